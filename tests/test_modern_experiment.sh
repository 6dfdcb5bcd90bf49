#!/usr/bin/env bash
# Chapter 21's experiment (inspect_modern_attention) prints exactly its lines for the
# defaults and for other sizes (tests/expected/modern_*.txt, each equal to what
# tests/golden/gen_modern.py's torch block prints for those arguments), the same
# lines on the fused kernels, decodes through the KV cache to within float32
# rounding of the full pass (--trace's unrounded figures), draws the mask and every
# head's weights, and refuses bad flags with one line on stderr and exit status 2.
set -u
fail=0
exp="$ATTN_SOURCE_DIR/tests/expected"
MODERN=${MODERN:-$ATTN_BUILD_DIR/inspect_modern_attention}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

same() { # name, expected file, args...
    local name=$1 want=$2; shift 2
    if ! "$MODERN" "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL $name: exit status $? ($(cat "$tmp/err"))"; fail=1; return
    fi
    if ! cmp -s "$tmp/out" "$want"; then
        echo "FAIL $name: output differs from $want"; diff "$want" "$tmp/out"; fail=1; return
    fi
    [ -s "$tmp/err" ] && { echo "FAIL $name: wrote to stderr: $(cat "$tmp/err")"; fail=1; return; }
    echo "ok   $name"
}

refuse() { # name, expected stderr substring, args...
    local name=$1 want=$2; shift 2
    "$MODERN" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    local lines; lines=$(wc -l <"$tmp/err")
    if [ "$rc" -ne 2 ]; then echo "FAIL $name: exit status $rc, expected 2"; fail=1; return; fi
    if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr, expected 1"; cat "$tmp/err"; fail=1; return; fi
    if [ -s "$tmp/out" ]; then echo "FAIL $name: printed to stdout"; fail=1; return; fi
    if ! grep -qF -- "$want" "$tmp/err"; then echo "FAIL $name: stderr '$(cat "$tmp/err")' lacks '$want'"; fail=1; return; fi
    echo "ok   $name: $(cat "$tmp/err")"
}

same "defaults print the experiment's lines" "$exp/modern_default.txt"
same "explicit defaults print the same" "$exp/modern_default.txt" \
    --batch-size 2 --seq-len 6 --embed-dim 32 --num-heads 4 --num-kv-heads 2 --window 3 \
    --rope interleaved --rope-base 10000 --seed 42
same "the fused kernels print the same lines" "$exp/modern_default.txt" --impl fused
same "T=1 with one head: one position, weight 1, one decode step" "$exp/modern_b1_t1_e2_h1.txt" \
    --batch-size 1 --seq-len 1 --embed-dim 2 --num-heads 1 --num-kv-heads 1 --window 1
same "B=3 T=4 H=6 with one kv head (MQA), window 2, half pairs" "$exp/modern_b3_t4_e24_h6_kv1_w2.txt" \
    --batch-size=3 --seq-len=4 --embed-dim=24 --num-heads=6 --num-kv-heads=1 --window=2 --rope=half

# The rounded lines say 0.0; --trace prints the unrounded largest differences, and
# each must be float32 rounding (below 1e-5 on outputs of size about 1), on both
# kernel paths, on a longer sequence where the window slides.
for impl in ref fused; do
    if ! "$MODERN" --impl $impl --trace --seq-len 33 --embed-dim 64 --num-heads 8 --num-kv-heads 2 \
        --window 5 --rope half >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL --trace ($impl): $(cat "$tmp/err")"; fail=1; continue
    fi
    n=$(grep -c "largest |decode - full|" "$tmp/out")
    worst=$(sed -n 's/.*largest |decode - full| of output row [0-9]*: //p' "$tmp/out" \
        | awk 'BEGIN { m = 0 } { if ($1 + 0 > m || $1 != $1 + 0) m = $1 } END { print m }')
    rope=$(sed -n "s/.*largest relative change of a pair's length: \([^ ]*\).*/\1/p" "$tmp/out")
    # A NaN or inf would print as a word, which the pattern refuses.
    if [ "$n" -eq 33 ] && [[ $worst =~ ^[0-9.e+-]+$ && $rope =~ ^[0-9.e+-]+$ ]] && awk -v w="$worst" -v r="$rope" 'BEGIN { exit !(w + 0 < 1e-5 && r + 0 < 1e-6 && r != "") }'; then
        echo "ok   decoding through the cache equals the full pass ($impl: 33 steps, largest difference $worst < 1e-5; RoPE's largest pair-length change $rope < 1e-6)"
    else
        echo "FAIL decode vs full ($impl): $n steps, largest difference '$worst', RoPE change '$rope'"; fail=1
    fi
    want_kernel="^kernels: "; [ $impl = ref ] && want_kernel="^kernels: the reference"
    if grep -q "$want_kernel" "$tmp/out" \
        && grep -q "grouped-query attention keeps 0.25" "$tmp/out"; then
        echo "ok   --trace ($impl) names the kernels and the cache's saving with 2 of 8 kv heads"
    else echo "FAIL --trace ($impl): $(grep -E '^kernels|KV cache' "$tmp/out")"; fail=1; fi
done

# --heatmap: one mask panel and H weight panels of T x T cells each.
if "$MODERN" --seq-len 5 --heatmap "$tmp/m.svg" >"$tmp/out" 2>"$tmp/err" \
    && [ "$(wc -l <"$tmp/out")" -eq 13 ] && [ ! -s "$tmp/err" ]; then
    cells=$(grep -o 'class="cell' "$tmp/m.svg" | wc -l)
    masked=$(grep -o 'class="cell masked' "$tmp/m.svg" | wc -l)
    # w=3 on T=5 hides 25 - 12 = 13 cells of every panel: 5 panels.
    if [ "$cells" -eq 125 ] && [ "$masked" -eq 65 ]; then
        echo "ok   --heatmap draws the mask and 4 heads' weights (125 cells, 65 masked)"
    else echo "FAIL --heatmap: $cells cells (want 125), $masked masked (want 65)"; fail=1; fi
else echo "FAIL --heatmap: $(cat "$tmp/err")"; fail=1; fi
if NO_COLOR=1 "$MODERN" --show --seq-len 4 >"$tmp/out" 2>"$tmp/err" \
    && [ "$(grep -c ' weights (kv head ' "$tmp/out")" -eq 4 ] && grep -q "sliding window causal mask, w=3" "$tmp/out"; then
    echo "ok   --show prints the mask and each head's weights with its kv head"
else echo "FAIL --show: $(head -3 "$tmp/out") $(cat "$tmp/err")"; fail=1; fi

# Out of memory at every allocation in turn (ATTN_FAIL_ALLOC_AT, tools/common_cli.h):
# each run fails with exit status 1 and one line, until N is past the last one.
n=1; oom_bad=0
while [ $n -le 200 ]; do
    ATTN_FAIL_ALLOC_AT=$n "$MODERN" --values --heatmap "$tmp/oom.svg" >"$tmp/out" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && break
    if [ $rc -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
        echo "FAIL out of memory at allocation $n: exit status $rc, stderr: $(head -3 "$tmp/err")"; oom_bad=1; fail=1
    fi
    n=$((n + 1))
done
if [ $oom_bad -eq 0 ] && [ $n -gt 1 ] && [ $n -le 200 ]; then
    echo "ok   out of memory at each of the $((n - 1)) allocations fails with one line and exit status 1"
elif [ $oom_bad -eq 0 ]; then echo "FAIL the out-of-memory sweep stopped at $n"; fail=1; fi

refuse "Hkv must divide H" "--num-kv-heads 3 does not divide --num-heads 4" --num-kv-heads 3
refuse "RoPE needs an even head size" "RoPE needs an even head size, but --embed-dim 12 / --num-heads 4 = 3" --embed-dim 12
refuse "E not divisible by H is refused" "--embed-dim 32 is not divisible by --num-heads 5" --num-heads 5
refuse "a window of 0 is refused" "--window must be in 1..4096 (got 0)" --window 0
refuse "an unknown pairing is refused" "--rope takes interleaved|half, not 'sideways'" --rope sideways
refuse "a base of 0 is refused" "--rope-base must be greater than 0, got 0" --rope-base 0
refuse "a non-number base is refused" "--rope-base" --rope-base 1e5x
refuse "a head outside H is refused" "--head 4 is out of range for --num-heads 4" --head 4
refuse "a sample outside the batch is refused" "--sample 2 is out of range for --batch-size 2" --sample 2
refuse "a picture too large to read is refused" "--heatmap and --show draw at most --seq-len 256" --seq-len 300 --show
refuse "sizes too large for memory are refused" "too large for the experiment" --seq-len 4096 --batch-size 4096
refuse "an unknown flag is refused" "unknown option '--bogus'" --bogus
refuse "a missing value is refused" "--seed needs a value" --seed

if "$MODERN" --help >"$tmp/out" 2>"$tmp/err" && [ ! -s "$tmp/err" ] && grep -q -- "--num-kv-heads HKV" "$tmp/out" \
    && grep -q -- "--rope interleaved|half" "$tmp/out" && grep -q "^EXIT STATUS" "$tmp/out" && grep -q "^NUMBERS" "$tmp/out"; then
    echo "ok   --help describes the flags, the number rule and the exit statuses"
else echo "FAIL --help: $(head -3 "$tmp/out") $(cat "$tmp/err")"; fail=1; fi

[ $fail -eq 0 ] && echo "test_modern_experiment: all passed"
exit $fail
