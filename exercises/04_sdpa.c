/*
 * Exercise 4: scaled dot-product attention, one head.
 *
 * The chapter's three lines:
 *
 *   scores  = q @ k^T / sqrt(D)        [Tq, Tk]
 *   weights = softmax(scores)          [Tq, Tk]  over keys; masked scores -> -inf
 *   out     = weights @ v              [Tq, Dv]
 *
 * D is the head dim of q and k (q [Tq, D], k [Tk, D]); v has its own dim Dv. The
 * scale is 1/sqrt(D), not 1/D: the dot product of two D-long vectors of unit
 * variance has variance D, and dividing by sqrt(D) brings it back to about 1.
 * mask may be NULL; every row has at least one unmasked key. You may call your
 * masked_softmax from exercise 3 (declared in exercises.h) for the middle line.
 *
 * Index: q[i * D + d], k[j * D + d], v[j * Dv + e], mask[i * Tk + j],
 *        weights[i * Tk + j], out[i * Dv + e].
 * Check it with `make exercises` (or `make exercises ONLY=4`).
 */
#include <math.h>

#include "exercises.h"

void sdpa(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
          const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
          const uint8_t *mask /* [Tq, Tk] or NULL */, float *weights /* [Tq, Tk] */,
          float *out /* [Tq, Dv] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
