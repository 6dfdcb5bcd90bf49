/*
 * test_threads_signals.c - the pool's workers run with every signal blocked, so a
 * signal sent to the process runs the program's handler on one of the program's own
 * threads, never on a library worker (where a handler that exits or longjmps would
 * stop a thread holding the pool's lock), whatever mask the caller had when the pool
 * started. Linux only: it reads each thread's blocked set (SigBlk) in
 * /proc/self/task/TID/status.
 */
#define _GNU_SOURCE 1
#include "attn.h"
#include "check.h"

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)

/* The blocked-signal bits of thread tid, or 0 when unreadable (-1 in *ok). */
static uint64_t sigblk(const char *tid, int *ok)
{
    char path[320], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%s/status", tid);
    FILE *f = fopen(path, "r");
    uint64_t bits = 0;
    *ok = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "SigBlk:", 7) == 0 && sscanf(line + 7, "%" SCNx64, &bits) == 1)
            *ok = 1;
    fclose(f);
    return bits;
}

static int run_threaded_call(void)
{
    enum { T = 8 * 512, D = 64 }; /* 8 heads of 512 rows: large enough for 3 threads */
    static float q[T * D], o[T * D];
    for (int i = 0; i < T * D; i++)
        q[i] = (float)((i * 7 % 13) - 6) / 8.0f;
    attn_ctx ctx = {0};
    ctx.threads = 3; /* two workers, on any machine */
    attn_tensor tq, to;
    const int64_t shape[4] = {1, 8, T / 8, D};
    if (attn_tensor_init(&ctx, &tq, ATTN_DTYPE_F32, q, 4, shape) != ATTN_OK ||
        attn_tensor_init(&ctx, &to, ATTN_DTYPE_F32, o, 4, shape) != ATTN_OK)
        return -1;
    return attn_sdpa(&ctx, &tq, &tq, &tq, NULL, &to, NULL);
}

int main(void)
{
    TEST("workers started by a thread that blocks nothing block every signal");
    sigset_t none;
    sigemptyset(&none);
    CHECK(pthread_sigmask(SIG_SETMASK, &none, NULL) == 0);
    CHECK_INT(run_threaded_call(), ATTN_OK);

    char self[32];
    snprintf(self, sizeof self, "%ld", (long)getpid());
    const uint64_t want = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1)) |
                          (1ull << (SIGALRM - 1)) | (1ull << (SIGUSR1 - 1)) |
                          (1ull << (SIGCHLD - 1)) | (1ull << (SIGPIPE - 1));
    int workers = 0;
    DIR *dir = opendir("/proc/self/task");
    CHECK(dir != NULL);
    for (struct dirent *e; dir && (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        int ok = 0;
        const uint64_t bits = sigblk(e->d_name, &ok);
        CHECK(ok);
        if (strcmp(e->d_name, self) == 0) {
            CHECK(bits == 0); /* the caller's own mask is given back */
            continue;
        }
        workers++;
        if ((bits & want) != want)
            fprintf(stderr, "thread %s: SigBlk %016" PRIx64 "\n", e->d_name, bits);
        CHECK((bits & want) == want);
    }
    if (dir)
        closedir(dir);
    /* Sanitizers may run threads of their own, which block what they like; the
     * library's two workers are among those counted. */
    CHECK(workers >= 2);
    return check_summary("test_threads_signals");
}

#else

int main(void)
{
    printf("test_threads_signals: skipped, no /proc/self/task on this system\n");
    return 0;
}

#endif
