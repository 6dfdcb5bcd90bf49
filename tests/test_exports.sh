#!/usr/bin/env bash
# The shared library exports the public API and nothing else: every function that
# include/attn.h marks ATTN_API, and no other symbol (no attn__ internals, no
# helpers without a prefix). Needs nm (binutils, which gcc brings).
#
# The static library cannot hide anything: a program linked against libattn.a sees
# every global symbol of every object in it, so a helper named plainly (`pack_panel`)
# would clash with one of the program's own. Every global symbol libattn.a defines
# must therefore carry the library's prefix, attn_ or attn__.
set -u
: "${ATTN_SOURCE_DIR:?}" "${ATTN_BUILD_DIR:?}"
so="$ATTN_BUILD_DIR/libattn.so"
[ -f "$so" ] || { echo "FAIL: $so was not built" >&2; exit 1; }
command -v nm >/dev/null || { echo "FAIL: nm is not installed" >&2; exit 1; }

want=$(grep -o '^ATTN_API [^(]*(' "$ATTN_SOURCE_DIR/include/attn.h" |
       grep -o 'attn_[a-z0-9_]*($' | tr -d '(' | sort -u)
got=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TtDdBbRrVvWw]$/ {print $3}' |
      grep -v '^_\(init\|fini\|edata\|end\|_bss_start\)$' | sed 's/@.*//' | sort -u)

fails=0
extra=$(comm -13 <(echo "$want") <(echo "$got"))
missing=$(comm -23 <(echo "$want") <(echo "$got"))
if [ -n "$extra" ]; then
    echo "FAIL: libattn.so exports symbols attn.h does not declare: $(echo $extra)" >&2
    fails=1
fi
if [ -n "$missing" ]; then
    echo "FAIL: attn.h declares functions libattn.so does not export: $(echo $missing)" >&2
    fails=1
fi
echo "-- libattn.so exports the $(echo "$want" | wc -l) functions attn.h marks ATTN_API, and nothing else" >&2

# The README: "errors as values ... no exit or abort on bad input". The library calls
# none of the C library's ways to end the process (an assert() left in a build
# would import __assert_fail).
enders=$(nm -D --undefined-only "$so" | awk '{print $NF}' | sed 's/@.*//' |
         grep -xE 'exit|_exit|_Exit|quick_exit|abort|__assert_fail|__assert_perror_fail|err|errx|verr|verrx' | sort -u)
if [ -n "$enders" ]; then
    echo "FAIL: libattn.so calls functions that end the process: $(echo $enders)" >&2
    fails=1
else
    echo "-- libattn.so imports no exit, _exit, abort or __assert_fail: it never ends the caller's process" >&2
fi

# The README's Robustness section counts the public functions; the count is this one.
n=$(echo "$want" | wc -l)
said=$(grep -o 'any of the [0-9]* public functions' "$ATTN_SOURCE_DIR/README.md" | grep -o '[0-9]*')
if [ "$said" = "$n" ]; then
    echo "-- the README's 'any of the $said public functions' is attn.h's count" >&2
else
    echo "FAIL: the README says 'any of the ${said:-?} public functions'; attn.h declares $n" >&2
    fails=1
fi

a="$ATTN_BUILD_DIR/libattn.a"
if [ -f "$a" ]; then
    # Names that begin with two underscores belong to the C implementation (a
    # sanitizer's __odr_asan.* markers, for one): no program may define them.
    unprefixed=$(nm -g --defined-only "$a" | awk 'NF == 3 {print $3}' | grep -v '^attn_' | grep -v '^__' | sort -u)
    if [ -n "$unprefixed" ]; then
        echo "FAIL: libattn.a defines global symbols without the attn_ prefix, which a program" \
             "linked statically could clash with: $(echo $unprefixed)" >&2
        fails=1
    else
        echo "-- every global symbol libattn.a defines starts with attn_ ($(nm -g --defined-only "$a" |
            awk 'NF == 3 && $3 !~ /^__/' | wc -l) symbols; names of the implementation's, __*, aside)" >&2
    fi
else
    echo "FAIL: $a was not built" >&2
    fails=1
fi
exit $fails
