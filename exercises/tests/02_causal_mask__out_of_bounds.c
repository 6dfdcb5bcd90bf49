/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * rows T + 1 entries apart, as if the mask were [T, T + 1] (a wrong shape).
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * (T + 1) + j] = j <= i;
}
