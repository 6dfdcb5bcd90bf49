/*
 * test_kv_adversarial.c - the KV cache and RoPE probed as a server would probe them:
 * the cache's bookkeeping at its edges, values that must stay in their own
 * sequence, chunked prefill against attn_sdpa on the cache's view, RoPE applied
 * once at append, and aliasing that the contract refuses.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const attn_arch archs[5] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                                   ATTN_ARCH_AVX512, ATTN_ARCH_AVX512_BF16};

static int arch_runs(attn_arch a)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = a;
    float x[4] = {1, 2, 3, 4}, o[4];
    attn_tensor t = tu_tensor4(x, 1, 1, 1, 4), ot = tu_tensor4(o, 1, 1, 1, 4);
    return attn_sdpa(&ctx, &t, &t, &t, NULL, &ot, NULL) == ATTN_OK;
}

static attn_kv_cache *make(attn_ctx *ctx, int64_t B, int64_t Hkv, int64_t cap, int64_t D,
                           attn_dtype dt)
{
    attn_kv_cache_config cfg = {B, Hkv, cap, D, 0, dt};
    attn_kv_cache *c = NULL;
    CHECK_INT(attn_kv_cache_create(ctx, &cfg, NULL, 0, &c), ATTN_OK);
    return c;
}

static void test_bookkeeping(void)
{
    TEST("bookkeeping: exactly to capacity, one past it, Tnew = 0, ranges that overflow");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { B = 3, HKV = 2, CAP = 5, D = 4 };
    attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, ATTN_DTYPE_F32);
    static float k[B * HKV * CAP * D], v[B * HKV * CAP * D];
    tu_fill(k, B * HKV * CAP * D, 1);
    tu_fill(v, B * HKV * CAP * D, 2);
    attn_tensor k5 = tu_tensor4(k, 1, HKV, CAP, D), v5 = tu_tensor4(v, 1, HKV, CAP, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k5, &v5, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(c, 0), CAP);
    attn_tensor k1 = tu_tensor4(k, 1, HKV, 1, D), v1 = tu_tensor4(v, 1, HKV, 1, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k1, &v1, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_length(c, 0), CAP);
    /* Tnew = 0: a size-0 axis is refused as every attn tensor's is, and nothing
     * changes. */
    attn_tensor k0 = k1, v0 = v1;
    k0.shape[2] = v0.shape[2] = 0;
    CHECK_INT(attn_kv_cache_append(&ctx, c, 1, &k0, &v0, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "sizes must be at least 1");
    CHECK_INT(attn_kv_cache_length(c, 1), 0);
    /* first near INT64_MAX: refused, and the message names no wrapped number. */
    attn_tensor k2 = tu_tensor4(k, 2, HKV, 1, D), v2 = tu_tensor4(v, 2, HKV, 1, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, INT64_MAX, &k2, &v2, NULL),
              ATTN_STATUS_INVALID_ARGUMENT);
    /* The message's last sequence was first + n - 1 in int64: a signed overflow
     * (undefined behaviour) that printed -9223372036854775808 here. */
    CHECK(strstr(ctx.message, "-9223372036854775808") == NULL);
    CHECK_STR_CONTAINS(ctx.message, "9223372036854775807");
    CHECK_INT(attn_kv_cache_append(&ctx, c, 2, &k2, &v2, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_append(&ctx, c, -1, &k1, &v1, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_length(c, 2), 0);
    /* truncate beyond the length, to 0, and append again */
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, 0, CAP + 1), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, 3, 0), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, -2, 0), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, INT64_MAX, 0), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, -1, INT64_MAX), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(c, 0), CAP);
    CHECK_INT(attn_kv_cache_truncate(&ctx, c, 0, 0), ATTN_OK);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k5, &v5, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(c, 0), CAP);
    /* attend on an empty sequence: refused (Tq above its length of 0) */
    float q[4 * D], o[4 * D];
    tu_fill(q, 4 * D, 3);
    attn_tensor q1 = tu_tensor4(q, 1, HKV, 1, D), o1 = tu_tensor4(o, 1, HKV, 1, D);
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 1, &q1, NULL, NULL, &o1, NULL),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "holds only 0 positions");
    /* Tq > length */
    attn_tensor q6 = tu_tensor4(q, 1, HKV, 2, D), o6 = tu_tensor4(o, 1, HKV, 2, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 1, &k1, &v1, NULL), ATTN_OK);
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 1, &q6, NULL, NULL, &o6, NULL),
              ATTN_STATUS_INVALID_ARGUMENT);
    attn_kv_cache_free(&ctx, c);
}

/* S9-like: 3 sequences of lengths 1100, 2100, 40 (split-key for the long ones at
 * Tq = 1), GQA 4/2, D = 64; a NaN in one key of sequence 1, an inf in one value
 * of sequence 1, and NaN in sequence 0's slots past its length. Sequences 0 and 2
 * must equal themselves attended alone on a clean cache, bit for bit, on every
 * arch and with 1 and 2 threads. */
static void test_poison_stays_home(void)
{
    TEST("NaN and inf in one sequence (and stale NaN past a sequence's length) reach no "
         "other sequence, float32 and 16-bit caches, on every arch, 1 and 2 threads, with "
         "a window that hides all but the last key and with sinks");
    enum { B = 3, H = 4, HKV = 2, CAP = 2200, D = 64 };
    const int64_t lens[B] = {1100, 2100, 40}; /* 1100: a 16-bit split ends mid-chunk */
    float *k = malloc(sizeof(float) * HKV * CAP * D), *v = malloc(sizeof(float) * HKV * CAP * D);
    enum { TQMAX = 9 }; /* Tq = 1 (row and split-key paths) and 9 (the tile path) */
    float *q = malloc(sizeof(float) * B * H * TQMAX * D),
          *o = malloc(sizeof(float) * B * H * TQMAX * D),
          *ref = malloc(sizeof(float) * B * H * TQMAX * D),
          *one = malloc(sizeof(float) * 3 * B * H * TQMAX * D); /* 1 thread's, per option */
    tu_fill(q, B * H * TQMAX * D, 9);
    static const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    for (int ai = 0; ai < 5; ai++) {
        if (!arch_runs(archs[ai]))
            continue;
        for (int di = 0; di < 3; di++)
        for (int64_t Tq = 1; Tq <= TQMAX; Tq += TQMAX - 1)
        for (int th = 1; th <= 2; th++)
            for (int win = 0; win < 3; win++) {
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.arch = archs[ai];
                ctx.threads = th;
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                float sinks[H] = {0.5f, -1.0f, 2.0f, 0.0f};
                attn_tensor st = tu_tensor4(sinks, 1, 1, 1, H);
                st.ndim = 1;
                st.shape[0] = H;
                st.stride[0] = 1;
                if (win == 1) { /* only the last key visible */
                    p.has_window = 1;
                    p.window_left = 0;
                    p.window_right = 0;
                } else if (win == 2) {
                    p.sinks = &st;
                }
                /* clean caches: each sequence alone */
                attn_kv_cache *clean = make(&ctx, 1, HKV, CAP, D, dts[di]);
                for (int b = 0; b < B; b++) {
                    if (b == 1)
                        continue;
                    attn_kv_cache_truncate(&ctx, clean, 0, 0);
                    tu_fill(k, HKV * CAP * D, 100 + b);
                    tu_fill(v, HKV * CAP * D, 200 + b);
                    attn_tensor kt = tu_tensor4(k, 1, HKV, lens[b], D),
                                vt = tu_tensor4(v, 1, HKV, lens[b], D);
                    kt.stride[1] = vt.stride[1] = CAP * D;
                    CHECK_INT(attn_kv_cache_append(&ctx, clean, 0, &kt, &vt, NULL), ATTN_OK);
                    attn_tensor qt = tu_tensor4(q + b * H * Tq * D, 1, H, Tq, D),
                                ot = tu_tensor4(ref + b * H * Tq * D, 1, H, Tq, D);
                    CHECK_INT(attn_kv_cache_attend(&ctx, clean, 0, &qt, &p, NULL, &ot, NULL),
                              ATTN_OK);
                }
                attn_kv_cache_free(&ctx, clean);
                attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, dts[di]);
                for (int b = 0; b < B; b++) {
                    tu_fill(k, HKV * CAP * D, 100 + b);
                    tu_fill(v, HKV * CAP * D, 200 + b);
                    int64_t n = b == 0 ? lens[b] + 50 : lens[b];
                    if (b == 0)
                        for (int64_t t = lens[b]; t < n; t++)
                            for (int64_t d = 0; d < D; d++)
                                k[t * D + d] = v[(CAP + t) * D + d] = NAN;
                    if (b == 1) {
                        k[(CAP + 1000) * D + 3] = NAN;
                        v[17 * D + 5] = INFINITY;
                        v[18 * D + 6] = 1e6f; /* inf in float16 */
                    }
                    attn_tensor kt = tu_tensor4(k, 1, HKV, n, D), vt = tu_tensor4(v, 1, HKV, n, D);
                    kt.stride[1] = vt.stride[1] = CAP * D;
                    CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kt, &vt, NULL), ATTN_OK);
                    if (b == 0)
                        CHECK_INT(attn_kv_cache_truncate(&ctx, c, 0, lens[0]), ATTN_OK);
                }
                attn_tensor qt = tu_tensor4(q, B, H, Tq, D), ot = tu_tensor4(o, B, H, Tq, D);
                for (int64_t i = 0; i < B * H * Tq * D; i++)
                    o[i] = 12345.0f;
                /* with weights (the sequences one by one; the keys not split) */
                float *w = malloc(sizeof(float) * B * H * Tq * CAP);
                attn_tensor wt = tu_tensor4(w, B, H, Tq, CAP);
                for (int64_t i = 0; i < B * H * Tq * CAP; i++)
                    w[i] = NAN;
                CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, &wt), ATTN_OK);
                int wok = 1;
                for (int b = 0; b < B; b += 2)
                    for (int64_t r = 0; r < H * Tq; r++)
                        for (int64_t j = 0; j < CAP; j++) {
                            const float x = w[(b * H * Tq + r) * CAP + j];
                            wok &= j < lens[b] ? isfinite(x) && x >= 0.0f : x == 0.0f;
                        }
                free(w);
                CHECK(wok);
                CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, NULL), ATTN_OK);
                const size_t n = (size_t)(H * Tq * D);
                int ok0 = memcmp(o, ref, sizeof(float) * n) == 0;
                int ok2 = memcmp(o + 2 * n, ref + 2 * n, sizeof(float) * n) == 0;
                if (!ok0 || !ok2)
                    fprintf(stderr, "  dtype %d Tq %d arch %d threads %d option %d: seq0 %s seq2 %s (o0 %g ref %g)\n",
                            (int)dts[di], (int)Tq, (int)archs[ai], th, win, ok0 ? "ok" : "DIFFERS",
                            ok2 ? "ok" : "DIFFERS", o[0], ref[0]);
                CHECK(ok0 && ok2);
                /* 1 and 2 threads: the same bits (sequence 1's NaN rows included) */
                float *mine = one + (size_t)win * B * H * TQMAX * D;
                if (th == 1)
                    memcpy(mine, o, sizeof(float) * B * n);
                else
                    CHECK(memcmp(mine, o, sizeof(float) * B * n) == 0);
                attn_kv_cache_free(&ctx, c);
            }
    }
    free(k);
    free(v);
    free(q);
    free(o);
    free(ref);
    free(one);
}

/* Chunked prefill: Tq = 7 new rows at the end of a sequence of 12, bottom-right
 * causal, against attn_sdpa on the cache's own view: the same bits. */
static void test_chunked_prefill_bits(void)
{
    TEST("attend with Tq > 1 (chunked prefill) equals attn_sdpa bottom-right on the cache's "
         "view, bit for bit, every arch, with RoPE, ALiBi and softcap, a window and sinks");
    enum { HKV = 2, H = 4, CAP = 40, D = 16, T0 = 5, TN = 7 };
    static float k[HKV * (T0 + TN) * D], v[HKV * (T0 + TN) * D], q[H * TN * D], o1[H * TN * D],
        o2[H * TN * D];
    tu_fill(k, HKV * (T0 + TN) * D, 11);
    tu_fill(v, HKV * (T0 + TN) * D, 12);
    tu_fill(q, H * TN * D, 13);
    for (int ai = 0; ai < 5; ai++) {
        if (!arch_runs(archs[ai]))
            continue;
        for (int rope = 0; rope < 2; rope++)
          for (int opt = 0; opt < 3; opt++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = archs[ai];
            attn_kv_cache *c = make(&ctx, 1, HKV, CAP, D, ATTN_DTYPE_F32);
            attn_rope_params rp;
            attn_rope_params_init(&rp);
            rp.pairing = ATTN_ROPE_HALF;
            attn_tensor ka = tu_tensor4(k, 1, HKV, T0, D), va = tu_tensor4(v, 1, HKV, T0, D);
            ka.stride[1] = va.stride[1] = (T0 + TN) * D;
            attn_tensor kb = ka, vb = va;
            kb.data = k + T0 * D;
            vb.data = v + T0 * D;
            kb.shape[2] = vb.shape[2] = TN;
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &ka, &va, rope ? &rp : NULL), ATTN_OK);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kb, &vb, rope ? &rp : NULL), ATTN_OK);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            if (opt == 1) { /* ALiBi and a softcap: positions from the sequence's start */
                p.alibi = 1;
                p.softcap = 2.0f;
            } else if (opt == 2) { /* a window of 3 keys and a sink per head */
                static float sk[H] = {0.25f, -3.0f, 1.0f, 4.0f};
                static attn_tensor skt;
                skt = tu_tensor4(sk, 1, 1, 1, H);
                skt.ndim = 1;
                skt.shape[0] = H;
                skt.stride[0] = 1; /* tu_tensor4's axis 0 stride was H */
                p.sinks = &skt;
                p.has_window = 1;
                p.window_left = 2;
                p.window_right = 0;
            }
            attn_tensor qt = tu_tensor4(q, 1, H, TN, D), ot1 = tu_tensor4(o1, 1, H, TN, D),
                        ot2 = tu_tensor4(o2, 1, H, TN, D);
            CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, rope ? &rp : NULL, &ot1, NULL),
                      ATTN_OK);
            attn_tensor kv, vv;
            CHECK_INT(attn_kv_cache_view(&ctx, c, 0, &kv, &vv), ATTN_OK);
            /* RoPE once at append: the view holds k rotated at positions 0 .. 11 */
            static float kr[HKV * (T0 + TN) * D], qr[H * TN * D];
            attn_tensor kall = tu_tensor4(k, 1, HKV, T0 + TN, D),
                        krt = tu_tensor4(kr, 1, HKV, T0 + TN, D);
            attn_tensor qrt = tu_tensor4(qr, 1, H, TN, D);
            if (rope) {
                CHECK_INT(attn_rope_apply(&ctx, &rp, &kall, &krt), ATTN_OK);
                int same = 1;
                for (int64_t h = 0; h < HKV; h++)
                    same &= memcmp((float *)kv.data + h * kv.stride[1], kr + h * (T0 + TN) * D,
                                   sizeof(float) * (T0 + TN) * D) == 0;
                CHECK(same);
                attn_rope_params rq = rp;
                rq.offset = T0;
                CHECK_INT(attn_rope_apply(&ctx, &rq, &qt, &qrt), ATTN_OK);
            }
            CHECK_INT(attn_sdpa(&ctx, rope ? &qrt : &qt, &kv, &vv, &p, &ot2, NULL), ATTN_OK);
            int same = memcmp(o1, o2, sizeof o1) == 0;
            if (!same)
                fprintf(stderr, "  arch %d rope %d option %d: attend != sdpa on the view\n",
                        (int)archs[ai], rope, opt);
            CHECK(same);
            attn_kv_cache_free(&ctx, c);
        }
    }
}

/* A 16-bit cache with RoPE: the stored keys are the float32 rotation rounded once
 * (from float32 k, or from 16-bit k widened), in a chunked prefill too; attend
 * with a 16-bit q and out equals attn_sdpa on the cache's views bit for bit. */
static void test_half_rope_once(void)
{
    TEST("16-bit caches: RoPE'd keys are rounded once (float32 or 16-bit k), and attend "
         "equals attn_sdpa on the views bit for bit, every arch");
    enum { HKV = 2, H = 4, CAP = 40, D = 16, T0 = 5, TN = 7, T = T0 + TN };
    static float k[HKV * T * D], v[HKV * T * D], q[H * TN * D], kr[HKV * T * D];
    static uint16_t kh[HKV * T * D], vh[HKV * T * D], krh[HKV * T * D], qh[H * TN * D],
        o1[H * TN * D], o2[H * TN * D];
    tu_fill(k, HKV * T * D, 21);
    tu_fill(v, HKV * T * D, 22);
    tu_fill(q, H * TN * D, 23);
    for (int i = 0; i < HKV * T * D; i++)
        k[i] *= 300.0f; /* large keys: the rotation's rounding shows */
    static const attn_dtype dts[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    for (int ai = 0; ai < 5; ai++) {
        if (!arch_runs(archs[ai]))
            continue;
        for (int di = 0; di < 2; di++)
            for (int kin16 = 0; kin16 < 2; kin16++) {
                const attn_dtype dt = dts[di];
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.arch = archs[ai];
                attn_rope_params rp;
                attn_rope_params_init(&rp);
                rp.pairing = kin16 ? ATTN_ROPE_INTERLEAVED : ATTN_ROPE_HALF;
                const int64_t sh[4] = {1, HKV, T, D}, sq[4] = {1, H, TN, D};
                attn_tensor kf = tu_tensor4(k, 1, HKV, T, D), vf = tu_tensor4(v, 1, HKV, T, D),
                            krf = tu_tensor4(kr, 1, HKV, T, D), k16, v16, kr16, q16, ot1, ot2;
                attn_tensor_init(NULL, &k16, dt, kh, 4, sh);
                attn_tensor_init(NULL, &v16, dt, vh, 4, sh);
                attn_tensor_init(NULL, &kr16, dt, krh, 4, sh);
                attn_tensor_init(NULL, &q16, dt, qh, 4, sq);
                attn_tensor_init(NULL, &ot1, dt, o1, 4, sq);
                attn_tensor_init(NULL, &ot2, dt, o2, 4, sq);
                CHECK_INT(attn_tensor_convert(&ctx, &kf, &k16), ATTN_OK);
                CHECK_INT(attn_tensor_convert(&ctx, &vf, &v16), ATTN_OK);
                attn_tensor qf = tu_tensor4(q, 1, H, TN, D);
                CHECK_INT(attn_tensor_convert(&ctx, &qf, &q16), ATTN_OK);
                /* expected: rotate (k, or k16 widened) in float32, round once */
                if (kin16)
                    CHECK_INT(attn_tensor_convert(&ctx, &k16, &krf), ATTN_OK);
                CHECK_INT(attn_rope_apply(&ctx, &rp, kin16 ? &krf : &kf, &krf), ATTN_OK);
                CHECK_INT(attn_tensor_convert(&ctx, &krf, &kr16), ATTN_OK);
                attn_kv_cache *c = make(&ctx, 1, HKV, CAP, D, dt);
                attn_tensor ka = kin16 ? k16 : kf, va = kin16 ? v16 : vf;
                ka.shape[2] = va.shape[2] = T0;
                attn_tensor kb = ka, vb = va;
                const size_t es = kin16 ? 2 : 4;
                kb.data = (char *)ka.data + T0 * D * es;
                vb.data = (char *)va.data + T0 * D * es;
                kb.shape[2] = vb.shape[2] = TN;
                CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &ka, &va, &rp), ATTN_OK);
                CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kb, &vb, &rp), ATTN_OK);
                attn_tensor kv, vv;
                CHECK_INT(attn_kv_cache_view(&ctx, c, 0, &kv, &vv), ATTN_OK);
                int same = 1;
                for (int64_t h = 0; h < HKV; h++)
                    same &= memcmp((uint16_t *)kv.data + h * kv.stride[1], krh + h * T * D,
                                   sizeof(uint16_t) * T * D) == 0;
                if (!same)
                    fprintf(stderr, "  dtype %d arch %d k16 %d: stored keys are not one rounding\n",
                            (int)dt, (int)archs[ai], kin16);
                CHECK(same);
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &q16, &p, NULL, &ot1, NULL), ATTN_OK);
                CHECK_INT(attn_sdpa(&ctx, &q16, &kv, &vv, &p, &ot2, NULL), ATTN_OK);
                same = memcmp(o1, o2, sizeof o1) == 0;
                if (!same)
                    fprintf(stderr, "  dtype %d arch %d: attend != sdpa on the 16-bit view\n",
                            (int)dt, (int)archs[ai]);
                CHECK(same);
                attn_kv_cache_free(&ctx, c);
            }
    }
}

/* out and lse must have q's batch of sequences: an out or lse of batch 1 (or with
 * fewer dims) would take every sequence's rows in the same place. */
static void test_output_batch(void)
{
    TEST("attend: out and lse with a batch axis other than q's are refused, not written "
         "by every sequence in turn");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { B = 2, HKV = 1, CAP = 8, D = 4 };
    attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, ATTN_DTYPE_F32);
    float k[B * 3 * D], v[B * 3 * D], q[B * D], o[B * D], l[B];
    tu_fill(k, B * 3 * D, 1);
    tu_fill(v, B * 3 * D, 2);
    tu_fill(q, B * D, 3);
    attn_tensor kt = tu_tensor4(k, B, HKV, 3, D), vt = tu_tensor4(v, B, HKV, 3, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, NULL), ATTN_OK);
    attn_tensor qt = tu_tensor4(q, B, HKV, 1, D);
    attn_tensor o1 = tu_tensor4(o, 1, HKV, 1, D), o3 = tu_tensor3(o, HKV, 1, D);
    for (int w = 0; w < 2; w++) {
        float wt_[B * CAP];
        attn_tensor wt = tu_tensor4(wt_, B, HKV, 1, CAP);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &o1, w ? &wt : NULL),
                  ATTN_STATUS_SHAPE_MISMATCH);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &o3, w ? &wt : NULL),
                  ATTN_STATUS_SHAPE_MISMATCH);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        attn_tensor ot = tu_tensor4(o, B, HKV, 1, D), lt = tu_tensor3(l, 1, HKV, 1);
        p.lse = &lt;
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, w ? &wt : NULL),
                  ATTN_STATUS_SHAPE_MISMATCH);
        attn_tensor l2 = tu_tensor3(l, HKV, 1, 1); /* 2-D-like [H, Tq] as 3 dims */
        l2.ndim = 2;
        l2.shape[0] = HKV;
        l2.shape[1] = 1;
        l2.stride[0] = 1;
        l2.stride[1] = 1;
        p.lse = &l2;
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, w ? &wt : NULL),
                  ATTN_STATUS_SHAPE_MISMATCH);
    }
    attn_kv_cache_free(&ctx, c);
}

/* One append to sequences of different lengths with RoPE: each sequence's rows are
 * turned at its own positions, and attend turns each sequence's query at its own
 * last position, on float32 and 16-bit caches. */
static void test_rope_per_sequence(void)
{
    TEST("RoPE through one append and one attend over sequences of lengths 0, 3 and 9: "
         "each at its own positions");
    enum { B = 3, HKV = 2, H = 4, CAP = 16, D = 8 };
    const int64_t lens[B] = {0, 3, 9};
    static float k[B * HKV * CAP * D], v[B * HKV * CAP * D], kr[HKV * D], q[B * H * D],
        qr[H * D], o[B * H * D], o2[H * D];
    tu_fill(k, B * HKV * CAP * D, 31);
    tu_fill(v, B * HKV * CAP * D, 32);
    tu_fill(q, B * H * D, 33);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = ATTN_ROPE_HALF;
    rp.base = 500000.0f;
    rp.offset = 1000; /* not used by the cache */
    attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, ATTN_DTYPE_F32);
    for (int b = 1; b < B; b++) {
        attn_tensor kt = tu_tensor4(k + b * HKV * CAP * D, 1, HKV, lens[b], D),
                    vt = tu_tensor4(v + b * HKV * CAP * D, 1, HKV, lens[b], D);
        kt.stride[1] = vt.stride[1] = CAP * D;
        CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kt, &vt, &rp), ATTN_OK);
    }
    /* one more key for all three at once, at positions 0, 3 and 9 */
    attn_tensor kn = tu_tensor4(k + 12 * D, B, HKV, 1, D), vn = tu_tensor4(v + 12 * D, B, HKV, 1, D);
    kn.stride[0] = vn.stride[0] = HKV * CAP * D;
    kn.stride[1] = vn.stride[1] = CAP * D;
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kn, &vn, &rp), ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    attn_tensor qt = tu_tensor4(q, B, H, 1, D), ot = tu_tensor4(o, B, H, 1, D);
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, &rp, &ot, NULL), ATTN_OK);
    for (int b = 0; b < B; b++) {
        attn_tensor kv, vv;
        CHECK_INT(attn_kv_cache_view(&ctx, c, b, &kv, &vv), ATTN_OK);
        CHECK_INT(kv.shape[2], lens[b] + 1);
        attn_rope_params r1 = rp;
        r1.offset = lens[b];
        attn_tensor kin = tu_tensor4(k + b * HKV * CAP * D + 12 * D, 1, HKV, 1, D),
                    kout = tu_tensor4(kr, 1, HKV, 1, D);
        kin.stride[1] = CAP * D;
        CHECK_INT(attn_rope_apply(&ctx, &r1, &kin, &kout), ATTN_OK);
        int same = 1;
        for (int64_t h = 0; h < HKV; h++)
            same &= memcmp((float *)kv.data + h * kv.stride[1] + lens[b] * D, kr + h * D,
                           sizeof(float) * D) == 0;
        CHECK(same);
        attn_tensor qin = tu_tensor4(q + b * H * D, 1, H, 1, D), qo = tu_tensor4(qr, 1, H, 1, D),
                    oo = tu_tensor4(o2, 1, H, 1, D);
        CHECK_INT(attn_rope_apply(&ctx, &r1, &qin, &qo), ATTN_OK);
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        CHECK_INT(attn_sdpa(&ctx, &qo, &kv, &vv, &p, &oo, NULL), ATTN_OK);
        CHECK(memcmp(o2, o + b * H * D, sizeof o2) == 0);
    }
    attn_kv_cache_free(&ctx, c);
}

/* A cache in caller memory: its block starts with the cache's own bookkeeping
 * (the struct, the lengths) and, in 16 bits, ends with the RoPE stage rows. An
 * output there, or a k turned through the stage while it is read, is refused
 * like one over the stored keys. */
static void test_caller_memory_bookkeeping(void)
{
    TEST("attend and append: tensors over the cache's bookkeeping or stage rows (caller "
         "memory) are refused, and the cache stays intact");
    enum { B = 2, HKV = 1, CAP = 4, D = 4 };
    for (int half = 0; half < 2; half++) {
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, half ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32};
        size_t bytes = 0;
        CHECK_INT(attn_kv_cache_bytes(&ctx, &cfg, &bytes), ATTN_OK);
        float *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
        attn_kv_cache *c = NULL;
        CHECK_INT(attn_kv_cache_create(&ctx, &cfg, mem, bytes, &c), ATTN_OK);
        float k[B * 2 * D], v[B * 2 * D], q[B * D];
        tu_fill(k, B * 2 * D, 1);
        tu_fill(v, B * 2 * D, 2);
        tu_fill(q, B * D, 3);
        attn_tensor kt = tu_tensor4(k, B, HKV, 2, D), vt = tu_tensor4(v, B, HKV, 2, D);
        CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, NULL), ATTN_OK);
        unsigned char before[256];
        memcpy(before, mem, sizeof before);
        /* out over the block's first bytes: the struct (B, Hkv, capacity, ...) */
        attn_tensor qt = tu_tensor4(q, B, HKV, 1, D), ot = tu_tensor4(mem, B, HKV, 1, D);
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &ot, NULL),
                  ATTN_STATUS_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(ctx.message, "share memory");
        CHECK(memcmp(before, mem, sizeof before) == 0);
        memcpy(mem, before, sizeof before);
        CHECK_INT(attn_kv_cache_length(c, 1), 2);
        if (half) {
            /* k read from the stage rows (the block's last Hkv * D floats) while
             * RoPE turns each position's keys there */
            attn_tensor ks = tu_tensor4((float *)((char *)mem + bytes) - HKV * D, 1, HKV, 1, D),
                        vs = tu_tensor4(v, 1, HKV, 1, D);
            attn_rope_params rp;
            attn_rope_params_init(&rp);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &ks, &vs, &rp),
                      ATTN_STATUS_INVALID_ARGUMENT);
            CHECK_INT(attn_kv_cache_length(c, 0), 2);
        }
        /* an lse over the lengths (64 bytes into the block) */
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        float o[B * D];
        attn_tensor olt = tu_tensor4(o, B, HKV, 1, D), lt = tu_tensor3(mem + 16, B, HKV, 1);
        p.lse = &lt;
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &olt, NULL),
                  ATTN_STATUS_INVALID_ARGUMENT);
        CHECK_INT(attn_kv_cache_length(c, 0), 2);
        CHECK_INT(attn_kv_cache_length(c, 1), 2);
        attn_kv_cache_free(&ctx, c);
        free(mem);
    }
}

/* attn_kv_cache_workspace_size asked once, on short sequences, serves every later
 * step as the sequences grow at different rates to a full cache (through the
 * lengths where the keys come to be split): no step allocates. */
static long ws_allocs;
static void *ws_alloc(void *user, size_t n)
{
    (void)user;
    ws_allocs++;
    return malloc(n);
}
static void ws_free(void *user, void *p)
{
    (void)user;
    free(p);
}

static void test_workspace_grows(void)
{
    TEST("one workspace of attn_kv_cache_workspace_size bytes, asked on short sequences, "
         "serves every step to a full cache (f32 and bf16, Tq 1 and 9, 1 and 2 threads)");
    enum { B = 3, HKV = 2, H = 8, CAP = 2600, D = 64, TQ = 9 };
    static const attn_dtype dts[2] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16};
    float *k = malloc(sizeof(float) * HKV * 256 * D), *v = malloc(sizeof(float) * HKV * 256 * D);
    float *q = malloc(sizeof(float) * B * H * TQ * D), *o = malloc(sizeof(float) * B * H * TQ * D);
    tu_fill(k, HKV * 256 * D, 41);
    tu_fill(v, HKV * 256 * D, 42);
    tu_fill(q, B * H * TQ * D, 43);
    for (int di = 0; di < 2; di++)
        for (int64_t tq = 1; tq <= TQ; tq += TQ - 1)
            for (int th = 1; th <= 2; th++) {
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.threads = th;
                attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, dts[di]);
                const int64_t grow[B] = {37, 211, 101}; /* positions per step */
                for (int b = 0; b < B; b++) {
                    attn_tensor kt = tu_tensor4(k, 1, HKV, tq, D), vt = tu_tensor4(v, 1, HKV, tq, D);
                    CHECK_INT(attn_kv_cache_append(&ctx, c, b, &kt, &vt, NULL), ATTN_OK);
                }
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                attn_tensor qt = tu_tensor4(q, B, H, tq, D), ot = tu_tensor4(o, B, H, tq, D);
                size_t bytes = 0;
                CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &qt, &p, NULL, &ot, NULL, &bytes),
                          ATTN_OK);
                void *ws = aligned_alloc(64, (bytes + 64) / 64 * 64);
                ctx.workspace = ws;
                ctx.workspace_size = bytes;
                ctx.allocator.alloc = ws_alloc;
                ctx.allocator.free = ws_free;
                ws_allocs = 0;
                int steps = 0, ok = 1;
                for (int more = 1; more && ok; steps++) {
                    more = 0;
                    for (int b = 0; b < B; b++) {
                        int64_t n = grow[b];
                        if (n > CAP - attn_kv_cache_length(c, b))
                            n = CAP - attn_kv_cache_length(c, b);
                        if (n < 1)
                            continue;
                        more = 1;
                        attn_tensor kt = tu_tensor4(k, 1, HKV, n, D), vt = tu_tensor4(v, 1, HKV, n, D);
                        ok &= attn_kv_cache_append(&ctx, c, b, &kt, &vt, NULL) == ATTN_OK;
                    }
                    ok &= attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &ot, NULL) == ATTN_OK;
                }
                CHECK(ok);
                if (ws_allocs)
                    fprintf(stderr, "  dtype %d Tq %d threads %d: %ld allocations in %d steps "
                            "(workspace %zu bytes)\n", (int)dts[di], (int)tq, th, ws_allocs,
                            steps, bytes);
                CHECK(ws_allocs == 0);
                attn_kv_cache_free(&ctx, c);
                attn_ctx_release(&ctx);
                free(ws);
            }
    free(k);
    free(v);
    free(q);
    free(o);
}

/* RoPE in place on a strided view: out aliasing x with other strides is refused or
 * right; base extremes. */
static void test_rope_edges(void)
{
    TEST("RoPE: base extremes, in place on a strided view, offsets near INT64_MAX");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { T = 3, D = 8 };
    float x[T * D], y[T * D], z[T * D];
    tu_fill(x, T * D, 4);
    attn_tensor xt = tu_tensor4(x, 1, 1, T, D), yt = tu_tensor4(y, 1, 1, T, D);
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    const float bases[] = {1.0f, 1e30f, 3.4e38f, 1e-30f, 1e-45f, 0.5f};
    for (unsigned i = 0; i < sizeof bases / sizeof *bases; i++) {
        rp.base = bases[i];
        int rc = attn_rope_apply(&ctx, &rp, &xt, &yt);
        int finite = 1;
        for (int j = 0; j < T * D; j++)
            finite &= isfinite(y[j]);
        CHECK_INT(rc, ATTN_OK);
        CHECK(finite);
    }
    rp.base = NAN;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_STATUS_INVALID_ARGUMENT);
    rp.base = 0.0f;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_STATUS_INVALID_ARGUMENT);
    rp.base = -2.0f;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_STATUS_INVALID_ARGUMENT);
    attn_rope_params_init(&rp);
    rp.offset = INT64_MAX - T;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_OK);
    /* the last row at INT64_MAX itself: representable, so taken */
    rp.offset = INT64_MAX - T + 1;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_OK);
    rp.offset = INT64_MAX - T + 2;
    CHECK(attn_rope_apply(&ctx, &rp, &xt, &yt) != ATTN_OK);
    /* positions past 2^24: float32 of the position as PyTorch's float arange */
    rp.offset = (1 << 24) - 1;
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_OK);
    /* in place: out = x (the same view) equals out of place */
    attn_rope_params_init(&rp);
    rp.offset = 2;
    memcpy(z, x, sizeof x);
    attn_tensor zt = tu_tensor4(z, 1, 1, T, D);
    CHECK_INT(attn_rope_apply(&ctx, &rp, &xt, &yt), ATTN_OK);
    CHECK_INT(attn_rope_apply(&ctx, &rp, &zt, &zt), ATTN_OK);
    CHECK(memcmp(y, z, sizeof y) == 0);
    /* the same memory with other strides (rows read in another order): refused, not
     * rotated with a pair's members read after the other was written */
    memcpy(z, x, sizeof x);
    attn_tensor zr = zt;
    zr.shape[2] = T - 1;
    zt.shape[2] = T - 1;
    zr.data = z + D; /* rows 1.. over rows 0.. */
    CHECK_INT(attn_rope_apply(&ctx, &rp, &zt, &zr), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "share memory");
}

/* out pointing into another sequence's stored keys: refused before anything runs
 * (the cache must be unchanged). */
static void test_out_into_cache(void)
{
    TEST("attend: out overlapping the cache is refused before any sequence is written");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { B = 2, HKV = 1, CAP = 8, D = 4 };
    attn_kv_cache *c = make(&ctx, B, HKV, CAP, D, ATTN_DTYPE_F32);
    float k[B * HKV * 4 * D], v[B * HKV * 4 * D], q[B * D], w[B * CAP];
    tu_fill(k, B * HKV * 4 * D, 1);
    tu_fill(v, B * HKV * 4 * D, 2);
    tu_fill(q, B * D, 3);
    attn_tensor kt = tu_tensor4(k, B, HKV, 4, D), vt = tu_tensor4(v, B, HKV, 4, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kt, &vt, NULL), ATTN_OK);
    attn_tensor k1, v1;
    CHECK_INT(attn_kv_cache_view(&ctx, c, 1, &k1, &v1), ATTN_OK);
    float before[4 * D];
    memcpy(before, k1.data, sizeof before);
    /* out [2,1,1,4]: row 0 on sequence 1's first key, row 1 on its second; with
     * weights the sequences run one by one, and sequence 0's output was written
     * into sequence 1's keys before sequence 1's own call found the overlap. */
    attn_tensor qt = tu_tensor4(q, B, HKV, 1, D), ot = tu_tensor4(k1.data, B, HKV, 1, D);
    attn_tensor wt = tu_tensor4(w, B, HKV, 1, CAP);
    for (int weights = 0; weights < 2; weights++) {
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &ot, weights ? &wt : NULL),
                  ATTN_STATUS_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(ctx.message, "share memory");
        CHECK(memcmp(before, k1.data, sizeof before) == 0);
        memcpy(k1.data, before, sizeof before);
    }
    /* out into the cache's room past sequence 1's length (position 5 of 8): the
     * cache's memory too, refused. */
    attn_tensor ot2 = tu_tensor4((float *)k1.data + 5 * D, B, HKV, 1, D);
    ot2.stride[0] = D;
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &ot2, NULL),
              ATTN_STATUS_INVALID_ARGUMENT);
    /* the lse into sequence 1's values */
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    static float o[B * D];
    attn_tensor olt = tu_tensor4(o, B, HKV, 1, D);
    attn_tensor lt = tu_tensor3(v1.data, B, HKV, 1);
    float vbefore[4 * D];
    memcpy(vbefore, v1.data, sizeof vbefore);
    p.lse = &lt;
    for (int weights = 0; weights < 2; weights++) {
        CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, &p, NULL, &olt, weights ? &wt : NULL),
                  ATTN_STATUS_INVALID_ARGUMENT);
        CHECK(memcmp(vbefore, v1.data, sizeof vbefore) == 0);
        memcpy(v1.data, vbefore, sizeof vbefore);
    }
    /* weights of sequence 1 over out of sequence 0: outputs overlapping each other */
    static float wo[B * CAP + D];
    attn_tensor wot = tu_tensor4(wo, B, HKV, 1, CAP), oot = tu_tensor4(wo + CAP, B, HKV, 1, D);
    oot.stride[0] = CAP + D;
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qt, NULL, NULL, &oot, &wot),
              ATTN_STATUS_INVALID_ARGUMENT);
    attn_kv_cache_free(&ctx, c);
}

int main(void)
{
    test_bookkeeping();
    test_chunked_prefill_bits();
    test_half_rope_once();
    test_output_batch();
    test_rope_per_sequence();
    test_caller_memory_bookkeeping();
    test_workspace_grows();
    test_rope_edges();
    test_out_into_cache();
    test_poison_stays_home();
    return check_summary("test_kv_adversarial");
}
