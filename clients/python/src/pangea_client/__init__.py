"""Pangea client for Python: mutual-TLS QUIC to the replicas of a cluster, with
the routing of docs/protocol.md §9 (nearest replica, failover, hedging, the
watermark fallback race, row affinity, bounded reads).

    from pangea_client import Client, SetCell, Watermark

    client = await Client.connect("/tmp/pangea/cluster.toml", region="eu-west-1")
    written = await client.mutate("ad_profiles", "us/42", [SetCell("profile", "p", b"hi")])
    row = (await client.get("ad_profiles", "us/42", consistency=Watermark(written.value))).value
"""

from .adprofile import AdProfile, FrequencyCap, Segment
from .client import Client, Response
from .consistency import AsOf, Bounded, Eventual, RowAffinity, ScopeWatermarks, Token, Watermark
from .deployment import ClusterFile, Deployment
from .errors import (
    Ambiguous,
    ConfigError,
    CursorExpired,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    Lost,
    NotCovered,
    NotFound,
    NotReplicated,
    PangeaError,
    PolicyForbids,
    TooStale,
    Unavailable,
)
from .rows import (
    Cell,
    Change,
    ChangesPage,
    DeleteFromColumn,
    DeleteFromFamily,
    DeleteFromRow,
    Family,
    Increment,
    Row,
    ScanPage,
    SetCell,
    key_range,
)
from .transport import Credential

__all__ = [
    "AdProfile", "Ambiguous", "AsOf", "Bounded", "Cell", "Change", "ChangesPage", "Client", "ClusterFile",
    "ConfigError", "Credential", "CursorExpired",
    "DeadlineExceeded", "DeleteFromColumn", "DeleteFromFamily", "DeleteFromRow", "Deployment", "Eventual", "Family",
    "FrequencyCap", "Increment", "Internal", "InvalidArgument", "Lost", "NotCovered", "NotFound", "NotReplicated", "PangeaError",
    "PolicyForbids", "Response", "Row", "RowAffinity", "ScanPage", "ScopeWatermarks", "Segment", "SetCell", "Token",
    "TooStale", "Unavailable", "Watermark", "key_range",
]
