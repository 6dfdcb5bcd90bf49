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

# Which kernel: the default is the fused kernel on the best instruction set; forcing
# the reference (ATTN_ARCH=ref) is reported, with the reason.
env -u ATTN_ARCH "$INSPECT" --trace >"$tmp/t1" 2>&1
grep -q "^attention:   fused online-softmax kernel" "$tmp/t1" && ok "default run reports the fused kernel: $(grep '^attention:' "$tmp/t1")" \
    || bad "default run does not report the fused kernel: $(grep -A2 '== kernel' "$tmp/t1")"
ATTN_ARCH=ref "$INSPECT" --trace >"$tmp/t2" 2>&1
grep -q "^attention:   reference" "$tmp/t2" && grep -q "ATTN_ARCH" "$tmp/t2" \
    && ok "ATTN_ARCH=ref reports the reference and why: $(grep '^why:' "$tmp/t2")" \
    || bad "ATTN_ARCH=ref is not reported: $(grep -A2 '== kernel' "$tmp/t2")"
ATTN_ARCH=scalar "$INSPECT" --trace >"$tmp/t3" 2>&1
grep -q "^attention:   fused online-softmax kernel.*scalar build" "$tmp/t3" \
    && ok "ATTN_ARCH=scalar reports the portable fused build" \
    || bad "ATTN_ARCH=scalar is not reported: $(grep -A2 '== kernel' "$tmp/t3")"

# Without --trace nothing of it is printed.
"$INSPECT" >"$tmp/t4" 2>&1
[ "$(wc -l <"$tmp/t4")" -eq 7 ] && ok "without --trace the output is the seven lines" \
    || bad "without --trace there are $(wc -l <"$tmp/t4") lines"

[ $fail -eq 0 ] && echo "test_trace: all passed"
exit $fail
