#!/bin/bash
# test_cli_forward_grad.sh - `attn forward --grad-output DY --grad-input DX
# --grad-weights G` (SPEC section 8): on every case of tests/data/golden_mha_grads/
# (PyTorch 2.15 autograd of the chapter's module, tests/golden/gen_mha_grads.py) the
# output, dX and each weight's gradient equal PyTorch's within the bound of
# tests/test_mha_backward.c (1e-6 + 1e-5 * |torch|; the reason is given there); the
# gradients' file names exactly the tensors the weights file has, prefix included;
# the bad combinations of the flags are usage errors (exit 2), a dY of the wrong
# shape an error (exit 1), and a failed run writes nothing. (Separate projections
# and --rope with --grad-* are tests/test_cli_gqa_grad.sh's.)
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_forward_grad"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_mha_grads"
ATOL=1e-6
RTOL=1e-5

# st_header FILE: the JSON header of a .safetensors file.
st_header() {
    local n
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    head -c $((8 + n)) "$1" | tail -c "$n"
}

# st_names FILE: the tensor names of a .safetensors file, sorted, one a line.
st_names() {
    st_header "$1" | grep -o '"[^"]*":{"dtype"' | sed 's/":{"dtype"//; s/^"//' | sort
}

# st_floats FILE NAME: the float32 values of tensor NAME, one a line.
st_floats() {
    local n off
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    off=$(st_header "$1" | grep -o "\"$2\":{[^}]*}" | grep -o '"data_offsets":\[[0-9]*,[0-9]*\]' |
        grep -o '[0-9]*,[0-9]*')
    [ -n "$off" ] || return 0
    local a=${off%,*} b=${off#*,}
    od -An -v -j$((8 + n + a)) -N$((b - a)) -tf4 -w4 "$1" | awk '{print $1}'
}

# st_close FILE NAME EXPECTED.npy: tensor NAME of FILE against EXPECTED within the bound.
st_close() {
    local res
    res=$(paste <(st_floats "$1" "$2") <(npy_floats "$3") | awk -v atol=$ATOL -v rtol=$RTOL '
        function abs(x) { return x < 0 ? -x : x }
        NF != 2 { short++ }
        { n++; d = ($1 == $2) ? 0 : abs($1 - $2); if (!(d <= atol + rtol * abs($2))) { bad++; if (bad < 4) printf "  [%d] %s vs %s\n", n - 1, $1, $2 } }
        END { printf "%d %d\n", n, bad + short + 0 }' | tail -n 1)
    local cnt=${res% *} nbad=${res#* }
    if [ "$cnt" -gt 0 ] && [ "$nbad" -eq 0 ]; then ok; else bad "$2 in $1 differs from $3 in $nbad of $cnt values"; fi
}

# case_args DIR: the `attn forward` flags of the case in DIR into `args`.
case_args() {
    local dir=$1
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    args=(forward --num-heads "$c_num_heads" --input "$dir/x.npy")
    [ "$c_causal" = 1 ] && args+=(--causal)
    [ -n "$c_mask" ] && args+=(--mask "$dir/$c_mask")
    return 0
}

say "attn forward --grad-* reproduces PyTorch autograd's dX, dW_qkv, db_qkv, dW_o and db_o on every golden case"
ncases=0
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GOLD/$name"
    case_args "$dir"
    w="$WORK/$name"
    run 0 "$ATTN" "${args[@]}" --weights "$dir/weights.safetensors" --output "$w.y.npy" \
        --grad-output "$dir/dy.npy" --grad-input "$w.dx.npy" --grad-weights "$w.g.safetensors"
    npy_close "$w.y.npy" "$dir/out.npy" $ATOL $RTOL
    npy_close "$w.dx.npy" "$dir/dx.npy" $ATOL $RTOL
    names=$(st_names "$w.g.safetensors" | tr '\n' ' ')
    [ "$names" = "output.bias output.weight qkv.bias qkv.weight " ] && ok ||
        bad "$name: the gradients' file names '$names'"
    st_close "$w.g.safetensors" qkv.weight "$dir/dw_qkv.npy"
    st_close "$w.g.safetensors" qkv.bias "$dir/db_qkv.npy"
    st_close "$w.g.safetensors" output.weight "$dir/dw_o.npy"
    st_close "$w.g.safetensors" output.bias "$dir/db_o.npy"
    ncases=$((ncases + 1))
done <"$GOLD/MANIFEST"
[ "$ncases" -ge 4 ] && ok || bad "only $ncases golden cases"
no_temp_files "$WORK"

say "attn forward --num-kv-heads/--rope --grad-* reproduces PyTorch autograd's dX and every weight's gradient on every case of golden_gqa_grads (separate projections with GQA and MQA, the chapter's module with RoPE, both pairings), under the weights file's own names"
GQA_GOLD="$ATTN_TEST_DATA_DIR/golden_gqa_grads"
ncases=0
while read -r name; do
    case "$name" in '#'* | '') continue ;; esac
    dir="$GQA_GOLD/$name"
    unset "${!c_@}" 2>/dev/null
    while IFS='=' read -r k v; do
        case "$k" in '#'* | '') continue ;; esac
        printf -v "c_$k" '%s' "$v"
    done <"$dir/case.txt"
    args=(forward --weights "$dir/weights.safetensors" --num-heads "$c_num_heads"
        --input "$dir/x.npy")
    [ -n "$c_prefix" ] && args+=(--prefix "$c_prefix")
    [ "$c_layout" = separate ] && args+=(--num-kv-heads "$c_num_kv_heads")
    [ "$c_causal" = 1 ] && args+=(--causal)
    [ -n "$c_mask" ] && args+=(--mask "$dir/$c_mask")
    [ "$c_rope" != none ] &&
        args+=(--rope "$c_rope" --rope-base "$c_rope_base" --rope-offset "$c_rope_offset")
    w="$WORK/gqa_$name"
    run 0 "$ATTN" "${args[@]}" --output "$w.y.npy" --grad-output "$dir/dy.npy" \
        --grad-input "$w.dx.npy" --grad-weights "$w.g.safetensors"
    npy_close "$w.y.npy" "$dir/out.npy" $ATOL $RTOL
    npy_close "$w.dx.npy" "$dir/dx.npy" $ATOL $RTOL
    want=$(st_names "$dir/weights.safetensors" | tr '\n' ' ')
    names=$(st_names "$w.g.safetensors" | tr '\n' ' ')
    [ "$names" = "$want" ] && ok || bad "$name: the gradients' file names '$names', not '$want'"
    for n in $want; do st_close "$w.g.safetensors" "$n" "$dir/grad_$n.npy"; done
    ncases=$((ncases + 1))
done <"$GQA_GOLD/MANIFEST"
[ "$ncases" -ge 6 ] && ok || bad "only $ncases grouped-query golden cases"
no_temp_files "$WORK"

say "PyTorch's names under a prefix, without an output bias: the gradients' file has exactly those three names, with the same gradients"
dir="$GOLD/plain"
case_args "$dir"
run 0 "$ATTN" "${args[@]}" --weights "$dir/weights_torch_prefixed.safetensors" \
    --prefix layer.0. --output "$WORK/t.y.npy" --grad-output "$dir/dy.npy" \
    --grad-weights "$WORK/t.g.safetensors"
names=$(st_names "$WORK/t.g.safetensors" | tr '\n' ' ')
[ "$names" = "layer.0.in_proj_bias layer.0.in_proj_weight layer.0.out_proj.weight " ] && ok ||
    bad "the gradients' file names '$names'"
st_close "$WORK/t.g.safetensors" layer.0.in_proj_weight "$dir/dw_qkv.npy"
st_close "$WORK/t.g.safetensors" layer.0.in_proj_bias "$dir/db_qkv.npy"
st_close "$WORK/t.g.safetensors" layer.0.out_proj.weight "$dir/dw_o.npy"
[ ! -e "$WORK/t.dx.npy" ] && ok || bad "a dX was written without --grad-input"

say "--grad-output without a destination, a destination without it, or onto another output is a usage error (exit 2)"
base=("${args[@]}" --weights "$dir/weights.safetensors" --output "$WORK/u.y.npy")
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/dy.npy"
err_has "--grad-output needs --grad-input or --grad-weights"
run 2 "$ATTN" "${base[@]}" --grad-input "$WORK/u.dx.npy"
err_has "--grad-input needs --grad-output"
run 2 "$ATTN" "${base[@]}" --grad-weights "$WORK/u.g.safetensors"
err_has "--grad-weights needs --grad-output"
run 2 "$ATTN" "${base[@]}" --grad-output "$dir/dy.npy" --grad-input "$WORK/u.y.npy"
[ ! -e "$WORK/u.y.npy" ] && ok || bad "a usage error wrote the output"

say "a dY of the wrong shape is an error (exit 1) that names the file, and nothing is written"
run 1 "$ATTN" "${base[@]}" --grad-output "$GOLD/causal/dy.npy" --grad-input "$WORK/u.dx.npy"
err_has "--grad-output $GOLD/causal/dy.npy: expected float"
[ ! -e "$WORK/u.y.npy" ] && [ ! -e "$WORK/u.dx.npy" ] && ok || bad "a failed run wrote a file"
no_temp_files "$WORK"

say "attn forward --help documents the three --grad-* flags"
run 0 "$ATTN" forward --help
for f in --grad-output --grad-input --grad-weights; do out_has "$f"; done

cli_summary test_cli_forward_grad
