#!/bin/bash
# test_cli_bad_inputs.sh - what a user who gets the gradient (SPEC section 8) and
# 16-bit (section 10) flags of `attn sdpa` and `attn forward` wrong sees: one line
# naming the flag and the value, the exit status of SPEC section 4, no crash, no
# file half-written, and no input replaced by an output. The odd inputs are
# tests/data/cli_inputs/ (tests/golden/gen_cli_inputs.py); the broken files are
# made here from copies of them.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_bad_inputs"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
D="$ATTN_TEST_DATA_DIR/cli_inputs"
QKV=(--query "$D/q.npy" --key "$D/k.npy" --value "$D/v.npy")
G=(--grad-query "$WORK/dq.npy" --grad-key "$WORK/dk.npy" --grad-value "$WORK/dv.npy")
FWD=(forward --weights "$D/w_f16.safetensors" --num-heads 2 --input "$D/x.npy")

# nothing_written: no file of a failed run is in $WORK (only stdout, stderr and the
# inputs this test put there), and no temporary file is left.
nothing_written() {
    local left
    left=$(ls "$WORK" | grep -Ev '^(stdout|stderr|in\..*)$')
    if [ -n "$left" ]; then bad "a failed run wrote: $left"; else ok; fi
    no_temp_files "$WORK"
}

# npy_header DESCR SHAPE: a version-1 .npy header (padded to 64 bytes, as numpy
# writes it) for DESCR and SHAPE, e.g. npy_header '<f4' '(1, 2, 0, 4)'.
npy_header() {
    local dict="{'descr': '$1', 'fortran_order': False, 'shape': $2, }"
    local len=$((10 + ${#dict} + 1))
    local pad=$(((64 - len % 64) % 64))
    local hl=$((${#dict} + pad + 1))
    printf '\223NUMPY\001\000'
    printf "\\$(printf '%03o' $((hl % 256)))\\$(printf '%03o' $((hl / 256)))"
    printf '%s%*s\n' "$dict" "$pad" ""
}

say "an output that names an input file is a usage error (exit 2) naming both flags, and the input is left as it was"
cp "$D/q.npy" "$WORK/in.q.npy"
run 2 "$ATTN" sdpa --query "$WORK/in.q.npy" --key "$D/k.npy" --value "$D/v.npy" \
    --output "$WORK/in.q.npy"
err_has "--output $WORK/in.q.npy is also read as --query"
cmp -s "$WORK/in.q.npy" "$D/q.npy" && ok || bad "--output over --query changed the query file"
cp "$D/do.npy" "$WORK/in.do.npy"
run 2 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$WORK/in.do.npy" \
    --grad-query "$WORK/dq.npy" --grad-key "$WORK/dk.npy" --grad-value "$WORK/in.do.npy"
err_has "--grad-value $WORK/in.do.npy is also read as --grad-output"
cmp -s "$WORK/in.do.npy" "$D/do.npy" && ok || bad "--grad-value over --grad-output changed dO"
# Another spelling of the same file (./, a link) is the same file.
cp "$D/w_f16.safetensors" "$WORK/in.w.safetensors"
ln -s "$WORK/in.w.safetensors" "$WORK/in.link.safetensors"
run 2 "$ATTN" forward --weights "$WORK/in.w.safetensors" --num-heads 2 --input "$D/x.npy" \
    --output "$WORK/y.npy" --grad-output "$D/dy.npy" --grad-weights "$WORK/./in.w.safetensors"
err_has "is also read as --weights"
run 2 "$ATTN" forward --weights "$WORK/in.link.safetensors" --num-heads 2 --input "$D/x.npy" \
    --output "$WORK/y.npy" --grad-output "$D/dy.npy" --grad-weights "$WORK/in.w.safetensors"
err_has "is also read as --weights"
cmp -s "$WORK/in.w.safetensors" "$D/w_f16.safetensors" && ok ||
    bad "--grad-weights over --weights changed the weights file"
run 2 "$ATTN" decode --weights "$D/w_f16.safetensors" --num-heads 2 --input "$D/x.npy" \
    --output "$D/x.npy"
err_has "is also read as --input"
nothing_written

say "a dO that is not a float array of the output's shape is an error (exit 1) naming --grad-output and the problem"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$D/do_i32.npy" "${G[@]}"
err_has "--grad-output $D/do_i32.npy: dout must be float32, not int32"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$D/q17_f16.npy" "${G[@]}"
err_has "dout has shape (1, 3, 17, 3); expected (1, 2, 3, 4)"
run 1 "$ATTN" "${FWD[@]}" --output "$WORK/y.npy" --grad-output "$D/dy_wrong.npy" \
    --grad-input "$WORK/dx.npy"
err_has "--grad-output $D/dy_wrong.npy: expected float (2, 3, 8) (the output's shape), got float32 (2, 3, 9)"
run 1 "$ATTN" "${FWD[@]}" --output "$WORK/y.npy" --grad-output "$D/do_i32.npy" \
    --grad-input "$WORK/dx.npy"
err_has "got int32 (1, 2, 3, 4)"
# An empty dO, one whose size overflows, and one cut short.
npy_header '<f4' '(1, 2, 0, 4)' >"$WORK/in.empty.npy"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$WORK/in.empty.npy" "${G[@]}"
err_has "--grad-output: $WORK/in.empty.npy: the array of shape (1, 2, 0, 4) is empty"
npy_header '<f4' '(1, 2, 4611686018427387904, 4)' >"$WORK/in.huge.npy"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$WORK/in.huge.npy" "${G[@]}"
err_has "overflows 64 bits"
head -c 150 "$D/do_f16.npy" >"$WORK/in.short16.npy"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$WORK/in.short16.npy" "${G[@]}"
err_has "--grad-output: $WORK/in.short16.npy: truncated"
nothing_written

say "a float16 dO is widened exactly: the gradients equal, bit for bit, those of the float32 file of the same values"
run 0 "$ATTN" sdpa "${QKV[@]}" --causal --output "$WORK/o32.npy" --grad-output "$D/do.npy" \
    --grad-query "$WORK/dq32.npy" --grad-key "$WORK/dk32.npy" --grad-value "$WORK/dv32.npy"
run 0 "$ATTN" sdpa "${QKV[@]}" --causal --output "$WORK/o16.npy" --grad-output "$D/do_f16.npy" \
    --grad-query "$WORK/dq16.npy" --grad-key "$WORK/dk16.npy" --grad-value "$WORK/dv16.npy"
for f in dq dk dv; do
    cmp -s "$WORK/${f}32.npy" "$WORK/${f}16.npy" && ok || bad "$f from a float16 dO differs from float32's"
done

say "a NaN in dO (head 1, query 2, feature 3) reaches exactly that row's dq, head 1's dk and feature 3 of head 1's dv; every other gradient is a number"
run 0 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/on.npy" --grad-output "$D/do_nan.npy" \
    --grad-query "$WORK/dqn.npy" --grad-key "$WORK/dkn.npy" --grad-value "$WORK/dvn.npy"
# nan_at FILE: the flat indices of NaN values, space-separated.
nan_at() { npy_floats "$1" | awk '$1 ~ /nan/ { printf "%s%d", sep, NR - 1; sep = " " }'; }
# [1, 2, 3, 4]: dq row (h 1, i 2) is 20..23; dk of head 1 is 12..23; dv (h 1, j, d 3)
# is 15, 19, 23.
want_dq="20 21 22 23" want_dk="12 13 14 15 16 17 18 19 20 21 22 23" want_dv="15 19 23"
[ "$(nan_at "$WORK/dqn.npy")" = "$want_dq" ] && ok || bad "NaN in dq at '$(nan_at "$WORK/dqn.npy")', expected '$want_dq'"
[ "$(nan_at "$WORK/dkn.npy")" = "$want_dk" ] && ok || bad "NaN in dk at '$(nan_at "$WORK/dkn.npy")', expected '$want_dk'"
[ "$(nan_at "$WORK/dvn.npy")" = "$want_dv" ] && ok || bad "NaN in dv at '$(nan_at "$WORK/dvn.npy")', expected '$want_dv'"
[ -z "$(nan_at "$WORK/on.npy")" ] && ok || bad "the forward's output has NaN at '$(nan_at "$WORK/on.npy")'"
rm -f "$WORK"/o*.npy "$WORK"/d[qkv]*.npy

say "16-bit inputs of odd sizes (float16 [1, 3, 17, 3]) run under --dtype f32, bf16 and f16, the output in the input's shape"
for dt in f32 bf16 f16; do
    run 0 "$ATTN" sdpa --query "$D/q17_f16.npy" --key "$D/q17_f16.npy" --value "$D/q17_f16.npy" \
        --causal --dtype "$dt" --output "$WORK/o17.$dt.npy"
    [ "$(npy_shape "$WORK/o17.$dt.npy")" = "(1, 3, 17, 3)" ] && ok ||
        bad "--dtype $dt: output shape '$(npy_shape "$WORK/o17.$dt.npy")'"
done
rm -f "$WORK"/o17.*.npy

say "a truncated or garbled F16/BF16 weights file is an error (exit 1) naming the file and the problem, with --grad-weights too, and writes nothing"
for w in w_f16 w_bf16; do
    size=$(stat -c %s "$D/$w.safetensors")
    head -c $((size - 3)) "$D/$w.safetensors" >"$WORK/in.cut.safetensors"
    run 1 "$ATTN" forward --weights "$WORK/in.cut.safetensors" --num-heads 2 --input "$D/x.npy" \
        --output "$WORK/y.npy" --grad-output "$D/dy.npy" --grad-input "$WORK/dx.npy" \
        --grad-weights "$WORK/g.safetensors"
    err_has "$WORK/in.cut.safetensors: tensor"
    err_has "out of range"
    # The dtype in the header made unknown: F16 -> F17, BF16 -> BF17.
    cp "$D/$w.safetensors" "$WORK/in.garbled.safetensors"
    at=$(grep -abo '"[B]*F16"' "$WORK/in.garbled.safetensors" | head -n 1 | cut -d: -f1)
    name=$(grep -ao '"[B]*F16"' "$WORK/in.garbled.safetensors" | head -n 1 | tr -d '"')
    printf '7' | dd of="$WORK/in.garbled.safetensors" bs=1 seek=$((at + ${#name})) conv=notrunc \
        2>/dev/null
    run 1 "$ATTN" forward --weights "$WORK/in.garbled.safetensors" --num-heads 2 \
        --input "$D/x.npy" --output "$WORK/y.npy" --grad-output "$D/dy.npy" \
        --grad-weights "$WORK/g.safetensors"
    err_has "unknown dtype '${name%6}7'"
done
nothing_written

say "a gradient output that is a directory fails the run (exit 1) naming it, and no output of the set is written"
mkdir -p "$WORK/in.dir"
run 1 "$ATTN" sdpa "${QKV[@]}" --output "$WORK/o.npy" --grad-output "$D/do.npy" \
    --grad-query "$WORK/dq.npy" --grad-key "$WORK/in.dir" --grad-value "$WORK/dv.npy"
err_has "$WORK/in.dir: is a directory"
nothing_written

cli_summary test_cli_bad_inputs
