#!/bin/bash
# test_cli_errors.sh - the attn program's contract for errors (SPEC section 4): exit
# status 2 for a usage error and 1 for any other, one line on stderr naming the
# problem, --help on stdout with status 0, and output files written whole or not at
# all.
set -u
. "$(dirname "$0")/cli_lib.sh"

WORK="$ATTN_TEST_TMP_DIR/cli_errors"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
G="$ATTN_TEST_DATA_DIR/golden"
F="$ATTN_TEST_DATA_DIR/files"
W="$G/mha_chapter_pad_causal/weights.safetensors"
X="$G/mha_chapter_pad_causal/x.npy"
Q="$G/sdpa_causal_scale/q.npy"
K="$G/sdpa_causal_scale/k.npy"
V="$G/sdpa_causal_scale/v.npy"
fwd=(forward --weights "$W" --num-heads 3 --input "$X")
sdpa=(sdpa --query "$Q" --key "$K" --value "$V")

say "--help of every program and subcommand is a manual on stdout (exit 0) that documents the number rule and the exit statuses"
for prog in "$ATTN forward" "$ATTN sdpa" "$ATTN bench" "$INSPECT"; do
    run 0 $prog --help
    for section in NAME SYNOPSIS DESCRIPTION OPTIONS NUMBERS "EXIT STATUS" EXAMPLE \
        "a leading '+'" "hex ('0x10')" "'inf' or 'nan'" "1e-50" "    2   a usage error" "    1   any other error"; do
        out_has "$section"
    done
    [ -s "$ERR_FILE" ] && bad "$prog --help wrote to stderr" || ok
done
run 0 "$ATTN" forward --help
for opt in --weights --prefix --num-heads --input --token-ids --pad-id --causal --mask --empty-rows --output --attention; do
    out_has "$opt"
done
run 0 "$ATTN" sdpa -h
for opt in --query --key --value --mask --causal --scale --empty-rows --output --attention; do out_has "$opt"; done
run 0 "$ATTN" bench --help
for opt in --shape --batch --heads --query-len --key-len --head-dim --causal --padding --threads --impl --runs --json --peak --mha --seq-len --embed-dim --num-heads --gemm --size --bandwidth "JSON OUTPUT" ATTN_ARCH; do
    out_has "$opt"
done
run 0 "$INSPECT" --help
for opt in --batch-size --seq-len --embed-dim --num-heads --seed --trace --dump --heatmap --show --sample; do out_has "$opt"; done
run 0 "$ATTN" --help
for section in NAME SYNOPSIS COMMANDS forward sdpa bench NUMBERS "EXIT STATUS" ENVIRONMENT; do out_has "$section"; done

say "usage errors exit 2 with one line that names the problem and points to --help"
run 2 "$ATTN" forward
err_has "missing --weights"
err_has "attn forward --help"
run 2 "$ATTN" forward --weights "$W" --input "$X" --output "$WORK/y.npy"
err_has "missing --num-heads"
run 2 "$ATTN" "${fwd[@]}"
err_has "missing --output"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --bogus 1
err_has "unknown option '--bogus'"
run 2 "$ATTN" forward --weights "$W" --num-heads 0 --input "$X" --output "$WORK/y.npy"
err_has "--num-heads must be at least 1 (got 0)"
run 2 "$ATTN" forward --weights "$W" --num-heads three --input "$X" --output "$WORK/y.npy"
err_has "--num-heads takes a whole number, not 'three'"
run 2 "$ATTN" forward --weights "$W" --num-heads 3x --input "$X" --output "$WORK/y.npy"
run 2 "$ATTN" forward --weights "$W" --num-heads 99999999999999999999 --input "$X" --output "$WORK/y.npy"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --token-ids "$G/mha_chapter_pad_causal/ids.npy"
err_has "--token-ids and --pad-id go together"
say "uint8 token ids are named uint8 (not bool, what they load as) in the message"
npy_bool_const "$WORK/ids_u8.npy" 1 2 5
sed -i 's/|b1/|u1/' "$WORK/ids_u8.npy"
run 1 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --token-ids "$WORK/ids_u8.npy" --pad-id 0
err_has "got uint8 (2, 5)"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --empty-rows maybe
err_has "--empty-rows takes error|zero, not 'maybe'"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --causal=1
err_has "--causal takes no value"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --num-heads 3
err_has "--num-heads is given twice"
run 2 "$ATTN" "${fwd[@]}" --output
err_has "--output needs a value"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" stray
err_has "unexpected argument 'stray'"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --attention "$WORK/y.npy"
run 2 "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" --scale abc
err_has "--scale takes a finite number, not 'abc'"
run 2 "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" --scale nan
run 2 "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" --scale 1e300
err_has "--scale 1e300 is too large for float32"
run 2 "$ATTN" sdpa --query "$Q" --key "$K" --output "$WORK/o.npy"
err_has "missing --value"
run 2 "$ATTN" nosuchcommand
err_has "unknown command 'nosuchcommand'"
run 2 "$ATTN"
err_has "missing COMMAND"
[ -e "$WORK/y.npy" ] || [ -e "$WORK/o.npy" ] && bad "a usage error wrote an output" || ok

# bad_number PROGRAM... -- OPTION VALUE...: each VALUE given to OPTION (after the
# program's other arguments) is a usage error: exit 2, one line on stderr that names
# the option and the value, nothing on stdout.
bad_number() {
    local prog=()
    while [ "$1" != -- ]; do prog+=("$1"); shift; done
    shift
    local opt=$1 val
    shift
    for val in "$@"; do
        run 2 "${prog[@]}" "$opt" "$val"
        err_has "$opt"
        if [ -n "$val" ]; then err_has "$val"; else err_has "''"; fi
        [ -s "$OUT_FILE" ] && bad "${prog[*]} $opt '$val' printed to stdout" || ok
    done
}
# One rule for whole numbers in every program: the whole value is decimal digits
# with an optional '-'; whitespace, '+', hex, exponents, fractions, inf/nan, an empty
# value and overflow (either way) are refused.
BAD_INTS=(" 4" "4 " "+4" "0x10" "" "4x" "4.0" "1e3" "inf" "nan" "-" "99999999999999999999" "-99999999999999999999" "18446744073709551616")
# And for real numbers: decimal with an optional fraction and exponent, finite, and
# not so small or large that float32 makes it 0 or infinity.
BAD_FLOATS=(" 1" "1 " "+1" "0x10" "0x1p3" "" "1e" "." "inf" "-inf" "nan" "infinity" "1e39" "-1e39" "1e999" "1e-50" "-1e-50" "1e-999")

say "the number rule holds for every integer option of every program"
bad_number "$ATTN" forward --weights "$W" --input "$X" --output "$WORK/y.npy" -- --num-heads "${BAD_INTS[@]}"
bad_number "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --token-ids "$G/mha_chapter_pad_causal/ids.npy" -- --pad-id "${BAD_INTS[@]}"
bad_number "$ATTN" bench -- --threads "${BAD_INTS[@]}"
bad_number "$ATTN" bench -- --runs "${BAD_INTS[@]}"
bad_number "$ATTN" bench --head-dim 4 -- --query-len "${BAD_INTS[@]}"
bad_number "$ATTN" bench --mha -- --embed-dim "${BAD_INTS[@]}"
bad_number "$ATTN" bench --gemm -- --size "${BAD_INTS[@]}"
bad_number "$INSPECT" -- --seq-len "${BAD_INTS[@]}"
bad_number "$INSPECT" -- --seed "${BAD_INTS[@]}"
bad_number "$INSPECT" -- --sample "${BAD_INTS[@]}"

say "the number rule holds for real numbers (--scale), float32 included"
bad_number "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" -- --scale "${BAD_FLOATS[@]}"
run 2 "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" --scale 1e-50
err_has "--scale 1e-50 is too small for float32 (it would be 0)"
run 2 "$ATTN" "${sdpa[@]}" --output "$WORK/o.npy" --scale 1e39
err_has "--scale 1e39 is too large for float32 (it would be infinity)"
[ -e "$WORK/o.npy" ] && bad "a refused --scale wrote an output" || ok

say "the range of an integer option is part of the rule, and its message names the range and the value"
run 2 "$ATTN" bench --threads 99999999999999999999
err_has "--threads must be in 1..1024 (got 99999999999999999999)"
run 2 "$ATTN" bench --threads 0
err_has "--threads must be in 1..1024 (got 0)"
run 2 "$ATTN" "${fwd[@]}" --output "$WORK/y.npy" --token-ids "$G/mha_chapter_pad_causal/ids.npy" --pad-id 9223372036854775808
err_has "--pad-id does not fit in 64 bits (got 9223372036854775808)"
run 2 "$INSPECT" --seed -1
err_has "--seed must be at least 0 (got -1)"
run 2 "$INSPECT" --seed 9223372036854775808
err_has "--seed does not fit in 64 bits (got 9223372036854775808)"

say "numbers the rule accepts: a '-' sign, leading zeros, the ends of the ranges, fractions and exponents"
run 0 "$ATTN" "${fwd[@]}" --token-ids "$G/mha_chapter_pad_causal/ids.npy" --pad-id -9223372036854775808 --output "$WORK/ok.npy"
run 0 "$ATTN" forward --weights "$W" --num-heads 03 --input "$X" --output "$WORK/ok.npy"
for s in 0.125 -0.5 .5 5. 1e-3 1E+2 -0 1e-45 3.4028234e38; do
    run 0 "$ATTN" "${sdpa[@]}" --output "$WORK/ok.npy" --scale "$s"
done
run 0 "$INSPECT" --seed 9223372036854775807 --seq-len=0005 --batch-size 1 --embed-dim 4 --num-heads 1
rm -f "$WORK/ok.npy"

say "a fully masked query row names the flag --empty-rows zero, not the C field"
E0="$G/sdpa_empty_rows_zero"
run 1 "$ATTN" sdpa --query "$E0/q.npy" --key "$E0/k.npy" --value "$E0/v.npy" --mask "$E0/mask.npy" --output "$WORK/o.npy"
err_has "has all 4 keys masked"
err_has "(use --empty-rows zero to give such rows zero output)"
grep -q "empty_rows" "$ERR_FILE" && bad "the message names the C field: $(cat "$ERR_FILE")" || ok
npy_bool_const "$WORK/none.npy" 0 1 1 5 5
run 1 "$ATTN" "${fwd[@]}" --mask "$WORK/none.npy" --output "$WORK/o.npy"
err_has "keys masked"
err_has "(use --empty-rows zero to give such rows zero output)"
grep -q "empty_rows" "$ERR_FILE" && bad "the message names the C field: $(cat "$ERR_FILE")" || ok
run 0 "$ATTN" "${fwd[@]}" --mask "$WORK/none.npy" --empty-rows zero --output "$WORK/o.npy"
[ -e "$WORK/o.npy" ] && ok || bad "--empty-rows zero wrote no output"
rm -f "$WORK/o.npy"

say "--scale 0 is a scale like any other (every score 0: uniform weights) and runs"
run 0 "$ATTN" "${sdpa[@]}" --output "$WORK/scale0.npy" --scale 0
[ -s "$WORK/scale0.npy" ] && ok || bad "--scale 0 wrote no output"

say "a negative number is a value, not an option: --pad-id -1 (no key is a pad) runs"
run 0 "$ATTN" "${fwd[@]}" --token-ids "$G/mha_chapter_pad_causal/ids.npy" --pad-id -1 --output "$WORK/neg.npy"
[ -s "$WORK/neg.npy" ] && ok || bad "--pad-id -1 did not write"

say "options take their value after '=' too"
run 0 "$ATTN" forward --weights="$W" --num-heads=3 --input="$X" --output="$WORK/eq.npy"
[ -s "$WORK/eq.npy" ] && ok || bad "--output= did not write"

say "every malformed file of tests/data/files/MANIFEST is refused: exit 1, one line naming the file and the problem"
n=0
while IFS=$'\t' read -r name phrase; do
    case "$name" in '#'* | '') continue ;; esac
    case "$name" in
    *.npy) run 1 "$ATTN" forward --weights "$W" --num-heads 3 --input "$F/$name" --output "$WORK/bad.npy"
           err_has "--input" ;;
    *.safetensors) run 1 "$ATTN" forward --weights "$F/$name" --num-heads 3 --input "$X" --output "$WORK/bad.npy" ;;
    esac
    err_has "$name"
    err_has "$phrase"
    n=$((n + 1))
done <"$F/MANIFEST"
[ "$n" -ge 30 ] && ok || bad "only $n malformed files"
said=$(grep -o 'lists the [0-9]* broken files' "$ATTN_SOURCE_DIR/README.md" | grep -o '[0-9]*')
[ "$said" = "$n" ] && ok || bad "the README says MANIFEST lists '${said:-?}' broken files; it lists $n"
[ -e "$WORK/bad.npy" ] && bad "a refused input produced an output" || ok
run 1 "$ATTN" "${sdpa[@]/$K/$F/bad_dtype_complex.npy}" --output "$WORK/bad.npy"
err_has "--key"
err_has "bad_dtype_complex.npy"
run 1 "$ATTN" "${fwd[@]}" --output "$WORK/bad.npy" --mask "$F/ref_f32.npy"
err_has "a mask must be bool or uint8, not float32"
run 1 "$ATTN" "${fwd[@]}" --output "$WORK/bad.npy" --token-ids "$F/ref_f32.npy" --pad-id 0
err_has "expected int32 or int64 ids [2, 5]"
run 1 "$ATTN" "${fwd[@]/$X/$WORK/missing.npy}" --output "$WORK/bad.npy"
err_has "missing.npy: cannot open"

say "an input that is not a regular file (a FIFO no one writes to, a directory, a device) is refused at once: exit 1 naming the option and the file, no wait for a writer"
mkfifo "$WORK/in.fifo"
# timeout: before the fix, opening the FIFO waited for a writer forever (exit 124).
for flag in --mask --weights; do
    case $flag in
    --mask) run 1 timeout 20 "$ATTN" "${sdpa[@]}" --mask "$WORK/in.fifo" --output "$WORK/bad.npy" ;;
    --weights) run 1 timeout 20 "$ATTN" forward --weights "$WORK/in.fifo" --num-heads 3 --input "$X" --output "$WORK/bad.npy" ;;
    esac
    err_has "$WORK/in.fifo: not a regular file"
done
run 1 "$ATTN" "${sdpa[@]/$Q/$WORK}" --output "$WORK/bad.npy"
err_has "--query: $WORK: not a regular file"
run 1 "$ATTN" "${sdpa[@]/$K//dev/zero}" --output "$WORK/bad.npy"
err_has "--key: /dev/zero: not a regular file"
run 1 "$ATTN" sdpa --query <(cat "$Q") --key "$K" --value "$V" --output "$WORK/bad.npy"
err_has "not a regular file"

say "'-' as an input is a usage error (exit 2) that says inputs are files, not 'No such file'; /dev/stdin redirected from a file is read"
run 2 "$ATTN" sdpa --query - --key "$K" --value "$V" --output "$WORK/bad.npy" <"$Q"
err_has "--query -: inputs are read from files, not from a pipe"
run 2 "$ATTN" "${fwd[@]/$W/-}" --output "$WORK/bad.npy"
err_has "--weights -: inputs are read from files"
run 0 "$ATTN" sdpa --query /dev/stdin --key "$K" --value "$V" --output "$WORK/stdin.npy" <"$Q"
run 0 "$ATTN" sdpa --query "$Q" --key "$K" --value "$V" --output "$WORK/file.npy"
cmp -s "$WORK/stdin.npy" "$WORK/file.npy" && ok || bad "--query /dev/stdin < q.npy gave another output than --query q.npy"
rm -f "$WORK/stdin.npy" "$WORK/file.npy"
[ -p "$WORK/in.fifo" ] && ok || bad "the FIFO given as --mask is no longer a FIFO"
rm -f "$WORK/in.fifo"
[ -e "$WORK/bad.npy" ] && bad "a refused input produced an output" || ok

say "a failed run leaves an existing output file untouched; no temporary file is left behind"
printf 'old' >"$WORK/keep.npy"
run 1 "$ATTN" forward --weights "$W" --num-heads 3 --input "$F/bad_truncated_data.npy" --output "$WORK/keep.npy"
[ "$(cat "$WORK/keep.npy")" = old ] && ok || bad "keep.npy was changed by a failed run"
run 1 "$ATTN" "${sdpa[@]}" --mask "$G/sdpa_empty_rows_zero/mask.npy" --output "$WORK/keep.npy"
[ "$(cat "$WORK/keep.npy")" = old ] && ok || bad "keep.npy was changed by a failed run"

say "when the attention file cannot be written, the output is not written either"
run 1 "$ATTN" "${fwd[@]}" --output "$WORK/both.npy" --attention "$WORK/no_such_dir/a.npy"
err_has "no_such_dir/a.npy"
[ -e "$WORK/both.npy" ] && bad "the output was written although the attention file failed" || ok
run 1 "$ATTN" "${fwd[@]}" --output "$WORK/no_such_dir/y.npy"
err_has "no_such_dir/y.npy"
no_temp_files "$WORK"

say "a successful run replaces an existing output whole"
run 0 "$ATTN" "${fwd[@]}" --output "$WORK/keep.npy" --attention "$WORK/att.npy"
[ "$(head -c 6 "$WORK/keep.npy" | tail -c 5)" = NUMPY ] && ok || bad "keep.npy was not replaced"
[ "$(npy_shape "$WORK/keep.npy")" = "(2, 5, 12)" ] && ok || bad "output shape $(npy_shape "$WORK/keep.npy")"
[ "$(npy_shape "$WORK/att.npy")" = "(2, 3, 5, 5)" ] && ok || bad "attention shape $(npy_shape "$WORK/att.npy")"
no_temp_files "$WORK"

cli_summary test_cli_errors
