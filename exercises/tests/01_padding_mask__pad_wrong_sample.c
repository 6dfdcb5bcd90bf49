/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * token_ids[j] for key j of every sample: the sample's offset b * T is missing,
 * so every sample gets sample 0's pads.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void padding_mask(int B, int T, const int64_t *token_ids /* [B, T] */, int64_t pad_id,
                  uint8_t *mask /* [B, T, T] */)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++)
                mask[(b * T + i) * T + j] = token_ids[j] != pad_id;
}
