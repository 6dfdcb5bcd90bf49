#!/usr/bin/env bash
# inspect_self_attention --trace prints SPEC section 1's steps in order, each with the
# shape the sizes at hand give (x [B, T, E] -> qkv [B, T, 3E] -> ... -> output
# [B, T, E]), the mask shapes and their broadcast, and the kernel that ran; the
# seven lines before it stay exactly the chapter's; and the shapes it prints are
# those of the arrays --dump writes.
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# expect_in_order FILE NAME STRING...: each fixed string occurs on the line of the one
# before or on a later line.
expect_in_order() {
    local f=$1 name=$2; shift 2
    local after=0 want n
    for want in "$@"; do
        n=$(awk -v s="$want" -v a="$after" 'NR >= a && index($0, s) { print NR; exit }' "$f")
        if [ -z "$n" ]; then
            bad "$name: no line with '$want' from line $after on"; sed 's/^/    /' "$f"; return
        fi
        after=$n
    done
    ok "$name: $# items in order"
}

check() { # B T E H
    local B=$1 T=$2 E=$3 H=$4 D=$(( $3 / $4 ))
    local name="B=$B T=$T E=$E H=$H"
    "$INSPECT" --batch-size "$B" --seq-len "$T" --embed-dim "$E" --num-heads "$H" >"$tmp/plain" 2>&1
    if ! "$INSPECT" --batch-size "$B" --seq-len "$T" --embed-dim "$E" --num-heads "$H" --trace \
        --dump "$tmp/d" >"$tmp/trace" 2>"$tmp/err"; then
        bad "$name: --trace failed: $(cat "$tmp/err")"; return
    fi
    head -n 7 "$tmp/trace" | cmp -s - "$tmp/plain" && ok "$name: the seven lines come first, unchanged" \
        || bad "$name: --trace changed the seven lines"
    expect_in_order "$tmp/trace" "$name: the steps" \
        "B=$B T=$T E=$E H=$H D=E/H=$D" \
        " 1  input" "x [$B, $T, $E]" \
        " 2  fused q/k/v projection" "qkv [$B, $T, $((3 * E))]" "W_qkv [$((3 * E)), $E], b_qkv [$((3 * E))]" \
        " 3  split the last axis" "q, k, v 3 × [$B, $T, $E]" \
        " 4  split heads" "q, k, v [$B, $H, $T, $D]" \
        " 5  scaled dot products" "scores [$B, $H, $T, $T]" "/ sqrt($D)" \
        " 6  mask" "scores [$B, $H, $T, $T]" \
        " 7  softmax over the keys" "weights [$B, $H, $T, $T]" \
        " 8  weighted sum of values" "context [$B, $H, $T, $D]" \
        " 9  merge heads" "context [$B, $T, $E]" \
        "10  output projection" "output [$B, $T, $E]" "W_o [$E, $E], b_o [$E]"
    expect_in_order "$tmp/trace" "$name: the masks and their broadcast" \
        "padding  [$B, 1, 1, $T]" "causal   [1, 1, $T, $T]" \
        "combined [$B, 1, $T, $T]" "[$B, 1, 1, $T] and [1, 1, $T, $T] broadcast to [$B, 1, $T, $T]" \
        "scores   [$B, $H, $T, $T]" "1 -> H=$H" \
        "== kernel" "attention:" "why:"
    # The trace's shapes are the shapes of what was computed.
    local f shape
    for f in "attention:($B, $H, $T, $T)" "combined_mask:($B, 1, $T, $T)" "x:($B, $T, $E)" \
             "output:($B, $T, $E)" "padding_mask:($B, 1, 1, $T)" "causal_mask:(1, 1, $T, $T)"; do
        shape=${f#*:}; f=${f%%:*}
        head -c 200 "$tmp/d/$f.npy" | grep -aq "'shape': $shape" \
            && ok "$name: $f.npy has the traced shape $shape" \
            || bad "$name: $f.npy's shape is not $shape"
    done
    rm -rf "$tmp/d"
}

check 2 5 16 4
check 3 7 12 3
check 1 1 3 1
check 4 9 32 8

# Which kernel: the default is the reference (issue 11: a learner's breakpoint in
# src/attention/sdpa_ref.c must be hit), with the plain projections; --impl fused is
# the fused kernel on the best instruction set, and the trace says it never builds
# the scores; forcing the reference under --impl fused (ATTN_ARCH=ref) is reported,
# with the reason.
env -u ATTN_ARCH "$INSPECT" --trace >"$tmp/t0" 2>&1
grep -q "^attention:   reference: .*attn_sdpa_ref" "$tmp/t0" && grep -q "^why: .*--impl ref (the default)" "$tmp/t0" \
    && grep -q "^projections: .*plain reference loops" "$tmp/t0" && ! grep -q "never materialises" "$tmp/t0" \
    && ok "default run reports the reference kernels: $(grep '^attention:' "$tmp/t0")" \
    || bad "default run does not report the reference: $(grep -A4 '== kernel' "$tmp/t0")"
ATTN_ARCH=avx512 "$INSPECT" --trace >"$tmp/t0b" 2>&1
grep -q "^attention:   reference: " "$tmp/t0b" && ok "ATTN_ARCH does not move the default off the reference" \
    || bad "ATTN_ARCH=avx512 moved the default run: $(grep '^attention:' "$tmp/t0b")"
env -u ATTN_ARCH "$INSPECT" --impl fused --trace >"$tmp/t1" 2>&1
grep -q "^attention:   fused online-softmax kernel" "$tmp/t1" \
    && grep -q "^scores:      the fused kernel never materialises the scores" "$tmp/t1" \
    && grep -q "scores \[2, 4, 5, 5\].*(never built by the fused kernel)" "$tmp/t1" \
    && ok "--impl fused reports the fused kernel and that it never builds the scores: $(grep '^attention:' "$tmp/t1")" \
    || bad "--impl fused is not reported: $(grep -A4 '== kernel' "$tmp/t1")"
ATTN_ARCH=ref "$INSPECT" --impl fused --trace >"$tmp/t2" 2>&1
grep -q "^attention:   reference" "$tmp/t2" && grep -q "ATTN_ARCH" "$tmp/t2" \
    && ok "--impl fused with ATTN_ARCH=ref reports the reference and why: $(grep '^why:' "$tmp/t2")" \
    || bad "ATTN_ARCH=ref is not reported: $(grep -A2 '== kernel' "$tmp/t2")"
ATTN_ARCH=scalar "$INSPECT" --impl fused --trace >"$tmp/t3" 2>&1
grep -q "^attention:   fused online-softmax kernel.*scalar build" "$tmp/t3" \
    && ok "--impl fused with ATTN_ARCH=scalar reports the portable fused build" \
    || bad "ATTN_ARCH=scalar is not reported: $(grep -A2 '== kernel' "$tmp/t3")"
# The chapter's three projections are named as row blocks of the fused one.
grep -q "the chapter's W_q = W_qkv\[0:16\], W_k = W_qkv\[16:32\], W_v = W_qkv\[32:48\]" "$tmp/t0" \
    && ok "the trace names W_q, W_k, W_v as row blocks of W_qkv" \
    || bad "the trace lacks the W_q/W_k/W_v row blocks"
# Under a mistake the trace says the printed numbers are not the kernel's.
"$INSPECT" --mistake no-scale --trace >"$tmp/t5" 2>&1
grep -q "^scores:      MISTAKE no-scale: .*tools/common_mistakes.c" "$tmp/t5" \
    && ok "a mistake is named in the trace" || bad "--mistake no-scale --trace: $(grep -A4 '== kernel' "$tmp/t5")"

# Without --trace nothing of it is printed.
"$INSPECT" >"$tmp/t4" 2>&1
[ "$(wc -l <"$tmp/t4")" -eq 7 ] && ok "without --trace the output is the seven lines" \
    || bad "without --trace there are $(wc -l <"$tmp/t4") lines"

[ $fail -eq 0 ] && echo "test_trace: all passed"
exit $fail
