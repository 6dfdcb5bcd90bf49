#!/usr/bin/env bash
# fuzz/run.sh TARGET SECONDS - runs one libFuzzer target (npy, safetensors, weights
# or cli; the fuzz_ prefix may be given too) built by fuzz/build.sh for a bounded time, against a copy of its committed
# seed corpus fuzz/corpus/TARGET/ (the copy grows; the committed corpus does not).
#
# Exits 0 when the time ran out without a finding, non-zero on a finding (a crash,
# a sanitizer report, a leak, a timeout of one input above 10 s, more than 2 GB of
# memory); the reproducer is kept as build-fuzz/artifacts/TARGET-crash-... and the
# log as build-fuzz/TARGET.log. Exits 0 with a "skipped" line when fuzz/build.sh
# skipped (no libFuzzer runtime).
#
# Extra arguments after SECONDS go to libFuzzer (e.g. -seed=1).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/build-fuzz"
if [ $# -lt 2 ]; then
    echo "usage: fuzz/run.sh npy|safetensors|weights|cli SECONDS [libFuzzer flags]" >&2
    exit 2
fi
target=${1#fuzz_} # "fuzz_npy" (the source's name, as .ci/run passes it) or "npy"
secs=$2
shift 2
case "$target" in npy|safetensors|weights|cli) ;; *)
    echo "fuzz/run.sh: unknown target '$target' (npy, safetensors, weights, cli)" >&2
    exit 2 ;;
esac
if [ -f "$out/SKIPPED" ]; then
    echo "fuzz/run.sh: $target skipped: $(cat "$out/SKIPPED")"
    exit 0
fi
bin="$out/fuzz_$target"
if [ ! -x "$bin" ]; then
    echo "fuzz/run.sh: $bin is missing; run fuzz/build.sh first" >&2
    exit 2
fi

# A fresh copy of the seeds, and a scratch directory for what the target writes.
corpus="$out/corpus-$target"
rm -rf "$corpus"
mkdir -p "$corpus" "$out/artifacts"
cp "$root/fuzz/corpus/$target/"* "$corpus/"
base=/tmp
[ -w /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/attn-fuzz-$target.XXXXXX")
trap 'rm -rf "$work"' EXIT

dict=()
case "$target" in
npy) dict=("-dict=$root/fuzz/npy.dict") ;;
safetensors|weights) dict=("-dict=$root/fuzz/safetensors.dict") ;;
cli) dict=("-dict=$root/fuzz/cli.dict") ;;
esac

log="$out/$target.log"
echo "fuzz/run.sh: $target for ${secs}s ($(ls "$corpus" | wc -l) seeds), log $log"
ATTN_FUZZ_WORK="$work" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$bin" "$corpus" "${dict[@]}" -max_total_time="$secs" -rss_limit_mb=2048 \
    -timeout=10 -max_len=65536 -close_fd_mask=3 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$target-" "$@" > "$log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ $rc -ne 0 ]; then
    echo "fuzz/run.sh: $target FOUND A PROBLEM (exit $rc) after ${execs:-?} executions:" >&2
    grep -E "ERROR|SUMMARY|runtime error|fuzz invariant|Test unit written|#0 |#1 |#2 |#3 " "$log" | head -40 >&2
    exit 1
fi
echo "fuzz/run.sh: $target: ${execs:-?} executions in ${secs}s, no finding ($(ls "$corpus" | wc -l) inputs in the grown corpus)"
