#!/usr/bin/env bash
# What inspect_self_attention --help's ENVIRONMENT and FILES sections say holds: the
# reference (--impl ref, the default) computes the same bytes whatever ATTN_ARCH
# says; with --impl fused, --trace names the instruction set ATTN_ARCH forced, and
# an unknown value is reported and taken as the default; NO_COLOR keeps --show's
# character shading; --heatmap's SVG holds no script; --dump writes the files the
# help lists, which 'attn forward' reads back to the same output bytes.
set -u
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$INSPECT" --help >"$tmp/help" 2>&1
for s in ENVIRONMENT FILES EXAMPLES "EXIT STATUS" SYNOPSIS; do
    grep -qx "$s" "$tmp/help" && ok "--help has a $s section" || bad "--help has no $s section"
done

# The reference ignores ATTN_ARCH: the same dumped arrays under every value.
for a in scalar avx2 avx512; do
    ATTN_ARCH=$a "$INSPECT" --dump "$tmp/ref_$a" >/dev/null 2>&1 || bad "--dump with ATTN_ARCH=$a failed"
done
same=1
for f in "$tmp"/ref_scalar/*; do
    n=$(basename "$f")
    for a in avx2 avx512; do cmp -s "$f" "$tmp/ref_$a/$n" || { same=0; bad "--impl ref: $n differs between ATTN_ARCH=scalar and $a"; }; done
done
[ "$same" -eq 1 ] && ok "--impl ref: every dumped file is the same bytes under ATTN_ARCH=scalar, avx2 and avx512"

# With --impl fused, --trace says which instruction set ATTN_ARCH forced.
ATTN_ARCH=scalar "$INSPECT" --impl fused --trace >"$tmp/t" 2>&1
grep -q "^why: .*arch forced by ATTN_ARCH=scalar" "$tmp/t" && ok "--impl fused --trace names ATTN_ARCH=scalar" \
    || bad "--impl fused --trace with ATTN_ARCH=scalar does not say so: $(grep '^why:' "$tmp/t")"
ATTN_ARCH=bogus "$INSPECT" --impl fused --trace >"$tmp/t" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "^why: .*ATTN_ARCH=bogus is not one of .*so auto" "$tmp/t" \
    && ok "an unknown ATTN_ARCH is reported by --trace and taken as auto" \
    || bad "ATTN_ARCH=bogus: exit $rc, trace: $(grep '^why:' "$tmp/t")"

# NO_COLOR: --show shades with characters (its output here is not a terminal
# either, so this checks that NO_COLOR does not turn anything else on).
NO_COLOR=1 "$INSPECT" --show >"$tmp/s" 2>&1
if grep -q '█' "$tmp/s" && ! grep -q $'\033\[' "$tmp/s"; then ok "NO_COLOR: --show shades with characters, no escape codes"
else bad "NO_COLOR: --show printed escape codes or no shading"; fi

# FILES: the SVG holds no script, and --dump's files are the ones the help lists.
"$INSPECT" --heatmap "$tmp/h.svg" >/dev/null 2>&1
if [ -s "$tmp/h.svg" ] && ! grep -qi '<script' "$tmp/h.svg"; then ok "--heatmap's SVG holds no script"
else bad "--heatmap's SVG is missing or holds a script"; fi
listed=$(awk '/^    --dump DIR$/ { f = 1; next } f && /^    --/ { exit } f' "$tmp/help" | grep -o '[a-z_]*\.\(npy\|safetensors\)' | sort -u)
got=$(cd "$tmp/ref_scalar" && ls | sort -u)
[ -n "$listed" ] && [ "$listed" = "$got" ] && ok "--dump writes exactly the $(echo "$got" | wc -l) files --help lists" \
    || bad "--dump wrote '$(echo $got)', --help lists '$(echo $listed)'"
if [ -n "${ATTN:-}" ] && [ -x "$ATTN" ]; then
    d="$tmp/ref_scalar"
    # The experiment runs the reference by default, and so must attn forward here.
    ATTN_ARCH=ref "$ATTN" forward --weights "$d/weights.safetensors" --num-heads 4 --input "$d/x.npy" \
        --token-ids "$d/token_ids.npy" --pad-id 0 --causal --output "$tmp/y.npy" >/dev/null 2>"$tmp/err"
    cmp -s "$tmp/y.npy" "$d/output.npy" && ok "attn forward reads --dump's files back to output.npy's bytes" \
        || bad "attn forward on --dump's files: $(cat "$tmp/err"), output differs from output.npy"
fi

[ $fail -eq 0 ] && echo "test_experiment_env: all passed"
exit $fail
