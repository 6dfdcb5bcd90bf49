/*
 * test_embed_stack.c - a program's own thread with a small stack calls attn. Threads
 * of an embedding program often get 64 KiB or less (an event loop's workers, musl's
 * default of 128 KiB, a coroutine's stack); attn's calls take their large scratch
 * from the heap or the caller's workspace and keep each frame to a few KiB, so every
 * entry point below must run on a 64 KiB stack. A frame that outgrows it is a
 * crash (SIGSEGV on the guard page), not an error status, so the test runs the calls
 * in a child process and checks that it exits normally.
 *
 * Sanitizers enlarge every frame (redzones), so sanitized builds give the thread
 * 512 KiB: the plain build is the one that holds the 64 KiB line.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STACK_BYTES (CHECK_SANITIZED ? 512 * 1024 : 64 * 1024)

enum { B = 1, H = 4, T = 64, D = 32, N = B * H * T * D, E = 32, TX = 24 };
static float q[N], k[N], v[N], o[N], lse[B * H * T], dq[N], dk[N], dv[N];
static float x[2 * TX * E], y[2 * TX * E], wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E];
static uint16_t h16[4 * N];
static char npy_path[600], st_path[600];

typedef struct result {
    int failed;      /* calls that did not return ATTN_OK */
    char what[800];  /* the first one and its message */
} result;

static void note(result *r, int rc, const attn_ctx *ctx, const char *what)
{
    if (rc != ATTN_OK && r->failed++ == 0)
        snprintf(r->what, sizeof r->what, "%s: %s: %s", what, attn_status_name(rc),
                 ctx->message);
}

/* Every kind of call once, each on its own context. */
static void *calls(void *arg)
{
    result *r = arg;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 1;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D), tl;
    const int64_t ls[3] = {B, H, T};
    attn_tensor_init(NULL, &tl, ATTN_DTYPE_F32, lse, 3, ls);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    p.lse = &tl;
    note(r, attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), &ctx, "attn_sdpa");
    note(r, attn_sdpa_ref(&ctx, &tq, &tk, &tv, &p, &to, NULL), &ctx, "attn_sdpa_ref");
    p.lse = NULL;
    attn_tensor tdq = tu_tensor4(dq, B, H, T, D), tdk = tu_tensor4(dk, B, H, T, D),
                tdv = tu_tensor4(dv, B, H, T, D);
    attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, NULL};
    note(r, attn_sdpa_backward(&ctx, &tq, &tk, &tv, &p, &to, &tl, &to, &g), &ctx,
         "attn_sdpa_backward");

    attn_mha_weights w = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, 2, TX, E), ty = tu_tensor3(y, 2, TX, E);
    note(r, attn_mha_forward(&ctx, &w, 4, &tx, &p, &ty, NULL), &ctx, "attn_mha_forward");

    attn_tensor hq = tq, hk = tk, hv = tv, ho = to;
    hq.data = h16, hk.data = h16 + N, hv.data = h16 + 2 * N, ho.data = h16 + 3 * N;
    hq.dtype = hk.dtype = hv.dtype = ho.dtype = ATTN_DTYPE_BF16;
    note(r, attn_sdpa(&ctx, &hq, &hk, &hv, &p, &ho, NULL), &ctx, "attn_sdpa bfloat16");

    attn_kv_cache_config cfg = {B, H, 2 * T, D, 0, ATTN_DTYPE_BF16};
    attn_kv_cache *cache = NULL;
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    int rc = attn_kv_cache_create(&ctx, &cfg, NULL, 0, &cache);
    note(r, rc, &ctx, "attn_kv_cache_create");
    if (rc == ATTN_OK) {
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        note(r, attn_kv_cache_append(&ctx, cache, 0, &tk, &tv, &rope), &ctx,
             "attn_kv_cache_append");
        note(r, attn_kv_cache_attend(&ctx, cache, 0, &tq, &p, &rope, &to, NULL), &ctx,
             "attn_kv_cache_attend");
        attn_kv_cache_free(&ctx, cache);
    }

    /* Every other feature of q: a strided view, which the writers copy element by
     * element through a staging buffer. */
    attn_tensor half = tq;
    half.shape[3] = D / 2;
    half.stride[3] = 2;
    note(r, attn_npy_save(&ctx, npy_path, &half), &ctx, "attn_npy_save (strided)");
    const char *names[1] = {"q"};
    note(r, attn_safetensors_save(&ctx, st_path, names, &half, 1), &ctx,
         "attn_safetensors_save (strided)");
    attn_array a;
    rc = attn_npy_load(&ctx, npy_path, &a);
    note(r, rc, &ctx, "attn_npy_load");
    if (rc == ATTN_OK)
        attn_array_free(&ctx, &a);
    attn_ctx_release(&ctx);
    return NULL;
}

int main(void)
{
    TEST("every kind of call (attention, reference, backward, multi-head, bfloat16, a "
         "KV cache with RoPE, writing and reading strided .npy and .safetensors) runs on "
         "a thread of the program's own with a 64 KiB stack");
    snprintf(npy_path, sizeof npy_path, "%s/embed_stack.npy", ATTN_TEST_TMP_DIR);
    snprintf(st_path, sizeof st_path, "%s/embed_stack.safetensors", ATTN_TEST_TMP_DIR);
    tu_fill(q, N, 1);
    tu_fill(k, N, 2);
    tu_fill(v, N, 3);
    tu_fill(x, 2 * TX * E, 4);
    tu_fill(wqkv, 3 * E * E, 5);
    tu_fill(bqkv, 3 * E, 6);
    tu_fill(wo, E * E, 7);
    tu_fill(bo, E, 8);
    for (int i = 0; i < 4 * N; i++)
        h16[i] = (uint16_t)(0x3c00 + i % 97);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        result r;
        memset(&r, 0, sizeof r);
        pthread_attr_t attr;
        pthread_t t;
        if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, STACK_BYTES) != 0 ||
            pthread_create(&t, &attr, calls, &r) != 0)
            _exit(2);
        pthread_join(t, NULL);
        if (r.failed)
            fprintf(stderr, "   %d calls failed; the first: %s\n", r.failed, r.what);
        _exit(r.failed ? 1 : 0);
    }
    CHECK(pid > 0);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        fprintf(stderr, "   the thread's calls ended with signal %d (a stack overflow "
                "is SIGSEGV, 11)\n", WTERMSIG(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(npy_path);
    unlink(st_path);
    return check_summary("test_embed_stack");
}
