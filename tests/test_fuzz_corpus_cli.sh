#!/usr/bin/env bash
# Replays the committed corpus of the command-line fuzz target (fuzz/corpus/cli/:
# seeds and the regress_* inputs that once crashed it) through the real attn
# program, the way fuzz/fuzz_cli.c builds each argv: byte 0 picks the subcommand
# (even: forward, odd: sdpa), the rest are arguments separated by NUL bytes (at most
# 48), '/' in an argument becomes '_', and the program runs in a directory holding
# the files fuzz/cli_files.txt lists. Every input must end with exit status 0, 1 or
# 2 (no crash, no sanitizer report in a sanitized build).
set -u
src=${ATTN_SOURCE_DIR:?}
data=${ATTN_TEST_DATA_DIR:?}
corpus="$src/fuzz/corpus/cli"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
n=0
regress=0

setup_dir() { # a fresh work directory with the listed files
    rm -rf "$tmp/work"
    mkdir "$tmp/work"
    while IFS=$'\t' read -r name source; do
        case "$name" in '#'*|'') continue ;; esac
        cp "$data/$source" "$tmp/work/$name"
    done < "$src/fuzz/cli_files.txt"
}

for input in "$corpus"/*; do
    [ -f "$input" ] || continue
    n=$((n + 1))
    case "$(basename "$input")" in regress_*) regress=$((regress + 1)) ;; esac
    first=$(head -c 1 "$input" | od -An -tu1 | tr -d ' ')
    [ -n "$first" ] || continue
    cmd=forward
    [ $((first % 2)) -eq 1 ] && cmd=sdpa
    args=()
    if [ "$(stat -c %s "$input")" -gt 1 ]; then
        mapfile -d '' -t args < <(tail -c +2 "$input" | tr '/' '_')
    fi
    args=("${args[@]:0:48}")
    setup_dir
    (cd "$tmp/work" && "$ATTN" "$cmd" "${args[@]}") >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -gt 2 ]; then
        echo "FAIL $(basename "$input"): attn $cmd exited with status $rc"
        head -20 "$tmp/err"
        fail=1
    else
        echo "ok   $(basename "$input"): attn $cmd, exit $rc"
    fi
done
echo "$n inputs replayed ($regress regression inputs)"
[ $n -ge 5 ] || { echo "FAIL: the corpus $corpus has only $n inputs"; fail=1; }
exit $fail
