/*
 * test_embed_args.c - arguments a program embedding attn may hand in by mistake,
 * which must be refused with a message before anything is written, never run by
 * luck: data pointers not aligned to their elements, outputs that overlap
 * themselves (two results to one place), and outputs that overlap an input other
 * than the one the header allows. Inputs that broadcast through stride 0 stay
 * allowed, and so does the one in-place call attn_sdpa documents (out = q).
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>

enum { B = 1, H = 2, T = 7, D = 8 };
#define N (B * H * T * D)

/* Room for a tensor at any byte offset: 64-byte aligned, plus slack. */
static _Alignas(64) float qbuf[N + 16], kbuf[N + 16], vbuf[N + 16], obuf[N + 16], wbuf[B * H * T * T + 16];
static _Alignas(64) unsigned char mbuf[T * T + 16];

static attn_tensor at_bytes(void *base, size_t byte_offset, attn_dtype dt, int64_t a, int64_t b,
                            int64_t c, int64_t d)
{
    attn_tensor t;
    const int64_t shape[4] = {a, b, c, d};
    attn_tensor_init(NULL, &t, dt, (unsigned char *)base + byte_offset, 4, shape);
    return t;
}

/* attn_sdpa's status and message for q, k, v, out, weights given. */
static int sdpa(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                const attn_sdpa_params *p, attn_tensor *out, attn_tensor *w)
{
    ctx->message[0] = '\0';
    return attn_sdpa(ctx, q, k, v, p, out, w);
}

/* 1 when every byte of obuf still holds the 0x7f a refused call's test filled it
 * with: nothing was written. */
static int out_untouched(void)
{
    const unsigned char *b = (const unsigned char *)obuf;
    for (size_t i = 0; i < sizeof obuf; i++)
        if (b[i] != 0x7f)
            return 0;
    return 1;
}

static void test_alignment(attn_ctx *ctx)
{
    TEST("a float32 tensor whose data pointer is not a multiple of 4 bytes (q, k, v, out, "
         "weights) is refused with INVALID_ARGUMENT naming it and the alignment, and out is "
         "left untouched");
    attn_tensor q = at_bytes(qbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                k = at_bytes(kbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                v = at_bytes(vbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                o = at_bytes(obuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                w = at_bytes(wbuf, 0, ATTN_DTYPE_F32, B, H, T, T);
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &o, &w), ATTN_OK);
    const char *names[5] = {"q", "k", "v", "out", "weights"};
    for (int which = 0; which < 5; which++)
        for (size_t off = 1; off < 4; off++) {
            attn_tensor t[5] = {q, k, v, o, w};
            t[which].data = (unsigned char *)t[which].data + off;
            memset(obuf, 0x7f, sizeof obuf);
            CHECK_INT(sdpa(ctx, &t[0], &t[1], &t[2], NULL, &t[3], &t[4]), ATTN_STATUS_INVALID_ARGUMENT);
            char where[32];
            snprintf(where, sizeof where, "%s: data at", names[which]);
            CHECK_STR_CONTAINS(ctx->message, where);
            CHECK_STR_CONTAINS(ctx->message, "not aligned to its float32 elements (a multiple of 4 bytes)");
            CHECK_INT(out_untouched(), 1);
        }

    TEST("a bool mask at any byte offset is accepted (one-byte elements), and a float32 "
         "bias at an odd offset is refused like q");
    for (size_t off = 0; off < 8; off++) {
        attn_tensor m = at_bytes(mbuf, off, ATTN_DTYPE_BOOL, 1, 1, T, T);
        CHECK_INT(attn_mask_causal(ctx, T, &m), ATTN_OK);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.mask = &m;
        CHECK_INT(sdpa(ctx, &q, &k, &v, &p, &o, NULL), ATTN_OK);
    }
    attn_tensor bias = at_bytes(wbuf, 2, ATTN_DTYPE_F32, 1, 1, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.bias = &bias;
    CHECK_INT(sdpa(ctx, &q, &k, &v, &p, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "bias: data at");

    TEST("a 16-bit q at an odd byte offset is refused (2-byte elements); at an even one it "
         "runs");
    attn_tensor q16 = at_bytes(qbuf, 1, ATTN_DTYPE_BF16, B, H, T, D),
                k16 = at_bytes(kbuf, 0, ATTN_DTYPE_BF16, B, H, T, D),
                v16 = at_bytes(vbuf, 0, ATTN_DTYPE_BF16, B, H, T, D),
                o16 = at_bytes(obuf, 0, ATTN_DTYPE_BF16, B, H, T, D);
    memset(qbuf, 0, sizeof qbuf);
    memset(kbuf, 0, sizeof kbuf);
    memset(vbuf, 0, sizeof vbuf);
    CHECK_INT(sdpa(ctx, &q16, &k16, &v16, NULL, &o16, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "not aligned to its bfloat16 elements (a multiple of 2 bytes)");
    q16.data = (unsigned char *)qbuf + 2;
    CHECK_INT(sdpa(ctx, &q16, &k16, &v16, NULL, &o16, NULL), ATTN_OK);

    TEST("attn_linear and attn_rope_apply refuse a misaligned x the same way");
    attn_tensor x, W, y;
    const int64_t xs[3] = {1, T, D}, ws[2] = {D, D};
    attn_tensor_init(NULL, &x, ATTN_DTYPE_F32, (unsigned char *)qbuf + 3, 3, xs);
    attn_tensor_init(NULL, &W, ATTN_DTYPE_F32, kbuf, 2, ws);
    attn_tensor_init(NULL, &y, ATTN_DTYPE_F32, obuf, 3, xs);
    CHECK_INT(attn_linear(ctx, &x, &W, NULL, &y), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "not aligned");
    CHECK_INT(attn_rope_apply(ctx, NULL, &x, &y), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "not aligned");
}

static void test_self_overlap(attn_ctx *ctx)
{
    tu_fill(qbuf, N, 1);
    tu_fill(kbuf, N, 2);
    tu_fill(vbuf, N, 3);
    attn_tensor q = at_bytes(qbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                k = at_bytes(kbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                v = at_bytes(vbuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                o = at_bytes(obuf, 0, ATTN_DTYPE_F32, B, H, T, D),
                w = at_bytes(wbuf, 0, ATTN_DTYPE_F32, B, H, T, T);

    TEST("an out with stride 0 on its query axis (every query's row written to one place) "
         "is refused, naming out, its shape and its strides, and nothing is written");
    attn_tensor o0 = o;
    o0.stride[2] = 0;
    memset(obuf, 0x7f, sizeof obuf);
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &o0, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "out (shape (1, 2, 7, 8), strides (112, 56, 0, 1)) overlaps itself");
    CHECK_INT(out_untouched(), 1);

    TEST("weights whose rows overlap (row stride 3 for rows of 7: interleaved axes) and an "
         "lse with stride 0 on its head axis are refused as overlapping themselves");
    attn_tensor wi = w;
    wi.stride[2] = 3; /* rows of T = 7 weights starting 3 apart: each shares 4 with the next */
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &o, &wi), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "weights (shape (1, 2, 7, 7), strides (98, 49, 3, 1)) may "
                                     "overlap itself: its axes' strides interleave");
    float lse_buf[B * H * T];
    attn_tensor lse;
    const int64_t ls[3] = {B, H, T};
    attn_tensor_init(NULL, &lse, ATTN_DTYPE_F32, lse_buf, 3, ls);
    lse.stride[1] = 0;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    CHECK_INT(sdpa(ctx, &q, &k, &v, &p, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "overlaps itself: stride 0 on axis 1 writes its 2 entries");

    TEST("inputs may still broadcast through stride 0: k and v read one key row for every "
         "key give the answer of that row repeated (uniform weights, out = v's row)");
    attn_tensor k0 = k, v0 = v;
    k0.stride[2] = 0;
    v0.stride[2] = 0;
    CHECK_INT(sdpa(ctx, &q, &k0, &v0, NULL, &o, &w), ATTN_OK);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            CHECK_NEAR(wbuf[(h * T + t) * T + 3], 1.0f / T, 1e-7, 0);
            for (int d = 0; d < D; d++)
                CHECK_NEAR(obuf[(h * T + t) * D + d], vbuf[h * T * D + d], 1e-6, 1e-6);
        }

    TEST("out overlapping q by one element is refused; out = q itself (the header's "
         "in-place call) gives the bits of a separate out");
    attn_tensor shifted = q;
    shifted.data = qbuf + 1;
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &shifted, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, "out and q share memory");
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &o, NULL), ATTN_OK);
    CHECK_INT(sdpa(ctx, &q, &k, &v, NULL, &q, NULL), ATTN_OK);
    int differ = 0;
    for (int i = 0; i < N; i++)
        if (memcmp(&qbuf[i], &obuf[i], sizeof(float)) != 0 && differ++ == 0)
            fprintf(stderr, "   in place [%d]: %.9g, separate %.9g\n", i, (double)qbuf[i],
                    (double)obuf[i]);
    CHECK_INT(differ, 0);
}

int main(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    test_alignment(&ctx);
    test_self_overlap(&ctx);
    attn_ctx_release(&ctx);
    return check_summary("test_embed_args");
}
