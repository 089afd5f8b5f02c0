#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each: fuzz/run.sh [SECONDS] (default 20).
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`).
# Starts from the committed corpus (corpus/<target>, read only) and keeps what the
# fuzzer finds in work/<target> (ignored by git); a crash, panic, leak, timeout or
# out-of-memory input lands in artifacts/<target>/ and fails the run.
# Extra arguments after SECONDS go to libFuzzer (e.g. -runs=10000000).
# FUZZ_TARGETS picks targets (default: all six, one after another); FUZZ_SANITIZER
# picks cargo-fuzz's sanitizer (default address; `none` ran 1.4-3.7x faster here, and
# Pangea's own crates forbid unsafe code, so ASan only watches dependencies).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-20}
shift || true
read -r -a targets <<<"${FUZZ_TARGETS:-client_frame filter replication_frame token topology merge}"
sanitizer=(-s "${FUZZ_SANITIZER:-address}")
toolchain=${FUZZ_TOOLCHAIN:-nightly}
# FUZZ_TARGET_DIR: where to build (default fuzz/target).
target_dir=()
if [ -n "${FUZZ_TARGET_DIR:-}" ]; then target_dir=(--target-dir "$FUZZ_TARGET_DIR"); fi

nice -n "${FUZZ_NICE:-19}" cargo "+$toolchain" fuzz build "${sanitizer[@]}" "${target_dir[@]}"
for t in "${targets[@]}"; do
  printf '\n== fuzz %s for %ss (%s)\n' "$t" "$seconds" "$(date -u +%H:%M:%S)"
  mkdir -p "work/$t"
  nice -n "${FUZZ_NICE:-19}" cargo "+$toolchain" fuzz run "${sanitizer[@]}" "${target_dir[@]}" "$t" "work/$t" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 "$@"
done
printf '\nfuzz: %s targets ran %ss each with no failure\n' "${#targets[@]}" "$seconds"
