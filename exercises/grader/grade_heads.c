/*
 * grade_heads.c - exercise 5: the head split and merge, against the library's
 * views: attn_tensor_reshape [B, T, E] -> [B, T, H, D], attn_tensor_transpose of
 * axes 1 and 2, and attn_tensor_copy into a contiguous array (what PyTorch's
 * view / transpose / contiguous do).
 */
#include <stdio.h>

#include "grader.h"

static const grade_mistake HEADS_VIEW = {
    "heads-mixed", "the heads mix positions: the transpose is missing (a plain view)",
    "Reading x's memory straight as [B, H, T, D] (x.view(B, H, T, D)) gives \"head\" 0 the "
    "first T*D numbers of the sample, which are the features of the first positions, not "
    "feature slice 0 of every position. View as [B, T, H, D] first, then swap axes 1 and 2: "
    "heads[b][h][t][d] = x[b][t][h * D + d]."};
static const grade_mistake HEADS_INTERLEAVED = {
    "heads-interleaved", "each head takes every H-th feature instead of a block of D",
    "Head h owns the contiguous block of features h*D .. h*D + D - 1 (x.view(B, T, H, D)): "
    "the feature index is h * D + d, not d * H + h."};
static const grade_mistake MERGE_VIEW = {
    "merge-mixed", "the merge mixes positions: the transpose back is missing",
    "Copying heads [B, H, T, D] straight into [B, T, E] in memory order puts head 0's "
    "positions side by side. Position t's features are head 0's row t, then head 1's row t, "
    "and so on: x[b][t][h * D + d] = heads[b][h][t][d]."};
static const grade_mistake MERGE_INTERLEAVED = {
    "merge-interleaved", "the merge interleaves the heads' features (d * H + h)",
    "Head h's D features go back to the block h*D .. h*D + D - 1: index h * D + d."};

/* B, T, H, D: the chapter's [2, 5, 4 heads of 4]; heads that a plain view mixes
 * (T > 1 and H > 1); a single position and a single head, where some mistakes do
 * not show; D = 1. */
enum { CASES = 5 };
static const int SHAPES[CASES][4] = {{2, 5, 4, 4}, {1, 3, 2, 5}, {2, 1, 3, 2}, {1, 4, 1, 6},
                                     {3, 2, 5, 1}};

/* want = the library's split (split = 1) or merge of `in`. */
static int reference(attn_ctx *ctx, int split, int B, int T, int H, int D, const float *in,
                     float *want)
{
    attn_tensor a, view, swapped, dst;
    int64_t bthd[4] = {B, T, H, D}, bhtd[4] = {B, H, T, D};
    int st;
    if (split) {
        int64_t bte[3] = {B, T, (int64_t)H * D};
        st = attn_tensor_init(ctx, &a, ATTN_DTYPE_F32, (void *)in, 3, bte);
        if (!st) st = attn_tensor_reshape(ctx, &a, 4, bthd, &view);
        if (!st) st = attn_tensor_transpose(ctx, &view, 1, 2, &swapped);
        if (!st) st = attn_tensor_init(ctx, &dst, ATTN_DTYPE_F32, want, 4, bhtd);
    } else {
        st = attn_tensor_init(ctx, &a, ATTN_DTYPE_F32, (void *)in, 4, bhtd);
        if (!st) st = attn_tensor_transpose(ctx, &a, 1, 2, &swapped);
        if (!st) st = attn_tensor_init(ctx, &dst, ATTN_DTYPE_F32, want, 4, bthd);
    }
    if (!st) st = attn_tensor_copy(ctx, &swapped, &dst);
    return st;
}

static void grade_heads(grade_result *r, int split)
{
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 5);
    for (int c = 0; c < CASES; c++) {
        const int B = SHAPES[c][0], T = SHAPES[c][1], H = SHAPES[c][2], D = SHAPES[c][3];
        const int64_t n = (int64_t)B * T * H * D, E = (int64_t)H * D;
        float *in = grade_alloc_f(n), *got = grade_alloc_f(n), *want = grade_alloc_f(n);
        grade_randn(&rng, in, n, 1.0f);
        char where[160];
        snprintf(where, sizeof where, "case %d of %d (B = %d, T = %d, H = %d, D = %d)", c + 1,
                 CASES, B, T, H, D);
        grade_running(where);
        if (split)
            split_heads(B, T, H, D, in, got);
        else
            merge_heads(B, T, H, D, in, got);

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        int st = reference(&ctx, split, B, T, H, D, in, want);
        if (st) {
            grade_library_failed(r, "attn_tensor_reshape / transpose / copy", &ctx, st);
            grade_free_all();
            return;
        }

        /* The plain view copies memory as it is; the interleaved split reads
         * feature d * H + h for head h (and the merge writes it there). */
        float *view = grade_alloc_f(n), *inter = grade_alloc_f(n);
        for (int64_t i = 0; i < n; i++)
            view[i] = in[i];
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        int64_t head_at = ((b * H + h) * T + t) * D + d;
                        if (split)
                            inter[head_at] = in[(b * T + t) * E + d * H + h];
                        else
                            inter[(b * T + t) * E + d * H + h] = in[head_at];
                    }
        grade_variant vars[] = {
            {split ? &HEADS_VIEW : &MERGE_VIEW, {view}},
            {split ? &HEADS_INTERLEAVED : &MERGE_INTERLEAVED, {inter}},
        };
        grade_output out;
        if (split)
            out = (grade_output){"heads", 4, {B, H, T, D}, got, want};
        else
            out = (grade_output){"x", 3, {B, T, E}, got, want};
        int ok = grade_case(r, where, 1, &out, 2, vars, NULL);
        grade_free_all();
        if (!ok)
            return;
    }
}

void grade_split_heads(grade_result *r) { grade_heads(r, 1); }
void grade_merge_heads(grade_result *r) { grade_heads(r, 0); }
