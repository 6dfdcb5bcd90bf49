/*
 * test_embed_dlopen.c - a program that loads libattn.so with dlopen(), calls it
 * with several threads (so the library's pool starts workers), and unloads it with
 * dlclose(), a few times over: a plug-in host does exactly that. The workers sleep
 * in the library's code between calls; if they outlive dlclose(), each cycle leaves
 * its workers behind, parked in code that is no longer mapped (a crash as soon as
 * anything wakes them). So after every dlclose() the process must be back to the
 * threads it had before the first dlopen(), and every cycle must give the first
 * cycle's bits.
 *
 * Everything of the library is reached through dlsym(): the test links libattn.a
 * as every test does, but calls nothing in it, so no copy of the library but the
 * loaded one runs. ATTN_SHARED_LIB is the path of the built libattn.so
 * (tests/CMakeLists.txt).
 */
#define _GNU_SOURCE
#include "attn.h"
#include "check.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef ATTN_SHARED_LIB
#error "tests/CMakeLists.txt defines ATTN_SHARED_LIB, the path of libattn.so"
#endif

/* Threads of this process now (the entries of /proc/self/task). */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Large enough that four workers are worth waking (attn__threads_for). */
enum { B = 1, H = 4, T = 256, D = 64, N = B * H * T * D, CYCLES = 4 };
static float q[N], k[N], v[N], out[N], first[N];

typedef void (*ctx_init_fn)(attn_ctx *);
typedef void (*tensor_init_fn)(attn_ctx *, attn_tensor *, attn_dtype, void *, int,
                               const int64_t *);
typedef int (*sdpa_fn)(attn_ctx *, const attn_tensor *, const attn_tensor *,
                       const attn_tensor *, const attn_sdpa_params *, attn_tensor *,
                       attn_tensor *);

static void *nothing(void *arg)
{
    return arg;
}

int main(void)
{
    for (int i = 0; i < N; i++) {
        q[i] = (float)(i % 7) * 0.25f - 0.75f;
        k[i] = (float)(i % 5) * 0.25f - 0.5f;
        v[i] = (float)(i % 11) * 0.125f - 0.6f;
    }
    /* ThreadSanitizer starts a thread of its own with the process's second thread:
     * start and join one first, so that `before` counts it. */
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0)
        pthread_join(t, NULL);
    const int before = thread_count();
    if (before < 1) {
        fprintf(stderr, "-- skipped: no /proc/self/task to count threads in\n");
        return 0;
    }
    TEST("dlopen, attn_sdpa with 4 threads, dlclose, 4 times: the same bits each time, "
         "and no thread of the library outlives dlclose");
    for (int c = 0; c < CYCLES; c++) {
        void *lib = dlopen(ATTN_SHARED_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "dlopen(%s): %s\n", ATTN_SHARED_LIB, dlerror());
            CHECK(lib != NULL);
            break;
        }
        /* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
        ctx_init_fn ctx_init;
        tensor_init_fn tensor_init;
        sdpa_fn sdpa;
        *(void **)&ctx_init = dlsym(lib, "attn_ctx_init");
        *(void **)&tensor_init = dlsym(lib, "attn_tensor_init");
        *(void **)&sdpa = dlsym(lib, "attn_sdpa");
        CHECK(ctx_init && tensor_init && sdpa);
        if (!ctx_init || !tensor_init || !sdpa) {
            dlclose(lib);
            break;
        }
        attn_ctx ctx;
        ctx_init(&ctx);
        ctx.threads = 4;
        const int64_t shape[4] = {B, H, T, D};
        attn_tensor tq, tk, tv, to;
        tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, shape);
        tensor_init(NULL, &tk, ATTN_DTYPE_F32, k, 4, shape);
        tensor_init(NULL, &tv, ATTN_DTYPE_F32, v, 4, shape);
        tensor_init(NULL, &to, ATTN_DTYPE_F32, out, 4, shape);
        CHECK_INT(sdpa(&ctx, &tq, &tk, &tv, NULL, &to, NULL), ATTN_OK);
        if (c == 0)
            memcpy(first, out, sizeof out);
        else
            CHECK(memcmp(first, out, sizeof out) == 0);
        const int during = thread_count();
        CHECK(during > before); /* the pool did start workers: the check below can fail */
        CHECK_INT(dlclose(lib), 0);
        const int after = thread_count();
        fprintf(stderr, "   cycle %d: %d threads before dlopen, %d after the call, %d after dlclose\n",
               c, before, during, after);
        CHECK_INT(after, before);
    }
    return check_summary("test_embed_dlopen");
}
