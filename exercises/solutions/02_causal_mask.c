/*
 * Model solution to exercise 2, the causal mask: the lower triangle, diagonal
 * included, because a position may read itself.
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i;
}
