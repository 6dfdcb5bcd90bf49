#!/usr/bin/env bash
# inspect_self_attention --heatmap FILE.svg draws, for --sample N, the padding,
# causal and combined masks and each head's weights: the file is well-formed XML
# (xmllint, from Debian's libxml2-utils, which .ci/run installs; where it is absent
# the C checker in tests/test_heatmap.c still covers well-formedness), has one
# <rect class="cell"> with a <title> per entry, marks exactly the masked entries, and
# the weights in the titles are those of the dumped attention.npy. --show draws the
# same in the terminal. The seven lines do not change.
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
    # One cell per entry: padding [T] + causal [T, T] + combined [T, T] + H x [T, T].
    local want=$(( T + 2 * T * T + H * T * T ))
    local cells; cells=$(count "$svg" '<rect class="cell[ "]')
    [ "$cells" -eq "$want" ] && ok "$name: $cells cells = T + 2T^2 + H*T^2" \
        || bad "$name: $cells cells, expected $want"
    local titled; titled=$(count "$svg" '<rect class="cell[^>]*><title>[^<][^<]*</title></rect>')
    [ "$titled" -eq "$want" ] && ok "$name: every cell has a <title>" \
        || bad "$name: $titled titled cells of $want"
    # Masked entries of sample S: key j is masked for query i when j > i or key j is a
    # pad; the padding panel masks the pads, the causal one j > i, the combined one and
    # every head both.
    local m=$(( T < 3 ? T : 3 )); (( m < 1 )) && m=1
    local len=$(( T - 1 - S % m )); (( len < 1 )) && len=1
    local pads=$(( T - len )) causal=$(( T * (T - 1) / 2 )) comb=0 i j
    for ((i = 0; i < T; i++)); do for ((j = 0; j < T; j++)); do
        (( j > i || j >= len )) && comb=$((comb + 1))
    done; done
    local want_masked=$(( pads + causal + comb + H * comb ))
    local masked; masked=$(count "$svg" '<rect class="cell masked"')
    [ "$masked" -eq "$want_masked" ] && ok "$name: $masked masked cells, all hatched" \
        || bad "$name: $masked masked cells, expected $want_masked"
    local hatched; hatched=$(count "$svg" 'class="cell masked"[^>]*fill="url(#masked)"')
    [ "$hatched" -eq "$want_masked" ] || bad "$name: $hatched hatched of $want_masked masked cells"
    grep -q "head $((H - 1)) weights" "$svg" && ok "$name: a panel per head" || bad "$name: no panel for head $((H - 1))"
    grep -q '<linearGradient id="scale"' "$svg" && ok "$name: has a colour scale" || bad "$name: no colour scale"
    # Token ids of sample S label the axes: the first real token is S*T + 1.
    grep -q "(token $((S * T + 1)))" "$svg" && ok "$name: titles name sample $S's token ids" \
        || bad "$name: sample $S's first token id $((S * T + 1)) is not in the titles"
    # The titles hold the weights that were computed: compare with attention.npy.
    if command -v python3 >/dev/null 2>&1 && python3 -c 'import numpy' 2>/dev/null; then
        if python3 - "$svg" "$tmp/d/attention.npy" "$S" <<'EOF'
import re, sys
import numpy as np
svg, att, s = open(sys.argv[1], encoding="utf-8").read(), np.load(sys.argv[2]), int(sys.argv[3])
cells = re.findall(r'<title>head (\d+) weights: query (\d+) \(token -?\d+\) \S+ key (\d+) '
                   r'\(token -?\d+\) = ([0-9.]+)', svg)
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
for p in "padding mask" "causal mask" "combined mask" "head 0 weights" "head 3 weights"; do
    grep -q "^$p" "$tmp/show" || bad "--show lacks the panel '$p'"
done
grep -q "×××" "$tmp/show" && grep -q "███" "$tmp/show" && ok "--show shades cells and marks masked ones" \
    || bad "--show has no shading or no masked marks"
grep -q $'\x1b' "$tmp/show" && bad "--show wrote colour codes to a file" || ok "--show writes no colour codes to a file"
# Query 1 of sample 0 sees only key 1: the first head-0 row is one full cell, then masks.
grep -A2 "^head 0 weights" "$tmp/show" | tail -1 | grep -q "^    1 ███ ××× ××× ××× ×××$" \
    && ok "--show: the first query of head 0 puts all its weight on key 1" \
    || bad "--show: unexpected first row of head 0: $(grep -A2 '^head 0 weights' "$tmp/show" | tail -1)"

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
