/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * j <= i + 1: each position also sees the next token, the one it must predict.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void causal_mask(int T, uint8_t *mask /* [T, T] */)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i + 1;
}
