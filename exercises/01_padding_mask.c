/*
 * Exercise 1: the padding mask.
 *
 * The chapter pads short samples to one length with a pad token, and the pad
 * positions must not be read by anyone: the padding mask hides padded KEYS. In
 * PyTorch the chapter builds it as (token_ids != pad_id)[:, None, None, :], shape
 * [B, 1, 1, T], and lets it broadcast over heads and queries. Here you write the
 * broadcast form over queries, [B, T, T], so that every entry is spelled out:
 *
 *   mask[b][i][j] = 1  when query i of sample b may attend to key j
 *                      (token j of sample b is not pad_id)
 *                   0  otherwise.
 *
 * Example: token_ids = [[1, 2, 3, 4, 0]], pad_id = 0 gives five rows 1 1 1 1 0.
 * A pad QUERY still attends (its output is ignored later, by the loss).
 *
 * Index: token_ids[b * T + j], mask[(b * T + i) * T + j]. Write 1 and 0 only.
 * Check it with `make exercises` (or `make exercises ONLY=1`).
 */
#include "exercises.h"

void padding_mask(int B, int T, const int64_t *token_ids /* [B, T] */, int64_t pad_id,
                  uint8_t *mask /* [B, T, T] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
