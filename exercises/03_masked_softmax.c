/*
 * Exercise 3: the masked softmax.
 *
 * The chapter's weights = softmax(scores) run over the KEY axis: each query's row
 * of weights is a probability distribution over the keys it may see. A masked key
 * (mask[i][j] == 0) gets its score replaced by -INFINITY BEFORE the softmax, so its
 * weight is exactly 0 and the other weights of the row still sum to 1 (PyTorch:
 * scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)).
 *
 *   for each row i:  m = max over unmasked j of scores[i][j]
 *                    e_j = exp(scores[i][j] - m)   (0 for a masked j)
 *                    weights[i][j] = e_j / sum_j e_j
 *
 * Subtracting the row's max changes nothing mathematically but keeps exp() from
 * overflowing when scores are large. mask may be NULL: then nothing is masked.
 * Every row has at least one unmasked key. Use <math.h>: expf, INFINITY.
 *
 * Index: scores[i * Tk + j], mask[i * Tk + j], weights[i * Tk + j].
 * Check it with `make exercises` (or `make exercises ONLY=3`).
 */
#include <math.h>

#include "exercises.h"

void masked_softmax(int Tq, int Tk, const float *scores /* [Tq, Tk] */,
                    const uint8_t *mask /* [Tq, Tk] or NULL */,
                    float *weights /* [Tq, Tk] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
