/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the inner loop has no j++, so it never ends (it keeps writing the same entry).
 * The grader must stop it and name it; the rest of the file is the model solution.
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T;)
            mask[i * T + j] = j <= i;
}
