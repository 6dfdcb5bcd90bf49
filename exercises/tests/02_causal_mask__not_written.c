/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * only the visible entries are written (as if the mask started as zeros).
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            if (j <= i)
                mask[i * T + j] = 1;
}
