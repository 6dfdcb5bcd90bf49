/*
 * test_fused_avx2_tiles.c - the AVX2 fused kernel's micro-tiles
 * (src/kernels/sdpa_fused_avx2.c: 4 keys x 3 vectors of query rows for the scores,
 * 6 query rows x 2 vectors of value columns for the weighted sum) on the tails they
 * make: query tiles of 24 rows, so Tq, the query tile and the weighted sum's 6-row
 * blocks end anywhere, and D and Dv not multiples of 6, 8 or 24.
 *
 * What it protects, on the tile path (Tq above the row path's handful of rows):
 *
 *   - 2 threads give the 1-thread bits;
 *   - the output is near the reference, |avx2 - ref| <= 3e-5 + 1e-4 |ref|, which
 *     only catches a micro-tile wired wrong (test_fused_sweep.c holds the tight
 *     bound against a float64 oracle, on every path);
 *   - where the CPU has AVX-512, the AVX2 body gives the AVX-512 body's bits. Both
 *     sum each score over d in increasing order and each output over keys in
 *     increasing order, from key tiles at the same multiples of bc, with the same
 *     exp (simd.h: p * 2^n rounded once on both), so the vector width and the
 *     micro-tile shapes change only which products run side by side. The AVX2
 *     body's micro-tiles were 4 x 2 and 4 x 2 before, with these same sums, so this
 *     also says that the change of shape left the bits as they were.
 *
 * The problems: Tq in {9, 23, 25, 49, 73, 113, 200}, Tk in {1, 5, 17, 65, 130}, D
 * and Dv from 1 to 128, and in turn no option, causal (both alignments), a window,
 * softcap, a bias, ALiBi, a boolean mask, sinks and grouped-query heads, with the
 * log-sum-exp and the weights asked for on some. Each runs under the context's
 * default tiles (64 x 64 unless the machine's entry says otherwise); CTest runs the
 * test a second time under ATTN_TILE=32x24, whose br is not a multiple of 24.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 3e-5
#define RTOL 1e-4

enum { OPT_NONE, OPT_CAUSAL_TL, OPT_CAUSAL_BR, OPT_WINDOW, OPT_SOFTCAP, OPT_BIAS,
       OPT_ALIBI, OPT_MASK, OPT_SINKS, OPT_GQA, OPT_KINDS };
static const char *opt_names[OPT_KINDS] = {"none", "causal top-left", "causal bottom-right",
                                           "window", "softcap", "bias", "alibi", "mask",
                                           "sinks", "gqa"};

typedef struct problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int opt, lse, weights;
} problem;

static const int64_t tqs[] = {9, 23, 25, 49, 73, 113, 200};
static const int64_t tks[] = {1, 5, 17, 65, 130};
static const int64_t dims[] = {1, 5, 7, 13, 64, 71, 128};
#define N_TQ 7
#define N_TK 5
#define N_DIMS 7
#define N_PROBLEMS (N_TQ * N_TK * 2)

/* Problem n: every (Tq, Tk) pair twice, with the options, D, Dv and the outputs
 * asked for cycling with periods co-prime to the grid's. */
static problem problem_of(int n)
{
    problem p = {1, 2, 2, 1, 1, 1, 1, OPT_NONE, 0, 0};
    p.Tq = tqs[(n / 2) % N_TQ];
    p.Tk = tks[(n / 2 / N_TQ) % N_TK];
    p.opt = (n * 3 + n / 11) % OPT_KINDS;
    p.D = dims[(n * 3 + 1) % N_DIMS];
    p.Dv = n % 3 == 0 ? dims[(n + 4) % N_DIMS] : p.D;
    p.B = 1 + n % 2;
    if (p.opt == OPT_GQA) {
        p.H = 4;
        p.Hkv = 2;
    }
    p.lse = n % 2 == 0;
    p.weights = n % 4 == 1;
    return p;
}

/* Floats of one problem's results: out, then lse and weights when asked for. */
static int64_t result_floats(const problem *p)
{
    const int64_t rows = p->B * p->H * p->Tq;
    return rows * p->Dv + (p->lse ? rows : 0) + (p->weights ? rows * p->Tk : 0);
}

/* Runs problem p on ctx into res (result_floats of it, zeroed first); 0 on success. */
static int run(attn_ctx *ctx, const problem *p, int n, float *res)
{
    const int64_t nq = p->B * p->H * p->Tq * p->D, nk = p->B * p->Hkv * p->Tk * p->D;
    const int64_t nv = p->B * p->Hkv * p->Tk * p->Dv, nw = p->B * p->H * p->Tq * p->Tk;
    float *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k);
    float *v = malloc((size_t)nv * sizeof *v), *bias = malloc((size_t)nw * sizeof *bias);
    unsigned char *mask = malloc((size_t)nw);
    float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    memset(res, 0, (size_t)result_floats(p) * sizeof *res);
    tu_fill(q, nq, 5000 + (uint64_t)n);
    tu_fill(k, nk, 6000 + (uint64_t)n);
    tu_fill(v, nv, 7000 + (uint64_t)n);
    tu_fill(bias, nw, 8000 + (uint64_t)n);
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
    case OPT_WINDOW: pa.has_window = 1; pa.window_left = 11; pa.window_right = 3; break;
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

/* How many of the nf floats of a and b differ in their bits; prints the first few. */
static int64_t count_bit_differences(const float *a, const float *b, int64_t nf, const char *what_a,
                                     const char *what_b)
{
    int64_t diff = 0;
    for (int64_t i = 0; i < nf; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0 && diff++ < 3)
            fprintf(stderr, "   [%lld]: %s %.9g, %s %.9g\n", (long long)i, what_a, a[i], what_b,
                    b[i]);
    return diff;
}

int main(void)
{
    TEST("the AVX2 fused kernel's 4 x 3 and 6 x 2 micro-tiles: 1 and 2 threads give the "
         "same bits, near the reference, and the AVX-512 body's bits where it runs");
    if (!attn_arch_supported(ATTN_ARCH_AVX2)) {
        printf("test_fused_avx2_tiles: skipped (this CPU or build has no AVX2 path)\n");
        return check_summary("test_fused_avx2_tiles");
    }
    const int with_avx512 = attn_arch_supported(ATTN_ARCH_AVX512);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int compared = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        float *one = malloc((size_t)nf * sizeof *one), *two = malloc((size_t)nf * sizeof *two);
        float *wide = malloc((size_t)nf * sizeof *wide), *ref = malloc((size_t)nf * sizeof *ref);
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = ATTN_ARCH_AVX2;
        ctx.threads = 1;
        CHECK_INT(run(&ctx, &p, n, one), ATTN_OK);
        ctx.threads = 2;
        CHECK_INT(run(&ctx, &p, n, two), ATTN_OK);
        ctx.impl = ATTN_IMPL_REF;
        ctx.threads = 1;
        CHECK_INT(run(&ctx, &p, n, ref), ATTN_OK);
        const int64_t bad_threads = count_bit_differences(one, two, nf, "1 thread", "2 threads");
        int64_t bad_ref = 0, bad_wide = 0;
        for (int64_t i = 0; i < nf; i++) {
            const double err = fabs((double)one[i] - (double)ref[i]);
            const int near = err <= ATOL + RTOL * fabs((double)ref[i]) ||
                             (isinf(one[i]) && one[i] == ref[i]);
            if (!near && bad_ref++ < 3)
                fprintf(stderr, "   [%lld]: avx2 %.9g, reference %.9g\n", (long long)i, one[i],
                        ref[i]);
        }
        if (with_avx512) {
            ctx.impl = ATTN_IMPL_FUSED;
            ctx.arch = ATTN_ARCH_AVX512;
            CHECK_INT(run(&ctx, &p, n, wide), ATTN_OK);
            bad_wide = count_bit_differences(one, wide, nf, "avx2", "avx512");
            compared++;
        }
        if (bad_threads || bad_ref || bad_wide)
            describe(n, &p);
        CHECK_INT(bad_threads, 0);
        CHECK_INT(bad_ref, 0);
        CHECK_INT(bad_wide, 0);
        free(one);
        free(two);
        free(wide);
        free(ref);
    }
    attn_ctx_release(&ctx);
    printf("test_fused_avx2_tiles: %d problems on AVX2, %d of them also against AVX-512%s\n",
           N_PROBLEMS, compared, with_avx512 ? "" : " (this CPU has no AVX-512 path)");
    return check_summary("test_fused_avx2_tiles");
}
