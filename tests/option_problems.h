/*
 * option_problems.h - one attention problem per section 6 option, run through
 * attn_sdpa, for the tests that compare two bodies of the fused kernel bit for bit
 * (test_fused_microtile.c: AVX-512 8 x 2 against 4 x 4; test_fused_avx2_tiles.c:
 * AVX2 against AVX-512). Each test picks its own grid of shapes (problem_of); the
 * inputs, the options and the comparisons are these.
 */
#ifndef ATTN_TEST_OPTION_PROBLEMS_H
#define ATTN_TEST_OPTION_PROBLEMS_H

#include "attn.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bound against the reference, |fused - ref| <= OP_ATOL + OP_RTOL |ref|, is
 * loose on purpose: it only catches a body wired wrong. The tight bound is
 * test_fused_sweep.c's against a float64 oracle. */
#define OP_ATOL 3e-5
#define OP_RTOL 1e-4

enum { OPT_NONE, OPT_CAUSAL_TL, OPT_CAUSAL_BR, OPT_WINDOW, OPT_SOFTCAP, OPT_BIAS,
       OPT_ALIBI, OPT_MASK, OPT_SINKS, OPT_GQA, OPT_KINDS };
static const char *opt_names[OPT_KINDS] = {"none", "causal top-left", "causal bottom-right",
                                           "window", "softcap", "bias", "alibi", "mask",
                                           "sinks", "gqa"};

typedef struct problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int opt, lse, weights;
} problem;

/* Floats of one problem's results: out, then lse and weights when asked for. */
static int64_t result_floats(const problem *p)
{
    const int64_t rows = p->B * p->H * p->Tq;
    return rows * p->Dv + (p->lse ? rows : 0) + (p->weights ? rows * p->Tk : 0);
}

/* Runs problem p (number n, which seeds its inputs from seed) on ctx into res
 * (result_floats of it, zeroed first); 0 on success, the message on stderr if not. */
static int run_problem(attn_ctx *ctx, const problem *p, int n, uint64_t seed, float *res)
{
    const int64_t nq = p->B * p->H * p->Tq * p->D, nk = p->B * p->Hkv * p->Tk * p->D;
    const int64_t nv = p->B * p->Hkv * p->Tk * p->Dv, nw = p->B * p->H * p->Tq * p->Tk;
    float *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k);
    float *v = malloc((size_t)nv * sizeof *v), *bias = malloc((size_t)nw * sizeof *bias);
    unsigned char *mask = malloc((size_t)nw);
    float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    memset(res, 0, (size_t)result_floats(p) * sizeof *res);
    tu_fill(q, nq, seed + 1000 + (uint64_t)n);
    tu_fill(k, nk, seed + 2000 + (uint64_t)n);
    tu_fill(v, nv, seed + 3000 + (uint64_t)n);
    tu_fill(bias, nw, seed + 4000 + (uint64_t)n);
    for (int64_t i = 0; i < nw; i++) /* about one entry in five masked, never a whole row */
        mask[i] = (i % p->Tk == 0) || ((i * 2654435761u) >> 7) % 5 != 0;

    attn_tensor tq = tu_tensor4(q, p->B, p->H, p->Tq, p->D);
    attn_tensor tk = tu_tensor4(k, p->B, p->Hkv, p->Tk, p->D);
    attn_tensor tv = tu_tensor4(v, p->B, p->Hkv, p->Tk, p->Dv);
    const int64_t rows = p->B * p->H * p->Tq;
    attn_tensor to = tu_tensor4(res, p->B, p->H, p->Tq, p->Dv);
    float *lse = res + rows * p->Dv, *w = lse + (p->lse ? rows : 0);
    attn_tensor tl = tu_tensor3(lse, p->B, p->H, p->Tq);
    attn_tensor tw = tu_tensor4(w, p->B, p->H, p->Tq, p->Tk);
    attn_tensor tb = tu_tensor4(bias, p->B, p->H, p->Tq, p->Tk);
    attn_tensor tm = tu_tensor4((float *)mask, p->B, p->H, p->Tq, p->Tk);
    tm.dtype = ATTN_DTYPE_BOOL;
    attn_tensor tsk;
    const int64_t hshape[1] = {p->H};
    attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, sinks, 1, hshape);

    attn_sdpa_params pa;
    attn_sdpa_params_init(&pa);
    pa.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    switch (p->opt) {
    case OPT_CAUSAL_TL: pa.causal = ATTN_CAUSAL_TOP_LEFT; break;
    case OPT_CAUSAL_BR: pa.causal = ATTN_CAUSAL_BOTTOM_RIGHT; break;
    case OPT_WINDOW: pa.has_window = 1; pa.window_left = 9; pa.window_right = 4; break;
    case OPT_SOFTCAP: pa.softcap = 0.7f; pa.has_scale = 1; pa.scale = 2.0f; break;
    case OPT_BIAS: pa.bias = &tb; break;
    case OPT_ALIBI: pa.alibi = 1; pa.causal = ATTN_CAUSAL_BOTTOM_RIGHT; break;
    case OPT_MASK: pa.mask = &tm; break;
    case OPT_SINKS: pa.sinks = &tsk; pa.causal = ATTN_CAUSAL_TOP_LEFT; break;
    default: break;
    }
    if (p->lse)
        pa.lse = &tl;
    const int rc = attn_sdpa(ctx, &tq, &tk, &tv, &pa, &to, p->weights ? &tw : NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "   problem %d: %s\n", n, ctx->message);
    free(q);
    free(k);
    free(v);
    free(bias);
    free(mask);
    return rc;
}

static void describe(int n, const problem *p)
{
    fprintf(stderr, "   problem %d: B %lld H %lld/%lld Tq %lld Tk %lld D %lld Dv %lld, %s%s%s\n", n,
            (long long)p->B, (long long)p->H, (long long)p->Hkv, (long long)p->Tq,
            (long long)p->Tk, (long long)p->D, (long long)p->Dv, opt_names[p->opt],
            p->lse ? ", lse" : "", p->weights ? ", weights" : "");
}

/* How many of the nf floats of a and b differ in their bits; prints the first few,
 * each after tag ("" for none). */
static int64_t count_bit_differences(const float *a, const float *b, int64_t nf, const char *tag,
                                     const char *what_a, const char *what_b)
{
    int64_t diff = 0;
    for (int64_t i = 0; i < nf; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0 && diff++ < 3)
            fprintf(stderr, "   %s%s[%lld]: %s %.9g, %s %.9g\n", tag, *tag ? ", " : "",
                    (long long)i, what_a, a[i], what_b, b[i]);
    return diff;
}

/* How many of the nf floats of got are not within the loose bound of ref (an
 * infinity must be ref's own); prints the first few, each after tag. */
static int64_t count_far_from_reference(const float *got, const float *ref, int64_t nf,
                                        const char *tag, const char *what)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < nf; i++) {
        const double err = fabs((double)got[i] - (double)ref[i]);
        const int near = err <= OP_ATOL + OP_RTOL * fabs((double)ref[i]) ||
                         (isinf(got[i]) && got[i] == ref[i]);
        if (!near && bad++ < 3)
            fprintf(stderr, "   %s%s[%lld]: %s %.9g, reference %.9g\n", tag, *tag ? ", " : "",
                    (long long)i, what, got[i], ref[i]);
    }
    return bad;
}

#endif
