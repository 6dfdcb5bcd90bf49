#!/bin/bash
# test_train.sh - the training demonstration (tools/train_attention.c): with its
# defaults (seed 1, 600 SGD steps, lr 0.1) the chapter's module, trained with
# nothing but attn_mha_forward and attn_mha_backward, learns to reverse a sequence:
# the loss starts above 1.5 (chance is ln 7 = 1.95) and ends below 0.05 on a batch
# it was not trained on, with every token right (measured: 2.05 and 0.0009, so the
# bound leaves room for another instruction set's rounding); it prints the picture
# before and after; a bad --lr is a usage error.
set -u
. "$(dirname "$0")/cli_lib.sh"
TRAIN="$ATTN_BUILD_DIR/train_attention"

WORK="$ATTN_TEST_TMP_DIR/train"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"

say "train_attention learns to reverse: loss from above 1.5 to below 0.05, accuracy 1 on a new batch"
run 0 "$TRAIN"
first=$(awk '/^step +0 /{print $4}' "$OUT_FILE")
final=$(awk '/^final loss/{print $3}' "$OUT_FILE")
acc=$(awk '/^final loss/{print $5}' "$OUT_FILE")
awk -v a="$first" 'BEGIN { exit !(a > 1.5) }' && ok || bad "the first loss is '$first', expected above 1.5"
awk -v a="$final" 'BEGIN { exit !(a < 0.05) }' && ok || bad "the final loss is '$final', expected below 0.05"
[ "$acc" = 1.000 ] && ok || bad "the final accuracy is '$acc', expected 1.000"
[ "$(grep -c '^step ' "$OUT_FILE")" -eq 11 ] && ok || bad "expected 11 step lines"
out_has "before training: where each query looks"
out_has "after training: where each query looks"

say "head 0's picture: no weight of 0.75 (a full block) before training; after, at least 4 of 6 queries t on key 5 - t and none elsewhere"
# cells PICTURE: for each row t of the picture after PICTURE's title, the columns
# (0-based) holding a full block, as "t:j" words.
cells() {
    awk -v title="$1" 'index($0, title) { f = 1; next } f && /^key,/ { exit }
        f && /^pos / { n = 0; for (i = 5; i <= NF; i++) { if ($i ~ /█/) print $2 ":" (i - 5) } }' "$OUT_FILE"
}
before=$(cells "before training:" | wc -l)
[ "$before" -eq 0 ] && ok || bad "before training, $before cells of head 0 hold >= 0.75, expected none: $(cells "before training:" | tr '\n' ' ')"
on=0; off=0
for c in $(cells "after training:"); do
    if [ $((${c%%:*} + ${c##*:})) -eq 5 ]; then on=$((on + 1)); else off=$((off + 1)); fi
done
[ "$on" -ge 4 ] && [ "$off" -eq 0 ] && ok \
    || bad "after training, head 0 has $on full blocks on the anti-diagonal (expected >= 4) and $off off it (expected 0): $(cells "after training:" | tr '\n' ' ')"

say "a learning rate so large that the loss stops being finite stops training: one line naming the step and --lr, exit 1"
run 1 "$TRAIN" --lr 1000
err_has "training diverged at step"
err_has "try a smaller --lr than 1000"

say "a learning rate that is not > 0 is a usage error (exit 2)"
run 2 "$TRAIN" --lr 0
err_has "--lr must be a number > 0"
run 2 "$TRAIN" --seq-len 1

cli_summary test_train
