#!/bin/bash
# test_cli_options.sh - the options of current models (SPEC section 6) on the command
# line: every golden case of tests/data/golden_options/ (made with PyTorch by
# tests/golden/gen_options.py) run through `attn sdpa` with the flags its case.txt
# names, the output, weights and log-sum-exp compared with PyTorch's within the
# tolerance of tests/test_golden.c (2e-6 + 1e-5 * |torch|; the reason is given
# there); `attn forward` passing each option to the attention inside; and every bad
# combination refused as a usage error (exit 2) or a shape error (exit 1) that names
# the values.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_options"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_options"
MHA="$ATTN_TEST_DATA_DIR/golden"
ATOL=2e-6
RTOL=1e-5

# npy_drop_lead IN OUT: a copy of IN, a version-1 .npy whose first axis has size 1,
# without that axis: "(1, 6, 4, 4)" becomes "(6, 4, 4)". The header keeps its length
# (the three characters "1, " become spaces before its closing newline).
npy_drop_lead() {
    local hl hdr
    hl=$(od -An -j8 -N2 -tu2 "$1" | tr -d ' ')
    hdr=$(head -c $((10 + hl)) "$1" | tail -c +11)
    case "$hdr" in *"'shape': (1, "*) ;; *) bad "npy_drop_lead: $1 does not start with an axis of 1"; return ;; esac
    hdr=${hdr/"'shape': (1, "/"'shape': ("}
    { head -c 10 "$1"; printf '%s   \n' "$hdr"; tail -c +$((11 + hl)) "$1"; } >"$2"
}

# npy_f32_zeros FILE SHAPE...: a version-1 float32 .npy of zeros (all bytes 0).
npy_f32_zeros() {
    local file=$1
    shift
    local n=1 d dims
    for d in "$@"; do n=$((n * d)); done
    if [ $# -eq 1 ]; then dims="$1,"; else dims=$(IFS=,; echo "$*" | sed 's/,/, /g'); fi
    local dict="{'descr': '<f4', 'fortran_order': False, 'shape': ($dims), }"
    local len=$((10 + ${#dict} + 1))
    local pad=$(((64 - len % 64) % 64))
    local hl=$((${#dict} + pad + 1))
    {
        printf '\223NUMPY\001\000'
        printf "\\$(printf '%03o' $((hl % 256)))\\$(printf '%03o' $((hl / 256)))"
        printf '%s%*s\n' "$dict" "$pad" ""
        head -c $((4 * n)) /dev/zero
    } >"$file"
}

# case_args DIR: the `attn sdpa` flags for the case in DIR, into the array `args`
# (without --empty-rows and the outputs); c_<key> holds each key of its case.txt.
case_args() {
    local dir=$1
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    args=(sdpa --query "$dir/$c_query" --key "$dir/$c_key" --value "$dir/$c_value")
    [ -n "$c_mask" ] && args+=(--mask "$dir/$c_mask")
    case "$c_causal" in
    1) args+=(--causal) ;;
    2) args+=(--causal-bottom-right) ;;
    esac
    [ -n "$c_scale" ] && args+=(--scale "$c_scale")
    [ -n "$c_window" ] && args+=(--window "$c_window")
    [ -n "$c_softcap" ] && args+=(--softcap "$c_softcap")
    case "$c_alibi" in
    '' | 0) ;;
    1) args+=(--alibi) ;;
    *) args+=(--alibi-slopes "$dir/$c_alibi") ;;
    esac
    [ -n "$c_bias" ] && args+=(--bias "$dir/$c_bias")
    [ -n "$c_sinks" ] && args+=(--sinks "$dir/$c_sinks")
    return 0
}

say "attn sdpa reproduces PyTorch's output, weights and log-sum-exp on every golden case of the options"
ncases=0
seen_flags=""
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GOLD/$name"
    case_args "$dir"
    seen_flags="$seen_flags ${args[*]}"
    strict=("${args[@]}")
    [ "$c_empty_rows" = zero ] && args+=(--empty-rows zero)
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out.npy" --attention "$WORK/$name.attn.npy" \
        --lse "$WORK/$name.lse.npy"
    npy_close "$WORK/$name.out.npy" "$dir/$c_output" $ATOL $RTOL
    npy_close "$WORK/$name.attn.npy" "$dir/$c_attention" $ATOL $RTOL
    npy_close "$WORK/$name.lse.npy" "$dir/$c_lse" $ATOL $RTOL

    # Without --attention the output and the log-sum-exp are the same.
    run 0 "$ATTN" "${args[@]}" --output "$WORK/$name.out2.npy" --lse "$WORK/$name.lse2.npy"
    if cmp -s "$WORK/$name.out.npy" "$WORK/$name.out2.npy" && cmp -s "$WORK/$name.lse.npy" "$WORK/$name.lse2.npy"; then
        ok
    else bad "$name: output or lse differs without --attention"; fi

    if [ "$c_empty_rows" = zero ] && [ -z "$c_sinks" ]; then
        say "$name: without --empty-rows zero the query row that sees no key is an error, and no output is written"
        run 1 "$ATTN" "${strict[@]}" --output "$WORK/$name.err.npy" --lse "$WORK/$name.err.lse.npy"
        err_has "--empty-rows zero"
        [ -e "$WORK/$name.err.npy" ] || [ -e "$WORK/$name.err.lse.npy" ] && bad "$name: an output was written for a failed run" || ok
    fi
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 14 ] && ok || bad "only $ncases golden cases of the options"
# Every flag of section 6 was exercised end to end by at least one case.
for f in --causal --causal-bottom-right --window --softcap --alibi --alibi-slopes --bias --sinks --scale --mask; do
    case "$seen_flags " in *" $f "*) ok ;; *) bad "no golden case runs $f" ;; esac
done
no_temp_files "$WORK"

say "3-D inputs [H, T, D] give a log-sum-exp [H, Tq] with the 4-D case's values"
d3="$WORK/three_d"
mkdir -p "$d3"
g="$GOLD/alibi_default_6_heads"
for f in q k v out attn lse; do npy_drop_lead "$g/$f.npy" "$d3/$f.npy"; done
run 0 "$ATTN" sdpa --query "$d3/q.npy" --key "$d3/k.npy" --value "$d3/v.npy" --causal-bottom-right --alibi \
    --output "$WORK/3d.out.npy" --attention "$WORK/3d.attn.npy" --lse "$WORK/3d.lse.npy"
[ "$(npy_shape "$WORK/3d.lse.npy")" = "(6, 4)" ] && ok || bad "3-D lse shape is $(npy_shape "$WORK/3d.lse.npy"), expected (6, 4)"
npy_close "$WORK/3d.out.npy" "$d3/out.npy" $ATOL $RTOL
npy_close "$WORK/3d.attn.npy" "$d3/attn.npy" $ATOL $RTOL
npy_close "$WORK/3d.lse.npy" "$d3/lse.npy" $ATOL $RTOL

say "2-D inputs [T, D] give an output [Tq, Dv] and a log-sum-exp [Tq]"
npy_f32_zeros "$WORK/2d.q.npy" 4 8
npy_f32_zeros "$WORK/2d.kv.npy" 6 8
run 0 "$ATTN" sdpa --query "$WORK/2d.q.npy" --key "$WORK/2d.kv.npy" --value "$WORK/2d.kv.npy" \
    --output "$WORK/2d.out.npy" --lse "$WORK/2d.lse.npy"
[ "$(npy_shape "$WORK/2d.lse.npy")" = "(4,)" ] && ok || bad "2-D lse shape is $(npy_shape "$WORK/2d.lse.npy"), expected (4,)"
[ "$(npy_shape "$WORK/2d.out.npy")" = "(4, 8)" ] && ok || bad "2-D output shape is $(npy_shape "$WORK/2d.out.npy"), expected (4, 8)"

say "--help describes every option of section 6, for sdpa and forward"
for cmd in sdpa forward; do
    run 0 "$ATTN" "$cmd" --help
    for f in --causal-bottom-right --window --softcap --alibi --alibi-slopes --bias --sinks --lse; do out_has "$f"; done
done

# ---- attn forward ----
FW="$MHA/mha_torch_prefix_mask" # B=3, T=7, E=20, H=4
fw=(forward --weights "$FW/weights.safetensors" --prefix layers.0.attn. --num-heads 4 --input "$FW/x.npy")
SINKS4="$GOLD/sinks/sinks.npy" # [4]

say "forward: --causal-bottom-right is --causal for self-attention, byte for byte"
run 0 "$ATTN" "${fw[@]}" --causal --output "$WORK/fw_tl.npy" --attention "$WORK/fw_tl.attn.npy"
run 0 "$ATTN" "${fw[@]}" --causal-bottom-right --output "$WORK/fw_br.npy" --attention "$WORK/fw_br.attn.npy"
cmp -s "$WORK/fw_tl.npy" "$WORK/fw_br.npy" && cmp -s "$WORK/fw_tl.attn.npy" "$WORK/fw_br.attn.npy" && ok ||
    bad "forward --causal-bottom-right differs from --causal"

say "forward: --window 0,0 leaves each position only itself (weights exactly the identity)"
run 0 "$ATTN" "${fw[@]}" --window 0,0 --output "$WORK/fw_w.npy" --attention "$WORK/fw_w.attn.npy"
res=$(npy_floats "$WORK/fw_w.attn.npy" | awk -v T=7 '{ i = int((NR - 1) / T) % T; j = (NR - 1) % T;
    want = (i == j) ? 1 : 0; if ($1 != want) { bad++; if (bad < 4) printf "[%d] %s vs %s; ", NR - 1, $1, want } }
    END { printf "%d %d", NR, bad + 0 }')
[ "${res% *}" -eq $((3 * 4 * 7 * 7)) ] && [ "${res#* }" = 0 ] && ok || bad "forward --window 0,0 weights: $res"

say "forward: --sinks and --lse: each row's weights sum to 1 - exp(sink_h - lse) (to 1e-6), lse is [B, H, T]"
run 0 "$ATTN" "${fw[@]}" --sinks "$SINKS4" --output "$WORK/fw_s.npy" --attention "$WORK/fw_s.attn.npy" --lse "$WORK/fw_s.lse.npy"
[ "$(npy_shape "$WORK/fw_s.lse.npy")" = "(3, 4, 7)" ] && ok || bad "forward lse shape $(npy_shape "$WORK/fw_s.lse.npy")"
res=$( { npy_floats "$SINKS4" | sed 's/^/S /'; npy_floats "$WORK/fw_s.lse.npy" | sed 's/^/L /'; npy_floats "$WORK/fw_s.attn.npy" | sed 's/^/W /'; } |
    awk -v T=7 -v H=4 '
    $1 == "S" { sink[ns++] = $2; next }
    $1 == "L" { lse[nl++] = $2; next }
    { row = int(nw / T); sum[row] += $2; nw++ }
    END { for (r = 0; r < nl; r++) { h = int(r / T) % H; want = 1 - exp(sink[h] - lse[r]);
              d = sum[r] - want; if (d < 0) d = -d; if (!(d <= 1e-6) || !(sum[r] < 1)) { bad++; if (bad < 4) printf "row %d: sum %.9g vs %.9g; ", r, sum[r], want } }
          printf "%d %d", nl, bad + 0 }')
[ "${res% *}" -eq $((3 * 4 * 7)) ] && [ "${res#* }" = 0 ] && ok || bad "forward sinks/lse: $res"

say "forward: a zero --bias, zero --alibi-slopes and a huge --softcap leave the output as it was (within the tolerance)"
run 0 "$ATTN" "${fw[@]}" --output "$WORK/fw_plain.npy"
npy_f32_zeros "$WORK/zero_bias.npy" 1 1 1 7
npy_f32_zeros "$WORK/zero_slopes.npy" 4
run 0 "$ATTN" "${fw[@]}" --bias "$WORK/zero_bias.npy" --alibi-slopes "$WORK/zero_slopes.npy" --softcap 1e30 \
    --output "$WORK/fw_neutral.npy"
npy_close "$WORK/fw_neutral.npy" "$WORK/fw_plain.npy" $ATOL $RTOL

say "forward: --alibi and a small --softcap change the output (they reach the attention)"
for opt in "--alibi" "--softcap 0.01"; do
    # shellcheck disable=SC2086
    run 0 "$ATTN" "${fw[@]}" $opt --output "$WORK/fw_opt.npy"
    cmp -s "$WORK/fw_opt.npy" "$WORK/fw_plain.npy" && bad "forward $opt changed nothing" || ok
done

say "forward: a single sequence [T, E] gives a log-sum-exp [H, T]"
F1="$MHA/mha_single_f64_all_masks" # x [6, 8], H=2
run 0 "$ATTN" forward --weights "$F1/weights.safetensors" --num-heads 2 --input "$F1/x.npy" --causal \
    --window 2,0 --sinks "$GOLD/sinks_empty_rows/sinks.npy" --output "$WORK/f1.npy" --lse "$WORK/f1.lse.npy"
[ "$(npy_shape "$WORK/f1.lse.npy")" = "(2, 6)" ] && ok || bad "single-sequence lse shape $(npy_shape "$WORK/f1.lse.npy")"

# ---- refusals ----
g="$GOLD/everything" # q [2, 4, 5, 8], k, v [2, 2, 9, 8|6]
qkv=(sdpa --query "$g/q.npy" --key "$g/k.npy" --value "$g/v.npy" --output "$WORK/never.npy")

say "usage errors (exit 2, one line naming the values) and nothing written"
for cmd in sdpa forward; do
    if [ "$cmd" = sdpa ]; then base=("${qkv[@]}"); else base=("${fw[@]}" --output "$WORK/never.npy"); fi
    run 2 "$ATTN" "${base[@]}" --causal --causal-bottom-right
    err_has "--causal (top-left) and --causal-bottom-right exclude each other"
    run 2 "$ATTN" "${base[@]}" --alibi --alibi-slopes "$GOLD/alibi_slopes/slopes.npy"
    err_has "--alibi (the default slopes) and --alibi-slopes"
    err_has "slopes.npy"
    run 2 "$ATTN" "${base[@]}" --window -2,0
    err_has "--window -2,0: the left side is -2"
    run 2 "$ATTN" "${base[@]}" --window 3,-7
    err_has "the right side is -7"
    for w in 3 "a,b" "1,2,3" ",0" "0x1,0" " 1,0" "1,99999999999999999999"; do
        run 2 "$ATTN" "${base[@]}" --window "$w"
        err_has "--window"
    done
    run 2 "$ATTN" "${base[@]}" --softcap 0
    err_has "--softcap must be a number > 0 (got 0)"
    run 2 "$ATTN" "${base[@]}" --softcap -2.5
    err_has "(got -2.5)"
    for c in inf nan 1e39; do
        run 2 "$ATTN" "${base[@]}" --softcap "$c"
        err_has "--softcap"
    done
    run 2 "$ATTN" "${base[@]}" --lse "$WORK/never.npy"
    err_has "--output and --lse name the same file"
    run 2 "$ATTN" "${base[@]}" --attention "$WORK/a.npy" --lse "$WORK/a.npy"
    err_has "--attention and --lse name the same file"
done
[ -e "$WORK/never.npy" ] || [ -e "$WORK/a.npy" ] && bad "a usage error wrote a file" || ok

say "shape errors come from the library (exit 1) and name the shapes and the file"
run 1 "$ATTN" sdpa --query "$GOLD/sinks_empty_rows/q.npy" --key "$GOLD/alibi_default_6_heads/k.npy" \
    --value "$GOLD/alibi_default_6_heads/v.npy" --output "$WORK/never.npy"
err_has "q's 2 heads are not a multiple of k and v's 3 heads"
err_has "(1, 2, 4, 4)"
err_has "(1, 3, 9, 4)"
g6="$GOLD/alibi_default_6_heads" # H=6
six=(sdpa --query "$g6/q.npy" --key "$g6/k.npy" --value "$g6/v.npy" --output "$WORK/never.npy")
run 1 "$ATTN" "${six[@]}" --alibi-slopes "$GOLD/alibi_slopes/slopes.npy"
err_has "--alibi-slopes $GOLD/alibi_slopes/slopes.npy: alibi_slopes has shape (4,); expected (6,)"
run 1 "$ATTN" "${six[@]}" --sinks "$SINKS4"
err_has "--sinks $SINKS4: sinks has shape (4,); expected (6,)"
run 1 "$ATTN" "${qkv[@]}" --bias "$GOLD/bias_heads/bias.npy"
err_has "--bias $GOLD/bias_heads/bias.npy: bias shape (1, 3, 1, 6) does not broadcast to (2, 4, 5, 9)"
run 1 "$ATTN" "${fw[@]}" --output "$WORK/never.npy" --bias "$GOLD/bias_heads/bias.npy"
err_has "does not broadcast to (3, 4, 7, 7)"
run 1 "$ATTN" "${fw[@]}" --output "$WORK/never.npy" --sinks "$GOLD/sinks_empty_rows/sinks.npy"
err_has "sinks has shape (2,); expected (4,)"
run 1 "$ATTN" "${qkv[@]}" --bias "$GOLD/bias_full_ninf/mask.npy"
err_has "expected a float array, got bool"
run 1 "$ATTN" "${qkv[@]}" --sinks "$WORK/missing.npy"
err_has "--sinks"
err_has "missing.npy"
[ -e "$WORK/never.npy" ] && bad "a failed run wrote its output" || ok

say "the three outputs are one set: when --lse cannot be written, neither are --output and --attention"
mkdir -p "$WORK/a_directory"
run 1 "$ATTN" "${qkv[@]/never.npy/set.out.npy}" --attention "$WORK/set.attn.npy" --lse "$WORK/a_directory"
[ -e "$WORK/set.out.npy" ] || [ -e "$WORK/set.attn.npy" ] && bad "an output was written although --lse failed" || ok
no_temp_files "$WORK"

cli_summary test_cli_options
