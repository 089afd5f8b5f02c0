#!/usr/bin/env bash
# Serving over replication (docs/benchmarks.md, issue 32 point 6): a frontend reads
# 1 KiB rows at euw1-a at a steady rate (open loop: `pangea bench --rate`) while a
# bulk load writes $ROWS rows of 1 KiB at use1-a, an ocean away (emulated WAN,
# 69.6 ms), which replicate into euw1-a as they are written. Prints euw1-a's read
# latency idle and during the load, the load's rate, and how long after the load
# ended euw1-a had every row (the last row readable there). Raw JSON in $OUT, with
# euw1-a's own request-duration buckets for gets after each phase (handled-*.txt).
# OP=put measures writes at euw1-a instead: each waits for euw1-a's driver, which
# is applying the load's replicated rows meanwhile. ROW_BYTES sizes the load's rows;
# TOPO names another two-region topology (its links' rtt_ms and bandwidth_mbps set
# the emulated delay and the replication link's flow-control windows).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-target/release/pangea}   # cargo build --release -p pangea-cli
ROWS=${ROWS:-200000}
ROW_BYTES=${ROW_BYTES:-1024}
TOPO=${TOPO:-topology/two-regions.toml}
RATE=${RATE:-1000}              # requests per second at euw1-a
OP=${OP:-get}                   # what the frontend at euw1-a sends: get, or put (writes
                                # that euw1-a makes durable among the replicated ones)
SECS=${SECS:-20}                # seconds of reading, idle
DURING_SECS=${DURING_SECS:-10}  # seconds of reading during the load (it must outlast them)
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
D=$(mktemp -d)
trap '$P cluster down --data-dir "$D" >/dev/null; rm -rf "$D"' EXIT
$P cluster up "$TOPO" --placement topology/single-replica.placement.toml \
  --data-dir "$D" --emulate-wan >/dev/null
C="$D/cluster.toml"
# PIN=1: euw1-a and the reader on CPU 0 (READER_CPU=1 moves the reader), use1-a
# and the loader on CPU 1, so that what euw1-a's serving suffers is its own
# replication work, not the loader's or the origin's. LOAD_CONCURRENCY slows the
# load (the loader's writes in flight, default 64).
LOADER=()
READER=()
if [ "${PIN:-0}" = 1 ]; then
  for pid in $(pgrep -f -- "--replica euw1-a"); do taskset -a -p -c 0 "$pid" >/dev/null; done
  for pid in $(pgrep -f -- "--replica use1-a"); do taskset -a -p -c 1 "$pid" >/dev/null; done
  LOADER=(taskset -c 1)
  READER=(taskset -c "${READER_CPU:-0}")
fi
awk -v n="$ROWS" -v b="$ROW_BYTES" 'BEGIN { v = "x"; while (length(v) < b) v = v v; v = substr(v, 1, b);
  for (i = 0; i < n; i++) printf("{\"key\":\"load/%08d\",\"cells\":{\"profile:p\":\"%s\"}}\n", i, v) }' \
  > "$D/rows.ndjson"
last=$(printf 'load/%08d' $((ROWS - 1)))
bench() {
  "${READER[@]}" $P bench --cluster "$C" --region eu-west-1 --op "$OP" --value-bytes 1024 --keys 1000 \
    --concurrency 16 --rate "$RATE" --duration "$1" --json
}
# euw1-a's own view: its request-duration histogram for gets, after each phase.
ADMIN=$(awk '/^id = "euw1-a"/ { f = 1 } f && /^admin/ { gsub(/"/, "", $3); print $3; exit }' "$C")
handled() { curl -s "http://$ADMIN/metrics" | grep "request_duration_seconds_bucket{.*op=\"$([ "$OP" = put ] && echo mutate || echo get)\"" > "$1"; }
bench "${SECS}s" > "$OUT/idle.json"
handled "$OUT/handled-idle.txt"
start=$(date +%s.%N)
# The load, then (as soon as it ends) polling euw1-a for its last row.
(
  "${LOADER[@]}" $P load --cluster "$C" --region us-east-1 --table ad_profiles \
    --concurrency "${LOAD_CONCURRENCY:-64}" "$D/rows.ndjson" > "$OUT/load.txt" 2>&1
  date +%s.%N > "$OUT/load-end"
  until $P get --cluster "$C" --region eu-west-1 --table ad_profiles "$last" >/dev/null 2>&1; do
    sleep 0.05
  done
  date +%s.%N > "$OUT/caught"
) &
load=$!
# Reading during the load's first $DURING_SECS s: the load must outlast them.
bench "${DURING_SECS}s" > "$OUT/during.json"
during_end=$(date +%s.%N)
handled "$OUT/handled-during.txt"
wait $load
loaded=$(cat "$OUT/load-end")
caught=$(cat "$OUT/caught")
python3 - "$OUT" "$start" "$loaded" "$caught" "$ROWS" "$during_end" "$OP" "$ROW_BYTES" <<'PY'
import json, sys
out, start, loaded, caught, rows, during_end = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5]), float(sys.argv[6])
row_bytes = int(sys.argv[8])
what = "writes" if sys.argv[7] == "put" else "reads"
if during_end > loaded:
    print(f"warning: the load ended {during_end - loaded:.1f} s before the reading did: 'during' mixes in idle time (lower DURING_SECS)")
for name in ["idle", "during"]:
    try:
        r = json.load(open(f"{out}/{name}.json"))[what]
        print(f"{name:>6}: {r['ops_per_s']:.0f} {what}/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  p999 {r['p999_ms']:.2f} ms  max {r['max_ms']:.2f} ms  errors {r['errors']}")
    except Exception as e:
        print(f"{name:>6}: no report ({e})")
print(f"load: {rows} rows in {loaded - start:.1f} s ({rows / (loaded - start):.0f} rows/s); "
      f"euw1-a had the last row {caught - loaded:.2f} s after the load ended "
      f"(replicated {rows * row_bytes / (caught - start) / 1e6:.1f} MB/s of values)")
PY
echo "raw: $OUT"
