/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * every key visible: the pad is never compared with pad_id.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void padding_mask(int B, int T, const int64_t *token_ids /* [B, T] */, int64_t pad_id,
                  uint8_t *mask /* [B, T, T] */)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++)
                mask[(b * T + i) * T + j] = 1;
}
