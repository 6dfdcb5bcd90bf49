#!/bin/bash
# test_cli_half.sh - `attn sdpa --dtype bf16|f16` and `attn bench --dtype` (SPEC
# section 10) on the command line: a 16-bit run agrees with the float32 run of the
# same files within the dtype's precision, float16 output is written as '<f2' and
# bfloat16 output as float32, and the combinations that cannot work are usage errors
# (exit 2) that say why; `attn bench --shape S9` and `--decode` run through a 16-bit
# KV cache with --dtype. The accuracy rule itself (2 x PyTorch's error + a floor) is
# tests/test_half.c's, on every path; here the tolerance only has to catch a wrong
# path through the program: the case's inputs are exact in bfloat16, the output's
# rounding costs up to 2^-9 of it and the float32 sums differ in order, and its
# values are below 3 in magnitude, so 0.03 + 1e-2 * |f32| is a few units of
# bfloat16's precision. (These helpers read float32 files only, so the float16 run
# is checked for its format and for loading back.)
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_half"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
CASE="$ATTN_TEST_DATA_DIR/golden_half/bf16_causal"
IN=(--query "$CASE/q.npy" --key "$CASE/k.npy" --value "$CASE/v.npy" --causal)

say "attn sdpa --dtype bf16 agrees with the float32 run within bfloat16's precision"
run 0 "$ATTN" sdpa "${IN[@]}" --output "$WORK/o32.npy"
run 0 "$ATTN" sdpa "${IN[@]}" --dtype bf16 --output "$WORK/obf.npy"
run 0 "$ATTN" sdpa "${IN[@]}" --dtype f16 --output "$WORK/oh.npy"
npy_close "$WORK/obf.npy" "$WORK/o32.npy" 0.03 1e-2

say "float16 output is a '<f2' .npy of the output's shape; bfloat16 output is float32"
if head -c 128 "$WORK/oh.npy" | grep -aq "'descr': '<f2'"; then ok; else bad "f16 output is not '<f2'"; fi
if head -c 128 "$WORK/obf.npy" | grep -aq "'descr': '<f4'"; then ok; else bad "bf16 output is not '<f4'"; fi
if [ "$(npy_shape "$WORK/oh.npy")" = "$(npy_shape "$WORK/o32.npy")" ]; then ok; else bad "f16 output shape"; fi
# The float16 output read back through the program: --dtype f16 on its own output
# as q, k and v gives a file, which is enough to show the '<f2' file loads.
run 0 "$ATTN" sdpa --query "$WORK/oh.npy" --key "$WORK/oh.npy" --value "$WORK/oh.npy" \
    --dtype f16 --output "$WORK/oh2.npy"

say "--dtype with --grad-output, and an unknown dtype, are usage errors"
run 2 "$ATTN" sdpa "${IN[@]}" --dtype bf16 --output "$WORK/x.npy" --grad-output "$WORK/o32.npy" \
    --grad-query "$WORK/dq.npy" --grad-key "$WORK/dk.npy" --grad-value "$WORK/dv.npy"
err_has "float32 only"
run 2 "$ATTN" sdpa "${IN[@]}" --dtype f64 --output "$WORK/x.npy"
err_has "f64"

say "attn bench --dtype bf16 runs a custom shape and says so; --mha --dtype is refused; S9 runs through a bfloat16 cache"
run 0 "$ATTN" bench --batch 1 --heads 2 --query-len 33 --head-dim 16 --causal --threads 2 \
    --impl all --runs 1 --dtype bf16
out_has "dtype=bfloat16"
out_has "cpu 16-bit features:"
run 2 "$ATTN" bench --mha --dtype f16 --runs 1
err_has "--dtype f16"
# S9 goes through the KV cache, which now stores 16 bits too (it was refused when
# the cache was float32 only).
run 0 "$ATTN" bench --shape S9 --dtype bf16 --runs 1 --threads 1
out_has "dtype=bfloat16"
say "attn bench --decode --dtype f16: the cache in float16, the K/V rate of its bytes, no allocation per step"
run 0 "$ATTN" bench --decode --prefill 40 --steps 5 --threads 2 --dtype f16 --json
n=$(grep -c '"kind":"decode",.*"allocs":0,"allocs_per_step":0.000,"dtype":"float16"' "$OUT_FILE")
[ "$n" -eq 3 ] && ok || bad "--decode --dtype f16: $n of 3 lines ($(cat "$OUT_FILE"))"
run 2 "$ATTN" bench --gemm --dtype bf16 --runs 1
err_has "not to --gemm"

cli_summary test_cli_half
