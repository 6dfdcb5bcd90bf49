/*
 * test_threads_affinity.c - the default thread count (ctx->threads = 0) is the number
 * of cores this process may run on: the online cores, or fewer under a CPU affinity
 * (taskset, a container's cpuset). A process pinned to one core of a two-core machine
 * used to start two workers there, which share the core and wait on each other at
 * every call's end.
 *
 * The count is taken once per process, at the first call that asks, so each case runs
 * in a child of fork() that has not asked yet: one child as it is, one pinned to the
 * first core of its mask before its first call. On a machine whose process may use
 * only one core both children expect 1, and the pinned case cannot tell the fix from
 * the old count; CI's machines have two.
 */
#define _GNU_SOURCE 1
#include "attn.h"
#include "check.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__linux__) && defined(CPU_COUNT)

static int expected_for(const cpu_set_t *set)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    long allowed = CPU_COUNT(set);
    if (allowed >= 1 && (n < 1 || allowed < n))
        n = allowed;
    return n < 1 ? 1 : (int)n;
}

/* In a child: the default count against want (capped as the pool caps it: the
 * library never reports more than an explicit count of that size resolves to). */
static int child_checks(int want)
{
    attn_ctx big = {0};
    big.threads = 1 << 20;
    const int cap = attn_threads_resolve(&big);
    if (want > cap)
        want = cap;
    attn_ctx ctx = {0};
    const int online = attn_threads_online(), resolved = attn_threads_resolve(&ctx);
    ctx.threads = 3;
    const int three = attn_threads_resolve(&ctx);
    if (online != want || resolved != want || attn_threads_resolve(NULL) != want ||
        three != (cap < 3 ? cap : 3)) {
        fprintf(stderr, "default threads %d (resolved %d), expected %d; threads = 3 gave %d\n",
                online, resolved, want, three);
        return 1;
    }
    /* A call with the default count still runs and gives a number. */
    enum { T = 40, D = 16 };
    static float q[T * D], o[T * D];
    for (int i = 0; i < T * D; i++)
        q[i] = (float)((i * 7 % 13) - 6) / 8.0f;
    attn_ctx run = {0};
    attn_tensor tq, to;
    const int64_t shape[4] = {1, 1, T, D};
    if (attn_tensor_init(&run, &tq, ATTN_DTYPE_F32, q, 4, shape) != ATTN_OK ||
        attn_tensor_init(&run, &to, ATTN_DTYPE_F32, o, 4, shape) != ATTN_OK)
        return 1;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    if (attn_sdpa(&run, &tq, &tq, &tq, &p, &to, NULL) != ATTN_OK) {
        fprintf(stderr, "attn_sdpa: %s\n", run.message);
        return 1;
    }
    return o[0] == q[0] ? 0 : 1; /* row 0 sees only key 0: its value row, exactly */
}

static int run_child(int pin)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof set, &set) != 0)
            _exit(3);
        if (pin) {
            int first = 0;
            while (!CPU_ISSET(first, &set))
                first++;
            CPU_ZERO(&set);
            CPU_SET(first, &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0)
                _exit(3);
        }
        _exit(child_checks(pin ? 1 : expected_for(&set)));
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

int main(void)
{
    CHECK_INT(run_child(0), 0);
    CHECK_INT(run_child(1), 0);
    return check_summary("test_threads_affinity");
}

#else

int main(void)
{
    printf("test_threads_affinity: skipped, no sched_getaffinity on this system\n");
    return 0;
}

#endif
