/*
 * test_mha.c - the chapter's masks and multi-head self-attention: mask shapes and
 * contents, broadcasting over heads, output and weight shapes, agreement with a
 * double-precision re-computation of the whole module written here, and the errors.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
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
    test_mha_errors();
    test_no_memory();
    return check_summary("test_mha");
}
