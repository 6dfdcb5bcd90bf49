/*
 * test_kv_cache.c - decoding through the KV cache reproduces the full causal pass.
 *
 * For awkward lengths (1, 3, 17, 113, 4097), MHA and GQA, with and without RoPE
 * (both pairings) and a sliding window, a sequence is prefilled into the cache as
 * one block and then fed one token at a time; every output row is compared with
 * the full pass over the whole sequence (attn_sdpa_ref, bottom-right causal) and
 * with a float64 oracle, under the fused kernel's bound (tests/test_fused_sweep.c):
 *
 *     max |cache - oracle| <= 2 * max |reference - oracle| + 2e-6
 *
 * on every arch this machine runs, with 1 and 2 threads (4097 on the selected arch
 * only, to keep the test short). Also: a batch of sequences of different lengths
 * decoded together, PyTorch 2.15's GQA decode sequence (golden_decode), a full
 * cache that appends nothing, truncate (roll back) and re-append, views of what is
 * stored, section 6's options through attend, zero allocations per decoding
 * step with a counting allocator, and batched decoding on the split-key path
 * (src/kernels/fused_split.h) equal to each sequence alone for any thread count.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif

#define FLOOR 2e-6

static const attn_arch archs[4] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                                   ATTN_ARCH_AVX512};

typedef struct problem {
    int64_t H, Hkv, T, D, prefill;
    int rope;        /* 0 none, 1 interleaved, 2 half */
    int64_t window;  /* window_left, or -1 for none */
} problem;

/* The float64 oracle over rotated q [H, T, D], k and v [Hkv, T, D]: causal, with
 * the window, query head h reading key/value head h / (H / Hkv). */
static void oracle(const problem *pr, const float *q, const float *k, const float *v,
                   double *out)
{
    const int64_t H = pr->H, T = pr->T, D = pr->D, g = pr->H / pr->Hkv;
    const double scale = 1.0 / sqrt((double)D);
    double *row = malloc((size_t)T * sizeof *row);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
            const int64_t lo = pr->window >= 0 && i - pr->window > 0 ? i - pr->window : 0;
            double m = -INFINITY, sum = 0.0;
            for (int64_t j = lo; j <= i; j++) {
                double s = 0.0;
                for (int64_t d = 0; d < D; d++)
                    s += (double)q[(h * T + i) * D + d] * (double)k[((h / g) * T + j) * D + d];
                row[j] = s * scale;
                if (row[j] > m)
                    m = row[j];
            }
            for (int64_t j = lo; j <= i; j++)
                sum += (row[j] = exp(row[j] - m));
            for (int64_t d = 0; d < D; d++) {
                double acc = 0.0;
                for (int64_t j = lo; j <= i; j++)
                    acc += row[j] / sum * (double)v[((h / g) * T + j) * D + d];
                out[(h * T + i) * D + d] = acc;
            }
        }
    free(row);
}

static double max_err(const float *a, const double *b, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > m || isnan(a[i]))
            m = isnan(a[i]) ? INFINITY : fabs((double)a[i] - b[i]);
    return m;
}

static void rope_params(const problem *pr, attn_rope_params *rp)
{
    attn_rope_params_init(rp);
    rp->pairing = pr->rope == 2 ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
    rp->base = pr->rope == 2 ? 500000.0f : 10000.0f;
}

/* Decodes through a cache: prefill, then one token at a time. q [H, T, D], k and
 * v [Hkv, T, D] are the raw (unrotated) inputs; out [H, T, D]. */
static int decode(attn_ctx *ctx, const problem *pr, const float *q, const float *k,
                  const float *v, float *out)
{
    const int64_t H = pr->H, Hkv = pr->Hkv, T = pr->T, D = pr->D;
    attn_kv_cache_config cfg = {1, Hkv, T, D, 0, ATTN_DTYPE_F32};
    attn_kv_cache *c = NULL;
    int rc = attn_kv_cache_create(ctx, &cfg, NULL, 0, &c);
    if (rc)
        return rc;
    attn_rope_params rp;
    rope_params(pr, &rp);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    if (pr->window >= 0) {
        p.has_window = 1;
        p.window_left = pr->window;
        p.window_right = -1;
    }
    const attn_tensor qf = tu_tensor4((float *)q, 1, H, T, D),
                      kf = tu_tensor4((float *)k, 1, Hkv, T, D),
                      vf = tu_tensor4((float *)v, 1, Hkv, T, D),
                      of = tu_tensor4(out, 1, H, T, D);
    for (int64_t t = 0; t < T && rc == ATTN_OK;) {
        const int64_t n = t == 0 && pr->prefill > 0 ? pr->prefill : 1;
        attn_tensor qs, ks, vs, os;
        attn_tensor_narrow(NULL, &qf, 2, t, n, &qs);
        attn_tensor_narrow(NULL, &kf, 2, t, n, &ks);
        attn_tensor_narrow(NULL, &vf, 2, t, n, &vs);
        attn_tensor_narrow(NULL, &of, 2, t, n, &os);
        rc = attn_kv_cache_append(ctx, c, 0, &ks, &vs, pr->rope ? &rp : NULL);
        if (rc == ATTN_OK)
            rc = attn_kv_cache_attend(ctx, c, 0, &qs, &p, pr->rope ? &rp : NULL, &os, NULL);
        t += n;
    }
    attn_kv_cache_free(ctx, c);
    return rc;
}

static void run_problem(const problem *pr, int all_paths, double *worst)
{
    const int64_t H = pr->H, Hkv = pr->Hkv, T = pr->T, D = pr->D;
    const int64_t nq = H * T * D, nk = Hkv * T * D;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
    float *qr = malloc((size_t)nq * 4), *kr = malloc((size_t)nk * 4);
    float *ref = malloc((size_t)nq * 4), *got = malloc((size_t)nq * 4);
    double *want = malloc((size_t)nq * sizeof *want);
    tu_fill(q, nq, (uint64_t)(T * 7 + H));
    tu_fill(k, nk, (uint64_t)(T * 11 + Hkv));
    tu_fill(v, nk, (uint64_t)(T * 13 + D));
    memcpy(qr, q, (size_t)nq * 4);
    memcpy(kr, k, (size_t)nk * 4);
    attn_tensor qt = tu_tensor4(qr, 1, H, T, D), kt = tu_tensor4(kr, 1, Hkv, T, D),
                vt = tu_tensor4(v, 1, Hkv, T, D), rt = tu_tensor4(ref, 1, H, T, D);
    if (pr->rope) {
        attn_rope_params rp;
        rope_params(pr, &rp);
        CHECK_INT(attn_rope_apply(NULL, &rp, &qt, &qt), ATTN_OK);
        CHECK_INT(attn_rope_apply(NULL, &rp, &kt, &kt), ATTN_OK);
    }
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    if (pr->window >= 0) {
        p.has_window = 1;
        p.window_left = pr->window;
        p.window_right = -1;
    }
    CHECK_INT(attn_sdpa_ref(NULL, &qt, &kt, &vt, &p, &rt, NULL), ATTN_OK);
    oracle(pr, qr, kr, v, want);
    const double ref_err = max_err(ref, want, nq), bound = 2.0 * ref_err + FLOOR;
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]) || (!all_paths && archs[a] != attn_arch_selected(NULL)))
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = archs[a];
            ctx.threads = threads;
            ctx.keep_workspace = 1;
            int rc = decode(&ctx, pr, q, k, v, got);
            if (rc)
                fprintf(stderr, "  decode failed: %s\n", ctx.message);
            CHECK_INT(rc, ATTN_OK);
            attn_ctx_release(&ctx);
            const double err = max_err(got, want, nq);
            if (bound > 0 && err / bound > *worst)
                *worst = err / bound;
            if (!(err <= bound)) {
                fprintf(stderr, "  H %lld/%lld T %lld D %lld prefill %lld rope %d window %lld, "
                                "%s, %d threads: error %.3g, bound %.3g (reference %.3g)\n",
                        (long long)H, (long long)Hkv, (long long)T, (long long)D,
                        (long long)pr->prefill, pr->rope, (long long)pr->window,
                        attn_arch_name(archs[a]), threads, err, bound, ref_err);
                CHECK(err <= bound);
            }
        }
    }
    free(q), free(k), free(v), free(qr), free(kr), free(ref), free(got), free(want);
}

static void test_decode_matches_full_pass(void)
{
    TEST("decoding token by token through the cache (after a prefill) reproduces the full "
         "bottom-right causal pass within the fused kernel's bound, for lengths 1, 3, 17, "
         "113 and 4097, MHA and GQA, without RoPE, with either pairing, with a sliding "
         "window, on every arch, 1 and 2 threads");
    static const int64_t lengths[] = {1, 3, 17, 113};
    static const int64_t heads[][2] = {{2, 2}, {4, 2}, {3, 1}};
    double worst = 0.0;
    int count = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
            for (int rope = 0; rope < 3; rope++)
                for (int win = 0; win < 2; win++) {
                    const int64_t T = lengths[li];
                    problem pr = {heads[hi][0], heads[hi][1], T, hi == 1 ? 16 : 8,
                                  T / 2, rope, win ? 4 : -1};
                    run_problem(&pr, 1, &worst);
                    count++;
                }
    problem big = {2, 1, 4097, 8, 4000, 2, -1};
    run_problem(&big, 0, &worst);
    problem big_win = {4, 2, 4097, 8, 4001, 1, 31};
    run_problem(&big_win, 0, &worst);
    fprintf(stderr, "   %d problems; worst error / bound %.3f\n", count + 2, worst);
}

static void test_batch_of_lengths(void)
{
    TEST("three sequences of different lengths (5, 17, 40) decoded together, one token "
         "each per step, give bit for bit what each sequence gives decoded alone in a "
         "cache of its own (the same kernel on the same keys)");
    enum { B = 3, H = 4, HKV = 2, D = 8, CAP = 48, STEPS = 4 };
    const int64_t L[B] = {5, 17, 40};
    float *q[B], *k[B], *v[B], *want[B];
    attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, ATTN_DTYPE_F32};
    attn_kv_cache *c = NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = ATTN_ROPE_HALF;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    for (int b = 0; b < B; b++) {
        q[b] = malloc((size_t)(H * L[b] * D) * 4);
        k[b] = malloc((size_t)(HKV * L[b] * D) * 4);
        v[b] = malloc((size_t)(HKV * L[b] * D) * 4);
        want[b] = malloc((size_t)(H * L[b] * D) * 4);
        tu_fill(q[b], H * L[b] * D, 100 + (uint64_t)b);
        tu_fill(k[b], HKV * L[b] * D, 200 + (uint64_t)b);
        tu_fill(v[b], HKV * L[b] * D, 300 + (uint64_t)b);
        /* This sequence alone in a cache of its own: all but the last STEPS tokens
         * at once, then one token per step. */
        attn_kv_cache_config one = {1, HKV, L[b], D, 0, ATTN_DTYPE_F32};
        attn_kv_cache *c1 = NULL;
        CHECK_INT(attn_kv_cache_create(&ctx, &one, NULL, 0, &c1), ATTN_OK);
        attn_tensor kt = tu_tensor4(k[b], 1, HKV, L[b], D), vt = tu_tensor4(v[b], 1, HKV, L[b], D);
        attn_tensor qt = tu_tensor4(q[b], 1, H, L[b], D), ot = tu_tensor4(want[b], 1, H, L[b], D);
        attn_tensor kp, vp;
        attn_tensor_narrow(NULL, &kt, 2, 0, L[b] - STEPS, &kp);
        attn_tensor_narrow(NULL, &vt, 2, 0, L[b] - STEPS, &vp);
        CHECK_INT(attn_kv_cache_append(&ctx, c1, 0, &kp, &vp, &rp), ATTN_OK);
        for (int64_t t = L[b] - STEPS; t < L[b]; t++) {
            attn_tensor k1, v1, q1, o1;
            attn_tensor_narrow(NULL, &kt, 2, t, 1, &k1);
            attn_tensor_narrow(NULL, &vt, 2, t, 1, &v1);
            attn_tensor_narrow(NULL, &qt, 2, t, 1, &q1);
            attn_tensor_narrow(NULL, &ot, 2, t, 1, &o1);
            CHECK_INT(attn_kv_cache_append(&ctx, c1, 0, &k1, &v1, &rp), ATTN_OK);
            CHECK_INT(attn_kv_cache_attend(&ctx, c1, 0, &q1, &p, &rp, &o1, NULL), ATTN_OK);
        }
        attn_kv_cache_free(&ctx, c1);
        /* The batched cache: the same prefix, one sequence at a time. */
        CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kp, &vp, &rp), ATTN_OK);
    }
    static float qs[B * H * D], ks[B * HKV * D], vs[B * HKV * D], os[B * H * D];
    int same = 1;
    for (int s = 0; s < STEPS; s++) {
        for (int b = 0; b < B; b++) {
            const int64_t t = L[b] - STEPS + s;
            for (int64_t h = 0; h < H; h++)
                memcpy(&qs[(b * H + h) * D], &q[b][(h * L[b] + t) * D], D * 4);
            for (int64_t h = 0; h < HKV; h++) {
                memcpy(&ks[(b * HKV + h) * D], &k[b][(h * L[b] + t) * D], D * 4);
                memcpy(&vs[(b * HKV + h) * D], &v[b][(h * L[b] + t) * D], D * 4);
            }
        }
        attn_tensor qt = tu_tensor4(qs, B, H, 1, D), kt = tu_tensor4(ks, B, HKV, 1, D),
                    vt = tu_tensor4(vs, B, HKV, 1, D), ot = tu_tensor4(os, B, H, 1, D);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, &rp), ATTN_OK);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, &rp, &ot, NULL), ATTN_OK);
        for (int b = 0; b < B; b++) {
            const int64_t t = L[b] - STEPS + s;
            for (int64_t h = 0; h < H; h++)
                same &= memcmp(&os[(b * H + h) * D], &want[b][(h * L[b] + t) * D], D * 4) == 0;
        }
    }
    CHECK(same);
    for (int b = 0; b < B; b++) {
        CHECK_INT(attn_kv_cache_length(c, b), L[b]);
        free(q[b]), free(k[b]), free(v[b]), free(want[b]);
    }
    attn_kv_cache_free(&ctx, c);
}

static int load(const char *dir, const char *name, attn_array *a)
{
    char path[512];
    snprintf(path, sizeof path, "%s/golden_decode/%s/%s.npy", ATTN_TEST_DATA_DIR, dir, name);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int rc = attn_npy_load(&ctx, path, a);
    if (rc != ATTN_OK)
        fprintf(stderr, "  cannot load %s: %s\n", path, ctx.message);
    CHECK_INT(rc, ATTN_OK);
    return rc;
}

static void test_golden_decode(void)
{
    TEST("PyTorch 2.15's GQA decode sequences (H 8 / Hkv 2 with half RoPE; H 6 / Hkv 2 "
         "with interleaved RoPE, base 500000 and a window of 6): a prefill then one token "
         "at a time through the cache gives PyTorch's rows within 1e-5 + 1e-5 relative, "
         "and the cache's keys are PyTorch's rotated keys within 4 ulps");
    static const struct {
        const char *dir;
        int64_t H, Hkv, T, D, prefill, window;
        int rope;
    } cases[] = {
        {"decode_gqa_half", 8, 2, 13, 16, 5, -1, 2},
        {"decode_gqa_interleaved_window", 6, 2, 21, 32, 1, 5, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        attn_array q, k, v, out, krope;
        if (load(cases[ci].dir, "q", &q) || load(cases[ci].dir, "k", &k) ||
            load(cases[ci].dir, "v", &v) || load(cases[ci].dir, "out", &out) ||
            load(cases[ci].dir, "k_rope", &krope))
            return;
        problem pr = {cases[ci].H, cases[ci].Hkv, cases[ci].T, cases[ci].D, cases[ci].prefill,
                      cases[ci].rope, cases[ci].window};
        /* rope_params picks base 500000 for the half pairing; these files say otherwise. */
        const int64_t n = pr.H * pr.T * pr.D;
        float *got = malloc((size_t)n * 4);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_kv_cache_config cfg = {1, pr.Hkv, pr.T, pr.D, 0, ATTN_DTYPE_F32};
        attn_kv_cache *c = NULL;
        CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
        attn_rope_params rp;
        attn_rope_params_init(&rp);
        rp.pairing = pr.rope == 2 ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
        rp.base = pr.rope == 2 ? 10000.0f : 500000.0f;
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        if (pr.window >= 0) {
            p.has_window = 1;
            p.window_left = pr.window;
            p.window_right = 0;
        }
        attn_tensor of = tu_tensor4(got, 1, pr.H, pr.T, pr.D);
        for (int64_t t = 0; t < pr.T;) {
            const int64_t m = t == 0 ? pr.prefill : 1;
            attn_tensor qs, ks, vs, os;
            attn_tensor_narrow(NULL, &q.tensor, 2, t, m, &qs);
            attn_tensor_narrow(NULL, &k.tensor, 2, t, m, &ks);
            attn_tensor_narrow(NULL, &v.tensor, 2, t, m, &vs);
            attn_tensor_narrow(NULL, &of, 2, t, m, &os);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &ks, &vs, &rp), ATTN_OK);
            CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qs, &p, &rp, &os, NULL), ATTN_OK);
            t += m;
        }
        const float *w = out.tensor.data;
        double worst = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double err = fabs((double)got[i] - w[i]), bound = 1e-5 + 1e-5 * fabs(w[i]);
            if (err / bound > worst)
                worst = err / bound;
            if (!(err <= bound)) {
                fprintf(stderr, "  %s element %lld: %.9g vs PyTorch %.9g\n", cases[ci].dir,
                        (long long)i, got[i], w[i]);
                CHECK(err <= bound);
                break;
            }
        }
        attn_tensor kv;
        CHECK_INT(attn_kv_cache_view(&ctx, c, 0, &kv, NULL), ATTN_OK);
        CHECK_INT(kv.shape[2], pr.T);
        const float *kw = krope.tensor.data;
        int close = 1;
        for (int64_t h = 0; h < pr.Hkv; h++)
            for (int64_t t = 0; t < pr.T; t++)
                for (int64_t d = 0; d < pr.D; d++) {
                    const float a = ((const float *)kv.data)[h * kv.stride[1] + t * kv.stride[2] + d];
                    const float b = kw[(h * pr.T + t) * pr.D + d];
                    close &= fabsf(a - b) <= 4.0f * 1.1920929e-7f * (fabsf(b) + 1.0f);
                }
        CHECK(close);
        fprintf(stderr, "   %s: worst error / bound %.3f\n", cases[ci].dir, worst);
        attn_kv_cache_free(&ctx, c);
        free(got);
        attn_array_free(NULL, &q), attn_array_free(NULL, &k), attn_array_free(NULL, &v);
        attn_array_free(NULL, &out), attn_array_free(NULL, &krope);
    }
}

static void test_full_truncate_view(void)
{
    TEST("a full cache appends nothing to any sequence and says so (capacity and lengths "
         "in the message); truncate rolls back and a re-append gives the same bits as the "
         "first time; views show what was appended, with the cache's strides");
    enum { B = 2, HKV = 2, CAP = 6, D = 4, DV = 3 };
    attn_kv_cache_config cfg = {B, HKV, CAP, D, DV, ATTN_DTYPE_F32};
    size_t bytes = 0;
    CHECK_INT(attn_kv_cache_bytes(NULL, &cfg, &bytes), ATTN_OK);
    void *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
    attn_kv_cache *c = NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, mem, bytes, &c), ATTN_OK);
    static float k[B * HKV * 4 * D], v[B * HKV * 4 * DV];
    tu_fill(k, B * HKV * 4 * D, 5);
    tu_fill(v, B * HKV * 4 * DV, 6);
    attn_tensor k4 = tu_tensor4(k, B, HKV, 4, D), v4 = tu_tensor4(v, B, HKV, 4, DV);
    attn_tensor k1 = tu_tensor4(k, 1, HKV, 4, D), v1 = tu_tensor4(v, 1, HKV, 4, DV);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k4, &v4, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, 1, 1), ATTN_OK);
    /* Sequence 0 holds 4 of 6: 4 more do not fit, even though sequence 1 has room. */
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k4, &v4, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "full");
    CHECK_STR_CONTAINS(ctx.message, "sequence 0 holds 4 of 6");
    CHECK_INT(attn_kv_cache_length(c, 0), 4);
    CHECK_INT(attn_kv_cache_length(c, 1), 1);
    attn_tensor kv, vv;
    CHECK_INT(attn_kv_cache_view(&ctx, c, 1, &kv, &vv), ATTN_OK);
    CHECK_INT(kv.shape[2], 1);
    CHECK_INT(kv.stride[1], CAP * D);
    CHECK_INT(vv.shape[3], DV);
    CHECK_INT(vv.stride[1], CAP * DV);
    /* Sequence 1's 4 more fit after the roll back. */
    CHECK_INT(attn_kv_cache_append(&ctx, c, 1, &k1, &v1, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(c, 1), 5);
    CHECK_INT(attn_kv_cache_view(&ctx, c, 0, &kv, &vv), ATTN_OK);
    int same = 1;
    for (int64_t h = 0; h < HKV; h++)
        for (int64_t t = 0; t < 4; t++) {
            same &= memcmp((float *)kv.data + h * kv.stride[1] + t * kv.stride[2],
                           &k[(h * 4 + t) * D], D * 4) == 0;
            same &= memcmp((float *)vv.data + h * vv.stride[1] + t * vv.stride[2],
                           &v[(h * 4 + t) * DV], DV * 4) == 0;
        }
    CHECK(same);
    /* Sequence 1 now: position 0 from the first append (k4[1]), 1..4 from k1 (k4[0]). */
    CHECK_INT(attn_kv_cache_view(&ctx, c, 1, &kv, &vv), ATTN_OK);
    same = 1;
    for (int64_t h = 0; h < HKV; h++) {
        same &= memcmp((float *)kv.data + h * kv.stride[1], &k[((HKV + h) * 4) * D], D * 4) == 0;
        for (int64_t t = 0; t < 4; t++)
            same &= memcmp((float *)kv.data + h * kv.stride[1] + (t + 1) * kv.stride[2],
                           &k[(h * 4 + t) * D], D * 4) == 0;
    }
    CHECK(same);

    /* Roll back, append again, attend: the same bits as before the roll back. */
    static float q[HKV * 2 * 2 * D], o1[HKV * 2 * 2 * DV], o2[HKV * 2 * 2 * DV];
    tu_fill(q, HKV * 2 * 2 * D, 8);
    attn_tensor qt = tu_tensor4(q, 1, HKV * 2, 2, D);
    attn_tensor ot1 = tu_tensor4(o1, 1, HKV * 2, 2, DV), ot2 = tu_tensor4(o2, 1, HKV * 2, 2, DV);
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 1, &qt, NULL, NULL, &ot1, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, 1, 1), ATTN_OK);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 1, &k1, &v1, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 1, &qt, NULL, NULL, &ot2, NULL), ATTN_OK);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, -1, 0), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(c, 0) + attn_kv_cache_length(c, 1), 0);
    attn_kv_cache_free(&ctx, c);
    free(mem);
}

static void test_options(void)
{
    TEST("attend takes section 6's options like attn_sdpa on the stored keys: mask and bias "
         "over the capacity (each sequence reads its first length entries), ALiBi, softcap, "
         "sinks and lse, weights [Bn, H, Tq, capacity] with zeros past a sequence's length");
    enum { B = 2, H = 4, HKV = 2, CAP = 9, D = 8, TQ = 2 };
    const int64_t L[B] = {5, 9};
    attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, ATTN_DTYPE_F32};
    attn_kv_cache *c = NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
    static float k[HKV * CAP * D], v[HKV * CAP * D];
    for (int b = 0; b < B; b++) {
        tu_fill(k, HKV * L[b] * D, 40 + (uint64_t)b);
        tu_fill(v, HKV * L[b] * D, 50 + (uint64_t)b);
        attn_tensor kt = tu_tensor4(k, 1, HKV, L[b], D), vt = tu_tensor4(v, 1, HKV, L[b], D);
        CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kt, &vt, NULL), ATTN_OK);
    }
    static float q[B * H * TQ * D], out[B * H * TQ * D], w[B * H * TQ * CAP], lse[B * H * TQ];
    static float bias[B * 1 * 1 * CAP], sinks[H], want_o[H * TQ * D], want_w[H * TQ * CAP],
        want_l[H * TQ];
    static unsigned char mask[B * CAP];
    tu_fill(q, B * H * TQ * D, 60);
    tu_fill(bias, B * CAP, 61);
    tu_fill(sinks, H, 62);
    for (int i = 0; i < B * CAP; i++)
        mask[i] = (unsigned char)(i % 4 != 1);
    attn_tensor qt = tu_tensor4(q, B, H, TQ, D), ot = tu_tensor4(out, B, H, TQ, D),
                wt = tu_tensor4(w, B, H, TQ, CAP), bt = tu_tensor4(bias, B, 1, 1, CAP);
    const int64_t mshape[4] = {B, 1, 1, CAP}, lshape[3] = {B, H, TQ}, sshape[1] = {H};
    attn_tensor mt, lt, st;
    attn_tensor_init(NULL, &mt, ATTN_DTYPE_BOOL, mask, 4, mshape);
    attn_tensor_init(NULL, &lt, ATTN_DTYPE_F32, lse, 3, lshape);
    attn_tensor_init(NULL, &st, ATTN_DTYPE_F32, sinks, 1, sshape);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &mt;
    p.bias = &bt;
    p.alibi = 1;
    p.softcap = 3.0f;
    p.sinks = &st;
    p.lse = &lt;
    memset(w, 0x7f, sizeof w); /* not zero, so the zeros past a length are written */
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, &wt), ATTN_OK);
    double worst = 0.0;
    for (int b = 0; b < B; b++) {
        attn_tensor kv, vv, qb, mb, bb, mk, bk;
        CHECK_INT(attn_kv_cache_view(&ctx, c, b, &kv, &vv), ATTN_OK);
        attn_tensor_narrow(NULL, &qt, 0, b, 1, &qb);
        attn_tensor_narrow(NULL, &mt, 0, b, 1, &mb);
        attn_tensor_narrow(NULL, &bt, 0, b, 1, &bb);
        attn_tensor_narrow(NULL, &mb, 3, 0, L[b], &mk);
        attn_tensor_narrow(NULL, &bb, 3, 0, L[b], &bk);
        attn_tensor wo = tu_tensor4(want_o, 1, H, TQ, D), ww = tu_tensor4(want_w, 1, H, TQ, L[b]);
        const int64_t l3[3] = {1, H, TQ};
        attn_tensor wl;
        attn_tensor_init(NULL, &wl, ATTN_DTYPE_F32, want_l, 3, l3);
        attn_sdpa_params pr = p;
        pr.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        pr.mask = &mk;
        pr.bias = &bk;
        pr.lse = &wl;
        CHECK_INT(attn_sdpa_ref(&ctx, &qb, &kv, &vv, &pr, &wo, &ww), ATTN_OK);
        for (int64_t i = 0; i < H * TQ * D; i++) {
            const double e = fabs((double)out[b * H * TQ * D + i] - want_o[i]);
            worst = e > worst ? e : worst;
        }
        for (int64_t hi = 0; hi < H * TQ; hi++) {
            const double e = fabs((double)lse[b * H * TQ + hi] - want_l[hi]);
            worst = e > worst ? e : worst;
            for (int64_t j = 0; j < CAP; j++) {
                const float g = w[(b * H * TQ + hi) * CAP + j];
                if (j >= L[b])
                    CHECK(g == 0.0f);
                else {
                    const double e2 = fabs((double)g - want_w[hi * L[b] + j]);
                    worst = e2 > worst ? e2 : worst;
                }
            }
        }
    }
    /* The same kernel may run both (the reference) or not (a fused path with the
     * options): 2e-6 is the fused kernel's floor at these magnitudes (below 1; the
     * lse below 4, hence 8e-6). */
    if (!(worst <= 8e-6))
        fprintf(stderr, "  largest difference from attn_sdpa_ref: %.3g\n", worst);
    CHECK(worst <= 8e-6);
    attn_kv_cache_free(&ctx, c);
}

/* ---- zero allocations per step ---------------------------------------------------- */

typedef struct counting {
    long calls;
} counting;

static void *count_alloc(void *user, size_t n)
{
    ((counting *)user)->calls++;
    return malloc(n);
}

static void count_free(void *user, void *p)
{
    (void)user;
    free(p);
}

static void test_no_alloc_per_step(void)
{
    TEST("a decoding loop allocates nothing per step: with keep_workspace after its first "
         "step, with a workspace of attn_kv_cache_workspace_size bytes from the start, and a "
         "cache in caller memory allocates nothing at all (counting allocator; every arch, "
         "1 and 2 threads, RoPE and a window on, B 2, S5-like heads)");
    enum { B = 2, H = 8, HKV = 2, D = 64, CAP = 300, PRE = 256, STEPS = 40 };
    static float k[B * HKV * PRE * D], v[B * HKV * PRE * D], q[B * H * D], k1[B * HKV * D],
        v1[B * HKV * D], o[B * H * D];
    tu_fill(k, B * HKV * PRE * D, 70);
    tu_fill(v, B * HKV * PRE * D, 71);
    tu_fill(q, B * H * D, 72);
    tu_fill(k1, B * HKV * D, 73);
    tu_fill(v1, B * HKV * D, 74);
    attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, ATTN_DTYPE_F32};
    size_t cache_bytes = 0;
    CHECK_INT(attn_kv_cache_bytes(NULL, &cfg, &cache_bytes), ATTN_OK);
    void *mem = aligned_alloc(64, (cache_bytes + 63) / 64 * 64);
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.has_window = 1;
    p.window_left = 100;
    p.window_right = 0;
    attn_tensor kt = tu_tensor4(k, B, HKV, PRE, D), vt = tu_tensor4(v, B, HKV, PRE, D);
    attn_tensor qt = tu_tensor4(q, B, H, 1, D), k1t = tu_tensor4(k1, B, HKV, 1, D),
                v1t = tu_tensor4(v1, B, HKV, 1, D), ot = tu_tensor4(o, B, H, 1, D);
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int threads = 1; threads <= 2; threads++)
            for (int mode = 0; mode < 2; mode++) {
                counting cnt = {0};
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.allocator.alloc = count_alloc;
                ctx.allocator.free = count_free;
                ctx.allocator.user = &cnt;
                ctx.arch = archs[a];
                ctx.threads = threads;
                attn_kv_cache *c = NULL;
                CHECK_INT(attn_kv_cache_create(&ctx, &cfg, mem, cache_bytes, &c), ATTN_OK);
                CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, &rp), ATTN_OK);
                void *ws = NULL;
                if (mode == 0) {
                    ctx.keep_workspace = 1;
                } else {
                    size_t need = 0;
                    CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &qt, &p, &rp, &ot, NULL,
                                                           &need), ATTN_OK);
                    ws = aligned_alloc(64, (need + 63) / 64 * 64 + 64);
                    ctx.workspace = ws;
                    ctx.workspace_size = need;
                }
                const long before = cnt.calls;
                long first_step = 0;
                for (int s = 0; s < STEPS; s++) {
                    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k1t, &v1t, &rp), ATTN_OK);
                    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, &rp, &ot, NULL), ATTN_OK);
                    if (s == 0)
                        first_step = cnt.calls - before;
                }
                const long later = cnt.calls - before - first_step;
                if (later != 0 || (mode == 1 && first_step != 0))
                    fprintf(stderr, "  %s, %d threads, %s: %ld allocations in the first step, "
                                    "%ld in the %d after\n",
                            attn_arch_name(archs[a]), threads, mode ? "workspace" : "keep",
                            first_step, later, STEPS - 1);
                CHECK_INT(later, 0);
                if (mode == 1)
                    CHECK_INT(first_step, 0);
                CHECK_INT(attn_kv_cache_length(c, 1), PRE + STEPS);
                attn_kv_cache_free(&ctx, c);
                attn_ctx_release(&ctx);
                free(ws);
            }
    }
    free(mem);
}

/* An allocator that counts its calls (test_batch_split's workspace check). */
static long split_allocs;
static void *split_alloc(void *user, size_t n)
{
    (void)user;
    split_allocs++;
    return malloc(n);
}
static void split_free(void *user, void *p)
{
    (void)user;
    free(p);
}

/* One batched step of test_batch_split: q [B, H, 1, D] against the cache, the
 * options on, into out [B, H, 1, D] and lse [B, H, 1]. */
static int split_step(attn_ctx *ctx, attn_kv_cache *c, float *q, float *out, float *lse,
                      float *sinks, int64_t B, int64_t H, int64_t D)
{
    attn_tensor qt = tu_tensor4(q, B, H, 1, D), ot = tu_tensor4(out, B, H, 1, D),
                lt = tu_tensor3(lse, B, H, 1), st;
    const int64_t hs[1] = {H};
    attn_tensor_init(NULL, &st, ATTN_DTYPE_F32, sinks, 1, hs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.has_window = 1;
    p.window_left = 700;
    p.window_right = -1;
    p.softcap = 20.0f;
    p.alibi = 1;
    p.sinks = &st;
    p.lse = &lt;
    return attn_kv_cache_attend(ctx, c, 0, &qt, &p, NULL, &ot, NULL);
}

static void test_batch_split(void)
{
    TEST("batched decoding on the split-key path (sequences of 300, 1000 and 2500 "
         "positions, H 8 over Hkv 2, a window, softcap, ALiBi, sinks and lse): every "
         "sequence's output and lse equal attn_sdpa on that sequence alone bit for bit, "
         "on every fused path, with 1, 2, 3 and 7 threads; and a loop whose workspace was "
         "sized before the lengths crossed into the split path allocates nothing");
    enum { B = 3, H = 8, HKV = 2, D = 32, CAP = 2600 };
    const int64_t L[B] = {300, 1000, 2500};
    static float k[B][HKV * CAP * D], v[B][HKV * CAP * D];
    static float q[B * H * D], out[B * H * D], lse[B * H], sinks[H];
    static float want[B * H * D], want_l[B * H];
    tu_fill(q, B * H * D, 70);
    tu_fill(sinks, H, 71);
    for (int a = 1; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, ATTN_DTYPE_F32};
        attn_kv_cache *c = NULL;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.keep_workspace = 1;
        CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
        for (int b = 0; b < B; b++) {
            tu_fill(k[b], HKV * L[b] * D, 80 + (uint64_t)b);
            tu_fill(v[b], HKV * L[b] * D, 90 + (uint64_t)b);
            attn_tensor kt = tu_tensor4(k[b], 1, HKV, L[b], D),
                        vt = tu_tensor4(v[b], 1, HKV, L[b], D);
            CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kt, &vt, NULL), ATTN_OK);
        }
        /* Each sequence alone: attn_sdpa on its own keys, bottom-right causal. */
        for (int b = 0; b < B; b++) {
            attn_ctx one;
            attn_ctx_init(&one);
            one.arch = archs[a];
            one.threads = 1;
            attn_tensor qt = tu_tensor4(q + b * H * D, 1, H, 1, D),
                        kt = tu_tensor4(k[b], 1, HKV, L[b], D),
                        vt = tu_tensor4(v[b], 1, HKV, L[b], D),
                        ot = tu_tensor4(want + b * H * D, 1, H, 1, D),
                        lt = tu_tensor3(want_l + b * H, 1, H, 1), st;
            const int64_t hs[1] = {H};
            attn_tensor_init(NULL, &st, ATTN_DTYPE_F32, sinks, 1, hs);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            p.has_window = 1;
            p.window_left = 700;
            p.window_right = -1;
            p.softcap = 20.0f;
            p.alibi = 1;
            p.sinks = &st;
            p.lse = &lt;
            CHECK_INT(attn_sdpa(&one, &qt, &kt, &vt, &p, &ot, NULL), ATTN_OK);
        }
        static const int counts[] = {1, 2, 3, 7};
        for (int ci = 0; ci < 4; ci++) {
            ctx.threads = counts[ci];
            memset(out, 0, sizeof out);
            memset(lse, 0, sizeof lse);
            CHECK_INT(split_step(&ctx, c, q, out, lse, sinks, B, H, D), ATTN_OK);
            const int same = memcmp(out, want, sizeof out) == 0 && memcmp(lse, want_l, sizeof lse) == 0;
            if (!same) {
                double d = 0;
                for (int x = 0; x < B * H * D; x++)
                    d = fmax(d, fabs((double)out[x] - (double)want[x]));
                fprintf(stderr, "  %s, %d threads: max |batched - alone| %.3g\n",
                        attn_arch_name(archs[a]), counts[ci], d);
            }
            CHECK(same);
        }
        attn_kv_cache_free(&ctx, c);
        attn_ctx_release(&ctx);

        /* One sequence of 500 positions (unsplit), its workspace sized then, and 30
         * steps that take it past 512 keys (split): no allocation. */
        attn_kv_cache_config cfg1 = {1, HKV, 1100, D, 0, ATTN_DTYPE_F32};
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.threads = 2;
        CHECK_INT(attn_kv_cache_create(&ctx, &cfg1, NULL, 0, &c), ATTN_OK);
        attn_tensor kt = tu_tensor4(k[2], 1, HKV, 500, D), vt = tu_tensor4(v[2], 1, HKV, 500, D);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, NULL), ATTN_OK);
        attn_tensor qt = tu_tensor4(q, 1, H, 1, D), ot = tu_tensor4(out, 1, H, 1, D);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        size_t bytes = 0;
        CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &qt, &p, NULL, &ot, NULL, &bytes),
                  ATTN_OK);
        void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
        ctx.allocator.alloc = split_alloc;
        ctx.allocator.free = split_free;
        split_allocs = 0;
        for (int s = 0; s < 30; s++) {
            /* The next token's k and v for both heads: any values will do. */
            attn_tensor k1b = tu_tensor4(k[1] + (size_t)(HKV * s) * D, 1, HKV, 1, D),
                        v1b = tu_tensor4(v[1] + (size_t)(HKV * s) * D, 1, HKV, 1, D);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k1b, &v1b, NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, NULL), ATTN_OK);
        }
        if (split_allocs)
            fprintf(stderr, "  %s: %ld allocations in 30 steps from 500 to 530 keys\n",
                    attn_arch_name(archs[a]), split_allocs);
        CHECK_INT(split_allocs, 0);
        attn_kv_cache_free(&ctx, c);
        free(ws);
    }
}

int main(void)
{
    test_decode_matches_full_pass();
    test_batch_of_lengths();
    test_batch_split();
    test_golden_decode();
    test_full_truncate_view();
    test_options();
    test_no_alloc_per_step();
    return check_summary("test_kv_cache");
}
