#!/usr/bin/env bash
# Side by side on one machine (docs/benchmarks.md, "Serving"): pangea get on one
# replica, the quinn echo floor, redis GET; JSON/CSV results in $OUT (default /tmp).
# Needs redis-server and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-target/release/pangea}   # cargo build --release -p pangea-cli
D=$(mktemp -d)

$P cluster up topology/single-replica.toml --placement topology/single-replica.placement.toml --data-dir $D >/dev/null
redis-server --port 6399 --save '' --appendonly no --daemonize yes >/dev/null
sleep 1
for size in 1024 102400; do
  for c in 32 50; do
    $P bench --cluster $D/cluster.toml --region local-1 --op get --value-bytes $size --concurrency $c --duration 5s --keys 1000 --json > ${OUT:-/tmp}/b-pangea-$size-$c.json 2>/dev/null
    $P bench-echo --value-bytes $size --concurrency $c --duration 5s --json > ${OUT:-/tmp}/b-echo-$size-$c.json 2>/dev/null
    # GET of keys that exist: SET the 1,000 keys (key:000000000000..999) at this size
    # first, or Redis would answer nil for most GETs and send no value at all.
    redis-benchmark -p 6399 -t set -d $size -r 1000 -n 20000 -q >/dev/null 2>&1
    redis-benchmark -p 6399 -t get -d $size -c $c -n 150000 -r 1000 --csv 2>/dev/null | tail -1 > ${OUT:-/tmp}/b-redis-$size-$c.csv
  done
done
redis-cli -p 6399 shutdown nosave >/dev/null 2>&1 || true
$P cluster down --data-dir $D >/dev/null
