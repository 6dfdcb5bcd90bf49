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

say "--help for attn, forward and sdpa prints the manual on stdout and exits 0"
for cmd in forward sdpa; do
    run 0 "$ATTN" $cmd --help
    for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLE; do out_has "$section"; done
    [ -s "$ERR_FILE" ] && bad "$cmd --help wrote to stderr" || ok
done
run 0 "$ATTN" forward --help
for opt in --weights --prefix --num-heads --input --token-ids --pad-id --causal --mask --empty-rows --output --attention; do
    out_has "$opt"
done
run 0 "$ATTN" sdpa -h
for opt in --query --key --value --mask --causal --scale --empty-rows --output --attention; do out_has "$opt"; done
run 0 "$ATTN" --help
out_has forward
out_has sdpa

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
run 2 "$ATTN" sdpa --query "$Q" --key "$K" --output "$WORK/o.npy"
err_has "missing --value"
run 2 "$ATTN" nosuchcommand
[ -e "$WORK/y.npy" ] || [ -e "$WORK/o.npy" ] && bad "a usage error wrote an output" || ok

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
