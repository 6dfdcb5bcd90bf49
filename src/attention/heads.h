/*
 * heads.h - the head split and merge of multi-head attention as views: the
 * forward (mha.c) and the backward (mha_backward.c) lay q, k, v and the context out
 * as column blocks of [B, T, row] buffers and see them as [B, H, T, D] without a
 * copy, the way PyTorch's view + transpose(1, 2) does. Internal.
 */
#ifndef ATTN_HEADS_H
#define ATTN_HEADS_H

#include "attn_internal.h"

#include <string.h>

/* A [B, H, T, D] view of head-split data that lives in a [B, T, row] buffer at
 * column `col`: element (b, h, t, d) is at b*T*row + t*row + col + h*D + d. */
static inline void attn__head_view(attn_tensor *t, float *base, int64_t B, int64_t T,
                                   int64_t H, int64_t D, int64_t row, int64_t col)
{
    memset(t, 0, sizeof *t);
    t->data = base + col;
    t->dtype = ATTN_DTYPE_F32;
    t->ndim = 4;
    t->shape[0] = B;
    t->shape[1] = H;
    t->shape[2] = T;
    t->shape[3] = D;
    t->stride[0] = T * row;
    t->stride[1] = D;
    t->stride[2] = row;
    t->stride[3] = 1;
}

#endif /* ATTN_HEADS_H */
