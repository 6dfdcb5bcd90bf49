#!/usr/bin/env bash
# inspect_self_attention --heatmap FILE.svg draws, for --sample N, the padding,
# causal and combined masks and each head's scaled scores and weights: the file is
# well-formed XML (xmllint, from Debian's libxml2-utils, which .ci/run installs; where
# it is absent the C checker in tests/test_heatmap.c still covers well-formedness),
# has one <rect class="cell"> with a <title> per entry, marks exactly the masked
# entries (a masked score is -inf and says so), has a key for masks, scores and
# weights each, labels every position "pos P (id I)", the weights in the titles are
# those of the dumped attention.npy, and the softmax of each row of scores in the
# titles gives that row's weights. --show draws the same in the terminal. The seven
# lines do not change.
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
have_xmllint=0
command -v xmllint >/dev/null 2>&1 && have_xmllint=1
[ $have_xmllint -eq 1 ] || echo "skip xmllint not installed: well-formedness is left to test_heatmap.c"

count() { grep -o -- "$2" "$1" | wc -l; }

check() { # B T E H SAMPLE
    local B=$1 T=$2 E=$3 H=$4 S=$5
    local name="B=$B T=$T E=$E H=$H sample $S"
    local svg="$tmp/h_$B$T$E$H$S.svg"
    "$INSPECT" --batch-size "$B" --seq-len "$T" --embed-dim "$E" --num-heads "$H" >"$tmp/plain"
    if ! "$INSPECT" --batch-size "$B" --seq-len "$T" --embed-dim "$E" --num-heads "$H" \
        --heatmap "$svg" --sample "$S" --dump "$tmp/d" >"$tmp/out" 2>"$tmp/err"; then
        bad "$name: --heatmap failed: $(cat "$tmp/err")"; return
    fi
    cmp -s "$tmp/plain" "$tmp/out" && ok "$name: the seven lines are unchanged" \
        || bad "$name: --heatmap changed stdout"
    if [ $have_xmllint -eq 1 ]; then
        xmllint --noout "$svg" 2>"$tmp/xerr" && ok "$name: xmllint parses the SVG" \
            || bad "$name: xmllint: $(head -3 "$tmp/xerr")"
    fi
    # One cell per entry: padding [T] + causal [T, T] + combined [T, T] + H x [T, T]
    # scores + H x [T, T] weights.
    local want=$(( T + 2 * T * T + 2 * H * T * T ))
    local cells; cells=$(count "$svg" '<rect class="cell[ "]')
    [ "$cells" -eq "$want" ] && ok "$name: $cells cells = T + 2T^2 + 2H*T^2" \
        || bad "$name: $cells cells, expected $want"
    local titled; titled=$(count "$svg" '<rect class="cell[^>]*><title>[^<][^<]*</title></rect>')
    [ "$titled" -eq "$want" ] && ok "$name: every cell has a <title>" \
        || bad "$name: $titled titled cells of $want"
    # Masked entries of sample S: key j is masked for query i when j > i or key j is a
    # pad; the padding panel masks the pads, the causal one j > i, the combined one and
    # every head's scores and weights both.
    local m=$(( T < 3 ? T : 3 )); (( m < 1 )) && m=1
    local len=$(( T - 1 - S % m )); (( len < 1 )) && len=1
    local pads=$(( T - len )) causal=$(( T * (T - 1) / 2 )) comb=0 i j
    for ((i = 0; i < T; i++)); do for ((j = 0; j < T; j++)); do
        (( j > i || j >= len )) && comb=$((comb + 1))
    done; done
    local want_masked=$(( pads + causal + comb + 2 * H * comb ))
    local masked; masked=$(count "$svg" '<rect class="cell masked"')
    [ "$masked" -eq "$want_masked" ] && ok "$name: $masked masked cells, all hatched" \
        || bad "$name: $masked masked cells, expected $want_masked"
    local hatched; hatched=$(count "$svg" 'class="cell masked"[^>]*fill="url(#masked)"')
    [ "$hatched" -eq "$want_masked" ] || bad "$name: $hatched hatched of $want_masked masked cells"
    grep -q "head $((H - 1)) weights" "$svg" && grep -q "head $((H - 1)) scaled scores" "$svg" \
        && ok "$name: a panel of scores and one of weights per head" || bad "$name: no panels for head $((H - 1))"
    local inf; inf=$(count "$svg" 'scaled scores: [^<]* = -inf (masked)</title>')
    [ "$inf" -eq $(( H * comb )) ] && ok "$name: the $inf masked scores are titled -inf" \
        || bad "$name: $inf scores titled -inf, expected $(( H * comb ))"
    local g
    for g in weights scores masks; do
        grep -q "<g class=\"legend legend-$g\">" "$svg" || bad "$name: no key for the $g"
    done
    grep -q '<g class="legend legend-masks">' "$svg" && ok "$name: masks, scores and weights each have a key"
    # Positions and token ids of sample S label the axes: the first real token, at
    # position 0, has id S*T + 1; the last position is a pad (id 0) for T > 1.
    grep -q ">pos 0 (id $((S * T + 1)))</text>" "$svg" && grep -q "query pos 0 (id $((S * T + 1))) " "$svg" \
        && ok "$name: axes and titles name positions and sample $S's token ids as \"pos P (id I)\"" \
        || bad "$name: \"pos 0 (id $((S * T + 1)))\" is not on the axes and in the titles"
    if [ "$T" -gt 1 ]; then
        grep -q ">pos $((T - 1)) (id 0)</text>" "$svg" && ok "$name: the last position is labelled pos $((T - 1)) (id 0)" \
            || bad "$name: no label \"pos $((T - 1)) (id 0)\""
    fi
    # The scores in the titles are those the weights came from: per row, the softmax
    # of the visible scores (6 decimals, so each is off by at most 5e-7, which moves a
    # weight by about as much) equals the weights in the titles (6 decimals) within
    # 3e-6. A wrong scale, head or slice of qkv moves them by far more.
    if grep -o '<title>head [0-9]* [a-z ]*: query pos [0-9]* ([^)]*) [^ ]* key pos [0-9]* ([^)]*) = [-0-9.inf]*' "$svg" \
        | sed 's/<title>head \([0-9]*\) \([a-z ]*\): query pos \([0-9]*\) ([^)]*) [^ ]* key pos \([0-9]*\) ([^)]*) = /\1 \2 \3 \4 /' \
        | awk -v T="$T" '
            $2 == "scaled" { s[$1, $4, $5] = $6; next }
            { w[$1, $3, $4] = $5; n++ }
            END {
                if (n == 0) { print "no weights"; exit 1 }
                worst = 0
                for (k in w) {
                    split(k, a, SUBSEP); h = a[1]; i = a[2]
                    m = -1e30
                    for (j = 0; j < T; j++) if (s[h, i, j] != "-inf" && s[h, i, j] + 0 > m) m = s[h, i, j] + 0
                    z = 0
                    for (j = 0; j < T; j++) if (s[h, i, j] != "-inf") z += exp(s[h, i, j] - m)
                    v = s[h, i, a[3]] == "-inf" ? 0 : exp(s[h, i, a[3]] - m) / z
                    d = v - w[k]; if (d < 0) d = -d; if (d > worst) worst = d
                }
                printf "largest difference %.2g over %d weights\n", worst, n
                exit worst > 3e-6
            }' >"$tmp/soft"; then
        ok "$name: softmax of the titled scores gives the titled weights ($(cat "$tmp/soft"))"
    else
        bad "$name: scores and weights in the titles disagree: $(cat "$tmp/soft")"
    fi
    # The titles hold the weights that were computed: compare with attention.npy.
    if command -v python3 >/dev/null 2>&1 && python3 -c 'import numpy' 2>/dev/null; then
        if python3 - "$svg" "$tmp/d/attention.npy" "$S" <<'EOF'
import re, sys
import numpy as np
svg, att, s = open(sys.argv[1], encoding="utf-8").read(), np.load(sys.argv[2]), int(sys.argv[3])
cells = re.findall(r'<title>head (\d+) weights: query pos (\d+) \(id -?\d+\) \S+ key pos (\d+) '
                   r'\(id -?\d+\) = ([0-9.]+)', svg)
assert len(cells) == att.shape[1] * att.shape[2] * att.shape[3], len(cells)
for h, i, j, v in cells:
    # float(...) first: NumPy 2 would subtract in float32 and round the difference.
    assert abs(float(v) - float(att[s, int(h), int(i), int(j)])) <= 5e-7, (h, i, j, v)
EOF
        then ok "$name: every head cell's title holds attention[$S, h, i, j] (to the 6 printed decimals)"
        else bad "$name: titles do not match attention.npy"; fi
    else
        echo "skip $name: python3 with numpy not installed, title values not compared"
    fi
    rm -rf "$tmp/d"
}

check 2 5 16 4 0
check 2 5 16 4 1
check 3 7 12 3 2
check 1 1 3 1 0

# --show: the same panels in the terminal; no colour codes when stdout is a file.
"$INSPECT" --show >"$tmp/show" 2>"$tmp/err" || bad "--show failed: $(cat "$tmp/err")"
head -n 7 "$tmp/show" | cmp -s - "$ATTN_SOURCE_DIR/tests/expected/experiment_default.txt" \
    && ok "--show keeps the seven lines first" || bad "--show changed the seven lines"
for p in "padding mask" "causal mask" "combined mask" "head 0 scaled scores" "head 3 scaled scores" \
    "head 0 weights" "head 3 weights"; do
    grep -q "^$p" "$tmp/show" || bad "--show lacks the panel '$p'"
done
grep -q "×××" "$tmp/show" && grep -q "███" "$tmp/show" && ok "--show shades cells and marks masked ones" \
    || bad "--show has no shading or no masked marks"
grep -q $'\x1b' "$tmp/show" && bad "--show wrote colour codes to a file" || ok "--show writes no colour codes to a file"
# Position 0 (id 1) of sample 0 sees only key position 0: the first head-0 row is one
# full cell, then masks; its scores row is one number, then -inf.
grep -A3 "^head 0 weights" "$tmp/show" | tail -1 | grep -q "^pos 0 (id 1) ███ ××× ××× ××× ×××$" \
    && ok "--show: the first query of head 0 puts all its weight on key pos 0 (id 1)" \
    || bad "--show: unexpected first row of head 0: $(grep -A3 '^head 0 weights' "$tmp/show" | tail -1)"
grep -A3 "^head 0 scaled scores" "$tmp/show" | tail -1 | grep -Eq "^pos 0 \(id 1\) +-?[0-9]+\.[0-9]{2}( +-inf){4}$" \
    && ok "--show: the first query's scores are one number and four -inf" \
    || bad "--show: unexpected first row of head 0's scores: $(grep -A3 '^head 0 scaled scores' "$tmp/show" | tail -1)"
grep -q "^key, masks:   1 = may attend   × = masked (may not attend)$" "$tmp/show" \
    && grep -q "^key, scores: " "$tmp/show" && grep -q "^key, weights: " "$tmp/show" \
    && ok "--show has a key for masks, one for scores and one for weights" || bad "--show lacks a key"
# Sample 1 ends in two pads: both keep their positions ("two axes labelled 0" no more).
"$INSPECT" --show --sample 1 >"$tmp/show1" 2>"$tmp/err" || bad "--show --sample 1 failed: $(cat "$tmp/err")"
grep -q "^pos 3 (id 0) " "$tmp/show1" && grep -q "^pos 4 (id 0) " "$tmp/show1" \
    && ok "--show --sample 1 labels its two pads pos 3 (id 0) and pos 4 (id 0)" \
    || bad "--show --sample 1 does not tell its two pads apart"

# --sample out of range is a usage error.
"$INSPECT" --heatmap "$tmp/x.svg" --sample 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -e "$tmp/x.svg" ] \
    && ok "--sample 2 with B=2 is refused: $(cat "$tmp/err")" || bad "--sample 2 gave status $rc"
"$INSPECT" --show --seq-len 300 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ] \
    && ok "pictures of more than 256 tokens are refused: $(cat "$tmp/err")" || bad "--show --seq-len 300 gave status $rc"
"$INSPECT" --heatmap "$tmp/no_such_dir/x.svg" >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] \
    && ok "an unwritable --heatmap path fails with status 1: $(cat "$tmp/err")" || bad "unwritable --heatmap gave status $rc"

[ $fail -eq 0 ] && echo "test_heatmap_svg: all passed"
exit $fail
