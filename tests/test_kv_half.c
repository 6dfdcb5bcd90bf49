/*
 * test_kv_half.c - the KV cache stored in bfloat16 and float16 (SPEC section 10).
 *
 * What it protects:
 *   - the config's dtype: float32 when zeroed, K and V in half the bytes when
 *     16-bit, anything else refused with the dtype named;
 *   - append: float32 keys and values rounded once to nearest even, the cache's
 *     own dtype copied bit for bit, strided sources, every instruction set's
 *     converters storing the same bits; RoPE turning keys in float32 and rounding
 *     once (the rounded keys of a float32 cache with the same RoPE);
 *   - attend: FlashAttention's accuracy rule of tests/test_half.c on
 *     tests/data/golden_kv_half (made by tests/golden/gen_kv_half.py with
 *     PyTorch: 1, 3, 17, 113 and 1100 keys, grouped-query heads, several query
 *     rows, a window, softcap), on the reference and the fused kernel of every
 *     instruction set this machine runs, with 1 and 2 threads (the same bits), for
 *     q and out each float32 or 16-bit; a 16-bit q/out call gives the bits of
 *     attn_sdpa on the cache's own views, a float32 q holding 16-bit values the
 *     bits of the 16-bit q, and a float32 out rounds to the 16-bit out's bits;
 *   - a batch of unequal lengths (1, 17, 113), with and without the weights:
 *     each sequence's bits are attn_sdpa's on its views;
 *   - a batch of 3, 300, 700 and 2100 keys (every layout of the 16-bit row path:
 *     unsplit, split by the float32 rule, split in half-chunks), GQA, 1 and 3
 *     query rows, q/out float32 or 16-bit, RoPE, a window with softcap, a mask
 *     and lse: the batched attend (one parallel job) gives the bits of each
 *     sequence attended on its own, on every path, 1, 2 (and on avx512 3 and 7)
 *     threads;
 *   - a batch of 70, 113, 200 and 330 keys with 9 and 70 query rows (the
 *     tile path, since issue 16 one parallel job too), GQA, q/out float32 or
 *     16-bit, RoPE, a window with softcap, a mask and lse: each sequence's own
 *     bits, on every fused path, 1, 2 (and on avx512 3) threads;
 *   - where the 16-bit row path chunks the keys as the float32 one does (S7's
 *     heads, one head a group, D 113, 120 and 62, and unsplit): a 16-bit cache's
 *     float32 output has the bits of a float32 cache of the widened values (the
 *     split items widen in registers on AVX-512 and AVX2, the scalar build into
 *     a copy), and is within 1e-5 of a float64 oracle;
 *   - one sequence's call of 9 and 70 query rows (the tile path, each key/value
 *     head widened by the items that use it): a float32 cache's bits on the
 *     widened values, GQA and one key/value head, RoPE, options, q/out float32 or
 *     16-bit, every fused path, 1, 2 and 3 threads;
 *   - a NaN key and an inf value in a batch: the reference's classes, and each
 *     sequence's own bits for the finite outputs;
 *   - a decoding loop on a 16-bit cache with attn_kv_cache_workspace_size bytes
 *     of workspace allocates nothing per step, for one batch whose lengths cross
 *     the layouts' thresholds during the loop too.
 */
#include "attn.h"
#include "check.h"
#include "half_golden.h"
#include "half.h"
#include "sdpa_contract.h"
#include "sdpa_fused.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const attn_dtype DTS[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};

/* The paths a call can take: the reference and the fused kernel per instruction set
 * (avx512bf16 and amx where the CPU and the OS allow them; announced as skipped
 * where they do not). */
static const struct {
    attn_impl impl;
    attn_arch arch;
    const char *name;
} PATHS[] = {{ATTN_IMPL_REF, ATTN_ARCH_AUTO, "ref"},
             {ATTN_IMPL_FUSED, ATTN_ARCH_SCALAR, "scalar"},
             {ATTN_IMPL_FUSED, ATTN_ARCH_AVX2, "avx2"},
             {ATTN_IMPL_FUSED, ATTN_ARCH_AVX512, "avx512"},
             {ATTN_IMPL_FUSED, ATTN_ARCH_AVX512_BF16, "avx512bf16"},
             {ATTN_IMPL_FUSED, ATTN_ARCH_AMX, "amx"}};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])

static uint16_t round_to(attn_dtype dt, float x)
{
    return dt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(x) : attn__f32_to_f16(x);
}

static float widen(attn_dtype dt, uint16_t h)
{
    return dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
}

static attn_kv_cache *make_cache(attn_ctx *ctx, int64_t B, int64_t Hkv, int64_t cap, int64_t D,
                                 int64_t Dv, attn_dtype dt)
{
    const attn_kv_cache_config cfg = {B, Hkv, cap, D, Dv, dt};
    attn_kv_cache *c = NULL;
    const int rc = attn_kv_cache_create(ctx, &cfg, NULL, 0, &c);
    if (rc != ATTN_OK)
        fprintf(stderr, "   attn_kv_cache_create: %s\n", ctx->message);
    CHECK_INT(rc, ATTN_OK);
    return c;
}

/* A 16-bit (or float32) copy of src, contiguous. */
static int copy_as(attn_ctx *ctx, const attn_tensor *src, attn_dtype dt, attn_tensor *dst)
{
    int rc = attn_tensor_alloc(ctx, dst, dt, src->ndim, src->shape);
    return rc ? rc : attn_tensor_convert(ctx, src, dst);
}

/* Element (b, h, t, d) of a 4-D 16-bit tensor. */
static uint16_t at16(const attn_tensor *t, int64_t b, int64_t h, int64_t i, int64_t d)
{
    return ((const uint16_t *)t->data)[b * t->stride[0] + h * t->stride[1] + i * t->stride[2] +
                                       d * t->stride[3]];
}

/* How many elements of two 4-D 16-bit tensors of one shape differ in bits. */
static int64_t diff16(const attn_tensor *a, const attn_tensor *b)
{
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < a->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < a->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < a->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < a->shape[3]; i3++)
                    n += at16(a, i0, i1, i2, i3) != at16(b, i0, i1, i2, i3);
    return n;
}

static void test_config(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    TEST("a 16-bit cache takes half the K and V bytes of a float32 one, plus one float32 "
         "[Hkv, D] block of stage rows");
    attn_kv_cache_config cfg = {2, 2, 64, 32, 0, ATTN_DTYPE_F32};
    size_t b32 = 0, b16 = 0;
    CHECK_INT(attn_kv_cache_bytes(&ctx, &cfg, &b32), ATTN_OK);
    for (int i = 0; i < 2; i++) {
        cfg.dtype = DTS[i];
        CHECK_INT(attn_kv_cache_bytes(&ctx, &cfg, &b16), ATTN_OK);
        /* K and V: 2 x 2 x 2 x 64 x 32 elements, 4 bytes -> 2; the stage 2 x 32 floats. */
        const long long kv32 = 2LL * 2 * 2 * 64 * 32 * 4, stage = 2LL * 32 * 4;
        CHECK_INT((long long)b32 - (long long)b16, kv32 / 2 - stage);
    }
    TEST("a zeroed config stores float32 (ATTN_DTYPE_F32 is 0)");
    attn_kv_cache_config zero;
    memset(&zero, 0, sizeof zero);
    zero.batch = zero.kv_heads = zero.capacity = zero.head_dim = 2;
    attn_kv_cache *c = NULL;
    CHECK_INT(attn_kv_cache_create(&ctx, &zero, NULL, 0, &c), ATTN_OK);
    const int64_t s4[4] = {1, 2, 1, 2};
    float kv[4] = {1.0f / 3.0f, 2, 3, 4};
    attn_tensor k, view;
    attn_tensor_init(&ctx, &k, ATTN_DTYPE_F32, kv, 4, s4);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &k, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_view(&ctx, c, 0, &view, NULL), ATTN_OK);
    CHECK_INT(view.dtype, ATTN_DTYPE_F32);
    CHECK(((float *)view.data)[0] == 1.0f / 3.0f);
    attn_kv_cache_free(&ctx, c);

    TEST("a config dtype other than float32, bfloat16 or float16 is a DTYPE error naming it");
    cfg.dtype = ATTN_DTYPE_I32;
    CHECK_INT(attn_kv_cache_bytes(&ctx, &cfg, &b16), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "dtype 3 (int32)");
    CHECK_INT(b16, 0);
    cfg.dtype = (attn_dtype)77;
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "dtype 77 (unknown)");
    CHECK(c == NULL);
    attn_ctx_release(&ctx);
}

/* Values that probe the rounding: random ones, ties of both dtypes, a NaN, float16's
 * overflow and a subnormal. */
static void fill_probe(float *x, int64_t n, uint64_t seed)
{
    tu_fill(x, n, seed);
    const float special[] = {attn__bits_f32(0x3f808000u), attn__bits_f32(0x3f818000u),
                             1.0f + 1.0f / 2048.0f, NAN, 70000.0f, -65520.0f,
                             2.98023223876953125e-8f, 5e-41f, -0.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && (int64_t)i * 7 < n; i++)
        x[i * 7] = special[i];
}

static void test_append(void)
{
    enum { B = 2, HKV = 3, T1 = 7, T2 = 5, CAP = 20, D = 10, DV = 6 };
    static float kb[B * HKV * T1 * D], vt[B * HKV * DV * T1], k2b[B * HKV * T2 * D],
        v2b[B * HKV * T2 * DV];
    fill_probe(kb, B * HKV * T1 * D, 1);
    fill_probe(vt, B * HKV * DV * T1, 2);
    tu_fill(k2b, B * HKV * T2 * D, 3);
    tu_fill(v2b, B * HKV * T2 * DV, 4);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    /* v is read through a transposed view: its feature stride is T1, not 1. */
    attn_tensor k = tu_tensor4(kb, B, HKV, T1, D), vtt = tu_tensor4(vt, B, HKV, DV, T1), v;
    attn_tensor_transpose(&ctx, &vtt, 2, 3, &v);
    attn_tensor k2 = tu_tensor4(k2b, B, HKV, T2, D), v2 = tu_tensor4(v2b, B, HKV, T2, DV);
    for (int i = 0; i < 2; i++) {
        const attn_dtype dt = DTS[i];
        char what[256];
        snprintf(what, sizeof what,
                 "%s cache: float32 keys and values (one strided) are rounded once to "
                 "nearest even; %s ones are copied bit for bit; views are %s; every "
                 "instruction set stores the same bits",
                 attn_dtype_name(dt), attn_dtype_name(dt), attn_dtype_name(dt));
        TEST(what);
        attn_tensor k2h, v2h;
        CHECK_INT(copy_as(&ctx, &k2, dt, &k2h), ATTN_OK);
        CHECK_INT(copy_as(&ctx, &v2, dt, &v2h), ATTN_OK);
        attn_tensor first_k, first_v;
        int have_first = 0;
        for (size_t pi = 1; pi < N_PATHS; pi++) {
            if (!attn_arch_supported(PATHS[pi].arch))
                continue;
            ctx.arch = PATHS[pi].arch;
            attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, DV, dt);
            if (!c)
                continue;
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &v, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k2h, &v2h, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_length(c, 1), T1 + T2);
            int64_t bad = 0;
            for (int64_t b = 0; b < B; b++) {
                attn_tensor ck, cv;
                CHECK_INT(attn_kv_cache_view(&ctx, c, b, &ck, &cv), ATTN_OK);
                CHECK_INT(ck.dtype, dt);
                CHECK_INT(cv.dtype, dt);
                CHECK_INT(ck.shape[2], T1 + T2);
                for (int64_t h = 0; h < HKV; h++) {
                    for (int64_t t = 0; t < T1; t++) {
                        for (int64_t d = 0; d < D; d++)
                            bad += at16(&ck, 0, h, t, d) !=
                                   round_to(dt, kb[((b * HKV + h) * T1 + t) * D + d]);
                        for (int64_t d = 0; d < DV; d++)
                            bad += at16(&cv, 0, h, t, d) !=
                                   round_to(dt, vt[((b * HKV + h) * DV + d) * T1 + t]);
                    }
                    for (int64_t t = 0; t < T2; t++) {
                        for (int64_t d = 0; d < D; d++)
                            bad += at16(&ck, 0, h, T1 + t, d) != at16(&k2h, b, h, t, d);
                        for (int64_t d = 0; d < DV; d++)
                            bad += at16(&cv, 0, h, T1 + t, d) != at16(&v2h, b, h, t, d);
                    }
                }
                if (!have_first && b == 0) {
                    CHECK_INT(copy_as(&ctx, &ck, dt, &first_k), ATTN_OK);
                    CHECK_INT(copy_as(&ctx, &cv, dt, &first_v), ATTN_OK);
                    have_first = 1;
                } else if (b == 0) {
                    const int64_t dk = diff16(&ck, &first_k), dv = diff16(&cv, &first_v);
                    if (dk || dv)
                        fprintf(stderr, "   %s stores %lld keys, %lld values unlike the first path\n",
                                PATHS[pi].name, (long long)dk, (long long)dv);
                    CHECK_INT(dk + dv, 0);
                }
            }
            if (bad)
                fprintf(stderr, "   %s, %s: %lld elements differ from the rounded source\n",
                        attn_dtype_name(dt), PATHS[pi].name, (long long)bad);
            CHECK_INT(bad, 0);
            attn_kv_cache_free(&ctx, c);
        }
        ctx.arch = ATTN_ARCH_AUTO;
        if (have_first)
            attn_tensor_free(&ctx, &first_k), attn_tensor_free(&ctx, &first_v);

        snprintf(what, sizeof what,
                 "%s cache: a key of another 16-bit dtype, or a 16-bit query against a "
                 "float32 cache, is a DTYPE error naming both; a full cache appends nothing",
                 attn_dtype_name(dt));
        TEST(what);
        const attn_dtype other = dt == ATTN_DTYPE_BF16 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        attn_tensor k2o;
        CHECK_INT(copy_as(&ctx, &k2, other, &k2o), ATTN_OK);
        attn_kv_cache *c = make_cache(&ctx, B, HKV, T1 + 1, D, DV, dt);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k2o, &v2h, NULL), ATTN_STATUS_DTYPE);
        char want[128];
        snprintf(want, sizeof want, "k must be float32 or %s (the cache's dtype), not %s",
                 attn_dtype_name(dt), attn_dtype_name(other));
        CHECK_STR_CONTAINS(ctx.message, want);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k2h, &v2h, NULL), ATTN_OK);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k2h, &v2h, NULL), ATTN_STATUS_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(ctx.message, "the KV cache is full");
        CHECK_INT(attn_kv_cache_length(c, 0), T2);
        attn_kv_cache_free(&ctx, c);
        attn_kv_cache *c32 = make_cache(&ctx, B, HKV, CAP, D, DV, ATTN_DTYPE_F32);
        CHECK_INT(attn_kv_cache_append(&ctx, c32, 0, &k2h, &v2, NULL), ATTN_STATUS_DTYPE);
        snprintf(want, sizeof want, "k must be float32, not %s", attn_dtype_name(dt));
        CHECK_STR_CONTAINS(ctx.message, want);
        CHECK_INT(attn_kv_cache_append(&ctx, c32, 0, &k2, &v2, NULL), ATTN_OK);
        static float ob[B * HKV * 1 * DV];
        attn_tensor qh, qv, o = tu_tensor4(ob, B, HKV, 1, DV);
        CHECK_INT(attn_tensor_narrow(&ctx, &k2h, 2, 0, 1, &qv), ATTN_OK);
        CHECK_INT(copy_as(&ctx, &qv, dt, &qh), ATTN_OK);
        CHECK_INT(attn_kv_cache_attend(&ctx, c32, 0, &qh, NULL, NULL, &o, NULL), ATTN_STATUS_DTYPE);
        snprintf(want, sizeof want, "q must be float32, not %s", attn_dtype_name(dt));
        CHECK_STR_CONTAINS(ctx.message, want);
        attn_kv_cache_free(&ctx, c32);
        attn_tensor_free(&ctx, &qh);
        attn_tensor_free(&ctx, &k2o), attn_tensor_free(&ctx, &k2h), attn_tensor_free(&ctx, &v2h);
    }
    attn_ctx_release(&ctx);
}

static void test_rope_append(void)
{
    enum { HKV = 2, T1 = 3, T2 = 4, CAP = 9, D = 12 };
    static float kb[HKV * (T1 + T2) * D], vb[HKV * (T1 + T2) * D];
    tu_fill(kb, HKV * (T1 + T2) * D, 11);
    tu_fill(vb, HKV * (T1 + T2) * D, 12);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    const attn_tensor kall = tu_tensor4(kb, 1, HKV, T1 + T2, D), vall = tu_tensor4(vb, 1, HKV, T1 + T2, D);
    for (int i = 0; i < 2; i++)
        for (int pairing = 0; pairing < 2; pairing++) {
            const attn_dtype dt = DTS[i];
            attn_rope_params rope;
            attn_rope_params_init(&rope);
            rope.pairing = pairing ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
            rope.base = 500000.0f;
            char what[256];
            snprintf(what, sizeof what,
                     "%s cache, RoPE %s: keys turned in float32 and rounded once, from "
                     "float32 keys and from %s keys (widened first): the rounded keys of a "
                     "float32 cache with the same RoPE",
                     attn_dtype_name(dt), pairing ? "half" : "interleaved", attn_dtype_name(dt));
            TEST(what);
            attn_tensor kh, kw;
            CHECK_INT(copy_as(&ctx, &kall, dt, &kh), ATTN_OK);
            CHECK_INT(copy_as(&ctx, &kh, ATTN_DTYPE_F32, &kw), ATTN_OK); /* exact */
            for (int src16 = 0; src16 < 2; src16++) {
                attn_kv_cache *c32 = make_cache(&ctx, 1, HKV, CAP, D, 0, ATTN_DTYPE_F32);
                attn_kv_cache *c16 = make_cache(&ctx, 1, HKV, CAP, D, 0, dt);
                /* Two blocks, so the second starts at position T1. */
                for (int blk = 0; blk < 2; blk++) {
                    const int64_t t0 = blk ? T1 : 0, n = blk ? T2 : T1;
                    attn_tensor k32, k16, vv;
                    attn_tensor_narrow(&ctx, src16 ? &kw : &kall, 2, t0, n, &k32);
                    attn_tensor_narrow(&ctx, src16 ? &kh : &kall, 2, t0, n, &k16);
                    attn_tensor_narrow(&ctx, &vall, 2, t0, n, &vv);
                    CHECK_INT(attn_kv_cache_append(&ctx, c32, 0, &k32, &vv, &rope), ATTN_OK);
                    CHECK_INT(attn_kv_cache_append(&ctx, c16, 0, &k16, &vv, &rope), ATTN_OK);
                }
                attn_tensor a, b;
                CHECK_INT(attn_kv_cache_view(&ctx, c32, 0, &a, NULL), ATTN_OK);
                CHECK_INT(attn_kv_cache_view(&ctx, c16, 0, &b, NULL), ATTN_OK);
                int64_t bad = 0;
                for (int64_t h = 0; h < HKV; h++)
                    for (int64_t t = 0; t < T1 + T2; t++)
                        for (int64_t d = 0; d < D; d++) {
                            const float x = ((float *)a.data)[h * a.stride[1] + t * a.stride[2] + d];
                            bad += at16(&b, 0, h, t, d) != round_to(dt, x);
                        }
                if (bad)
                    fprintf(stderr, "   %lld keys differ (source %s)\n", (long long)bad,
                            src16 ? "16-bit" : "float32");
                CHECK_INT(bad, 0);
                attn_kv_cache_free(&ctx, c32), attn_kv_cache_free(&ctx, c16);
            }
            attn_tensor_free(&ctx, &kh), attn_tensor_free(&ctx, &kw);
        }
    attn_ctx_release(&ctx);
}

/* ---- the golden sweep ---------------------------------------------------------- */

/* The largest |out - ref| (out float32 or 16-bit, contiguous); NaN counts as inf. */
static double max_err(const attn_tensor *out, const float *ref, int64_t n)
{
    double err = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float x = out->dtype == ATTN_DTYPE_F32 ? ((const float *)out->data)[i]
                                                     : widen(out->dtype, ((const uint16_t *)out->data)[i]);
        const double e = fabs((double)x - (double)ref[i]);
        err = isnan(e) ? INFINITY : fmax(err, e);
    }
    return err;
}

static void run_case(const char *name)
{
    half_case c;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/golden_kv_half/%s", ATTN_TEST_DATA_DIR, name);
    if (!read_case(dir, &c)) {
        CHECK(!"case.txt is readable");
        return;
    }
    const attn_dtype dt = strcmp(c.dtype, "bf16") == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array q, k, v, o64;
    if (load(&ctx, &c, "q.npy", &q) || load(&ctx, &c, "k.npy", &k) || load(&ctx, &c, "v.npy", &v) ||
        load(&ctx, &c, "out64.npy", &o64)) {
        CHECK(!"the case's files load");
        return;
    }
    const int64_t B = q.tensor.shape[0], H = q.tensor.shape[1], Tq = q.tensor.shape[2],
                  D = q.tensor.shape[3], Hkv = k.tensor.shape[1], Tk = k.tensor.shape[2],
                  Dv = v.tensor.shape[3];
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = c.causal == 2 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    if (c.window[0]) {
        p.has_window = 1;
        long long l = 0, r = 0;
        sscanf(c.window, "%lld,%lld", &l, &r);
        p.window_left = l, p.window_right = r;
    }
    p.softcap = c.softcap[0] ? (float)atof(c.softcap) : 0.0f;

    /* The cache holds Tk keys of a capacity of Tk + 3: the keys before the queries'
     * appended in float32 (their values are exact in the dtype, so rounding keeps
     * them), the queries' own in 16 bits (copied). */
    attn_kv_cache *cache = make_cache(&ctx, B, Hkv, Tk + 3, D, Dv, dt);
    attn_tensor kh, vh, qh, oh, o32, oh2, first, first2, kpre, vpre, knew, vnew, knewh, vnewh;
    CHECK_INT(copy_as(&ctx, &k.tensor, dt, &kh), ATTN_OK);
    CHECK_INT(copy_as(&ctx, &v.tensor, dt, &vh), ATTN_OK);
    CHECK_INT(copy_as(&ctx, &q.tensor, dt, &qh), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, o64.tensor.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &oh2, dt, 4, o64.tensor.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &first, dt, 4, o64.tensor.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &first2, dt, 4, o64.tensor.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &o32, ATTN_DTYPE_F32, 4, o64.tensor.shape), ATTN_OK);
    const int64_t pre = Tk - Tq;
    if (pre > 0) {
        attn_tensor_narrow(&ctx, &k.tensor, 2, 0, pre, &kpre);
        attn_tensor_narrow(&ctx, &v.tensor, 2, 0, pre, &vpre);
        CHECK_INT(attn_kv_cache_append(&ctx, cache, 0, &kpre, &vpre, NULL), ATTN_OK);
    }
    attn_tensor_narrow(&ctx, &k.tensor, 2, pre, Tq, &knew);
    attn_tensor_narrow(&ctx, &v.tensor, 2, pre, Tq, &vnew);
    CHECK_INT(copy_as(&ctx, &knew, dt, &knewh), ATTN_OK);
    CHECK_INT(copy_as(&ctx, &vnew, dt, &vnewh), ATTN_OK);
    CHECK_INT(attn_kv_cache_append(&ctx, cache, 0, &knewh, &vnewh, NULL), ATTN_OK);
    int64_t held = 0;
    for (int64_t b = 0; b < B; b++) {
        attn_tensor ck, cv, kb, vb;
        CHECK_INT(attn_kv_cache_view(&ctx, cache, b, &ck, &cv), ATTN_OK);
        attn_tensor_narrow(&ctx, &kh, 0, b, 1, &kb);
        attn_tensor_narrow(&ctx, &vh, 0, b, 1, &vb);
        held += diff16(&ck, &kb) + diff16(&cv, &vb);
    }
    CHECK_INT(held, 0); /* the cache holds the case's 16-bit K and V exactly */

    const int64_t n = B * H * Tq * Dv;
    const float *ref = o64.tensor.data;
    double amax = 0.0;
    for (int64_t i = 0; i < n; i++)
        amax = fmax(amax, fabs((double)ref[i]));
    const double floor_ = ldexp(amax, dt == ATTN_DTYPE_BF16 ? -8 : -11);
    const double bound = 2.0 * c.torch_err + floor_;
    double worst = 0.0;
    const attn_tensor *qs[2] = {&qh, &q.tensor};
    attn_tensor *os[2] = {&oh, &o32};
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        if (!attn_arch_supported(PATHS[pi].arch))
            continue;
        ctx.impl = PATHS[pi].impl;
        ctx.arch = PATHS[pi].arch;
        for (int threads = 1; threads <= 2; threads++) {
            ctx.threads = threads;
            for (int combo = 0; combo < 4; combo++) {
                const attn_tensor *qq = qs[combo & 1];
                attn_tensor *out = os[combo >> 1];
                char what[640];
                snprintf(what, sizeof what, "%s on %s, %d thread%s, q %s, out %s", name,
                         PATHS[pi].name, threads, threads > 1 ? "s" : "",
                         attn_dtype_name(qq->dtype), attn_dtype_name(out->dtype));
                const int rc = attn_kv_cache_attend(&ctx, cache, 0, qq, &p, NULL, out, NULL);
                if (rc != ATTN_OK) {
                    fprintf(stderr, "-- %s: %s\n", what, ctx.message);
                    CHECK_INT(rc, ATTN_OK);
                    continue;
                }
                const double err = max_err(out, ref, n);
                if (err > bound)
                    fprintf(stderr, "-- %s: error %.4g > 2 x torch's %.4g + floor %.4g\n", what,
                            err, c.torch_err, floor_);
                CHECK(err <= bound);
                worst = fmax(worst, err);
                /* The 16-bit output of this path and thread count, as each combination
                 * sees it: a float32 out rounds to it, a float32 q holding the 16-bit
                 * values gives it, and 2 threads give 1 thread's. */
                attn_tensor *got = out;
                if (out->dtype == ATTN_DTYPE_F32) {
                    attn_tensor_convert(&ctx, out, &oh2);
                    got = &oh2;
                }
                /* Except on the bfloat16 kernels' paths (avx512bf16, amx), where q and
                 * out in bfloat16 with more than 8 query rows take the bfloat16 tile
                 * path and the other combinations the widening one: there each route
                 * has its own bits, the same for every combination and thread count
                 * that takes it. */
                const int own = dt == ATTN_DTYPE_BF16 && Tq > 8 &&
                                (PATHS[pi].arch == ATTN_ARCH_AVX512_BF16 ||
                                 PATHS[pi].arch == ATTN_ARCH_AMX);
                attn_tensor *ref16 = own && combo != 0 ? &first2 : &first;
                if (threads == 1 && (combo == 0 || (own && combo == 1))) {
                    attn_tensor_copy(&ctx, got, ref16);
                } else if (diff16(got, ref16) != 0) {
                    fprintf(stderr, "-- %s: %lld elements differ from q and out %s, 1 thread\n",
                            what, (long long)diff16(got, ref16), attn_dtype_name(dt));
                    CHECK(!"every combination and thread count gives the same bits");
                }
            }
            /* attn_sdpa on the cache's own views, one sequence at a time: the same
             * kernel, so the same bits. */
            int64_t differ = 0;
            for (int64_t b = 0; b < B; b++) {
                attn_tensor ck, cv, qb, ob;
                attn_kv_cache_view(&ctx, cache, b, &ck, &cv);
                attn_tensor_narrow(&ctx, &qh, 0, b, 1, &qb);
                attn_tensor_narrow(&ctx, &oh2, 0, b, 1, &ob);
                CHECK_INT(attn_sdpa(&ctx, &qb, &ck, &cv, &p, &ob, NULL), ATTN_OK);
            }
            differ = diff16(&oh2, &first);
            if (differ)
                fprintf(stderr, "-- %s on %s, %d threads: %lld elements differ from attn_sdpa "
                                "on the cache's views\n",
                        name, PATHS[pi].name, threads, (long long)differ);
            CHECK_INT(differ, 0);
        }
    }
    fprintf(stderr, "   %-16s attn's worst error %.3g, torch's %.3g, bound %.3g\n", name, worst,
            c.torch_err, bound);
    attn_kv_cache_free(&ctx, cache);
    attn_tensor *ts[] = {&kh, &vh, &qh, &oh, &o32, &oh2, &first, &first2, &knewh, &vnewh};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        attn_tensor_free(&ctx, ts[i]);
    attn_array_free(&ctx, &q), attn_array_free(&ctx, &k), attn_array_free(&ctx, &v);
    attn_array_free(&ctx, &o64);
    attn_ctx_release(&ctx);
}

static void test_golden(void)
{
    TEST("every golden_kv_half case through a 16-bit cache, every path, 1 and 2 threads, q "
         "and out float32 or 16-bit: within FlashAttention's rule, the same bits for each, "
         "and attn_sdpa's bits on the cache's views");
    const int cases = for_each_case(ATTN_TEST_DATA_DIR "/golden_kv_half", run_case);
    if (cases < 18)
        fprintf(stderr, "   golden_kv_half/MANIFEST: %d cases (-1: unreadable), want at least 18\n",
                cases);
    CHECK(cases >= 18);
}

/* ---- a batch of unequal lengths, RoPE on attend, the decoding loop -------------- */

/* Appends B sequences of len[b] keys and values (Hkv heads of D) to the cache c,
 * drawn from seeds seed + b (keys) and seed + 100 + b (values) through kb and vb. */
static void append_batch(attn_ctx *ctx, attn_kv_cache *c, int64_t B, int64_t Hkv, const int64_t *len,
                         int64_t D, float *kb, float *vb, uint64_t seed)
{
    for (int64_t b = 0; b < B; b++) {
        tu_fill(kb, Hkv * len[b] * D, seed + (uint64_t)b);
        tu_fill(vb, Hkv * len[b] * D, seed + 100 + (uint64_t)b);
        attn_tensor k = tu_tensor4(kb, 1, Hkv, len[b], D), v = tu_tensor4(vb, 1, Hkv, len[b], D);
        CHECK_INT(attn_kv_cache_append(ctx, c, b, &k, &v, NULL), ATTN_OK);
    }
}

static void test_batch(void)
{
    enum { B = 3, H = 4, HKV = 2, CAP = 120, D = 64 };
    static const int64_t len[B] = {1, 17, 113};
    static float kb[HKV * CAP * D], vb[HKV * CAP * D], qb[B * H * D], wb[B * H * CAP],
        w2b[B * H * CAP];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (int i = 0; i < 2; i++) {
        const attn_dtype dt = DTS[i];
        char what[256];
        snprintf(what, sizeof what,
                 "%s cache of lengths 1, 17, 113, GQA: each sequence's output (and weights) "
                 "are attn_sdpa's on its views, bit for bit, on every path and 1 and 2 threads",
                 attn_dtype_name(dt));
        TEST(what);
        attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
        append_batch(&ctx, c, B, HKV, len, D, kb, vb, 100);
        tu_fill(qb, B * H * D, 7);
        attn_tensor q32 = tu_tensor4(qb, B, H, 1, D), qh, oh, ob1, w = tu_tensor4(wb, B, H, 1, CAP),
                    w2 = tu_tensor4(w2b, B, H, 1, CAP);
        CHECK_INT(copy_as(&ctx, &q32, dt, &qh), ATTN_OK);
        CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, qh.shape), ATTN_OK);
        CHECK_INT(attn_tensor_alloc(&ctx, &ob1, dt, 4, qh.shape), ATTN_OK);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        for (size_t pi = 0; pi < N_PATHS; pi++) {
            if (!attn_arch_supported(PATHS[pi].arch))
                continue;
            ctx.impl = PATHS[pi].impl;
            ctx.arch = PATHS[pi].arch;
            for (int threads = 1; threads <= 2; threads++)
                for (int weights = 0; weights < 2; weights++) {
                    ctx.threads = threads;
                    memset(wb, 0x7f, sizeof wb); /* not zero: attend must write the zeros */
                    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, NULL, &oh,
                                                   weights ? &w : NULL),
                              ATTN_OK);
                    int64_t bad = 0, badw = 0;
                    for (int64_t b = 0; b < B; b++) {
                        attn_tensor ck, cv, qv, ov, wv, wvn;
                        attn_kv_cache_view(&ctx, c, b, &ck, &cv);
                        attn_tensor_narrow(&ctx, &qh, 0, b, 1, &qv);
                        attn_tensor_narrow(&ctx, &ob1, 0, b, 1, &ov);
                        attn_tensor_narrow(&ctx, &w2, 0, b, 1, &wv);
                        attn_tensor_narrow(&ctx, &wv, 3, 0, len[b], &wvn);
                        CHECK_INT(attn_sdpa(&ctx, &qv, &ck, &cv, &p, &ov, weights ? &wvn : NULL),
                                  ATTN_OK);
                        for (int64_t h = 0; weights && h < H; h++)
                            for (int64_t j = 0; j < CAP; j++) {
                                const float got = wb[(b * H + h) * CAP + j];
                                const float want = j < len[b] ? w2b[(b * H + h) * CAP + j] : 0.0f;
                                badw += memcmp(&got, &want, sizeof got) != 0;
                            }
                    }
                    bad = diff16(&oh, &ob1);
                    if (bad || badw)
                        fprintf(stderr, "   %s, %d threads, weights %d: %lld outputs, %lld weights differ\n",
                                PATHS[pi].name, threads, weights, (long long)bad, (long long)badw);
                    CHECK_INT(bad + badw, 0);
                }
        }
        ctx.impl = ATTN_IMPL_AUTO;
        ctx.arch = ATTN_ARCH_AUTO;
        ctx.threads = 0;

        snprintf(what, sizeof what,
                 "%s cache, RoPE on attend: a %s q is widened and turned in float32, giving "
                 "the bits of a float32 q holding the same values",
                 attn_dtype_name(dt), attn_dtype_name(dt));
        TEST(what);
        attn_rope_params rope;
        attn_rope_params_init(&rope);
        attn_tensor qw;
        CHECK_INT(copy_as(&ctx, &qh, ATTN_DTYPE_F32, &qw), ATTN_OK);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, &rope, &oh, NULL), ATTN_OK);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qw, &p, &rope, &ob1, NULL), ATTN_OK);
        CHECK_INT(diff16(&oh, &ob1), 0);
        attn_tensor_free(&ctx, &qw);
        attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &oh), attn_tensor_free(&ctx, &ob1);
        attn_kv_cache_free(&ctx, c);
    }
    attn_ctx_release(&ctx);
}

/* How many bytes of two tensors of one shape and dtype (contiguous) differ. */
static int64_t diff_bytes(const attn_tensor *a, const attn_tensor *b)
{
    int64_t n = 1, bad = 0;
    for (int d = 0; d < a->ndim; d++)
        n *= a->shape[d];
    const size_t es = attn_dtype_size(a->dtype);
    for (int64_t i = 0; i < n; i++)
        bad += memcmp((const char *)a->data + i * es, (const char *)b->data + i * es, es) != 0;
    return bad;
}

/* One case of the batch tests: the cache's batched attend of B sequences' tq query
 * rows (16-bit or float32 q and out) against each sequence attended on its own,
 * with no option (opt 0), RoPE on attend (1), or a window of window_left keys, a
 * softcap, the mask mt and lse (2). The paths from first_path on run it with
 * threads[0] and threads[1], the avx512 path with every count of threads[]. Every
 * value must have the bits of the sequence's own attend. */
static void check_batch_vs_alone(attn_ctx *ctx, attn_kv_cache *c, attn_dtype dt, const float *qb,
                                 float *lb, float *l1b, int64_t B, int64_t H, int64_t tq, int64_t D,
                                 int f32io, int opt, int64_t window_left, const attn_tensor *mt,
                                 size_t first_path, const int *threads, int nthreads)
{
    const attn_dtype iot = f32io ? ATTN_DTYPE_F32 : dt;
    attn_tensor q32 = tu_tensor4((float *)qb, B, H, tq, D), q, o, o1;
    CHECK_INT(copy_as(ctx, &q32, iot, &q), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(ctx, &o, iot, 4, q.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(ctx, &o1, iot, 4, q.shape), ATTN_OK);
    attn_tensor lt = tu_tensor3(lb, B, H, tq), l1t = tu_tensor3(l1b, B, H, tq);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    const attn_rope_params *rp = opt == 1 ? &rope : NULL;
    if (opt == 2) {
        p.has_window = 1;
        p.window_left = window_left;
        p.window_right = -1;
        p.softcap = 20.0f;
        p.mask = mt;
    }
    int64_t bad = 0;
    for (size_t pi = first_path; pi < N_PATHS; pi++) {
        if (!attn_arch_supported(PATHS[pi].arch))
            continue;
        ctx->impl = PATHS[pi].impl;
        ctx->arch = PATHS[pi].arch;
        for (int ti = 0; ti < nthreads; ti++) {
            if (ti >= 2 && PATHS[pi].arch != ATTN_ARCH_AVX512)
                continue;
            ctx->threads = threads[ti];
            p.lse = opt == 2 ? &lt : NULL;
            CHECK_INT(attn_kv_cache_attend(ctx, c, 0, &q, &p, rp, &o, NULL), ATTN_OK);
            for (int64_t b = 0; b < B; b++) {
                attn_tensor qv, ov, lv;
                attn_tensor_narrow(ctx, &q, 0, b, 1, &qv);
                attn_tensor_narrow(ctx, &o1, 0, b, 1, &ov);
                attn_tensor_narrow(ctx, &l1t, 0, b, 1, &lv);
                p.lse = opt == 2 ? &lv : NULL;
                CHECK_INT(attn_kv_cache_attend(ctx, c, b, &qv, &p, rp, &ov, NULL), ATTN_OK);
            }
            const int64_t n = diff_bytes(&o, &o1) + (opt == 2 ? diff_bytes(&lt, &l1t) : 0);
            if (n)
                fprintf(stderr, "   %s, %d threads: %lld values differ\n", PATHS[pi].name,
                        threads[ti], (long long)n);
            bad += n;
        }
    }
    CHECK_INT(bad, 0);
    ctx->impl = ATTN_IMPL_AUTO;
    ctx->arch = ATTN_ARCH_AUTO;
    ctx->threads = 0;
    attn_tensor_free(ctx, &q), attn_tensor_free(ctx, &o), attn_tensor_free(ctx, &o1);
}

/* A batch long enough to take every 16-bit row-path layout at once, D = 64 (a
 * half-chunk of 512 keys): 3 and 300 keys unsplit, 700 split by the float32 rule
 * (three chunks of 240), 2100 split in half-chunks (five). The batched attend runs
 * them as one parallel job (src/kernels/sdpa_fused.c, attn__sdpa_fused_run_batch);
 * each sequence attended on its own runs the 16-bit call one by one. */
static void test_batch_split(void)
{
    enum { B = 4, H = 8, HKV = 2, CAP = 2112, D = 64, TQ = 3 };
    static const int64_t len[B] = {3, 300, 700, 2100};
    static float kb[HKV * CAP * D], vb[HKV * CAP * D], qb[B * H * TQ * D], lb[B * H * TQ],
        l1b[B * H * TQ];
    static uint8_t mb[CAP];
    for (int64_t j = 0; j < CAP; j++)
        mb[j] = j % 7 != 3;
    const int64_t mshape[4] = {1, 1, 1, CAP};
    attn_tensor mt;
    attn_tensor_init(NULL, &mt, ATTN_DTYPE_BOOL, mb, 4, mshape);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = DTS[di];
        attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
        append_batch(&ctx, c, B, HKV, len, D, kb, vb, 300);
        tu_fill(qb, B * H * TQ * D, 9);
        for (int tq = 1; tq <= TQ; tq += TQ - 1)
            for (int f32io = 0; f32io < 2; f32io++)
                for (int opt = 0; opt < 3; opt++) {
                    /* opt 0: plain; 1: RoPE on attend; 2: a window, softcap, a
                     * mask hiding every seventh key, and lse. */
                    char what[320];
                    snprintf(what, sizeof what,
                             "%s cache, a batch of 3, 300, 700 and 2100 keys (GQA 8/2, %d "
                             "query rows, %s q/out, %s): the batched attend gives each "
                             "sequence's own attend bits, on every path and 1, 2, 3, 7 threads",
                             attn_dtype_name(dt), tq, f32io ? "float32" : "16-bit",
                             opt == 0 ? "no options" : opt == 1 ? "RoPE" : "window, softcap, mask, lse");
                    TEST(what);
                    static const int THREADS[4] = {1, 2, 3, 7};
                    check_batch_vs_alone(&ctx, c, dt, qb, lb, l1b, B, H, tq, D, f32io, opt, 250, &mt, 0,
                                         THREADS, 4);
                }
        attn_kv_cache_free(&ctx, c);
    }
    attn_ctx_release(&ctx);
}

/* Calls of more than ATTN__FUSED_ROW_MAX query rows (a chunked prefill, a
 * speculative-decoding step) take the tile path; a batch of them on a 16-bit
 * cache runs as one parallel job of (b, key/value head) items, each widening its
 * head's keys into its worker's copy (src/kernels/sdpa_fused.c, half_head_item).
 * Lengths 70, 113, 200 and 330, GQA 8/2, 9 and 70 query rows (9: the first count
 * past the row path; 70: more than one query tile of the tiles chosen for any
 * machine, 64 rows at most): the batched attend gives each sequence's own attend
 * bits. */
static void test_batch_tile(void)
{
    enum { B = 4, H = 8, HKV = 2, CAP = 330, D = 40, TQ = 70 };
    static const int64_t len[B] = {70, 113, 200, 330};
    static float kb[HKV * CAP * D], vb[HKV * CAP * D], qb[B * H * TQ * D], lb[B * H * TQ],
        l1b[B * H * TQ];
    static uint8_t mb[CAP];
    for (int64_t j = 0; j < CAP; j++)
        mb[j] = j % 5 != 2;
    const int64_t mshape[4] = {1, 1, 1, CAP};
    attn_tensor mt;
    attn_tensor_init(NULL, &mt, ATTN_DTYPE_BOOL, mb, 4, mshape);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = DTS[di];
        attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
        append_batch(&ctx, c, B, HKV, len, D, kb, vb, 800);
        tu_fill(qb, B * H * TQ * D, 10);

        char what[320];
        snprintf(what, sizeof what,
                 "%s cache, %d query rows (the tile path): the plan joins a batch "
                 "(attn__fused_batch_add leaves one_by_one at 0) on every fused path",
                 attn_dtype_name(dt), (int)TQ);
        TEST(what);
        for (size_t pi = 1; pi < N_PATHS; pi++) {
            if (!attn_arch_supported(PATHS[pi].arch) || PATHS[pi].arch == ATTN_ARCH_AVX512_BF16 ||
                PATHS[pi].arch == ATTN_ARCH_AMX) /* their own bfloat16 kernel: one by one */
                continue;
            ctx.impl = PATHS[pi].impl;
            ctx.arch = PATHS[pi].arch;
            attn_tensor q32 = tu_tensor4(qb, 1, H, TQ, D), q, o, ck, cv;
            CHECK_INT(copy_as(&ctx, &q32, dt, &q), ATTN_OK);
            CHECK_INT(attn_tensor_alloc(&ctx, &o, dt, 4, q.shape), ATTN_OK);
            attn_kv_cache_view(&ctx, c, 3, &ck, &cv);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            attn__sdpa_shapes sh;
            attn__sdpa_plan plan;
            CHECK_INT(attn__sdpa_prepare(&ctx, &q, &ck, &cv, &p, &o, NULL, &sh), ATTN_OK);
            CHECK_INT(attn__sdpa_plan_for_ctx(&ctx, &sh, &plan), ATTN_OK);
            attn__fused_batch_size acc;
            memset(&acc, 0, sizeof acc);
            attn__fused_batch_add(&acc, &plan);
            attn__fused_batch_add(&acc, &plan);
            if (acc.one_by_one)
                fprintf(stderr, "   %s: the plan goes one by one\n", PATHS[pi].name);
            CHECK_INT(acc.one_by_one, 0);
            attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &o);
        }
        ctx.impl = ATTN_IMPL_AUTO;
        ctx.arch = ATTN_ARCH_AUTO;

        static const int TQS[2] = {9, TQ};
        for (int ti = 0; ti < 2; ti++)
            for (int f32io = 0; f32io < 2; f32io++)
                for (int opt = 0; opt < 3; opt++) {
                    /* opt 0: plain; 1: RoPE on attend; 2: a window, softcap, a mask
                     * hiding every fifth key, and lse. */
                    const int tq = TQS[ti];
                    snprintf(what, sizeof what,
                             "%s cache, a batch of 70, 113, 200 and 330 keys (GQA 8/2, D 40, %d "
                             "query rows: the tile path, %s q/out, %s): the batched attend gives "
                             "each sequence's own attend bits, on every fused path, 1 and 2 threads (and 3 on avx512)",
                             attn_dtype_name(dt), tq, f32io ? "float32" : "16-bit",
                             opt == 0 ? "no options" : opt == 1 ? "RoPE" : "window, softcap, mask, lse");
                    TEST(what);
                    /* The fused paths (the reference never batches). */
                    static const int THREADS[3] = {1, 2, 3};
                    check_batch_vs_alone(&ctx, c, dt, qb, lb, l1b, B, H, tq, D, f32io, opt, 50, &mt, 1,
                                         THREADS, 3);
                }
        attn_kv_cache_free(&ctx, c);
    }
    attn_ctx_release(&ctx);
}

/* Shapes where the 16-bit row path cuts the keys into the chunks the float32 one
 * cuts them into (half-chunks of HALF_CHUNK_BYTES / (4 (D + Dv)) keys, rounded
 * down to 16, against ATTN__SPLIT_ITEMS / Hkv chunks of the float32 rule): there,
 * a 16-bit cache's float32 result must have the bits of a float32 cache holding
 * the widened keys and values, whether the split items widen each chunk into a
 * float32 copy first (scalar) or in registers as they load it (AVX-512, AVX2).
 * Both are checked
 * against a float64 oracle too, so that a fault common to both cannot pass. */
static void test_widen_bits(void)
{
    static const struct {
        int64_t H, Hkv, D, Tk;
    } SH[] = {{32, 8, 128, 2000}, /* S7's heads: groups of four, 8 chunks of 256 */
              {8, 8, 64, 4096},   /* one head a group: 8 chunks of 512 */
              {16, 8, 113, 2300}, /* an odd D, pairs: 8 chunks of 288 */
              {32, 8, 120, 2170}, /* groups of four, a last block of 56 columns: 8 chunks of 272 */
              {4, 2, 120, 300},   /* the unsplit row path, the same last block */
              {32, 8, 62, 4200},  /* AVX2's last blocks: 14 columns of four heads, */
              {16, 8, 62, 4200}}; /* and 30 of two: 8 chunks of 528 */
    enum { TQ = 3, MAXN = 8 * 4096 * 128 };
    static float kb[MAXN], vb[MAXN], qb[32 * TQ * 128], o16[32 * TQ * 128], o32[32 * TQ * 128];
    static uint8_t mb[4224]; /* the longest Tk below */
    for (int64_t j = 0; j < (int64_t)sizeof mb; j++)
        mb[j] = j % 5 != 1;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (size_t si = 0; si < sizeof SH / sizeof SH[0]; si++)
        for (int di = 0; di < 2; di++) {
            const attn_dtype dt = DTS[di];
            const int64_t H = SH[si].H, Hkv = SH[si].Hkv, D = SH[si].D, Tk = SH[si].Tk;
            char what[300];
            snprintf(what, sizeof what,
                     "%s cache, H %lld / Hkv %lld, D %lld, %lld keys (the float32 layout): its "
                     "float32 output has the bits of a float32 cache of the widened keys and "
                     "values and both are within 1e-5 of a float64 oracle, 1 and 3 query rows, three "
                     "sets of options, every path, 2 threads",
                     attn_dtype_name(dt), (long long)H, (long long)Hkv, (long long)D,
                     (long long)Tk);
            TEST(what);
            const int64_t n = Hkv * Tk * D;
            tu_fill(kb, n, 500 + si);
            tu_fill(vb, n, 600 + si);
            for (int64_t i = 0; i < n; i++) { /* the values a 16-bit cache holds */
                kb[i] = widen(dt, round_to(dt, kb[i]));
                vb[i] = widen(dt, round_to(dt, vb[i]));
            }
            attn_kv_cache *c16 = make_cache(&ctx, 1, Hkv, Tk, D, 0, dt);
            attn_kv_cache *c32 = make_cache(&ctx, 1, Hkv, Tk, D, 0, ATTN_DTYPE_F32);
            attn_tensor k = tu_tensor4(kb, 1, Hkv, Tk, D), v = tu_tensor4(vb, 1, Hkv, Tk, D);
            CHECK_INT(attn_kv_cache_append(&ctx, c16, 0, &k, &v, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_append(&ctx, c32, 0, &k, &v, NULL), ATTN_OK);
            tu_fill(qb, H * TQ * D, 700 + si);
            const int64_t mshape[4] = {1, 1, 1, Tk};
            attn_tensor mt;
            attn_tensor_init(NULL, &mt, ATTN_DTYPE_BOOL, mb, 4, mshape);
            int64_t bad = 0;
            double worst = 0.0;
            for (int tq = 1; tq <= TQ; tq += TQ - 1)
                for (int opt = 0; opt < 3; opt++) {
                    attn_tensor q = tu_tensor4(qb, 1, H, tq, D), a = tu_tensor4(o16, 1, H, tq, D),
                                b = tu_tensor4(o32, 1, H, tq, D);
                    attn_sdpa_params p;
                    attn_sdpa_params_init(&p);
                    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                    if (opt == 1) { /* a window and softcap */
                        p.has_window = 1;
                        p.window_left = 700;
                        p.window_right = -1;
                        p.softcap = 15.0f;
                    }
                    if (opt == 2) /* a mask: no quads or pairs in phase 3 */
                        p.mask = &mt;
                    /* The float64 oracle of one output row: (h, i) = (H - 1, tq - 1). */
                    const int64_t h = H - 1, i = tq - 1, kvh = h / (H / Hkv), ip = Tk - tq + i;
                    const float *qr = qb + (h * tq + i) * D;
                    double m = -INFINITY, l = 0.0, ref[128] = {0};
                    for (int pass = 0; pass < 2; pass++)
                        for (int64_t j = 0; j < Tk; j++) {
                            if (j > ip || (opt == 1 && j < ip - 700) || (opt == 2 && !mb[j]))
                                continue;
                            double sc = 0.0;
                            for (int64_t d = 0; d < D; d++)
                                sc += (double)qr[d] * kb[(kvh * Tk + j) * D + d];
                            sc /= sqrt((double)D);
                            if (opt == 1)
                                sc = 15.0 * tanh(sc / 15.0);
                            if (pass == 0) {
                                m = sc > m ? sc : m;
                                continue;
                            }
                            const double w = exp(sc - m);
                            l += w;
                            for (int64_t d = 0; d < D; d++)
                                ref[d] += w * vb[(kvh * Tk + j) * D + d];
                        }
                    for (size_t pi = 1; pi < N_PATHS; pi++) {
                        if (!attn_arch_supported(PATHS[pi].arch))
                            continue;
                        ctx.impl = PATHS[pi].impl;
                        ctx.arch = PATHS[pi].arch;
                        /* 2 threads: the batch tests above cover 1 against 2. */
                        for (int threads = 2; threads <= 2; threads++) {
                            ctx.threads = threads;
                            CHECK_INT(attn_kv_cache_attend(&ctx, c16, 0, &q, &p, NULL, &a, NULL), ATTN_OK);
                            CHECK_INT(attn_kv_cache_attend(&ctx, c32, 0, &q, &p, NULL, &b, NULL), ATTN_OK);
                            const int64_t nb = diff_bytes(&a, &b);
                            double err = 0.0;
                            for (int64_t d = 0; d < D; d++) {
                                const double e = fabs(o16[(h * tq + i) * D + d] - ref[d] / l),
                                             e32 = fabs(o32[(h * tq + i) * D + d] - ref[d] / l);
                                err = e > err || e != e ? e : err;
                                err = e32 > err || e32 != e32 ? e32 : err;
                            }
                            if (nb || !(err <= 1e-5))
                                fprintf(stderr, "   %s, %d threads, %d rows, options %d: %lld of %lld "
                                        "differ; error %g against the oracle\n",
                                        PATHS[pi].name, threads, tq, opt, (long long)nb,
                                        (long long)(H * tq * D), err);
                            bad += nb;
                            worst = err > worst || err != err ? err : worst;
                        }
                    }
                    ctx.impl = ATTN_IMPL_AUTO;
                    ctx.arch = ATTN_ARCH_AUTO;
                    ctx.threads = 0;
                }
            CHECK_INT(bad, 0);
            CHECK(worst <= 1e-5);
            attn_kv_cache_free(&ctx, c16);
            attn_kv_cache_free(&ctx, c32);
        }
    attn_ctx_release(&ctx);
}

/* One sequence's call of more than 8 query rows (the tile path) on a 16-bit cache:
 * since issue 16's second session each (b, key/value head) is widened by the item
 * that runs its group's query tiles (half_head_item in src/kernels/sdpa_fused.c;
 * split in parts across the workers where the heads are fewer than the threads),
 * not all of K and V first. Widening is exact and no sum changes its order, so a
 * float32 out must have the bits of a float32 cache holding the widened keys and
 * values (what the old whole copy gave), and a 16-bit out those bits rounded once;
 * on GQA 8/2, one key/value head for three query heads (parts), 9 and 70 rows,
 * plain, RoPE, and a window with softcap, a mask and lse, every fused path, 1, 2
 * and 3 threads. */
static void test_single_tile(void)
{
    static const struct {
        int64_t H, Hkv, D, Tk;
    } SH[] = {{8, 2, 40, 200}, /* groups of four, two heads for 2 and 3 threads */
              {3, 1, 18, 113}, /* one key/value head: its tiles dealt out in parts */
              {1, 1, 64, 331}};
    enum { TQ = 70, MAXN = 2 * 331 * 64 };
    static float kb[MAXN], vb[MAXN], qb[8 * TQ * 64], o32[8 * TQ * 64], l32[8 * TQ],
        l16[8 * TQ];
    static uint8_t mb[331];
    for (int64_t j = 0; j < (int64_t)sizeof mb; j++)
        mb[j] = j % 7 != 3;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (size_t si = 0; si < sizeof SH / sizeof SH[0]; si++)
        for (int di = 0; di < 2; di++) {
            const attn_dtype dt = DTS[di];
            const int64_t H = SH[si].H, Hkv = SH[si].Hkv, D = SH[si].D, Tk = SH[si].Tk;
            char what[360];
            snprintf(what, sizeof what,
                     "%s cache, one sequence, H %lld / Hkv %lld, D %lld, %lld keys, 9 and 70 "
                     "query rows (the tile path, each key/value head widened by its own "
                     "items): a float32 out has the bits of a float32 cache of the widened "
                     "values and a 16-bit out those bits rounded, with lse's bits, three sets "
                     "of options, every fused path, 1, 2 and 3 threads",
                     attn_dtype_name(dt), (long long)H, (long long)Hkv, (long long)D,
                     (long long)Tk);
            TEST(what);
            const int64_t n = Hkv * Tk * D;
            tu_fill(kb, n, 1500 + si);
            tu_fill(vb, n, 1600 + si);
            tu_fill(qb, H * TQ * D, 1700 + si);
            for (int64_t i = 0; i < n; i++) { /* the values a 16-bit cache holds */
                kb[i] = widen(dt, round_to(dt, kb[i]));
                vb[i] = widen(dt, round_to(dt, vb[i]));
            }
            for (int64_t i = 0; i < H * TQ * D; i++) /* and a 16-bit q */
                qb[i] = widen(dt, round_to(dt, qb[i]));
            attn_kv_cache *c16 = make_cache(&ctx, 1, Hkv, Tk, D, 0, dt);
            attn_kv_cache *c32 = make_cache(&ctx, 1, Hkv, Tk, D, 0, ATTN_DTYPE_F32);
            attn_tensor k = tu_tensor4(kb, 1, Hkv, Tk, D), v = tu_tensor4(vb, 1, Hkv, Tk, D);
            CHECK_INT(attn_kv_cache_append(&ctx, c16, 0, &k, &v, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_append(&ctx, c32, 0, &k, &v, NULL), ATTN_OK);
            const int64_t mshape[4] = {1, 1, 1, Tk};
            attn_tensor mt;
            attn_tensor_init(NULL, &mt, ATTN_DTYPE_BOOL, mb, 4, mshape);
            int64_t bad = 0, runs = 0;
            for (int tq = 9; tq <= TQ; tq += TQ - 9)
                for (int opt = 0; opt < 3; opt++)
                    for (int f32io = 0; f32io < 2; f32io++) {
                        const attn_dtype iot = f32io ? ATTN_DTYPE_F32 : dt;
                        attn_tensor q32 = tu_tensor4(qb, 1, H, tq, D),
                                    b = tu_tensor4(o32, 1, H, tq, D), q, a, br;
                        attn_tensor lb = tu_tensor3(l32, 1, H, tq), la = tu_tensor3(l16, 1, H, tq);
                        CHECK_INT(copy_as(&ctx, &q32, iot, &q), ATTN_OK);
                        CHECK_INT(attn_tensor_alloc(&ctx, &a, iot, 4, q.shape), ATTN_OK);
                        CHECK_INT(attn_tensor_alloc(&ctx, &br, iot, 4, q.shape), ATTN_OK);
                        attn_sdpa_params p;
                        attn_sdpa_params_init(&p);
                        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                        attn_rope_params rope;
                        attn_rope_params_init(&rope);
                        const attn_rope_params *rp = opt == 1 ? &rope : NULL;
                        if (opt == 2) {
                            p.has_window = 1;
                            p.window_left = 40;
                            p.window_right = -1;
                            p.softcap = 20.0f;
                            p.mask = &mt;
                        }
                        for (size_t pi = 1; pi < N_PATHS; pi++) {
                            /* bfloat16 on these two runs their own bfloat16 kernel. */
                            if (!attn_arch_supported(PATHS[pi].arch) ||
                                (dt == ATTN_DTYPE_BF16 &&
                                 (PATHS[pi].arch == ATTN_ARCH_AVX512_BF16 ||
                                  PATHS[pi].arch == ATTN_ARCH_AMX)))
                                continue;
                            ctx.impl = PATHS[pi].impl;
                            ctx.arch = PATHS[pi].arch;
                            for (int threads = 1; threads <= 3; threads++) {
                                ctx.threads = threads;
                                p.lse = opt == 2 ? &lb : NULL;
                                CHECK_INT(attn_kv_cache_attend(&ctx, c32, 0, &q32, &p, rp, &b, NULL),
                                          ATTN_OK);
                                p.lse = opt == 2 ? &la : NULL;
                                CHECK_INT(attn_kv_cache_attend(&ctx, c16, 0, &q, &p, rp, &a, NULL),
                                          ATTN_OK);
                                /* The float32 result in out's dtype: itself, or rounded. */
                                CHECK_INT(attn_tensor_convert(&ctx, &b, &br), ATTN_OK);
                                const int64_t nb = diff_bytes(&a, &br) +
                                                   (opt == 2 ? diff_bytes(&la, &lb) : 0);
                                if (nb)
                                    fprintf(stderr, "   %s, %d threads, %d rows, options %d, %s "
                                            "q/out: %lld values differ\n",
                                            PATHS[pi].name, threads, tq, opt,
                                            f32io ? "float32" : "16-bit", (long long)nb);
                                bad += nb;
                                runs++;
                            }
                        }
                        ctx.impl = ATTN_IMPL_AUTO;
                        ctx.arch = ATTN_ARCH_AUTO;
                        ctx.threads = 0;
                        attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &a),
                            attn_tensor_free(&ctx, &br);
                    }
            CHECK_INT(bad, 0);
            CHECK(runs > 0);
            attn_kv_cache_free(&ctx, c16);
            attn_kv_cache_free(&ctx, c32);
        }
    attn_ctx_release(&ctx);
}

/* The class of x: 0 finite, 1 NaN, 2 +inf, 3 -inf. */
static int value_class(float x)
{
    return x != x ? 1 : x == INFINITY ? 2 : x == -INFINITY ? 3 : 0;
}

/* Non-finite keys and values through the batch: a NaN key (sequence 1, key/value
 * head 0, key 1000, in a half-chunk that AVX-512's items, and AVX2's for
 * bfloat16, widen in registers) and an inf value (sequence 0, key/value head 1,
 * key 5, in an unsplit call): each
 * element of the batched output has the reference's class (a NaN or an inf
 * reaches exactly the rows whose softmax includes it) and the finite ones the
 * bits of each sequence attended on its own. */
static void test_batch_nonfinite(void)
{
    enum { B = 2, H = 8, HKV = 2, CAP = 2100, D = 64 };
    static const int64_t len[B] = {300, 2100};
    static float kb[HKV * CAP * D], vb[HKV * CAP * D], qb[B * H * D], oa[B * H * D],
        o1[B * H * D], orf[B * H * D];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = DTS[di];
        char what[240];
        snprintf(what, sizeof what,
                 "%s cache, a batch with a NaN key and an inf value: every output has the "
                 "reference's class, and the bits of each sequence's own attend, every path, "
                 "1 and 2 threads",
                 attn_dtype_name(dt));
        TEST(what);
        attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
        for (int64_t b = 0; b < B; b++) {
            tu_fill(kb, HKV * len[b] * D, 800 + (uint64_t)b);
            tu_fill(vb, HKV * len[b] * D, 900 + (uint64_t)b);
            if (b == 1)
                kb[(0 * len[b] + 1000) * D + 7] = NAN;
            else
                vb[(1 * len[b] + 5) * D + 3] = INFINITY;
            attn_tensor k = tu_tensor4(kb, 1, HKV, len[b], D), v = tu_tensor4(vb, 1, HKV, len[b], D);
            CHECK_INT(attn_kv_cache_append(&ctx, c, b, &k, &v, NULL), ATTN_OK);
        }
        tu_fill(qb, B * H * D, 11);
        attn_tensor q = tu_tensor4(qb, B, H, 1, D), a = tu_tensor4(oa, B, H, 1, D),
                    r = tu_tensor4(orf, B, H, 1, D);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        ctx.impl = ATTN_IMPL_REF;
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &q, &p, NULL, &r, NULL), ATTN_OK);
        int64_t nonfinite = 0;
        for (int64_t e = 0; e < B * H * D; e++)
            nonfinite += value_class(orf[e]) != 0;
        /* Every column of heads 0-3 of sequence 1 (the NaN key), column 3 of heads
         * 4-7 of sequence 0 (the inf value). */
        CHECK_INT(nonfinite, 4 * D + 4);
        int64_t bad = 0;
        for (size_t pi = 1; pi < N_PATHS; pi++) {
            if (!attn_arch_supported(PATHS[pi].arch))
                continue;
            ctx.impl = PATHS[pi].impl;
            ctx.arch = PATHS[pi].arch;
            for (int threads = 1; threads <= 2; threads++) {
                ctx.threads = threads;
                CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &q, &p, NULL, &a, NULL), ATTN_OK);
                for (int64_t b = 0; b < B; b++) {
                    attn_tensor qv, ov, o1t = tu_tensor4(o1, B, H, 1, D);
                    attn_tensor_narrow(&ctx, &q, 0, b, 1, &qv);
                    attn_tensor_narrow(&ctx, &o1t, 0, b, 1, &ov);
                    CHECK_INT(attn_kv_cache_attend(&ctx, c, b, &qv, &p, NULL, &ov, NULL), ATTN_OK);
                }
                int64_t n = 0;
                for (int64_t e = 0; e < B * H * D; e++)
                    n += value_class(oa[e]) != value_class(orf[e]) ||
                         (value_class(oa[e]) == 0 && memcmp(&oa[e], &o1[e], sizeof oa[e]) != 0) ||
                         value_class(oa[e]) != value_class(o1[e]);
                if (n)
                    fprintf(stderr, "   %s, %d threads: %lld of %d outputs differ\n",
                            PATHS[pi].name, threads, (long long)n, B * H * D);
                bad += n;
            }
        }
        CHECK_INT(bad, 0);
        ctx.impl = ATTN_IMPL_AUTO;
        ctx.arch = ATTN_ARCH_AUTO;
        ctx.threads = 0;
        attn_kv_cache_free(&ctx, c);
    }
    attn_ctx_release(&ctx);
}

/* A decoding loop over a batch whose lengths cross the 16-bit row path's layouts
 * (unsplit below 512 keys, split by the float32 rule, split in half-chunks from
 * 1024 at D = 64) during the steps: the workspace sized at the first step serves
 * every later one, in one parallel job (the batch path). */
/* Plans the cache's attend of q into o with p, gives ctx a workspace of exactly
 * that size and an allocator that counts into *count instead of allocating;
 * returns the workspace (for end_counted_steps). */
static void *begin_counted_steps(attn_ctx *ctx, const attn_kv_cache *c, const attn_tensor *q,
                                 const attn_sdpa_params *p, const attn_tensor *o,
                                 tu_counting *count, attn_allocator *orig)
{
    size_t bytes = 0;
    CHECK_INT(attn_kv_cache_workspace_size(ctx, c, 0, q, p, NULL, o, NULL, &bytes), ATTN_OK);
    /* The planned bytes, rounded up to the multiple of 64 aligned_alloc wants:
     * under AddressSanitizer a write past them fails the test. */
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    ctx->workspace = ws;
    ctx->workspace_size = bytes;
    *count = (tu_counting){0};
    *orig = ctx->allocator;
    ctx->allocator.alloc = tu_count_alloc;
    ctx->allocator.free = tu_count_free;
    ctx->allocator.user = count;
    return ws;
}

/* Gives ctx back its own allocator and no workspace, and frees ws. */
static void end_counted_steps(attn_ctx *ctx, const attn_allocator *orig, void *ws)
{
    ctx->workspace = NULL;
    ctx->workspace_size = 0;
    ctx->allocator = *orig;
    free(ws);
}

static void test_loop_batch(void)
{
    enum { B = 3, H = 4, HKV = 2, CAP = 1100, D = 64, STEPS = 12 };
    static const int64_t pre[B] = {505, 1017, 60};
    static float kb[B * HKV * CAP * D], qb[B * H * D];
    for (int i = 0; i < 2; i++) {
        const attn_dtype dt = DTS[i];
        char what[200];
        snprintf(what, sizeof what,
                 "%s cache, a batch of 505, 1017 and 60 keys growing past 512 and 1024: "
                 "attn_kv_cache_workspace_size bytes at the first step serve every step, "
                 "no allocation, every fused path, 1 and 2 threads",
                 attn_dtype_name(dt));
        TEST(what);
        for (size_t pi = 1; pi < N_PATHS; pi++)
            for (int threads = 1; threads <= 2; threads++) {
                if (!attn_arch_supported(PATHS[pi].arch))
                    continue;
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.threads = threads;
                ctx.impl = PATHS[pi].impl;
                ctx.arch = PATHS[pi].arch;
                attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
                for (int64_t b = 0; b < B; b++) {
                    tu_fill(kb, HKV * pre[b] * D, 70 + (uint64_t)b);
                    attn_tensor kp = tu_tensor4(kb, 1, HKV, pre[b], D);
                    CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kp, &kp, NULL), ATTN_OK);
                }
                tu_fill(qb, B * H * D, 6);
                attn_tensor q = tu_tensor4(qb, B, H, 1, D), qh, oh;
                CHECK_INT(copy_as(&ctx, &q, dt, &qh), ATTN_OK);
                CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, qh.shape), ATTN_OK);
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                tu_counting count;
                attn_allocator orig;
                void *ws = begin_counted_steps(&ctx, c, &qh, &p, &oh, &count, &orig);
                for (int st = 0; st < STEPS; st++) {
                    tu_fill(kb, B * HKV * D, 80 + (uint64_t)st);
                    attn_tensor k = tu_tensor4(kb, B, HKV, 1, D);
                    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &k, NULL), ATTN_OK);
                    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, NULL, &oh, NULL), ATTN_OK);
                }
                if (count.allocs)
                    fprintf(stderr, "   %s, %d threads: %lld allocations\n", PATHS[pi].name, threads,
                            (long long)count.allocs);
                CHECK_INT(count.allocs, 0);
                end_counted_steps(&ctx, &orig, ws);
                attn_kv_cache_free(&ctx, c);
                attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &oh);
                attn_ctx_release(&ctx);
            }
    }
}

static void test_loop(void)
{
    enum { B = 2, H = 4, HKV = 2, CAP = 600, D = 64, STEPS = 6 };
    static float kb[B * HKV * D], vb[B * HKV * D], qb[B * H * D], pre[B * HKV * 590 * D];
    for (int i = 0; i < 2; i++) {
        const attn_dtype dt = DTS[i];
        char what[200];
        snprintf(what, sizeof what,
                 "%s cache: a decoding loop with attn_kv_cache_workspace_size bytes of "
                 "workspace allocates nothing per step",
                 attn_dtype_name(dt));
        TEST(what);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.threads = 2;
        attn_kv_cache *c = make_cache(&ctx, B, HKV, CAP, D, 0, dt);
        tu_fill(pre, B * HKV * 590 * D, 5);
        attn_tensor kp = tu_tensor4(pre, B, HKV, 590, D);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kp, &kp, NULL), ATTN_OK);
        tu_fill(qb, B * H * D, 6);
        attn_tensor q = tu_tensor4(qb, B, H, 1, D), qh, oh;
        CHECK_INT(copy_as(&ctx, &q, dt, &qh), ATTN_OK);
        CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, qh.shape), ATTN_OK);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        tu_counting count;
        attn_allocator orig;
        void *ws = begin_counted_steps(&ctx, c, &qh, &p, &oh, &count, &orig);
        for (int st = 0; st < STEPS; st++) {
            tu_fill(kb, B * HKV * D, 50 + (uint64_t)st);
            tu_fill(vb, B * HKV * D, 60 + (uint64_t)st);
            attn_tensor k = tu_tensor4(kb, B, HKV, 1, D), v = tu_tensor4(vb, B, HKV, 1, D);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &v, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, NULL, &oh, NULL), ATTN_OK);
        }
        CHECK_INT(count.allocs, 0);
        end_counted_steps(&ctx, &orig, ws);
        attn_kv_cache_free(&ctx, c);
        attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &oh);
        attn_ctx_release(&ctx);
    }
}

int main(void)
{
    for (size_t pi = 0; pi < N_PATHS; pi++)
        if (!attn_arch_supported(PATHS[pi].arch))
            fprintf(stderr, "-- skipped: the %s path (this CPU or OS cannot run it)\n",
                    PATHS[pi].name);
    test_config();
    test_append();
    test_rope_append();
    test_golden();
    test_batch();
    test_batch_split();
    test_batch_tile();
    test_widen_bits();
    test_single_tile();
    test_batch_nonfinite();
    test_loop();
    test_loop_batch();
    return check_summary("test_kv_half");
}
