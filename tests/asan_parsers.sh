#!/bin/bash
# asan_parsers.sh - builds the file-format tests (test_npy, test_safetensors,
# test_weights, test_golden) and the attn program with AddressSanitizer and
# UndefinedBehaviorSanitizer in a build folder of their own, and runs them, then the
# attn program's shell tests (test_cli_errors.sh, test_cli_golden.sh) against that
# build: the malformed-file, mutation and out-of-memory sweeps then prove that no
# hostile file makes the parsers or the program read or write outside a buffer, or
# leak.
#
#   tests/asan_parsers.sh [BUILD_DIR]      (default: build-asan-parsers)
#
# Environment: JOBS (parallel build jobs, default 2). Takes about a minute on two
# cores. Called from .ci/run; not a CTest test itself (it builds).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build-asan-parsers}
TESTS="test_npy test_safetensors test_weights test_golden"

cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DATTN_SANITIZE=address,undefined \
    -DATTN_WERROR=ON -DATTN_BUILD_TOOLS=ON >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "${JOBS:-2}" --target $TESTS attn >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for t in $TESTS; do
    if "$BUILD/tests/$t" 2>"$BUILD/tests/$t.log"; then
        echo "asan: $t ok ($(tail -n 1 "$BUILD/tests/$t.log"))"
    else
        echo "asan: $t FAILED; its log:" >&2
        cat "$BUILD/tests/$t.log" >&2
        status=1
    fi
done
for t in test_cli_errors test_cli_golden; do
    if ATTN="$BUILD/attn" ATTN_TEST_DATA_DIR="$SRC/tests/data" ATTN_TEST_TMP_DIR="$BUILD/tests" \
        bash "$SRC/tests/$t.sh" 2>"$BUILD/tests/$t.log"; then
        echo "asan: $t ok ($(tail -n 1 "$BUILD/tests/$t.log"))"
    else
        echo "asan: $t FAILED; its log:" >&2
        cat "$BUILD/tests/$t.log" >&2
        status=1
    fi
done
exit $status
