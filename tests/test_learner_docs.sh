#!/usr/bin/env bash
# The learner's pages quote what the programs print, and the quotes stay true: every
# line of each quoted output below is a line the program prints today (the
# README's seven lines, the walkthrough's --trace, --show and --grad, the
# debugging page's --trace tail and --values, and its gdb session's numbers against
# --values; chapter 21's lines; the training run; the grader's verdict on a
# masked-zero softmax). A "..." in a quoted line stands for text left out: the part
# before it must match. Numbers drift when a kernel's rounding changes; this test
# is what says a page must be updated.
set -u
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
src="$ATTN_SOURCE_DIR"
bin="$ATTN_BUILD_DIR"
export NO_COLOR=1

# block FILE ANCHOR [N]: the N-th (default 1st) fenced block after the first line of
# FILE that contains ANCHOR, without its fences.
block() {
    awk -v a="$2" -v n="${3:-1}" '
        !found && index($0, a) { found = 1; next }
        found && /^```/ { if (inb) { inb = 0; if (++seen == n) exit; next } inb = 1; next }
        found && inb && seen == n - 1 { print }' "$1"
}

# quoted_lines_match NAME QUOTE OUTPUT: every non-empty line of QUOTE that is not
# "..." is a line of OUTPUT; a line with "..." in it matches a line that starts with
# the text before the "...". Trailing spaces are ignored.
quoted_lines_match() {
    local name=$1 quote=$2 out=$3 n=0 missing=0 line pre
    if [ ! -s "$quote" ]; then bad "$name: the page's quote was not found (has its anchor moved?)"; return; fi
    sed -i 's/[[:space:]]*$//' "$quote" "$out"
    while IFS= read -r line; do
        [ -z "$line" ] && continue
        if [[ "$line" =~ ^[[:space:]]*\.\.\.[[:space:]] ]] || [ "$line" = "..." ]; then continue; fi
        n=$((n + 1))
        if [[ "$line" == *"..."* ]]; then
            pre=${line%%...*}
            grep -qF -- "$pre" "$out" || { bad "$name: the page quotes '$line', and no line starts so"; missing=1; }
        else
            grep -qxF -- "$line" "$out" || { bad "$name: the page quotes '$line', which the program no longer prints"; missing=1; }
        fi
    done <"$quote"
    if [ "$missing" -eq 0 ]; then ok "$name: all $n quoted lines are printed"; else
        echo "    the program printed:"; sed 's/^/    | /' "$out"; fi
}

INSPECT="$bin/inspect_self_attention"

# README.md: the chapter's seven lines.
block "$src/README.md" '`make run` builds everything' >"$tmp/q"
"$INSPECT" >"$tmp/o" 2>&1
if cmp -s "$tmp/q" "$tmp/o"; then ok "README: the seven lines are the program's, in order"; else
    bad "README: the seven lines differ from the program's"; diff "$tmp/q" "$tmp/o" | sed 's/^/    /'; fi

# docs/walkthrough.md section 4: --trace, every line but the thread count (which
# depends on the machine's cores).
block "$src/docs/walkthrough.md" '## 4. `--trace`' | grep -v '^threads:' >"$tmp/q"
"$INSPECT" --trace 2>&1 | tail -n +9 | grep -v '^threads:' >"$tmp/o"
if [ -s "$tmp/q" ] && cmp -s "$tmp/q" "$tmp/o"; then ok "walkthrough: the --trace quote is the program's (threads line aside)"; else
    bad "walkthrough: the --trace quote differs from the program's (< page, > program)"; diff "$tmp/q" "$tmp/o" | sed 's/^/    /'; fi

# docs/walkthrough.md section 5: --show's head 0 panels.
block "$src/docs/walkthrough.md" '`NO_COLOR` to keep the shading' >"$tmp/q"
"$INSPECT" --show >"$tmp/o" 2>&1
quoted_lines_match "walkthrough --show" "$tmp/q" "$tmp/o"

# docs/walkthrough.md section 5's prose: head 1's row of pos 3 (id 4), its visible
# scores and weights quoted to 2 decimals, are --values's 4-decimal numbers rounded
# (within 0.005 + 0.0001, since rounding the 4-decimal figure again may go the other
# way); and the hover title it quotes is the SVG's.
"$INSPECT" --values --head 1 >"$tmp/v1" 2>&1
quote=$(grep -o 'scores `[^`]*`; the softmax makes them `[^`]*`' "$src/docs/walkthrough.md")
n=0
for kind in "masked scores[0, 1]" "weights[0, 1]"; do
    n=$((n + 1))
    quoted=$(echo "$quote" | cut -d'`' -f$((2 * n)) | sed 's/−/-/g; s/,//g')
    now=$(awk -v t="$kind" 'index($0, t) == 1 { f = 1 } f && /^pos 3 \(id 4\)/ { print $5, $6, $7, $8; exit }' "$tmp/v1")
    if awk -v q="$quoted" -v w="$now" 'BEGIN { nq = split(q, a, " "); nw = split(w, b, " "); if (nq != 4 || nw != 4) exit 1
            for (i = 1; i <= 4; i++) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > 0.0051) exit 1 } }'; then
        ok "walkthrough: head 1's row of pos 3 (id 4), $kind, quoted as '$quoted', is '$now' rounded"
    else
        bad "walkthrough: head 1's row of pos 3 (id 4), $kind, is '$now' now; the page quotes '$quoted'"
    fi
done
"$INSPECT" --heatmap "$tmp/h.svg" >/dev/null 2>&1
title=$(grep -o 'head 0 weights: query pos 1 (id 2) → key pos 0 (id 1) = [0-9.]*' "$tmp/h.svg" | head -1)
grep -qF -- "\`$title\`" "$src/docs/walkthrough.md" && ok "walkthrough: the quoted hover title is the SVG's: $title" \
    || bad "walkthrough: the SVG's title is '$title', which the page does not quote"

# The walkthrough and the README: the two layouts' outputs differ by up to 1.28
# (the walkthrough: largest |difference| 1.2777), from --dump of each.
ATTN_TEST_DATA_DIR=${ATTN_TEST_DATA_DIR:-$src/tests/data}
. "$src/tests/learner_lib.sh"
"$INSPECT" --dump "$tmp/fused" >/dev/null 2>&1 && "$INSPECT" --layout separate --dump "$tmp/sep" >/dev/null 2>&1
maxd=$(paste <(npy_floats "$tmp/fused/output.npy") <(npy_floats "$tmp/sep/output.npy") |
       awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.4f", m }')
short=$(awk -v m="$maxd" 'BEGIN { printf "%.2f", m }')
if grep -qF "largest |difference| $maxd" "$src/docs/walkthrough.md" && grep -qF "differs by up to $short" "$src/docs/walkthrough.md" \
    && grep -qF "differ by up to $short" "$src/README.md"; then
    ok "walkthrough and README: the layouts' outputs differ by up to $short ($maxd), as quoted"
else
    bad "the layouts' outputs differ by up to $maxd now; the walkthrough quotes '$(grep -o 'largest |difference| [0-9.]*' "$src/docs/walkthrough.md")', the README '$(grep -o 'differ by up to [0-9.]*' "$src/README.md")'"
fi

# docs/walkthrough.md: --grad.
block "$src/docs/walkthrough.md" './build/inspect_self_attention --grad' | grep -v '^\$ ' >"$tmp/q"
if ! grep -q 'norm=' "$tmp/q"; then
    block "$src/docs/walkthrough.md" 'inspect_self_attention --grad`' | grep -v '^\$ ' >"$tmp/q"
fi
"$INSPECT" --grad >"$tmp/o" 2>&1
quoted_lines_match "walkthrough --grad" "$tmp/q" "$tmp/o"

# docs/debugging.md: the --trace tail and --values.
block "$src/docs/debugging.md" '`--trace` says which ran' | grep -v '^\$ ' >"$tmp/q"
"$INSPECT" --trace 2>&1 | tail -4 >"$tmp/o"
quoted_lines_match "debugging --trace | tail -4" "$tmp/q" "$tmp/o"
block "$src/docs/debugging.md" 'The same numbers, rounded, without a debugger' >"$tmp/q"
"$INSPECT" --values >"$tmp/values" 2>&1
cp "$tmp/values" "$tmp/o"
quoted_lines_match "debugging --values" "$tmp/q" "$tmp/o"

# docs/debugging.md's gdb session: q's row 0 of head 0 ($4), the masked scores ($5)
# and the weights ($6) of (sample 0, head 0), rounded to 4 decimals, are --values's.
block "$src/docs/debugging.md" 'captured with GNU gdb' >"$tmp/gdb"
values_rows() { # TITLE: the 4-decimal numbers of the table so titled in --values, one a line
    awk -v t="$1" 'index($0, t) == 1 { f = 1; getline; next } f && /^$/ { exit }
                   f { for (i = 5; i <= NF; i++) print $i }' "$tmp/values" | sed 's/^-inf$/-inf/'
}
gdb_values() { # N: the numbers of gdb's $N, rounded to 4 decimals, one a line
    grep "^\\\$$1 = {" "$tmp/gdb" | sed 's/.*{//; s/}.*//' | tr ',' '\n' | sed 's/ //g' |
        awk '{ if ($1 == "-inf") print "-inf"; else printf "%.4f\n", $1 }'
}
check_gdb() { # NAME N TITLE
    gdb_values "$2" >"$tmp/g"; values_rows "$3" >"$tmp/v"
    # q's table has D columns and the session printed row 0 only.
    [ "$2" = 4 ] && head -n "$(wc -l <"$tmp/g")" "$tmp/v" >"$tmp/v2" && mv "$tmp/v2" "$tmp/v"
    sed -i 's/^-0\.0000$/0.0000/' "$tmp/g" "$tmp/v"
    if [ -s "$tmp/g" ] && cmp -s "$tmp/g" "$tmp/v"; then ok "debugging's gdb session: $1 ($(wc -l <"$tmp/g") numbers) are --values's"; else
        bad "debugging's gdb session: $1 differ from --values's '$3' (gdb, then --values):"
        paste "$tmp/g" "$tmp/v" | sed 's/^/    /'; fi
}
check_gdb "qd[0]@D" 4 "q[0, 0]"
check_gdb "the masked scores" 5 "masked scores[0, 0]"
check_gdb "the weights" 6 "weights[0, 0]"

# docs/debugging.md's gdb session stops where the recipe puts the breakpoints today:
# each "Breakpoint N at ..., line L" and each stop's "L<tab>source" is the first
# `for` line after step N's comment, as the recipe's awk finds it.
for n in 1 2 3; do
    want=$(awk -v s="Step $n:" 'index($0, s) { f = 1 } f && /for \(/ { print NR; exit }' "$src/src/attention/sdpa_ref.c")
    text=$(sed -n "${want}p" "$src/src/attention/sdpa_ref.c")
    said=$(grep -o "^Breakpoint $n at .*line [0-9]*" "$tmp/gdb" | grep -o '[0-9]*$')
    stop=$(grep -A1 "^Breakpoint $n, " "$tmp/gdb" | tail -1)
    if [ "$said" = "$want" ] && [ "$stop" = "$want	$text" ]; then
        ok "debugging's gdb session: step $n's breakpoint is line $want, as the recipe finds it"
    else
        bad "debugging's gdb session: step $n's breakpoint is quoted at line '$said' stopping on '$stop'; the recipe finds line $want: '$text'"
    fi
done

# docs/modern-attention.md: chapter 21's lines.
awk '/^```/ { if (inb) { if (keep) exit; inb = 0; next } inb = 1; next }
     inb { print; if (index($0, "x_shape=(2, 6, 32)")) keep = 1 }' "$src/docs/modern-attention.md" |
    awk 'f || /^x_shape=/ { f = 1; print }' >"$tmp/q"
"$bin/inspect_modern_attention" >"$tmp/o" 2>&1
quoted_lines_match "modern-attention" "$tmp/q" "$tmp/o"

# docs/gradients.md: the training run.
block "$src/docs/gradients.md" 'it takes about half a second' | grep -v '^\$ ' >"$tmp/q"
"$bin/train_attention" >"$tmp/o" 2>&1
quoted_lines_match "gradients train_attention" "$tmp/q" "$tmp/o"

# docs/exercises.md: the verdict on a softmax that masks with 0 is the grader's.
g="$bin/exercises/grade_broken_03_masked_softmax__masked_zero"
if [ -x "$g" ]; then
    block "$src/docs/exercises.md" '## Reading a verdict' >"$tmp/q"
    "$g" 3 >"$tmp/o" 2>&1
    sed -i 's#(exercises/solutions/\.\./tests/03_masked_softmax__masked_zero\.c#(exercises/03_masked_softmax.c#; s#(exercises/tests/03_masked_softmax__masked_zero\.c#(exercises/03_masked_softmax.c#' "$tmp/o"
    awk '/^WRONG /{ f = 1 } f && /^$/ { exit } f' "$tmp/o" >"$tmp/o2"
    if [ -s "$tmp/q" ] && cmp -s "$tmp/q" "$tmp/o2"; then ok "exercises: the quoted verdict is the grader's"; else
        bad "exercises: the quoted verdict differs from the grader's (< page, > grader)"; diff "$tmp/q" "$tmp/o2" | sed 's/^/    /'; fi
else
    echo "skip the exercises' verdict: $g was not built (ATTN_BUILD_EXERCISES off)"
fi

[ $fail -eq 0 ] && echo "test_learner_docs: all passed"
exit $fail
