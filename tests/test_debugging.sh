#!/usr/bin/env bash
# docs/debugging.md's recipe keeps working: each of the three step comments it names
# exists exactly once in src/attention/sdpa_ref.c, in order, and the recipe's "first
# `for` line after the comment" lands on a loop of that step (before the next step's
# comment); `make learn` is a Debug build that runs the reference.
set -u
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
src="$ATTN_SOURCE_DIR/src/attention/sdpa_ref.c"
doc="$ATTN_SOURCE_DIR/docs/debugging.md"
line() { awk -v s="$1" 'index($0, s) { f = 1 } f && /for \(/ { print NR; exit }' "$src"; }

prev=0
for c in "/* Step 1: scores = q k^T * scale, hidden keys -inf.  [Tq, Tk] */" \
         "/* Step 2: weights = softmax over the key axis," "/* Step 3: out = weights v.  [Tq, Dv]"; do
    grep -qF -- "$c" "$doc" || bad "docs/debugging.md does not name the comment '$c'"
    n=$(grep -cF -- "$c" "$src")
    [ "$n" -eq 1 ] || { bad "'$c' occurs $n times in sdpa_ref.c"; continue; }
    at=$(grep -nF -- "$c" "$src" | cut -d: -f1)
    [ "$at" -gt "$prev" ] || bad "'$c' is out of order"
    step=${c:3:6}
    b=$(line "$step:")
    next=$(awk -v a="$at" 'NR > a && /Step [0-9]:/ { print NR; exit }' "$src"); next=${next:-999999}
    if [ -n "$b" ] && [ "$b" -gt "$at" ] && [ "$b" -lt "$next" ]; then
        ok "$step: the comment is at line $at and the recipe's breakpoint at line $b is its loop: $(sed -n "${b}p" "$src" | sed 's/^ *//')"
    else bad "$step: the recipe's breakpoint (line '${b}') is not a loop of this step (comment at $at, next step at $next)"; fi
    prev=$at
done
grep -q "^learn:" "$ATTN_SOURCE_DIR/Makefile" && grep -q "CMAKE_BUILD_TYPE=Debug" "$ATTN_SOURCE_DIR/Makefile" \
    && grep -q "inspect_self_attention --impl ref" "$ATTN_SOURCE_DIR/Makefile" \
    && ok "make learn is a Debug build that runs the experiment on the reference" \
    || bad "the Makefile's learn target is not a Debug build running the reference"
[ $fail -eq 0 ] && echo "test_debugging: all passed"
exit $fail
