/*
 * test_util.h - small helpers the tests share: a fixed-seed generator (so every run
 * is the same) and a double-precision attention oracle written independently of the
 * library, straight from the formula softmax(q k^T * scale + mask) v.
 */
#ifndef ATTN_TEST_UTIL_H
#define ATTN_TEST_UTIL_H

#include "attn.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* An allocator that counts its allocations (attn_ctx.allocator with user = a
 * tu_counting), for the tests that pin "allocates nothing per step". */
typedef struct tu_counting {
    long long allocs;
} tu_counting;

static inline void *tu_count_alloc(void *user, size_t size)
{
    ((tu_counting *)user)->allocs++;
    return malloc(size);
}

static inline void tu_count_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

/* xorshift64*: a fixed, documented sequence; uniform in [-1, 1). */
static inline float tu_uniform(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static inline void tu_fill(float *p, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++)
        p[i] = tu_uniform(&s);
}

/* Contiguous [B, H, T, D]-style tensor over caller memory. */
static inline attn_tensor tu_tensor4(float *data, int64_t a, int64_t b, int64_t c, int64_t d)
{
    attn_tensor t;
    const int64_t shape[4] = {a, b, c, d};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, 4, shape);
    return t;
}

/* Contiguous [a, b, c] tensor over caller memory. */
static inline attn_tensor tu_tensor3(float *data, int64_t a, int64_t b, int64_t c)
{
    attn_tensor t;
    const int64_t shape[3] = {a, b, c};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, 3, shape);
    return t;
}

/* Multi-head attention weights for embed_dim E over caller arrays:
 * wqkv [3E, E], bqkv [3E], wo [E, E], bo [E]. */
static inline attn_mha_weights tu_mha_weights(float *wqkv, float *bqkv, float *wo, float *bo,
                                              int64_t E)
{
    attn_mha_weights w;
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    attn_tensor_init(NULL, &w.w_qkv, ATTN_DTYPE_F32, wqkv, 2, s1);
    attn_tensor_init(NULL, &w.b_qkv, ATTN_DTYPE_F32, bqkv, 1, s2);
    attn_tensor_init(NULL, &w.w_o, ATTN_DTYPE_F32, wo, 2, s3);
    attn_tensor_init(NULL, &w.b_o, ATTN_DTYPE_F32, bo, 1, s4);
    return w;
}

/* The oracle: contiguous q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]; mask is a
 * contiguous [B,H,Tq,Tk] byte array already broadcast (or NULL); writes out and
 * weights in double. Returns the number of fully masked rows (their outputs are 0). */
static inline int tu_oracle(const float *q, const float *k, const float *v,
                            const unsigned char *mask, int64_t B, int64_t H, int64_t Tq,
                            int64_t Tk, int64_t D, int64_t Dv, double scale, double *out,
                            double *weights)
{
    int empty = 0;
    double *row = malloc((size_t)Tk * sizeof *row);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < Tq; i++) {
            double max = -INFINITY;
            for (int64_t j = 0; j < Tk; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++)
                    s += (double)q[(bh * Tq + i) * D + d] * (double)k[(bh * Tk + j) * D + d];
                s *= scale;
                int ok = !mask || mask[(bh * Tq + i) * Tk + j];
                row[j] = ok ? s : -INFINITY;
                if (row[j] > max)
                    max = row[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < Tk; j++) {
                row[j] = max == -INFINITY ? 0.0 : exp(row[j] - max);
                sum += row[j];
            }
            if (max == -INFINITY)
                empty++;
            for (int64_t j = 0; j < Tk; j++) {
                row[j] = sum > 0 ? row[j] / sum : 0.0;
                if (weights)
                    weights[(bh * Tq + i) * Tk + j] = row[j];
            }
            for (int64_t d = 0; d < Dv; d++) {
                double acc = 0;
                for (int64_t j = 0; j < Tk; j++)
                    if (row[j] != 0.0)
                        acc += row[j] * (double)v[(bh * Tk + j) * Dv + d];
                out[(bh * Tq + i) * Dv + d] = acc;
            }
        }
    free(row);
    return empty;
}

#endif
