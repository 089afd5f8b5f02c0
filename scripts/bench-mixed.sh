#!/usr/bin/env bash
# A mixed, realistic load on one replica (docs/benchmarks.md, "A mixed load"):
# 90 % gets and 10 % puts (fsync durability), keys by a Zipf law, values
# log-normal around 2 KiB with a tail to 1 MiB. First a closed loop finds the
# capacity; then open loops paced at 50 % and 90 % of it give the latencies
# (from when each request was due). Prints one line per run; JSON in $OUT.
# PIN=1 gives the replica (all its threads) CPU 1 and the load generator CPU 0
# (taskset), instead of letting them share both cores. SERVE_POLL_US (0) sets
# the replica's serve_poll_us. REQUESTS=1 writes each run's request log
# (`pangea bench --requests`) beside its JSON and says how the slowest reads
# bunch in time. Run on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-target/release/pangea}   # cargo build --release -p pangea-cli
KEYS=${KEYS:-10000}
SIZES=${SIZES:-lognormal:2048,1.5,1048576}
ZIPF=${ZIPF:-0.99}
C=${CONCURRENCY:-32}          # the closed loop's requests in flight
PACED_C=${PACED_CONCURRENCY:-512}  # the open loops' schedules, and the most
                                   # requests they keep in flight
DURATION=${DURATION:-20s}
export PANGEA_ROW_CACHE_MIB=${ROW_CACHE_MIB:-512}   # as scripts/bench-serving.sh
export PANGEA_SERVE_POLL_US=${SERVE_POLL_US:-0}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SERVER_CPU=(); CLIENT_CPU=()
if [ "${PIN:-0}" = 1 ]; then SERVER_CPU=(taskset -c 1); CLIENT_CPU=(taskset -c 0); fi
D=$(mktemp -d)
${SERVER_CPU[@]+"${SERVER_CPU[@]}"} $P cluster up topology/single-replica.toml --placement topology/single-replica.placement.toml --data-dir "$D" >/dev/null
trap '$P cluster down --data-dir "$D" >/dev/null; rm -rf "$D"' EXIT
sleep 1
REQ=()
run() { # NAME RATE CONCURRENCY
  if [ "${REQUESTS:-0}" = 1 ]; then REQ=(--requests "$OUT/$1.csv"); fi
  ${CLIENT_CPU[@]+"${CLIENT_CPU[@]}"} $P bench --cluster "$D/cluster.toml" --region local-1 --op mix --value-bytes "$SIZES" --zipf "$ZIPF" \
    --keys "$KEYS" --concurrency "$3" --duration "$DURATION" --rate "$2" ${REQ[@]+"${REQ[@]}"} --json > "$OUT/$1.json" 2>/dev/null
}
run capacity 0 "$C"
CAP=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['reads']['ops_per_s'] + r['writes']['ops_per_s'])" "$OUT/capacity.json")
run at50 "$(python3 -c "print($CAP * 0.5)")" "$PACED_C"
run at90 "$(python3 -c "print($CAP * 0.9)")" "$PACED_C"
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
print(f"{'run':<9} {'ops/s':>8}  {'reads p50/p99/p999 ms':<24} {'writes p50/p99/p999 ms':<24} errors")
for name in ("capacity", "at50", "at90"):
    r = json.load(open(os.path.join(out, name + ".json")))
    rd, wr = r["reads"], r["writes"]
    f = lambda x: f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f} / {x['p999_ms']:.2f}"
    print(f"{name:<9} {rd['ops_per_s'] + wr['ops_per_s']:>8.0f}  {f(rd):<24} {f(wr):<24} {rd['errors'] + wr['errors']}")
    log = os.path.join(out, name + ".csv")
    if os.path.exists(log):
        # Stalls or slow requests: how many 50 ms windows (by due time) hold
        # the reads at or above the p99, and how many the busiest few hold.
        reads = [(int(d), int(l)) for d, l, op, _, ok in
                 (x.split(",") for x in open(log).read().split()[1:]) if op == "get" and ok == "1"]
        lat = sorted(l for _, l in reads)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        windows = {}
        for d, l in reads:
            if l >= p99:
                windows[d // 50_000_000] = windows.get(d // 50_000_000, 0) + 1
        slow, busiest = sum(windows.values()), sorted(windows.values(), reverse=True)
        print(f"{'':<9} reads >= p99: {slow} in {len(windows)} of "
              f"{(max(d for d, _ in reads) - min(d for d, _ in reads)) // 50_000_000 + 1} "
              f"50 ms windows; the busiest 5 hold {sum(busiest[:5])}")
print(f"{r['machine']}; raw results: {out}")
EOF
