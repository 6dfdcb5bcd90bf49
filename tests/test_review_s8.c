/*
 * test_review_s8.c - the review of the day's changes, by differential checks: the
 * same values in two layouts must give the same bits, and the bytes an output view
 * does not own must keep theirs.
 *
 *   - the float32 forward's tile path reads a PARTIAL key tile's values in place
 *     when they are unit-stride rows of a multiple of the vector, after checking
 *     them for inf/NaN there (fk_check_v): the same values behind a transposed v
 *     (never read in place, always packed) must give the same bits, with -0,
 *     denormals, and inf/NaN on keys the causal alignment, a window or a padding
 *     mask hides from some rows (where the contract keeps those rows finite), on
 *     awkward shapes (Tk below a tile, Dv of 24 and 48, GQA, sinks, bottom-right);
 *   - the 16-bit tile path widens each tile's q rows and rounds its out rows in the
 *     worker's own one-head buffers: q and out as [B, Tq, H, D] views with padded
 *     rows give a contiguous call's bits, leave every padding byte alone, and so
 *     does out = q (the same strided view), with Tq not a multiple of the tile and
 *     one sequence with one key/value head (several items per head); a 16-bit KV
 *     cache's batch of 12-row steps (the tile path's batch items, RoPE, GQA, three
 *     lengths) writes a padded [Bn, Tq, H, Dv] out with the contiguous one's bits
 *     and each sequence's own bits, for a float16 or float32 q;
 *   - the fused backward's write-out (fb_put_block) copies blocks where output rows
 *     are contiguous: dq, dk and dv as views whose heads interleave, or whose rows
 *     are padded, give a contiguous call's bits and leave the padding alone;
 *   - the embedder's contract: 16-bit data at a 2-byte address and a bool mask at
 *     an odd one are taken, float32 at a 2-byte address refused; outputs whose
 *     size-1 axes have stride 0 or any stride are taken, and an output with stride
 *     0 on a longer axis refused.
 *
 * Every instruction set this machine runs, 1, 2 and 3 threads.
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const attn_arch ARCHS[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
#define SENTINEL 0x7E
#define TAIL 256 /* bytes after the last element's row, SENTINEL too */

/* ---- views ------------------------------------------------------------------------ */

/* A 4-D view over its own buffer: `order` lists the logical axes from the
 * outermost in memory to the innermost, the innermost has stride 1 and each row of
 * it `pad` elements of padding after it. Every byte starts as SENTINEL. */
typedef struct view {
    attn_tensor t;
    unsigned char *buf;
    size_t bytes;
} view;

static void view_make(view *v, attn_dtype dt, const int64_t shape[4], const int order[4],
                      int64_t pad)
{
    memset(v, 0, sizeof *v);
    int64_t stride = 1;
    for (int k = 3; k >= 0; k--) {
        const int ax = order[k];
        v->t.stride[ax] = stride;
        stride *= shape[ax] + (k == 3 ? pad : 0);
    }
    v->t.dtype = dt;
    v->t.ndim = 4;
    memcpy(v->t.shape, shape, 4 * sizeof(int64_t));
    v->bytes = (size_t)stride * attn_dtype_size(dt);
    void *p = NULL;
    if (posix_memalign(&p, 64, v->bytes + TAIL) != 0)
        abort();
    v->buf = (unsigned char *)p;
    memset(v->buf, SENTINEL, v->bytes + TAIL);
    v->t.data = v->buf;
}

static const int ROWMAJOR[4] = {0, 1, 2, 3}, BSHD[4] = {0, 2, 1, 3};

static int64_t view_off(const view *v, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 * v->t.stride[0] + i1 * v->t.stride[1] + i2 * v->t.stride[2] + i3 * v->t.stride[3];
}

#define FOR4(t, i0, i1, i2, i3)                                \
    for (int64_t i0 = 0; i0 < (t).shape[0]; i0++)              \
        for (int64_t i1 = 0; i1 < (t).shape[1]; i1++)          \
            for (int64_t i2 = 0; i2 < (t).shape[2]; i2++)      \
                for (int64_t i3 = 0; i3 < (t).shape[3]; i3++)

/* The logical elements of a (float32 or 16-bit) as bits, in row-major order. */
static uint32_t elem_bits(const view *v, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    const int64_t off = view_off(v, i0, i1, i2, i3);
    if (v->t.dtype == ATTN_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, (const float *)v->t.data + off, 4);
        return u;
    }
    return ((const uint16_t *)v->t.data)[off];
}

/* How many logical elements of a and b (same shape) differ in bits; the first one
 * is printed with `what`. */
static int64_t bits_differ(const view *a, const view *b, const char *what)
{
    int64_t n = 0;
    FOR4(a->t, i0, i1, i2, i3)
    {
        const uint32_t x = elem_bits(a, i0, i1, i2, i3), y = elem_bits(b, i0, i1, i2, i3);
        if (x != y && n++ == 0)
            fprintf(stderr, "  %s: first difference at (%lld, %lld, %lld, %lld): 0x%08x vs 0x%08x\n",
                    what, (long long)i0, (long long)i1, (long long)i2, (long long)i3,
                    (unsigned)x, (unsigned)y);
    }
    return n;
}

/* Bytes of v's buffer that no element owns and that no longer hold SENTINEL. */
static int64_t padding_touched(const view *v)
{
    unsigned char *owned = calloc(v->bytes + TAIL, 1);
    const size_t es = attn_dtype_size(v->t.dtype);
    FOR4(v->t, i0, i1, i2, i3)
        memset(owned + (size_t)view_off(v, i0, i1, i2, i3) * es, 1, es);
    int64_t n = 0;
    for (size_t i = 0; i < v->bytes + TAIL; i++)
        n += !owned[i] && v->buf[i] != SENTINEL;
    free(owned);
    return n;
}

/* Fills v's elements from f (row-major float32 of v's shape), converted. */
static void view_fill(view *v, const float *f)
{
    attn_tensor src = tu_tensor4((float *)(uintptr_t)f, v->t.shape[0], v->t.shape[1],
                                 v->t.shape[2], v->t.shape[3]);
    if (attn_tensor_convert(NULL, &src, &v->t) != ATTN_OK)
        abort();
}

static void view_free(view *v) { free(v->buf); }

static int64_t prod4(const int64_t s[4]) { return s[0] * s[1] * s[2] * s[3]; }

static float *randn(int64_t n, uint64_t seed)
{
    float *p = malloc((size_t)n * sizeof(float));
    tu_fill(p, n, seed);
    return p;
}

static attn_ctx make_ctx(attn_arch arch, int threads)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_FUSED;
    ctx.arch = arch;
    ctx.threads = threads;
    return ctx;
}

/* ---- the float32 tile path: values in place or packed ------------------------- */

typedef struct fproblem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal;          /* attn_causal */
    int64_t wl, wr;      /* a window when wl >= -1 and has_window */
    int has_window;
    int pad_mask;        /* a padding mask [B, 1, 1, Tk] hiding keys 3 and Tk - 2 */
    int sinks;
    int nonfinite;       /* inf and NaN values on hidden keys */
} fproblem;

/* Writes special values into v (row-major [B, Hkv, Tk, Dv]): -0 and denormals on
 * every key's first entries, and with nonfinite, NaN and inf on keys that some
 * rows do not see (the last key under the causal alignment, the window's first
 * keys, the padding mask's keys). */
static void specials(const fproblem *p, float *v)
{
    for (int64_t bh = 0; bh < p->B * p->Hkv; bh++)
        for (int64_t j = 0; j < p->Tk; j++) {
            float *row = v + (bh * p->Tk + j) * p->Dv;
            row[0] = -0.0f;
            row[p->Dv - 1] = (j % 2) ? 1e-40f : -1.4e-45f;
            if (!p->nonfinite)
                continue;
            if (p->pad_mask && (j == 3 || j == p->Tk - 2))
                row[1] = j == 3 ? NAN : -INFINITY;
            if ((p->causal || p->has_window) && j == p->Tk - 1)
                row[p->Dv / 2] = NAN;
            if (p->has_window && j == 0)
                row[2] = INFINITY;
        }
}

static int run_f32(const fproblem *p, attn_arch arch, int threads, const view *q, const view *k,
                   const view *v, view *out, int ref)
{
    attn_ctx ctx = make_ctx(arch, threads);
    if (ref)
        ctx.impl = ATTN_IMPL_REF;
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.causal = p->causal;
    prm.has_window = p->has_window;
    prm.window_left = p->wl;
    prm.window_right = p->wr;
    prm.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    uint8_t *mb = NULL;
    float sk[8];
    attn_tensor mask, sinks;
    if (p->pad_mask) {
        mb = malloc((size_t)(p->B * p->Tk));
        for (int64_t i = 0; i < p->B * p->Tk; i++)
            mb[i] = !(i % p->Tk == 3 || i % p->Tk == p->Tk - 2);
        const int64_t ms[4] = {p->B, 1, 1, p->Tk};
        attn_tensor_init(NULL, &mask, ATTN_DTYPE_BOOL, mb, 4, ms);
        prm.mask = &mask;
    }
    if (p->sinks) {
        for (int64_t h = 0; h < p->H; h++)
            sk[h] = h % 2 ? -1.5f : 2.0f;
        const int64_t ss[1] = {p->H};
        attn_tensor_init(NULL, &sinks, ATTN_DTYPE_F32, sk, 1, ss);
        prm.sinks = &sinks;
    }
    const int rc = attn_sdpa(&ctx, &q->t, &k->t, &v->t, &prm, &out->t, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "  attn_sdpa: %s\n", ctx.message);
    free(mb);
    attn_ctx_release(&ctx);
    return rc;
}

static void test_tile_values_in_place(void)
{
    const fproblem P[] = {
        /* B H Hkv Tq Tk D Dv causal wl wr win pad sinks nonfinite */
        {1, 2, 1, 113, 113, 16, 64, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 1},
        {2, 4, 2, 65, 130, 32, 32, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 1, 0, 1},
        {2, 2, 1, 70, 17, 8, 16, ATTN_CAUSAL_NONE, 0, 0, 0, 1, 0, 1},
        {1, 2, 1, 113, 200, 16, 48, ATTN_CAUSAL_BOTTOM_RIGHT, 31, 0, 1, 0, 1, 1},
        {1, 3, 3, 65, 65, 16, 24, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 1, 1, 1},
        {1, 2, 2, 40, 96, 16, 32, ATTN_CAUSAL_NONE, 20, 20, 1, 0, 0, 1},
        {1, 2, 1, 17, 64, 16, 16, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0},
    };
    const int np = (int)(sizeof P / sizeof P[0]);
    const int VT[4] = {0, 1, 3, 2}; /* v stored [B, Hkv, Dv, Tk]: its last stride is Tk */
    for (int pi = 0; pi < np; pi++) {
        const fproblem *p = &P[pi];
        const int64_t sq[4] = {p->B, p->H, p->Tq, p->D}, sk[4] = {p->B, p->Hkv, p->Tk, p->D};
        const int64_t sv[4] = {p->B, p->Hkv, p->Tk, p->Dv}, so[4] = {p->B, p->H, p->Tq, p->Dv};
        float *fq = randn(prod4(sq), 11 + pi), *fk = randn(prod4(sk), 23 + pi);
        float *fv = randn(prod4(sv), 37 + pi);
        specials(p, fv);
        view q, k, v, vt, ref;
        view_make(&q, ATTN_DTYPE_F32, sq, ROWMAJOR, 0);
        view_make(&k, ATTN_DTYPE_F32, sk, ROWMAJOR, 0);
        view_make(&v, ATTN_DTYPE_F32, sv, ROWMAJOR, 0);
        view_make(&vt, ATTN_DTYPE_F32, sv, VT, 0);
        view_make(&ref, ATTN_DTYPE_F32, so, ROWMAJOR, 0);
        view_fill(&q, fq), view_fill(&k, fk), view_fill(&v, fv), view_fill(&vt, fv);
        /* NaN after v's last row: a key tile read in place past Tk without the
         * check (as a FULL one) would show. With the check, such a read is seen
         * only by AddressSanitizer on a buffer that ends at Tk (not this one). */
        memset(v.buf + v.bytes, 0xFF, TAIL);
        CHECK_INT(run_f32(p, ATTN_ARCH_AUTO, 1, &q, &k, &v, &ref, 1), ATTN_OK);
        for (int a = 0; a < 3; a++) {
            if (!attn_arch_supported(ARCHS[a]))
                continue;
            view first;
            view_make(&first, ATTN_DTYPE_F32, so, ROWMAJOR, 0);
            for (int threads = 1; threads <= 3; threads++) {
                view o1, o2;
                view_make(&o1, ATTN_DTYPE_F32, so, ROWMAJOR, 0);
                view_make(&o2, ATTN_DTYPE_F32, so, ROWMAJOR, 0);
                int ok = run_f32(p, ARCHS[a], threads, &q, &k, &v, &o1, 0) == ATTN_OK &&
                         run_f32(p, ARCHS[a], threads, &q, &k, &vt, &o2, 0) == ATTN_OK;
                CHECK(ok);
                char what[160];
                snprintf(what, sizeof what, "problem %d, %s, %d threads: v in place vs packed",
                         pi, attn_arch_name(ARCHS[a]), threads);
                /* Protects: a tile's values read in place (after fk_check_v) give
                 * the bits of the same values packed, whatever they hold. */
                CHECK_INT(bits_differ(&o1, &o2, what), 0);
                if (threads == 1)
                    memcpy(first.buf, o1.buf, o1.bytes);
                snprintf(what, sizeof what, "problem %d, %s: %d threads vs 1", pi,
                         attn_arch_name(ARCHS[a]), threads);
                /* Protects: the same bits for any thread count. */
                CHECK_INT(bits_differ(&o1, &first, what), 0);
                /* Protects: an inf or NaN value reaches exactly the rows that see
                 * its key (the reference's NaN), and a finite row stays near it. */
                int64_t bad = 0;
                const float *x = (const float *)o1.t.data, *y = (const float *)ref.t.data;
                for (int64_t i = 0; i < prod4(so); i++) {
                    const int match = isnan(x[i]) || isnan(y[i]) ? isnan(x[i]) && isnan(y[i])
                                      : isinf(x[i]) || isinf(y[i]) ? x[i] == y[i]
                                      : fabsf(x[i] - y[i]) <= 2e-5f;
                    if (!match && bad++ == 0)
                        fprintf(stderr, "  problem %d, %s, %d threads: out[%lld] %.9g vs the "
                                "reference's %.9g\n", pi, attn_arch_name(ARCHS[a]), threads,
                                (long long)i, (double)x[i], (double)y[i]);
                }
                CHECK_INT(bad, 0);
                view_free(&o1), view_free(&o2);
            }
            view_free(&first);
        }
        view_free(&q), view_free(&k), view_free(&v), view_free(&vt), view_free(&ref);
        free(fq), free(fk), free(fv);
    }
}

/* ---- 16-bit prefill: q and out strided, out = q -------------------------------- */

typedef struct hproblem {
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal;
} hproblem;

static int run_half(const hproblem *p, attn_arch arch, int threads, const view *q, const view *k,
                    const view *v, view *out)
{
    attn_ctx ctx = make_ctx(arch, threads);
    if (arch == ATTN_ARCH_AUTO)
        ctx.impl = ATTN_IMPL_REF;
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.causal = p->causal;
    /* A workspace of exactly the planned size: AddressSanitizer sees a step past it. */
    size_t bytes = 0;
    void *ws = NULL;
    if (attn_sdpa_workspace_size(&ctx, &q->t, &k->t, &v->t, &prm, &out->t, NULL, &bytes) ==
            ATTN_OK && bytes > 0 && posix_memalign(&ws, 64, (bytes + 63) / 64 * 64) == 0) {
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
    }
    const int rc = attn_sdpa(&ctx, &q->t, &k->t, &v->t, &prm, &out->t, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "  attn_sdpa (16-bit): %s\n", ctx.message);
    free(ws);
    attn_ctx_release(&ctx);
    return rc;
}

static void test_half_strided_qo(void)
{
    const hproblem P[] = {
        {1, 2, 1, 113, 113, 16, ATTN_CAUSAL_TOP_LEFT},
        {1, 1, 1, 130, 150, 32, ATTN_CAUSAL_BOTTOM_RIGHT},
        {2, 4, 2, 65, 70, 16, ATTN_CAUSAL_NONE},
        {1, 3, 1, 17, 17, 24, ATTN_CAUSAL_TOP_LEFT},
    };
    const attn_dtype DT[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int pi = 0; pi < (int)(sizeof P / sizeof P[0]); pi++)
        for (int d = 0; d < 2; d++) {
            const hproblem *p = &P[pi];
            const int64_t sq[4] = {p->B, p->H, p->Tq, p->D}, sk[4] = {p->B, p->Hkv, p->Tk, p->D};
            float *fq = randn(prod4(sq), 101 + pi), *fk = randn(prod4(sk), 131 + pi);
            float *fv = randn(prod4(sk), 151 + pi);
            view q, qs, k, v;
            view_make(&q, DT[d], sq, ROWMAJOR, 0);
            view_make(&qs, DT[d], sq, BSHD, 5);
            view_make(&k, DT[d], sk, ROWMAJOR, 0);
            view_make(&v, DT[d], sk, ROWMAJOR, 0);
            view_fill(&q, fq), view_fill(&qs, fq), view_fill(&k, fk), view_fill(&v, fv);
            view ref;
            view_make(&ref, DT[d], sq, ROWMAJOR, 0);
            CHECK_INT(run_half(p, ATTN_ARCH_AUTO, 1, &q, &k, &v, &ref), ATTN_OK);
            /* Two units in the last place of the 16-bit output: each side rounds once
             * from float32 sums in its own order. */
            const double tol = DT[d] == ATTN_DTYPE_BF16 ? 2.0 / 256 : 2.0 / 2048;
            for (int a = 0; a < 3; a++) {
                if (!attn_arch_supported(ARCHS[a]))
                    continue;
                for (int threads = 1; threads <= 3; threads++) {
                    view o, os, qi;
                    view_make(&o, DT[d], sq, ROWMAJOR, 0);
                    view_make(&os, DT[d], sq, BSHD, 3);
                    view_make(&qi, DT[d], sq, BSHD, 5);
                    view_fill(&qi, fq);
                    const int ok = run_half(p, ARCHS[a], threads, &q, &k, &v, &o) == ATTN_OK &&
                                   run_half(p, ARCHS[a], threads, &qs, &k, &v, &os) == ATTN_OK &&
                                   run_half(p, ARCHS[a], threads, &qi, &k, &v, &qi) == ATTN_OK;
                    CHECK(ok);
                    /* Protects: the contiguous call itself is the reference's result
                     * (the differential checks below cannot see a bug both share). */
                    int64_t far = 0;
                    {
                        view o32, r32;
                        view_make(&o32, ATTN_DTYPE_F32, sq, ROWMAJOR, 0);
                        view_make(&r32, ATTN_DTYPE_F32, sq, ROWMAJOR, 0);
                        attn_tensor_convert(NULL, &o.t, &o32.t);
                        attn_tensor_convert(NULL, &ref.t, &r32.t);
                        const float *x = (const float *)o32.t.data, *y = (const float *)r32.t.data;
                        for (int64_t i = 0; i < prod4(sq); i++)
                            if (!(fabs((double)x[i] - y[i]) <= tol * (1.0 + fabs((double)y[i]))) &&
                                far++ == 0)
                                fprintf(stderr, "  problem %d, %s, %s, %d threads: out[%lld] %.6g vs "
                                        "the reference's %.6g\n", pi, attn_dtype_name(DT[d]),
                                        attn_arch_name(ARCHS[a]), threads, (long long)i,
                                        (double)x[i], (double)y[i]);
                        view_free(&o32), view_free(&r32);
                    }
                    CHECK_INT(far, 0);
                    char what[160];
                    snprintf(what, sizeof what, "problem %d, %s, %s, %d threads: q, out [B,Tq,H,D] "
                             "padded vs contiguous", pi, attn_dtype_name(DT[d]),
                             attn_arch_name(ARCHS[a]), threads);
                    /* Protects: each tile's q rows are read, and its out rows written,
                     * through the caller's strides, the rows of that tile only. */
                    CHECK_INT(bits_differ(&os, &o, what), 0);
                    /* Protects: no row or column outside out's elements is written. */
                    CHECK_INT(padding_touched(&os), 0);
                    snprintf(what, sizeof what, "problem %d, %s, %s, %d threads: out = q strided "
                             "vs a separate out", pi, attn_dtype_name(DT[d]),
                             attn_arch_name(ARCHS[a]), threads);
                    /* Protects: out = q in place, strided, reads each q row before its
                     * out row replaces it. */
                    CHECK_INT(bits_differ(&qi, &o, what), 0);
                    CHECK_INT(padding_touched(&qi), 0);
                    view_free(&o), view_free(&os), view_free(&qi);
                }
            }
            view_free(&q), view_free(&qs), view_free(&k), view_free(&v), view_free(&ref);
            free(fq), free(fk), free(fv);
        }
}

/* ---- a 16-bit KV cache's tile-path batch: out strided ------------------------- */

/* Attends q to sequences first .. first + q's batch - 1 of c into out. */
static int kv_attend(attn_kv_cache *c, attn_arch arch, int threads, int64_t first,
                     const attn_tensor *q, attn_tensor *out)
{
    attn_ctx ctx = make_ctx(arch, threads);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    size_t bytes = 0;
    void *ws = NULL;
    if (attn_kv_cache_workspace_size(&ctx, c, first, q, &prm, &rope, out, NULL, &bytes) ==
            ATTN_OK && bytes > 0 && posix_memalign(&ws, 64, (bytes + 63) / 64 * 64) == 0) {
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
    }
    const int rc = attn_kv_cache_attend(&ctx, c, first, q, &prm, &rope, out, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "  attn_kv_cache_attend: %s\n", ctx.message);
    free(ws);
    attn_ctx_release(&ctx);
    return rc;
}

static void test_kv_half_batch_strided_out(void)
{
    const int64_t Bn = 3, H = 4, Hkv = 2, Tq = 12, D = 16, cap = 160;
    const int64_t len[3] = {20, 70, 130};
    attn_kv_cache_config cfg = {Bn, Hkv, cap, D, 0, ATTN_DTYPE_F16};
    attn_kv_cache *c = NULL;
    CHECK_INT(attn_kv_cache_create(NULL, &cfg, NULL, 0, &c), ATTN_OK);
    if (!c)
        return;
    for (int64_t i = 0; i < Bn; i++) {
        float *fk = randn(Hkv * len[i] * D, 301 + i), *fv = randn(Hkv * len[i] * D, 311 + i);
        attn_tensor k = tu_tensor4(fk, 1, Hkv, len[i], D), v = tu_tensor4(fv, 1, Hkv, len[i], D);
        CHECK_INT(attn_kv_cache_append(NULL, c, i, &k, &v, NULL), ATTN_OK);
        free(fk), free(fv);
    }
    const int64_t sq[4] = {Bn, H, Tq, D}, s1[4] = {1, H, Tq, D};
    float *fq = randn(prod4(sq), 321);
    const attn_dtype QDT[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    for (int qd = 0; qd < 2; qd++) {
        view q;
        view_make(&q, QDT[qd], sq, BSHD, 3);
        view_fill(&q, fq);
        for (int a = 0; a < 3; a++) {
            if (!attn_arch_supported(ARCHS[a]))
                continue;
            for (int threads = 1; threads <= 3; threads++) {
                view o, os;
                view_make(&o, ATTN_DTYPE_F16, sq, ROWMAJOR, 0);
                view_make(&os, ATTN_DTYPE_F16, sq, BSHD, 5);
                /* Each out starts with other bytes, so that an element none of the
                 * calls writes shows as a difference. */
                memset(o.buf, 0, o.bytes);
                CHECK_INT(kv_attend(c, ARCHS[a], threads, 0, &q.t, &o.t), ATTN_OK);
                CHECK_INT(kv_attend(c, ARCHS[a], threads, 0, &q.t, &os.t), ATTN_OK);
                char what[160];
                snprintf(what, sizeof what, "KV cache batch, q %s, %s, %d threads: out "
                         "[Bn,Tq,H,Dv] padded vs contiguous", attn_dtype_name(QDT[qd]),
                         attn_arch_name(ARCHS[a]), threads);
                /* Protects: each batch item rounds its tile's rows into the caller's
                 * out through its strides, and writes nothing else. */
                CHECK_INT(bits_differ(&os, &o, what), 0);
                CHECK_INT(padding_touched(&os), 0);
                /* Protects: the batch gives each sequence the bits of its own call. */
                for (int64_t i = 0; i < Bn; i++) {
                    attn_tensor qi = q.t, oi;
                    qi.shape[0] = 1;
                    qi.data = (unsigned char *)q.t.data + i * q.t.stride[0] * attn_dtype_size(QDT[qd]);
                    view one;
                    view_make(&one, ATTN_DTYPE_F16, s1, ROWMAJOR, 0);
                    memset(one.buf, 0xFF, one.bytes);
                    CHECK_INT(kv_attend(c, ARCHS[a], threads, i, &qi, &one.t), ATTN_OK);
                    oi = o.t;
                    oi.shape[0] = 1;
                    oi.data = (uint16_t *)o.t.data + i * o.t.stride[0];
                    view ov = {oi, NULL, 0};
                    snprintf(what, sizeof what, "KV cache, q %s, %s, %d threads: sequence %lld "
                             "alone vs in the batch", attn_dtype_name(QDT[qd]),
                             attn_arch_name(ARCHS[a]), threads, (long long)i);
                    CHECK_INT(bits_differ(&one, &ov, what), 0);
                    view_free(&one);
                }
                view_free(&o), view_free(&os);
            }
        }
        view_free(&q);
    }
    free(fq);
    attn_kv_cache_free(NULL, c);
}

/* ---- the fused backward's write-out -------------------------------------------- */

static void test_backward_views(void)
{
    typedef struct {
        int64_t B, H, Hkv, Tq, Tk, D, Dv;
        int causal;
    } bproblem;
    const bproblem P[] = {
        {2, 4, 2, 65, 70, 16, 32, ATTN_CAUSAL_TOP_LEFT},
        {1, 2, 1, 17, 113, 16, 16, ATTN_CAUSAL_BOTTOM_RIGHT},
        {1, 3, 3, 130, 130, 24, 8, ATTN_CAUSAL_NONE},
    };
    for (int pi = 0; pi < (int)(sizeof P / sizeof P[0]); pi++) {
        const bproblem *p = &P[pi];
        const int64_t sq[4] = {p->B, p->H, p->Tq, p->D}, sk[4] = {p->B, p->Hkv, p->Tk, p->D};
        const int64_t sv[4] = {p->B, p->Hkv, p->Tk, p->Dv}, so[4] = {p->B, p->H, p->Tq, p->Dv};
        float *fq = randn(prod4(sq), 201 + pi), *fk = randn(prod4(sk), 211 + pi);
        float *fv = randn(prod4(sv), 221 + pi), *fd = randn(prod4(so), 231 + pi);
        attn_tensor q = tu_tensor4(fq, sq[0], sq[1], sq[2], sq[3]);
        attn_tensor k = tu_tensor4(fk, sk[0], sk[1], sk[2], sk[3]);
        attn_tensor v = tu_tensor4(fv, sv[0], sv[1], sv[2], sv[3]);
        attn_tensor dout = tu_tensor4(fd, so[0], so[1], so[2], so[3]);
        float *fo = malloc((size_t)prod4(so) * sizeof(float));
        float *fl = malloc((size_t)(p->B * p->H * p->Tq) * sizeof(float));
        attn_tensor out = tu_tensor4(fo, so[0], so[1], so[2], so[3]);
        attn_tensor lse = tu_tensor3(fl, p->B, p->H, p->Tq);
        attn_sdpa_params prm;
        attn_sdpa_params_init(&prm);
        prm.causal = p->causal;
        prm.lse = &lse;
        attn_ctx c0 = make_ctx(ATTN_ARCH_AUTO, 1);
        CHECK_INT(attn_sdpa(&c0, &q, &k, &v, &prm, &out, NULL), ATTN_OK);
        prm.lse = NULL;
        /* Layouts of the gradients: contiguous (the baseline), heads interleaved
         * ([B, T, H, D]: each row contiguous, rows H*D apart), padded rows. */
        /* The reference chain's gradients, for the contiguous call below. */
        view rg[3];
        view_make(&rg[0], ATTN_DTYPE_F32, sq, ROWMAJOR, 0);
        view_make(&rg[1], ATTN_DTYPE_F32, sk, ROWMAJOR, 0);
        view_make(&rg[2], ATTN_DTYPE_F32, sv, ROWMAJOR, 0);
        {
            attn_sdpa_grads gr = {&rg[0].t, &rg[1].t, &rg[2].t, NULL, NULL};
            CHECK_INT(attn_sdpa_backward_ref(&c0, &q, &k, &v, &prm, &out, &lse, &dout, &gr), ATTN_OK);
        }
        const int *orders[3] = {ROWMAJOR, BSHD, ROWMAJOR};
        const int64_t pads[3] = {0, 0, 4};
        for (int a = 0; a < 3; a++) {
            if (!attn_arch_supported(ARCHS[a]))
                continue;
            for (int threads = 1; threads <= 3; threads++) {
                view g[3][3]; /* layout, then dq dk dv */
                for (int l = 0; l < 3; l++) {
                    view_make(&g[l][0], ATTN_DTYPE_F32, sq, orders[l], pads[l]);
                    view_make(&g[l][1], ATTN_DTYPE_F32, sk, orders[l], pads[l]);
                    view_make(&g[l][2], ATTN_DTYPE_F32, sv, orders[l], pads[l]);
                    attn_ctx ctx = make_ctx(ARCHS[a], threads);
                    attn_sdpa_grads gr = {&g[l][0].t, &g[l][1].t, &g[l][2].t, NULL, NULL};
                    const int rc = attn_sdpa_backward(&ctx, &q, &k, &v, &prm, &out, &lse, &dout, &gr);
                    if (rc != ATTN_OK)
                        fprintf(stderr, "  backward: %s\n", ctx.message);
                    CHECK_INT(rc, ATTN_OK);
                    attn_ctx_release(&ctx);
                }
                /* Protects: the contiguous call's gradients are the reference's
                 * (dq and dk scaled, dv not), within float32 sums in another order. */
                for (int w = 0; w < 3; w++) {
                    const float *x = (const float *)g[0][w].t.data, *y = (const float *)rg[w].t.data;
                    const int64_t n = prod4(g[0][w].t.shape);
                    int64_t far = 0;
                    for (int64_t i = 0; i < n; i++)
                        if (!(fabsf(x[i] - y[i]) <= 1e-4f + 1e-3f * fabsf(y[i])) && far++ == 0)
                            fprintf(stderr, "  problem %d, %s, %d threads: %s[%lld] %.9g vs the "
                                    "reference's %.9g\n", pi, attn_arch_name(ARCHS[a]), threads,
                                    w == 0 ? "dq" : w == 1 ? "dk" : "dv", (long long)i,
                                    (double)x[i], (double)y[i]);
                    CHECK_INT(far, 0);
                }
                for (int l = 1; l < 3; l++)
                    for (int w = 0; w < 3; w++) {
                        char what[160];
                        snprintf(what, sizeof what, "problem %d, %s, %d threads, %s in layout %d",
                                 pi, attn_arch_name(ARCHS[a]), threads,
                                 w == 0 ? "dq" : w == 1 ? "dk" : "dv", l);
                        /* Protects: fb_put_block writes through any row stride with
                         * the contiguous call's bits (dq and dk scaled, dv not). */
                        CHECK_INT(bits_differ(&g[l][w], &g[0][w], what), 0);
                        /* Protects: the block copy writes no byte between rows. */
                        CHECK_INT(padding_touched(&g[l][w]), 0);
                    }
                for (int l = 0; l < 3; l++)
                    for (int w = 0; w < 3; w++)
                        view_free(&g[l][w]);
            }
        }
        attn_ctx_release(&c0);
        view_free(&rg[0]), view_free(&rg[1]), view_free(&rg[2]);
        free(fq), free(fk), free(fv), free(fd), free(fo), free(fl);
    }
}

/* ---- the embedder's contract ----------------------------------------------------- */

static void test_contract(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 1;
    const int64_t T = 5, D = 8;
    /* 16-bit arrays at a 2-byte address (not 4): legitimate for their elements. */
    uint16_t *hb = calloc(4 * T * D + 8, sizeof(uint16_t));
    for (int64_t i = 0; i < 4 * T * D + 8; i++)
        hb[i] = 0x3C00; /* 1.0 in float16 */
    const int64_t s4[4] = {1, 1, T, D};
    attn_tensor hq, hk, hv, ho;
    attn_tensor_init(NULL, &hq, ATTN_DTYPE_F16, hb + 1, 4, s4);
    attn_tensor_init(NULL, &hk, ATTN_DTYPE_F16, hb + 1 + T * D, 4, s4);
    attn_tensor_init(NULL, &hv, ATTN_DTYPE_F16, hb + 1 + 2 * T * D, 4, s4);
    attn_tensor_init(NULL, &ho, ATTN_DTYPE_F16, hb + 1 + 3 * T * D, 4, s4);
    int rc = attn_sdpa(&ctx, &hq, &hk, &hv, NULL, &ho, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "  float16 at a 2-byte address: %s\n", ctx.message);
    /* Protects: the alignment check asks for the element's size, not 4 or 64. */
    CHECK_INT(rc, ATTN_OK);

    /* A bool mask at an odd address. */
    float *fb = calloc(4 * T * D + 16, sizeof(float));
    tu_fill(fb, 4 * T * D, 7);
    attn_tensor q = tu_tensor4(fb, 1, 1, T, D), k = tu_tensor4(fb + T * D, 1, 1, T, D);
    attn_tensor v = tu_tensor4(fb + 2 * T * D, 1, 1, T, D);
    attn_tensor o = tu_tensor4(fb + 3 * T * D, 1, 1, T, D);
    unsigned char *mb = calloc((size_t)(T * T + 2), 1);
    memset(mb, 1, (size_t)(T * T + 2));
    attn_tensor mask;
    const int64_t ms[2] = {T, T};
    attn_tensor_init(NULL, &mask, ATTN_DTYPE_BOOL, mb + 1, 2, ms);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.mask = &mask;
    rc = attn_sdpa(&ctx, &q, &k, &v, &prm, &o, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "  a bool mask at an odd address: %s\n", ctx.message);
    /* Protects: a one-byte dtype is aligned anywhere. */
    CHECK_INT(rc, ATTN_OK);

    /* float32 at a 2-byte address is refused, naming the tensor. */
    attn_tensor bad = q;
    bad.data = (unsigned char *)fb + 2;
    rc = attn_sdpa(&ctx, &bad, &k, &v, NULL, &o, NULL);
    CHECK_INT(rc, ATTN_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(ctx.message, "not aligned") != NULL);

    /* Outputs whose size-1 axes have stride 0, or a huge stride, own their memory
     * all the same; lse [1, 1, T] with stride 0 on its size-1 axes too. */
    float lse_buf[8];
    attn_tensor o0 = o, lse;
    o0.stride[0] = 0, o0.stride[1] = 1000000;
    attn_tensor_init(NULL, &lse, ATTN_DTYPE_F32, lse_buf, 3, (const int64_t[3]){1, 1, T});
    lse.stride[0] = 0, lse.stride[1] = 0;
    attn_sdpa_params_init(&prm);
    prm.lse = &lse;
    attn_tensor w;
    float wb[5 * 5 * 2];
    attn_tensor_init(NULL, &w, ATTN_DTYPE_F32, wb, 4, (const int64_t[4]){1, 1, T, T});
    w.stride[0] = 0, w.stride[1] = 7;
    ctx.impl = ATTN_IMPL_REF; /* weights */
    rc = attn_sdpa(&ctx, &q, &k, &v, &prm, &o0, &w);
    if (rc != ATTN_OK)
        fprintf(stderr, "  outputs with odd strides on size-1 axes: %s\n", ctx.message);
    /* Protects: the self-overlap check ignores the axes that add no bytes. */
    CHECK_INT(rc, ATTN_OK);
    ctx.impl = ATTN_IMPL_AUTO;

    /* An out with stride 0 on its T axis writes T rows to one: refused. */
    attn_tensor o1 = o;
    o1.stride[2] = 0;
    rc = attn_sdpa(&ctx, &q, &k, &v, NULL, &o1, NULL);
    CHECK_INT(rc, ATTN_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(ctx.message, "overlaps itself") != NULL);

    attn_ctx_release(&ctx);
    free(hb), free(fb), free(mb);
}

int main(void)
{
    test_contract();
    test_tile_values_in_place();
    test_half_strided_qo();
    test_kv_half_batch_strided_out();
    test_backward_views();
    return check_summary("test_review_s8");
}
