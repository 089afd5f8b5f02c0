"""Typed `AdProfile` helpers (`proto/pangea/v1/ad_profile.proto`): one user's
profile, serialized into table `ad_profiles`, family `profile`, column `p` — the
layout the Rust client's `get_profile` / `put_profile` use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import Internal
from .pb.ad_profile_pb2 import AdProfile, FrequencyCap, Segment
from .rows import SetCell

if TYPE_CHECKING:
    from .client import Client, Response
    from .consistency import Token

PROFILE_TABLE = "ad_profiles"
PROFILE_FAMILY = "profile"
PROFILE_COLUMN = b"p"

__all__ = ["AdProfile", "FrequencyCap", "Segment", "get_profile", "put_profile", "profile_cell"]


def profile_cell(profile: AdProfile) -> SetCell:
    """The mutation that stores `profile`. Segments are sorted by name first, the
    convention that makes equal profiles encode identically."""
    names = [s.name for s in profile.segments]
    if names != sorted(names):
        ordered = sorted(profile.segments, key=lambda s: s.name)
        copy = AdProfile()
        copy.CopyFrom(profile)
        del copy.segments[:]
        copy.segments.extend(ordered)
        profile = copy
    return SetCell(PROFILE_FAMILY, PROFILE_COLUMN, profile.SerializeToString(deterministic=True))


async def get_profile(client: Client, user_key: str, **opts: Any) -> Response[AdProfile | None]:
    """Reads only (profile, p) of row `user_key` and decodes it; None when absent.
    Takes `get`'s keyword options (consistency, deadline, hedge)."""
    r = await client.get(PROFILE_TABLE, user_key, columns=[(PROFILE_FAMILY, PROFILE_COLUMN)], **opts)
    raw = r.value.value(PROFILE_FAMILY, PROFILE_COLUMN) if r.value is not None else None
    if raw is None:
        return _with(r, None)
    try:
        return _with(r, AdProfile.FromString(raw))
    except Exception as e:  # noqa: BLE001 (protobuf's DecodeError and friends)
        raise Internal(f"stored profile of {user_key!r} does not decode as AdProfile: {e}", replica=r.replica) from None


async def put_profile(client: Client, user_key: str, profile: AdProfile, **opts: Any) -> Response[Token]:
    """Writes `profile` as row `user_key`'s (profile, p); returns the write's token.
    Takes `mutate`'s keyword options."""
    return await client.mutate(PROFILE_TABLE, user_key, [profile_cell(profile)], **opts)


def _with(r: Response[Any], value: Any) -> Response[Any]:
    from .client import Response

    return Response(value, r.replica, r.region, r.reason, r.watermarks, r.latency, r.attempts)
