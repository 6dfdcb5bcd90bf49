/*
 * test_alias.c - what may share memory, and what happens when it does.
 *
 * attn.h says, for every function that writes a tensor, which arguments may share
 * memory with its outputs. Where sharing would give wrong numbers the call refuses
 * it with INVALID_ARGUMENT and a message naming both tensors; where the header
 * allows it (an output that is exactly an input, read before it is written) the
 * result equals the result with separate memory. This file checks the detector
 * itself against a byte-by-byte oracle, then every pair of every writing function.
 */
#include "attn.h"
#include "attn_internal.h"
#include "check.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>

/* ---- the detector against an oracle ------------------------------------------- */

enum { ARENA = 512 };

/* Marks the bytes of t (relative to arena) in mark[]; returns 0 when t leaves it. */
static int mark_bytes(const attn_tensor *t, const unsigned char *arena, unsigned char *mark,
                      unsigned char value)
{
    int64_t sh[4], st[4];
    attn__as4d(t, sh, st);
    const int64_t es = (int64_t)attn_dtype_size(t->dtype);
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t b = 0; b < sh[1]; b++)
            for (int64_t c = 0; c < sh[2]; c++)
                for (int64_t d = 0; d < sh[3]; d++) {
                    int64_t off = (int64_t)((const unsigned char *)t->data - arena) +
                                  attn__off4(st, a, b, c, d) * es;
                    for (int64_t k = 0; k < es; k++) {
                        if (off + k < 0 || off + k >= ARENA)
                            return 0;
                        mark[off + k] |= value;
                    }
                }
    return 1;
}

static attn_dtype random_dtype(uint64_t *s)
{
    static const attn_dtype all[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BOOL, ATTN_DTYPE_I64,
                                     ATTN_DTYPE_I32};
    return all[(int)((tu_uniform(s) + 1.0f) * 2.0f) & 3];
}

static int64_t rnd(uint64_t *s, int64_t n) /* 0 .. n-1 */
{
    int64_t r = (int64_t)((tu_uniform(s) + 1.0f) * 0.5f * (float)n);
    return r < 0 ? 0 : r >= n ? n - 1 : r;
}

/* A random view into the arena: a C-ordered array, possibly transposed, sliced,
 * strided, broadcast (stride 0) or, now and then, a self-overlapping view. */
static attn_tensor random_view(uint64_t *s, unsigned char *arena)
{
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = random_dtype(s);
    t.ndim = 1 + (int)rnd(s, 4);
    int64_t stride = 1 + rnd(s, 2);
    for (int k = t.ndim - 1; k >= 0; k--) {
        t.shape[k] = 1 + rnd(s, 4);
        t.stride[k] = stride;
        stride *= t.shape[k] + rnd(s, 2); /* a gap makes it a column block */
    }
    const int64_t kind = rnd(s, 10);
    if (kind == 0 && t.ndim >= 2) { /* transpose */
        int64_t x = t.shape[0], y = t.stride[0];
        t.shape[0] = t.shape[t.ndim - 1];
        t.stride[0] = t.stride[t.ndim - 1];
        t.shape[t.ndim - 1] = x;
        t.stride[t.ndim - 1] = y;
    } else if (kind == 1) { /* broadcast axis */
        t.stride[rnd(s, t.ndim)] = 0;
    } else if (kind == 2) { /* a view that overlaps itself */
        t.stride[rnd(s, t.ndim)] = 1;
    }
    for (int k = t.ndim; k < ATTN_MAX_DIMS; k++)
        t.shape[k] = t.stride[k] = 1;
    const int64_t es = (int64_t)attn_dtype_size(t.dtype);
    int64_t last = 0;
    for (int k = 0; k < t.ndim; k++)
        last += (t.shape[k] - 1) * t.stride[k];
    const int64_t room = ARENA / es - last;
    t.data = arena + es * rnd(s, room > 1 ? room : 1);
    return t;
}

static void test_detector(void)
{
    TEST("attn__overlap says two views share memory exactly when a byte-by-byte oracle "
         "does, for 20000 random views (slices, transposes, column blocks, broadcasts, "
         "mixed dtypes); a self-overlapping view is never said not to overlap");
    static unsigned char arena[ARENA];
    uint64_t s = 12345;
    int checked = 0, overlapping = 0, exact_mismatch = 0, unsafe = 0;
    for (int n = 0; n < 20000; n++) {
        attn_tensor a = random_view(&s, arena), b = random_view(&s, arena);
        unsigned char mark[ARENA] = {0};
        if (!mark_bytes(&a, arena, mark, 1) || !mark_bytes(&b, arena, mark, 2))
            continue;
        int truth = 0;
        for (int i = 0; i < ARENA; i++)
            truth |= mark[i] == 3;
        const int got = attn__overlap(&a, &b);
        checked++;
        overlapping += truth;
        if (truth && !got)
            unsafe++;
        /* Views that are ordinary arrays (no stride of 1 forced onto an axis) must
         * get the exact answer; a self-overlapping one may be called overlapping. */
        if (!truth && got) {
            int64_t sa[4], ta[4], sb[4], tb[4];
            attn__as4d(&a, sa, ta);
            attn__as4d(&b, sb, tb);
            unsigned char self[ARENA] = {0};
            int self_overlap = 0;
            /* An oracle for "overlaps itself": some byte is reached twice. */
            const attn_tensor *both[2] = {&a, &b};
            for (int w = 0; w < 2 && !self_overlap; w++) {
                memset(self, 0, sizeof self);
                int64_t sh[4], st[4];
                attn__as4d(both[w], sh, st);
                const int64_t es = (int64_t)attn_dtype_size(both[w]->dtype);
                for (int k = 0; k < 4; k++)
                    if (st[k] == 0)
                        sh[k] = 1; /* broadcast repeats bytes on purpose */
                for (int64_t i0 = 0; i0 < sh[0]; i0++)
                    for (int64_t i1 = 0; i1 < sh[1]; i1++)
                        for (int64_t i2 = 0; i2 < sh[2]; i2++)
                            for (int64_t i3 = 0; i3 < sh[3]; i3++) {
                                int64_t off = (int64_t)((unsigned char *)both[w]->data - arena) +
                                              attn__off4(st, i0, i1, i2, i3) * es;
                                for (int64_t k = 0; k < es; k++)
                                    self_overlap |= self[off + k]++ != 0;
                            }
            }
            if (!self_overlap) {
                exact_mismatch++;
                if (exact_mismatch <= 5)
                    fprintf(stderr, "   false overlap: a %s +%td, b %s +%td\n",
                            attn_dtype_name(a.dtype), (unsigned char *)a.data - arena,
                            attn_dtype_name(b.dtype), (unsigned char *)b.data - arena);
            }
        }
    }
    fprintf(stderr, "   %d pairs checked, %d overlapping\n", checked, overlapping);
    CHECK(checked > 10000);
    CHECK(overlapping > 1000 && overlapping < checked - 1000);
    CHECK_INT(unsafe, 0);
    CHECK_INT(exact_mismatch, 0);
}

static void test_column_blocks(void)
{
    TEST("q, k and v as column blocks of one [T, 3E] buffer do not overlap each other, "
         "and a block shifted by one element overlaps its neighbour");
    enum { T = 5, E = 8 };
    static float buf[T * 3 * E];
    attn_tensor q, k, kshift;
    memset(&q, 0, sizeof q);
    q.data = buf;
    q.dtype = ATTN_DTYPE_F32;
    q.ndim = 2;
    q.shape[0] = T;
    q.shape[1] = E;
    q.stride[0] = 3 * E;
    q.stride[1] = 1;
    q.shape[2] = q.shape[3] = q.stride[2] = q.stride[3] = 1;
    k = q;
    k.data = buf + E;
    kshift = q;
    kshift.data = buf + E - 1;
    CHECK_INT(attn__overlap(&q, &k), 0);
    CHECK_INT(attn__overlap(&k, &q), 0);
    CHECK_INT(attn__overlap(&q, &kshift), 1);
    CHECK_INT(attn__overlap(&q, &q), 1);
    CHECK_INT(attn__same_view(&q, &q), 1);
    CHECK_INT(attn__same_view(&q, &k), 0);
}

/* ---- every writing function --------------------------------------------------- */

static void expect_alias_error(int rc, const attn_ctx *ctx, const char *a, const char *b)
{
    CHECK_INT(rc, ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx->message, a);
    CHECK_STR_CONTAINS(ctx->message, b);
    CHECK_STR_CONTAINS(ctx->message, "share memory");
}

static void test_tensor_copy(void)
{
    TEST("attn_tensor_copy refuses overlapping source and destination (it gave zeros), "
         "naming both, and copying a view onto itself changes nothing");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float buf[16];
    for (int i = 0; i < 16; i++)
        buf[i] = (float)i;
    const int64_t shape[1] = {8};
    attn_tensor src, dst;
    attn_tensor_init(&ctx, &src, ATTN_DTYPE_F32, buf, 1, shape);
    attn_tensor_init(&ctx, &dst, ATTN_DTYPE_F32, buf + 4, 1, shape);
    expect_alias_error(attn_tensor_copy(&ctx, &src, &dst), &ctx, "destination", "source");
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == (float)i); /* nothing was written */
    CHECK_INT(attn_tensor_copy(&ctx, &src, &src), ATTN_OK);
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == (float)i);
    attn_tensor_init(&ctx, &dst, ATTN_DTYPE_F32, buf + 8, 1, shape); /* adjacent: fine */
    CHECK_INT(attn_tensor_copy(&ctx, &src, &dst), ATTN_OK);
    for (int i = 0; i < 8; i++)
        CHECK(buf[8 + i] == (float)i);
}

static void test_masks(void)
{
    TEST("attn_mask_and may write into a or b itself (same result as separate memory) "
         "but refuses an out that overlaps them otherwise; attn_mask_padding refuses a "
         "mask that overlaps the token ids");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    enum { B = 2, T = 5 };
    uint8_t a[B * T * T], b[T * T], want[B * T * T];
    uint64_t s = 7;
    for (int i = 0; i < B * T * T; i++)
        a[i] = tu_uniform(&s) > 0;
    for (int i = 0; i < T * T; i++)
        b[i] = tu_uniform(&s) > -0.3f;
    const int64_t sa[4] = {B, 1, T, T}, sb[4] = {1, 1, T, T};
    attn_tensor ta, tb, tw;
    attn_tensor_init(&ctx, &ta, ATTN_DTYPE_BOOL, a, 4, sa);
    attn_tensor_init(&ctx, &tb, ATTN_DTYPE_BOOL, b, 4, sb);
    attn_tensor_init(&ctx, &tw, ATTN_DTYPE_BOOL, want, 4, sa);
    CHECK_INT(attn_mask_and(&ctx, &ta, &tb, &tw), ATTN_OK);
    CHECK_INT(attn_mask_and(&ctx, &ta, &tb, &ta), ATTN_OK); /* in place into a */
    CHECK(memcmp(a, want, sizeof a) == 0);

    /* out overlapping a, shifted by one entry. */
    static uint8_t big[B * T * T + 1];
    attn_tensor tbig, tshift;
    attn_tensor_init(&ctx, &tbig, ATTN_DTYPE_BOOL, big, 4, sa);
    attn_tensor_init(&ctx, &tshift, ATTN_DTYPE_BOOL, big + 1, 4, sa);
    expect_alias_error(attn_mask_and(&ctx, &tbig, &tb, &tshift), &ctx, "out", "a");
    expect_alias_error(attn_mask_and(&ctx, &tb, &tbig, &tshift), &ctx, "out", "b");

    int64_t ids[B * T] = {1, 2, 3, 0, 0, 4, 5, 0, 0, 0};
    const int64_t si[2] = {B, T}, sm[4] = {B, 1, 1, T};
    attn_tensor tid, tm;
    attn_tensor_init(&ctx, &tid, ATTN_DTYPE_I64, ids, 2, si);
    attn_tensor_init(&ctx, &tm, ATTN_DTYPE_BOOL, (uint8_t *)ids + 3, 4, sm);
    expect_alias_error(attn_mask_padding(&ctx, &tid, 0, &tm), &ctx, "mask", "token_ids");
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[5] == 4); /* untouched */
}

static void test_sdpa_pairs(void)
{
    TEST("attn_sdpa refuses every output (out, weights, lse) that overlaps an input (q, k, "
         "v, mask, bias, sinks, ALiBi slopes) or another output, naming both, on every "
         "path; out may be q itself and then equals the result with separate memory");
    enum { B = 1, H = 2, T = 6, D = 4 };
    enum { NQ = B * H * T * D, NW = B * H * T * T, NL = B * H * T };
    /* One arena holds every tensor, so any output can be placed on any input. */
    /* Each input is followed by a gap at least as large as the largest output, so
     * an output laid over an input's start overlaps that input only. */
    enum { GAP = NW };
    static float arena[16 * NW];
    float *q = arena, *k = q + NQ + GAP, *v = k + NQ + GAP, *bias = v + NQ + GAP,
          *sinks = bias + NW + GAP, *slopes = sinks + H + GAP, *o = slopes + H + GAP,
          *w = o + NQ, *lse = w + NW, *o2 = lse + NL;
    uint8_t *mask = (uint8_t *)(o2 + NQ + GAP);
    tu_fill(arena, (int64_t)(sizeof arena / sizeof arena[0]), 5);
    for (int i = 0; i < NW; i++)
        mask[i] = 1;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D);
    attn_tensor tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    attn_tensor tw = tu_tensor4(w, B, H, T, T), tb = tu_tensor4(bias, B, H, T, T);
    attn_tensor tl = tu_tensor3(lse, B, H, T), tm = tu_tensor4((float *)mask, B, H, T, T);
    tm.dtype = ATTN_DTYPE_BOOL;
    const int64_t hs[1] = {H};
    attn_tensor tsk, tsl;
    attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, sinks, 1, hs);
    attn_tensor_init(NULL, &tsl, ATTN_DTYPE_F32, slopes, 1, hs);
    for (int i = 0; i < H; i++)
        slopes[i] = 0.1f;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tm;
    p.bias = &tb;
    p.sinks = &tsk;
    p.alibi_slopes = &tsl;
    p.lse = &tl;

    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);

        /* Each output placed over the start of each input. */
        struct { const char *name; float *at; } ins[] = {
            {"q", q}, {"k", k}, {"v", v}, {"bias", bias}, {"sinks", sinks},
            {"alibi_slopes", slopes}, {"mask", (float *)mask}};
        for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
            attn_tensor bad_o = to, bad_w = tw, bad_l = tl;
            bad_o.data = ins[i].at + (i == 0 ? 1 : 0); /* q itself is allowed; q + 1 is not */
            bad_w.data = ins[i].at;
            bad_l.data = ins[i].at;
            expect_alias_error(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &bad_o, &tw), &ctx, "out",
                               ins[i].name);
            expect_alias_error(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, &bad_w), &ctx, "weights",
                               ins[i].name);
            attn_sdpa_params pl = p;
            pl.lse = &bad_l;
            expect_alias_error(attn_sdpa(&ctx, &tq, &tk, &tv, &pl, &to, &tw), &ctx, "lse",
                               ins[i].name);
        }
        /* Outputs on each other. */
        attn_tensor w_on_o = tw, l_on_w = tl;
        w_on_o.data = o;
        l_on_w.data = w;
        expect_alias_error(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, &w_on_o), &ctx, "weights", "out");
        attn_sdpa_params pl = p;
        pl.lse = &l_on_w;
        expect_alias_error(attn_sdpa(&ctx, &tq, &tk, &tv, &pl, &to, &tw), &ctx, "lse", "weights");

        /* In place: out is q. */
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_TOP_LEFT;
        attn_tensor to2 = tu_tensor4(o2, B, H, T, D);
        static float qcopy[NQ];
        memcpy(qcopy, q, sizeof qcopy);
        CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to2, NULL), ATTN_OK);
        CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &tq, NULL), ATTN_OK);
        CHECK(memcmp(q, o2, sizeof qcopy) == 0);
        memcpy(q, qcopy, sizeof qcopy);
        attn_sdpa_params_init(&p);
        p.mask = &tm;
        p.bias = &tb;
        p.sinks = &tsk;
        p.alibi_slopes = &tsl;
        p.lse = &tl;
    }
}

static void test_linear_pairs(void)
{
    TEST("attn_linear refuses y overlapping x, the weight or the bias (y == x gave numbers "
         "off by up to 30), and attn_linear_forward_packed y overlapping x, naming both");
    enum { M = 4, K = 6, N = 6 };
    static float buf[M * K + N * K + N + M * N];
    float *x = buf, *W = x + M * K, *b = W + N * K, *y = b + N;
    tu_fill(buf, (int64_t)(sizeof buf / sizeof buf[0]), 9);
    const int64_t sx[2] = {M, K}, sw[2] = {N, K}, sb[1] = {N}, sy[2] = {M, N};
    attn_tensor tx, tW, tb, ty;
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, x, 2, sx);
    attn_tensor_init(NULL, &tW, ATTN_DTYPE_F32, W, 2, sw);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, sb);
    attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, y, 2, sy);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_linear(&ctx, &tx, &tW, &tb, &ty), ATTN_OK);
    attn_tensor on_x = ty, on_w = ty, on_b = ty;
    on_x.data = x;
    on_w.data = W + 3;
    on_b.data = b;
    expect_alias_error(attn_linear(&ctx, &tx, &tW, &tb, &on_x), &ctx, "y", "x");
    expect_alias_error(attn_linear(&ctx, &tx, &tW, &tb, &on_w), &ctx, "y", "weight");
    expect_alias_error(attn_linear(&ctx, &tx, &tW, &tb, &on_b), &ctx, "y", "bias");
    attn_linear_packed *pw = NULL;
    CHECK_INT(attn_linear_pack(&ctx, &tW, &tb, &pw), ATTN_OK);
    expect_alias_error(attn_linear_forward_packed(&ctx, &tx, pw, &on_x), &ctx, "y", "x");
    CHECK_INT(attn_linear_forward_packed(&ctx, &tx, pw, &ty), ATTN_OK);
    attn_linear_packed_free(&ctx, pw);
}

static void test_mha_pairs(void)
{
    TEST("attn_mha_forward may write out over x itself (same result as separate memory) "
         "but refuses out, the attention weights or the log-sum-exp overlapping x, the "
         "weight tensors or each other, naming both; the packed call too");
    enum { B = 2, T = 5, E = 8, H = 2 };
    /* One arena in a known order, with a gap after the output weight so that an
     * out laid over it overlaps it alone. */
    static float arena[3 * E * E + 3 * E + E * E + B * T * E + E + B * T * E + B * T * E +
                       B * H * T * T + B * H * T];
    float *wqkv = arena, *bqkv = wqkv + 3 * E * E, *wo = bqkv + 3 * E, *bo = wo + E * E + B * T * E;
    float *x = bo + E, *out = x + B * T * E, *att = out + B * T * E, *lse = att + B * H * T * T;
    tu_fill(wqkv, 3 * E * E, 11);
    tu_fill(bqkv, 3 * E, 12);
    tu_fill(wo, E * E, 13);
    tu_fill(bo, E, 14);
    tu_fill(x, B * T * E, 15);
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), to = tu_tensor3(out, B, T, E);
    attn_tensor ta = tu_tensor4(att, B, H, T, T), tl = tu_tensor3(lse, B, H, T);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    p.lse = &tl;
    CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &to, &ta), ATTN_OK);

    attn_tensor o_wqkv = to, o_wo = to, a_x = ta, a_o = ta, l_x = tl, l_a = tl;
    o_wqkv.data = wqkv;
    o_wo.data = wo;
    a_x.data = x;
    a_o.data = out;
    l_x.data = x + 3;
    l_a.data = att;
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &p, &o_wqkv, &ta), &ctx, "out",
                       "qkv weight");
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &p, &o_wo, &ta), &ctx, "out",
                       "output weight");
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &p, &to, &a_x), &ctx, "weights", "x");
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &p, &to, &a_o), &ctx, "weights", "out");
    attn_sdpa_params pl = p;
    pl.lse = &l_x;
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &pl, &to, &ta), &ctx, "lse", "x");
    pl.lse = &l_a;
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &pl, &to, &ta), &ctx, "lse", "weights");
    attn_tensor shifted = to;
    shifted.data = x + 1;
    expect_alias_error(attn_mha_forward(&ctx, &mw, H, &tx, &p, &shifted, &ta), &ctx, "out", "x");

    attn_mha_packed *pw = NULL;
    CHECK_INT(attn_mha_pack(&ctx, &mw, &pw), ATTN_OK);
    expect_alias_error(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &to, &a_x), &ctx,
                       "weights", "x");
    /* In place: out is x. */
    static float xin[B * T * E];
    memcpy(xin, x, sizeof xin);
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tx, NULL), ATTN_OK);
    CHECK(memcmp(x, out, sizeof xin) == 0);
    memcpy(x, xin, sizeof xin);
    CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &tx, NULL), ATTN_OK);
    CHECK(memcmp(x, out, sizeof xin) == 0);
    attn_mha_packed_free(&ctx, pw);
}

int main(void)
{
    test_detector();
    test_column_blocks();
    test_tensor_copy();
    test_masks();
    test_sdpa_pairs();
    test_linear_pairs();
    test_mha_pairs();
    return check_summary("test_alias");
}
