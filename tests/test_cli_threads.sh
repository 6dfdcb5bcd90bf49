#!/bin/bash
# test_cli_threads.sh - `--threads N` of attn sdpa, forward and decode (SPEC's "threads
# do not change answers", from the command line): every output file of a run, the
# gradients included, has the same bytes with --threads 1, --threads 2 and the default
# (one thread per usable core); and the option follows the number rule (1..1024).
# The library's own tests prove the kernels' determinism on many shapes; this one
# proves that the programs pass the count on and that what a user gets does not
# depend on it. Small inputs: a few hundred milliseconds in all.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_threads"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
# [1, 1, 1100, 64] float32: 1100 query rows, many tiles for two threads to share.
L="$ATTN_TEST_DATA_DIR/golden_half/f16_long/k.npy"
HF="$ATTN_TEST_DATA_DIR/help_examples/forward"
HD="$ATTN_TEST_DATA_DIR/help_examples/decode"

# same_outputs NAME FILE...: each FILE written by the runs "t1", "t2" and "tdef" (as
# $WORK/<run>.FILE) has the same bytes in all three.
same_outputs() {
    local name=$1 f
    shift
    for f in "$@"; do
        if cmp -s "$WORK/t1.$f" "$WORK/t2.$f" && cmp -s "$WORK/t1.$f" "$WORK/tdef.$f"; then
            ok
        else
            bad "$name: $f differs between --threads 1, 2 and the default ($(cmp "$WORK/t1.$f" "$WORK/t2.$f" 2>&1 | head -n 1); $(cmp "$WORK/t1.$f" "$WORK/tdef.$f" 2>&1 | head -n 1))"
        fi
    done
}

say "attn sdpa: output, weights, log-sum-exp and dq, dk, dv have the same bytes for --threads 1, 2 and the default"
for t in 1 2 def; do
    threads=(--threads "$t")
    [ "$t" = def ] && threads=()
    run 0 "$ATTN" sdpa --query "$L" --key "$L" --value "$L" --causal --window 700,0 \
        "${threads[@]}" --output "$WORK/t$t.o.npy" --attention "$WORK/t$t.a.npy" \
        --lse "$WORK/t$t.l.npy" --grad-output "$L" --grad-query "$WORK/t$t.dq.npy" \
        --grad-key "$WORK/t$t.dk.npy" --grad-value "$WORK/t$t.dv.npy"
done
same_outputs sdpa o.npy a.npy l.npy dq.npy dk.npy dv.npy

say "attn forward: output, weights, dx and the weights' gradients have the same bytes for --threads 1, 2 and the default"
for t in 1 2 def; do
    threads=(--threads "$t")
    [ "$t" = def ] && threads=()
    run 0 "$ATTN" forward --weights "$HF/mha.safetensors" --num-heads 4 --input "$HF/x.npy" \
        --causal "${threads[@]}" --output "$WORK/t$t.y.npy" --attention "$WORK/t$t.fa.npy" \
        --grad-output "$HF/dy.npy" --grad-input "$WORK/t$t.dx.npy" \
        --grad-weights "$WORK/t$t.g.safetensors"
done
same_outputs forward y.npy fa.npy dx.npy g.safetensors

say "attn decode: the outputs of a prefill and its steps have the same bytes for --threads 1, 2 and the default"
for t in 1 2 def; do
    threads=(--threads "$t")
    [ "$t" = def ] && threads=()
    run 0 "$ATTN" decode --weights "$HD/llama.safetensors" --prefix model.layers.0.self_attn. \
        --num-heads 32 --num-kv-heads 8 \
        --input "$HD/x.npy" --prefill 6 --rope half "${threads[@]}" --output "$WORK/t$t.dy.npy"
done
same_outputs decode dy.npy

say "--threads follows the number rule: 0, 1025, -1 and 'two' are usage errors naming the range or the value"
for cmd in sdpa forward decode; do
    run 2 "$ATTN" "$cmd" --threads 0
    err_has "--threads must be in 1..1024 (got 0)"
    run 2 "$ATTN" "$cmd" --threads 1025
    err_has "--threads must be in 1..1024 (got 1025)"
    run 2 "$ATTN" "$cmd" --threads two
    err_has "--threads takes a whole number, not 'two'"
done
run 2 "$ATTN" sdpa --threads -1
err_has "--threads must be in 1..1024 (got -1)"

cli_summary test_cli_threads
