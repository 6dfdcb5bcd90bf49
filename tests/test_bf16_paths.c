/*
 * test_bf16_paths.c - the bfloat16 tile path (src/kernels/sdpa_bf16.h): q, k and v in
 * bfloat16, products on AMX-BF16 tiles ("amx") or by vdpbf16ps ("avx512bf16"), the
 * online softmax in float32 between them.
 *
 * On awkward shapes (query rows 9 to 200, keys 1 to 300, head dims 1 to 128, Dv
 * apart from D, grouped-query heads) with every option of SPEC section 6, each
 * bfloat16 path this machine runs is compared with the reference on the same
 * bfloat16 arrays:
 *
 *   - every output within 2^-8 of max |v| plus 2^-8 of the output itself: the
 *     weights are rounded to bfloat16 (2^-9 relative) before they multiply v, and
 *     both outputs are rounded to bfloat16 once (2^-9 relative each);
 *   - the log-sum-exp within 1e-4 (the scores are exact products summed in
 *     float32, as in the reference);
 *   - the same bits with 1 and 2 threads;
 *   - an empty row is the same error as the reference's;
 *   - an inf in v at a masked key never reaches a row, and a NaN at a visible key
 *     reaches exactly the rows that see it.
 *
 * This program sets ATTN_BF16_EMULATE=1 before its first call, so that on an
 * AVX-512 CPU without AVX512-BF16 the avx512bf16 path runs with vdpbf16ps emulated
 * (src/kernels/sdpa_bf16_avx512.c): the packing, masking and softmax are then
 * checked on any AVX-512 machine, and the instructions themselves where the CPU
 * has them. A path this machine cannot run is announced as skipped.
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_NONE, OPT_CAUSAL, OPT_BOTTOM_RIGHT, OPT_WINDOW, OPT_SOFTCAP, OPT_BIAS, OPT_ALIBI,
       OPT_SINKS, OPT_PADDING, OPT_MASK, OPT_COUNT };
static const char *const opt_names[] = {"none",  "causal", "bottom-right causal", "window",
                                        "softcap", "bias", "ALiBi", "sinks", "padding mask",
                                        "random mask"};

typedef struct shape {
    int B, H, Hkv, Tq, Tk, D, Dv;
} shape;

static const shape shapes[] = {
    {1, 2, 1, 9, 1, 16, 16},   {1, 1, 1, 17, 3, 3, 5},     {2, 4, 2, 33, 17, 64, 64},
    {1, 2, 2, 113, 113, 64, 32}, {1, 3, 1, 40, 300, 80, 80}, {1, 1, 1, 200, 150, 128, 128},
    {2, 2, 1, 64, 64, 1, 1},   {1, 2, 1, 100, 257, 96, 48},
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void fill_bf16(attn_tensor *t, float scale)
{
    uint16_t *d = t->data;
    for (int64_t i = 0; i < attn_tensor_numel(t); i++)
        d[i] = attn__f32_to_bf16(uniform() * scale);
}

typedef struct problem {
    attn_ctx ctx;
    attn_tensor q, k, v, out, bias, sinks, mask, lse;
    attn_sdpa_params p;
    int64_t n_out;
} problem;

static void problem_make(problem *pr, const shape *sh, int opt)
{
    memset(pr, 0, sizeof *pr);
    attn_ctx_init(&pr->ctx);
    attn_ctx *ctx = &pr->ctx;
    const int64_t qs[4] = {sh->B, sh->H, sh->Tq, sh->D}, ks[4] = {sh->B, sh->Hkv, sh->Tk, sh->D};
    const int64_t vs[4] = {sh->B, sh->Hkv, sh->Tk, sh->Dv}, os[4] = {sh->B, sh->H, sh->Tq, sh->Dv};
    attn_tensor_alloc(ctx, &pr->q, ATTN_DTYPE_BF16, 4, qs);
    attn_tensor_alloc(ctx, &pr->k, ATTN_DTYPE_BF16, 4, ks);
    attn_tensor_alloc(ctx, &pr->v, ATTN_DTYPE_BF16, 4, vs);
    attn_tensor_alloc(ctx, &pr->out, ATTN_DTYPE_BF16, 4, os);
    const int64_t ls[3] = {sh->B, sh->H, sh->Tq};
    attn_tensor_alloc(ctx, &pr->lse, ATTN_DTYPE_F32, 3, ls);
    fill_bf16(&pr->q, 2.0f);
    fill_bf16(&pr->k, 2.0f);
    fill_bf16(&pr->v, 1.0f);
    pr->n_out = attn_tensor_numel(&pr->out);
    attn_sdpa_params_init(&pr->p);
    attn_sdpa_params *p = &pr->p;
    p->lse = &pr->lse;
    const int bottom = sh->Tk >= sh->Tq;
    switch (opt) {
    case OPT_CAUSAL:
        p->causal = ATTN_CAUSAL_TOP_LEFT;
        break;
    case OPT_BOTTOM_RIGHT:
        p->causal = bottom ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_TOP_LEFT;
        break;
    case OPT_WINDOW:
        p->has_window = 1;
        p->window_left = 7;
        p->window_right = 2;
        break;
    case OPT_SOFTCAP:
        p->softcap = 1.5f;
        break;
    case OPT_BIAS: {
        const int64_t bs[4] = {1, sh->H, sh->Tq, sh->Tk};
        attn_tensor_alloc(ctx, &pr->bias, ATTN_DTYPE_F32, 4, bs);
        float *b = pr->bias.data;
        for (int64_t i = 0; i < attn_tensor_numel(&pr->bias); i++)
            b[i] = i % 7 == 3 && i % sh->Tk != 0 ? -INFINITY : uniform();
        p->bias = &pr->bias;
        break;
    }
    case OPT_ALIBI:
        p->alibi = 1;
        p->causal = ATTN_CAUSAL_TOP_LEFT;
        break;
    case OPT_SINKS: {
        const int64_t ss[1] = {sh->H};
        attn_tensor_alloc(ctx, &pr->sinks, ATTN_DTYPE_F32, 1, ss);
        for (int h = 0; h < sh->H; h++)
            ((float *)pr->sinks.data)[h] = uniform() * 3.0f;
        p->sinks = &pr->sinks;
        break;
    }
    case OPT_PADDING: {
        const int64_t ms[4] = {sh->B, 1, 1, sh->Tk};
        attn_tensor_alloc(ctx, &pr->mask, ATTN_DTYPE_BOOL, 4, ms);
        uint8_t *m = pr->mask.data;
        for (int b = 0; b < sh->B; b++)
            for (int j = 0; j < sh->Tk; j++)
                m[b * sh->Tk + j] = j == 0 || j < sh->Tk - (b + 1) * sh->Tk / 4;
        p->mask = &pr->mask;
        break;
    }
    case OPT_MASK: {
        const int64_t ms[4] = {1, 1, sh->Tq, sh->Tk};
        attn_tensor_alloc(ctx, &pr->mask, ATTN_DTYPE_BOOL, 4, ms);
        uint8_t *m = pr->mask.data;
        for (int64_t i = 0; i < (int64_t)sh->Tq * sh->Tk; i++)
            m[i] = i % sh->Tk == 0 || uniform() > -0.3f;
        p->mask = &pr->mask;
        break;
    }
    default:
        break;
    }
}

static void problem_free(problem *pr)
{
    attn_ctx *ctx = &pr->ctx;
    attn_tensor_free(ctx, &pr->q), attn_tensor_free(ctx, &pr->k), attn_tensor_free(ctx, &pr->v);
    attn_tensor_free(ctx, &pr->out), attn_tensor_free(ctx, &pr->lse);
    attn_tensor_free(ctx, &pr->bias), attn_tensor_free(ctx, &pr->sinks);
    attn_tensor_free(ctx, &pr->mask);
    attn_ctx_release(ctx);
}

/* Runs pr under (impl, arch, threads) into out16 (bfloat16 bits) and lse. */
static int run(problem *pr, attn_impl impl, attn_arch arch, int threads, uint16_t *out16,
               float *lse)
{
    pr->ctx.impl = impl;
    pr->ctx.arch = arch;
    pr->ctx.threads = threads;
    const int rc = attn_sdpa(&pr->ctx, &pr->q, &pr->k, &pr->v, &pr->p, &pr->out, NULL);
    memcpy(out16, pr->out.data, (size_t)pr->n_out * 2);
    memcpy(lse, pr->lse.data, (size_t)attn_tensor_numel(&pr->lse) * sizeof(float));
    return rc;
}

static const attn_arch paths[] = {ATTN_ARCH_AVX512_BF16, ATTN_ARCH_AMX};

static void test_against_reference(void)
{
    TEST("every bfloat16 path, every option, awkward shapes: within 2^-8 (max |v| + |out|) of the "
         "reference, lse within 1e-4, the same bits for 1 and 2 threads");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int opt = 0; opt < OPT_COUNT; opt++) {
            const shape *sh = &shapes[si];
            problem pr;
            problem_make(&pr, sh, opt);
            const int64_t n = pr.n_out, nl = attn_tensor_numel(&pr.lse);
            uint16_t *ref = malloc((size_t)n * 2), *got = malloc((size_t)n * 2),
                     *got2 = malloc((size_t)n * 2);
            float *lref = malloc((size_t)nl * 4), *lgot = malloc((size_t)nl * 4),
                  *lgot2 = malloc((size_t)nl * 4);
            const int rc_ref = run(&pr, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, ref, lref);
            for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
                if (!attn_arch_supported(paths[pi]))
                    continue;
                char what[200];
                snprintf(what, sizeof what, "%s, B%d H%d/%d Tq%d Tk%d D%d Dv%d, %s",
                         attn_arch_name(paths[pi]), sh->B, sh->H, sh->Hkv, sh->Tq, sh->Tk, sh->D,
                         sh->Dv, opt_names[opt]);
                const int rc1 = run(&pr, ATTN_IMPL_FUSED, paths[pi], 1, got, lgot);
                const int rc2 = run(&pr, ATTN_IMPL_FUSED, paths[pi], 2, got2, lgot2);
                if (rc1 != rc_ref || rc2 != rc_ref) {
                    fprintf(stderr, "   %s: status %d and %d, the reference's %d (%s)\n", what,
                            rc1, rc2, rc_ref, pr.ctx.message);
                    CHECK_INT(rc1, rc_ref);
                    continue;
                }
                if (rc_ref != ATTN_OK)
                    continue;
                double vmax = 0.0, worst = 0.0, lworst = 0.0;
                for (int64_t i = 0; i < attn_tensor_numel(&pr.v); i++)
                    vmax = fmax(vmax, fabs(attn__bf16_to_f32(((uint16_t *)pr.v.data)[i])));
                int64_t bad = -1;
                for (int64_t i = 0; i < n; i++) {
                    const double a = attn__bf16_to_f32(ref[i]), b = attn__bf16_to_f32(got[i]);
                    const double e = fabs(a - b), bound = ldexp(vmax + fabs(a), -8);
                    if (!(e <= bound) && bad < 0)
                        bad = i;
                    worst = fmax(worst, e);
                }
                if (bad >= 0)
                    fprintf(stderr, "   %s: out[%lld] %.6g, the reference's %.6g\n", what,
                            (long long)bad, attn__bf16_to_f32(got[bad]), attn__bf16_to_f32(ref[bad]));
                CHECK(bad < 0);
                for (int64_t i = 0; i < nl; i++) {
                    const double e = fabs((double)lref[i] - (double)lgot[i]);
                    if (!(e <= 1e-4) && !(isinf(lref[i]) && lref[i] == lgot[i])) {
                        fprintf(stderr, "   %s: lse[%lld] %.8g, the reference's %.8g\n", what,
                                (long long)i, lgot[i], lref[i]);
                        CHECK(!"lse within 1e-4 of the reference's");
                        break;
                    }
                    lworst = isinf(e) ? lworst : fmax(lworst, e);
                }
                if (memcmp(got, got2, (size_t)n * 2) != 0 || memcmp(lgot, lgot2, (size_t)nl * 4) != 0) {
                    fprintf(stderr, "   %s: 1 and 2 threads give other bits\n", what);
                    CHECK(!"1 and 2 threads give the same bits");
                }
            }
            free(ref), free(got), free(got2), free(lref), free(lgot), free(lgot2);
            problem_free(&pr);
        }
}

static void test_nonfinite(void)
{
    TEST("an inf in v at a masked key reaches no row; a NaN in v at a visible key reaches "
         "exactly the rows that see it (causal: the rows from its position on)");
    const shape sh = {1, 2, 1, 70, 70, 64, 64};
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!attn_arch_supported(paths[pi]))
            continue;
        problem pr;
        problem_make(&pr, &sh, OPT_PADDING); /* keys 53..69 masked (Tk - Tk/4 on) */
        uint16_t *v = pr.v.data, *out = malloc((size_t)pr.n_out * 2);
        float *lse = malloc(2 * 70 * sizeof(float));
        v[60 * 64 + 5] = 0x7f80; /* +inf at masked key 60 */
        CHECK_INT(run(&pr, ATTN_IMPL_FUSED, paths[pi], 2, out, lse), ATTN_OK);
        int finite = 1;
        for (int64_t i = 0; i < pr.n_out; i++)
            finite &= (out[i] & 0x7f80) != 0x7f80;
        if (!finite)
            fprintf(stderr, "   %s: an inf at a masked key reached the output\n",
                    attn_arch_name(paths[pi]));
        CHECK(finite);
        v[60 * 64 + 5] = 0;
        pr.p.mask = NULL;
        pr.p.causal = ATTN_CAUSAL_TOP_LEFT;
        v[40 * 64 + 7] = 0x7fc0; /* NaN at key 40: rows 40 and later see it */
        CHECK_INT(run(&pr, ATTN_IMPL_FUSED, paths[pi], 2, out, lse), ATTN_OK);
        int right = 1;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 70; i++) {
                const uint16_t x = out[((int64_t)h * 70 + i) * 64 + 7];
                const int nan = (x & 0x7f80) == 0x7f80 && (x & 0x7f);
                right &= nan == (i >= 40);
            }
        if (!right)
            fprintf(stderr, "   %s: the NaN at key 40 did not reach exactly rows 40..69\n",
                    attn_arch_name(paths[pi]));
        CHECK(right);
        free(out), free(lse);
        problem_free(&pr);
    }
}

static void test_strided_out(void)
{
    TEST("out written through a transposed view (element stride Tq) gets the contiguous "
         "out's bits, on every bfloat16 path");
    const shape sh = {1, 2, 2, 40, 70, 64, 48};
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!attn_arch_supported(paths[pi]))
            continue;
        problem pr;
        problem_make(&pr, &sh, OPT_CAUSAL);
        const int64_t n = pr.n_out;
        uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
        float lse[80];
        CHECK_INT(run(&pr, ATTN_IMPL_FUSED, paths[pi], 2, want, lse), ATTN_OK);
        attn_tensor store, view;
        const int64_t ts[4] = {1, 2, 48, 40};
        CHECK_INT(attn_tensor_alloc(&pr.ctx, &store, ATTN_DTYPE_BF16, 4, ts), ATTN_OK);
        CHECK_INT(attn_tensor_transpose(&pr.ctx, &store, 2, 3, &view), ATTN_OK);
        pr.ctx.arch = paths[pi];
        CHECK_INT(attn_sdpa(&pr.ctx, &pr.q, &pr.k, &pr.v, &pr.p, &view, NULL), ATTN_OK);
        const uint16_t *st = store.data;
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 40; i++)
                for (int64_t e = 0; e < 48; e++)
                    got[(h * 40 + i) * 48 + e] = st[(h * 48 + e) * 40 + i];
        if (memcmp(want, got, (size_t)n * 2) != 0)
            fprintf(stderr, "   %s: the strided out differs\n", attn_arch_name(paths[pi]));
        CHECK(memcmp(want, got, (size_t)n * 2) == 0);
        attn_tensor_free(&pr.ctx, &store);
        free(want), free(got);
        problem_free(&pr);
    }
}

static void announce(void)
{
    const unsigned x = attn_cpu_features();
    fprintf(stderr, "-- CPU 16-bit features: %s\n", attn_cpu_features_string());
    if (!attn_arch_supported(ATTN_ARCH_AVX512_BF16))
        fprintf(stderr, "-- skipped: the avx512bf16 path: no AVX-512 here\n");
    else
        fprintf(stderr, "-- the avx512bf16 path runs %s\n",
                x & ATTN_CPU_AVX512_BF16 ? "on this CPU's vdpbf16ps"
                                         : "with vdpbf16ps emulated (no AVX512-BF16 here)");
    if (!attn_arch_supported(ATTN_ARCH_AMX))
        fprintf(stderr, "-- skipped: the amx path: this CPU, OS or build has no AMX-BF16 tiles\n");
    else
        fprintf(stderr, "-- the amx path runs on this CPU's AMX-BF16 tiles\n");
}

int main(void)
{
    setenv("ATTN_BF16_EMULATE", "1", 1);
    announce();
    test_against_reference();
    test_nonfinite();
    test_strided_out();
    return check_summary("test_bf16_paths");
}
