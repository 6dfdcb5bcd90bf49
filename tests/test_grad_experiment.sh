#!/bin/bash
# test_grad_experiment.sh - inspect_self_attention --grad, the chapter's experiment
# one step further: the gradient of L = mean(output) for every step's tensor equals
# PyTorch 2.15 autograd's (tests/data/golden_mha_grads/experiment_*.txt, made by
# tests/golden/gen_mha_grads.py from the same seeds) - the shapes exactly, the norms
# and first values within 1e-8 + 1e-4 |torch| (float32 through a few short sums,
# as tests/test_mha_backward.c argues, against a float64 autograd); the seven lines
# before it stay byte-identical to the run without --grad, under both kernels.
set -u
. "$(dirname "$0")/cli_lib.sh"
: "${INSPECT:?INSPECT must name inspect_self_attention}"

WORK="$ATTN_TEST_TMP_DIR/grad_experiment"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
GOLD="$ATTN_TEST_DATA_DIR/golden_mha_grads"

# compare GOLDEN: the last run's "grad" lines against GOLDEN's, line by line.
compare() {
    local res
    res=$(awk -v gold="$1" '
        function abs(x) { return x < 0 ? -x : x }
        function close_to(a, b) { return abs(a - b) <= 1e-8 + 1e-4 * abs(b) }
        BEGIN { n = 0; while ((getline l < gold) > 0) { if (l ~ /^loss /) { split(l, p, " "); loss = p[2]; continue } g[++n] = l } }
        /^== gradients of loss/ { got_loss = $0; sub(/.*= /, "", got_loss); sub(/,.*/, "", got_loss); if (!close_to(got_loss + 0, loss + 0)) { bad++; print "loss " got_loss " vs " loss } }
        /^grad / {
            m++; split(g[m], w, " ")
            name = $2; shape = $3; gsub(/[(),]/, "", shape); gsub(/ /, "", shape)
            # The shape field is "(2, 5, 16)" split by spaces over several fields.
            line = $0; sub(/^grad +[^ ]+ +/, "", line); sh = line; sub(/\).*/, "", sh); gsub(/[(, ]/, "x", sh); gsub(/x+/, "x", sh); sub(/^x/, "", sh); sub(/x$/, "", sh)
            if (name != w[1] || sh != w[2]) { bad++; print "line " m ": " name " " sh " vs " w[1] " " w[2] }
            norm = line; sub(/.*norm=/, "", norm); sub(/ .*/, "", norm)
            if (!close_to(norm + 0, w[3] + 0)) { bad++; print name " norm " norm " vs " w[3] }
            f = line; sub(/.*first=\[/, "", f); sub(/\].*/, "", f); k = split(f, v, ", ")
            for (i = 1; i <= k; i++) if (!close_to(v[i] + 0, w[3 + i] + 0)) { bad++; print name "[" i - 1 "] " v[i] " vs " w[3 + i] }
        }
        END { if (m != n) { bad++; print m " grad lines, expected " n } print "bad " bad + 0 }' "$OUT_FILE")
    if [ "${res##*bad }" = 0 ]; then ok; else bad "$1: $res"; fi
}

for impl in ref fused; do
    say "--grad (--impl $impl) prints PyTorch autograd's gradients of mean(output) for the defaults and for seed 7, B=3 T=7 E=12 H=3"
    run 0 "$INSPECT" --impl $impl --grad
    compare "$GOLD/experiment_s42_2_5_16_4.txt"
    head -n 7 "$OUT_FILE" >"$WORK/seven_grad"
    run 0 "$INSPECT" --impl $impl
    cmp -s "$OUT_FILE" "$WORK/seven_grad" && ok || bad "the seven lines differ with --grad"
    [ "$(wc -l <"$OUT_FILE")" -eq 7 ] && ok || bad "the default run is not seven lines"
    run 0 "$INSPECT" --impl $impl --grad --seed 7 --batch-size 3 --seq-len 7 --embed-dim 12 --num-heads 3
    compare "$GOLD/experiment_s7_3_7_12_3.txt"
done

say "with --mistake the gradients are the correct module's (as --help says): every --mistake prints the block of --grad alone, byte for byte"
run 0 "$INSPECT" --grad
sed -n '/^== gradients/,$p' "$OUT_FILE" >"$WORK/grad_block"
[ "$(wc -l <"$WORK/grad_block")" -eq 12 ] && ok || bad "the --grad block is not 12 lines: $(cat "$WORK/grad_block")"
for m in no-scale inverted-mask mask-queries softmax-wrong-axis mask-zero; do
    run 0 "$INSPECT" --grad --mistake $m
    if sed -n '/^== gradients/,$p' "$OUT_FILE" | cmp -s - "$WORK/grad_block"; then ok; else
        bad "--grad --mistake $m: the gradients differ from the correct module's"
    fi
done

say "the help documents --grad"
run 0 "$INSPECT" --help
out_has "--grad"

cli_summary test_grad_experiment
