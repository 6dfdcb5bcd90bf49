#!/usr/bin/env bash
# Out of memory through the programs: with ATTN_FAIL_ALLOC_AT=N the Nth allocation of
# `attn forward`, `attn decode`, `attn sdpa` and `inspect_self_attention --dump` fails, for N = 1, 2,
# 3, ... until the run succeeds. Every failing run must exit 1 with one line on
# stderr that says "out of memory", and leave no output and no temporary file; the
# run that succeeds must write what an unconstrained run writes, byte for byte.
# (Leaks on these paths are the sanitizer and valgrind builds' business: CI runs this
# test under AddressSanitizer, whose leak checker fails the process.)
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
gold="$ATTN_TEST_DATA_DIR/golden"
fail=0

sweep() { # name, output files (space-separated, relative to $tmp/out), command...
    local name=$1 outs=$2; shift 2
    rm -rf "$tmp/out" "$tmp/want"; mkdir -p "$tmp/out"
    if ! "$@" >/dev/null 2>"$tmp/err"; then
        echo "FAIL $name: the unconstrained run failed: $(cat "$tmp/err")"; fail=1; return
    fi
    mv "$tmp/out" "$tmp/want"; mkdir -p "$tmp/out"
    local n=1 rc
    while [ $n -le 2000 ]; do
        ATTN_FAIL_ALLOC_AT=$n "$@" >/dev/null 2>"$tmp/err"; rc=$?
        if [ $rc -eq 0 ]; then break; fi
        if [ $rc -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q "out of memory" "$tmp/err"; then
            echo "FAIL $name: allocation $n: exit $rc, stderr: $(cat "$tmp/err")"; fail=1; return
        fi
        if [ -n "$(ls -A "$tmp/out")" ]; then
            echo "FAIL $name: allocation $n failed but left files: $(ls -A "$tmp/out")"; fail=1; return
        fi
        n=$((n + 1))
    done
    for f in $outs; do
        cmp -s "$tmp/want/$f" "$tmp/out/$f" || { echo "FAIL $name: $f differs from the unconstrained run"; fail=1; return; }
    done
    rm -rf "$tmp/out"
    echo "ok   $name: $((n - 1)) allocations made to fail, each cleanly; then the same output"
}

d="$gold/mha_chapter_pad_causal"
sweep "attn forward (padding + causal, with --attention)" "y.npy a.npy" \
    "$ATTN" forward --weights "$d/weights.safetensors" --num-heads 3 --input "$d/x.npy" \
    --token-ids "$d/ids.npy" --pad-id 0 --causal --output "$tmp/out/y.npy" --attention "$tmp/out/a.npy"
d="$gold/sdpa_cross_mask"
sweep "attn sdpa (cross-attention with a mask, with --attention)" "o.npy a.npy" \
    "$ATTN" sdpa --query "$d/q.npy" --key "$d/k.npy" --value "$d/v.npy" --mask "$d/mask.npy" \
    --output "$tmp/out/o.npy" --attention "$tmp/out/a.npy"
d="$ATTN_TEST_DATA_DIR/golden_gqa_rope/rope_mqa_interleaved_offset37_pad"
sweep "attn decode (MQA, RoPE, padding, a prefill and steps, with --attention and --lse)" \
    "y.npy a.npy l.npy" \
    "$ATTN" decode --weights "$d/weights.safetensors" --prefix model.layers.0.self_attn. \
    --num-heads 4 --num-kv-heads 1 --input "$d/x.npy" --token-ids "$d/ids.npy" --pad-id 0 \
    --rope half --prefill 2 --output "$tmp/out/y.npy" --attention "$tmp/out/a.npy" \
    --lse "$tmp/out/l.npy"
sweep "inspect_self_attention --dump" "x.npy output.npy attention.npy weights.safetensors" \
    "$INSPECT" --dump "$tmp/out"
# A --dump directory the run makes itself is gone again when the run fails.
sweep "inspect_self_attention --dump into a new directory" \
    "new/x.npy new/output.npy new/attention.npy new/weights.safetensors" \
    "$INSPECT" --dump "$tmp/out/new"
exit $fail
