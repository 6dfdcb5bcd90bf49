#!/bin/bash
# test_cli_bench_options.sh - `attn bench` refuses every option that the run it asks
# for would not use: exit 2, one line naming the option and what it applies to,
# before anything is timed, so that a user never reads figures of another shape than
# the one typed. All of these stop at the option check (no timing runs), so the test
# takes well under a second.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_bench_options"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"

# refused PHRASE ARGS...: `attn bench ARGS` is a usage error whose line has PHRASE,
# and it printed nothing on stdout (no table header: nothing was timed).
refused() {
    local phrase=$1
    shift
    run 2 "$ATTN" bench "$@"
    err_has "$phrase"
    if [ -s "$OUT_FILE" ]; then bad "bench $* printed on stdout: $(head -c 200 "$OUT_FILE")"; else ok; fi
}

say "a mode's own sizes without that mode are refused, not dropped"
refused "--size applies to --gemm" --shape S1 --size 64
refused "--size applies to --gemm" --mha --size 64
refused "--seq-len applies to --mha" --shape S1 --seq-len 8
refused "--embed-dim applies to --mha" --gemm --size 8 --embed-dim 8
refused "--num-heads applies to --mha" --query-len 4 --head-dim 4 --num-heads 2
refused "--prefill, --steps and --tq apply to --decode" --shape S1 --steps 2

say "--peak takes no --runs or --impl (it times FMA chains, not a kernel), and --decode none of either"
refused "--peak measures the FMA peak alone: --runs does not apply" --peak --runs 3
refused "--peak measures the FMA peak alone: --impl does not apply" --peak --impl ref
refused "--decode times each of its --steps once on the default path: --runs does not apply" \
    --decode --runs 3

say "modes exclude each other and a shape; a custom shape's options need one"
refused "exclude each other" --peak --gemm
refused "--gemm takes no shape" --gemm --shape S1
refused "--shape and a custom shape exclude each other" --shape S1 --query-len 4 --head-dim 4
refused "a custom shape needs --query-len and --head-dim" --batch 2
refused "--causal applies to a custom shape or --mha" --shape S2 --causal
refused "--padding applies to a custom shape" --shape S6 --padding
refused "--window applies to a custom shape" --shape S2 --window 3,0
refused "--heads 6 is not a multiple of --kv-heads 4" --heads 6 --kv-heads 4 --query-len 4 --head-dim 4
refused "--embed-dim 10 is not divisible by --num-heads 4" --mha --embed-dim 10 --num-heads 4

say "the same sizes with their mode run (a tiny --mha and --gemm: exit 0, one line each)"
run 0 "$ATTN" bench --mha --seq-len 8 --embed-dim 8 --num-heads 2 --runs 1 --threads 1 --json
out_has '"kind":"mha"'
out_has '"Tq":8'
run 0 "$ATTN" bench --gemm --size 16 --runs 1 --threads 1 --json
out_has '"kind":"gemm"'
out_has '"N":16'

cli_summary test_cli_bench_options
