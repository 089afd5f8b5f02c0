"""Read modes, consistency tokens and watermarks (docs/protocol.md §3 "Consistency
and filters", §6, §7; docs/consistency.md for what each mode promises)."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from .errors import InvalidArgument
from .pb import client_pb2 as pb

#: §6: the first byte of a token.
TOKEN_FORMAT_V1 = 1
#: §6: a replica refuses a longer token.
TOKEN_BYTES_MAX = 512


@dataclass(frozen=True)
class Token:
    """One write: the `sequence`-th write of `origin` in `scope`, at HLC `timestamp`
    (§6). Applications keep `encode()`'s bytes and pass them back as they are."""

    scope: str
    origin: str
    sequence: int
    timestamp: int

    def encode(self) -> bytes:
        body = pb.TokenV1(scope=self.scope, origin=self.origin, sequence=self.sequence, timestamp=self.timestamp)
        return bytes([TOKEN_FORMAT_V1]) + body.SerializeToString()

    @staticmethod
    def decode(data: bytes) -> Token:
        """Parses token bytes (§6); raises InvalidArgument saying what is wrong."""
        if not data:
            raise InvalidArgument("consistency token: empty")
        if len(data) > TOKEN_BYTES_MAX:
            raise InvalidArgument(f"consistency token: {len(data)} bytes, at most {TOKEN_BYTES_MAX}")
        if data[0] != TOKEN_FORMAT_V1:
            raise InvalidArgument(f"consistency token: format {data[0]}, expected {TOKEN_FORMAT_V1}")
        try:
            body = pb.TokenV1.FromString(bytes(data[1:]))
        except DecodeError as e:
            raise InvalidArgument(f"consistency token: body does not decode: {e}") from None
        if not body.scope or not body.origin or body.sequence == 0:
            raise InvalidArgument("consistency token: scope, origin and a non-zero sequence are required")
        return Token(body.scope, body.origin, body.sequence, body.timestamp)

    @property
    def wall_ms(self) -> int:
        """The write's time in Unix milliseconds (upper 48 bits of the HLC)."""
        return self.timestamp >> 16


@dataclass(frozen=True)
class Eventual:
    """Nearest healthy replica; may lag (mode 1)."""


@dataclass(frozen=True)
class RowAffinity:
    """The row's rendezvous replica in the caller's region, which sees the region's
    own writes (mode 2; §9 "The rendezvous hash"). Never hedged."""


@dataclass(frozen=True)
class Watermark:
    """Only a replica that has applied the write `token` names (mode 3)."""

    token: Token


@dataclass(frozen=True)
class Bounded:
    """Only a replica at most `max_ms` behind by its freshness (mode 4)."""

    max_ms: int


@dataclass(frozen=True)
class AsOf:
    """The row as of wall time `ms` (Unix ms): only a replica fresh as of it
    answers, with each column's newest versions stamped at or before it (mode 5;
    docs/consistency.md "Reads as of a time")."""

    ms: int


Consistency = Eventual | RowAffinity | Watermark | Bounded | AsOf


def may_hedge(c: Consistency) -> bool:
    """Every mode but row affinity may be hedged (§9 step 7)."""
    return not isinstance(c, RowAffinity)


def to_proto(c: Consistency) -> pb.Consistency:
    if isinstance(c, RowAffinity):
        return pb.Consistency(row_affinity=pb.Consistency.RowAffinity())
    if isinstance(c, Watermark):
        return pb.Consistency(watermark_token=c.token.encode())
    if isinstance(c, Bounded):
        return pb.Consistency(bounded_staleness_ms=c.max_ms)
    if isinstance(c, AsOf):
        return pb.Consistency(as_of_ms=c.ms)
    return pb.Consistency(eventual=pb.Consistency.Eventual())


def mode_name(c: Consistency) -> str:
    return {Eventual: "eventual", RowAffinity: "affinity", Watermark: "watermark", Bounded: "bounded", AsOf: "as_of"}[
        type(c)
    ]


@dataclass(frozen=True)
class OriginMark:
    sequence: int
    timestamp: int
    vouched: int


@dataclass(frozen=True)
class ScopeWatermarks:
    """How far a replica has applied each origin's stream in one scope (§7)."""

    scope: str
    origins: dict[str, OriginMark] = field(default_factory=dict)
    low_watermark: int = 0
    freshness: int = 0

    @staticmethod
    def from_proto(w: pb.ScopeWatermarks) -> ScopeWatermarks:
        # §7: lenient; an origin listed twice keeps its last entry.
        origins = {o.origin: OriginMark(o.sequence, o.timestamp, o.vouched) for o in w.origins if o.origin}
        return ScopeWatermarks(w.scope, origins, w.low_watermark, w.freshness)

    def covers(self, token: Token) -> bool:
        """Whether the write `token` names is applied here: a sequence comparison,
        never a clock comparison (§6)."""
        mark = self.origins.get(token.origin)
        return token.scope == self.scope and mark is not None and mark.sequence >= token.sequence

    def staleness_ms(self, now_ms: int) -> int:
        """How far `freshness` is behind a wall clock reading (bounded reads)."""
        return max(0, now_ms - (self.freshness >> 16))
