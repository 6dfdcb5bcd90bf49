#!/bin/bash
# test_cli_golden.sh - runs `attn forward` and `attn sdpa` end to end on every golden
# case of tests/data/golden/ (made with PyTorch by tests/golden/gen_golden.py) and
# compares the .npy files the program writes with PyTorch's, within the tolerance of
# tests/test_golden.c (2e-6 + 1e-5 * |torch|; the reason is given there).
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_golden"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden"
ATOL=2e-6
RTOL=1e-5

say "attn forward and attn sdpa reproduce PyTorch's outputs and attention weights on every golden case"
ncases=0
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GOLD/$name"
    # Read the case's key=value lines into c_<key> variables.
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    args=()
    if [ "$c_kind" = mha ]; then
        args=(forward --weights "$dir/$c_weights" --num-heads "$c_num_heads" --input "$dir/$c_input")
        [ -n "$c_prefix" ] && args+=(--prefix "$c_prefix")
        [ -n "$c_token_ids" ] && args+=(--token-ids "$dir/$c_token_ids" --pad-id "$c_pad_id")
    else
        args=(sdpa --query "$dir/$c_query" --key "$dir/$c_key" --value "$dir/$c_value")
        [ -n "$c_scale" ] && args+=(--scale "$c_scale")
    fi
    [ -n "$c_mask" ] && args+=(--mask "$dir/$c_mask")
    [ "$c_causal" = 1 ] && args+=(--causal)
    strict=("${args[@]}")
    [ "$c_empty_rows" = zero ] && args+=(--empty-rows zero)
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out.npy" --attention "$WORK/$name.attn.npy"
    npy_close "$WORK/$name.out.npy" "$dir/$c_output" $ATOL $RTOL
    npy_close "$WORK/$name.attn.npy" "$dir/$c_attention" $ATOL $RTOL

    # Without --attention only the output is written, and it is the same.
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out2.npy"
    if cmp -s "$WORK/$name.out.npy" "$WORK/$name.out2.npy"; then ok; else bad "$name: output differs without --attention"; fi

    if [ "$c_empty_rows" = zero ]; then
        say "$name: without --empty-rows zero the fully masked query row is an error (exit 1, one line)"
        run 1 "$ATTN" "${strict[@]}" --output "$WORK/$name.err.npy"
        err_has "masked"
        [ -e "$WORK/$name.err.npy" ] && bad "an output was written for a failed run" || ok
    fi
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 11 ] && ok || bad "only $ncases golden cases"
no_temp_files "$WORK"

say "with --num-heads that does not divide embed_dim, forward fails with one line naming both"
run 1 "$ATTN" forward --weights "$GOLD/mha_chapter_pad_causal/weights.safetensors" --num-heads 5 \
    --input "$GOLD/mha_chapter_pad_causal/x.npy" --output "$WORK/x.npy"
err_has "embed_dim 12"
err_has "num_heads 5"

say "without the prefix, forward fails naming the names it looked for and suggesting the prefix"
run 1 "$ATTN" forward --weights "$GOLD/mha_torch_prefix_mask/weights.safetensors" --num-heads 4 \
    --input "$GOLD/mha_torch_prefix_mask/x.npy" --output "$WORK/x.npy"
err_has "try the prefix 'layers.0.attn.'"

say "an input whose last axis is not embed_dim is refused with both sizes"
run 1 "$ATTN" forward --weights "$GOLD/mha_chapter_pad_causal/weights.safetensors" --num-heads 3 \
    --input "$GOLD/mha_torch_prefix_mask/x.npy" --output "$WORK/x.npy"
err_has "[B, T, 12]"
err_has "(3, 7, 20)"

say "a mask that does not broadcast is refused naming the mask file and both shapes"
run 1 "$ATTN" forward --weights "$GOLD/mha_chapter_pad_causal/weights.safetensors" --num-heads 3 \
    --input "$GOLD/mha_chapter_pad_causal/x.npy" --mask "$GOLD/mha_torch_prefix_mask/mask.npy" \
    --output "$WORK/x.npy"
err_has "mha_torch_prefix_mask/mask.npy"
err_has "(3, 1, 7, 7)"
run 1 "$ATTN" sdpa --query "$GOLD/sdpa_cross_mask/q.npy" --key "$GOLD/sdpa_cross_mask/k.npy" \
    --value "$GOLD/sdpa_cross_mask/v.npy" --mask "$GOLD/sdpa_pad_causal/mask.npy" --output "$WORK/x.npy"
err_has "sdpa_pad_causal/mask.npy"

say "--causal with Tq != Tk runs, top-left aligned as PyTorch's is_causal (the values are checked in tests/test_sdpa_ref.c)"
rm -f "$WORK/x.npy"
run 0 "$ATTN" sdpa --query "$GOLD/sdpa_cross_mask/q.npy" --key "$GOLD/sdpa_cross_mask/k.npy" \
    --value "$GOLD/sdpa_cross_mask/v.npy" --causal --output "$WORK/x.npy"
[ -s "$WORK/x.npy" ] && ok || bad "no output was written"

cli_summary test_cli_golden
