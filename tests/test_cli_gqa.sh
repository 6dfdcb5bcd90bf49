#!/bin/bash
# test_cli_gqa.sh - `attn forward --num-kv-heads` end to end: every grouped-query
# golden case of tests/data/golden_gqa/ (a Llama-style block from PyTorch 2.15, made
# by tests/golden/gen_gqa.py) gives PyTorch's output, attention weights and
# log-sum-exp within the tolerance of tests/test_golden.c (2e-6 + 1e-5 * |torch|; the
# reason is given there), and head counts that do not fit the weights are errors that
# name the shapes.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_gqa"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_gqa"
ATOL=2e-6
RTOL=1e-5

say "attn forward --num-kv-heads reproduces PyTorch's grouped-query block (output, weights, log-sum-exp) on every golden case"
ncases=0
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GOLD/$name"
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    args=(forward --weights "$dir/$c_weights" --prefix "$c_prefix" --num-heads "$c_num_heads"
          --num-kv-heads "$c_num_kv_heads" --input "$dir/$c_input")
    [ -n "$c_token_ids" ] && args+=(--token-ids "$dir/$c_token_ids" --pad-id "$c_pad_id")
    [ "$c_causal" = 1 ] && args+=(--causal)
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out.npy" --attention "$WORK/$name.attn.npy" \
        --lse "$WORK/$name.lse.npy"
    npy_close "$WORK/$name.out.npy" "$dir/$c_output" $ATOL $RTOL
    npy_close "$WORK/$name.attn.npy" "$dir/$c_attention" $ATOL $RTOL
    npy_close "$WORK/$name.lse.npy" "$dir/$c_lse" $ATOL $RTOL

    if [ "$c_num_kv_heads" = "$c_num_heads" ]; then
        say "$name: without --num-kv-heads (default: --num-heads) the output is the same file"
        run 0 "$ATTN" "${args[@]:0:7}" "${args[@]:9}" --output "$WORK/$name.d.out.npy" \
            --attention "$WORK/$name.d.attn.npy" --lse "$WORK/$name.d.lse.npy"
        for f in out attn lse; do
            if cmp -s "$WORK/$name.$f.npy" "$WORK/$name.d.$f.npy"; then ok; else bad "$name: the default Hkv changes $f"; fi
        done
    else
        say "$name: without --num-kv-heads the k_proj rows do not fit Hkv = H: exit 1 naming the shapes"
        run 1 "$ATTN" "${args[@]:0:7}" "${args[@]:9}" --output "$WORK/$name.err.npy"
        err_has "k_proj.weight' has shape"
        err_has "num_kv_heads $c_num_heads"
        [ -e "$WORK/$name.err.npy" ] && bad "an output was written for a failed run" || ok
    fi
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 5 ] && ok || bad "only $ncases grouped-query golden cases"

G="$GOLD/gqa_h4_kv2_nobias_causal"
P=model.layers.0.self_attn.
base=(forward --weights "$G/weights.safetensors" --prefix "$P" --input "$G/x.npy")

say "a head count that does not divide --num-heads is an error naming both (exit 1)"
run 1 "$ATTN" "${base[@]}" --num-heads 4 --num-kv-heads 3 --output "$WORK/e1.npy"
err_has "num_heads 4 is not a multiple of num_kv_heads 3"

say "query heads that do not fit q_proj's rows are an error naming the tensor and its shape"
run 1 "$ATTN" "${base[@]}" --num-heads 3 --num-kv-heads 1 --output "$WORK/e2.npy"
err_has "q_proj.weight' has shape (16, 16)"
run 1 "$ATTN" "${base[@]}" --num-heads 8 --num-kv-heads 2 --output "$WORK/e3.npy"
err_has "k_proj.weight' has shape (8, 16); expected (Hkv*D, E) for num_kv_heads 2, head_dim 2 = (4, 16)"

say "--num-kv-heads below 1 or not a number is a usage error (exit 2)"
run 2 "$ATTN" "${base[@]}" --num-heads 4 --num-kv-heads 0 --output "$WORK/e4.npy"
run 2 "$ATTN" "${base[@]}" --num-heads 4 --num-kv-heads two --output "$WORK/e5.npy"

F="$ATTN_TEST_DATA_DIR/golden/mha_chapter_pad_causal"
say "fused weights (the chapter's qkv.weight) have Hkv = H: --num-kv-heads H gives the same bytes, another count is an error that says why"
fbase=(forward --weights "$F/weights.safetensors" --num-heads 4 --input "$F/x.npy" --causal)
run 0 "$ATTN" "${fbase[@]}" --output "$WORK/f1.npy"
run 0 "$ATTN" "${fbase[@]}" --num-kv-heads 4 --output "$WORK/f2.npy"
if cmp -s "$WORK/f1.npy" "$WORK/f2.npy"; then ok; else bad "--num-kv-heads H changed the chapter's output"; fi
run 1 "$ATTN" "${fbase[@]}" --num-kv-heads 2 --output "$WORK/f3.npy"
err_has "a fused set with as many key/value heads as query heads"

say "attn forward --help documents --num-kv-heads and the grouped-query shapes"
run 0 "$ATTN" forward --help
out_has "--num-kv-heads Hkv"
out_has "k_proj.weight [Hkv*D,E]"

no_temp_files "$WORK"
cli_summary test_cli_gqa
