#!/usr/bin/env bash
# Every number inspect_modern_attention prints equals PyTorch's for the same seed:
# tests/data/golden_modern/ holds, per case, the lines and the --values text that
# tests/golden/gen_modern.py's torch block (a Llama-style layer with RoPE, GQA by
# repeated kv heads, the sliding window and a torch.cat KV cache) prints for the
# case's arguments, rounded to 4 decimals with rows and columns labelled "pos P"
# (and the kv head for keys and values). Both are compared character for character,
# on the reference kernels (the default) and on the fused ones, for MHA, GQA and
# MQA, both pairings and two bases. No Python is needed.
set -u
fail=0
MODERN=${MODERN:-$ATTN_BUILD_DIR/inspect_modern_attention}
G="$ATTN_TEST_DATA_DIR/golden_modern"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

ncases=0
for dir in "$G"/*/; do
    c=$(basename "$dir")
    read -r -a args <"$dir/args.txt"
    nlines=$(wc -l <"$dir/lines.txt")
    for impl in ref fused; do
        if ! "$MODERN" "${args[@]}" --impl $impl >"$tmp/out" 2>"$tmp/err"; then
            bad "$c ($impl): run failed: $(cat "$tmp/err")"; continue
        fi
        if cmp -s "$tmp/out" "$dir/lines.txt"; then
            ok "$c ($impl): the $nlines lines equal torch's"
        else
            bad "$c ($impl): the lines differ from torch's ($dir/lines.txt)"; diff "$dir/lines.txt" "$tmp/out"
        fi
        for want in "$dir"/values_b*_h*.txt; do
            b=$(basename "$want" .txt); s=${b#values_b}; s=${s%%_h*}; h=${b##*_h}
            if ! "$MODERN" "${args[@]}" --impl $impl --values --sample "$s" --head "$h" >"$tmp/out" 2>"$tmp/err"; then
                bad "$c ($impl) --values --sample $s --head $h: run failed: $(cat "$tmp/err")"; continue
            fi
            # The lines first, unchanged, then one blank line, then the values.
            if ! head -n "$nlines" "$tmp/out" | cmp -s - "$dir/lines.txt"; then
                bad "$c ($impl) --values: the lines before the values changed"; continue
            fi
            if tail -n +"$((nlines + 2))" "$tmp/out" | cmp -s - "$want"; then
                ok "$c ($impl) --values --sample $s --head $h: $(grep -c '^pos ' "$want") rows equal torch's"
            else
                bad "$c ($impl) --values --sample $s --head $h differs from torch's ($want)"
                tail -n +"$((nlines + 2))" "$tmp/out" | diff "$want" - | head -20
            fi
        done
    done
    ncases=$((ncases + 1))
done
[ "$ncases" -ge 4 ] || bad "found $ncases cases in $G, expected at least 4"

[ $fail -eq 0 ] && echo "test_modern_values: all passed"
exit $fail
