/*
 * test_oom.c - out of memory, allocation by allocation. For every public entry
 * point that allocates, a counting allocator makes the 1st, 2nd, 3rd ... allocation
 * fail until the call succeeds. Each failing run must return ATTN_STATUS_NO_MEMORY
 * with a message, leave no allocation behind, and leave files untouched; the run
 * that finally succeeds must give the same result as an unconstrained run.
 *
 * Each entry point that allocates is also called with an allocator of which only
 * one function is set (alloc without free, free without alloc): memory of one heap
 * would be handed to the other's free. Each must refuse it, INVALID_ARGUMENT with
 * a message naming ctx->allocator, before it asks either function for anything.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

typedef struct counting {
    long calls;    /* allocations asked for so far */
    long fail_at;  /* the allocation (1-based) that fails; 0 = none */
    long live;     /* allocations not yet freed */
} counting;

static void *count_alloc(void *user, size_t n)
{
    counting *c = user;
    if (++c->calls == c->fail_at)
        return NULL;
    void *p = malloc(n);
    if (p)
        c->live++;
    return p;
}

static void count_free(void *user, void *p)
{
    counting *c = user;
    c->live--;
    free(p);
}

/* One entry point under test: runs with ctx, returns its status, and frees what it
 * produced on success (through the same ctx). */
typedef int (*entry_fn)(attn_ctx *ctx, void *arg);

/* Fails allocation 1, 2, ... until the call succeeds; returns how many failed. */
static long sweep(const char *name, entry_fn fn, void *arg)
{
    long fails = 0;
    for (long k = 1; k < 10000; k++) {
        counting c = {0, k, 0};
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.threads = 1;
        ctx.allocator.alloc = count_alloc;
        ctx.allocator.free = count_free;
        ctx.allocator.user = &c;
        int rc = fn(&ctx, arg);
        if (c.live != 0)
            fprintf(stderr, "  %s: failing allocation %ld leaves %ld allocations behind\n", name, k, c.live);
        CHECK_INT(c.live, 0);
        if (rc == ATTN_OK) {
            CHECK(c.calls < k); /* it succeeded because allocation k was never asked for */
            break;
        }
        fails++;
        if (rc != ATTN_STATUS_NO_MEMORY)
            fprintf(stderr, "  %s: failing allocation %ld gives %s: %s\n", name, k,
                    attn_status_name(rc), ctx.message);
        CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
        CHECK_STR_CONTAINS(ctx.message, "out of memory");
    }
    fprintf(stderr, "  %s: %ld allocations made to fail, each cleanly\n", name, fails);
    if (fails > 0)
        for (int half = 0; half < 2; half++) {
            counting c = {0, 0, 0};
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.threads = 1;
            ctx.allocator.alloc = half == 0 ? count_alloc : NULL;
            ctx.allocator.free = half == 1 ? count_free : NULL;
            ctx.allocator.user = &c;
            int rc = fn(&ctx, arg);
            if (rc != ATTN_STATUS_INVALID_ARGUMENT || c.calls != 0)
                fprintf(stderr, "  %s: an allocator with only %s set gives %s after %ld allocations: %s\n",
                        name, half == 0 ? "alloc" : "free", attn_status_name(rc), c.calls, ctx.message);
            CHECK_INT(rc, ATTN_STATUS_INVALID_ARGUMENT);
            CHECK_INT(c.calls, 0);
            CHECK_INT(c.live, 0);
            CHECK_STR_CONTAINS(ctx.message, "ctx->allocator has");
        }
    return fails;
}

/* ---- the entry points ---------------------------------------------------------- */

enum { B = 2, H = 2, T = 9, D = 8, E = H * D };
static float q[B * H * T * D], k[B * H * T * D], v[B * H * T * D], o[B * H * T * D],
    w[B * H * T * T];
static float x[B * T * E], wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E], y[B * T * E];

static int run_alloc(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_tensor t;
    const int64_t s[2] = {3, 5};
    int rc = attn_tensor_alloc(ctx, &t, ATTN_DTYPE_F32, 2, s);
    if (rc == ATTN_OK)
        attn_tensor_free(ctx, &t);
    return rc;
}

static int run_sdpa(attn_ctx *ctx, void *arg)
{
    ctx->impl = *(attn_impl *)arg;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D),
                tw = tu_tensor4(w, B, H, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_sdpa(ctx, &tq, &tk, &tv, &p, &to, &tw);
}

/* The default kernel on `len` tokens (16 or 32): its scratch grows with them. */
static float lq[B * H * 32 * D], lo[B * H * 32 * D];
static int run_sdpa_len(attn_ctx *ctx, int64_t len)
{
    attn_tensor tq = tu_tensor4(lq, B, H, len, D), to = tu_tensor4(lo, B, H, len, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_sdpa(ctx, &tq, &tq, &tq, &p, &to, NULL);
}

static int run_mha(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_mha_forward(ctx, &mw, H, &tx, &p, &ty, NULL);
}

static int run_linear(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_tensor tx = tu_tensor3(x, B, T, E), tq = tu_tensor3(y, B, T, E);
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    return attn_linear(ctx, &tx, &mw.w_o, &mw.b_o, &tq);
}

static int run_linear_pack(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_linear_packed *pl = NULL;
    int rc = attn_linear_pack(ctx, &mw.w_qkv, &mw.b_qkv, &pl);
    if (rc == ATTN_OK)
        attn_linear_packed_free(ctx, pl);
    return rc;
}

static int run_linear_packed(attn_ctx *ctx, void *arg)
{
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    return attn_linear_forward_packed(ctx, &tx, arg, &ty);
}

static int run_mha_pack(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_mha_packed *pw = NULL;
    int rc = attn_mha_pack(ctx, &mw, &pw);
    if (rc == ATTN_OK)
        attn_mha_packed_free(ctx, pw);
    return rc;
}

static int run_mha_packed(attn_ctx *ctx, void *arg)
{
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_mha_forward_packed(ctx, arg, H, &tx, &p, &ty, NULL);
}

/* The multi-head call with keep_workspace: the kept buffer is the one allocation,
 * and a failed call leaves none behind (the context is released here). */
static int run_mha_kept(attn_ctx *ctx, void *arg)
{
    ctx->keep_workspace = 1;
    int rc = run_mha_packed(ctx, arg);
    if (rc == ATTN_OK)
        rc = run_mha_packed(ctx, arg);
    attn_ctx_release(ctx);
    return rc;
}

static int run_workspace_queries(attn_ctx *ctx, void *arg)
{
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    size_t bytes;
    int rc = attn_mha_workspace_size(ctx, &mw, H, &tx, NULL, &ty, NULL, &bytes);
    if (rc == ATTN_OK)
        rc = attn_mha_packed_workspace_size(ctx, arg, H, &tx, NULL, &ty, NULL, &bytes);
    if (rc == ATTN_OK)
        rc = attn_linear_workspace_size(ctx, &tx, &mw.w_o, &mw.b_o, &ty, &bytes);
    return rc;
}

/* The gradients, grouped-query attention, the KV cache, 16-bit attention and RoPE,
 * with two threads (per-thread scratch slices) where the call takes them. */
static float lse[B * H * T], dout[B * H * T * D], dq[B * H * T * D], dk[B * H * T * D],
    dv[B * H * T * D];
static float dx[B * T * E], dwqkv[3 * E * E], dbqkv[3 * E], dwo[E * E], dbo[E];
static uint16_t hq[B * H * T * D], hk[B * H * T * D], hv[B * H * T * D], ho[B * H * T * D];

/* A contiguous float32 tensor of ndim dims over caller memory. */
static attn_tensor tn(void *data, int ndim, int64_t a, int64_t b, int64_t c)
{
    attn_tensor t;
    const int64_t shape[3] = {a, b, c};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, ndim, shape);
    return t;
}

static int run_sdpa_backward(attn_ctx *ctx, void *arg)
{
    ctx->impl = *(attn_impl *)arg;
    ctx->threads = 2;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D),
                tl = tn(lse, 3, B, H, T), tdo = tu_tensor4(dout, B, H, T, D),
                tdq = tu_tensor4(dq, B, H, T, D), tdk = tu_tensor4(dk, B, H, T, D),
                tdv = tu_tensor4(dv, B, H, T, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, NULL};
    return attn_sdpa_backward(ctx, &tq, &tk, &tv, &p, &to, &tl, &tdo, &g);
}

static int run_mha_backward(attn_ctx *ctx, void *arg)
{
    (void)arg;
    ctx->threads = 2;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), tdy = tu_tensor3(y, B, T, E),
                tdx = tu_tensor3(dx, B, T, E), tdw = tn(dwqkv, 2, 3 * E, E, 1),
                tdb = tn(dbqkv, 1, 3 * E, 1, 1), tdwo = tn(dwo, 2, E, E, 1),
                tdbo = tn(dbo, 1, E, 1, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    attn_mha_grads g = {&tdx, &tdw, &tdb, &tdwo, &tdbo};
    return attn_mha_backward(ctx, &mw, H, &tx, &p, &tdy, &g);
}

static int run_half_sdpa(attn_ctx *ctx, void *arg)
{
    ctx->impl = *(attn_impl *)arg;
    ctx->threads = 2;
    attn_tensor tq = tu_tensor4(NULL, B, H, T, D), tk = tq, tv = tq, to = tq;
    tq.data = hq, tk.data = hk, tv.data = hv, to.data = ho;
    tq.dtype = tk.dtype = tv.dtype = to.dtype = ATTN_DTYPE_BF16;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_sdpa(ctx, &tq, &tk, &tv, &p, &to, NULL);
}

/* Creates a cache, appends q's keys and values (rotated), attends to them, frees it. */
static int run_kv_cache(attn_ctx *ctx, void *arg)
{
    ctx->threads = 2;
    attn_kv_cache_config cfg = {B, H, 16, D, 0, *(attn_dtype *)arg};
    attn_kv_cache *cache = NULL;
    int rc = attn_kv_cache_create(ctx, &cfg, NULL, 0, &cache);
    if (rc != ATTN_OK) {
        CHECK(cache == NULL);
        return rc;
    }
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    rc = attn_kv_cache_append(ctx, cache, 0, &tk, &tv, &rope);
    if (rc == ATTN_OK)
        rc = attn_kv_cache_attend(ctx, cache, 0, &tq, NULL, &rope, &to, NULL);
    attn_kv_cache_free(ctx, cache);
    return rc;
}

static int run_rope(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    attn_tensor tq = tu_tensor4(q, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    int rc = attn_rope_apply(ctx, &rope, &tq, &to);
    if (rc == ATTN_OK)
        rc = attn_rope_backward(ctx, &rope, &tq, &to);
    return rc;
}

static char npy_path[512], st_path[512], out_path[512], out_stem[128];

/* Files in the test folder whose name starts with the output's name: the output
 * itself or a temporary made for it. */
static int leftovers(void)
{
    int n = 0;
    DIR *d = opendir(ATTN_TEST_TMP_DIR);
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, out_stem, strlen(out_stem)) == 0;
    closedir(d);
    return n;
}

static int run_npy_load(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_array a;
    int rc = attn_npy_load(ctx, npy_path, &a);
    if (rc == ATTN_OK)
        attn_array_free(ctx, &a);
    return rc;
}

static int run_npy_save(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_tensor t = tu_tensor4(q, B, H, T, D);
    return attn_npy_save(ctx, out_path, &t);
}

static int run_st_get(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_safetensors *st;
    int rc = attn_safetensors_open(ctx, st_path, &st);
    if (rc)
        return rc;
    attn_array a;
    rc = attn_safetensors_get(ctx, st, "qkv.weight", &a);
    if (rc == ATTN_OK)
        attn_array_free(ctx, &a);
    attn_safetensors_close(ctx, st);
    return rc;
}

static int run_st_save(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_tensor t[2];
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E};
    attn_tensor_init(NULL, &t[0], ATTN_DTYPE_F32, wqkv, 2, s1);
    attn_tensor_init(NULL, &t[1], ATTN_DTYPE_F32, bqkv, 1, s2);
    const char *names[2] = {"a", "b"};
    return attn_safetensors_save(ctx, out_path, names, t, 2);
}

static int run_weights_load(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_mha_weights mw;
    int rc = attn_weights_load(ctx, st_path, NULL, H, &mw);
    if (rc == ATTN_OK)
        attn_weights_free(ctx, &mw);
    return rc;
}

/* Grouped-query attention, H = 2 query heads over one key/value head of D: W_q
 * and W_o are wo, W_k and W_v halves of wqkv, no biases. */
static attn_gqa_weights gqa_weights(void)
{
    attn_gqa_weights g;
    memset(&g, 0, sizeof g);
    const int64_t sq[2] = {E, E}, skv[2] = {D, E}, sb[1] = {E}, sbkv[1] = {D};
    attn_tensor_init(NULL, &g.w_q, ATTN_DTYPE_F32, wo, 2, sq);
    attn_tensor_init(NULL, &g.w_k, ATTN_DTYPE_F32, wqkv, 2, skv);
    attn_tensor_init(NULL, &g.w_v, ATTN_DTYPE_F32, wqkv + D * E, 2, skv);
    attn_tensor_init(NULL, &g.w_o, ATTN_DTYPE_F32, wo, 2, sq);
    attn_tensor_init(NULL, &g.b_q, ATTN_DTYPE_F32, NULL, 1, sb);
    attn_tensor_init(NULL, &g.b_k, ATTN_DTYPE_F32, NULL, 1, sbkv);
    attn_tensor_init(NULL, &g.b_v, ATTN_DTYPE_F32, NULL, 1, sbkv);
    attn_tensor_init(NULL, &g.b_o, ATTN_DTYPE_F32, NULL, 1, sb);
    return g;
}

static int run_gqa(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_gqa_weights g = gqa_weights();
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    return attn_gqa_forward(ctx, &g, H, 1, &tx, NULL, &ty, NULL);
}

static int run_gqa_pack(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_gqa_weights g = gqa_weights();
    attn_mha_packed *pw = NULL;
    int rc = attn_gqa_pack(ctx, &g, H, 1, &pw);
    if (rc == ATTN_OK)
        attn_mha_packed_free(ctx, pw);
    return rc;
}

/* Grouped-query weights on RoPE'd heads, packed (the pack is made by the caller
 * with a plain context: only the call is swept). */
static int run_mha_packed_rope(attn_ctx *ctx, void *arg)
{
    attn_tensor tx = tu_tensor3(x, B, T, E), ty = tu_tensor3(y, B, T, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    attn_rope_params r;
    attn_rope_params_init(&r);
    r.offset = 5;
    return attn_mha_forward_packed_rope(ctx, arg, H, &tx, &p, &r, &ty, NULL);
}

static float dwq[E * E], dwk[D * E], dwv[D * E], dwo2[E * E], dbq[E], dbk[D], dbv[D], dbo2[E];

static int run_gqa_backward(attn_ctx *ctx, void *arg)
{
    (void)arg;
    ctx->threads = 2;
    attn_gqa_weights g = gqa_weights();
    attn_tensor tx = tu_tensor3(x, B, T, E), tdy = tu_tensor3(y, B, T, E),
                tdx = tu_tensor3(dx, B, T, E);
    const int64_t sq[2] = {E, E}, skv[2] = {D, E}, sb[1] = {E}, sbkv[1] = {D};
    attn_tensor gq, gk, gv, go, bq, bk, bv, bo_;
    attn_tensor_init(NULL, &gq, ATTN_DTYPE_F32, dwq, 2, sq);
    attn_tensor_init(NULL, &gk, ATTN_DTYPE_F32, dwk, 2, skv);
    attn_tensor_init(NULL, &gv, ATTN_DTYPE_F32, dwv, 2, skv);
    attn_tensor_init(NULL, &go, ATTN_DTYPE_F32, dwo2, 2, sq);
    attn_tensor_init(NULL, &bq, ATTN_DTYPE_F32, dbq, 1, sb);
    attn_tensor_init(NULL, &bk, ATTN_DTYPE_F32, dbk, 1, sbkv);
    attn_tensor_init(NULL, &bv, ATTN_DTYPE_F32, dbv, 1, sbkv);
    attn_tensor_init(NULL, &bo_, ATTN_DTYPE_F32, dbo2, 1, sb);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    attn_rope_params r;
    attn_rope_params_init(&r);
    attn_gqa_grads gr = {&tdx, &gq, &gk, &gv, &go, &bq, &bk, &bv, &bo_};
    return attn_gqa_backward(ctx, &g, H, 1, &tx, &p, &r, &tdy, &gr);
}

static int run_sdpa_fused(attn_ctx *ctx, void *arg)
{
    (void)arg;
    ctx->threads = 2;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    return attn_sdpa_fused(ctx, &tq, &tk, &tv, &p, &to, NULL);
}

static char gqa_path[512];

static int run_weights_load_gqa(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_gqa_weights g;
    int rc = attn_weights_load_gqa(ctx, gqa_path, NULL, H, 1, &g);
    if (rc == ATTN_OK)
        attn_gqa_weights_free(ctx, &g);
    return rc;
}

/* An output set of one file, committed. */
static int run_output_set(attn_ctx *ctx, void *arg)
{
    (void)arg;
    attn_output_set *set = NULL;
    int rc = attn_output_set_create(ctx, &set);
    if (rc == ATTN_OK)
        rc = attn_output_set_add_bytes(ctx, set, out_path, "attn\n", 5);
    if (rc == ATTN_OK)
        rc = attn_output_set_commit(ctx, set);
    attn_output_set_free(ctx, set);
    return rc;
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
    snprintf(npy_path, sizeof npy_path, "%s/oom_in_%d.npy", ATTN_TEST_TMP_DIR, (int)getpid());
    snprintf(st_path, sizeof st_path, "%s/oom_in_%d.safetensors", ATTN_TEST_TMP_DIR, (int)getpid());
    snprintf(out_stem, sizeof out_stem, "oom_out_%d", (int)getpid());
    snprintf(out_path, sizeof out_path, "%s/%s.bin", ATTN_TEST_TMP_DIR, out_stem);

    /* Inputs written with the default allocator. */
    attn_tensor tq = tu_tensor4(q, B, H, T, D);
    CHECK_INT(attn_npy_save(NULL, npy_path, &tq), ATTN_OK);
    attn_tensor ws[4];
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    attn_tensor_init(NULL, &ws[0], ATTN_DTYPE_F32, wqkv, 2, s1);
    attn_tensor_init(NULL, &ws[1], ATTN_DTYPE_F32, bqkv, 1, s2);
    attn_tensor_init(NULL, &ws[2], ATTN_DTYPE_F32, wo, 2, s3);
    attn_tensor_init(NULL, &ws[3], ATTN_DTYPE_F32, bo, 1, s4);
    const char *names[4] = {"qkv.weight", "qkv.bias", "output.weight", "output.bias"};
    CHECK_INT(attn_safetensors_save(NULL, st_path, names, ws, 4), ATTN_OK);

    TEST("attn_tensor_alloc fails cleanly when its allocation fails");
    CHECK(sweep("attn_tensor_alloc", run_alloc, NULL) >= 1);

    TEST("attention (reference and default kernel) fails cleanly at every allocation, and then gives the unconstrained result");
    attn_impl impls[2] = {ATTN_IMPL_REF, ATTN_IMPL_AUTO};
    for (int i = 0; i < 2; i++) {
        float want[B * H * T * D];
        attn_ctx plain;
        attn_ctx_init(&plain);
        CHECK_INT(run_sdpa(&plain, &impls[i]), ATTN_OK);
        memcpy(want, o, sizeof o);
        sweep(i ? "attn_sdpa (default)" : "attn_sdpa (ref)", run_sdpa, &impls[i]);
        CHECK(memcmp(want, o, sizeof o) == 0);
    }

    TEST("multi-head attention fails cleanly at every allocation");
    CHECK(sweep("attn_mha_forward", run_mha, NULL) >= 1);

    TEST("packing weights, the projection, and multi-head attention on packed weights "
         "(with and without keep_workspace) fail cleanly at every allocation, and a "
         "packed projection and the workspace queries allocate nothing");
    attn_mha_weights mw0 = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_mha_packed *pw = NULL;
    attn_linear_packed *pl = NULL;
    CHECK_INT(attn_mha_pack(NULL, &mw0, &pw), ATTN_OK);
    CHECK_INT(attn_linear_pack(NULL, &mw0.w_o, &mw0.b_o, &pl), ATTN_OK);
    CHECK(sweep("attn_mha_pack", run_mha_pack, NULL) >= 1);
    CHECK(sweep("attn_linear_pack", run_linear_pack, NULL) >= 1);
    CHECK(sweep("attn_mha_forward_packed", run_mha_packed, pw) >= 1);
    CHECK(sweep("attn_mha_forward_packed (keep_workspace)", run_mha_kept, pw) >= 1);
    if (attn_arch_selected(NULL) != ATTN_ARCH_REF) /* the reference reads W in place */
        CHECK(sweep("attn_linear", run_linear, NULL) >= 1);
    CHECK_INT(sweep("attn_linear_forward_packed", run_linear_packed, pl), 0);
    CHECK_INT(sweep("the workspace queries", run_workspace_queries, pw), 0);
    {
        TEST("a kept buffer (keep_workspace) goes back to the allocator that gave it, "
             "whatever the context's allocator has become by then");
        /* attn_ctx_release after the program set the free half to NULL: the buffer
         * went to libc's free (a.live stayed 1); the allocator changed to another
         * one before a call that grows the buffer: the old one went to b's free. */
        counting a = {0, 0, 0}, b = {0, 0, 0};
        attn_ctx kc;
        attn_ctx_init(&kc);
        kc.threads = 1;
        kc.keep_workspace = 1;
        kc.allocator = (attn_allocator){count_alloc, count_free, &a};
        CHECK_INT(run_mha_packed(&kc, pw), ATTN_OK);
        CHECK_INT(a.live, 1);
        const long asked = a.calls;
        kc.allocator.free = NULL; /* half-set: this call needs no memory, asks none */
        CHECK_INT(run_mha_packed(&kc, pw), ATTN_OK);
        CHECK_INT(a.calls, asked);
        attn_ctx_release(&kc);
        CHECK_INT(a.live, 0);

        a = (counting){0, 0, 0};
        kc.allocator = (attn_allocator){count_alloc, count_free, &a};
        CHECK_INT(run_sdpa_len(&kc, 16), ATTN_OK);
        const long kept_a = a.live;
        kc.allocator = (attn_allocator){count_alloc, count_free, &b};
        CHECK_INT(run_sdpa_len(&kc, 32), ATTN_OK); /* more scratch than 16 tokens */
        if (kept_a == 1 && b.calls == 1) { /* the buffer grew: a's old one to a */
            CHECK_INT(a.live, 0);
            CHECK_INT(b.live, 1);
        } else {
            fprintf(stderr, "  the kept buffer did not grow (%ld, %ld): the case is not tested\n",
                    kept_a, b.calls);
            CHECK(0);
        }
        attn_ctx_release(&kc);
        CHECK_INT(a.live, 0);
        CHECK_INT(b.live, 0);

        /* And the release alone, after the allocator changed. */
        a = b = (counting){0, 0, 0};
        kc.allocator = (attn_allocator){count_alloc, count_free, &a};
        CHECK_INT(run_mha_packed(&kc, pw), ATTN_OK);
        kc.allocator = (attn_allocator){count_alloc, count_free, &b};
        attn_ctx_release(&kc);
        CHECK_INT(a.live, 0);
        CHECK_INT(b.live, 0);
    }
    attn_mha_packed_free(NULL, pw);
    attn_linear_packed_free(NULL, pl);

    TEST("the backward passes, 16-bit attention, the KV cache and RoPE fail cleanly at "
         "every allocation (two threads), and then give the unconstrained result");
    for (int i = 0; i < B * H * T * D; i++)
        hq[i] = (uint16_t)(0x3c00 + i % 61), hk[i] = (uint16_t)(0x3c00 + i % 47),
        hv[i] = (uint16_t)(0xbc00 + i % 53);
    tu_fill(dout, B * H * T * D, 7);
    {
        attn_ctx plain;
        attn_ctx_init(&plain);
        attn_tensor fq = tu_tensor4(q, B, H, T, D), fk = tu_tensor4(k, B, H, T, D),
                    fv = tu_tensor4(v, B, H, T, D), fo = tu_tensor4(o, B, H, T, D);
        attn_tensor tl = tn(lse, 3, B, H, T);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = 1;
        p.lse = &tl;
        CHECK_INT(attn_sdpa(&plain, &fq, &fk, &fv, &p, &fo, NULL), ATTN_OK);
    }
    for (int i = 0; i < 2; i++) {
        float want[B * H * T * D];
        attn_ctx plain;
        attn_ctx_init(&plain);
        CHECK_INT(run_sdpa_backward(&plain, &impls[i]), ATTN_OK);
        memcpy(want, dq, sizeof dq);
        /* The reference's scratch for this size fits on the stack: no allocation. */
        sweep(i ? "attn_sdpa_backward (default)" : "attn_sdpa_backward (ref)",
              run_sdpa_backward, &impls[i]);
        CHECK(memcmp(want, dq, sizeof dq) == 0);
        uint16_t hwant[B * H * T * D];
        CHECK_INT(run_half_sdpa(&plain, &impls[i]), ATTN_OK);
        memcpy(hwant, ho, sizeof ho);
        sweep(i ? "attn_sdpa bfloat16 (default)" : "attn_sdpa bfloat16 (ref)", run_half_sdpa,
              &impls[i]);
        CHECK(memcmp(hwant, ho, sizeof ho) == 0);
    }
    {
        float want[B * T * E];
        attn_ctx plain;
        attn_ctx_init(&plain);
        CHECK_INT(run_mha_backward(&plain, NULL), ATTN_OK);
        memcpy(want, dx, sizeof dx);
        CHECK(sweep("attn_mha_backward", run_mha_backward, NULL) >= 1);
        CHECK(memcmp(want, dx, sizeof dx) == 0);
    }
    attn_dtype cache_types[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        float want[B * H * T * D];
        attn_ctx plain;
        attn_ctx_init(&plain);
        CHECK_INT(run_kv_cache(&plain, &cache_types[i]), ATTN_OK);
        memcpy(want, o, sizeof o);
        CHECK(sweep(i == 0 ? "KV cache float32" : i == 1 ? "KV cache bfloat16" : "KV cache float16",
                    run_kv_cache, &cache_types[i]) >= 1);
        CHECK(memcmp(want, o, sizeof o) == 0);
    }
    sweep("attn_rope_apply + attn_rope_backward", run_rope, NULL);

    TEST("grouped-query attention and its packing fail cleanly at every allocation");
    CHECK(sweep("attn_gqa_forward", run_gqa, NULL) >= 1);
    CHECK(sweep("attn_gqa_pack", run_gqa_pack, NULL) >= 1);
    {
        attn_gqa_weights g = gqa_weights();
        attn_mha_packed *gp = NULL;
        CHECK_INT(attn_gqa_pack(NULL, &g, H, 1, &gp), ATTN_OK);
        if (gp)
            CHECK(sweep("attn_mha_forward_packed_rope", run_mha_packed_rope, gp) >= 1);
        attn_mha_packed_free(NULL, gp);
    }
    CHECK(sweep("attn_gqa_backward", run_gqa_backward, NULL) >= 1);
    CHECK(sweep("attn_sdpa_fused", run_sdpa_fused, NULL) >= 1);

    TEST("the file readers and the weight loader fail cleanly at every allocation");
    CHECK(sweep("attn_npy_load", run_npy_load, NULL) >= 1);
    CHECK(sweep("attn_safetensors_open+get", run_st_get, NULL) >= 1);
    CHECK(sweep("attn_weights_load", run_weights_load, NULL) >= 1);
    {
        /* The grouped-query names: q_proj [E, E], k_proj and v_proj [D, E], o_proj. */
        attn_gqa_weights g = gqa_weights();
        const attn_tensor gw[4] = {g.w_q, g.w_k, g.w_v, g.w_o};
        const char *gn[4] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                             "o_proj.weight"};
        snprintf(gqa_path, sizeof gqa_path, "%s/oom_gqa_%d.safetensors", ATTN_TEST_TMP_DIR,
                 (int)getpid());
        CHECK_INT(attn_safetensors_save(NULL, gqa_path, gn, gw, 4), ATTN_OK);
        CHECK(sweep("attn_weights_load_gqa", run_weights_load_gqa, NULL) >= 1);
        unlink(gqa_path);
    }
    {
        TEST("an open .safetensors file goes back to the allocator that opened it, "
             "whatever context closes it");
        /* Closed through another context (or none), the handle's memory went to that
         * context's free (b.live -5, a.live 5) or to libc's. */
        for (int closer = 0; closer < 2; closer++) {
            counting a = {0, 0, 0}, b = {0, 0, 0};
            attn_ctx ca, cb;
            attn_ctx_init(&ca);
            attn_ctx_init(&cb);
            ca.allocator = (attn_allocator){count_alloc, count_free, &a};
            cb.allocator = (attn_allocator){count_alloc, count_free, &b};
            attn_safetensors *st = NULL;
            CHECK_INT(attn_safetensors_open(&ca, st_path, &st), ATTN_OK);
            CHECK(a.live > 0);
            attn_safetensors_close(closer == 0 ? &cb : NULL, st);
            CHECK_INT(a.live, 0);
            CHECK_INT(b.live, 0);
            CHECK_INT(b.calls, 0);
        }
    }

    TEST("a writer that runs out of memory leaves no file and no temporary behind");
    unlink(out_path);
    sweep("attn_npy_save", run_npy_save, NULL);
    unlink(out_path);
    counting c = {0, 1, 0};
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.allocator.alloc = count_alloc;
    ctx.allocator.free = count_free;
    ctx.allocator.user = &c;
    CHECK_INT(run_npy_save(&ctx, NULL), ATTN_STATUS_NO_MEMORY);
    CHECK_INT(leftovers(), 0);
    c = (counting){0, 1, 0};
    CHECK_INT(run_st_save(&ctx, NULL), ATTN_STATUS_NO_MEMORY);
    CHECK_INT(leftovers(), 0);
    sweep("attn_safetensors_save", run_st_save, NULL);
    unlink(out_path);
    CHECK(sweep("an output set (create, add, commit)", run_output_set, NULL) >= 1);
    unlink(out_path);
    CHECK_INT(leftovers(), 0);

    unlink(npy_path);
    unlink(st_path);
    unlink(out_path);
    return check_summary("test_oom");
}
