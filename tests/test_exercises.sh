#!/usr/bin/env bash
# The exercise grader is itself graded: the model solutions (exercises/solutions/)
# and the right answers written another way (exercises/tests/correct/) pass every
# exercise; each deliberately broken file in exercises/tests/ is named by
# the diagnosis its file name promises, on the right exercise, while every other
# exercise still passes; the untouched stubs (exercises/0N_*.c) are all "not
# implemented yet"; the classic mistakes of docs/exercises.md each have a broken
# file, so none of their diagnoses can go untested; and the figures the page quotes
# for the 1/sqrt(D) scale are what the library measures.
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
bin="$ATTN_BUILD_DIR/exercises"
src="$ATTN_SOURCE_DIR/exercises"
verdicts() { grep -E '^(PASS|TODO|WRONG) ' "$1"; }
# A broken file whose loop never ends (02_causal_mask__too_slow.c) is stopped after
# this many seconds; right answers take milliseconds, even under a sanitizer.
export GRADE_TIME_LIMIT=2

# 1. The solutions pass all nine exercises (1, 2, 3, 4, 5a, 5b, 6, 7a, 7b), and so do
# the right answers written another way (exercises/tests/correct/: 7b with Delta =
# rowsum(P o dP), equal to rowsum(dO o O)).
NEX=9
all_pass() { # program, what
    "$1" >"$tmp/out" 2>&1; rc=$?
    n_pass=$(grep -c '^PASS ' "$tmp/out")
    if [ "$rc" -eq 0 ] && [ "$n_pass" -eq $NEX ] && [ "$(verdicts "$tmp/out" | wc -l)" -eq $NEX ]; then
        ok "$2 pass all $NEX exercises"
    else
        bad "$2: exit $rc, $n_pass of $NEX PASS lines, expected exit 0 and $NEX"
        sed 's/^/    /' "$tmp/out"
    fi
}
all_pass "$bin/grade_solutions" "the model solutions"
n_correct=0
for f in "$src"/tests/correct/*__*.c; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .c)
    n_correct=$((n_correct + 1))
    if [ -x "$bin/grade_correct_$name" ]; then all_pass "$bin/grade_correct_$name" "$name"
    else bad "$name: $bin/grade_correct_$name was not built (re-run cmake?)"; fi
done
[ "$n_correct" -gt 0 ] && ok "$n_correct right answers written another way graded" \
    || bad "no files in $src/tests/correct"

# 2. Each broken file gets the diagnosis its name promises, and only that one (a
# second file for the same mistake, written another way, is <stem>__<mistake>__<how>.c).
n_broken=0
for f in "$src"/tests/*__*.c; do
    name=$(basename "$f" .c)
    stem=${name%%__*}
    id=${name#*__}; id=${id%%__*}; id=${id//_/-} # <stem>__<mistake>[__<how>]
    number=$((10#${stem%%_*}))
    n_broken=$((n_broken + 1))
    if [ ! -x "$bin/grade_broken_$name" ]; then
        bad "$name: $bin/grade_broken_$name was not built (re-run cmake?)"; continue
    fi
    "$bin/grade_broken_$name" >"$tmp/out" 2>&1; rc=$?
    others=$(verdicts "$tmp/out" | grep -v '^PASS ' | wc -l)
    line=$(grep -E "^WRONG ${number}[a-z]? " "$tmp/out" | head -1)
    if [ "$rc" -eq 1 ] && [ "$others" -eq 1 ] && [[ "$line" == *"[$id]"* ]] \
        && [ "$(verdicts "$tmp/out" | wc -l)" -eq $NEX ]; then
        ok "$name: exercise $number is diagnosed [$id], the others pass"
    else
        bad "$name: expected exit 1 and one WRONG line for exercise $number naming [$id]; got exit $rc, $others verdicts other than PASS, line: '${line:-none}'"
        sed 's/^/    /' "$tmp/out"
    fi
done
[ "$n_broken" -gt 0 ] && ok "$n_broken broken files graded" || bad "no broken files in $src/tests"

# 2b. A crash or an endless loop inside the learner's function names the case it was
# on (the child writes it to a page it shares with the grader before each call), so
# the learner knows which shapes to try: the crashed file reads the mask without
# checking for NULL, which the first case of exercise 3 passes.
joined() { "$1" 2>&1 | tr '\n' ' ' | tr -s ' '; }
out=$(joined "$bin/grade_broken_03_masked_softmax__crashed")
if [[ "$out" == *"It crashed on case 1 of 5 (Tq = 3, Tk = 5, no mask,"* ]]; then
    ok "a crash names the case it happened on (case 1, no mask)"
else bad "the [crashed] verdict does not name 'case 1 of 5 (Tq = 3, Tk = 5, no mask': $out"; fi
out=$(joined "$bin/grade_broken_02_causal_mask__too_slow")
if [[ "$out" == *"It was on case 1 of 4 (T = 4)"* ]]; then
    ok "an endless loop names the case it was on (case 1, T = 4)"
else bad "the [too-slow] verdict does not name 'case 1 of 4 (T = 4)': $out"; fi

# 3. Every mistake docs/exercises.md's table lists (its first column, one or two ids
# in backquotes) has a broken file, as the page promises, so no diagnosis it names
# goes untested; "not-implemented" is the stubs' verdict, checked in 4. The brief's
# classic mistakes must be in the table.
doc="$ATTN_SOURCE_DIR/docs/exercises.md"
doc_ids=$(awk '/^## The mistakes the grader recognises/ { f = 1; next } /^## / { f = 0 }
               f && /^\| `/ { split($0, c, "|"); print c[2] }' "$doc" | grep -o '`[a-z0-9-]*`' | tr -d '`')
n_ids=$(echo "$doc_ids" | grep -c .)
[ "$n_ids" -ge 30 ] && ok "docs/exercises.md lists $n_ids mistake ids" \
    || bad "docs/exercises.md's table of mistakes gave $n_ids ids, expected at least 30 (has its heading moved?)"
for id in mask-inverted mask-queries causal-transposed causal-off-by-one out-of-bounds masked-zero \
          softmax-axis no-max-subtraction mask-transposed scale-missing scale-1-over-d k-layout \
          heads-mixed merge-mixed no-rescale masked-first-nan empty-row-nan crashed too-slow \
          no-rowsum rowsum-axis rowsum-unweighted delta-outside-p masked-gradient scale-twice \
          dk-not-transposed dv-not-transposed not-zeroed not-accumulated dq-dk-swapped; do
    echo "$doc_ids" | grep -qx -- "$id" || bad "mistake [$id] is not in docs/exercises.md's table"
done
for id in $doc_ids; do
    [ "$id" = not-implemented ] && continue
    file_id=${id//-/_}
    if ls "$src"/tests/*__"$file_id".c >/dev/null 2>&1; then ok "mistake [$id] has a broken file"
    else bad "mistake [$id] (docs/exercises.md) has no broken file exercises/tests/<stem>__$file_id.c"; fi
done

# 4. The stubs: untouched, every exercise is "not implemented yet". A learner who
# has started an exercise has edited its file (the TODO line is gone), and then
# this check is left to CI, which runs on a fresh clone.
stubs=("$src"/0[1-7]_*.c)
edited=""
for f in "${stubs[@]}"; do
    grep -q 'TODO: write this function' "$f" || edited="$edited $(basename "$f")"
done
if [ "${#stubs[@]}" -ne 7 ]; then
    bad "expected 7 exercise files exercises/0N_*.c, found ${#stubs[@]}"
elif [ -n "$edited" ]; then
    echo "skip the stubs' check: these exercises have been started:$edited (CI checks the stubs on a fresh clone)"
elif ! cmake --build "$ATTN_BUILD_DIR" --target grade_exercises >"$tmp/build" 2>&1; then
    bad "the stubs do not build"; sed 's/^/    /' "$tmp/build"
else
    "$bin/grade_exercises" >"$tmp/out" 2>&1; rc=$?
    n_todo=$(grep -c '^TODO .*not implemented yet' "$tmp/out")
    if [ "$rc" -eq 1 ] && [ "$n_todo" -eq $NEX ] && [ "$(verdicts "$tmp/out" | wc -l)" -eq $NEX ]; then
        ok "the untouched stubs: all $NEX exercises are 'not implemented yet'"
    else
        bad "the stubs: exit $rc, $n_todo of $NEX TODO lines, expected exit 1 and $NEX"
        sed 's/^/    /' "$tmp/out"
    fi
fi

# 5. docs/exercises.md's figures: with D = 64 and 5 keys of N(0, 1) entries, the
# largest weight of a row is mostly 0.3-0.65 with the scale (p10 and p90) and near 1
# without it (median above 0.95, three rows in four above 0.85).
if "$bin/exercise_max_weight" 64 5 10000 0 >"$tmp/mw" 2>&1; then
    read -r s10 s90 < <(awk '/^scale 1\/sqrt/ { print $3, $7 }' "$tmp/mw")
    read -r u25 u50 < <(awk '/^no scale/ { print $4, $5 }' "$tmp/mw")
    if awk -v a="$s10" -v b="$s90" -v c="$u25" -v d="$u50" \
        'BEGIN { exit !(a >= 0.28 && a <= 0.35 && b >= 0.60 && b <= 0.70 && c >= 0.85 && d >= 0.95) }'; then
        ok "the scale's measured figures: scaled p10 $s10, p90 $s90; unscaled p25 $u25, median $u50"
    else
        bad "the scale's figures moved: scaled p10 $s10 p90 $s90, unscaled p25 $u25 median $u50 (docs/exercises.md quotes 0.313, 0.653, 0.853, 0.983)"
        cat "$tmp/mw"
    fi
else
    bad "exercise_max_weight failed: $(cat "$tmp/mw")"
fi

# 6. The command line: "5" grades 5a and 5b only, "7" 7a and 7b; an unknown exercise
# is a usage error.
for n in 5 7; do
    "$bin/grade_solutions" $n >"$tmp/out" 2>&1
    got=$(verdicts "$tmp/out" | awk '{print $2}' | tr '\n' ' ')
    [ "$got" = "${n}a ${n}b " ] && ok "'grade $n' grades ${n}a and ${n}b" \
        || bad "'grade $n' graded '$got', expected '${n}a ${n}b '"
done
"$bin/grade_solutions" 9 >"$tmp/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown exercise '9'" "$tmp/out" && ok "'grade 9' is a usage error (exit 2)" \
    || bad "'grade 9': exit $rc, expected 2 with a message: $(cat "$tmp/out")"

exit $fail
