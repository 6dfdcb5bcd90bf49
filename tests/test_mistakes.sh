#!/usr/bin/env bash
# --mistake NAME runs the experiment with one classic mistake, and each one changes
# what it should and nothing else:
#   - every array it computes equals PyTorch's for the same mistaken module
#     (tests/data/learner/mistake_*, from tests/golden/gen_learner.py);
#   - first_head_weights_row0 is torch's mistaken weights[0, 0, 0, :], rounded;
#   - the lines a mistake cannot touch (shapes, token ids, the mask's row) stay;
#   - the report names the mistake and counts the weight and output rows that
#     changed against the correct run, as many as torch's two modules differ in;
#   - --values, --show and --heatmap say a mistake is on;
# and nothing is on by default: --mistake none is the default run, byte for byte.
set -u
source "$ATTN_SOURCE_DIR/tests/learner_lib.sh"
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# rows_changed MISTAKEN CORRECT ROWLEN: "CHANGED NANROWS" over rows of ROWLEN numbers,
# by the rule the program states (a difference over 1e-6, or NaN in one only).
rows_changed() {
    paste <(npy_floats "$1") <(npy_floats "$2") | awk -v L="$3" '
        { a = $1; b = $2; an = a ~ /nan/; bn = b ~ /nan/
          if (an != bn) d = 1
          else if (!an) { x = a - b; if (x < 0) x = -x; if (x > 1e-6) d = 1 }
          if (an) hn = 1
          if (NR % L == 0) { ch += d; nr += hn; d = 0; hn = 0 } }
        END { print ch + 0, nr + 0 }'
}

# rounded_row FILE T: the first T numbers as the seven lines print them.
rounded_row() {
    npy_floats "$1" | head -n "$2" | awk '
        { if ($1 ~ /nan/) s = "nan"; else { s = sprintf("%.4f", $1); sub(/0+$/, "", s); if (s ~ /\.$/) s = s "0" }
          out = out (NR > 1 ? ", " : "") s }
        END { print "[" out "]" }'
}

"$INSPECT" >"$tmp/default"
[ "$(wc -l <"$tmp/default")" -eq 7 ] && ! grep -q mistake "$tmp/default" \
    && ok "no mistake is on by default (seven lines, none about a mistake)" || bad "the default run mentions a mistake"
"$INSPECT" --mistake none >"$tmp/none"
cmp -s "$tmp/none" "$tmp/default" && ok "--mistake none prints exactly the default" || bad "--mistake none differs"
"$INSPECT" --dump "$tmp/d_default" >/dev/null; "$INSPECT" --mistake none --dump "$tmp/d_none" >/dev/null
same=1; for f in "$tmp/d_default"/*; do cmp -s "$f" "$tmp/d_none/$(basename "$f")" || same=0; done
[ $same -eq 1 ] && ok "--mistake none dumps exactly the default's files" || bad "--mistake none dumps other files"

correct="$LEARNER_DATA/chapter_s42"
for m in no-scale inverted-mask mask-queries softmax-wrong-axis mask-zero; do
    c="$LEARNER_DATA/mistake_${m//-/_}"
    d="$tmp/d_$m"
    if ! "$INSPECT" --mistake "$m" --dump "$d" >"$tmp/out" 2>"$tmp/err"; then
        bad "$m: run failed: $(cat "$tmp/err")"; continue
    fi
    for f in "$c"/*.npy; do
        n=$(basename "$f")
        read -r count nbad maxd first <<<"$(npy_compare "$d/$n" "$f")"
        [ "$nbad" -eq 0 ] && [ "$count" -gt 0 ] \
            && ok "$m: $n equals torch's mistaken module ($count numbers, largest difference $maxd)" \
            || bad "$m: $n: $nbad of $count numbers differ from torch's (first at $first)"
    done
    want="first_head_weights_row0=$(rounded_row "$c/attention.npy" 5)"
    got=$(sed -n 6p "$tmp/out")
    [ "$got" = "$want" ] && ok "$m: prints torch's mistaken $got" || bad "$m: printed '$got', torch gives '$want'"
    if [ "$(sed -n '1,5p;7p' "$tmp/out")" = "$(sed -n '1,5p;7p' "$tmp/default")" ]; then
        ok "$m: the shapes, token ids and the mask's row are unchanged"
    else bad "$m: a line the mistake cannot change changed"; fi
    grep -q "^mistake=$m: " "$tmp/out" && grep -q "^mistake_code=" "$tmp/out" \
        && ok "$m: the output says the mistake is on: $(grep "^mistake_code=" "$tmp/out")" || bad "$m: no mistake= line"
    read -r ch nr <<<"$(rows_changed "$c/attention.npy" "$correct/attention.npy" 5)"
    grep -q "^mistake_changed_weight_rows=$ch of 40 (.*; $nr rows hold NaN)" "$tmp/out" \
        && ok "$m: $ch of 40 weight rows changed, $nr NaN, as in torch" \
        || bad "$m: torch changes $ch weight rows ($nr NaN); printed $(grep changed_weight "$tmp/out")"
    read -r ch nr <<<"$(rows_changed "$c/output.npy" "$correct/output.npy" 16)"
    grep -q "^mistake_changed_output_rows=$ch of 10 (.*; $nr rows hold NaN)" "$tmp/out" \
        && ok "$m: $ch of 10 output rows changed, $nr NaN, as in torch" \
        || bad "$m: torch changes $ch output rows ($nr NaN); printed $(grep changed_output "$tmp/out")"
    [ "$ch" -gt 0 ] || bad "$m: the mistake changed no output row in torch either: the case shows nothing"
    if [ "$(sed -n 6p "$tmp/out")" = "$(sed -n 6p "$tmp/default")" ]; then
        grep -q "(first_head_weights_row0 is unchanged by the mistake)" "$tmp/out" \
            && ok "$m: says first_head_weights_row0 is unchanged" || bad "$m: does not say row 0 is unchanged"
    else
        grep -q "^correct_first_head_weights_row0=\[1.0, 0.0, 0.0, 0.0, 0.0\] (first_head_weights_row0 above is the mistaken one)" "$tmp/out" \
            && ok "$m: shows the correct row 0 beside the mistaken one" || bad "$m: no correct row 0"
    fi
    "$INSPECT" --mistake "$m" --values --show --heatmap "$tmp/h.svg" >"$tmp/vals" 2>&1
    grep -q "MISTAKE $m is on" "$tmp/vals" && grep -q "MISTAKE $m (the weights are the mistaken ones" "$tmp/vals" \
        && grep -q "MISTAKE $m" "$tmp/h.svg" && ok "$m: --values, --show and --heatmap say the mistake is on" \
        || bad "$m: --values/--show/--heatmap do not name the mistake"
done

# The mistakes' own printed effects, in words a learner checks by eye.
"$INSPECT" --mistake no-scale --values >"$tmp/v"
grep -q "NOT divided by sqrt(4) (mistake no-scale)" "$tmp/v" && ok "no-scale: --values titles the unscaled scores" \
    || bad "no-scale: the scaled scores' title does not say they are unscaled"
"$INSPECT" --mistake mask-zero --values >"$tmp/v"
row=$(awk '/^masked scores/ { m = 1 } m && /^pos 0 \(id 1\)/ { print; exit }' "$tmp/v")
[ "$(echo "$row" | awk '{ print $6, $7, $8, $9 }')" = "0.0000 0.0000 0.0000 0.0000" ] \
    && ok "mask-zero: the hidden scores show 0, not -inf: '$row'" || bad "mask-zero: masked row 0 is '$row'"
"$INSPECT" --mistake bogus >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -qF -- "--mistake takes none|no-scale|inverted-mask|mask-queries|softmax-wrong-axis|mask-zero, not 'bogus'" "$tmp/err" \
    && ok "an unknown mistake is a usage error naming the choices" || bad "--mistake bogus: status $rc, $(cat "$tmp/err")"

[ $fail -eq 0 ] && echo "test_mistakes: all passed"
exit $fail
