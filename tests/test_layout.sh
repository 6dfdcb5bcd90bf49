#!/usr/bin/env bash
# --layout separate draws the weights as three nn.Linear(E, E) layers in q, k, v order
# and then the output layer, so that a learner's own module written that way matches:
# every array equals torch's for the same seed (tests/data/learner/separate_*); x is
# the same as the default layout's, but the output is not (the draws come in another
# order); and the default stays the chapter's fused qkv.
set -u
source "$ATTN_SOURCE_DIR/tests/learner_lib.sh"
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

for c in separate_s42 separate_s3; do
    # shellcheck disable=SC2046
    "$INSPECT" $(cat "$LEARNER_DATA/$c/args.txt") --dump "$tmp/$c" >/dev/null 2>"$tmp/err" \
        || { bad "$c: run failed: $(cat "$tmp/err")"; continue; }
    for f in "$LEARNER_DATA/$c"/*.npy; do
        n=$(basename "$f")
        read -r count nbad maxd first <<<"$(npy_compare "$tmp/$c/$n" "$f")"
        [ "$nbad" -eq 0 ] && [ "$count" -gt 0 ] \
            && ok "$c: $n equals torch's three-nn.Linear module ($count numbers, largest difference $maxd)" \
            || bad "$c: $n: $nbad of $count numbers differ from torch's (first at $first)"
    done
done

# The same seed draws the same x in both layouts, and other weights.
"$INSPECT" --dump "$tmp/fused" >/dev/null
cmp -s "$tmp/fused/x.npy" "$tmp/separate_s42/x.npy" && ok "x is the same in both layouts" \
    || bad "x differs between the layouts"
read -r count nbad maxd first <<<"$(npy_compare "$tmp/separate_s42/output.npy" "$LEARNER_DATA/chapter_s42/output.npy")"
[ "$nbad" -gt 0 ] && ok "the separate layout's output is not the fused one's ($nbad of $count numbers differ, by up to $maxd)" \
    || bad "the separate layout drew the fused layout's numbers"
read -r count nbad maxd first <<<"$(npy_compare "$tmp/fused/output.npy" "$LEARNER_DATA/chapter_s42/output.npy")"
[ "$nbad" -eq 0 ] && ok "the default layout is still the chapter's fused qkv (output equals torch's Linear(E, 3E) module)" \
    || bad "the default layout no longer matches the fused module"
"$INSPECT" --layout fused >"$tmp/a"; "$INSPECT" >"$tmp/b"
cmp -s "$tmp/a" "$tmp/b" && ok "--layout fused is the default" || bad "--layout fused differs from the default"

# The stored weights stack W_q, W_k, W_v as qkv.weight, so attn forward reproduces it.
if ATTN_ARCH=ref "$ATTN" forward --weights "$tmp/separate_s42/weights.safetensors" --num-heads 4 \
    --input "$tmp/separate_s42/x.npy" --token-ids "$tmp/separate_s42/token_ids.npy" --pad-id 0 --causal \
    --output "$tmp/y.npy" 2>"$tmp/err" && cmp -s "$tmp/y.npy" "$tmp/separate_s42/output.npy"; then
    ok "attn forward on the separate layout's weights.safetensors reproduces its output.npy"
else bad "attn forward on the separate layout's dump: $(cat "$tmp/err")"; fi

[ $fail -eq 0 ] && echo "test_layout: all passed"
exit $fail
