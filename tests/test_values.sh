#!/usr/bin/env bash
# inspect_self_attention --values and --dump show the numbers of every step, and every
# one equals PyTorch's for the same seed (tests/data/learner/, from
# tests/golden/gen_learner.py running the chapter's module in torch): q, k, v after
# the head split, the raw, scaled and masked scores, the weights, the context and the
# output, on the reference (the default) and on the fused kernel; the --values text
# is, character for character, the torch numbers rounded to 4 decimals with rows and
# columns labelled "pos P (id I)"; the seven lines before it are unchanged.
set -u
source "$ATTN_SOURCE_DIR/tests/learner_lib.sh"
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# golden_dump CASE [flags]: the dump of the case's arguments matches every torch array.
golden_dump() {
    local c=$1; shift
    local d="$tmp/dump_$c" name="$c $*"
    rm -rf "$d"
    # shellcheck disable=SC2046
    if ! "$INSPECT" $(cat "$LEARNER_DATA/$c/args.txt") "$@" --dump "$d" >"$tmp/out" 2>"$tmp/err"; then
        bad "$name: run failed: $(cat "$tmp/err")"; return
    fi
    local f n r
    for f in "$LEARNER_DATA/$c"/*.npy; do
        n=$(basename "$f")
        [ -f "$d/$n" ] || { bad "$name: --dump did not write $n"; continue; }
        [ "$(npy_shape "$d/$n")" = "$(npy_shape "$f")" ] \
            || { bad "$name: $n has shape $(npy_shape "$d/$n"), torch's is $(npy_shape "$f")"; continue; }
        read -r count nbad maxd first <<<"$(npy_compare "$d/$n" "$f")"
        if [ "$nbad" -eq 0 ] && [ "$count" -gt 0 ]; then
            ok "$name: $n $(npy_shape "$f") equals torch's (all $count numbers, largest difference $maxd)"
        else
            bad "$name: $n: $nbad of $count numbers differ from torch's (first at index $first: got $(npy_floats "$d/$n" | sed -n "$((first + 1))p"), torch $(npy_floats "$f" | sed -n "$((first + 1))p"))"
        fi
    done
}

golden_dump chapter_s42
golden_dump tail_s7
golden_dump chapter_s42 --impl fused
golden_dump tail_s7 --impl fused

# values_text CASE B H [flags]: --values for sample B, head H is torch's text.
values_text() {
    local c=$1 b=$2 h=$3; shift 3
    local want="$LEARNER_DATA/$c/values_b${b}_h${h}.txt" name="$c --values --sample $b --head $h $*"
    # shellcheck disable=SC2046
    "$INSPECT" $(cat "$LEARNER_DATA/$c/args.txt") --values --sample "$b" --head "$h" "$@" \
        >"$tmp/v" 2>"$tmp/err" || { bad "$name: failed: $(cat "$tmp/err")"; return; }
    # shellcheck disable=SC2046
    "$INSPECT" $(cat "$LEARNER_DATA/$c/args.txt") >"$tmp/plain"
    head -n 7 "$tmp/v" | cmp -s - "$tmp/plain" && ok "$name: the seven lines come first, unchanged" \
        || bad "$name: --values changed the seven lines"
    [ "$(sed -n 8p "$tmp/v")" = "" ] || bad "$name: no blank line after the seven lines"
    if tail -n +9 "$tmp/v" | cmp -s - "$want"; then
        ok "$name: every printed number is torch's, rounded ($(grep -c '^pos ' "$want") labelled rows)"
    else
        bad "$name: the text differs from torch's ($want):"; tail -n +9 "$tmp/v" | diff "$want" - | head -20
    fi
}
values_text chapter_s42 0 0
values_text chapter_s42 1 2
values_text tail_s7 2 1
values_text chapter_s42 1 2 --impl fused

# What a learner reads: the labels, -inf where masked, every step with its shape.
"$INSPECT" --values >"$tmp/v"
for want in "x[0]  [T, E] = [5, 16]" "q[0, 0]  [T, D] = [5, 4]" "k[0, 0]  [T, D] = [5, 4]" \
    "v[0, 0]  [T, D] = [5, 4]" "scores[0, 0]  [T, T] = [5, 5]" "scaled scores[0, 0]  [5, 5]" \
    "masked scores[0, 0]  [5, 5]" "weights[0, 0]  [5, 5]" "context[0, 0]  [T, D] = [5, 4]" \
    "merged heads[0]  [T, E] = [5, 16]" "output[0]  [T, E] = [5, 16]"; do
    grep -qF -- "$want" "$tmp/v" && ok "--values prints '$want'" || bad "--values lacks '$want'"
done
# Sample 0's row for query 0 in the masked scores: key 0 visible, keys 1..4 -inf.
row=$(awk '/^masked scores/ { m = 1 } m && /^pos 0 \(id 1\)/ { print; exit }' "$tmp/v")
[ "$(echo "$row" | awk '{ print $6, $7, $8, $9 }')" = "-inf -inf -inf -inf" ] \
    && ok "masked scores show -inf as such: '$row'" || bad "masked row 0 is '$row'"
grep -q "^pos 4 (id 0)" "$tmp/v" && grep -q "pos 4 (id 0)$" "$tmp/v" \
    && ok "a pad token is labelled by position and id, on rows and columns: pos 4 (id 0)" \
    || bad "the pad token's label 'pos 4 (id 0)' is missing"

# Usage errors go through the one parser.
refuse() { # name, stderr substring, args...
    local name=$1 want=$2; shift 2
    "$INSPECT" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ] && grep -qF -- "$want" "$tmp/err"; then
        ok "$name: $(cat "$tmp/err")"
    else bad "$name: status $rc, stderr '$(cat "$tmp/err")'"; fi
}
refuse "a head outside H is refused" "--head 4 is out of range for --num-heads 4" --values --head 4
refuse "a negative head is refused" "--head must be in" --head -1
refuse "an unknown --impl is refused" "--impl takes ref|fused, not 'avx'" --impl avx
refuse "an unknown --layout is refused" "--layout takes fused|separate, not 'split'" --layout split
"$INSPECT" --help >"$tmp/h"
for flag in --values --head --impl --layout --mistake "q.npy, k.npy, v.npy"; do
    grep -qF -- "$flag" "$tmp/h" && ok "--help documents $flag" || bad "--help lacks $flag"
done

[ $fail -eq 0 ] && echo "test_values: all passed"
exit $fail
