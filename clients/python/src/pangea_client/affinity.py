"""Row affinity's weighted rendezvous hash (docs/protocol.md §9 "The rendezvous
hash"; docs/row-affinity.md). Every frontend of a region must pick the same
replica for a row, so this is computed exactly as specified."""

from __future__ import annotations

import math

from .xxh3 import xxh3_64


def affinity_hash(replica: str, row_key: bytes) -> int:
    """`XXH3_64_withSeed(row_key, XXH3_64(replica))`."""
    return xxh3_64(row_key, xxh3_64(replica.encode()))


def weighted_score(weight: float, h: int) -> float:
    """`-weight / ln(u)` with `u = ((h >> 11) + 0.5) / 2^53`."""
    u = ((h >> 11) + 0.5) / float(1 << 53)
    return -weight / math.log(u)


def rendezvous(candidates: list[tuple[str, float]], row_key: bytes) -> str | None:
    """The winner among (replica id, weight) candidates for `row_key`: the largest
    hash with equal weights, else the largest score; ties go to the smaller id
    (bytewise)."""
    equal = all(w == candidates[0][1] for _, w in candidates) if candidates else True
    best: str | None = None
    best_score: float | int = 0
    # In id order, replacing the best only on a strictly better score: a tie
    # keeps the smaller id. Equal weights compare the 64-bit integers exactly.
    for rid, weight in sorted(candidates, key=lambda c: c[0].encode()):
        h = affinity_hash(rid, row_key)
        score = h if equal else weighted_score(weight, h)
        if best is None or score > best_score:
            best, best_score = rid, score
    return best
