/*
 * test_dim_sweep.c - every head size from 1 to 264 on every kernel path that has code
 * of its own for a tail of the head size.
 *
 * Hand-picked "awkward" sizes (1, 3, 17, 113 ...) miss the switch cases of a
 * kernel's tail: main's row and split-key paths once summed nothing into the last
 * weighted-sum block of exactly NV vectors, so that on AVX-512 Dv 113..127 came out
 * wrong while tests/test_fused_sweep.c and tests/test_review_kernels.c passed. This
 * sweep takes every size instead, in three families of (D, Dv) pairs:
 *
 *   D = Dv = n,   D = 64 with Dv = n,   Dv = 64 with D = n,   for n = 1 .. 264,
 *
 * and runs each pair (792 in all) through
 *   - the float32 forward on the row path (Tq 1..8, a few keys), the split-key path
 *     (Tq 1, 520 keys, which the plan splits in chunks: checked) and the tile path
 *     (Tq 17, Tk 33), with grouped-query heads (groups of 2, 3 and 4; on the split
 *     path 2, 4 and 7) on most pairs;
 *   - the same three shapes with bfloat16 and with float16 q, k, v and out (the
 *     tile shape with 9 query rows);
 *   - every third pair of those through rows padded by 3 elements, NaN in the
 *     inputs' padding, out's padding to be left untouched; every fourth
 *     bottom-right causal;
 *   - a KV cache (float32, bfloat16 or float16 in turn) of two sequences, a few
 *     keys and 520, attended at once: each sequence's bits must be attn_sdpa's on
 *     its views of the cache, and with a 16-bit cache a float32 q holding the same
 *     values and a float32 out must round to the 16-bit out's bits;
 *   - the backward (attn_sdpa_backward) on a 3 x 5 and a 17 x 33 problem (every
 *     fourth pair bottom-right causal);
 *   - attn_linear's GEMM with K = D and N = Dv (and M = 1 .. 20 rows), and the same
 *     bits through a packed weight (attn_linear_pack);
 * on every instruction-set path this machine runs (scalar, avx2, avx512; for
 * bfloat16 also avx512bf16, with vdpbf16ps emulated where the CPU lacks it, and
 * amx where the CPU has it), each with 1 and 2 threads, which must give the same
 * bits. Paths this machine cannot run are announced as skipped.
 *
 * The bounds are the existing sweeps', not new ones:
 *   - float32 forward (tests/test_fused_sweep.c): max |fused - oracle| <= 2 max
 *     |reference - oracle| + 2e-6, against a float64 oracle;
 *   - float32 KV cache: the same, against a bottom-right causal float64 oracle;
 *   - 16-bit forward and KV cache (tests/test_bf16_paths.c): every output within
 *     2^-p (max |v| + |reference's output|) of the reference on the same 16-bit
 *     arrays, p = 8 for bfloat16 and 11 for float16 (one unit of the dtype, the
 *     floor of tests/test_half.c);
 *   - backward (tests/test_fused_backward.c): per gradient, max |fused - oracle| <=
 *     2 max |reference - oracle| + 16 FLT_EPSILON max |oracle of absolute terms|;
 *   - GEMM (tests/test_gemm.c): 2 max |reference - oracle| + 1e-6.
 * Under a sanitizer every seventh pair runs (still every residue of the vector
 * widths over the sweep).
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "half.h"
#include "sdpa_contract.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SWEEP_QUICK CHECK_SANITIZED

#define NMAX 264
#define FLOOR 2e-6 /* tests/test_fused_sweep.c's floor */
#define MAX_REPORTS 30 /* failures printed in full; the rest only counted */

static uint64_t rng_state = 0x6a09e667f3bcc909ull;

static float uni(void) /* uniform in [-1, 1), xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((double)((rng_state * 2685821657736338717ull) >> 40) / 8388608.0 - 1.0);
}

static void fill(float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = uni();
}

static float *fbuf(int64_t n)
{
    return malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
}

static double *dbuf(int64_t n)
{
    return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
}

static int reports = 0;

/* Prints a failure's description while there are few; a sweep gone wrong prints
 * the first MAX_REPORTS and counts the rest through CHECK. */
static void report(const char *what, const char *detail)
{
    if (reports++ < MAX_REPORTS)
        fprintf(stderr, "   %s: %s\n", what, detail);
}

/* ---- Shapes ------------------------------------------------------------------ */

typedef struct shape {
    int64_t H, Hkv, Tq, Tk, D, Dv;
    int64_t pad; /* attn_sdpa's q, k, v and out with rows this many elements apart
                    more than their length (0: contiguous) */
    int causal;  /* attn_sdpa with bottom-right causal (Tq <= Tk here) */
} shape;

enum { PATH_ROW, PATH_SPLIT, PATH_TILE, PATHS };
static const char *const path_names[PATHS] = {"row", "split", "tile"};

/* The i-th (D, Dv) pair of the three families. */
static void pair_of(int i, int64_t *D, int64_t *Dv)
{
    const int64_t n = i % NMAX + 1;
    switch (i / NMAX) {
    case 0:
        *D = *Dv = n;
        break;
    case 1:
        *D = 64, *Dv = n;
        break;
    default:
        *D = n, *Dv = 64;
        break;
    }
}

/* Pair i's problem on a path. Query heads per key/value head cycle through 1, 2, 3
 * and 4 on the row and tile paths, and 1, 2, 4 and 7 on the split-key path, which
 * takes a group's heads four, then two, then one at a time (fused_split.h), so that
 * 7 crosses every boundary; the cycle shifts by one from family to family, so that
 * each size meets three of the group sizes. The row path's key count keeps
 * Tk >= Tq for the KV cache. Every third pair reads and writes attn_sdpa's tensors
 * through rows padded by 3 elements (NaN in the inputs' padding, which a kernel
 * reading past a row's end would carry into the output), and every fourth is
 * bottom-right causal (the tile path's diagonal tiles weigh partly hidden rows). */
static shape shape_of(int path, int i, int64_t D, int64_t Dv)
{
    static const int64_t groups[4][2] = {{2, 2}, {2, 1}, {3, 1}, {4, 1}};
    static const int64_t split_groups[4][2] = {{1, 1}, {2, 1}, {4, 1}, {7, 1}};
    const int g = (i + i / NMAX) % 4;
    shape s = {groups[g][0], groups[g][1], 0, 0, D, Dv, i % 3 == 2 ? 3 : 0, i % 4 == 1};
    switch (path) {
    case PATH_ROW:
        s.Tq = 1 + i % 8;
        s.Tk = s.Tq + (7 * i) % 19;
        break;
    case PATH_SPLIT: /* one (batch, key/value head) pair, 520 keys: two chunks or more */
        s.H = split_groups[g][0], s.Hkv = split_groups[g][1];
        s.Tq = 1;
        s.Tk = 520;
        break;
    default:
        s.Tq = 17;
        s.Tk = 33;
        break;
    }
    return s;
}

static void shape_text(char *buf, size_t size, const char *what, const shape *s,
                       attn_arch arch)
{
    snprintf(buf, size, "%s H=%lld Hkv=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld%s%s arch=%s", what,
             (long long)s->H, (long long)s->Hkv, (long long)s->Tq, (long long)s->Tk,
             (long long)s->D, (long long)s->Dv, s->pad ? " padded rows" : "",
             s->causal ? " causal" : "", attn_arch_name(arch));
}

static attn_tensor tensor4(attn_dtype dt, void *data, int64_t a, int64_t b, int64_t c, int64_t d)
{
    attn_tensor t;
    const int64_t sh[4] = {a, b, c, d};
    attn_tensor_init(NULL, &t, dt, data, 4, sh);
    return t;
}

/* Logical [n, dim] rows (n = heads x tokens) of elem-byte elements copied into
 * storage whose rows are dim + pad elements apart, the padding filled with the
 * bytes of fill (elem bytes); or back out of it. */
static void *padded(const void *src, int64_t n, int64_t dim, int64_t pad, size_t elem,
                    const void *fill)
{
    const int64_t ld = dim + pad;
    unsigned char *st = malloc(elem * (size_t)(n * ld > 0 ? n * ld : 1));
    for (int64_t r = 0; r < n; r++) {
        memcpy(st + elem * (size_t)(r * ld), (const unsigned char *)src + elem * (size_t)(r * dim),
               elem * (size_t)dim);
        for (int64_t e = dim; e < ld; e++)
            memcpy(st + elem * (size_t)(r * ld + e), fill, elem);
    }
    return st;
}

static attn_tensor view4(attn_dtype dt, void *data, int64_t heads, int64_t T, int64_t dim,
                         int64_t pad)
{
    attn_tensor t = tensor4(dt, data, 1, heads, T, dim);
    t.stride[2] = dim + pad, t.stride[1] = T * (dim + pad), t.stride[0] = heads * T * (dim + pad);
    return t;
}

/* One attn_sdpa call on q [1, H, Tq, D], k [1, Hkv, Tk, D], v [1, Hkv, Tk, Dv] and
 * out [1, H, Tq, Dv] of dtype dt, given contiguous; the call sees them through
 * padded rows when s->pad is set (out's padding must come back untouched). With
 * chunks, also the number of key chunks the call's plan splits the keys into (0:
 * not split). */
static int sdpa(attn_dtype dt, const shape *s, const void *q, const void *k, const void *v,
                void *out, attn_impl impl, attn_arch arch, int threads, int64_t *chunks)
{
    const size_t elem = attn_dtype_size(dt);
    const uint32_t nan32 = 0x7fc00000u;
    const uint16_t nan16 = dt == ATTN_DTYPE_BF16 ? 0x7fc0 : 0x7e00, mark[2] = {0x5a5a, 0x5a5a};
    const void *nan = dt == ATTN_DTYPE_F32 ? (const void *)&nan32 : (const void *)&nan16;
    const int64_t pad = s->pad, nq = s->H * s->Tq, nk = s->Hkv * s->Tk;
    void *pq = (void *)q, *pk = (void *)k, *pv = (void *)v, *po = out;
    if (pad) {
        pq = padded(q, nq, s->D, pad, elem, nan);
        pk = padded(k, nk, s->D, pad, elem, nan);
        pv = padded(v, nk, s->Dv, pad, elem, nan);
        po = padded(out, nq, s->Dv, pad, elem, mark);
    }
    attn_tensor tq = view4(dt, pq, s->H, s->Tq, s->D, pad);
    attn_tensor tk = view4(dt, pk, s->Hkv, s->Tk, s->D, pad);
    attn_tensor tv = view4(dt, pv, s->Hkv, s->Tk, s->Dv, pad);
    attn_tensor to = view4(dt, po, s->H, s->Tq, s->Dv, pad);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = s->causal ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    if (chunks) {
        attn__sdpa_shapes sh;
        attn__sdpa_plan plan;
        *chunks = -1;
        if (attn__sdpa_prepare(&ctx, &tq, &tk, &tv, &p, &to, NULL, &sh) == ATTN_OK &&
            attn__sdpa_plan_for_ctx(&ctx, &sh, &plan) == ATTN_OK)
            *chunks = plan.n_chunks;
    }
    const int rc = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "   attn_sdpa: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    if (pad) {
        const unsigned char *st = po;
        int untouched = 1;
        for (int64_t r = 0; r < nq; r++) {
            memcpy((unsigned char *)out + elem * (size_t)(r * s->Dv),
                   st + elem * (size_t)(r * (s->Dv + pad)), elem * (size_t)s->Dv);
            for (int64_t e = s->Dv; e < s->Dv + pad; e++)
                untouched &= memcmp(st + elem * (size_t)(r * (s->Dv + pad) + e), mark, elem) == 0;
        }
        if (!untouched)
            fprintf(stderr, "   out's padding written (%s, H=%lld Tq=%lld Dv=%lld)\n",
                    attn_arch_name(arch), (long long)s->H, (long long)s->Tq, (long long)s->Dv);
        CHECK(untouched);
        free(pq), free(pk), free(pv), free(po);
    }
    return rc;
}

static double max_err(const float *a, const double *o, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - o[i]);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d; /* a NaN fails every bound */
    }
    return e;
}

/* ---- Paths ------------------------------------------------------------------- */

static attn_arch archs[3], archs16[5];
static int n_archs = 0, n_archs16 = 0;

static void find_paths(void)
{
    const attn_arch all[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    const attn_arch half_only[2] = {ATTN_ARCH_AVX512_BF16, ATTN_ARCH_AMX};
    fprintf(stderr, "-- paths on this machine:");
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(all[a])) {
            archs[n_archs++] = all[a];
            archs16[n_archs16++] = all[a];
            fprintf(stderr, " %s", attn_arch_name(all[a]));
        }
    for (int a = 0; a < 2; a++)
        if (attn_arch_supported(half_only[a])) {
            archs16[n_archs16++] = half_only[a];
            fprintf(stderr, " %s (bfloat16 only)", attn_arch_name(half_only[a]));
        }
    fprintf(stderr, "\n");
    for (int a = 0; a < 3; a++)
        if (!attn_arch_supported(all[a]))
            fprintf(stderr, "-- skipped: the %s path: this CPU or build lacks it\n",
                    attn_arch_name(all[a]));
    for (int a = 0; a < 2; a++)
        if (!attn_arch_supported(half_only[a]))
            fprintf(stderr, "-- skipped: the %s path: this CPU, OS or build lacks it\n",
                    attn_arch_name(half_only[a]));
}

/* ---- float32 forward ----------------------------------------------------------- */

typedef struct tally {
    int runs;
    double worst;
    char where[200];
} tally;

static void tally_add(tally *t, double ratio, const char *what)
{
    t->runs++;
    if (ratio > t->worst) {
        t->worst = ratio;
        snprintf(t->where, sizeof t->where, "%s", what);
    }
}

static tally t_f32, t_half[2], t_kv[3], t_bwd, t_gemm;
static int split_runs = 0;

/* The float64 forward: o [H, Tq, Dv] = softmax(q k^T / sqrt(D)) v for contiguous q
 * [H, Tq, D], k [Hkv, Tk, D] and v [Hkv, Tk, Dv]; with causal, bottom-right (query
 * row r sees keys 0 .. r + Tk - Tq). */
static void oracle_fwd(const shape *s, int causal, const float *q, const float *k,
                       const float *v, double *o)
{
    const int64_t D = s->D, Dv = s->Dv;
    const double scale = 1.0 / sqrt((double)D);
    double *sc = dbuf(s->Tk);
    memset(o, 0, sizeof(double) * (size_t)(s->H * s->Tq * Dv));
    for (int64_t h = 0; h < s->H; h++) {
        const int64_t hk = h / (s->H / s->Hkv);
        for (int64_t r = 0; r < s->Tq; r++) {
            const float *qr = q + (h * s->Tq + r) * D;
            const int64_t seen = causal ? r + s->Tk - s->Tq + 1 : s->Tk;
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < seen; j++) {
                double dot = 0.0;
                for (int64_t d = 0; d < D; d++)
                    dot += (double)qr[d] * (double)k[(hk * s->Tk + j) * D + d];
                sc[j] = dot * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int64_t j = 0; j < seen; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            double *orow = o + (h * s->Tq + r) * Dv;
            for (int64_t j = 0; j < seen; j++)
                for (int64_t e = 0; e < Dv; e++)
                    orow[e] += sc[j] / sum * (double)v[(hk * s->Tk + j) * Dv + e];
        }
    }
    free(sc);
}

static void check_f32(int path, int i, int64_t D, int64_t Dv)
{
    const shape s = shape_of(path, i, D, Dv);
    const int64_t nq = s.H * s.Tq * D, nk = s.Hkv * s.Tk * D, nv = s.Hkv * s.Tk * Dv;
    const int64_t no = s.H * s.Tq * Dv;
    float *q = fbuf(nq), *k = fbuf(nk), *v = fbuf(nv);
    float *ref = fbuf(no), *o1 = fbuf(no), *o2 = fbuf(no);
    double *oracle = dbuf(no);
    fill(q, nq), fill(k, nk), fill(v, nv);
    oracle_fwd(&s, s.causal, q, k, v, oracle);
    CHECK_INT(sdpa(ATTN_DTYPE_F32, &s, q, k, v, ref, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, NULL),
              ATTN_OK);
    const double bound = 2.0 * max_err(ref, oracle, no) + FLOOR;
    for (int a = 0; a < n_archs; a++) {
        char what[200], detail[200];
        shape_text(what, sizeof what, path_names[path], &s, archs[a]);
        int64_t chunks = 0;
        for (int64_t x = 0; x < no; x++)
            o1[x] = o2[x] = NAN; /* an element never written fails */
        CHECK_INT(sdpa(ATTN_DTYPE_F32, &s, q, k, v, o1, ATTN_IMPL_FUSED, archs[a], 1,
                       path == PATH_SPLIT ? &chunks : NULL),
                  ATTN_OK);
        CHECK_INT(sdpa(ATTN_DTYPE_F32, &s, q, k, v, o2, ATTN_IMPL_FUSED, archs[a], 2, NULL),
                  ATTN_OK);
        if (path == PATH_SPLIT) {
            if (chunks < 2) {
                snprintf(detail, sizeof detail, "the plan has %lld key chunks, not 2 or more",
                         (long long)chunks);
                report(what, detail);
            }
            CHECK(chunks >= 2);
            split_runs++;
        }
        const double err = max_err(o1, oracle, no);
        if (!(err <= bound)) {
            snprintf(detail, sizeof detail, "error %.3g against the oracle, bound %.3g", err,
                     bound);
            report(what, detail);
        }
        CHECK(err <= bound);
        const int same = memcmp(o1, o2, sizeof(float) * (size_t)no) == 0;
        if (!same)
            report(what, "1 and 2 threads give other bits");
        CHECK(same);
        tally_add(&t_f32, err / bound, what);
    }
    free(q), free(k), free(v), free(ref), free(o1), free(o2), free(oracle);
}

/* ---- 16-bit forward and KV cache ------------------------------------------------ */

static uint16_t narrow(attn_dtype dt, float x)
{
    return dt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(x) : attn__f32_to_f16(x);
}

static float widen(attn_dtype dt, uint16_t h)
{
    return dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
}

static uint16_t *fill16(attn_dtype dt, int64_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        p[i] = narrow(dt, uni());
    return p;
}

/* tests/test_bf16_paths.c's rule: got within 2^-p (vmax + |ref|) of ref, element by
 * element (p = 8 for bfloat16, 11 for float16). Returns the worst error / bound and
 * describes the first element out of bounds in detail (empty when none). */
static double half_rule(attn_dtype dt, const uint16_t *got, const uint16_t *ref, int64_t n,
                        double vmax, char *detail, size_t size)
{
    const int p = dt == ATTN_DTYPE_BF16 ? 8 : 11;
    double worst = 0.0;
    detail[0] = 0;
    for (int64_t x = 0; x < n; x++) {
        const double a = widen(dt, ref[x]), b = widen(dt, got[x]);
        const double e = fabs(a - b), bound = ldexp(vmax + fabs(a), -p);
        if (!(e <= bound)) {
            if (!detail[0])
                snprintf(detail, size, "out[%lld] %.6g, the reference's %.6g", (long long)x, b, a);
            worst = INFINITY;
        } else if (e / bound > worst) {
            worst = e / bound;
        }
    }
    return worst;
}

static double vmax_of(attn_dtype dt, const uint16_t *v, int64_t n)
{
    double m = 0.0;
    for (int64_t x = 0; x < n; x++)
        m = fmax(m, fabs(widen(dt, v[x])));
    return m;
}

/* One 16-bit forward problem on a path: the fused kernel of every path (16-bit
 * ones for bfloat16 only) against the reference on the same arrays. */
static void check_half(attn_dtype dt, int path, int i, int64_t D, int64_t Dv)
{
    shape s = shape_of(path, i, D, Dv);
    if (path == PATH_TILE)
        s.Tq = 9; /* one query row past the row path: half the time of 17 rows */
    const int64_t nq = s.H * s.Tq * D, nk = s.Hkv * s.Tk * D, nv = s.Hkv * s.Tk * Dv;
    const int64_t no = s.H * s.Tq * Dv;
    uint16_t *q = fill16(dt, nq), *k = fill16(dt, nk), *v = fill16(dt, nv);
    uint16_t *ref = malloc(2 * (size_t)no), *o1 = malloc(2 * (size_t)no),
             *o2 = malloc(2 * (size_t)no);
    const double vmax = vmax_of(dt, v, nv);
    tally *t = &t_half[dt == ATTN_DTYPE_BF16 ? 0 : 1];
    CHECK_INT(sdpa(dt, &s, q, k, v, ref, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, NULL), ATTN_OK);
    for (int a = 0; a < n_archs16; a++) {
        if (dt != ATTN_DTYPE_BF16 && a >= n_archs)
            continue;
        /* The scalar path's 16-bit split-key and tile forms widen K and V into
         * float32 and run the scalar float32 kernel, which the float32 part sweeps
         * on these shapes: the row form (and the cache below) keep it, at a third
         * of the time. */
        if (archs16[a] == ATTN_ARCH_SCALAR && path != PATH_ROW)
            continue;
        char what[200], detail[200];
        char name[40];
        snprintf(name, sizeof name, "%s %s", attn_dtype_name(dt), path_names[path]);
        shape_text(what, sizeof what, name, &s, archs16[a]);
        memset(o1, 0xff, 2 * (size_t)no); /* NaN bits in both dtypes */
        memset(o2, 0xff, 2 * (size_t)no);
        int64_t chunks = 0;
        CHECK_INT(sdpa(dt, &s, q, k, v, o1, ATTN_IMPL_FUSED, archs16[a], 1,
                       path == PATH_SPLIT ? &chunks : NULL),
                  ATTN_OK);
        CHECK_INT(sdpa(dt, &s, q, k, v, o2, ATTN_IMPL_FUSED, archs16[a], 2, NULL), ATTN_OK);
        if (path == PATH_SPLIT && chunks < 2) {
            snprintf(detail, sizeof detail, "the plan has %lld key chunks, not 2 or more",
                     (long long)chunks);
            report(what, detail);
        }
        CHECK(path != PATH_SPLIT || chunks >= 2);
        const double worst = half_rule(dt, o1, ref, no, vmax, detail, sizeof detail);
        if (detail[0])
            report(what, detail);
        CHECK(worst <= 1.0);
        const int same = memcmp(o1, o2, 2 * (size_t)no) == 0;
        if (!same)
            report(what, "1 and 2 threads give other bits");
        CHECK(same);
        tally_add(t, worst, what);
    }
    free(q), free(k), free(v), free(ref), free(o1), free(o2);
}

/* ---- KV cache -------------------------------------------------------------------- */

/* A cache of dtype dt holding two sequences: 0 with len[0] keys (a few: the row
 * path), 1 with 520 (the split-key path), attended at once by q [2, H, Tq, D] into
 * out [2, H, Tq, Dv], both in dt (the cache's attend takes 16-bit q and out with a
 * 16-bit cache). The queries are the last Tq positions of each sequence, so the
 * mask is bottom-right causal. */
typedef struct kv_problem {
    attn_dtype dt;
    shape s; /* H, Hkv, Tq, D, Dv; Tk is the capacity, 520 */
    int64_t len[2];
    void *q, *k[2], *v[2]; /* k[b] [1, Hkv, len[b], D], v[b] [1, Hkv, len[b], Dv] */
    float *q32;            /* a 16-bit q widened to float32 */
} kv_problem;

/* Runs kp's attend into out; with solo (not NULL), also attn_sdpa on each
 * sequence's own views of the cache, with the same ctx, into solo. With wide set
 * (a 16-bit cache), q and out are float32 instead: kp->q32 and a float32 out. */
static int kv_run(const kv_problem *kp, void *out, void *solo, attn_impl impl, attn_arch arch,
                  int threads, int wide)
{
    const attn_dtype dt = kp->dt;
    const shape *s = &kp->s;
    const size_t elem = attn_dtype_size(dt);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_kv_cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = 2, cfg.kv_heads = s->Hkv, cfg.capacity = s->Tk;
    cfg.head_dim = s->D, cfg.value_dim = s->Dv, cfg.dtype = dt;
    attn_kv_cache *cache = NULL;
    int rc = attn_kv_cache_create(&ctx, &cfg, NULL, 0, &cache);
    for (int b = 0; b < 2 && rc == ATTN_OK; b++) {
        attn_tensor tk = tensor4(dt, kp->k[b], 1, s->Hkv, kp->len[b], s->D);
        attn_tensor tv = tensor4(dt, kp->v[b], 1, s->Hkv, kp->len[b], s->Dv);
        rc = attn_kv_cache_append(&ctx, cache, b, &tk, &tv, NULL);
    }
    attn_tensor tq = tensor4(wide ? ATTN_DTYPE_F32 : dt, wide ? kp->q32 : kp->q, 2, s->H, s->Tq,
                             s->D);
    attn_tensor to = tensor4(wide ? ATTN_DTYPE_F32 : dt, out, 2, s->H, s->Tq, s->Dv);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT; /* what attend does with the queries at the end */
    if (rc == ATTN_OK)
        rc = attn_kv_cache_attend(&ctx, cache, 0, &tq, &p, NULL, &to, NULL);
    for (int b = 0; solo && b < 2 && rc == ATTN_OK; b++) {
        attn_tensor kview, vview;
        const size_t qo = elem * (size_t)(b * s->H * s->Tq * s->D);
        const size_t oo = elem * (size_t)(b * s->H * s->Tq * s->Dv);
        attn_tensor tqb = tensor4(dt, (unsigned char *)kp->q + qo, 1, s->H, s->Tq, s->D);
        attn_tensor tob = tensor4(dt, (unsigned char *)solo + oo, 1, s->H, s->Tq, s->Dv);
        rc = attn_kv_cache_view(&ctx, cache, b, &kview, &vview);
        if (rc == ATTN_OK)
            rc = attn_sdpa(&ctx, &tqb, &kview, &vview, &p, &tob, NULL);
    }
    if (rc != ATTN_OK)
        fprintf(stderr, "   attn_kv_cache: %s\n", ctx.message);
    attn_kv_cache_free(&ctx, cache);
    attn_ctx_release(&ctx);
    return rc;
}

/* Pair i in a cache of dtype dt: the fused attend of every path against the
 * reference's (float32: within the sweep's bound of a float64 oracle; 16-bit:
 * tests/test_bf16_paths.c's rule), 1 and 2 threads the same bits, and each
 * sequence's bits those of attn_sdpa on its own views. */
static void check_kv(attn_dtype dt, int i, int64_t D, int64_t Dv)
{
    kv_problem kp;
    memset(&kp, 0, sizeof kp);
    kp.dt = dt;
    kp.s = shape_of(PATH_ROW, i, D, Dv);
    kp.s.pad = 0, kp.s.causal = 1; /* what attend applies */
    kp.s.Tq = 1 + i % 3;
    kp.s.Tk = 520;
    kp.len[0] = kp.s.Tq + (7 * i) % 19, kp.len[1] = 520;
    const shape *s = &kp.s;
    const size_t elem = attn_dtype_size(dt);
    const int64_t nq = 2 * s->H * s->Tq * D, no = 2 * s->H * s->Tq * Dv;
    if (dt == ATTN_DTYPE_F32) {
        kp.q = fbuf(nq), fill(kp.q, nq);
        for (int b = 0; b < 2; b++) {
            kp.k[b] = fbuf(s->Hkv * kp.len[b] * D), fill(kp.k[b], s->Hkv * kp.len[b] * D);
            kp.v[b] = fbuf(s->Hkv * kp.len[b] * Dv), fill(kp.v[b], s->Hkv * kp.len[b] * Dv);
        }
    } else {
        kp.q = fill16(dt, nq);
        kp.q32 = fbuf(nq);
        for (int64_t x = 0; x < nq; x++)
            kp.q32[x] = widen(dt, ((const uint16_t *)kp.q)[x]);
        for (int b = 0; b < 2; b++)
            kp.k[b] = fill16(dt, s->Hkv * kp.len[b] * D),
            kp.v[b] = fill16(dt, s->Hkv * kp.len[b] * Dv);
    }
    void *ref = malloc(elem * (size_t)no), *o1 = malloc(elem * (size_t)no);
    void *o2 = malloc(elem * (size_t)no), *solo = malloc(elem * (size_t)no);
    float *o32 = fbuf(no);
    CHECK_INT(kv_run(&kp, ref, NULL, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, 0), ATTN_OK);
    double bound = 0.0, vmax = 0.0, *oracle = NULL;
    if (dt == ATTN_DTYPE_F32) {
        oracle = dbuf(no);
        for (int b = 0; b < 2; b++) {
            shape sb = *s;
            sb.Tk = kp.len[b];
            oracle_fwd(&sb, 1, (const float *)kp.q + b * s->H * s->Tq * D, kp.k[b], kp.v[b],
                       oracle + b * s->H * s->Tq * Dv);
        }
        bound = 2.0 * max_err(ref, oracle, no) + FLOOR;
    } else {
        for (int b = 0; b < 2; b++)
            vmax = fmax(vmax, vmax_of(dt, kp.v[b], s->Hkv * kp.len[b] * Dv));
    }
    tally *t = &t_kv[dt == ATTN_DTYPE_F32 ? 0 : dt == ATTN_DTYPE_BF16 ? 1 : 2];
    const attn_arch *paths = dt == ATTN_DTYPE_BF16 ? archs16 : archs;
    const int n_paths = dt == ATTN_DTYPE_BF16 ? n_archs16 : n_archs;
    for (int a = 0; a < n_paths; a++) {
        char what[200], detail[200], name[60];
        snprintf(name, sizeof name, "%s cache of %lld and 520 keys", attn_dtype_name(dt),
                 (long long)kp.len[0]);
        shape_text(what, sizeof what, name, s, paths[a]);
        memset(o1, 0xff, elem * (size_t)no); /* NaN bits in every dtype */
        memset(o2, 0xff, elem * (size_t)no);
        CHECK_INT(kv_run(&kp, o1, NULL, ATTN_IMPL_FUSED, paths[a], 1, 0), ATTN_OK);
        CHECK_INT(kv_run(&kp, o2, solo, ATTN_IMPL_FUSED, paths[a], 2, 0), ATTN_OK);
        if (dt != ATTN_DTYPE_F32) {
            /* A float32 q holding the 16-bit values gives the 16-bit q's result, and
             * a float32 out rounds to the 16-bit out's bits (attn.h, attend). */
            CHECK_INT(kv_run(&kp, o32, NULL, ATTN_IMPL_FUSED, paths[a], 2, 1), ATTN_OK);
            int64_t bad = -1;
            for (int64_t x = 0; x < no && bad < 0; x++)
                if (narrow(dt, o32[x]) != ((const uint16_t *)o2)[x])
                    bad = x;
            if (bad >= 0) {
                snprintf(detail, sizeof detail, "float32 q and out: out[%lld] %.8g rounds to "
                         "0x%04x, the 16-bit out is 0x%04x", (long long)bad, o32[bad],
                         narrow(dt, o32[bad]), ((const uint16_t *)o2)[bad]);
                report(what, detail);
            }
            CHECK(bad < 0);
        }
        double worst;
        if (dt == ATTN_DTYPE_F32) {
            const double err = max_err(o1, oracle, no);
            worst = err / bound;
            snprintf(detail, sizeof detail, "error %.3g against the oracle, bound %.3g", err,
                     bound);
        } else {
            worst = half_rule(dt, o1, ref, no, vmax, detail, sizeof detail);
        }
        if (!(worst <= 1.0))
            report(what, detail);
        CHECK(worst <= 1.0);
        const int same = memcmp(o1, o2, elem * (size_t)no) == 0;
        if (!same)
            report(what, "1 and 2 threads give other bits");
        CHECK(same);
        const int as_sdpa = memcmp(o2, solo, elem * (size_t)no) == 0;
        if (!as_sdpa)
            report(what, "the batch's bits differ from attn_sdpa's on each sequence's views");
        CHECK(as_sdpa);
        tally_add(t, worst, what);
    }
    free(kp.q), free(kp.k[0]), free(kp.k[1]), free(kp.v[0]), free(kp.v[1]);
    free(ref), free(o1), free(o2), free(solo), free(o32), free(oracle), free(kp.q32);
}

/* ---- Backward ------------------------------------------------------------------ */

/* The float64 backward of tests/test_fused_backward.c without the options: with
 * absolute set, every term taken in absolute value (the scale the gradients are
 * summed from, for the floor). dq, dk and dv are zeroed here. */
static void bwd_oracle(const shape *s, const float *q, const float *k, const float *v,
                       const float *dout, int absolute, double *dq, double *dk, double *dv)
{
#define A_(x) (absolute ? fabs((double)(x)) : (double)(x))
    const int64_t D = s->D, Dv = s->Dv, Tk = s->Tk, group = s->H / s->Hkv;
    const double scale = 1.0 / sqrt((double)D);
    memset(dq, 0, sizeof(double) * (size_t)(s->H * s->Tq * D));
    memset(dk, 0, sizeof(double) * (size_t)(s->Hkv * Tk * D));
    memset(dv, 0, sizeof(double) * (size_t)(s->Hkv * Tk * Dv));
    double *pw = dbuf(Tk), *o = dbuf(Dv);
    for (int64_t h = 0; h < s->H; h++) {
        const int64_t hk = h / group;
        const float *K = k + hk * Tk * D, *V = v + hk * Tk * Dv;
        for (int64_t r = 0; r < s->Tq; r++) {
            const float *qi = q + (h * s->Tq + r) * D, *doi = dout + (h * s->Tq + r) * Dv;
            double *dqi = dq + (h * s->Tq + r) * D, m = -INFINITY, l = 0.0, delta = 0.0;
            const int64_t seen = s->causal ? r + Tk - s->Tq + 1 : Tk; /* bottom-right */
            for (int64_t j = 0; j < seen; j++) {
                double dot = 0.0;
                for (int64_t d = 0; d < D; d++)
                    dot += (double)qi[d] * K[j * D + d];
                pw[j] = scale * dot;
                m = pw[j] > m ? pw[j] : m;
            }
            for (int64_t j = 0; j < seen; j++)
                l += (pw[j] = exp(pw[j] - m));
            memset(o, 0, sizeof(double) * (size_t)Dv);
            for (int64_t j = 0; j < seen; j++) {
                pw[j] /= l;
                for (int64_t e = 0; e < Dv; e++)
                    o[e] += pw[j] * A_(V[j * Dv + e]);
            }
            for (int64_t e = 0; e < Dv; e++)
                delta += A_(doi[e]) * o[e];
            for (int64_t j = 0; j < seen; j++) {
                double dp = 0.0;
                for (int64_t e = 0; e < Dv; e++) {
                    dp += A_(doi[e]) * A_(V[j * Dv + e]);
                    dv[(hk * Tk + j) * Dv + e] += pw[j] * A_(doi[e]);
                }
                const double ds = pw[j] * (absolute ? dp + delta : dp - delta);
                for (int64_t d = 0; d < D; d++) {
                    dqi[d] += scale * ds * A_(K[j * D + d]);
                    dk[(hk * Tk + j) * D + d] += scale * ds * A_(qi[d]);
                }
            }
        }
    }
    free(pw), free(o);
#undef A_
}

static int backward(const shape *s, float *q, float *k, float *v, float *out, float *lse,
                    float *dout, float *dq, float *dk, float *dv, attn_arch arch, int threads)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor tq = tensor4(ATTN_DTYPE_F32, q, 1, s->H, s->Tq, s->D);
    attn_tensor tk = tensor4(ATTN_DTYPE_F32, k, 1, s->Hkv, s->Tk, s->D);
    attn_tensor tv = tensor4(ATTN_DTYPE_F32, v, 1, s->Hkv, s->Tk, s->Dv);
    attn_tensor to = tensor4(ATTN_DTYPE_F32, out, 1, s->H, s->Tq, s->Dv);
    attn_tensor tdo = tensor4(ATTN_DTYPE_F32, dout, 1, s->H, s->Tq, s->Dv);
    attn_tensor tdq = tensor4(ATTN_DTYPE_F32, dq, 1, s->H, s->Tq, s->D);
    attn_tensor tdk = tensor4(ATTN_DTYPE_F32, dk, 1, s->Hkv, s->Tk, s->D);
    attn_tensor tdv = tensor4(ATTN_DTYPE_F32, dv, 1, s->Hkv, s->Tk, s->Dv);
    attn_tensor tl;
    const int64_t ls[3] = {1, s->H, s->Tq};
    attn_tensor_init(NULL, &tl, ATTN_DTYPE_F32, lse, 3, ls);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = s->causal ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, NULL};
    int rc;
    if (arch == ATTN_ARCH_REF) {
        p.lse = &tl; /* the forward on the reference first: out and lse */
        ctx.impl = ATTN_IMPL_REF;
        rc = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL);
        p.lse = NULL;
        if (rc == ATTN_OK)
            rc = attn_sdpa_backward_ref(&ctx, &tq, &tk, &tv, &p, &to, &tl, &tdo, &g);
    } else {
        rc = attn_sdpa_backward(&ctx, &tq, &tk, &tv, &p, &to, &tl, &tdo, &g);
    }
    if (rc != ATTN_OK)
        fprintf(stderr, "   backward on %s: %s\n", attn_arch_name(arch), ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

static double max_abs(const double *o, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(o[i]));
    return m;
}

static void check_backward(int i, int64_t D, int64_t Dv)
{
    shape s = shape_of(PATH_TILE, i, D, Dv);
    s.pad = 0; /* the backward's tensors are contiguous */
    if (i % 2 == 0)
        s.Tq = 3, s.Tk = 5;
    const int64_t nq = s.H * s.Tq * D, nk = s.Hkv * s.Tk * D, nv = s.Hkv * s.Tk * Dv;
    const int64_t no = s.H * s.Tq * Dv, n3[3] = {nq, nk, nv};
    float *q = fbuf(nq), *k = fbuf(nk), *v = fbuf(nv), *dout = fbuf(no);
    float *out = fbuf(no), *lse = fbuf(s.H * s.Tq);
    fill(q, nq), fill(k, nk), fill(v, nv), fill(dout, no);
    float *g[3][3]; /* [reference, 1 thread, 2 threads][dq, dk, dv] */
    double *o[3], *ab[3];
    for (int x = 0; x < 3; x++) {
        for (int y = 0; y < 3; y++)
            g[y][x] = fbuf(n3[x]);
        o[x] = dbuf(n3[x]);
        ab[x] = dbuf(n3[x]);
    }
    bwd_oracle(&s, q, k, v, dout, 0, o[0], o[1], o[2]);
    bwd_oracle(&s, q, k, v, dout, 1, ab[0], ab[1], ab[2]);
    CHECK_INT(backward(&s, q, k, v, out, lse, dout, g[0][0], g[0][1], g[0][2], ATTN_ARCH_REF, 1),
              ATTN_OK);
    static const char *const names[3] = {"dq", "dk", "dv"};
    for (int a = 0; a < n_archs; a++) {
        char what[200], detail[200];
        shape_text(what, sizeof what, "backward", &s, archs[a]);
        for (int t = 1; t <= 2; t++)
            CHECK_INT(backward(&s, q, k, v, out, lse, dout, g[t][0], g[t][1], g[t][2], archs[a],
                               t),
                      ATTN_OK);
        for (int x = 0; x < 3; x++) {
            const double eref = max_err(g[0][x], o[x], n3[x]);
            const double efus = max_err(g[1][x], o[x], n3[x]);
            const double bound = 2.0 * eref + 16.0 * FLT_EPSILON * max_abs(ab[x], n3[x]);
            if (!(efus <= bound)) {
                snprintf(detail, sizeof detail, "%s error %.3g, bound %.3g (reference %.3g)",
                         names[x], efus, bound, eref);
                report(what, detail);
            }
            CHECK(efus <= bound);
            const int same = memcmp(g[1][x], g[2][x], sizeof(float) * (size_t)n3[x]) == 0;
            if (!same) {
                snprintf(detail, sizeof detail, "%s: 1 and 2 threads give other bits", names[x]);
                report(what, detail);
            }
            CHECK(same);
            tally_add(&t_bwd, efus / bound, what);
        }
    }
    for (int x = 0; x < 3; x++) {
        for (int y = 0; y < 3; y++)
            free(g[y][x]);
        free(o[x]), free(ab[x]);
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse);
}

/* ---- GEMM ---------------------------------------------------------------------- */

/* y = x W^T + b through attn_linear, or (packed set) through a weight packed by
 * attn_linear_pack for the arch and attn_linear_forward_packed. */
static int linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
                  int64_t K, attn_arch arch, int threads, int packed)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor tx, tw, tb, ty;
    const int64_t sx[2] = {M, K}, sw[2] = {N, K}, sb[1] = {N}, sy[2] = {M, N};
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, (void *)x, 2, sx);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, (void *)w, 2, sw);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, (void *)b, 1, sb);
    attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, y, 2, sy);
    int rc;
    if (packed) {
        attn_linear_packed *pw = NULL;
        rc = attn_linear_pack(&ctx, &tw, &tb, &pw);
        if (rc == ATTN_OK)
            rc = attn_linear_forward_packed(&ctx, &tx, pw, &ty);
        attn_linear_packed_free(&ctx, pw);
    } else {
        rc = attn_linear(&ctx, &tx, &tw, &tb, &ty);
    }
    if (rc != ATTN_OK)
        fprintf(stderr, "   attn_linear: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

/* y [M, N] = x [M, K] W [N, K]^T + b with K = D and N = Dv of pair i. */
static void check_gemm(int i, int64_t K, int64_t N)
{
    const int64_t M = 1 + i % 20;
    float *x = fbuf(M * K), *w = fbuf(N * K), *b = fbuf(N), *ref = fbuf(M * N);
    float *y1 = fbuf(M * N), *y2 = fbuf(M * N), *yp = fbuf(M * N);
    double *oracle = dbuf(M * N);
    fill(x, M * K), fill(w, N * K), fill(b, N);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = b[n];
            for (int64_t kk = 0; kk < K; kk++)
                acc += (double)x[m * K + kk] * (double)w[n * K + kk];
            oracle[m * N + n] = acc;
        }
    CHECK_INT(linear(x, w, b, ref, M, N, K, ATTN_ARCH_REF, 1, 0), ATTN_OK);
    const double bound = 2.0 * max_err(ref, oracle, M * N) + 1e-6;
    for (int a = 0; a < n_archs; a++) {
        char what[200], detail[200];
        snprintf(what, sizeof what, "gemm M=%lld N=%lld K=%lld arch=%s", (long long)M,
                 (long long)N, (long long)K, attn_arch_name(archs[a]));
        for (int64_t e = 0; e < M * N; e++)
            y1[e] = y2[e] = NAN;
        CHECK_INT(linear(x, w, b, y1, M, N, K, archs[a], 1, 0), ATTN_OK);
        CHECK_INT(linear(x, w, b, y2, M, N, K, archs[a], 2, 0), ATTN_OK);
        CHECK_INT(linear(x, w, b, yp, M, N, K, archs[a], 2, 1), ATTN_OK);
        const double err = max_err(y1, oracle, M * N);
        if (!(err <= bound)) {
            snprintf(detail, sizeof detail, "error %.3g, bound %.3g", err, bound);
            report(what, detail);
        }
        CHECK(err <= bound);
        const int same = memcmp(y1, y2, sizeof(float) * (size_t)(M * N)) == 0;
        if (!same)
            report(what, "1 and 2 threads give other bits");
        CHECK(same);
        const int same_packed = memcmp(y2, yp, sizeof(float) * (size_t)(M * N)) == 0;
        if (!same_packed)
            report(what, "the packed weight gives other bits than the unpacked one");
        CHECK(same_packed);
        tally_add(&t_gemm, err / bound, what);
    }
    free(x), free(w), free(b), free(ref), free(y1), free(y2), free(yp), free(oracle);
}

static void summary(const char *name, const tally *t)
{
    fprintf(stderr, "   %-18s %6d runs; worst error / bound %.3f at %s\n", name, t->runs,
            t->worst, t->where);
}

/* The CPU time of each part, to keep the whole test within a few seconds. */
static clock_t lap_start;

static void lap(void)
{
    fprintf(stderr, "   (%.1f s)\n", (double)(clock() - lap_start) / CLOCKS_PER_SEC);
    lap_start = clock();
}

/* Whether the part named runs: all of them without arguments, else those named
 * (CTest runs "f32" once more under ATTN_MICROTILE=4x4). */
static int part(int argc, char **argv, const char *name)
{
    for (int a = 1; a < argc; a++)
        if (strcmp(argv[a], name) == 0)
            return 1;
    return argc < 2;
}

int main(int argc, char **argv)
{
    /* As in tests/test_bf16_paths.c: lets the avx512bf16 path run, with vdpbf16ps
     * emulated, on an AVX-512 CPU without AVX512-BF16. */
    setenv("ATTN_BF16_EMULATE", "1", 1);
    find_paths();
    lap_start = clock();
    const int step = SWEEP_QUICK ? 7 : 1, pairs = 3 * NMAX;

    if (part(argc, argv, "f32")) {
        TEST("every head size 1..264 (D = Dv, D = 64, Dv = 64): the float32 forward's row, "
             "split-key and tile paths stay within twice the reference's error against a "
             "float64 oracle (plus 2e-6), 1 and 2 threads the same bits, and 520 keys are "
             "split");
        for (int i = 0; i < pairs; i += step) {
            int64_t D, Dv;
            pair_of(i, &D, &Dv);
            for (int path = 0; path < PATHS; path++)
                check_f32(path, i, D, Dv);
        }
        summary("float32 forward", &t_f32);
        CHECK(split_runs > 0);
        lap();
    }

    if (part(argc, argv, "half")) {
        TEST("every head size 1..264: bfloat16 and float16 q, k, v and out on the row, "
             "split-key and tile paths are within one unit of the dtype of (max |v| + |out|) "
             "of the reference, 1 and 2 threads the same bits");
        for (int i = 0; i < pairs; i += step) {
            int64_t D, Dv;
            pair_of(i, &D, &Dv);
            for (int path = 0; path < PATHS; path++) {
                check_half(ATTN_DTYPE_BF16, path, i, D, Dv);
                check_half(ATTN_DTYPE_F16, path, i, D, Dv);
            }
        }
        summary("bfloat16 forward", &t_half[0]);
        summary("float16 forward", &t_half[1]);
        lap();
    }

    if (part(argc, argv, "kv")) {
        TEST("every head size 1..264: a float32, bfloat16 or float16 KV cache of two "
             "sequences (a few keys and 520) attended at once keeps its rule against the "
             "reference, 1 and 2 threads the same bits, each sequence attn_sdpa's bits on "
             "its views");
        for (int i = 0; i < pairs; i += step) {
            int64_t D, Dv;
            pair_of(i, &D, &Dv);
            /* One dtype a pair, shifted from family to family so that every size
             * meets all three. */
            static const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
            check_kv(dts[(i + i / NMAX) % 3], i, D, Dv);
        }
        summary("float32 KV cache", &t_kv[0]);
        summary("bfloat16 KV cache", &t_kv[1]);
        summary("float16 KV cache", &t_kv[2]);
        lap();
    }

    if (part(argc, argv, "backward")) {
        TEST("every head size 1..264: the fused backward's dq, dk and dv stay within twice the "
             "reference's error against a float64 backward (plus 16 ulps of the terms' scale), "
             "1 and 2 threads the same bits");
        for (int i = 0; i < pairs; i += step) {
            int64_t D, Dv;
            pair_of(i, &D, &Dv);
            check_backward(i, D, Dv);
        }
        summary("backward", &t_bwd);
        lap();
    }

    if (part(argc, argv, "gemm")) {
        TEST("every K and N in 1..264 (K = N, K = 64, N = 64): attn_linear's GEMM stays within "
             "twice the reference's error (plus 1e-6), 1 and 2 threads and a packed weight the "
             "same bits");
        for (int i = 0; i < pairs; i += step) {
            int64_t D, Dv;
            pair_of(i, &D, &Dv);
            check_gemm(i, D, Dv);
        }
        summary("gemm", &t_gemm);
        lap();
    }
    if (reports > MAX_REPORTS)
        fprintf(stderr, "   (%d more failures not printed)\n", reports - MAX_REPORTS);
    return check_summary("test_dim_sweep");
}
