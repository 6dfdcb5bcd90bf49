#!/bin/bash
# test_cli_grad.sh - the gradients on the command line (SPEC section 8): every golden
# case of tests/data/golden_grads/ (made with PyTorch autograd by
# tests/golden/gen_grads.py) run through `attn sdpa --grad-output ...` with the
# flags its case.txt names, the output and every gradient compared with PyTorch's
# within the bound of tests/test_sdpa_backward.c (1e-6 + 1e-5 * |torch|; the reason
# is given there); every bad combination of the --grad-* flags refused as a usage
# error (exit 2), a dO of the wrong shape as an error (exit 1) naming the file and
# the shapes, and no file written by a run that fails.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_grad"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_grads"
ATOL=1e-6
RTOL=1e-5

# case_args DIR: the `attn sdpa` flags for the case in DIR, into the array `args`
# (without the outputs); c_<key> holds each key of its case.txt.
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
    [ "$c_alibi" = 1 ] && args+=(--alibi)
    [ -n "$c_bias" ] && args+=(--bias "$dir/$c_bias")
    [ -n "$c_sinks" ] && args+=(--sinks "$dir/$c_sinks")
    [ "$c_empty_rows" = zero ] && args+=(--empty-rows zero)
    [ -n "${c_rope:-}" ] && args+=(--rope "$c_rope" --rope-base "$c_rope_base" --rope-offset "$c_rope_offset")
    return 0
}

say "attn sdpa --grad-* reproduces PyTorch autograd's dq, dk, dv, dbias and dsinks on every golden case"
ncases=0
seen=""
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GOLD/$name"
    case_args "$dir"
    w="$WORK/$name"
    grads=(--grad-output "$dir/$c_grad_output" --grad-query "$w.dq.npy" --grad-key "$w.dk.npy"
        --grad-value "$w.dv.npy")
    [ -n "$c_grad_bias" ] && grads+=(--grad-bias "$w.dbias.npy")
    [ -n "$c_grad_sinks" ] && grads+=(--grad-sinks "$w.dsinks.npy")
    seen="$seen ${grads[*]} ${args[*]}"
    run 0 "$ATTN" "${args[@]}" --output "$w.out.npy" "${grads[@]}"
    npy_close "$w.out.npy" "$dir/$c_output" $ATOL $RTOL
    npy_close "$w.dq.npy" "$dir/$c_grad_query" $ATOL $RTOL
    npy_close "$w.dk.npy" "$dir/$c_grad_key" $ATOL $RTOL
    npy_close "$w.dv.npy" "$dir/$c_grad_value" $ATOL $RTOL
    [ -n "$c_grad_bias" ] && npy_close "$w.dbias.npy" "$dir/$c_grad_bias" $ATOL $RTOL
    [ -n "$c_grad_sinks" ] && npy_close "$w.dsinks.npy" "$dir/$c_grad_sinks" $ATOL $RTOL
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 14 ] && ok || bad "only $ncases golden cases of the gradients"
for f in --grad-bias --grad-sinks --rope; do
    case "$seen " in *" $f "*) ok ;; *) bad "no golden case runs $f" ;; esac
done
no_temp_files "$WORK"

say "the gradients and the forward's --lse come out of one run, the lse the same as without the backward"
dir="$GOLD/sinks"
case_args "$dir"
run 0 "$ATTN" "${args[@]}" --output "$WORK/a.out.npy" --lse "$WORK/a.lse.npy" \
    --grad-output "$dir/do.npy" --grad-query "$WORK/a.dq.npy" --grad-key "$WORK/a.dk.npy" \
    --grad-value "$WORK/a.dv.npy" --grad-sinks "$WORK/a.ds.npy"
run 0 "$ATTN" "${args[@]}" --output "$WORK/b.out.npy" --lse "$WORK/b.lse.npy"
if cmp -s "$WORK/a.lse.npy" "$WORK/b.lse.npy" && cmp -s "$WORK/a.out.npy" "$WORK/b.out.npy"; then
    ok
else bad "the output or lse changed when the backward ran too"; fi
[ "$(npy_shape "$WORK/a.ds.npy")" = "(4,)" ] && ok || bad "dsinks shape $(npy_shape "$WORK/a.ds.npy")"

say "3-D inputs [H, T, D] give 3-D gradients with the 4-D case's values"
# npy_drop_lead IN OUT: a copy of IN, a version-1 .npy whose first axis has size 1,
# without that axis (as in test_cli_options.sh).
npy_drop_lead() {
    local hl hdr
    hl=$(od -An -j8 -N2 -tu2 "$1" | tr -d ' ')
    hdr=$(head -c $((10 + hl)) "$1" | tail -c +11)
    case "$hdr" in *"'shape': (1, "*) ;; *) bad "npy_drop_lead: $1 does not start with an axis of 1"; return ;; esac
    hdr=${hdr/"'shape': (1, "/"'shape': ("}
    { head -c 10 "$1"; printf '%s   \n' "$hdr"; tail -c +$((11 + hl)) "$1"; } >"$2"
}
dir="$GOLD/alibi"
for f in q k v do dq dk dv; do npy_drop_lead "$dir/$f.npy" "$WORK/t3.$f.npy"; done
run 0 "$ATTN" sdpa --query "$WORK/t3.q.npy" --key "$WORK/t3.k.npy" --value "$WORK/t3.v.npy" \
    --alibi --causal-bottom-right --output "$WORK/t3.out.npy" --grad-output "$WORK/t3.do.npy" \
    --grad-query "$WORK/t3.gq.npy" --grad-key "$WORK/t3.gk.npy" --grad-value "$WORK/t3.gv.npy"
npy_close "$WORK/t3.gq.npy" "$WORK/t3.dq.npy" $ATOL $RTOL
npy_close "$WORK/t3.gk.npy" "$WORK/t3.dk.npy" $ATOL $RTOL
npy_close "$WORK/t3.gv.npy" "$WORK/t3.dv.npy" $ATOL $RTOL

say "bad combinations of the --grad-* flags are usage errors (exit 2) naming the flags"
dir="$GOLD/plain"
case_args "$dir"
base=("${args[@]}" --output "$WORK/u.out.npy")
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/do.npy" --grad-query "$WORK/u.dq.npy" \
    --grad-value "$WORK/u.dv.npy"
err_has "--grad-key is missing"
run 2 "$ATTN" "${base[@]}" --grad-query "$WORK/u.dq.npy"
err_has "--grad-query needs --grad-output"
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/do.npy" --grad-query "$WORK/u.dq.npy" \
    --grad-key "$WORK/u.dk.npy" --grad-value "$WORK/u.dv.npy" --grad-bias "$WORK/u.db.npy"
err_has "--grad-bias needs --bias"
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/do.npy" --grad-query "$WORK/u.dq.npy" \
    --grad-key "$WORK/u.dk.npy" --grad-value "$WORK/u.dv.npy" --grad-sinks "$WORK/u.ds.npy"
err_has "--grad-sinks needs --sinks"
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/do.npy" --grad-query "$WORK/u.dq.npy" \
    --grad-key "$WORK/u.dq.npy" --grad-value "$WORK/u.dv.npy"
err_has "--grad-query and --grad-key name the same file"
run 2 "$ATTN" "${args[@]}" --output "$WORK/u.out.npy" --grad-output "$dir/do.npy" \
    --grad-query "$WORK/u.out.npy" --grad-key "$WORK/u.dk.npy" --grad-value "$WORK/u.dv.npy"
err_has "--output and --grad-query name the same file"
if ls "$WORK" | grep -q '^u\.'; then bad "a usage error wrote a file: $(ls "$WORK" | grep '^u\.')"; else ok; fi

say "a dO whose shape is not the output's is an error (exit 1) naming --grad-output and both shapes, and no file is written"
run 1 "$ATTN" "${base[@]}" --grad-output "$dir/q.npy" --grad-query "$WORK/s.dq.npy" \
    --grad-key "$WORK/s.dk.npy" --grad-value "$WORK/s.dv.npy"
err_has "--grad-output $dir/q.npy: dout has shape (2, 2, 5, 4); expected (2, 2, 5, 3)"
if [ -e "$WORK/u.out.npy" ] || ls "$WORK" | grep -q '^s\.'; then
    bad "a failed run wrote a file"
else ok; fi
no_temp_files "$WORK"

say "attn sdpa --help documents the --grad-* flags"
run 0 "$ATTN" sdpa --help
for f in --grad-output --grad-query --grad-key --grad-value --grad-bias --grad-sinks; do out_has "$f"; done

cli_summary test_cli_grad
