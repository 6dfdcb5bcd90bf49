/*
 * Exercise 2: the causal mask.
 *
 * A decoder-only language model predicts the next token, so position t may read
 * positions 0..t and nothing to its right. The chapter draws the mask as a lower
 * triangle (1 = may attend):
 *
 *   1 0 0 0
 *   1 1 0 0
 *   1 1 1 0
 *   1 1 1 1
 *
 * Row i is the query, column j the key: mask[i][j] = 1 when j <= i, else 0.
 *
 * Index: mask[i * T + j]. Write 1 and 0 only.
 * Check it with `make exercises` (or `make exercises ONLY=2`).
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
