"""`python -m pangea_client.bench`: get latency and ops/s of this client, to set
next to `pangea bench --op get` (docs/benchmarks.md, "Python client").

A closed loop of `--concurrency` workers on one asyncio event loop, each reading
`--keys` keys `<prefix><i:08>` in turn with eventual consistency (the keys `pangea
bench` writes; run it first, or pass `--preload`). Every call's latency is kept
and the percentiles are exact (nearest rank), not bucketed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time

from .client import Client
from .rows import SetCell


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return math.nan
    return sorted_ms[min(len(sorted_ms) - 1, max(0, math.ceil(q * len(sorted_ms)) - 1))]


async def bench(a: argparse.Namespace) -> dict[str, object]:
    client = await Client.connect(a.cluster, a.region, a.app_profile)
    keys = [f"{a.prefix}{i:08}".encode() for i in range(a.keys)]
    if a.preload:
        value = b"x" * a.value_bytes
        for k in keys:
            await client.mutate(a.table, k, [SetCell("profile", "p", value)], deadline=2.0)
    latencies: list[float] = []
    errors = 0
    stop_at = time.monotonic() + a.warmup + a.duration
    measure_from = time.monotonic() + a.warmup

    async def worker(w: int) -> None:
        nonlocal errors
        i = w
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            try:
                await client.get(a.table, keys[i % len(keys)], deadline=a.deadline)
            except Exception:  # noqa: BLE001 (counted, the loop goes on)
                errors += 1
            t1 = time.monotonic()
            if t0 >= measure_from:
                latencies.append((t1 - t0) * 1e3)
            i += a.concurrency

    await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    await client.close()
    latencies.sort()
    return {
        "concurrency": a.concurrency,
        "seconds": a.duration,
        "ops": len(latencies),
        "ops_per_s": round(len(latencies) / a.duration),
        "errors": errors,
        "p50_ms": round(percentile(latencies, 0.50), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "p999_ms": round(percentile(latencies, 0.999), 3),
        "max_ms": round(latencies[-1], 3) if latencies else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--app-profile", default="frontend")
    p.add_argument("--table", default="ad_profiles")
    p.add_argument("--prefix", default="bench/")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--preload", action="store_true")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--deadline", type=float, default=2.0, help="per call, seconds (pangea bench: 2 s)")
    a = p.parse_args()
    print(json.dumps(asyncio.run(bench(a))))


if __name__ == "__main__":
    main()
