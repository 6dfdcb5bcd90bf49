#!/bin/bash
# test_cli_decode.sh - RoPE on the command line and `attn decode` end to end (SPEC
# section 7):
#   - `attn forward --rope` reproduces PyTorch 2.15's Llama-style block WITH RoPE
#     (tests/data/golden_gqa_rope/, made by tests/golden/gen_gqa_rope.py: both
#     pairings, bases 500000 and 2500, offsets 0, 5 and 37, fused and separate
#     weights) within the golden tolerance of tests/test_golden.c, 2e-6 + 1e-5 * |torch|
#     (float32 projections and softmax against a float64 block; the reason is given
#     there), and `attn sdpa --rope` the bottom-right rotated attention;
#   - `attn decode` equals `attn forward --causal` on the same input and weights
#     (output, attention weights and log-sum-exp) for MHA (the chapter's fused
#     weights), GQA and MQA, without RoPE and with either pairing, with a sliding
#     window, padding, RoPE offsets, prefill 0, 1, T-1 and T, and T = 1, 3, 17. The
#     bound: forward and decode are each within the golden tolerance of the exact
#     block, so they differ by at most twice it, 4e-6 + 2e-5 * |forward|;
#   - `attn decode --dtype bf16|f16` (the cache stored in 16 bits): token by token
#     equals one block through the cache within the bound above, and the output is
#     within two units of the dtype's rounding of `attn forward --causal`;
#   - bad flags and combinations: usage errors exit 2, the rest exit 1, each with
#     one line that names the problem.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_decode"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_gqa_rope"
ATOL=2e-6
RTOL=1e-5
DATOL=4e-6
DRTOL=2e-5

# load_case NAME: the case's keys as c_<key> variables, its folder as $dir.
load_case() {
    dir="$GOLD/$1"
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    wargs=(--weights "$dir/$c_weights" --num-heads "$c_num_heads" --num-kv-heads "$c_num_kv_heads")
    [ -n "$c_prefix" ] && wargs+=(--prefix "$c_prefix")
}

say "attn forward --rope reproduces PyTorch's attention block with RoPE (output, weights, log-sum-exp) on every golden case"
ncases=0
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    load_case "$name"
    args=(forward "${wargs[@]}" --input "$dir/$c_input" --causal --rope "$c_rope"
          --rope-base "$c_rope_base" --rope-offset "$c_rope_offset")
    [ -n "$c_token_ids" ] && args+=(--token-ids "$dir/$c_token_ids" --pad-id "$c_pad_id")
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out.npy" --attention "$WORK/$name.attn.npy" \
        --lse "$WORK/$name.lse.npy"
    npy_close "$WORK/$name.out.npy" "$dir/$c_output" $ATOL $RTOL
    npy_close "$WORK/$name.attn.npy" "$dir/$c_attention" $ATOL $RTOL
    npy_close "$WORK/$name.lse.npy" "$dir/$c_lse" $ATOL $RTOL
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 4 ] && ok || bad "only $ncases RoPE golden cases"

say "the comparison can fail: the other pairing, or no RoPE, is far from PyTorch's output"
load_case rope_gqa_half_base500k
for wrong in "--rope interleaved --rope-base 500000.0" "--rope half" ""; do
    # shellcheck disable=SC2086
    run 0 "$ATTN" forward "${wargs[@]}" --input "$dir/x.npy" --causal $wrong --output "$WORK/wrong.npy"
    CLI_FAILS_BEFORE=$CLI_FAILS
    npy_close "$WORK/wrong.npy" "$dir/out.npy" $ATOL $RTOL 2>/dev/null
    if [ "$CLI_FAILS" -gt "$CLI_FAILS_BEFORE" ]; then
        CLI_FAILS=$CLI_FAILS_BEFORE
        ok
    else
        bad "forward with '$wrong' matched the half/500000 golden output"
    fi
done

say "attn sdpa --rope rotates the keys at positions N .. N+Tk-1 and the queries at the last Tq of them (PyTorch's bottom-right case)"
S="$GOLD/sdpa_tail"
run 0 "$ATTN" sdpa --query "$S/q.npy" --key "$S/k.npy" --value "$S/v.npy" --causal-bottom-right \
    --rope half --rope-base 500000.0 --rope-offset 7 --output "$WORK/sdpa_tail.npy"
npy_close "$WORK/sdpa_tail.npy" "$S/out.npy" $ATOL $RTOL
D2="$ATTN_TEST_DATA_DIR/golden_decode"
run 0 "$ATTN" sdpa --query "$D2/decode_gqa_half/q.npy" --key "$D2/decode_gqa_half/k.npy" \
    --value "$D2/decode_gqa_half/v.npy" --causal --rope half --output "$WORK/sdpa_half.npy"
npy_close "$WORK/sdpa_half.npy" "$D2/decode_gqa_half/out.npy" 1e-5 1e-5
run 0 "$ATTN" sdpa --query "$D2/decode_gqa_interleaved_window/q.npy" \
    --key "$D2/decode_gqa_interleaved_window/k.npy" \
    --value "$D2/decode_gqa_interleaved_window/v.npy" --causal --window 5,0 \
    --rope interleaved --rope-base 500000.0 --output "$WORK/sdpa_win.npy"
npy_close "$WORK/sdpa_win.npy" "$D2/decode_gqa_interleaved_window/out.npy" 1e-5 1e-5

# decode_vs_forward TAG T PREFILLS -- ARGS...: attn decode with each prefill equals
# attn forward --causal with the same ARGS (output, weights, log-sum-exp).
decode_vs_forward() {
    local tag=$1 prefills=$3
    shift 4
    run 0 "$ATTN" forward "$@" --causal --output "$WORK/$tag.f.npy" \
        --attention "$WORK/$tag.fa.npy" --lse "$WORK/$tag.fl.npy"
    local pf
    for pf in $prefills; do
        run 0 "$ATTN" decode "$@" --prefill "$pf" --output "$WORK/$tag.d$pf.npy" \
            --attention "$WORK/$tag.da$pf.npy" --lse "$WORK/$tag.dl$pf.npy"
        npy_close "$WORK/$tag.d$pf.npy" "$WORK/$tag.f.npy" $DATOL $DRTOL
        npy_close "$WORK/$tag.da$pf.npy" "$WORK/$tag.fa.npy" $DATOL $DRTOL
        npy_close "$WORK/$tag.dl$pf.npy" "$WORK/$tag.fl.npy" $DATOL $DRTOL
    done
}

IN="$GOLD/decode"
say "attn decode == attn forward --causal: MHA (fused), GQA, MQA; no RoPE, interleaved, half; T = 1, 3, 17; prefill 0, 1, T-1, T"
for weights in rope_chapter_interleaved_base500k rope_gqa_half_base500k rope_mqa_interleaved_offset37_pad; do
    load_case "$weights"
    for T in 1 3 17; do
        prefills=$(printf '%s\n' 0 1 $((T - 1)) "$T" | sort -un | tr '\n' ' ')
        for rope in none interleaved half; do
            ropeargs=()
            [ "$rope" != none ] && ropeargs=(--rope "$rope")
            decode_vs_forward "$weights.t$T.$rope" "$T" "$prefills" -- "${wargs[@]}" \
                --input "$IN/x_t$T.npy" "${ropeargs[@]}"
        done
    done
done

say "attn decode == attn forward --causal with a sliding window (alone and with RoPE, a base and an offset the cache does not apply itself)"
load_case rope_gqa_half_base500k
decode_vs_forward win "" "0 5 17" -- "${wargs[@]}" --input "$IN/x_t17.npy" --window 4,0
decode_vs_forward win_rope "" "0 1 16" -- "${wargs[@]}" --input "$IN/x_t17.npy" --window 4,0 \
    --rope half --rope-base 500000.0
decode_vs_forward win_off "" "0 7" -- "${wargs[@]}" --input "$IN/x_t17.npy" --window 2,0 \
    --rope interleaved --rope-offset 4090
load_case rope_chapter_interleaved_base500k
decode_vs_forward win_mha "" "0 3" -- "${wargs[@]}" --input "$IN/x_t17.npy" --window 6,0 \
    --rope interleaved --rope-offset 5

say "attn decode == attn forward --causal with padding: a padded key stays hidden (pads at the end; pads first, whose rows see nothing, with --empty-rows zero)"
load_case rope_mqa_interleaved_offset37_pad
decode_vs_forward pad_right "" "0 1 9 17" -- "${wargs[@]}" --input "$IN/x_t17.npy" \
    --token-ids "$IN/ids_right.npy" --pad-id 0 --rope half
decode_vs_forward pad_left "" "0 2 17" -- "${wargs[@]}" --input "$IN/x_t17.npy" \
    --token-ids "$IN/ids_left.npy" --pad-id 0 --empty-rows zero --rope interleaved
say "... and a padded key changes nothing: padding the last key of sequence 1 changes only its rows, and no row sees it"
run 0 "$ATTN" decode "${wargs[@]}" --input "$IN/x_t17.npy" --prefill 3 --output "$WORK/nopad.npy"
run 0 "$ATTN" decode "${wargs[@]}" --input "$IN/x_t17.npy" --prefill 3 --token-ids "$IN/ids_right.npy" \
    --pad-id 0 --attention "$WORK/pad_att.npy" --output "$WORK/pad.npy"
# Sequence 1's last three keys (positions 14..16) are padded: their weights must be 0
# in every row of that sequence; sequence 0 is untouched.
res=$(npy_floats "$WORK/pad_att.npy" | awk -v H=4 -v T=17 '
    { i = NR - 1; b = int(i / (H * T * T)); j = i % T; if (b == 1 && j >= 14 && $1 != 0) bad++ }
    END { print bad + 0 }')
[ "$res" -eq 0 ] && ok || bad "$res weights on padded keys are not 0"
paste <(npy_floats "$WORK/nopad.npy" | head -n $((17 * 32))) <(npy_floats "$WORK/pad.npy" | head -n $((17 * 32))) |
    awk '$1 != $2 { d++ } END { exit d > 0 }' && ok || bad "padding sequence 1 changed sequence 0"

say "a [T, E] input with [T] token ids (PyTorch's single-sequence GQA case, E = 8, D = 4) decodes to the [T, E] forward output"
Q1="$ATTN_TEST_DATA_DIR/golden_gqa/gqa_single_h2_kv1_pad"
decode_vs_forward single "" "0 2 6" -- --weights "$Q1/weights.safetensors" \
    --prefix model.layers.0.self_attn. --num-heads 2 --num-kv-heads 1 --input "$Q1/x.npy" \
    --token-ids "$Q1/ids.npy" --pad-id 0 --rope half
[ "$(npy_shape "$WORK/single.d2.npy")" = "(6, 8)" ] && ok || bad "single: shape $(npy_shape "$WORK/single.d2.npy")"

say "--stats says the decoding steps after the first allocated nothing"
load_case rope_gqa_half_base500k
run 0 "$ATTN" decode "${wargs[@]}" --input "$GOLD/rope_gqa_half_base500k/x.npy" --prefill 2 \
    --rope half --stats --output "$WORK/stats.npy"
out_has "prefill 2 tokens, 5 steps of 1 token, allocations in the steps after the first: 0"
run 0 "$ATTN" decode "${wargs[@]}" --input "$IN/x_t17.npy" --prefill 0 --rope half \
    --window 3,0 --stats --output "$WORK/stats0.npy"
out_has "prefill 0 tokens, 17 steps of 1 token, allocations in the steps after the first: 0"

say "attn decode --dtype: f32 is the default's bits; a bf16 or f16 cache decodes token by token as one block through it does, and stays within two units of its rounding of attn forward --causal"
load_case rope_gqa_half_base500k
dargs=("${wargs[@]}" --input "$IN/x_t17.npy" --rope half --window 5,0)
run 0 "$ATTN" decode "${dargs[@]}" --prefill 3 --output "$WORK/dt_default.npy"
run 0 "$ATTN" decode "${dargs[@]}" --prefill 3 --dtype f32 --output "$WORK/dt_f32.npy"
npy_close "$WORK/dt_f32.npy" "$WORK/dt_default.npy" 0 0
run 0 "$ATTN" forward "${dargs[@]}" --causal --output "$WORK/dt_fwd.npy"
# Each key and value is rounded once as it is appended (relative error at most u:
# 2^-8 for bfloat16, 2^-11 for float16), so the softmax-weighted sums of V and the
# scores move by about u times their size; on this input |y| < 1 (0.71 at most), so
# two units, 2u, bound the difference from float32 (measured: 0.0014 and 0.00025).
# Token by token and one block through the same cache round the same keys the same
# way and differ only in the order of sums: the decode bound above.
for dt in bf16 f16; do
    [ "$dt" = bf16 ] && tol=0.0078125 || tol=0.0009765625
    for pf in 0 17; do
        run 0 "$ATTN" decode "${dargs[@]}" --prefill $pf --dtype $dt --output "$WORK/dt_$dt.$pf.npy"
    done
    npy_close "$WORK/dt_$dt.0.npy" "$WORK/dt_$dt.17.npy" $DATOL $DRTOL
    npy_close "$WORK/dt_$dt.0.npy" "$WORK/dt_fwd.npy" $tol 0
    # The rounding happened: the 16-bit cache's output is not float32's.
    cmp -s "$WORK/dt_$dt.17.npy" "$WORK/dt_default.npy" && bad "--dtype $dt changed nothing" || ok
done

say "bad flags are usage errors (exit 2) naming the value"
base=(decode "${wargs[@]}" --input "$IN/x_t3.npy" --output "$WORK/bad.npy")
run 2 "$ATTN" "${base[@]}" --prefill -1
err_has "--prefill must be at least 0 (got -1)"
run 2 "$ATTN" "${base[@]}" --prefill two
err_has "--prefill takes a whole number"
run 2 "$ATTN" "${base[@]}" --dtype f8
err_has "--dtype takes f32|bf16|f16, not 'f8'"
for cmd in forward decode; do
    b=("$cmd" "${wargs[@]}" --input "$IN/x_t3.npy" --output "$WORK/bad.npy")
    run 2 "$ATTN" "${b[@]}" --rope sideways
    err_has "--rope takes interleaved|half, not 'sideways'"
    run 2 "$ATTN" "${b[@]}" --rope half --rope-base 0
    err_has "--rope-base must be a number > 0 (got 0)"
    run 2 "$ATTN" "${b[@]}" --rope half --rope-base -10000
    err_has "--rope-base must be a number > 0 (got -10000)"
    run 2 "$ATTN" "${b[@]}" --rope half --rope-base 1e39
    err_has "too large for float32"
    run 2 "$ATTN" "${b[@]}" --rope half --rope-offset -1
    err_has "--rope-offset must be at least 0 (got -1)"
    run 2 "$ATTN" "${b[@]}" --rope-base 500000.0
    err_has "--rope-base needs --rope interleaved|half"
    run 2 "$ATTN" "${b[@]}" --rope-offset 3
    err_has "--rope-offset needs --rope interleaved|half"
    run 2 "$ATTN" "${b[@]}" --rope half --rope half
    [ -e "$WORK/bad.npy" ] && bad "$cmd wrote an output after a usage error" || ok
done
run 2 "$ATTN" sdpa --query "$S/q.npy" --key "$S/k.npy" --value "$S/v.npy" --rope-offset 2 \
    --output "$WORK/bad.npy"
err_has "--rope-offset needs --rope"

say "bad combinations are errors (exit 1) naming the shapes"
run 1 "$ATTN" "${base[@]}" --prefill 4
err_has "--prefill 4 is more than the input's 3 tokens"
# The last of the 3 tokens would sit past int64: named by the offset as given, once,
# not by the offset of the step that reached it.
for prefill in 0 2; do
    run 1 "$ATTN" "${base[@]}" --prefill $prefill --rope half --rope-offset 9223372036854775806
    err_has "--rope-offset 9223372036854775806: the input's 3 tokens would sit at positions beyond"
    [ -e "$WORK/bad.npy" ] && bad "decode wrote an output after the offset error" || ok
done
# The last token at int64's largest position itself: taken.
run 0 "$ATTN" decode "${wargs[@]}" --input "$IN/x_t3.npy" --output "$WORK/offset_max.npy" \
    --prefill 1 --rope half --rope-offset 9223372036854775805
O="$ATTN_TEST_DATA_DIR/golden_gqa/gqa_h4_kv2_d3_qkvbias_pad"
for cmd in forward decode; do
    run 1 "$ATTN" "$cmd" --weights "$O/weights.safetensors" --prefix model.layers.0.self_attn. \
        --num-heads 4 --num-kv-heads 2 --input "$O/x.npy" --rope half --output "$WORK/bad.npy"
    err_has "RoPE needs an even head dim: D=3 is odd"
done
run 1 "$ATTN" decode --weights "$dir/$c_weights" --prefix "$c_prefix" --num-heads 4 --num-kv-heads 3 \
    --input "$IN/x_t3.npy" --output "$WORK/bad.npy"
err_has "num_heads 4 is not a multiple of num_kv_heads 3"
run 1 "$ATTN" sdpa --query "$S/k.npy" --key "$S/q.npy" --value "$S/q.npy" --rope half \
    --output "$WORK/bad.npy"
err_has "the first query would sit at position -7"
[ -e "$WORK/bad.npy" ] && bad "an output was written for a failed run" || ok

say "the help pages document the new options"
run 0 "$ATTN" decode --help
out_has "--prefill N"
out_has "N = 0 means no prefill"
out_has "--dtype f32|bf16|f16"
run 0 "$ATTN" forward --help
out_has "--rope interleaved|half"
run 0 "$ATTN" sdpa --help
out_has "--rope-offset N"
run 0 "$ATTN" --help
out_has "decode"

cli_summary test_cli_decode
