/*
 * test_half_extremes.c - q, k and v stored in bfloat16 or float16 with values at the
 * ends of their range, on every fused path against the reference: NaN, +-inf and the
 * largest finite numbers (bfloat16's 3.39e38, float16's 65504), put in one element or
 * one whole row of q, k or v, in a query tile or key tile that is the first of its
 * row, a later full tile (on the avx512bf16 path the weights taken against a stale
 * max), the causal diagonal's tile, or keys a window hides; no mask, causal top-left
 * and a window with empty rows as zeros; grouped-query heads, D and Dv apart, and
 * shapes whose tiles end in tails. Then sinks of -inf to +inf, a bias row of such a
 * value (empty rows as an error or zeros) and scales of 0 to 1e30 on ordinary data.
 *
 * Each output element must be of the reference's class (finite, NaN, +inf, -inf) and,
 * finite, within 2^-7 of (max finite |v| + |out|) of it (test_bf16_paths.c's 2^-8 for
 * the weights' and outputs' roundings, with room for float16's narrower range of
 * exponents); the log-sum-exp of the same class and within 1e-3 relative; the status
 * the reference's; 1 and 2 threads the same bits. A whole row of q or k at the
 * largest finite value is left out: the reference's float32 sum q.k overflows to
 * inf - inf = NaN there where the float64 value and the fused paths' sums are finite.
 *
 * What it found (the avx512bf16 path, before the fixes of bf16_tile.h): a value row
 * of 3.39e38 at a key whose weight against the stale max is above 1 overflowed O^T
 * to inf; an element of q or k of 3e38, or a scale of 1e30, gave scores of 1e30 and
 * more, whose one-FMA exponent S scale log2 e - m log2 e is off by units in the last
 * place of m log2 e, and NaN rows (tests/test_bf16_lazy.c holds both against a
 * float64 oracle too). Both fail here without the fixes.
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int B, H, Hkv, Tq, Tk, D, Dv;
} shape;

/* What a call sets beyond q, k and v. */
typedef struct options {
    int causal, window, zero_rows, sinks, bias_row, has_scale;
    float sink, bias_value, scale;
} options;

/* One value put into q, k or v of the last (batch, head): element (row, col), or
 * the whole row when col < 0. */
typedef struct placement {
    char tensor;
    int row, col;
    float value;
} placement;

static uint64_t rng_state;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static uint16_t narrow(attn_dtype dt, float x)
{
    return dt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(x) : attn__f32_to_f16(x);
}

static float widen(attn_dtype dt, uint16_t h)
{
    return dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
}

static int kind_of(float x) { return isnan(x) ? 1 : isinf(x) ? (x > 0 ? 2 : 3) : 0; }

static const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512,
                                  ATTN_ARCH_AVX512_BF16, ATTN_ARCH_AMX};

/* Runs one problem on the reference and every fused path this machine runs; returns
 * the number of broken claims, each printed with `what`. */
static int check_problem(const char *what, attn_dtype dt, shape sh, const options *o,
                         const placement *pl)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor q, k, v, out, lse, sinks, bias;
    memset(&sinks, 0, sizeof sinks);
    memset(&bias, 0, sizeof bias);
    const int64_t qs[4] = {sh.B, sh.H, sh.Tq, sh.D}, ks[4] = {sh.B, sh.Hkv, sh.Tk, sh.D};
    const int64_t vs[4] = {sh.B, sh.Hkv, sh.Tk, sh.Dv}, os[4] = {sh.B, sh.H, sh.Tq, sh.Dv};
    const int64_t ls[3] = {sh.B, sh.H, sh.Tq};
    attn_tensor_alloc(&ctx, &q, dt, 4, qs);
    attn_tensor_alloc(&ctx, &k, dt, 4, ks);
    attn_tensor_alloc(&ctx, &v, dt, 4, vs);
    attn_tensor_alloc(&ctx, &out, dt, 4, os);
    attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, ls);
    uint16_t *qd = q.data, *kd = k.data, *vd = v.data;
    for (int64_t i = 0; i < attn_tensor_numel(&q); i++)
        qd[i] = narrow(dt, 2.0f * uniform());
    for (int64_t i = 0; i < attn_tensor_numel(&k); i++)
        kd[i] = narrow(dt, 2.0f * uniform());
    for (int64_t i = 0; i < attn_tensor_numel(&v); i++)
        vd[i] = narrow(dt, uniform());
    if (pl) {
        const int isq = pl->tensor == 'q', heads = isq ? sh.H : sh.Hkv;
        const int64_t rows = isq ? sh.Tq : sh.Tk, cols = pl->tensor == 'v' ? sh.Dv : sh.D;
        uint16_t *d = isq ? qd : pl->tensor == 'k' ? kd : vd;
        uint16_t *row = d + (((int64_t)sh.B * heads - 1) * rows + pl->row) * cols;
        for (int64_t c = pl->col < 0 ? 0 : pl->col; c < (pl->col < 0 ? cols : pl->col + 1); c++)
            row[c] = narrow(dt, pl->value);
    }
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = o->causal;
    if (o->window) {
        p.has_window = 1;
        p.window_left = 40;
        p.window_right = 3;
    }
    if (o->zero_rows)
        p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    if (o->has_scale) {
        p.has_scale = 1;
        p.scale = o->scale;
    }
    p.lse = &lse;
    if (o->sinks) {
        const int64_t ss[1] = {sh.H};
        attn_tensor_alloc(&ctx, &sinks, ATTN_DTYPE_F32, 1, ss);
        for (int h = 0; h < sh.H; h++)
            ((float *)sinks.data)[h] = h == sh.H - 1 ? o->sink : 2.0f * uniform();
        p.sinks = &sinks;
    }
    if (o->bias_row) {
        /* A random bias, with one row of the last head all bias_value. */
        const int64_t bs[4] = {1, sh.H, sh.Tq, sh.Tk};
        attn_tensor_alloc(&ctx, &bias, ATTN_DTYPE_F32, 4, bs);
        float *b = bias.data;
        for (int64_t i = 0; i < attn_tensor_numel(&bias); i++)
            b[i] = uniform();
        const int64_t r = (int64_t)(sh.H - 1) * sh.Tq + (sh.Tq > 70 ? 70 : sh.Tq - 1);
        for (int j = 0; j < sh.Tk; j++)
            b[r * sh.Tk + j] = o->bias_value;
        p.bias = &bias;
    }
    const int64_t n = attn_tensor_numel(&out), nl = attn_tensor_numel(&lse);
    uint16_t *ref = malloc((size_t)n * 2), *got = malloc((size_t)n * 2), *got2 = malloc((size_t)n * 2);
    float *lref = malloc((size_t)nl * 4), *lgot = malloc((size_t)nl * 4), *lgot2 = malloc((size_t)nl * 4);
    ctx.impl = ATTN_IMPL_REF;
    ctx.threads = 1;
    const int rc_ref = attn_sdpa(&ctx, &q, &k, &v, &p, &out, NULL);
    memcpy(ref, out.data, (size_t)n * 2);
    memcpy(lref, lse.data, (size_t)nl * 4);
    double vmax = 0;
    for (int64_t i = 0; i < attn_tensor_numel(&v); i++) {
        const float x = widen(dt, vd[i]);
        if (isfinite(x))
            vmax = fmax(vmax, fabs(x));
    }
    int broken = 0;
    for (size_t ai = 0; ai < sizeof archs / sizeof archs[0]; ai++) {
        if (!attn_arch_supported(archs[ai]))
            continue;
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = archs[ai];
        ctx.threads = 1;
        const int rc1 = attn_sdpa(&ctx, &q, &k, &v, &p, &out, NULL);
        memcpy(got, out.data, (size_t)n * 2);
        memcpy(lgot, lse.data, (size_t)nl * 4);
        ctx.threads = 2;
        const int rc2 = attn_sdpa(&ctx, &q, &k, &v, &p, &out, NULL);
        memcpy(got2, out.data, (size_t)n * 2);
        memcpy(lgot2, lse.data, (size_t)nl * 4);
        char msg[256] = "";
        if (rc1 != rc_ref || rc2 != rc_ref)
            snprintf(msg, sizeof msg, "status %d and %d, the reference's %d", rc1, rc2, rc_ref);
        else if (rc_ref == ATTN_OK && (memcmp(got, got2, (size_t)n * 2) != 0 ||
                                      memcmp(lgot, lgot2, (size_t)nl * 4) != 0))
            snprintf(msg, sizeof msg, "1 and 2 threads give other bits");
        for (int64_t i = 0; rc_ref == ATTN_OK && i < n && !msg[0]; i++) {
            const float a = widen(dt, ref[i]), b = widen(dt, got[i]);
            if (kind_of(a) != kind_of(b) || (kind_of(a) == 0 && !(fabs(a - b) <= ldexp(vmax + fabs(a), -7))))
                snprintf(msg, sizeof msg, "out[%lld] %.6g, the reference's %.6g", (long long)i, b, a);
        }
        for (int64_t i = 0; rc_ref == ATTN_OK && i < nl && !msg[0]; i++)
            if (kind_of(lref[i]) != kind_of(lgot[i]) ||
                (kind_of(lref[i]) == 0 && !(fabs(lref[i] - lgot[i]) <= 1e-3 * fmax(1.0, fabs(lref[i])))))
                snprintf(msg, sizeof msg, "lse[%lld] %.8g, the reference's %.8g", (long long)i, lgot[i],
                         lref[i]);
        if (msg[0]) {
            fprintf(stderr, "   %s, %s, %s, B%d H%d/%d Tq%d Tk%d D%d Dv%d: %s\n", what,
                    dt == ATTN_DTYPE_BF16 ? "bfloat16" : "float16", attn_arch_name(archs[ai]), sh.B,
                    sh.H, sh.Hkv, sh.Tq, sh.Tk, sh.D, sh.Dv, msg);
            broken++;
        }
    }
    free(ref), free(got), free(got2), free(lref), free(lgot), free(lgot2);
    attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &k), attn_tensor_free(&ctx, &v);
    attn_tensor_free(&ctx, &out), attn_tensor_free(&ctx, &lse);
    attn_tensor_free(&ctx, &sinks), attn_tensor_free(&ctx, &bias);
    attn_ctx_release(&ctx);
    return broken;
}

static const attn_dtype dtypes[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};

static void test_placed_values(void)
{
    TEST("NaN, +-inf and the largest finite values in one element or row of q, k or v, in "
         "first, later, diagonal and hidden tiles: the reference's classes and values on every "
         "path, 1 and 2 threads the same bits");
    /* 264: four full tiles of 64 and a tail (the stale max's tiles, the diagonal's);
     * 130 x 200: tails in both; 65 and grouped heads; 17 x 113 with D 5, Dv 31. */
    static const shape shapes[] = {{1, 2, 1, 264, 264, 64, 64},
                                   {1, 2, 1, 130, 200, 32, 33},
                                   {2, 4, 2, 65, 65, 64, 64},
                                   {1, 1, 1, 17, 113, 5, 31}};
    int broken = 0, problems = 0;
    for (int di = 0; di < 2; di++) {
        const float big = dtypes[di] == ATTN_DTYPE_BF16 ? 0x1.fep127f : 65504.0f;
        const float values[5] = {NAN, INFINITY, -INFINITY, big, -big};
        /* Under a sanitizer (10 to 20 times slower), the first shape only. */
        for (size_t si = 0; si < (CHECK_SANITIZED ? 1 : sizeof shapes / sizeof shapes[0]); si++)
            for (int vi = 0; vi < 5; vi++)
                for (int ti = 0; ti < 3; ti++)
                    for (int mode = 0; mode < 3; mode++) {
                        const shape sh = shapes[si];
                        const char tensor = "qkv"[ti];
                        const int T = tensor == 'q' ? sh.Tq : sh.Tk;
                        /* The first tile, a later one (70, 200: full tiles of 264, the
                         * diagonal's for causal rows 64..127 and 192..255), the last. */
                        const int rows[3] = {0, T > 70 ? 70 : T / 2, T > 200 ? 200 : T - 1};
                        for (int ri = 0; ri < 3; ri++) {
                            /* mode 0: element (row, 0), no mask; 1: the whole row,
                             * causal; 2: the last element, a window, empty rows as
                             * zeros. The reference's sum over a whole row of q or k
                             * at the largest value overflows (see the top). */
                            const int whole = mode == 1 && !(tensor != 'v' && vi >= 3);
                            const int cols = tensor == 'v' ? sh.Dv : sh.D;
                            placement pl = {tensor, rows[ri], whole ? -1 : mode == 2 ? cols - 1 : 0,
                                            values[vi]};
                            options o = {0};
                            o.causal = mode == 1 ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
                            o.window = o.zero_rows = mode == 2;
                            char what[160];
                            snprintf(what, sizeof what, "%g at %c[%d][%s], %s", values[vi], tensor,
                                     rows[ri], whole ? "all" : mode == 2 ? "last" : "0",
                                     mode == 0 ? "no mask" : mode == 1 ? "causal" : "window");
                            rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)problems;
                            broken += check_problem(what, dtypes[di], sh, &o, &pl);
                            problems++;
                        }
                    }
    }
    fprintf(stderr, "-- %d problems\n", problems);
    CHECK_INT(broken, 0);
}

static void test_sinks_bias_scale(void)
{
    TEST("sinks of -inf to +inf, a bias row of such a value (empty rows as an error or "
         "zeros) and scales of 0 to 1e30: the reference's statuses, classes and values on "
         "every path, 1 and 2 threads the same bits");
    static const shape shapes[] = {{1, 2, 1, 130, 200, 64, 64}, {1, 4, 2, 256, 256, 64, 48}};
    static const float values[7] = {-INFINITY, INFINITY, NAN, 1e30f, -1e30f, 100.0f, -100.0f};
    static const float scales[7] = {0.0f, -1.0f, 1e-30f, 1e6f, 1e30f, -1e30f, 3.0f};
    int broken = 0;
    for (int di = 0; di < 2; di++)
        for (size_t si = 0; si < (CHECK_SANITIZED ? 1 : sizeof shapes / sizeof shapes[0]); si++)
            for (int vi = 0; vi < 7; vi++)
                for (int c = 0; c < 3; c++) {
                    const shape sh = shapes[si];
                    char what[160];
                    options o = {0};
                    o.causal = c;
                    o.sinks = 1;
                    o.sink = values[vi];
                    snprintf(what, sizeof what, "sink %g, causal %d", values[vi], c);
                    rng_state = 0x51ed2701ull + (uint64_t)(vi * 3 + c);
                    broken += check_problem(what, dtypes[di], sh, &o, NULL);
                    options ob = {0};
                    ob.causal = c;
                    ob.bias_row = 1;
                    ob.bias_value = values[vi];
                    ob.zero_rows = vi & 1;
                    snprintf(what, sizeof what, "a bias row of %g, causal %d, empty rows %s",
                             values[vi], c, ob.zero_rows ? "zeros" : "an error");
                    broken += check_problem(what, dtypes[di], sh, &ob, NULL);
                    options os = {0};
                    os.causal = c;
                    os.has_scale = 1;
                    os.scale = scales[vi];
                    snprintf(what, sizeof what, "scale %g, causal %d", scales[vi], c);
                    broken += check_problem(what, dtypes[di], sh, &os, NULL);
                }
    CHECK_INT(broken, 0);
}

int main(void)
{
    /* The avx512bf16 path with vdpbf16ps emulated where the CPU lacks it. */
    setenv("ATTN_BF16_EMULATE", "1", 1);
    test_placed_values();
    test_sinks_bias_scale();
    return check_summary("test_half_extremes");
}
