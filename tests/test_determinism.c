/*
 * test_determinism.c - the same inputs give the same bits: across repeated runs,
 * across thread counts (1, 2, 3), for attention alone (with and without every
 * option of SPEC section 6; the tile path's items, which its workers claim ahead,
 * with 4 and 7 threads too) and for multi-head attention end to end, on every
 * instruction-set path this machine runs. Between paths the
 * summation order differs (vector widths, fused multiply-adds), so there the test
 * measures the largest difference, prints it, and holds it to the float32 error
 * bound the correctness sweep uses.
 */
#include "attn.h"
#include "check.h"
#include "sdpa_contract.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 3, T = 131, D = 64, E = H * D };

static float q[B * H * T * D], k[B * H * T * D], v[B * H * T * D];
static float x[B * T * E], wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E];
static unsigned char pad[B * T];

static void run_sdpa(attn_arch arch, int threads, float *out)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(out, B, H, T, D), tm;
    const int64_t ms[4] = {B, 1, 1, T};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, pad, 4, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    p.mask = &tm;
    CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), ATTN_OK);
}

/* Every option of SPEC section 6 at once, on multi-query heads (H = 3 query heads
 * over one key/value head) with bottom-right causal over a longer key
 * sequence: out [B, H, T, D] and the log-sum-exp [B, H, T] after it in `out`. */
enum { TK = T + 40 };
static float kx[B * TK * D], vx[B * TK * D], bias_row[TK], slopes[H], sinks[H];

static void run_sdpa_options(attn_arch arch, int threads, float *out)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(kx, B, 1, TK, D),
                tv = tu_tensor4(vx, B, 1, TK, D), to = tu_tensor4(out, B, H, T, D),
                tl = tu_tensor3(out + B * H * T * D, B, H, T), tb, tsl, tsk;
    const int64_t bs[1] = {TK}, hs[1] = {H};
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, bias_row, 1, bs);
    attn_tensor_init(NULL, &tsl, ATTN_DTYPE_F32, slopes, 1, hs);
    attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, sinks, 1, hs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    p.has_window = 1;
    p.window_left = 70;
    p.window_right = -1;
    p.softcap = 3.0f;
    p.alibi_slopes = &tsl;
    p.bias = &tb;
    p.sinks = &tsk;
    p.lse = &tl;
    CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), ATTN_OK);
}

/* The tile path's workers claim their next item ahead (fk_tile_worker,
 * src/kernels/fused_tile.h). Two problems that stress that loop: CQ query rows
 * against CK keys, bottom-right causal, so that the first query tiles see no key
 * at all (items with no key tile, which claim their successor only after they
 * end); and one query head of CQ2 rows, two items, fewer than the threads asked
 * for. out is filled with NaN first, so that an item no worker ran shows. */
enum { CH = 3, CQ = 600, CK = 256, CQ2 = 70 };
static float cq[CH * CQ * D], ck[CH * CK * D], cv[CH * CK * D];

static void run_claimed(attn_arch arch, int threads, int few, float *out)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    const int64_t h = few ? 1 : CH, tq = few ? CQ2 : CQ;
    for (int64_t i = 0; i < h * tq * D; i++)
        out[i] = NAN;
    attn_tensor tq_ = tu_tensor4(cq, 1, h, tq, D), tk = tu_tensor4(ck, 1, h, CK, D),
                tv = tu_tensor4(cv, 1, h, CK, D), to = tu_tensor4(out, 1, h, tq, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    CHECK_INT(attn_sdpa(&ctx, &tq_, &tk, &tv, &p, &to, NULL), ATTN_OK);
}

/* Split-key decoding (src/kernels/fused_split.h): SB sequences of SQ query rows
 * with SH query heads over SHKV key/value heads against SK keys, every option of
 * SPEC section 6 on top, out [SB, SH, SQ, D] and the log-sum-exp [SB, SH, SQ] after
 * it in `out`. *chunks gets the plan's chunk count. */
enum { SB = 2, SH = 8, SHKV = 2, SQ = 2, SK = 3001 };
static float sq_[SB * SH * SQ * D], sk_[SB * SHKV * SK * D], sv_[SB * SHKV * SK * D];
static float sbias[SK], sslopes[SH], ssinks[SH];

static void run_split(attn_arch arch, int threads, int all_options, float *out, int64_t *chunks)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor tq = tu_tensor4(sq_, SB, SH, SQ, D), tk = tu_tensor4(sk_, SB, SHKV, SK, D),
                tv = tu_tensor4(sv_, SB, SHKV, SK, D), to = tu_tensor4(out, SB, SH, SQ, D),
                tl = tu_tensor3(out + SB * SH * SQ * D, SB, SH, SQ), tb, tsl, tsk;
    const int64_t bs[1] = {SK}, hs[1] = {SH};
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, sbias, 1, bs);
    attn_tensor_init(NULL, &tsl, ATTN_DTYPE_F32, sslopes, 1, hs);
    attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, ssinks, 1, hs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &tl;
    if (all_options) {
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        p.has_window = 1;
        p.window_left = 2000;
        p.window_right = -1;
        p.softcap = 3.0f;
        p.alibi = 1;
        p.alibi_slopes = &tsl;
        p.bias = &tb;
        p.sinks = &tsk;
    }
    attn__sdpa_shapes s;
    attn__sdpa_plan plan;
    *chunks = -1;
    if (attn__sdpa_prepare(&ctx, &tq, &tk, &tv, &p, &to, NULL, &s) == ATTN_OK &&
        attn__sdpa_plan_for_ctx(&ctx, &s, &plan) == ATTN_OK)
        *chunks = plan.n_chunks;
    CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), ATTN_OK);
}

static void run_mha(attn_arch arch, int threads, float *out)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(out, B, T, E), tm;
    const int64_t ms[4] = {B, 1, 1, T};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, pad, 4, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    p.mask = &tm;
    CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &ty, NULL), ATTN_OK);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
    }
    return m;
}

int main(void)
{
    tu_fill(q, B * H * T * D, 1);
    tu_fill(k, B * H * T * D, 2);
    tu_fill(v, B * H * T * D, 3);
    tu_fill(x, B * T * E, 4);
    tu_fill(wqkv, 3 * E * E, 5);
    tu_fill(bqkv, 3 * E, 6);
    tu_fill(wo, E * E, 7);
    tu_fill(bo, E, 8);
    tu_fill(kx, B * TK * D, 9);
    tu_fill(vx, B * TK * D, 10);
    tu_fill(bias_row, TK, 11);
    bias_row[5] = bias_row[100] = -INFINITY;
    for (int h = 0; h < H; h++)
        slopes[h] = 0.02f * (float)(h + 1), sinks[h] = 0.5f * (float)h;
    /* Weights at nn.Linear's scale (uniform in +-1/sqrt(E)) keep every stage O(1). */
    for (int i = 0; i < 3 * E * E; i++)
        wqkv[i] /= sqrtf((float)E);
    for (int i = 0; i < E * E; i++)
        wo[i] /= sqrtf((float)E);
    tu_fill(cq, CH * CQ * D, 16);
    tu_fill(ck, CH * CK * D, 17);
    tu_fill(cv, CH * CK * D, 18);
    tu_fill(sq_, SB * SH * SQ * D, 12);
    tu_fill(sk_, SB * SHKV * SK * D, 13);
    tu_fill(sv_, SB * SHKV * SK * D, 14);
    tu_fill(sbias, SK, 15);
    sbias[7] = sbias[1500] = sbias[SK - 2] = -INFINITY;
    for (int h = 0; h < SH; h++)
        sslopes[h] = 0.001f * (float)(h + 1), ssinks[h] = 0.3f * (float)h - 1.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            pad[b * T + t] = !(b == 1 && t >= T - 40); /* sample 1 ends in 40 pads */

    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    enum { N_ARCH = sizeof archs / sizeof archs[0] };
    const size_t n_attn = B * H * T * D, n_mha = B * T * E;
    float *attn_out[N_ARCH] = {0}, *mha_out[N_ARCH] = {0};
    for (int a = 0; a < N_ARCH; a++) {
        if (!attn_arch_supported(archs[a])) {
            fprintf(stderr, "-- path %s: not supported on this machine, skipped\n", attn_arch_name(archs[a]));
            continue;
        }
        fprintf(stderr, "== path %s\n", attn_arch_name(archs[a]));
        float *o1 = malloc(n_attn * 4), *o2 = malloc(n_attn * 4), *m1 = malloc(n_mha * 4),
              *m2 = malloc(n_mha * 4);
        TEST("two runs with the same inputs give the same bits (attention and multi-head attention)");
        run_sdpa(archs[a], 2, o1);
        run_sdpa(archs[a], 2, o2);
        CHECK(memcmp(o1, o2, n_attn * 4) == 0);
        run_mha(archs[a], 2, m1);
        run_mha(archs[a], 2, m2);
        CHECK(memcmp(m1, m2, n_mha * 4) == 0);
        TEST("1, 2 and 3 threads give the same bits (attention and multi-head attention)");
        for (int th = 1; th <= 3; th += 2) {
            run_sdpa(archs[a], th, o2);
            CHECK(memcmp(o1, o2, n_attn * 4) == 0);
            run_mha(archs[a], th, m2);
            CHECK(memcmp(m1, m2, n_mha * 4) == 0);
        }
        TEST("with every option (MQA, bottom-right causal, a window, softcap, ALiBi, a bias "
             "with -inf, sinks), 1, 2 and 3 threads give the same output and log-sum-exp bits");
        {
            const size_t n_opt = n_attn + B * H * T;
            float *p1 = malloc(n_opt * 4), *p2 = malloc(n_opt * 4);
            run_sdpa_options(archs[a], 1, p1);
            for (int th = 2; th <= 3; th++) {
                memset(p2, 0, n_opt * 4);
                run_sdpa_options(archs[a], th, p2);
                CHECK(memcmp(p1, p2, n_opt * 4) == 0);
            }
            free(p1), free(p2);
        }
        TEST("the tile path's items, which workers claim ahead, each run once: with query "
             "tiles that see no key, and with fewer items than workers, every output is "
             "finite, within 1e-5 of the reference, and the same bits for 1, 2, 3, 4 and 7 threads");
        {
            const size_t n_c = CH * CQ * D;
            float *c1 = malloc(n_c * 4), *c2 = malloc(n_c * 4), *cr = malloc(n_c * 4);
            for (int few = 0; few <= 1; few++) {
                const size_t n = few ? (size_t)CQ2 * D : n_c;
                run_claimed(ATTN_ARCH_REF, 1, few, cr);
                run_claimed(archs[a], 1, few, c1);
                size_t nonfinite = 0;
                for (size_t i = 0; i < n; i++)
                    nonfinite += !isfinite(c1[i]);
                const double dr = max_diff(c1, cr, n);
                if (nonfinite || !(dr <= 1e-5))
                    fprintf(stderr, "   problem %d, 1 thread: %zu outputs not finite, max "
                            "|difference| from the reference %.3g\n", few, nonfinite, dr);
                CHECK(nonfinite == 0);
                CHECK(dr <= 1e-5);
                static const int counts[] = {2, 3, 4, 7};
                for (int c = 0; c < 4; c++) {
                    run_claimed(archs[a], counts[c], few, c2);
                    if (memcmp(c1, c2, n * 4) != 0) {
                        size_t differ = 0;
                        for (size_t i = 0; i < n; i++)
                            differ += memcmp(c1 + i, c2 + i, 4) != 0;
                        fprintf(stderr, "   problem %d, %d threads: %zu outputs differ in their "
                                "bits from 1 thread's (max finite |difference| %.3g)\n", few,
                                counts[c], differ, max_diff(c1, c2, n));
                    }
                    CHECK(memcmp(c1, c2, n * 4) == 0);
                }
            }
            free(c1), free(c2), free(cr);
        }
        /* The reference does not split; the fused paths do. */
        if (archs[a] != ATTN_ARCH_REF) {
            TEST("split-key decoding (2 sequences, 8 query heads over 2 key/value heads, 2 "
                 "query rows, 3001 keys), plain and with every option, is split into chunks "
                 "and gives the same output and log-sum-exp bits for 1, 2, 3, 4 and 7 threads");
            const size_t n_split = SB * SH * SQ * D + SB * SH * SQ;
            float *s1 = malloc(n_split * 4), *s2 = malloc(n_split * 4);
            for (int all = 0; all <= 1; all++) {
                int64_t c1 = 0, c2 = 0;
                run_split(archs[a], 1, all, s1, &c1);
                if (c1 < 2)
                    fprintf(stderr, "   options %d: %lld chunks, expected at least 2\n", all,
                            (long long)c1);
                CHECK(c1 >= 2);
                static const int counts[] = {2, 3, 4, 7};
                for (int c = 0; c < 4; c++) {
                    memset(s2, 0, n_split * 4);
                    run_split(archs[a], counts[c], all, s2, &c2);
                    CHECK_INT(c2, c1);
                    if (memcmp(s1, s2, n_split * 4) != 0)
                        fprintf(stderr, "   options %d, %d threads: max |difference| %.3g\n",
                                all, counts[c], max_diff(s1, s2, n_split));
                    CHECK(memcmp(s1, s2, n_split * 4) == 0);
                }
            }
            free(s1), free(s2);
        }
        attn_out[a] = o1;
        mha_out[a] = m1;
        free(o2), free(m2);
    }
    /* Paths sum in other orders (vector widths, fused multiply-adds). Float32
     * rounding of D = 64 and E = 192 term sums of O(1) values is a few 1e-7 per sum
     * (6e-8 times the square root of the length, times the magnitudes), so 1e-5
     * leaves a wide margin while still catching a wrong tail or a lost term (errors
     * of order 1e-2). */
    TEST("between instruction-set paths the results stay within float32 rounding (differences printed)");
    for (int a = 0; a < N_ARCH; a++)
        for (int b = a + 1; b < N_ARCH; b++) {
            if (!attn_out[a] || !attn_out[b])
                continue;
            double da = max_diff(attn_out[a], attn_out[b], n_attn);
            double dm = max_diff(mha_out[a], mha_out[b], n_mha);
            fprintf(stderr, "   %-6s vs %-6s: max |difference| attention %.3g, multi-head %.3g%s\n",
                    attn_arch_name(archs[a]), attn_arch_name(archs[b]), da, dm,
                    da == 0 && dm == 0 ? " (bit-identical)" : "");
            CHECK(da <= 1e-5);
            CHECK(dm <= 1e-5);
        }
    for (int a = 0; a < N_ARCH; a++) {
        free(attn_out[a]);
        free(mha_out[a]);
    }
    return check_summary("test_determinism");
}
