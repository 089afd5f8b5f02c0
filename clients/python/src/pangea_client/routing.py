"""Choosing replicas (docs/protocol.md §9 steps 1–5 and 12): what a client knows
about each replica, and the plan of one read or write.

A port of the Rust client's `core/read/route.rs` (`plan_read_at`) and the
learning rules of `core/frontend/mod.rs`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .affinity import rendezvous
from .consistency import AsOf, Bounded, Consistency, RowAffinity, ScopeWatermarks, Token, Watermark
from .deployment import AppProfile, Deployment, Replica
from .errors import PolicyForbids
from .location import Location

#: §4, §9 step 12: a replica a request could not reach is down this long.
DOWN_FOR_S = 1.0
#: §9 step 13: a replica a background probe could not reach, this long.
PROBE_DOWN_FOR_S = 3.0
#: §9 step 12: weight of a new round-trip sample.
RTT_EWMA_ALPHA = 0.2


@dataclass(frozen=True)
class Candidate:
    """A replica to ask, why (`nearest`, `home`, `affinity`, `covered`,
    `origin-fallback`, `fresh`), and its round trip as planned."""

    replica: str
    reason: str
    rtt_ms: float


@dataclass
class ReadPlan:
    scope: str
    #: Ask the first; fail over (or hedge) to the next, in order.
    primary: list[Candidate]
    #: Watermark reads: raced at once after the first NOT_COVERED.
    fallback: list[Candidate]


def looks_gone(silent_ms: float, rtt_ms: float | None) -> bool:
    """A request silent for several round trips says its replica is gone, not slow
    (`4 × rtt + 20 ms`; never while the round trip is unknown)."""
    r = min(rtt_ms, 1e9) if rtt_ms is not None else math.inf
    return silent_ms > 4.0 * r + 20.0


def gone_after_s(rtt_ms: float | None) -> float:
    """How long a read that may not be hedged waits on its first replica before
    failing over (§9 step 7): `4 × rtt + 20 ms`, 100 ms while unknown."""
    return 0.1 if rtt_ms is None else (4.0 * min(rtt_ms, 1e9) + 20.0) / 1e3


@dataclass
class Peers:
    """What a client knows about replicas (§9 "What a client keeps"): round-trip
    estimates (EWMA), "down until" times and the last watermarks per scope.
    Times are `time.monotonic()` seconds."""

    rtt: dict[str, float] = field(default_factory=dict)
    down_until: dict[str, float] = field(default_factory=dict)
    known: dict[str, dict[str, ScopeWatermarks]] = field(default_factory=dict)
    # The last watermarks each replica sent in full, with its digest of them
    # (`ServedBy.watermarks_digest`), which requests name (§7).
    named: dict[str, tuple[int, ScopeWatermarks]] = field(default_factory=dict)

    def rtt_ms(self, replica: str) -> float | None:
        return self.rtt.get(replica)

    def is_down(self, replica: str, now: float | None = None) -> bool:
        until = self.down_until.get(replica)
        return until is not None and (time.monotonic() if now is None else now) < until

    def covers(self, replica: str, token: Token) -> bool:
        w = self.known.get(replica, {}).get(token.scope)
        return w is not None and w.covers(token)

    def freshness(self, replica: str, scope: str) -> ScopeWatermarks | None:
        return self.known.get(replica, {}).get(scope)

    # Learning (§9 step 12).
    def note_rtt(self, replica: str, ms: float) -> None:
        e = self.rtt.get(replica)
        self.rtt[replica] = ms if e is None else e * (1 - RTT_EWMA_ALPHA) + ms * RTT_EWMA_ALPHA

    def note_slower(self, replica: str, at_least_ms: float) -> None:
        """A request out this long lost a race: raise the estimate toward it."""
        e = self.rtt.get(replica)
        if e is not None and e < at_least_ms:
            self.note_rtt(replica, at_least_ms)

    def mark_down(self, replica: str, for_s: float = DOWN_FOR_S) -> None:
        self.down_until[replica] = time.monotonic() + for_s

    def clear_down(self, replica: str) -> None:
        self.down_until.pop(replica, None)

    def keep(self, replica: str, w: ScopeWatermarks, digest: int = 0) -> None:
        """Keeps a replica's watermarks; `digest` is its name for them (0: unnamed,
        a probe's answer)."""
        self.known.setdefault(replica, {})[w.scope] = w
        if digest:
            self.named[replica] = (digest, w)
            return
        named = self.named.get(replica)
        if named is not None and named[1].scope == w.scope and named[1] != w:
            # Unnamed ones replaced the named: name none, so the next answer
            # sends them in full.
            del self.named[replica]

    def known_digest(self, replica: str) -> int:
        """What a request to `replica` names (`ClientRequest.known_watermarks`)."""
        named = self.named.get(replica)
        return 0 if named is None else named[0]

    def named_watermarks(self, replica: str, digest: int) -> ScopeWatermarks | None:
        """The watermarks `replica` left out of an answer as the ones named by
        `digest`: unchanged. None when the client no longer holds them."""
        named = self.named.get(replica)
        return named[1] if named is not None and named[0] == digest else None


def eligible(d: Deployment, profile: AppProfile, client_region: str, scope: str) -> list[Replica]:
    """§9 step 2: the replicas, in id order, that store rows of `scope`'s regions,
    match the profile's priority and are allowed by its routing."""
    regions = d.policies.get(scope)
    if regions is None:
        return []
    out = []
    for r in d.replicas.values():
        if not r.stores_rows or r.region not in regions:
            continue
        if r.role != ("batch" if profile.priority == "batch" else "serving"):
            continue
        if profile.routing == "pinned" and r.id not in profile.pinned:
            continue
        if profile.routing == "region-local" and r.region != client_region:
            continue
        out.append(r)
    return out


def plan_read(
    d: Deployment,
    location: Location,
    profile: AppProfile,
    client_region: str,
    table: str,
    key: bytes,
    consistency: Consistency,
    peers: Peers,
    now: float | None = None,
    wall_ms: int | None = None,
) -> ReadPlan:
    """§9 steps 1–5: the replicas to ask for a row, in order, and a watermark
    read's fallbacks. Raises PolicyForbids when none is eligible (fail closed)."""
    now = time.monotonic() if now is None else now
    wall_ms = int(time.time() * 1000) if wall_ms is None else wall_ms
    scope = location.scope_of(d, table, key)
    routes = eligible(d, profile, client_region, scope)
    if not routes:
        raise PolicyForbids(
            f"no replica allowed by placement policy {scope!r} is usable by app profile {profile.name!r}"
        )
    # Step 3: the home region applies only when the client's region has no copy.
    home = None
    if not any(r.region == client_region for r in routes):
        home = location.home_of(d, table, key)

    def rtt(r: Replica) -> float:
        # The measured estimate when there is one, else the topology's. For a
        # replica of another region, never below the topology's: a measurement may
        # show another region farther than the file says, never nearer, so where
        # every round trip measures alike (a local cluster without WAN emulation)
        # the client's own region still goes first (route.rs `rtt_floor_ms`).
        est = d.rtt_estimate_ms(client_region, r)
        m = peers.rtt_ms(r.id)
        if m is None:
            return est
        return m if r.region == client_region else max(m, est)

    # Step 4: not down first; the home region first when it applies; round trip; id.
    keyed = sorted(
        ((peers.is_down(r.id, now), home is not None and r.region != home, rtt(r), i, r) for i, r in enumerate(routes)),
        key=lambda k: k[:4],
    )
    primary = [Candidate(r.id, "home" if home is not None and r.region == home else "nearest", ms) for _, _, ms, _, r in keyed]
    fallback: list[Candidate] = []
    # Step 5: the mode's changes.
    if isinstance(consistency, RowAffinity):
        def has(region: str | None) -> bool:
            return region is not None and any(r.region == region for r in routes)

        if has(client_region):
            region = client_region
        elif has(home):
            region = home
        else:
            region = d.replicas[primary[0].replica].region
        winner = rendezvous([(r.id, r.weight) for r in routes if r.region == region], key)
        if winner is not None and not peers.is_down(winner, now):
            i = next(i for i, c in enumerate(primary) if c.replica == winner)
            c = primary.pop(i)
            primary.insert(0, Candidate(c.replica, "affinity", c.rtt_ms))
    elif isinstance(consistency, Watermark):
        token = consistency.token
        for c in primary:
            if c.replica == token.origin:
                fallback.append(Candidate(c.replica, "origin-fallback", c.rtt_ms))
            elif peers.covers(c.replica, token) and not peers.is_down(c.replica, now):
                fallback.append(Candidate(c.replica, "covered", c.rtt_ms))
        fallback.sort(key=lambda c: c.reason != "origin-fallback")
    elif isinstance(consistency, (Bounded, AsOf)):
        # As of a time: as fresh as a bound of `now - ms` asks.
        bound = consistency.max_ms if isinstance(consistency, Bounded) else max(0, wall_ms - consistency.ms)
        marked = []
        for c in primary:
            w = peers.freshness(c.replica, scope)
            fresh = w is not None and w.staleness_ms(wall_ms) <= bound
            marked.append(Candidate(c.replica, "fresh", c.rtt_ms) if fresh else c)
        primary = sorted(marked, key=lambda c: c.reason != "fresh" or peers.is_down(c.replica, now))
    return ReadPlan(scope, primary, fallback)
