/*
 * Exercise 6 (stretch): the online softmax.
 *
 * Exercise 4 keeps a whole [Tq, Tk] block of scores. A fused kernel (FlashAttention,
 * arXiv 2205.14135) never does: it reads the keys once, in order, and keeps only a
 * running state per query (online softmax, Milakov and Gimelshein, arXiv
 * 1805.02867):
 *
 *   m    the largest score seen so far        (start at -INFINITY)
 *   l    sum of exp(score - m) over the keys  (start at 0)
 *   acc  sum of exp(score - m) * v            (start at 0, Dv floats)
 *
 * When a new score s arrives and raises the max from m to m' = max(m, s), every
 * term already in l and acc was computed against the old m and is too large by
 * exp(m' - m): multiply l and acc by exp(m - m') before adding exp(s - m') and
 * exp(s - m') * v. At the end, out = acc / l.
 *
 * Two edges: a masked key arrives with s = -INFINITY and must add nothing (take
 * care: -INFINITY - (-INFINITY) is NaN, so a first masked key needs thought); a row
 * whose keys were all masked ends with l == 0 and must give zeros, not 0/0.
 *
 * Check it with `make exercises` (or `make exercises ONLY=6`).
 */
#include <math.h>

#include "exercises.h"

void online_softmax_init(online_softmax *st, int Dv)
{
    /* TODO: write this function (and delete this line when you start). */
}

void online_softmax_add(online_softmax *st, float score, const float *v /* [Dv] */)
{
    /* TODO: write this function (and delete this line when you start). */
}

void online_softmax_result(const online_softmax *st, float *out /* [Dv] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
