/*
 * test_mha.c - the chapter's masks and multi-head self-attention: mask shapes and
 * contents, broadcasting over heads, output and weight shapes, agreement with a
 * double-precision re-computation of the whole module written here, and the errors.
 * Grouped-query attention (attn_gqa_*): it equals the chapter's module run with
 * each key/value head's weights repeated for its group of query heads (repeat_kv),
 * bit for bit, on every path; packed and unpacked agree; and with packed weights
 * and a workspace it allocates nothing.
 * RoPE inside the block (attn_mha_forward_packed_rope): PyTorch 2.15's Llama-style
 * blocks with RoPE (tests/data/golden_gqa_rope/, both pairings, non-default bases,
 * offsets, fused and separate weights) on every path, 1 and 2 threads.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_masks(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { B = 2, T = 5 };
    int64_t ids[B * T] = {1, 2, 3, 4, 0, 6, 7, 8, 0, 0};
    int32_t ids32[B * T] = {1, 2, 3, 4, 0, 6, 7, 8, 0, 0};
    unsigned char pad[B * T], causal[T * T], comb[B * T * T];
    attn_tensor tids, tids32, tpad, tcausal, tcomb;
    const int64_t ids_shape[2] = {B, T}, pad_shape[4] = {B, 1, 1, T},
                  causal_shape[4] = {1, 1, T, T}, comb_shape[4] = {B, 1, T, T};
    attn_tensor_init(NULL, &tids, ATTN_DTYPE_I64, ids, 2, ids_shape);
    attn_tensor_init(NULL, &tids32, ATTN_DTYPE_I32, ids32, 2, ids_shape);
    attn_tensor_init(NULL, &tpad, ATTN_DTYPE_BOOL, pad, 4, pad_shape);
    attn_tensor_init(NULL, &tcausal, ATTN_DTYPE_BOOL, causal, 4, causal_shape);
    attn_tensor_init(NULL, &tcomb, ATTN_DTYPE_BOOL, comb, 4, comb_shape);

    TEST("the padding mask [B, 1, 1, T] is false exactly where the key is the pad id");
    CHECK_INT(attn_mask_padding(&ctx, &tids, 0, &tpad), ATTN_OK);
    for (int i = 0; i < B * T; i++)
        CHECK_INT(pad[i], ids[i] != 0);
    TEST("int32 token ids give the same padding mask, and another pad id moves it");
    unsigned char pad32[B * T];
    tpad.data = pad32;
    CHECK_INT(attn_mask_padding(&ctx, &tids32, 0, &tpad), ATTN_OK);
    CHECK(memcmp(pad, pad32, sizeof pad) == 0);
    CHECK_INT(attn_mask_padding(&ctx, &tids32, 7, &tpad), ATTN_OK);
    CHECK(pad32[6] == 0 && pad32[4] == 1);
    tpad.data = pad;

    TEST("the causal mask [1, 1, T, T] is lower triangular with the diagonal");
    CHECK_INT(attn_mask_causal(&ctx, T, &tcausal), ATTN_OK);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++)
            CHECK_INT(causal[i * T + j], j <= i);

    TEST("padding AND causal broadcasts to [B, 1, T, T] and is their entry-wise AND");
    CHECK_INT(attn_mask_and(&ctx, &tpad, &tcausal, &tcomb), ATTN_OK);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++)
                CHECK_INT(comb[(b * T + i) * T + j], pad[b * T + j] && j <= i);
    TEST("the last real query of sample 0 may attend to [1, 1, 1, 1, 0], as the chapter prints");
    const unsigned char want[T] = {1, 1, 1, 1, 0};
    CHECK(memcmp(comb + 3 * T, want, T) == 0);

    TEST("an AND into an output of the wrong shape is refused");
    attn_tensor wrong = tcomb;
    wrong.shape[0] = 1;
    CHECK_INT(attn_mask_and(&ctx, &tpad, &tcausal, &wrong), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "combined mask has shape (1, 1, 5, 5); expected (2, 1, 5, 5)");

    TEST("attn_mask_check accepts shapes that broadcast and names both shapes when one does not");
    CHECK_INT(attn_mask_check(&ctx, &tcomb, B, 4, T, T), ATTN_OK);
    CHECK_INT(attn_mask_check(&ctx, &tpad, B, 4, 3, T), ATTN_OK);
    CHECK_INT(attn_mask_check(&ctx, &tcomb, 3, 4, T, T), ATTN_STATUS_MASK_BROADCAST);
    CHECK_STR_CONTAINS(ctx.message, "mask shape (2, 1, 5, 5) does not broadcast to (3, 4, 5, 5)");
    TEST("padding from float ids, a causal length of 0, and float masks are refused");
    attn_tensor fids = tids;
    fids.dtype = ATTN_DTYPE_F32;
    CHECK_INT(attn_mask_padding(&ctx, &fids, 0, &tpad), ATTN_STATUS_DTYPE);
    CHECK_INT(attn_mask_causal(&ctx, 0, &tcausal), ATTN_STATUS_INVALID_ARGUMENT);
    attn_tensor fm = tcomb;
    fm.dtype = ATTN_DTYPE_F32;
    CHECK_INT(attn_mask_and(&ctx, &fm, &tcausal, &tcomb), ATTN_STATUS_DTYPE);
}

/* The whole module in double, from the chapter's formulas, on contiguous arrays. */
static void mha_oracle(const float *x, const float *wqkv, const float *bqkv, const float *wo,
                       const float *bo, const unsigned char *mask /* [B, T, T] */, int B, int T,
                       int E, int H, double *out, double *weights /* [B, H, T, T] */)
{
    int D = E / H;
    double *qkv = malloc(sizeof(double) * B * T * 3 * E);
    double *merged = malloc(sizeof(double) * B * T * E);
    for (int bt = 0; bt < B * T; bt++)
        for (int o = 0; o < 3 * E; o++) {
            double acc = bqkv[o];
            for (int i = 0; i < E; i++)
                acc += (double)x[bt * E + i] * wqkv[o * E + i];
            qkv[bt * 3 * E + o] = acc;
        }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                double s[64], max = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += qkv[(b * T + i) * 3 * E + h * D + d] * qkv[(b * T + j) * 3 * E + E + h * D + d];
                    s[j] = mask[(b * T + i) * T + j] ? dot / sqrt((double)D) : -INFINITY;
                    max = s[j] > max ? s[j] : max;
                }
                for (int j = 0; j < T; j++)
                    sum += (s[j] = exp(s[j] - max));
                for (int j = 0; j < T; j++)
                    weights[((b * H + h) * T + i) * T + j] = s[j] / sum;
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++)
                        acc += s[j] / sum * qkv[(b * T + j) * 3 * E + 2 * E + h * D + d];
                    merged[(b * T + i) * E + h * D + d] = acc;
                }
            }
    for (int bt = 0; bt < B * T; bt++)
        for (int o = 0; o < E; o++) {
            double acc = bo[o];
            for (int i = 0; i < E; i++)
                acc += merged[bt * E + i] * wo[o * E + i];
            out[bt * E + o] = acc;
        }
    free(qkv);
    free(merged);
}

static void test_mha_against_oracle(int B, int T, int E, int H, int use_padding)
{
    float *x = malloc(sizeof(float) * B * T * E), *wqkv = malloc(sizeof(float) * 3 * E * E),
          *bqkv = malloc(sizeof(float) * 3 * E), *wo = malloc(sizeof(float) * E * E),
          *bo = malloc(sizeof(float) * E), *out = malloc(sizeof(float) * B * T * E),
          *w = malloc(sizeof(float) * B * H * T * T);
    double *oo = malloc(sizeof(double) * B * T * E), *ow = malloc(sizeof(double) * B * H * T * T);
    unsigned char *mask = malloc((size_t)B * T * T), *pad = malloc((size_t)B * T),
                  *causal = malloc((size_t)T * T);
    tu_fill(x, B * T * E, 100 + E);
    tu_fill(wqkv, 3 * E * E, 200 + E);
    tu_fill(bqkv, 3 * E, 300 + E);
    tu_fill(wo, E * E, 400 + E);
    tu_fill(bo, E, 500 + E);
    int64_t *ids = malloc(sizeof(int64_t) * B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            ids[b * T + t] = (use_padding && t > 0 && t >= T - b) ? 0 : t + 1;
    attn_tensor tx = tu_tensor3(x, B, T, E), to = tu_tensor3(out, B, T, E),
                tww = tu_tensor4(w, B, H, T, T), tids, tpad, tcausal, tmask;
    const int64_t ids_s[2] = {B, T}, pad_s[4] = {B, 1, 1, T}, causal_s[4] = {1, 1, T, T},
                  mask_s[4] = {B, 1, T, T};
    attn_tensor_init(NULL, &tids, ATTN_DTYPE_I64, ids, 2, ids_s);
    attn_tensor_init(NULL, &tpad, ATTN_DTYPE_BOOL, pad, 4, pad_s);
    attn_tensor_init(NULL, &tcausal, ATTN_DTYPE_BOOL, causal, 4, causal_s);
    attn_tensor_init(NULL, &tmask, ATTN_DTYPE_BOOL, mask, 4, mask_s);
    CHECK_INT(attn_mask_padding(NULL, &tids, 0, &tpad), ATTN_OK);
    CHECK_INT(attn_mask_causal(NULL, T, &tcausal), ATTN_OK);
    CHECK_INT(attn_mask_and(NULL, &tpad, &tcausal, &tmask), ATTN_OK);
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tmask;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &to, &tww), ATTN_OK);
    mha_oracle(x, wqkv, bqkv, wo, bo, mask, B, T, E, H, oo, ow);
    /* Three chained float32 stages with sums of up to 3E terms of values in [-1, 1]:
     * their rounding stays below 1e-4 absolute for E <= 64. */
    int bad = 0;
    for (int i = 0; i < B * T * E; i++)
        bad += !(fabs(out[i] - oo[i]) <= 1e-4 + 1e-4 * fabs(oo[i]));
    for (int i = 0; i < B * H * T * T; i++)
        bad += !(fabs(w[i] - ow[i]) <= 1e-5);
    if (bad)
        fprintf(stderr, "  B=%d T=%d E=%d H=%d: %d entries differ from the oracle\n", B, T, E, H, bad);
    CHECK_INT(bad, 0);
    TEST("the same module on weights packed once (attn_mha_pack) gives the same bits");
    attn_mha_packed *pw = NULL;
    float *outp = malloc(sizeof(float) * B * T * E), *wp = malloc(sizeof(float) * B * H * T * T);
    attn_tensor top = tu_tensor3(outp, B, T, E), twp = tu_tensor4(wp, B, H, T, T);
    CHECK_INT(attn_mha_pack(&ctx, &mw, &pw), ATTN_OK);
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &top, &twp), ATTN_OK);
    CHECK(memcmp(out, outp, sizeof(float) * B * T * E) == 0);
    CHECK(memcmp(w, wp, sizeof(float) * B * H * T * T) == 0);
    attn_mha_packed_free(&ctx, pw);
    free(outp), free(wp);
    TEST("the same module with the causal flag instead of a causal mask gives the same numbers");
    attn_tensor_init(NULL, &tmask, ATTN_DTYPE_BOOL, pad, 4, pad_s);
    p.causal = 1;
    float *out2 = malloc(sizeof(float) * B * T * E);
    to.data = out2;
    CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &to, NULL), ATTN_OK);
    CHECK(memcmp(out, out2, sizeof(float) * B * T * E) == 0);
    free(out2);
    free(x), free(wqkv), free(bqkv), free(wo), free(bo), free(out), free(w), free(oo), free(ow);
    free(mask), free(pad), free(causal), free(ids);
}

/* The projection writes each head's q, k and v as its own block of D columns
 * (src/kernels/gemm.h's column blocks): full vectors go straight to y when D is a
 * multiple of the vector width, through a stack tile when it is not. On every
 * path, with 1 and 2 threads, the module must match the oracle, and 2 threads
 * must give the bits of 1. */
static void test_mha_paths(int B, int T, int E, int H)
{
    float *x = malloc(sizeof(float) * B * T * E), *wqkv = malloc(sizeof(float) * 3 * E * E),
          *bqkv = malloc(sizeof(float) * 3 * E), *wo = malloc(sizeof(float) * E * E),
          *bo = malloc(sizeof(float) * E), *out1 = malloc(sizeof(float) * B * T * E),
          *out2 = malloc(sizeof(float) * B * T * E);
    double *oo = malloc(sizeof(double) * B * T * E), *ow = malloc(sizeof(double) * B * H * T * T);
    unsigned char *mask = malloc((size_t)B * T * T);
    tu_fill(x, B * T * E, 600 + E);
    tu_fill(wqkv, 3 * E * E, 700 + E);
    tu_fill(bqkv, 3 * E, 800 + E);
    tu_fill(wo, E * E, 900 + E);
    tu_fill(bo, E, 1000 + E);
    for (int i = 0; i < B * T * T; i++)
        mask[i] = 1;
    mha_oracle(x, wqkv, bqkv, wo, bo, mask, B, T, E, H, oo, ow);
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), t1 = tu_tensor3(out1, B, T, E),
                t2 = tu_tensor3(out2, B, T, E);
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.threads = 1;
        CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, NULL, &t1, NULL), ATTN_OK);
        ctx.threads = 2;
        CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, NULL, &t2, NULL), ATTN_OK);
        /* As in test_mha_against_oracle: below 1e-4 for E <= 64. */
        int bad = 0, worst = 0;
        for (int i = 0; i < B * T * E; i++)
            if (!(fabs(out1[i] - oo[i]) <= 1e-4 + 1e-4 * fabs(oo[i])) && !bad++)
                worst = i;
        if (bad)
            fprintf(stderr, "  %s B=%d T=%d E=%d H=%d: %d outputs differ from the oracle "
                            "(out[%d] %.9g, oracle %.9g)\n",
                    attn_arch_name(archs[a]), B, T, E, H, bad, worst, out1[worst], oo[worst]);
        CHECK_INT(bad, 0);
        const int same = memcmp(out1, out2, sizeof(float) * B * T * E) == 0;
        if (!same)
            fprintf(stderr, "  %s B=%d T=%d E=%d H=%d: 2 threads differ from 1 (out[0] %.9g vs "
                            "%.9g)\n",
                    attn_arch_name(archs[a]), B, T, E, H, out2[0], out1[0]);
        CHECK(same);
    }
    free(x), free(wqkv), free(bqkv), free(wo), free(bo), free(out1), free(out2), free(oo);
    free(ow), free(mask);
}

static void test_mha_errors(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float buf[4096] = {0};
    attn_tensor tx = tu_tensor3(buf, 2, 5, 16), to = tu_tensor3(buf + 2048, 2, 5, 16);
    attn_mha_weights mw = tu_mha_weights(buf, buf, buf, buf, 16);
    const attn_tensor tw1 = mw.w_qkv;
    TEST("embed_dim not divisible by num_heads is refused, naming both");
    CHECK_INT(attn_mha_forward(&ctx, &mw, 3, &tx, NULL, &to, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "embed_dim 16 is not divisible by num_heads 3");
    TEST("num_heads below 1 is refused");
    CHECK_INT(attn_mha_forward(&ctx, &mw, 0, &tx, NULL, &to, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    TEST("an input whose last axis is not E is refused, naming its shape");
    attn_tensor xbad = tu_tensor3(buf, 2, 5, 12);
    CHECK_INT(attn_mha_forward(&ctx, &mw, 4, &xbad, NULL, &to, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "x has shape (2, 5, 12); expected [B, T, 16]");
    TEST("a qkv weight that is not [3E, E] is refused");
    const int64_t w1bad[2] = {32, 16};
    attn_tensor_init(NULL, &mw.w_qkv, ATTN_DTYPE_F32, buf, 2, w1bad);
    CHECK_INT(attn_mha_forward(&ctx, &mw, 4, &tx, NULL, &to, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "qkv weight has shape (32, 16); expected (48, 16)");
    mw.w_qkv = tw1;
    TEST("a padding mask of another batch size is refused with both shapes");
    unsigned char m[3 * 5] = {0};
    attn_tensor tm;
    const int64_t ms[4] = {3, 1, 1, 5};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, m, 4, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tm;
    CHECK_INT(attn_mha_forward(&ctx, &mw, 4, &tx, &p, &to, NULL), ATTN_STATUS_MASK_BROADCAST);
    CHECK_STR_CONTAINS(ctx.message, "mask shape (3, 1, 1, 5) does not broadcast to (2, 4, 5, 5)");
    TEST("a mask that hides every key of a row is an error by default (not NaN)");
    const int64_t ms2[4] = {2, 1, 1, 5};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, m, 4, ms2);
    CHECK_INT(attn_mha_forward(&ctx, &mw, 4, &tx, &p, &to, NULL), ATTN_STATUS_EMPTY_ROW);
}

static void *alloc_fail(void *user, size_t n)
{
    (void)user;
    (void)n;
    return NULL;
}

static void test_no_memory(void)
{
    TEST("an allocator that returns NULL makes multi-head attention fail with NO_MEMORY and a message");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.allocator.alloc = alloc_fail;
    float buf[2048] = {0};
    attn_tensor tx = tu_tensor3(buf, 1, 2, 4), to = tu_tensor3(buf + 1024, 1, 2, 4);
    attn_mha_weights mw = tu_mha_weights(buf, buf, buf, buf, 4);
    CHECK_INT(attn_mha_forward(&ctx, &mw, 2, &tx, NULL, &to, NULL), ATTN_STATUS_NO_MEMORY);
    CHECK_STR_CONTAINS(ctx.message, "out of memory");
}

/* Separate projections for E, H, Hkv, D = E / H, filled from seed: wq [E, E],
 * wk and wv [Hkv*D, E], wo [E, E], biases; and the chapter's fused weights that
 * repeat each key/value head's rows for the H / Hkv query heads that read it. */
typedef struct gqa_case {
    int64_t E, H, Hkv, D;
    float *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *wqkv, *bqkv;
    attn_gqa_weights g;
    attn_mha_weights m;
} gqa_case;

static void gqa_case_make(gqa_case *c, int64_t E, int64_t H, int64_t Hkv, uint64_t seed)
{
    const int64_t D = E / H, KV = Hkv * D;
    c->E = E, c->H = H, c->Hkv = Hkv, c->D = D;
    c->wq = malloc(sizeof(float) * E * E), c->wo = malloc(sizeof(float) * E * E);
    c->wk = malloc(sizeof(float) * KV * E), c->wv = malloc(sizeof(float) * KV * E);
    c->bq = malloc(sizeof(float) * E), c->bo = malloc(sizeof(float) * E);
    c->bk = malloc(sizeof(float) * KV), c->bv = malloc(sizeof(float) * KV);
    c->wqkv = malloc(sizeof(float) * 3 * E * E), c->bqkv = malloc(sizeof(float) * 3 * E);
    tu_fill(c->wq, E * E, seed), tu_fill(c->wo, E * E, seed + 1);
    tu_fill(c->wk, KV * E, seed + 2), tu_fill(c->wv, KV * E, seed + 3);
    tu_fill(c->bq, E, seed + 4), tu_fill(c->bo, E, seed + 5);
    tu_fill(c->bk, KV, seed + 6), tu_fill(c->bv, KV, seed + 7);
    /* repeat_kv on the weights: query head h's k rows are key/value head
     * h / (H / Hkv)'s. */
    memcpy(c->wqkv, c->wq, sizeof(float) * E * E);
    memcpy(c->bqkv, c->bq, sizeof(float) * E);
    for (int64_t h = 0; h < H; h++) {
        const int64_t kvh = h / (H / Hkv);
        memcpy(c->wqkv + (E + h * D) * E, c->wk + kvh * D * E, sizeof(float) * D * E);
        memcpy(c->wqkv + (2 * E + h * D) * E, c->wv + kvh * D * E, sizeof(float) * D * E);
        memcpy(c->bqkv + E + h * D, c->bk + kvh * D, sizeof(float) * D);
        memcpy(c->bqkv + 2 * E + h * D, c->bv + kvh * D, sizeof(float) * D);
    }
    c->m = tu_mha_weights(c->wqkv, c->bqkv, c->wo, c->bo, E);
    const int64_t sq[2] = {E, E}, sk[2] = {KV, E}, s1[1] = {E}, s2[1] = {KV};
    attn_tensor_init(NULL, &c->g.w_q, ATTN_DTYPE_F32, c->wq, 2, sq);
    attn_tensor_init(NULL, &c->g.w_k, ATTN_DTYPE_F32, c->wk, 2, sk);
    attn_tensor_init(NULL, &c->g.w_v, ATTN_DTYPE_F32, c->wv, 2, sk);
    attn_tensor_init(NULL, &c->g.w_o, ATTN_DTYPE_F32, c->wo, 2, sq);
    attn_tensor_init(NULL, &c->g.b_q, ATTN_DTYPE_F32, c->bq, 1, s1);
    attn_tensor_init(NULL, &c->g.b_k, ATTN_DTYPE_F32, c->bk, 1, s2);
    attn_tensor_init(NULL, &c->g.b_v, ATTN_DTYPE_F32, c->bv, 1, s2);
    attn_tensor_init(NULL, &c->g.b_o, ATTN_DTYPE_F32, c->bo, 1, s1);
}

static void gqa_case_free(gqa_case *c)
{
    float *p[10] = {c->wq, c->wk, c->wv, c->wo, c->bq, c->bk, c->bv, c->bo, c->wqkv, c->bqkv};
    for (int i = 0; i < 10; i++)
        free(p[i]);
}

/* Counts the first mismatching float of two arrays, printing both values. */
static void same_bits(const char *what, const float *got, const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            check_failures_++;
            fprintf(stderr, "  %s: element %lld is %.9g, expected %.9g\n", what, (long long)i,
                    got[i], want[i]);
            return;
        }
}

static void test_gqa_equals_repeated(int B, int T, int E, int H, int Hkv)
{
    gqa_case c;
    gqa_case_make(&c, E, H, Hkv, 1000 + (uint64_t)(E * 31 + H * 7 + Hkv));
    float *x = malloc(sizeof(float) * B * T * E);
    float *o1 = malloc(sizeof(float) * B * T * E), *o2 = malloc(sizeof(float) * B * T * E);
    float *o3 = malloc(sizeof(float) * B * T * E);
    float *w1 = malloc(sizeof(float) * B * H * T * T), *w2 = malloc(sizeof(float) * B * H * T * T);
    float *l1 = malloc(sizeof(float) * B * H * T), *l2 = malloc(sizeof(float) * B * H * T);
    tu_fill(x, (int64_t)B * T * E, 77);
    /* A padding mask [B, 1, 1, T] that hides the last key of odd samples. */
    unsigned char *pad = malloc((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            pad[b * T + t] = !(b % 2 == 1 && t == T - 1 && T > 1);
    attn_tensor tmask;
    const int64_t sm[4] = {B, 1, 1, T};
    attn_tensor_init(NULL, &tmask, ATTN_DTYPE_BOOL, pad, 4, sm);
    attn_tensor tx = tu_tensor3(x, B, T, E), t1 = tu_tensor3(o1, B, T, E);
    attn_tensor t2 = tu_tensor3(o2, B, T, E), t3 = tu_tensor3(o3, B, T, E);
    attn_tensor tw1 = tu_tensor4(w1, B, H, T, T), tw2 = tu_tensor4(w2, B, H, T, T);
    attn_tensor tl1, tl2;
    const int64_t sl[3] = {B, H, T};
    attn_tensor_init(NULL, &tl1, ATTN_DTYPE_F32, l1, 3, sl);
    attn_tensor_init(NULL, &tl2, ATTN_DTYPE_F32, l2, 3, sl);
    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int with_weights = 0; with_weights < 2; with_weights++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = archs[a];
            ctx.threads = 2;
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.mask = &tmask;
            p.causal = ATTN_CAUSAL_TOP_LEFT;
            p.lse = with_weights ? &tl1 : NULL;
            attn_tensor *tw = with_weights ? &tw1 : NULL;
            int rc = attn_mha_forward(&ctx, &c.m, H, &tx, &p, &t1, tw);
            CHECK_INT(rc, ATTN_OK);
            p.lse = with_weights ? &tl2 : NULL;
            tw = with_weights ? &tw2 : NULL;
            rc = attn_gqa_forward(&ctx, &c.g, H, Hkv, &tx, &p, &t2, tw);
            CHECK_INT(rc, ATTN_OK);
            if (rc != ATTN_OK)
                fprintf(stderr, "  %s\n", ctx.message);
            char what[160];
            snprintf(what, sizeof what, "B=%d T=%d E=%d H=%d Hkv=%d arch %s%s output", B, T, E,
                     H, Hkv, attn_arch_name(archs[a]), with_weights ? " with weights" : "");
            same_bits(what, o2, o1, (int64_t)B * T * E);
            if (with_weights) {
                same_bits("... attention weights", w2, w1, (int64_t)B * H * T * T);
                same_bits("... log-sum-exp", l2, l1, (int64_t)B * H * T);
            }
            /* The packed weights give attn_gqa_forward's bits. */
            attn_mha_packed *pw = NULL;
            CHECK_INT(attn_gqa_pack(&ctx, &c.g, H, Hkv, &pw), ATTN_OK);
            p.lse = NULL;
            CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &t3, NULL), ATTN_OK);
            if (!with_weights)
                same_bits("... packed output", o3, o2, (int64_t)B * T * E);
            attn_mha_packed_free(&ctx, pw);
        }
    }
    free(x), free(o1), free(o2), free(o3), free(w1), free(w2), free(l1), free(l2), free(pad);
    gqa_case_free(&c);
}

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

static void test_gqa_no_alloc(void)
{
    TEST("grouped-query attention with packed weights and a caller's workspace makes zero "
         "allocations per call (and attn_gqa_forward none either), on every path");
    enum { B = 2, T = 9, E = 16, H = 4, HKV = 2 };
    gqa_case c;
    gqa_case_make(&c, E, H, HKV, 5);
    static float x[B * T * E], o[B * T * E];
    tu_fill(x, B * T * E, 3);
    attn_tensor tx = tu_tensor3(x, B, T, E), to = tu_tensor3(o, B, T, E);
    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        counting cnt = {0};
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.threads = 2;
        ctx.allocator.alloc = count_alloc;
        ctx.allocator.free = count_free;
        ctx.allocator.user = &cnt;
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_TOP_LEFT;
        attn_mha_packed *pw = NULL;
        CHECK_INT(attn_gqa_pack(&ctx, &c.g, H, HKV, &pw), ATTN_OK);
        size_t bytes = 0, bytes_unpacked = 0;
        CHECK_INT(attn_mha_packed_workspace_size(&ctx, pw, H, &tx, &p, &to, NULL, &bytes), ATTN_OK);
        CHECK_INT(attn_gqa_workspace_size(&ctx, &c.g, H, HKV, &tx, &p, &to, NULL, &bytes_unpacked),
                  ATTN_OK);
        CHECK(bytes <= bytes_unpacked);
        const size_t n = bytes_unpacked > bytes ? bytes_unpacked : bytes;
        void *ws = aligned_alloc(64, (n + 63) / 64 * 64);
        ctx.workspace = ws;
        ctx.workspace_size = n;
        const long before = cnt.calls;
        for (int i = 0; i < 3; i++) {
            CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &to, NULL), ATTN_OK);
            CHECK_INT(attn_gqa_forward(&ctx, &c.g, H, HKV, &tx, &p, &to, NULL), ATTN_OK);
        }
        if (cnt.calls != before)
            fprintf(stderr, "  arch %s: %ld allocations in 6 calls with a workspace of %zu bytes\n",
                    attn_arch_name(archs[a]), cnt.calls - before, n);
        CHECK_INT(cnt.calls - before, 0);
        attn_mha_packed_free(&ctx, pw);
        free(ws);
    }
    gqa_case_free(&c);
}

/* One golden case of tests/data/golden_gqa_rope/: its case.txt keys. */
typedef struct rope_case {
    char dir[512], layout[32], prefix[128], rope[32], ids[64];
    long long H, Hkv, offset;
    double base;
} rope_case;

static int rope_case_read(const char *name, rope_case *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s/golden_gqa_rope/%s", ATTN_TEST_DATA_DIR, name);
    char path[600], line[256];
    snprintf(path, sizeof path, "%s/case.txt", c->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq)
            continue;
        *eq = '\0';
        const char *k = line, *v = eq + 1;
        if (!strcmp(k, "layout"))
            snprintf(c->layout, sizeof c->layout, "%s", v);
        else if (!strcmp(k, "prefix"))
            snprintf(c->prefix, sizeof c->prefix, "%s", v);
        else if (!strcmp(k, "rope"))
            snprintf(c->rope, sizeof c->rope, "%s", v);
        else if (!strcmp(k, "token_ids"))
            snprintf(c->ids, sizeof c->ids, "%s", v);
        else if (!strcmp(k, "num_heads"))
            c->H = atoll(v);
        else if (!strcmp(k, "num_kv_heads"))
            c->Hkv = atoll(v);
        else if (!strcmp(k, "rope_offset"))
            c->offset = atoll(v);
        else if (!strcmp(k, "rope_base"))
            c->base = atof(v);
    }
    fclose(f);
    return c->H > 0 && c->Hkv > 0 && c->base > 0 && c->rope[0] ? 0 : -1;
}

static attn_array rope_load(const rope_case *c, const char *file)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    attn_array a;
    memset(&a, 0, sizeof a);
    if (attn_npy_load(NULL, path, &a) != ATTN_OK) {
        check_failures_++;
        fprintf(stderr, "  cannot load %s\n", path);
    }
    return a;
}

/* got against PyTorch's want under the golden tolerance of tests/test_golden.c,
 * 2e-6 + 1e-5 * |want| (float32 projections and softmax against a float64 block);
 * returns the worst error / bound. */
static double rope_close(const char *what, const float *got, const float *want, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i])
            continue;
        const double err = fabs((double)got[i] - want[i]), bound = 2e-6 + 1e-5 * fabs(want[i]);
        if (err / bound > worst)
            worst = err / bound;
        if (!(err <= bound)) {
            check_failures_++;
            fprintf(stderr, "  %s: element %lld is %.9g, PyTorch %.9g (error %.3g, bound %.3g)\n",
                    what, (long long)i, got[i], want[i], err, bound);
            return worst;
        }
    }
    check_count_++;
    return worst;
}

static void test_rope_golden(void)
{
    TEST("attention blocks with RoPE (attn_mha_forward_packed_rope) reproduce PyTorch 2.15's "
         "Llama-style blocks (both pairings, bases 500000 and 2500, offsets 0, 5 and 37, "
         "fused and separate weights, GQA and MQA, causal, padded) on every path, 1 and 2 "
         "threads: output, attention weights and log-sum-exp within 2e-6 + 1e-5 * |torch|; "
         "without RoPE the output is far from PyTorch's (the check can fail)");
    char path[600], name[128];
    snprintf(path, sizeof path, "%s/golden_gqa_rope/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *mf = fopen(path, "r");
    CHECK(mf != NULL);
    if (!mf)
        return;
    int ncases = 0;
    double worst = 0;
    while (fgets(name, sizeof name, mf)) {
        name[strcspn(name, "\n")] = '\0';
        if (name[0] == '#' || !name[0])
            continue;
        rope_case c;
        CHECK_INT(rope_case_read(name, &c), 0);
        attn_array x = rope_load(&c, "x.npy"), want = rope_load(&c, "out.npy");
        attn_array want_w = rope_load(&c, "attn.npy"), want_l = rope_load(&c, "lse.npy");
        attn_array ids;
        memset(&ids, 0, sizeof ids);
        if (c.ids[0])
            ids = rope_load(&c, c.ids);
        const int fused = !strcmp(c.layout, "fused");
        attn_mha_weights w;
        attn_gqa_weights g;
        memset(&w, 0, sizeof w);
        memset(&g, 0, sizeof g);
        snprintf(path, sizeof path, "%s/weights.safetensors", c.dir);
        CHECK_INT(fused ? attn_weights_load(NULL, path, c.prefix, c.H, &w)
                        : attn_weights_load_gqa(NULL, path, c.prefix, c.H, c.Hkv, &g),
                  ATTN_OK);
        const int64_t B = x.tensor.shape[0], T = x.tensor.shape[1], E = x.tensor.shape[2];
        const int64_t H = c.H, sa[4] = {B, H, T, T}, sl[3] = {B, H, T}, sp[4] = {B, 1, 1, T};
        attn_tensor out, att, lse, pad;
        memset(&pad, 0, sizeof pad);
        CHECK_INT(attn_tensor_alloc(NULL, &out, ATTN_DTYPE_F32, 3, x.tensor.shape), ATTN_OK);
        CHECK_INT(attn_tensor_alloc(NULL, &att, ATTN_DTYPE_F32, 4, sa), ATTN_OK);
        CHECK_INT(attn_tensor_alloc(NULL, &lse, ATTN_DTYPE_F32, 3, sl), ATTN_OK);
        if (c.ids[0]) {
            CHECK_INT(attn_tensor_alloc(NULL, &pad, ATTN_DTYPE_BOOL, 4, sp), ATTN_OK);
            CHECK_INT(attn_mask_padding(NULL, &ids.tensor, 0, &pad), ATTN_OK);
        }
        attn_rope_params rp;
        attn_rope_params_init(&rp);
        rp.pairing = !strcmp(c.rope, "half") ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
        rp.base = (float)c.base;
        rp.offset = c.offset;
        const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                                   ATTN_ARCH_AVX512};
        for (int a = 0; a < 4; a++) {
            if (!attn_arch_supported(archs[a]))
                continue;
            for (int threads = 1; threads <= 2; threads++) {
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.arch = archs[a];
                ctx.threads = threads;
                attn_mha_packed *pw = NULL;
                CHECK_INT(fused ? attn_mha_pack(&ctx, &w, &pw)
                                : attn_gqa_pack(&ctx, &g, c.H, c.Hkv, &pw),
                          ATTN_OK);
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = ATTN_CAUSAL_TOP_LEFT;
                p.mask = c.ids[0] ? &pad : NULL;
                p.lse = &lse;
                const int rc = attn_mha_forward_packed_rope(&ctx, pw, H, &x.tensor, &p, &rp,
                                                            &out, &att);
                CHECK_INT(rc, ATTN_OK);
                if (rc != ATTN_OK)
                    fprintf(stderr, "  %s: %s\n", name, ctx.message);
                char what[256];
                snprintf(what, sizeof what, "%s, arch %s, %d threads, output", name,
                         attn_arch_name(archs[a]), threads);
                double r = rope_close(what, out.data, want.tensor.data, B * T * E);
                worst = r > worst ? r : worst;
                r = rope_close("... attention weights", att.data, want_w.tensor.data,
                               B * H * T * T);
                worst = r > worst ? r : worst;
                r = rope_close("... log-sum-exp", lse.data, want_l.tensor.data, B * H * T);
                worst = r > worst ? r : worst;
                if (a == 0 && threads == 1) {
                    /* Without RoPE the same block is far from PyTorch's. */
                    p.lse = NULL;
                    CHECK_INT(attn_mha_forward_packed_rope(&ctx, pw, H, &x.tensor, &p, NULL,
                                                           &out, NULL),
                              ATTN_OK);
                    double far = 0;
                    const float *o = out.data, *wv = want.tensor.data;
                    for (int64_t i = 0; i < B * T * E; i++) {
                        const double e = fabs((double)o[i] - wv[i]) / (2e-6 + 1e-5 * fabs(wv[i]));
                        far = e > far ? e : far;
                    }
                    if (!(far > 10.0))
                        fprintf(stderr, "  %s: without RoPE the worst error / bound is only %.3g\n",
                                name, far);
                    CHECK(far > 10.0);
                }
                attn_mha_packed_free(&ctx, pw);
            }
        }
        attn_tensor_free(NULL, &out);
        attn_tensor_free(NULL, &att);
        attn_tensor_free(NULL, &lse);
        attn_tensor_free(NULL, &pad);
        attn_weights_free(NULL, &w);
        attn_gqa_weights_free(NULL, &g);
        attn_array_free(NULL, &x);
        attn_array_free(NULL, &want);
        attn_array_free(NULL, &want_w);
        attn_array_free(NULL, &want_l);
        attn_array_free(NULL, &ids);
        ncases++;
    }
    fclose(mf);
    if (ncases < 4)
        fprintf(stderr, "  only %d RoPE golden cases\n", ncases);
    CHECK(ncases >= 4);
    fprintf(stderr, "   %d cases; worst error / bound %.3f\n", ncases, worst);
}

int main(void)
{
    test_masks();
    TEST("multi-head attention agrees with a double-precision re-computation (chapter size, padded + causal)");
    test_mha_against_oracle(2, 5, 16, 4, 1);
    TEST("... and at awkward sizes: T = 1, E not a power of two, one head, many heads");
    test_mha_against_oracle(1, 1, 3, 1, 0);
    test_mha_against_oracle(3, 17, 24, 3, 1);
    test_mha_against_oracle(2, 9, 40, 8, 1);
    test_mha_against_oracle(1, 33, 64, 1, 0);
    TEST("on every path, with 1 and 2 threads, the module matches the oracle when each "
         "head's D columns are a multiple of the vector width (D = 16, 32, 64) and when they "
         "are not (D = 12, 20), and 2 threads give the bits of 1");
    test_mha_paths(2, 37, 64, 4);
    test_mha_paths(1, 20, 64, 2);
    test_mha_paths(1, 17, 64, 1);
    test_mha_paths(2, 19, 48, 4);
    test_mha_paths(1, 9, 60, 3);
    test_mha_errors();
    test_no_memory();
    TEST("grouped-query attention (Hkv = H, H/2, H/3, 1) equals the chapter's module with "
         "each key/value head's weights repeated for its query heads, bit for bit (output, "
         "weights, log-sum-exp) on every path, padded + causal; packed weights give the same bits");
    test_gqa_equals_repeated(2, 5, 12, 6, 6);
    test_gqa_equals_repeated(2, 5, 12, 6, 3);
    test_gqa_equals_repeated(3, 17, 12, 6, 2);
    test_gqa_equals_repeated(1, 1, 12, 6, 1);
    test_gqa_equals_repeated(2, 70, 64, 8, 2);
    test_gqa_no_alloc();
    test_rope_golden();
    return check_summary("test_mha");
}
