/*
 * test_embed_cancel.c - a program cancels (pthread_cancel) one of its threads while
 * that thread is inside a threaded attn call. POSIX lets a cancelled thread stop at
 * any cancellation point, and pthread_cond_wait is one: a call that waited there for
 * the pool's workers ended with the pool's lock held and the pool marked busy, its
 * job (on the dead thread's stack) still in the workers' hands, and every later
 * threaded call of the process waited for that lock forever. A call must finish
 * whole (the cancellation then takes effect at the thread's next cancellation point
 * outside attn), and the process's later calls must run.
 *
 * Everything runs in a child process under alarm(), so a hang fails the test
 * instead of stalling it.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Large enough that four workers are woken (attn__threads_for). */
enum { B = 1, H = 8, T = 256, D = 64, N = B * H * T * D, ROUNDS = 12 };
static float q[N], k[N], v[N], want[N];

static int call(int threads, float *out)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = threads;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(out, B, H, T, D);
    return attn_sdpa(&ctx, &tq, &tk, &tv, NULL, &to, NULL);
}

/* Calls attn over and over; the only cancellation point outside attn is the
 * explicit one between calls. */
static void *caller(void *arg)
{
    float *out = arg;
    for (;;) {
        call(4, out);
        pthread_testcancel();
    }
    return NULL;
}

/* The child's work: ROUNDS threads cancelled at varied moments, each followed by a
 * threaded call of the main thread, which must give the bits of a lone call. */
static int child(void)
{
    float *out = malloc(sizeof want), *mine = malloc(sizeof want);
    if (!out || !mine)
        return 2;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_t t;
        if (pthread_create(&t, NULL, caller, out) != 0)
            return 2;
        struct timespec ts = {0, 1000000L + 700000L * r};
        nanosleep(&ts, NULL);
        pthread_cancel(t);
        pthread_join(t, NULL);
        memset(mine, 0xff, sizeof want);
        if (call(2, mine) != ATTN_OK || memcmp(mine, want, sizeof want) != 0)
            return 3;
    }
    free(out);
    free(mine);
    return 0;
}

int main(void)
{
    TEST("a thread cancelled inside a threaded attn_sdpa leaves the pool usable: the "
         "next calls of the process finish with the same bits (12 rounds)");
    tu_fill(q, N, 1);
    tu_fill(k, N, 2);
    tu_fill(v, N, 3);
    CHECK_INT(call(1, want), ATTN_OK);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(CHECK_SANITIZED ? 120 : 15); /* a hang ends the child with SIGALRM */
        _exit(child());
    }
    CHECK(pid > 0);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        fprintf(stderr, "   the child ended with signal %d (SIGALRM, 14: a call waited "
                "forever)\n", WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "   the child exited %d (3: a call failed or gave other bits)\n",
                WEXITSTATUS(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return check_summary("test_embed_cancel");
}
