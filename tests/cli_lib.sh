# cli_lib.sh - helpers for the shell tests of the attn program (sourced by
# tests/test_cli_*.sh). Needs only bash, od and awk: no Python.
#
# The environment comes from CTest (tests/CMakeLists.txt): ATTN (the program),
# ATTN_TEST_DATA_DIR, ATTN_TEST_TMP_DIR.

: "${ATTN:?ATTN must name the attn program}"
: "${ATTN_TEST_DATA_DIR:?}"
: "${ATTN_TEST_TMP_DIR:?}"

CLI_FAILS=0
CLI_CHECKS=0

ok() { CLI_CHECKS=$((CLI_CHECKS + 1)); }
bad() {
    CLI_CHECKS=$((CLI_CHECKS + 1))
    CLI_FAILS=$((CLI_FAILS + 1))
    echo "FAIL: $*" >&2
}
say() { echo "-- $*" >&2; }

# run EXPECTED_STATUS CMD...: runs CMD with stdout/stderr in $OUT_FILE/$ERR_FILE and
# checks the exit status; an error (status != 0) must print exactly one line on stderr.
run() {
    local want=$1
    shift
    "$@" >"$OUT_FILE" 2>"$ERR_FILE"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        bad "exit $got, expected $want: $* ($(head -c 300 "$ERR_FILE"))"
        return
    fi
    ok
    if [ "$want" -ne 0 ]; then
        local lines
        lines=$(wc -l <"$ERR_FILE")
        if [ "$lines" -ne 1 ]; then
            bad "expected one line on stderr, got $lines: $*"
            cat "$ERR_FILE" >&2
        else
            ok
        fi
    fi
}

# err_has TEXT: the last run's stderr contains TEXT.
err_has() {
    if grep -qF -- "$1" "$ERR_FILE"; then ok; else bad "stderr lacks '$1': $(cat "$ERR_FILE")"; fi
}
out_has() {
    if grep -qF -- "$1" "$OUT_FILE"; then ok; else bad "stdout lacks '$1'"; fi
}

# npy_shape FILE: the shape field of an .npy header, e.g. "(2, 5, 16)".
npy_shape() {
    head -c 4096 "$1" | tr -d '\000' | grep -ao "'shape': ([0-9, ]*)" | sed "s/'shape': //"
}

# npy_floats FILE: the float32 values of a version-1 little-endian .npy file, one a
# line (od prints the shortest decimal that reads back to the same float).
npy_floats() {
    local hl
    hl=$(od -An -j8 -N2 -tu2 "$1" | tr -d ' ')
    od -An -v -j$((10 + hl)) -tf4 -w4 "$1" | awk '{print $1}'
}

# npy_close GOT EXPECTED ATOL RTOL: same shape, and every |got - exp| <= atol + rtol*|exp|;
# equal values always agree, so an expected -inf (a log-sum-exp of a row that sees no
# key) is matched by -inf only.
npy_close() {
    local gs es
    gs=$(npy_shape "$1")
    es=$(npy_shape "$2")
    if [ -z "$gs" ] || [ "$gs" != "$es" ]; then
        bad "shape of $1 is '$gs', expected '$es'"
        return
    fi
    ok
    local res
    res=$(paste <(npy_floats "$1") <(npy_floats "$2") | awk -v atol="$3" -v rtol="$4" '
        function abs(x) { return x < 0 ? -x : x }
        { n++; d = ($1 == $2) ? 0 : abs($1 - $2); if (!(d <= atol + rtol * abs($2))) { bad++; if (bad < 4) printf "  [%d] %s vs %s\n", n - 1, $1, $2 } }
        END { printf "%d %d\n", n, bad + 0 }' | tail -n 1)
    local n=${res% *} nbad=${res#* }
    if [ "$n" -gt 0 ] && [ "$nbad" -eq 0 ]; then ok; else bad "$1 differs from $2 in $nbad of $n values"; fi
}

# no_temp_files DIR: no "*.tmp.*" file left behind by an atomic write.
no_temp_files() {
    if ls "$1" | grep -q '\.tmp\.'; then bad "temporary files left in $1: $(ls "$1" | grep '\.tmp\.')"; else ok; fi
}

cli_summary() {
    echo "$1: $CLI_CHECKS checks, $CLI_FAILS failed" >&2
    [ "$CLI_FAILS" -eq 0 ]
}

# npy_bool_const FILE VALUE SHAPE...: writes a version-1 .npy of bool, every element
# VALUE (0 or 1), e.g. `npy_bool_const m.npy 0 1 1 5 5` for an all-false [1, 1, 5, 5]
# mask. The header is padded with spaces to a multiple of 64 bytes and ends in a
# newline, as numpy's format requires.
npy_bool_const() {
    local file=$1 value=$2
    shift 2
    local dims n=1 d
    for d in "$@"; do n=$((n * d)); done
    if [ $# -eq 1 ]; then dims="$1,"; else dims=$(IFS=,; echo "$*" | sed 's/,/, /g'); fi
    local dict="{'descr': '|b1', 'fortran_order': False, 'shape': ($dims), }"
    local len=$((10 + ${#dict} + 1))
    local pad=$(((64 - len % 64) % 64))
    local hl=$((${#dict} + pad + 1))
    {
        printf '\223NUMPY\001\000'
        printf "\\$(printf '%03o' $((hl % 256)))\\$(printf '%03o' $((hl / 256)))"
        printf '%s%*s\n' "$dict" "$pad" ""
        head -c "$n" /dev/zero | tr '\0' "\\$(printf '%03o' "$value")"
    } >"$file"
}
