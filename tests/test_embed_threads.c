/*
 * test_embed_threads.c - a program that embeds attn calls it from several threads of
 * its own at once, as attn.h allows: one context per thread, inputs, packed weights
 * and a KV cache being attended shared between threads, each thread's errors in its
 * own context; and the calls that share nothing (the backward passes, the unpacked
 * multi-head forward, a KV cache of each thread's own) at the same time.
 *
 * Every thread computes what the main thread computed alone first, with one worker,
 * and must get the same bits (attn.h: results never depend on the thread count).
 * The threads ask for two workers each, so they also meet the library's pool while
 * another caller holds it (src/runtime/threads.c: the second caller then runs its
 * items itself). .ci/run runs this test under ThreadSanitizer.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define N_THREADS 4
#define ROUNDS (CHECK_SANITIZED ? 2 : 6)

/* The problem every thread solves. Large enough that two workers are worth
 * waking (more than 2e6 floating-point operations per call). */
enum { B = 1, H = 4, HKV = 2, T = 113, D = 32, E = 32, TX = 17, NH = 4 };
enum { SEQS = 2, CAP = 128, LEN0 = 113, LEN1 = 40 };

static float q[B * H * T * D], k[B * HKV * T * D], v[B * HKV * T * D];
static float x[2 * TX * E], wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E];
static float qdec[SEQS * H * 1 * D];
static attn_mha_packed *packed;   /* shared by every thread, read only */
static attn_linear_packed *lin;   /* W_o packed alone, shared the same way */
static attn_kv_cache *cache;      /* shared by every thread, attended only */

/* What the main thread computed alone, with one worker. */
static float want_sdpa[B * H * T * D], want_weights[B * H * T * T];
static float want_mha[2 * TX * E], want_dec[SEQS * H * 1 * D], want_lin[2 * TX * E];

/* The gradients and the calls that take no packed or shared state: the backward of
 * attn_sdpa (from the forward's lse), attn_mha_forward and attn_mha_backward on the
 * unpacked weights, and a KV cache of each thread's own (create, append with RoPE,
 * attend, free). */
static float lse[B * H * T], dout[B * H * T * D];
static float want_dq[B * H * T * D], want_dk[B * HKV * T * D], want_dv[B * HKV * T * D];
static float want_mhau[2 * TX * E], want_dx[2 * TX * E], want_dwqkv[3 * E * E];
static float want_own[B * H * T * D];

typedef struct worker {
    int id;
    int calls_failed;           /* calls that should have succeeded and did not */
    char first_error[ATTN_MESSAGE_SIZE + 64];
    long long bits_differ;      /* output elements that differ from the main thread's */
    char first_diff[160];
    int own_message_ok;         /* the bad call's message names this thread's shape */
    char own_message[ATTN_MESSAGE_SIZE + 32];
    char own_shape[64];
} worker;

static void compare(worker *w, const char *what, const float *got, const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            if (w->bits_differ++ == 0)
                snprintf(w->first_diff, sizeof w->first_diff,
                         "%s[%lld]: thread %d got %.9g, alone %.9g", what, (long long)i, w->id,
                         (double)got[i], (double)want[i]);
        }
}

static void failed(worker *w, const attn_ctx *ctx, const char *what)
{
    if (w->calls_failed++ == 0)
        snprintf(w->first_error, sizeof w->first_error, "%s: %s", what,
                 ctx ? ctx->message : "(no context)");
}

static int sdpa_call(attn_ctx *ctx, float *out, float *weights)
{
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, HKV, T, D),
                tv = tu_tensor4(v, B, HKV, T, D), to = tu_tensor4(out, B, H, T, D),
                tw = tu_tensor4(weights ? weights : out, B, H, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    return attn_sdpa(ctx, &tq, &tk, &tv, &p, &to, weights ? &tw : NULL);
}

static int mha_call(attn_ctx *ctx, float *out)
{
    attn_tensor tx = tu_tensor3(x, 2, TX, E), to = tu_tensor3(out, 2, TX, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    return attn_mha_forward_packed(ctx, packed, NH, &tx, &p, &to, NULL);
}

static int linear_call(attn_ctx *ctx, float *y)
{
    attn_tensor tx = tu_tensor3(x, 2, TX, E), ty = tu_tensor3(y, 2, TX, E);
    return attn_linear_forward_packed(ctx, &tx, lin, &ty);
}

static int decode_call(attn_ctx *ctx, float *out)
{
    attn_tensor tq = tu_tensor4(qdec, SEQS, H, 1, D), to = tu_tensor4(out, SEQS, H, 1, D);
    return attn_kv_cache_attend(ctx, cache, 0, &tq, NULL, NULL, &to, NULL);
}

static attn_tensor tn(float *data, int ndim, int64_t a, int64_t b, int64_t c)
{
    attn_tensor t;
    const int64_t shape[3] = {a, b, c};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, ndim, shape);
    return t;
}

static int backward_call(attn_ctx *ctx, float *dq, float *dk, float *dv)
{
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, HKV, T, D),
                tv = tu_tensor4(v, B, HKV, T, D), to = tu_tensor4(want_sdpa, B, H, T, D),
                tl = tn(lse, 3, B, H, T), tdo = tu_tensor4(dout, B, H, T, D),
                tdq = tu_tensor4(dq, B, H, T, D), tdk = tu_tensor4(dk, B, HKV, T, D),
                tdv = tu_tensor4(dv, B, HKV, T, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, NULL};
    return attn_sdpa_backward(ctx, &tq, &tk, &tv, &p, &to, &tl, &tdo, &g);
}

static int mha_unpacked_call(attn_ctx *ctx, float *out)
{
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, 2, TX, E), to = tu_tensor3(out, 2, TX, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    return attn_mha_forward(ctx, &mw, NH, &tx, &p, &to, NULL);
}

/* The gradients of attn_mha_forward with dout = x; dx and dW_qkv are compared. */
static int mha_backward_call(attn_ctx *ctx, float *dx, float *dwqkv, float *rest)
{
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, 2, TX, E), tdx = tu_tensor3(dx, 2, TX, E),
                tdw = tn(dwqkv, 2, 3 * E, E, 1), tdb = tn(rest, 1, 3 * E, 1, 1),
                tdwo = tn(rest + 3 * E, 2, E, E, 1), tdbo = tn(rest + 3 * E + E * E, 1, E, 1, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    attn_mha_grads g = {&tdx, &tdw, &tdb, &tdwo, &tdbo};
    return attn_mha_backward(ctx, &mw, NH, &tx, &p, &tx, &g);
}

/* A cache of the caller's own: k and v appended with RoPE, q attended, freed. */
static int own_cache_call(attn_ctx *ctx, float *out)
{
    attn_kv_cache_config cfg = {B, HKV, CAP, D, 0, ATTN_DTYPE_F32};
    attn_kv_cache *own = NULL;
    int rc = attn_kv_cache_create(ctx, &cfg, NULL, 0, &own);
    if (rc)
        return rc;
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    attn_tensor tk = tu_tensor4(k, B, HKV, T, D), tv = tu_tensor4(v, B, HKV, T, D),
                tq = tu_tensor4(q, B, H, T, D), to = tu_tensor4(out, B, H, T, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    rc = attn_kv_cache_append(ctx, own, 0, &tk, &tv, &rope);
    if (!rc)
        rc = attn_kv_cache_attend(ctx, own, 0, &tq, &p, &rope, out ? &to : NULL, NULL);
    attn_kv_cache_free(ctx, own);
    return rc;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    /* Heap buffers: a thread's stack may be small in an embedding program. */
    float *out = malloc(sizeof want_sdpa), *weights = malloc(sizeof want_weights);
    float *mha = malloc(sizeof want_mha), *dec = malloc(sizeof want_dec);
    float *y = malloc(sizeof want_lin);
    float *dq = malloc(sizeof want_dq), *dk = malloc(sizeof want_dk), *dv = malloc(sizeof want_dv);
    float *dx = malloc(sizeof want_dx), *dw = malloc(sizeof want_dwqkv);
    float *rest = malloc((3 * E + E * E + E) * sizeof(float));
    if (!out || !weights || !mha || !dec || !y || !dq || !dk || !dv || !dx || !dw || !rest) {
        w->calls_failed++;
        snprintf(w->first_error, sizeof w->first_error, "malloc failed");
        goto done;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    ctx.keep_workspace = w->id & 1; /* half keep scratch, half allocate per call */
    for (int r = 0; r < ROUNDS; r++) {
        memset(out, 0xff, sizeof want_sdpa);
        memset(weights, 0xff, sizeof want_weights);
        /* Threads 0 and 2 pass no context at all, as a program may, at once. */
        if (sdpa_call(w->id % 2 == 0 ? NULL : &ctx, out, weights) != ATTN_OK)
            failed(w, w->id % 2 == 0 ? NULL : &ctx, "attn_sdpa");
        compare(w, "sdpa out", out, want_sdpa, B * H * T * D);
        compare(w, "sdpa weights", weights, want_weights, B * H * T * T);
        memset(out, 0xff, sizeof want_sdpa);
        if (sdpa_call(&ctx, out, NULL) != ATTN_OK)
            failed(w, &ctx, "attn_sdpa without weights");
        compare(w, "sdpa out (no weights)", out, want_sdpa, B * H * T * D);
        memset(mha, 0xff, sizeof want_mha);
        if (mha_call(&ctx, mha) != ATTN_OK)
            failed(w, &ctx, "attn_mha_forward_packed");
        compare(w, "mha out", mha, want_mha, 2 * TX * E);
        memset(y, 0xff, sizeof want_lin);
        if (linear_call(&ctx, y) != ATTN_OK)
            failed(w, &ctx, "attn_linear_forward_packed");
        compare(w, "linear y", y, want_lin, 2 * TX * E);
        memset(dec, 0xff, sizeof want_dec);
        if (decode_call(&ctx, dec) != ATTN_OK)
            failed(w, &ctx, "attn_kv_cache_attend");
        compare(w, "decode out", dec, want_dec, SEQS * H * 1 * D);
        memset(dq, 0xff, sizeof want_dq);
        memset(dk, 0xff, sizeof want_dk);
        memset(dv, 0xff, sizeof want_dv);
        if (backward_call(&ctx, dq, dk, dv) != ATTN_OK)
            failed(w, &ctx, "attn_sdpa_backward");
        compare(w, "sdpa dq", dq, want_dq, B * H * T * D);
        compare(w, "sdpa dk", dk, want_dk, B * HKV * T * D);
        compare(w, "sdpa dv", dv, want_dv, B * HKV * T * D);
        memset(mha, 0xff, sizeof want_mha);
        if (mha_unpacked_call(&ctx, mha) != ATTN_OK)
            failed(w, &ctx, "attn_mha_forward");
        compare(w, "mha (unpacked) out", mha, want_mhau, 2 * TX * E);
        memset(dx, 0xff, sizeof want_dx);
        memset(dw, 0xff, sizeof want_dwqkv);
        if (mha_backward_call(&ctx, dx, dw, rest) != ATTN_OK)
            failed(w, &ctx, "attn_mha_backward");
        compare(w, "mha dx", dx, want_dx, 2 * TX * E);
        compare(w, "mha dW_qkv", dw, want_dwqkv, 3 * E * E);
        memset(out, 0xff, sizeof want_own);
        if (own_cache_call(&ctx, out) != ATTN_OK)
            failed(w, &ctx, "a KV cache of the thread's own");
        compare(w, "own cache out", out, want_own, B * H * T * D);

        /* A bad call of this thread's own: out with 5 + id query rows. Its message,
         * in this thread's context, names that shape and no other thread's. */
        attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, HKV, T, D),
                    tv = tu_tensor4(v, B, HKV, T, D), to = tu_tensor4(out, B, H, 5 + w->id, D);
        int rc = attn_sdpa(&ctx, &tq, &tk, &tv, NULL, &to, NULL);
        attn_shape_format(w->own_shape, sizeof w->own_shape, 4, to.shape);
        w->own_message_ok = rc == ATTN_STATUS_SHAPE_MISMATCH && ctx.status == rc &&
                            strstr(ctx.message, w->own_shape) != NULL;
        snprintf(w->own_message, sizeof w->own_message, "%s (%s)", ctx.message,
                 attn_status_name(rc));
        if (!w->own_message_ok)
            break;
    }
    attn_ctx_release(&ctx);
done:
    free(out);
    free(weights);
    free(mha);
    free(dec);
    free(y);
    free(dq);
    free(dk);
    free(dv);
    free(dx);
    free(dw);
    free(rest);
    return NULL;
}

/* Builds the shared inputs and the answers of one thread alone. */
static int setup(void)
{
    tu_fill(q, B * H * T * D, 1);
    tu_fill(k, B * HKV * T * D, 2);
    tu_fill(v, B * HKV * T * D, 3);
    tu_fill(x, 2 * TX * E, 4);
    tu_fill(wqkv, 3 * E * E, 5);
    tu_fill(bqkv, 3 * E, 6);
    tu_fill(wo, E * E, 7);
    tu_fill(bo, E, 8);
    tu_fill(qdec, SEQS * H * D, 9);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 1;
    attn_mha_weights w = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    int rc = attn_mha_pack(&ctx, &w, &packed);
    if (!rc)
        rc = attn_linear_pack(&ctx, &w.w_o, &w.b_o, &lin);
    attn_kv_cache_config cfg = {SEQS, HKV, CAP, D, 0, ATTN_DTYPE_F32};
    if (!rc)
        rc = attn_kv_cache_create(&ctx, &cfg, NULL, 0, &cache);
    /* Sequence 0 holds k and v whole, sequence 1 their first LEN1 positions. */
    attn_tensor tk = tu_tensor4(k, 1, HKV, T, D), tv = tu_tensor4(v, 1, HKV, T, D), k1, v1;
    if (!rc)
        rc = attn_kv_cache_append(&ctx, cache, 0, &tk, &tv, NULL);
    if (!rc)
        rc = attn_tensor_narrow(&ctx, &tk, 2, 0, LEN1, &k1);
    if (!rc)
        rc = attn_tensor_narrow(&ctx, &tv, 2, 0, LEN1, &v1);
    if (!rc)
        rc = attn_kv_cache_append(&ctx, cache, 1, &k1, &v1, NULL);
    tu_fill(dout, B * H * T * D, 10);
    if (!rc) {
        attn_tensor tq = tu_tensor4(q, B, H, T, D), tk2 = tu_tensor4(k, B, HKV, T, D),
                    tv2 = tu_tensor4(v, B, HKV, T, D), to = tu_tensor4(want_sdpa, B, H, T, D),
                    tl = tn(lse, 3, B, H, T);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_TOP_LEFT;
        p.lse = &tl;
        rc = attn_sdpa(&ctx, &tq, &tk2, &tv2, &p, &to, NULL);
    }
    float *rest = malloc((3 * E + E * E + E) * sizeof(float));
    if (!rc && !rest)
        rc = ATTN_STATUS_NO_MEMORY;
    if (!rc)
        rc = backward_call(&ctx, want_dq, want_dk, want_dv);
    if (!rc)
        rc = mha_unpacked_call(&ctx, want_mhau);
    if (!rc)
        rc = mha_backward_call(&ctx, want_dx, want_dwqkv, rest);
    if (!rc)
        rc = own_cache_call(&ctx, want_own);
    free(rest);
    if (!rc)
        rc = sdpa_call(&ctx, want_sdpa, want_weights);
    if (!rc)
        rc = mha_call(&ctx, want_mha);
    if (!rc)
        rc = decode_call(&ctx, want_dec);
    if (!rc)
        rc = linear_call(&ctx, want_lin);
    if (rc)
        fprintf(stderr, "setup failed: %s (%s)\n", ctx.message, attn_status_name(rc));
    attn_ctx_release(&ctx);
    return rc;
}

int main(void)
{
    TEST("four threads of a program calling attn_sdpa, attn_mha_forward_packed and "
         "attn_linear_forward_packed (weights packed once, shared), attn_kv_cache_attend "
         "(one cache, shared), attn_sdpa_backward, attn_mha_forward, attn_mha_backward and "
         "a KV cache of their own (append with RoPE, attend) at once, each "
         "with its own context asking for two workers, get the bits one thread gets alone");
    CHECK_INT(setup(), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(cache, 0), LEN0);
    CHECK_INT(attn_kv_cache_length(cache, 1), LEN1);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    int started[N_THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < N_THREADS; i++) {
        w[i].id = i;
        started[i] = pthread_create(&th[i], NULL, worker_main, &w[i]) == 0;
        CHECK_INT(started[i], 1);
    }
    for (int i = 0; i < N_THREADS; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        CHECK_INT(w[i].calls_failed, 0);
        if (w[i].calls_failed)
            fprintf(stderr, "   thread %d: %s\n", i, w[i].first_error);
        CHECK_INT(w[i].bits_differ, 0);
        if (w[i].bits_differ)
            fprintf(stderr, "   first difference: %s\n", w[i].first_diff);
    }

    TEST("an error in one thread's context names that thread's call: four threads failing "
         "at once with different shapes each read their own shape in ctx.message");
    for (int i = 0; i < N_THREADS; i++) {
        CHECK_INT(w[i].own_message_ok, 1);
        if (!w[i].own_message_ok)
            fprintf(stderr, "   thread %d: message \"%s\", its shape %s\n", i, w[i].own_message,
                    w[i].own_shape);
    }
    attn_kv_cache_free(NULL, cache);
    attn_mha_packed_free(NULL, packed);
    attn_linear_packed_free(NULL, lin);
    return check_summary("test_embed_threads");
}
