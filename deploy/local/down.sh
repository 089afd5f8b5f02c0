#!/usr/bin/env bash
# Stop the local cluster deploy/local/up.sh started: `pangea cluster down` sends
# SIGTERM to every replica and SIGKILL to any still running after the grace period.
# Data, logs and certificates stay (up.sh on the same directory restarts the same
# cluster) unless --purge. See deploy/local/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

usage() {
    cat <<USAGE
Usage: deploy/local/down.sh [options]

Stop every replica of the local cluster.

Options:
  --dir DIR         cluster directory (default: \$PANGEA_LOCAL_DIR or $repo/target/pangea-local)
  --grace-ms MS     SIGKILL replicas still running this long after SIGTERM (default 10000)
  --purge           then delete the cluster directory (data, logs, certificates)
  --bin PATH        use this pangea binary (default: \$PANGEA_BIN, else
                    target/release/pangea, built with cargo if missing)
  -h, --help        this help
USAGE
}

dir="${PANGEA_LOCAL_DIR:-$repo/target/pangea-local}"
grace_ms=10000
purge=0
bin="${PANGEA_BIN:-}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir="${2:?--dir needs a value}"; shift 2 ;;
        --grace-ms) grace_ms="${2:?--grace-ms needs a value}"; shift 2 ;;
        --purge) purge=1; shift ;;
        --bin) bin="${2:?--bin needs a value}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "down.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ "$dir" != /* ]]; then dir="$PWD/$dir"; fi
if [[ ! -f "$dir/cluster.toml" ]]; then
    echo "down.sh: no cluster in $dir (no cluster.toml)" >&2
    exit 1
fi

if [[ -z "$bin" ]]; then
    bin="${CARGO_TARGET_DIR:-$repo/target}/release/pangea"
    [[ "$bin" = /* ]] || bin="$repo/$bin"
    if [[ ! -x "$bin" ]]; then
        command -v cargo >/dev/null || { echo "down.sh: cargo not found; pass --bin PATH" >&2; exit 1; }
        (cd "$repo" && cargo build --release -p pangea-cli)
    fi
fi
if [[ "$bin" == */* && "$bin" != /* ]]; then bin="$PWD/$bin"; fi
[[ -x "$bin" ]] || { echo "down.sh: $bin is not an executable" >&2; exit 1; }

# Signal only a cluster that runs: the pids in cluster.toml of a cluster already
# stopped may since belong to other processes.
status="$("$bin" cluster status --data-dir "$dir" --json)"
if [[ "$status" == *'"running": true'* ]]; then
    "$bin" cluster down --data-dir "$dir" --grace-ms "$grace_ms"
else
    echo "no replica of the cluster in $dir is running"
fi

if [[ "$purge" -eq 1 ]]; then
    # Only a directory that holds a cluster file, checked above, is ever removed.
    rm -rf -- "$dir"
    echo "removed $dir"
fi
