/*
 * test_half.c - bfloat16 and float16 storage (SPEC section 10).
 *
 * What it protects:
 *   - the converters: every float16 widens exactly and narrows back to itself,
 *     rounding is to nearest even, a NaN stays a NaN, float16 overflows to
 *     infinity from 65520 up, and every instruction set's array converters give
 *     the portable converters' bits;
 *   - attn_tensor_convert, and the dtype rule of attn_sdpa (all four 16-bit
 *     tensors of one dtype; any mix refused with every dtype named);
 *   - FlashAttention's accuracy rule on tests/data/golden_half (made by
 *     tests/golden/gen_half.py with PyTorch): attn's largest error against the
 *     float64 oracle is at most 2 x PyTorch's own same-dtype error + a floor, on
 *     the reference and the fused kernel of every instruction set this machine
 *     runs, with 1 and 2 threads, which give the same bits;
 *   - a call of more than 8 query rows (the tile path) plans one head's float32
 *     q, out, K and V per thread, not all of them, and gives the bits of the
 *     float32 call on the widened tensors, rounded once (strided K and V, one
 *     key/value head for three query heads, 1, 2 and 3 threads); with out = q
 *     itself it gives the bits of a separate out.
 *
 * The floor is one unit of the dtype's precision at the output's largest
 * magnitude (2^-8 x max|out| for bfloat16, 2^-11 for float16): rounding the
 * float32 result to 16 bits alone costs up to half of that, so no 16-bit output
 * can promise less, and PyTorch's error on a small case can be that small.
 */
#include "attn.h"
#include "check.h"
#include "half_golden.h"
#include "half.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float x) { return attn__f32_bits(x); }

static void test_scalar_rules(void)
{
    TEST("bfloat16 rounds to nearest, ties to even, and keeps NaN a NaN");
    CHECK_INT(attn__f32_to_bf16(1.0f), 0x3f80);
    CHECK_INT(attn__f32_to_bf16(attn__bits_f32(0x3f808000u)), 0x3f80); /* tie, even below */
    CHECK_INT(attn__f32_to_bf16(attn__bits_f32(0x3f818000u)), 0x3f82); /* tie, even above */
    CHECK_INT(attn__f32_to_bf16(attn__bits_f32(0x3f808001u)), 0x3f81); /* above the tie */
    CHECK_INT(attn__f32_to_bf16(attn__bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    CHECK(isnan(attn__bf16_to_f32(attn__f32_to_bf16(attn__bits_f32(0x7f800001u)))));
    CHECK(isnan(attn__bf16_to_f32(attn__f32_to_bf16(-NAN))));
    CHECK_INT(attn__f32_to_bf16(-INFINITY), 0xff80);

    TEST("float16 rounds to nearest even, overflows from 65520, keeps subnormals and NaN");
    CHECK_INT(attn__f32_to_f16(1.0f), 0x3c00);
    CHECK_INT(attn__f32_to_f16(65504.0f), 0x7bff);
    CHECK_INT(attn__f32_to_f16(65519.99f), 0x7bff);
    CHECK_INT(attn__f32_to_f16(65520.0f), 0x7c00);
    CHECK_INT(attn__f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);            /* tie, even */
    CHECK_INT(attn__f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);            /* tie, even */
    CHECK_INT(attn__f32_to_f16(5.9604644775390625e-8f), 0x0001);          /* 2^-24 */
    CHECK_INT(attn__f32_to_f16(2.98023223876953125e-8f), 0x0000);         /* 2^-25: tie to 0 */
    CHECK_INT(attn__f32_to_f16(-8.940696716308594e-8f), 0x8002);          /* 1.5 x 2^-24 */
    CHECK_INT(attn__f32_to_f16(6.1035156e-05f), 0x0400);                  /* 2^-14 */
    CHECK(isnan(attn__f16_to_f32(attn__f32_to_f16(NAN))));

    TEST("every float16 widens exactly and narrows back to itself (NaNs made quiet)");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = attn__f16_to_f32((uint16_t)h);
        const uint16_t back = attn__f32_to_f16(f);
        const int nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
        if (nan ? back != (h | 0x200u) : back != h) {
            if (bad++ < 5)
                fprintf(stderr, "  half 0x%04x -> %g -> 0x%04x\n", h, (double)f, back);
        }
        if (!nan && (double)f != ldexp((double)((h & 0x3ffu) | ((h & 0x7c00u) ? 0x400u : 0u)),
                                       (int)((h >> 10) & 0x1fu) - 25 + ((h & 0x7c00u) ? 0 : 1)) *
                                        ((h & 0x8000u) ? -1.0 : 1.0) &&
            (h & 0x7c00u) != 0x7c00u && bad++ < 5)
            fprintf(stderr, "  half 0x%04x widens to %g\n", h, (double)f);
    }
    CHECK_INT(bad, 0);
}

/* Floats to narrow: a stride through every bit pattern, plus ties and edges. */
static int64_t sweep_floats(float *x, int64_t cap)
{
    int64_t n = 0;
    for (uint64_t u = 0; u < 0x100000000ull && n < cap - 64; u += 65521)
        x[n++] = attn__bits_f32((uint32_t)u);
    const uint32_t edge[] = {0x3f808000u, 0x3f818000u, 0x477ff000u, 0x477fefffu, 0x7f800000u,
                             0xff800000u, 0x7fc00000u, 0x7f800001u, 0x33000000u, 0x33000001u,
                             0x387fe000u, 0x38800000u, 0x00000001u, 0x80000000u};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        x[n++] = attn__bits_f32(edge[i]);
    return n;
}

static void test_paths_agree(void)
{
    const attn_arch archs[] = {ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    enum { CAP = 70000 };
    float *x = malloc(CAP * sizeof *x), *w0 = malloc(CAP * sizeof *w0), *w1 = malloc(CAP * sizeof *w1);
    uint16_t *h0 = malloc(CAP * sizeof *h0), *h1 = malloc(CAP * sizeof *h1), *all = malloc(65536 * 2);
    const int64_t n = sweep_floats(x, CAP);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        if (!attn_arch_supported(archs[a])) {
            fprintf(stderr, "-- skipped: the %s converters (this CPU cannot run them)\n",
                    attn_arch_name(archs[a]));
            continue;
        }
        const attn__half_kernels *hk = attn__half_for(archs[a]), *ref = &attn__half_scalar;
        char what[160];
        snprintf(what, sizeof what, "the %s converters give the portable bits (%s)",
                 attn_arch_name(archs[a]), hk == ref ? "portable: no F16C" : "vector");
        TEST(what);
        int bad = 0;
        /* Odd lengths and offsets, so the vector bodies and the tails both run. */
        ref->f32_to_bf16(x + 1, h0, n - 1);
        hk->f32_to_bf16(x + 1, h1, n - 1);
        bad += memcmp(h0, h1, (size_t)(n - 1) * 2) != 0;
        ref->f32_to_f16(x + 1, h0, n - 1);
        hk->f32_to_f16(x + 1, h1, n - 1);
        for (int64_t i = 0; i < n - 1; i++)
            if (h0[i] != h1[i] && bad++ < 5)
                fprintf(stderr, "  f16 of 0x%08x: portable 0x%04x, %s 0x%04x\n", bits_of(x[i + 1]),
                        h0[i], attn_arch_name(archs[a]), h1[i]);
        ref->bf16_to_f32(all + 3, w0, 65533);
        hk->bf16_to_f32(all + 3, w1, 65533);
        bad += memcmp(w0, w1, 65533 * 4) != 0;
        ref->f16_to_f32(all + 3, w0, 65533);
        hk->f16_to_f32(all + 3, w1, 65533);
        for (int64_t i = 0; i < 65533; i++)
            if (bits_of(w0[i]) != bits_of(w1[i]) && bad++ < 5)
                fprintf(stderr, "  half 0x%04x: portable 0x%08x, %s 0x%08x\n", (unsigned)(i + 3),
                        bits_of(w0[i]), attn_arch_name(archs[a]), bits_of(w1[i]));
        CHECK_INT(bad, 0);
    }
    free(x), free(w0), free(w1), free(h0), free(h1), free(all);
}

static void test_convert_and_dtypes(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    TEST("attn_tensor_convert goes float32 -> bfloat16 -> float32 with the scalar rounding");
    float src[6] = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, 1e30f}, back[6];
    uint16_t mid[6];
    int64_t shape[1] = {6};
    attn_tensor ts, tm, tb;
    attn_tensor_init(&ctx, &ts, ATTN_DTYPE_F32, src, 1, shape);
    attn_tensor_init(&ctx, &tm, ATTN_DTYPE_BF16, mid, 1, shape);
    attn_tensor_init(&ctx, &tb, ATTN_DTYPE_F32, back, 1, shape);
    CHECK_INT(attn_tensor_convert(&ctx, &ts, &tm), ATTN_OK);
    CHECK_INT(attn_tensor_convert(&ctx, &tm, &tb), ATTN_OK);
    for (int i = 0; i < 6; i++)
        CHECK_INT(bits_of(back[i]), bits_of(attn__bf16_to_f32(attn__f32_to_bf16(src[i]))));
    TEST("attn_tensor_convert refuses an integer dtype, naming it");
    int32_t ints[6];
    attn_tensor ti;
    attn_tensor_init(&ctx, &ti, ATTN_DTYPE_I32, ints, 1, shape);
    CHECK_INT(attn_tensor_convert(&ctx, &ts, &ti), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "int32");
    CHECK_STR_EQ(attn_dtype_name(ATTN_DTYPE_BF16), "bfloat16");
    CHECK_INT(attn_dtype_size(ATTN_DTYPE_F16), 2);

    TEST("attn_sdpa refuses a bfloat16 q with a float32 k, naming all four dtypes");
    uint16_t q16[8] = {0}, k16[8] = {0}, v16[8] = {0}, o16[8];
    float k32[8] = {0};
    int64_t s4[4] = {1, 1, 2, 4};
    attn_tensor q, k, v, o;
    attn_tensor_init(&ctx, &q, ATTN_DTYPE_BF16, q16, 4, s4);
    attn_tensor_init(&ctx, &k, ATTN_DTYPE_F32, k32, 4, s4);
    attn_tensor_init(&ctx, &v, ATTN_DTYPE_BF16, v16, 4, s4);
    attn_tensor_init(&ctx, &o, ATTN_DTYPE_BF16, o16, 4, s4);
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, NULL, &o, NULL), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "q bfloat16, k float32, v bfloat16, out bfloat16");
    TEST("attn_sdpa refuses bfloat16 mixed with float16");
    attn_tensor_init(&ctx, &k, ATTN_DTYPE_F16, k16, 4, s4);
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, NULL, &o, NULL), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "k float16");
    TEST("the backward refuses bfloat16 q, k, v and out (it is float32 only)");
    {
        uint16_t do16[8] = {0};
        float dq[8], dk[8], dv[8], lse_d[2] = {0};
        attn_tensor qb, kb, vb, ob, dob, tdq, tdk, tdv, tl;
        int64_t s3[3] = {1, 1, 2};
        attn_tensor_init(&ctx, &qb, ATTN_DTYPE_BF16, q16, 4, s4);
        attn_tensor_init(&ctx, &kb, ATTN_DTYPE_BF16, k16, 4, s4);
        attn_tensor_init(&ctx, &vb, ATTN_DTYPE_BF16, v16, 4, s4);
        attn_tensor_init(&ctx, &ob, ATTN_DTYPE_BF16, o16, 4, s4);
        attn_tensor_init(&ctx, &dob, ATTN_DTYPE_BF16, do16, 4, s4);
        attn_tensor_init(&ctx, &tdq, ATTN_DTYPE_F32, dq, 4, s4);
        attn_tensor_init(&ctx, &tdk, ATTN_DTYPE_F32, dk, 4, s4);
        attn_tensor_init(&ctx, &tdv, ATTN_DTYPE_F32, dv, 4, s4);
        attn_tensor_init(&ctx, &tl, ATTN_DTYPE_F32, lse_d, 3, s3);
        attn_sdpa_grads grads = {&tdq, &tdk, &tdv, NULL, NULL};
        CHECK_INT(attn_sdpa_backward(&ctx, &qb, &kb, &vb, NULL, &ob, &tl, &dob, &grads),
                  ATTN_STATUS_DTYPE);
        CHECK_STR_CONTAINS(ctx.message, "backward takes float32");
    }
    TEST("a float32 q with a float16 k is refused as before (k must be float32)");
    float q32[8] = {0}, o32[8];
    attn_tensor_init(&ctx, &q, ATTN_DTYPE_F32, q32, 4, s4);
    attn_tensor_init(&ctx, &o, ATTN_DTYPE_F32, o32, 4, s4);
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, NULL, &o, NULL), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "k must be float32, not float16");
    attn_ctx_release(&ctx);
}

/* ---- the golden sweep ---------------------------------------------------------- */

/* A 16-bit copy of a float32 array (values already exact in the dtype). */
static int to_half(attn_ctx *ctx, const attn_tensor *src, attn_dtype dt, attn_tensor *dst)
{
    int rc = attn_tensor_alloc(ctx, dst, dt, src->ndim, src->shape);
    return rc ? rc : attn_tensor_convert(ctx, src, dst);
}

static void run_case(const char *name)
{
    half_case c;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/golden_half/%s", ATTN_TEST_DATA_DIR, name);
    if (!read_case(dir, &c)) {
        CHECK(!"case.txt is readable");
        return;
    }
    const attn_dtype dt = strcmp(c.dtype, "bf16") == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array q, k, v, o64, mask, bias, sinks;
    memset(&mask, 0, sizeof mask), memset(&bias, 0, sizeof bias), memset(&sinks, 0, sizeof sinks);
    if (load(&ctx, &c, "q.npy", &q) || load(&ctx, &c, "k.npy", &k) || load(&ctx, &c, "v.npy", &v) ||
        load(&ctx, &c, "out64.npy", &o64) || (c.mask[0] && load(&ctx, &c, c.mask, &mask)) ||
        (c.bias[0] && load(&ctx, &c, c.bias, &bias)) || (c.sinks[0] && load(&ctx, &c, c.sinks, &sinks))) {
        CHECK(!"the case's files load");
        return;
    }
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = c.causal;
    if (c.window[0]) {
        p.has_window = 1;
        long long l = 0, r = 0;
        sscanf(c.window, "%lld,%lld", &l, &r);
        p.window_left = l, p.window_right = r;
    }
    p.softcap = c.softcap[0] ? (float)atof(c.softcap) : 0.0f;
    p.alibi = c.alibi;
    p.mask = c.mask[0] ? &mask.tensor : NULL;
    p.bias = c.bias[0] ? &bias.tensor : NULL;
    p.sinks = c.sinks[0] ? &sinks.tensor : NULL;

    attn_tensor qh, kh, vh, oh, of;
    CHECK_INT(to_half(&ctx, &q.tensor, dt, &qh), ATTN_OK);
    CHECK_INT(to_half(&ctx, &k.tensor, dt, &kh), ATTN_OK);
    CHECK_INT(to_half(&ctx, &v.tensor, dt, &vh), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, o64.tensor.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &of, ATTN_DTYPE_F32, 4, o64.tensor.shape), ATTN_OK);
    const int64_t n = attn_tensor_numel(&of);
    uint16_t *first = malloc((size_t)n * 2);
    const float *ref = o64.tensor.data;
    double amax = 0.0;
    for (int64_t i = 0; i < n; i++)
        amax = fmax(amax, fabs((double)ref[i]));
    const double floor_ = ldexp(amax, dt == ATTN_DTYPE_BF16 ? -8 : -11);
    const double bound = 2.0 * c.torch_err + floor_;

    /* avx512bf16 and amx run bfloat16 calls of more than 8 query rows on their own
     * kernels (src/kernels/sdpa_bf16.h), everything else as avx512 does. */
    const struct { attn_impl impl; attn_arch arch; } paths[] = {
        {ATTN_IMPL_REF, ATTN_ARCH_AUTO},      {ATTN_IMPL_FUSED, ATTN_ARCH_SCALAR},
        {ATTN_IMPL_FUSED, ATTN_ARCH_AVX2},    {ATTN_IMPL_FUSED, ATTN_ARCH_AVX512},
        {ATTN_IMPL_FUSED, ATTN_ARCH_AVX512_BF16}, {ATTN_IMPL_FUSED, ATTN_ARCH_AMX}};
    double worst = 0.0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!attn_arch_supported(paths[pi].arch))
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            ctx.impl = paths[pi].impl;
            ctx.arch = paths[pi].arch;
            ctx.threads = threads;
            const int rc = attn_sdpa(&ctx, &qh, &kh, &vh, &p, &oh, NULL);
            char what[640];
            snprintf(what, sizeof what, "%s on %s, %d thread%s: error <= 2 x torch's %.3g + floor %.3g",
                     name, paths[pi].impl == ATTN_IMPL_REF ? "the reference" : attn_arch_name(paths[pi].arch),
                     threads, threads > 1 ? "s" : "", c.torch_err, floor_);
            if (rc != ATTN_OK) {
                fprintf(stderr, "%s: %s\n", what, ctx.message);
                CHECK_INT(rc, ATTN_OK);
                continue;
            }
            ctx.threads = 0;
            attn_tensor_convert(&ctx, &oh, &of);
            const float *got = of.data;
            double err = 0.0;
            for (int64_t i = 0; i < n; i++) {
                const double e = fabs((double)got[i] - (double)ref[i]);
                err = isnan(e) ? INFINITY : fmax(err, e);
            }
            if (err > bound)
                fprintf(stderr, "-- %s: error %.4g > bound %.4g\n", what, err, bound);
            CHECK(err <= bound);
            worst = fmax(worst, err);
            if (threads == 1) {
                memcpy(first, oh.data, (size_t)n * 2);
            } else if (memcmp(first, oh.data, (size_t)n * 2) != 0) {
                fprintf(stderr, "-- %s: 1 and 2 threads differ in bits\n", what);
                CHECK(!"1 and 2 threads give the same bits");
            }
        }
    }
    fprintf(stderr, "   %-18s attn's worst error %.3g, torch's %.3g, bound %.3g\n", name, worst,
            c.torch_err, bound);
    /* k read through a transposed view (element stride Tk, not 1) gives the bits of
     * the contiguous k: the strided widening is the same rounding-free copy. */
    attn_tensor kst, kview;
    const int64_t *ks = kh.shape;
    const int64_t tshape[4] = {ks[0], ks[1], ks[3], ks[2]};
    CHECK_INT(attn_tensor_alloc(&ctx, &kst, dt, 4, tshape), ATTN_OK);
    CHECK_INT(attn_tensor_transpose(&ctx, &kst, 2, 3, &kview), ATTN_OK);
    CHECK_INT(attn_tensor_copy(&ctx, &kh, &kview), ATTN_OK);
    ctx.impl = ATTN_IMPL_AUTO;
    ctx.arch = ATTN_ARCH_AUTO;
    ctx.threads = 2;
    if (attn_sdpa(&ctx, &qh, &kh, &vh, &p, &oh, NULL) == ATTN_OK) {
        memcpy(first, oh.data, (size_t)n * 2);
        CHECK_INT(attn_sdpa(&ctx, &qh, &kview, &vh, &p, &oh, NULL), ATTN_OK);
        if (memcmp(first, oh.data, (size_t)n * 2) != 0) {
            fprintf(stderr, "-- %s: a transposed k view gives other bits\n", name);
            CHECK(!"a strided k gives the contiguous k's bits");
        }
    }
    attn_tensor_free(&ctx, &kst);
    free(first);
    attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &kh), attn_tensor_free(&ctx, &vh);
    attn_tensor_free(&ctx, &oh), attn_tensor_free(&ctx, &of);
    attn_array_free(&ctx, &q), attn_array_free(&ctx, &k), attn_array_free(&ctx, &v);
    attn_array_free(&ctx, &o64), attn_array_free(&ctx, &mask), attn_array_free(&ctx, &bias);
    attn_array_free(&ctx, &sinks);
    attn_ctx_release(&ctx);
}

static void test_golden(void)
{
    TEST("every golden_half case, every path, 1 and 2 threads: within FlashAttention's rule");
    const int cases = for_each_case(ATTN_TEST_DATA_DIR "/golden_half", run_case);
    /* The README and docs/half-precision.md speak of 30 cases. */
    if (cases < 30)
        fprintf(stderr, "   golden_half/MANIFEST: %d cases (-1: unreadable), want at least 30\n",
                cases);
    CHECK(cases >= 30);
}

static void test_files(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    const int64_t shape[2] = {3, 5};
    uint16_t bf[15], f16[15];
    for (int i = 0; i < 15; i++) {
        const float x = (float)(i - 7) * 0.3f + 1e-3f * (float)i;
        bf[i] = attn__f32_to_bf16(x * 1e20f); /* beyond float16's range */
        f16[i] = attn__f32_to_f16(x);
    }
    attn_tensor tb, th;
    attn_tensor_init(&ctx, &tb, ATTN_DTYPE_BF16, bf, 2, shape);
    attn_tensor_init(&ctx, &th, ATTN_DTYPE_F16, f16, 2, shape);
    const char *np16 = ATTN_TEST_TMP_DIR "/half_f16.npy", *npbf = ATTN_TEST_TMP_DIR "/half_bf16.npy";
    const char *st = ATTN_TEST_TMP_DIR "/half.safetensors";
    attn_array a;

    TEST("a float16 .npy saves as '<f2' and loads with ATTN_LOAD_HALF as float16, bit for bit");
    CHECK_INT(attn_npy_save(&ctx, np16, &th), ATTN_OK);
    CHECK_INT(attn_npy_load_flags(&ctx, np16, ATTN_LOAD_HALF, &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F16);
    CHECK_STR_EQ(a.file_dtype, "float16");
    CHECK(a.buffer && memcmp(a.tensor.data, f16, sizeof f16) == 0);
    attn_array_free(&ctx, &a);
    TEST("without the flag the same file still loads widened to float32 (old callers)");
    CHECK_INT(attn_npy_load(&ctx, np16, &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
    CHECK(a.buffer && bits_of(((float *)a.tensor.data)[4]) == bits_of(attn__f16_to_f32(f16[4])));
    attn_array_free(&ctx, &a);

    TEST("a bfloat16 tensor saves to .npy as float32 holding exactly its values");
    CHECK_INT(attn_npy_save(&ctx, npbf, &tb), ATTN_OK);
    CHECK_INT(attn_npy_load_flags(&ctx, npbf, ATTN_LOAD_HALF, &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
    int same = 1;
    for (int i = 0; a.buffer && i < 15; i++)
        same &= bits_of(((float *)a.tensor.data)[i]) == bits_of(attn__bf16_to_f32(bf[i]));
    CHECK(same);
    attn_array_free(&ctx, &a);

    TEST("safetensors BF16 and F16 save and load as they are with ATTN_LOAD_HALF");
    const char *names[2] = {"b", "h"};
    const attn_tensor ts[2] = {tb, th};
    CHECK_INT(attn_safetensors_save(&ctx, st, names, ts, 2), ATTN_OK);
    attn_safetensors *f = NULL;
    CHECK_INT(attn_safetensors_open(&ctx, st, &f), ATTN_OK);
    CHECK_INT(attn_safetensors_get_flags(&ctx, f, "b", ATTN_LOAD_HALF, &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BF16);
    CHECK_STR_EQ(a.file_dtype, "bfloat16");
    CHECK(a.buffer && memcmp(a.tensor.data, bf, sizeof bf) == 0);
    attn_array_free(&ctx, &a);
    CHECK_INT(attn_safetensors_get_flags(&ctx, f, "h", ATTN_LOAD_HALF, &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F16);
    CHECK(a.buffer && memcmp(a.tensor.data, f16, sizeof f16) == 0);
    attn_array_free(&ctx, &a);
    TEST("safetensors BF16 without the flag widens to float32 as before");
    CHECK_INT(attn_safetensors_get(&ctx, f, "b", &a), ATTN_OK);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
    CHECK(a.buffer && bits_of(((float *)a.tensor.data)[14]) == bits_of(attn__bf16_to_f32(bf[14])));
    attn_array_free(&ctx, &a);
    attn_safetensors_close(&ctx, f);
    remove(np16), remove(npbf), remove(st);
    attn_ctx_release(&ctx);
}

/* attn_sdpa in 16 bits with more than 8 query rows on one call (the tile path on
 * the widening kernel): since issue 16's second session each (batch, key/value
 * head) is widened by the items that run its group's query tiles, into a copy per
 * worker, instead of all of K and V into one float32 copy first; since its third
 * session the items widen their query rows and round their output rows through
 * one head's float32 rows per worker too. What it protects: the plan holds at most
 * the float32 plan's scratch plus, per thread, one head's q and out rows and one
 * key/value head's K and V (q and out whole in float32, 8 MiB at 1024 positions,
 * fail, and so does a copy of all of K and V), and the same bytes for 4 heads as
 * for 16 (nothing in it grows with the heads); and the result has the bits of the float32 call on the widened tensors, rounded
 * once (what the whole copy gave), with K and V read through strides (a [B, Tk,
 * Hkv, D] buffer), two sequences of one key/value head for three query heads (so
 * 3 threads split a head's tiles), 9 and 70 rows, causal, a window with softcap,
 * every fused path, 1, 2 and 3 threads. */
static void test_tile_heads(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = di ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        {
            enum { H = 16, T = 1024, D = 64 };
            char what[240];
            snprintf(what, sizeof what,
                     "%s attn_sdpa on S4's heads at 1024 positions, 2 threads, plans one "
                     "head's float32 q, out, K and V per thread, not all of them, and the "
                     "same bytes for 4 heads",
                     attn_dtype_name(dt));
            TEST(what);
            const int64_t shape[4] = {1, H, T, D};
            attn_tensor t32, o32t, t16, o16t; /* q, k and v may be one tensor */
            CHECK_INT(attn_tensor_alloc(&ctx, &t32, ATTN_DTYPE_F32, 4, shape), ATTN_OK);
            CHECK_INT(attn_tensor_alloc(&ctx, &o32t, ATTN_DTYPE_F32, 4, shape), ATTN_OK);
            CHECK_INT(attn_tensor_alloc(&ctx, &t16, dt, 4, shape), ATTN_OK);
            CHECK_INT(attn_tensor_alloc(&ctx, &o16t, dt, 4, shape), ATTN_OK);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = ATTN_CAUSAL_TOP_LEFT;
            ctx.threads = 2;
            ctx.impl = ATTN_IMPL_FUSED;
            ctx.arch = ATTN_ARCH_AVX512; /* any arch but the bfloat16 kernel's */
            if (!attn_arch_supported(ctx.arch))
                ctx.arch = ATTN_ARCH_SCALAR;
            size_t w32 = 0, w16 = 0, w16h4 = 0;
            CHECK_INT(attn_sdpa_workspace_size(&ctx, &t32, &t32, &t32, &p, &o32t, NULL, &w32), ATTN_OK);
            CHECK_INT(attn_sdpa_workspace_size(&ctx, &t16, &t16, &t16, &p, &o16t, NULL, &w16), ATTN_OK);
            /* Per thread one head's q and out rows and one key/value head's K and
             * V, in float32, and alignment. */
            const size_t most = w32 + (size_t)4 * (2 * T * 2 * D + 2 * T * 2 * D) + 256;
            if (w16 > most)
                fprintf(stderr, "   %zu bytes planned; at most %zu expected\n", w16, most);
            CHECK(w16 <= most);
            attn_tensor t4, o4;
            CHECK_INT(attn_tensor_narrow(&ctx, &t16, 1, 0, 4, &t4), ATTN_OK);
            CHECK_INT(attn_tensor_narrow(&ctx, &o16t, 1, 0, 4, &o4), ATTN_OK);
            CHECK_INT(attn_sdpa_workspace_size(&ctx, &t4, &t4, &t4, &p, &o4, NULL, &w16h4), ATTN_OK);
            if (w16h4 != w16)
                fprintf(stderr, "   %zu bytes planned for 4 heads, %zu for 16\n", w16h4, w16);
            CHECK(w16h4 == w16);
            attn_tensor_free(&ctx, &t32), attn_tensor_free(&ctx, &o32t);
            attn_tensor_free(&ctx, &t16), attn_tensor_free(&ctx, &o16t);
        }
        enum { B = 2, H = 3, HKV = 1, TK = 150, TQ = 70, D = 24 };
        static float kb[B * TK * HKV * D], vb[B * TK * HKV * D], qb[B * H * TQ * D],
            o32[B * H * TQ * D];
        tu_fill(kb, B * TK * HKV * D, 31);
        tu_fill(vb, B * TK * HKV * D, 32);
        tu_fill(qb, B * H * TQ * D, 33);
        for (int64_t i = 0; i < B * TK * HKV * D; i++) {
            kb[i] = dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(attn__f32_to_bf16(kb[i]))
                                          : attn__f16_to_f32(attn__f32_to_f16(kb[i]));
            vb[i] = dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(attn__f32_to_bf16(vb[i]))
                                          : attn__f16_to_f32(attn__f32_to_f16(vb[i]));
        }
        for (int64_t i = 0; i < B * H * TQ * D; i++)
            qb[i] = dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(attn__f32_to_bf16(qb[i]))
                                          : attn__f16_to_f32(attn__f32_to_f16(qb[i]));
        /* K and V as [B, Tk, Hkv, D] buffers, read as [B, Hkv, Tk, D] views. */
        attn_tensor kt = tu_tensor4(kb, B, TK, HKV, D), vt = tu_tensor4(vb, B, TK, HKV, D);
        attn_tensor k32, v32, k16b, v16b, k16, v16;
        attn_tensor_transpose(&ctx, &kt, 1, 2, &k32);
        attn_tensor_transpose(&ctx, &vt, 1, 2, &v32);
        CHECK_INT(to_half(&ctx, &kt, dt, &k16b), ATTN_OK);
        CHECK_INT(to_half(&ctx, &vt, dt, &v16b), ATTN_OK);
        attn_tensor_transpose(&ctx, &k16b, 1, 2, &k16);
        attn_tensor_transpose(&ctx, &v16b, 1, 2, &v16);
        static const int TQS[2] = {9, TQ};
        for (int ti = 0; ti < 2; ti++)
            for (int opt = 0; opt < 2; opt++) {
                const int tq = TQS[ti];
                char what[300];
                snprintf(what, sizeof what,
                         "%s attn_sdpa, 2 sequences, H 3 / Hkv 1, %d query rows, strided K and "
                         "V, %s: the bits of the float32 call on the widened tensors, rounded "
                         "once, every fused path, 1, 2 and 3 threads",
                         attn_dtype_name(dt), tq, opt ? "a window and softcap" : "causal");
                TEST(what);
                attn_tensor q32 = tu_tensor4(qb, B, H, tq, D), o = tu_tensor4(o32, B, H, tq, D),
                            q16, o16, or16;
                CHECK_INT(to_half(&ctx, &q32, dt, &q16), ATTN_OK);
                CHECK_INT(to_half(&ctx, &q32, dt, &o16), ATTN_OK);
                CHECK_INT(to_half(&ctx, &q32, dt, &or16), ATTN_OK);
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                if (opt) {
                    p.has_window = 1;
                    p.window_left = 30;
                    p.window_right = 5;
                    p.softcap = 10.0f;
                    p.causal = ATTN_CAUSAL_NONE;
                }
                static const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
                int64_t bad = 0, runs = 0;
                for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
                    if (!attn_arch_supported(archs[a]))
                        continue;
                    ctx.impl = ATTN_IMPL_FUSED;
                    ctx.arch = archs[a];
                    for (int threads = 1; threads <= 3; threads++) {
                        ctx.threads = threads;
                        CHECK_INT(attn_sdpa(&ctx, &q32, &k32, &v32, &p, &o, NULL), ATTN_OK);
                        CHECK_INT(attn_sdpa(&ctx, &q16, &k16, &v16, &p, &o16, NULL), ATTN_OK);
                        CHECK_INT(attn_tensor_convert(&ctx, &o, &or16), ATTN_OK);
                        int64_t nb = 0;
                        const uint16_t *x = (const uint16_t *)o16.data,
                                       *y = (const uint16_t *)or16.data;
                        for (int64_t i = 0; i < (int64_t)B * H * tq * D; i++)
                            if (x[i] != y[i] && nb++ < 3)
                                fprintf(stderr, "   %s, %d threads, element %lld: 0x%04x, "
                                        "float32's rounded 0x%04x\n",
                                        attn_arch_name(archs[a]), threads, (long long)i, x[i], y[i]);
                        bad += nb;
                        runs++;
                    }
                }
                CHECK_INT(bad, 0);
                CHECK(runs > 0);
                attn_tensor_free(&ctx, &q16), attn_tensor_free(&ctx, &o16),
                    attn_tensor_free(&ctx, &or16);
            }
        attn_tensor_free(&ctx, &k16b), attn_tensor_free(&ctx, &v16b);
    }
    ctx.impl = ATTN_IMPL_AUTO;
    ctx.arch = ATTN_ARCH_AUTO;
    ctx.threads = 0;
    attn_ctx_release(&ctx);
}

/* attn_sdpa in 16 bits with out = q itself (the header allows it when D == Dv) on
 * the tile path: since issue 16's third session each query tile's rows of q are
 * widened just before the tile and its output rows rounded into out just after,
 * so the in-place call is right only because no other item reads those rows of q
 * afterwards (each tile reads its own rows only). What it protects: the in-place
 * call gives the bits of the same call with a separate out, for one sequence of
 * one key/value head for three query heads (so 2 and 3 threads deal a head's
 * tiles out to several items at once) and two sequences of two key/value heads,
 * 70 and 113 rows, causal and not, every fused path, 1, 2 and 3 threads. */
static void test_tile_in_place(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    static const int64_t CASES[4][4] = {{1, 3, 1, 70}, {1, 3, 1, 113}, {2, 4, 2, 70}, {2, 4, 2, 113}};
    static const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    enum { D = 24 };
    static float qb[2 * 4 * 113 * D], kb[2 * 2 * 113 * D];
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = di ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        char what[240];
        snprintf(what, sizeof what,
                 "%s attn_sdpa with out = q on the tile path (70 and 113 rows, 1 of 3 and 2 of 4 "
                 "key/value heads, causal and not): the bits of a separate out, every fused "
                 "path, 1, 2 and 3 threads",
                 attn_dtype_name(dt));
        TEST(what);
        int64_t bad = 0, runs = 0;
        for (int ci = 0; ci < 4; ci++) {
            const int64_t B = CASES[ci][0], H = CASES[ci][1], HKV = CASES[ci][2], T = CASES[ci][3];
            tu_fill(qb, B * H * T * D, 51 + (uint64_t)ci);
            tu_fill(kb, B * HKV * T * D, 61 + (uint64_t)ci);
            attn_tensor q32 = tu_tensor4(qb, B, H, T, D), k32 = tu_tensor4(kb, B, HKV, T, D);
            attn_tensor q16, k16, o16, io16;
            CHECK_INT(to_half(&ctx, &q32, dt, &q16), ATTN_OK);
            CHECK_INT(to_half(&ctx, &k32, dt, &k16), ATTN_OK);
            CHECK_INT(to_half(&ctx, &q32, dt, &o16), ATTN_OK);
            CHECK_INT(to_half(&ctx, &q32, dt, &io16), ATTN_OK);
            for (int causal = 0; causal < 2; causal++) {
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
                for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
                    if (!attn_arch_supported(archs[a]))
                        continue;
                    ctx.impl = ATTN_IMPL_FUSED;
                    ctx.arch = archs[a];
                    for (int threads = 1; threads <= 3; threads++) {
                        ctx.threads = threads;
                        /* k doubles as v; io16 starts as q and ends as out. */
                        CHECK_INT(attn_tensor_copy(&ctx, &q16, &io16), ATTN_OK);
                        CHECK_INT(attn_sdpa(&ctx, &q16, &k16, &k16, &p, &o16, NULL), ATTN_OK);
                        CHECK_INT(attn_sdpa(&ctx, &io16, &k16, &k16, &p, &io16, NULL), ATTN_OK);
                        const uint16_t *x = (const uint16_t *)io16.data,
                                       *y = (const uint16_t *)o16.data;
                        int64_t nb = 0;
                        for (int64_t i = 0; i < B * H * T * D; i++)
                            if (x[i] != y[i] && nb++ < 3)
                                fprintf(stderr, "   %s, %d threads, B %lld H %lld Hkv %lld T %lld, "
                                        "element %lld: in place 0x%04x, separate out 0x%04x\n",
                                        attn_arch_name(archs[a]), threads, (long long)B,
                                        (long long)H, (long long)HKV, (long long)T, (long long)i,
                                        x[i], y[i]);
                        bad += nb;
                        runs++;
                    }
                }
            }
            attn_tensor_free(&ctx, &q16), attn_tensor_free(&ctx, &k16);
            attn_tensor_free(&ctx, &o16), attn_tensor_free(&ctx, &io16);
        }
        CHECK_INT(bad, 0);
        CHECK(runs > 0);
    }
    ctx.impl = ATTN_IMPL_AUTO;
    ctx.arch = ATTN_ARCH_AUTO;
    ctx.threads = 0;
    attn_ctx_release(&ctx);
}

/* 1 when /proc/cpuinfo's first "flags" line lists `flag` as a whole word; -1 when
 * there is no such file (not Linux, or no x86 flags line). */
static int cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return -1;
    static char line[8192];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        found = 0;
        for (char *w = strtok(strchr(line, ':') ? strchr(line, ':') + 1 : line, " \t\n"); w;
             w = strtok(NULL, " \t\n"))
            if (strcmp(w, flag) == 0)
                found = 1;
        break;
    }
    fclose(f);
    return found;
}

static void test_features(void)
{
    TEST("attn_cpu_features agrees with the kernel's /proc/cpuinfo flags (f16c, "
         "avx512_bf16, avx512_fp16; amx_bf16 only where the OS also grants the tiles)");
    const unsigned x = attn_cpu_features();
    const struct { const char *flag; unsigned bit; } map[] = {
        {"f16c", ATTN_CPU_F16C}, {"avx512_bf16", ATTN_CPU_AVX512_BF16},
        {"avx512_fp16", ATTN_CPU_AVX512_FP16}};
    if (cpuinfo_has("fpu") != 1) {
        fprintf(stderr, "-- skipped: no x86 flags in /proc/cpuinfo\n");
        return;
    }
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        const int listed = cpuinfo_has(map[i].flag), ours = (x & map[i].bit) != 0;
        if (listed != ours)
            fprintf(stderr, "   %s: /proc/cpuinfo %d, attn %d\n", map[i].flag, listed, ours);
        CHECK_INT(ours, listed);
    }
    if (x & ATTN_CPU_AMX_BF16)
        CHECK_INT(cpuinfo_has("amx_bf16"), 1);
}

/* Which bfloat16 kernels the golden sweep runs here, and which it cannot. */
static void announce_missing(void)
{
    const unsigned x = attn_cpu_features();
    fprintf(stderr, "-- CPU 16-bit features: %s\n", attn_cpu_features_string());
    if (!attn_arch_supported(ATTN_ARCH_AVX512_BF16))
        fprintf(stderr, "-- skipped: the avx512bf16 path (vdpbf16ps): this CPU or build has no "
                        "AVX512-BF16 (ATTN_BF16_EMULATE=1 runs it emulated on AVX-512)\n");
    else if (!(x & ATTN_CPU_AVX512_BF16))
        fprintf(stderr, "-- the avx512bf16 path runs with vdpbf16ps emulated (ATTN_BF16_EMULATE=1)\n");
    else
        fprintf(stderr, "-- the avx512bf16 path runs on this CPU's vdpbf16ps\n");
    if (!attn_arch_supported(ATTN_ARCH_AMX))
        fprintf(stderr, "-- skipped: the amx path: this CPU, OS or build has no AMX-BF16 tiles\n");
    else
        fprintf(stderr, "-- the amx path runs on this CPU's AMX-BF16 tiles\n");
}

int main(void)
{
    announce_missing();
    test_features();
    test_scalar_rules();
    test_paths_agree();
    test_convert_and_dtypes();
    test_files();
    test_golden();
    test_tile_heads();
    test_tile_in_place();
    return check_summary("test_half");
}
