#!/usr/bin/env bash
# Replication across a long link (docs/benchmarks.md, "Replication across a long
# link"): a bulk load of $ROWS rows of $ROW_BYTES at use1-a, as fast as it goes,
# replicated to euw1-a over the emulated WAN of $TOPO (a two-region topology: its
# link's rtt_ms is the emulated delay, its bandwidth_mbps sizes the link's
# flow-control windows). Samples euw1-a's applied-row counter for the load's
# origin every ~0.25 s and prints how long euw1-a took to hold every row, and at
# what rate it caught up once the load had ended. Gives up after $LIMIT_S seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-target/release/pangea}   # cargo build --release -p pangea-cli
TOPO=${TOPO:-topology/two-regions.toml}
ROWS=${ROWS:-2000}
ROW_BYTES=${ROW_BYTES:-102400}
LIMIT_S=${LIMIT_S:-120}
D=$(mktemp -d)
trap '$P cluster down --data-dir "$D" >/dev/null; rm -rf "$D"' EXIT
$P cluster up "$TOPO" --placement topology/single-replica.placement.toml \
  --data-dir "$D" --emulate-wan >/dev/null
C="$D/cluster.toml"
ADMIN=$(awk '/^id = "euw1-a"/ { f = 1 } f && /^admin/ { gsub(/"/, "", $3); print $3; exit }' "$C")
awk -v n="$ROWS" -v b="$ROW_BYTES" 'BEGIN { v = "x"; while (length(v) < b) v = v v; v = substr(v, 1, b);
  for (i = 0; i < n; i++) printf("{\"key\":\"load/%08d\",\"cells\":{\"profile:p\":\"%s\"}}\n", i, v) }' \
  > "$D/rows.ndjson"
applied() {
  curl -s "http://$ADMIN/metrics" |
    awk '/^pangea_applied_total\{scope="global",origin="use1-a"\}/ { print $2; f = 1 } END { if (!f) print 0 }'
}
start=$(date +%s.%N)
$P load --cluster "$C" --region us-east-1 --table ad_profiles --concurrency 64 "$D/rows.ndjson" \
  > "$D/load.txt" 2>&1 &
load=$!
loaded="" n=0
while :; do
  now=$(date +%s.%N)
  if [ -z "$loaded" ] && ! kill -0 "$load" 2>/dev/null; then
    loaded=$now; at_load_end=$(applied)
  fi
  n=$(applied)
  [ "$n" -ge "$ROWS" ] && break
  if python3 -c "import sys; sys.exit(0 if $now - $start > $LIMIT_S else 1)"; then break; fi
  sleep 0.25
done
wait "$load" || true
python3 - "$start" "${loaded:-$now}" "$now" "$n" "${at_load_end:-0}" "$ROWS" "$ROW_BYTES" <<'PY'
import sys
start, loaded, end = map(float, sys.argv[1:4])
n, at_end, rows, row_bytes = map(int, sys.argv[4:8])
mb = lambda r: r * row_bytes / 1e6
print(f"load: {rows} rows ({mb(rows):.0f} MB) at use1-a in {loaded - start:.1f} s; "
      f"euw1-a had {at_end} then")
if n >= rows:
    rate = mb(rows - at_end) / max(end - loaded, 1e-9)
    print(f"euw1-a had every row {end - start:.1f} s after the load started "
          f"(caught up at {rate:.1f} MB/s after it ended)")
else:
    print(f"euw1-a had {n} of {rows} rows after {end - start:.0f} s (gave up); "
          f"{mb(n - at_end) / max(end - loaded, 1e-9):.2f} MB/s after the load ended")
PY
grep -E "^loaded|retries" "$D/load.txt" || true
