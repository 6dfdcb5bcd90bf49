/*
 * test_output_threads.c - every writer from 8 threads at once, each thread with its
 * own context, as include/attn.h allows: attn_npy_save, attn_safetensors_save and
 * output sets of several files, to each thread's own targets and to targets all
 * threads share. The shared targets must end up whole (each thread writes the same
 * bytes, so the result must equal them exactly), no temporary file may be left, and
 * under ThreadSanitizer (.ci/run's TSan step runs this test) no data race may be
 * reported: the writer keeps no shared mutable state but its lock-free table of
 * live temporary files.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "io_test_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { THREADS = 8, ROUNDS = 12 };

static float data[4 * 64];

typedef struct job {
    int id;
    int failures;
    char message[ATTN_MESSAGE_SIZE + 64];
} job;

/* "<tmp>/test_output_threads_<name>" in the caller's buffer: io_tmp's rotating
 * buffers are shared, and threads must not share them. */
static const char *at(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/test_output_threads_%s", ATTN_TEST_TMP_DIR, name);
    return buf;
}

static void note(job *j, const attn_ctx *ctx, int rc)
{
    if (rc != ATTN_OK && j->failures++ == 0)
        snprintf(j->message, sizeof j->message, "%s: %s", attn_status_name(rc), ctx->message);
}

static void *worker(void *arg)
{
    job *j = arg;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor t;
    const int64_t shape[2] = {4, 64};
    attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 2, shape);
    const char *names[2] = {"first", "second"};
    const attn_tensor pair[2] = {t, t};
    char own[256], own_st[256], p[1024];
    snprintf(own, sizeof own, "thread%d.npy", j->id);
    snprintf(own_st, sizeof own_st, "thread%d.safetensors", j->id);
    for (int r = 0; r < ROUNDS; r++) {
        note(j, &ctx, attn_npy_save(&ctx, at(p, sizeof p, own), &t));
        note(j, &ctx, attn_npy_save(&ctx, at(p, sizeof p, "shared.npy"), &t));
        note(j, &ctx, attn_safetensors_save(&ctx, at(p, sizeof p, own_st), names,
                                            pair, 2));
        note(j, &ctx, attn_safetensors_save(&ctx,
                                            at(p, sizeof p, "shared.safetensors"),
                                            names, pair, 2));
        attn_output_set *s = NULL;
        int rc = attn_output_set_create(&ctx, &s);
        if (!rc)
            rc = attn_output_set_add_npy(&ctx, s, at(p, sizeof p, "set_a.npy"), &t);
        if (!rc)
            rc = attn_output_set_add_bytes(&ctx, s, at(p, sizeof p, "set_b.txt"),
                                           "same bytes\n", 11);
        if (!rc)
            rc = attn_output_set_commit(&ctx, s);
        attn_output_set_free(&ctx, s);
        note(j, &ctx, rc);
    }
    return NULL;
}

/* 1 when the file at path holds exactly the n bytes at want. */
static int same_bytes(const char *path, const unsigned char *want, size_t n)
{
    size_t got_n;
    unsigned char *got = io_read(path, &got_n);
    int same = got && got_n == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

int main(void)
{
    TEST("8 threads, each with its own context, saving .npy, .safetensors and output "
         "sets to their own and to shared targets at once all succeed, leave every "
         "shared file whole and no temporary file");
    for (int i = 0; i < 4 * 64; i++)
        data[i] = (float)i * 0.25f - 3.0f;
    pthread_t th[THREADS];
    job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].id = i;
        CHECK_INT(pthread_create(&th[i], NULL, worker, &jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(jobs[i].failures, 0);
        if (jobs[i].failures)
            fprintf(stderr, "   thread %d: %s\n", i, jobs[i].message);
    }

    /* What one thread alone writes is what every shared file must hold. */
    attn_tensor t;
    const int64_t shape[2] = {4, 64};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, 2, shape);
    const char *names[2] = {"first", "second"};
    const attn_tensor pair[2] = {t, t};
    CHECK_INT(attn_npy_save(NULL, io_tmp("test_output_threads", "alone.npy"), &t), ATTN_OK);
    CHECK_INT(attn_safetensors_save(NULL, io_tmp("test_output_threads", "alone.safetensors"),
                                    names, pair, 2),
              ATTN_OK);
    size_t n_npy, n_st;
    unsigned char *npy = io_read(io_tmp("test_output_threads", "alone.npy"), &n_npy);
    unsigned char *st = io_read(io_tmp("test_output_threads", "alone.safetensors"), &n_st);
    CHECK(npy != NULL && st != NULL);
    if (npy && st) {
        CHECK(same_bytes(io_tmp("test_output_threads", "shared.npy"), npy, n_npy));
        CHECK(same_bytes(io_tmp("test_output_threads", "set_a.npy"), npy, n_npy));
        CHECK(same_bytes(io_tmp("test_output_threads", "shared.safetensors"), st, n_st));
        CHECK(same_bytes(io_tmp("test_output_threads", "set_b.txt"),
                         (const unsigned char *)"same bytes\n", 11));
        for (int i = 0; i < THREADS; i++) {
            char own[64];
            snprintf(own, sizeof own, "thread%d.npy", i);
            CHECK(same_bytes(io_tmp("test_output_threads", own), npy, n_npy));
            snprintf(own, sizeof own, "thread%d.safetensors", i);
            CHECK(same_bytes(io_tmp("test_output_threads", own), st, n_st));
        }
    }
    free(npy);
    free(st);
    CHECK(io_no_temp_files("test_output_threads"));
    return check_summary("test_output_threads");
}
