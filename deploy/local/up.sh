#!/usr/bin/env bash
# Bring the reference topology (topology/four-continents.toml + topology/placement.toml,
# 27 replicas in 13 regions) up as local processes on 127.0.0.1, for drills on real
# processes. A thin wrapper around `pangea cluster up`: it issues the certificates,
# picks free ports, starts every replica and waits until each reports healthy.
# See deploy/local/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

usage() {
    cat <<USAGE
Usage: deploy/local/up.sh [options]

Start every replica of the reference topology as a local process.

Options:
  --dir DIR             cluster directory: data, logs, certificates, cluster.toml
                        (default: \$PANGEA_LOCAL_DIR or $repo/target/pangea-local)
  --topology FILE       topology file (default: topology/four-continents.toml)
  --placement FILE      placement file (default: topology/placement.toml)
  --no-emulate-wan      do not delay traffic by the topology's latencies
  --durability MODE     fsync (default) or os-buffer
  --bin PATH            use this pangea binary (default: \$PANGEA_BIN, else build
                        target/release/pangea with cargo)
  -h, --help            this help

Stop it with deploy/local/down.sh (same --dir).
USAGE
}

dir="${PANGEA_LOCAL_DIR:-$repo/target/pangea-local}"
topology="$repo/topology/four-continents.toml"
placement="$repo/topology/placement.toml"
emulate_wan=1
durability=fsync
bin="${PANGEA_BIN:-}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir="${2:?--dir needs a value}"; shift 2 ;;
        --topology) topology="${2:?--topology needs a value}"; shift 2 ;;
        --placement) placement="${2:?--placement needs a value}"; shift 2 ;;
        --no-emulate-wan) emulate_wan=0; shift ;;
        --durability) durability="${2:?--durability needs a value}"; shift 2 ;;
        --bin) bin="${2:?--bin needs a value}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "up.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

# Paths given relative to the caller's directory stay valid after we cd.
abs() { if [[ "$1" = /* ]]; then printf '%s\n' "$1"; else printf '%s\n' "$PWD/$1"; fi; }
dir="$(abs "$dir")"
topology="$(abs "$topology")"
placement="$(abs "$placement")"
for f in "$topology" "$placement"; do
    [[ -f "$f" ]] || { echo "up.sh: no such file: $f" >&2; exit 1; }
done

if [[ -z "$bin" ]]; then
    command -v cargo >/dev/null || { echo "up.sh: cargo not found; pass --bin PATH" >&2; exit 1; }
    echo "building pangea (cargo build --release -p pangea-cli) ..."
    (cd "$repo" && cargo build --release -p pangea-cli)
    bin="${CARGO_TARGET_DIR:-$repo/target}/release/pangea"
    [[ "$bin" = /* ]] || bin="$repo/$bin"
fi
[[ "$bin" != */* ]] || bin="$(abs "$bin")"
[[ -x "$bin" ]] || { echo "up.sh: $bin is not an executable" >&2; exit 1; }

# Validate first: a bad file is reported with file, line and key, and nothing starts.
"$bin" topology check "$topology" --placement "$placement"

args=(cluster up "$topology" --placement "$placement" --data-dir "$dir" --durability "$durability")
if [[ "$emulate_wan" -eq 1 ]]; then
    args+=(--emulate-wan)
fi
mkdir -p "$dir"
echo "starting the cluster in $dir ..."
"$bin" "${args[@]}"
"$bin" cluster status --data-dir "$dir"

cat <<NEXT

Cluster file: $dir/cluster.toml (logs in $dir/logs/)
  $bin get --cluster $dir/cluster.toml --region eu-west-1 eu/42
  $bin watermarks --cluster $dir/cluster.toml --region us-east-1
  $bin topology apply --cluster $dir/cluster.toml EDITED_TOPOLOGY.toml
Stop it: $here/down.sh --dir $dir
NEXT
