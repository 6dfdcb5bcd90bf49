#!/usr/bin/env bash
# tests/valgrind.sh BUILD_DIR - valgrind memcheck on the chapter's experiment and on
# `attn forward` / `attn sdpa` with the golden cases of tests/data/golden/.
#
#   tests/valgrind.sh build        # after cmake --build build
#
# Every run is `valgrind --error-exitcode=1 --leak-check=full`: an invalid read or
# write, a use of uninitialised memory, or a leak (definite or possible) fails it.
# The runs cover the success paths (every golden forward case: each weight name set,
# prefix, F16/BF16/F64 files, [T, E] input, padding + causal + random masks), the
# experiment's --trace/--dump/--heatmap/--show paths, one run on the reference
# kernel (ATTN_ARCH=ref), and error paths (a malformed file, a fully masked row,
# a usage error) where leaks like to hide. Not a CTest test (valgrind is slow);
# .ci/run calls it. Exits 0 when every run is clean, 1 otherwise; exits 0 with a
# "skipped" line when valgrind is not installed.
#
# valgrind does not emulate AVX-512; its emulated CPU does not report it, so the
# library's dispatch (cpuid) picks AVX2 or below under valgrind by itself.
set -u

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: tests/valgrind.sh BUILD_DIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
golden="$src/tests/data/golden"
ATTN="$build/attn"
INSPECT="$build/inspect_self_attention"
if ! command -v valgrind >/dev/null 2>&1; then
    echo "tests/valgrind.sh: skipped: valgrind is not installed (apt-get install valgrind)"
    exit 0
fi
for p in "$ATTN" "$INSPECT"; do
    [ -x "$p" ] || { echo "tests/valgrind.sh: $p is missing (build first)" >&2; exit 2; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
runs=0

# vg NAME EXPECTED_EXIT CMD... : runs CMD under memcheck; the command's own exit
# status must be EXPECTED_EXIT and valgrind must report no error. VG_ENV="A=1 B=2"
# sets environment variables for the one run.
vg() {
    local name=$1 want=$2
    shift 2
    runs=$((runs + 1))
    local log="$tmp/vg.$runs.log"
    env ${VG_ENV:-} valgrind --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect,possible \
        --errors-for-leak-kinds=definite,indirect,possible --track-origins=yes \
        --log-file="$log" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local summary
    summary=$(grep -E "ERROR SUMMARY" "$log" | tail -1 | sed 's/^==[0-9]*== //')
    if [ $rc -eq 99 ]; then
        echo "FAIL $name: valgrind found errors: $summary"
        grep -E "^==[0-9]+== (Invalid|Conditional|Use of|Syscall|.*definitely|.*indirectly|.*possibly|   (at|by) )" "$log" | head -40
        fail=1
    elif [ $rc -ne "$want" ]; then
        echo "FAIL $name: exit status $rc, expected $want ($(head -c 300 "$tmp/err"))"
        fail=1
    else
        echo "ok   $name: $summary"
    fi
}

# The experiment: the defaults, other sizes, and every optional output.
vg "inspect defaults" 0 "$INSPECT"
vg "inspect B=3 T=7 E=24 H=6 seed 7" 0 "$INSPECT" --batch-size 3 --seq-len 7 --embed-dim 24 --num-heads 6 --seed 7
VG_ENV="NO_COLOR=1" vg "inspect --trace --dump --heatmap --show" 0 "$INSPECT" --trace --dump "$tmp/dump" --heatmap "$tmp/h.svg" --show --sample 1
VG_ENV="ATTN_ARCH=ref" vg "inspect on the reference kernel" 0 "$INSPECT" --trace
VG_ENV="ATTN_ARCH=scalar" vg "inspect on the portable kernels" 0 "$INSPECT"
vg "inspect usage error" 2 "$INSPECT" --num-heads 3

# attn forward / attn sdpa with every golden case, as its case.txt says.
n_cases=0
for dir in "$golden"/*/; do
    case_file="$dir/case.txt"
    [ -f "$case_file" ] || continue
    get() { sed -n "s/^$1=//p" "$case_file" | head -1; }
    kind=$(get kind)
    name=$(basename "$dir")
    args=()
    if [ "$kind" = mha ]; then
        args=(forward --weights "$dir/$(get weights)" --num-heads "$(get num_heads)"
              --input "$dir/$(get input)")
        [ -n "$(get prefix)" ] && args+=(--prefix "$(get prefix)")
        [ -n "$(get token_ids)" ] && args+=(--token-ids "$dir/$(get token_ids)" --pad-id "$(get pad_id)")
    elif [ "$kind" = sdpa ]; then
        args=(sdpa --query "$dir/$(get query)" --key "$dir/$(get key)" --value "$dir/$(get value)")
        [ -n "$(get scale)" ] && args+=(--scale "$(get scale)")
    else
        continue
    fi
    [ "$(get causal)" = 1 ] && args+=(--causal)
    [ -n "$(get mask)" ] && args+=(--mask "$dir/$(get mask)")
    [ -n "$(get empty_rows)" ] && args+=(--empty-rows "$(get empty_rows)")
    args+=(--output "$tmp/out.npy")
    [ -n "$(get attention)" ] && args+=(--attention "$tmp/attn.npy")
    vg "attn ${args[0]} $name" 0 "$ATTN" "${args[@]}"
    n_cases=$((n_cases + 1))
done
if [ $n_cases -eq 0 ]; then
    echo "FAIL no golden cases found under $golden"
    fail=1
fi

# Error paths: each must fail cleanly, without a leak.
g="$golden/mha_chapter_pad_causal"
files="$src/tests/data/files"
vg "attn forward: malformed weights" 1 "$ATTN" forward --weights "$files/bad_st_overlap.safetensors" --num-heads 3 --input "$g/x.npy" --output "$tmp/o.npy"
vg "attn forward: malformed input" 1 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 3 --input "$files/bad_truncated_data.npy" --output "$tmp/o.npy"
vg "attn forward: heads do not divide E" 1 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 5 --input "$g/x.npy" --output "$tmp/o.npy"
# A bool mask [5, 5] of zeros (numpy's .npy layout written by hand): every row of
# the 5-token golden input is fully masked.
{
    printf '\x93NUMPY\x01\x00\x76\x00'
    printf "%-117s\n" "{'descr': '|b1', 'fortran_order': False, 'shape': (5, 5), }"
    head -c 25 /dev/zero
} > "$tmp/none.npy"
vg "attn forward: fully masked rows" 1 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 3 --input "$g/x.npy" --mask "$tmp/none.npy" --output "$tmp/o.npy"
vg "attn forward: mask that does not broadcast" 1 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 3 --input "$g/x.npy" --mask "$files/ref_bool.npy" --output "$tmp/o.npy"
vg "attn forward: unwritable output" 1 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 3 --input "$g/x.npy" --output "$tmp/no/such/dir/o.npy" --attention "$tmp/a.npy"
vg "attn forward: usage error" 2 "$ATTN" forward --weights "$g/weights.safetensors" --num-heads 0
ev="$src/tests/data/golden_options/everything"
vg "attn sdpa: every option of current models at once" 0 "$ATTN" sdpa --query "$ev/q.npy" --key "$ev/k.npy" --value "$ev/v.npy" --causal-bottom-right --window 4,0 --softcap 8 --alibi --bias "$ev/bias.npy" --sinks "$ev/sinks.npy" --scale 0.3 --output "$tmp/o.npy" --attention "$tmp/a.npy" --lse "$tmp/l.npy"
vg "attn sdpa: sinks of the wrong length" 1 "$ATTN" sdpa --query "$ev/q.npy" --key "$ev/k.npy" --value "$ev/v.npy" --sinks "$ev/bias.npy" --output "$tmp/o.npy"

echo "tests/valgrind.sh: $runs runs, $([ $fail = 0 ] && echo "all clean" || echo "FAILURES")"
exit $fail
