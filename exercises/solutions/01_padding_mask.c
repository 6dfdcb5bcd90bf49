/*
 * Model solution to exercise 1, the padding mask (see exercises/01_padding_mask.c
 * for the task). Key j is visible to every query of its sample unless it is a pad.
 */
#include "exercises.h"

void padding_mask(int B, int T, const int64_t *token_ids /* [B, T] */, int64_t pad_id,
                  uint8_t *mask /* [B, T, T] */)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++)
                mask[(b * T + i) * T + j] = token_ids[b * T + j] != pad_id;
}
