/*
 * test_threads_spin.c - the pool's workers spin for the next job before they
 * sleep (src/runtime/threads.c), for ATTN_SPIN_US microseconds: 100 by default, 0
 * to sleep at once, at most 1,000,000; any other value leaves the default.
 *
 * What is checked is the CPU the process burns while it idles after a threaded
 * call (its CPU time over a 400 ms sleep that starts 50 ms after the call), which tells a bounded spin from one that
 * never ends and a value that is read from one that is not:
 *   - the default and 0: well under 25 ms (a spin of 0.1 ms, or none);
 *   - 300000 (300 ms): the worker spins through most of the window, at least 60 ms
 *     of CPU even on a loaded machine;
 *   - malformed values ("300000x", "+300000", " 300000", "3e5", "1000001", "-1"):
 *     the default, under 25 ms, where reading a prefix or clamping to the maximum
 *     would spin for 300 ms or a second.
 * The limits are wide (the spins differ by three orders of magnitude), so that a
 * busy machine does not decide the outcome.
 *
 * Only a worker that took part in the last job spins: after one job of 8 threads
 * and then one of 2, the 6 workers the second job did not need (woken by its
 * broadcast) go back to sleep at once. They used to spin too, taking the cores
 * from the program's next call. Counted on Linux by the threads whose CPU time
 * (/proc/self/task/N/schedstat) grows by more than 30 ms in the idle window, with
 * ATTN_SPIN_US=300000: one, the second job's worker. Each case is a child of fork() that has
 * not called the pool yet: the variable is read once per process, at the first
 * threaded call. Every job's items must also each run once, in every mode.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "threads.h"

#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { N_ITEMS = 64 };

typedef struct {
    _Atomic int ran[N_ITEMS];
    double out[N_ITEMS];
} job_state;

/* Each item a few tens of microseconds of work, so that the worker joins in. */
static void item_fn(void *arg, int64_t item, int worker)
{
    (void)worker;
    job_state *st = arg;
    double x = (double)item;
    for (int i = 0; i < 20000; i++)
        x = x * 0.999999 + 1e-9;
    st->out[item] = x;
    atomic_fetch_add(&st->ran[item], 1);
}

static double process_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms)
{
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

/* In a child: three threaded jobs (checked), then the CPU time in ms of a 400 ms
 * idle; -1 when an item did not run once. */
static double idle_after_jobs(const char *value)
{
    if (value)
        setenv("ATTN_SPIN_US", value, 1);
    else
        unsetenv("ATTN_SPIN_US");
    static job_state st;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N_ITEMS; i++)
            atomic_store(&st.ran[i], 0);
        attn__parallel_for(2, N_ITEMS, item_fn, &st);
        for (int i = 0; i < N_ITEMS; i++)
            if (atomic_load(&st.ran[i]) != 1) {
                fprintf(stderr, "ATTN_SPIN_US=%s: item %d ran %d times\n",
                        value ? value : "(unset)", i, atomic_load(&st.ran[i]));
                return -1;
            }
    }
    /* A thread's CPU time is brought up to date when it sleeps or at the scheduler's
     * tick: 50 ms first, so that the window below holds none of the items' time. */
    sleep_ms(50);
    const double c0 = process_cpu_ms();
    sleep_ms(400);
    return process_cpu_ms() - c0;
}

/* The CPU time, in ms, of each of this process's threads (by task id, up to n). */
static int thread_cpu_ms(long *tid, double *ms, int n)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)) && k < n) {
        if (e->d_name[0] == '.')
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long long run_ns = 0;
        if (fscanf(f, "%llu", &run_ns) == 1) {
            tid[k] = atol(e->d_name);
            ms[k] = (double)run_ns / 1e6;
            k++;
        }
        fclose(f);
    }
    closedir(d);
    return k;
}

/* In a child: a job of 8 threads, one of 2, then how many threads burn more than
 * 30 ms of CPU in a 400 ms idle (ATTN_SPIN_US=300000). -2 when /proc says nothing. */
static double spinners_after_jobs(const char *unused)
{
    (void)unused;
    setenv("ATTN_SPIN_US", "300000", 1);
    static job_state st;
    attn__parallel_for(8, N_ITEMS, item_fn, &st);
    attn__parallel_for(2, N_ITEMS, item_fn, &st);
    sleep_ms(50);
    enum { MAXT = 64 };
    long t0[MAXT], t1[MAXT];
    double c0[MAXT], c1[MAXT];
    const int n0 = thread_cpu_ms(t0, c0, MAXT);
    sleep_ms(400);
    const int n1 = thread_cpu_ms(t1, c1, MAXT);
    if (n0 <= 0 || n1 <= 0)
        return -2;
    int spinning = 0;
    for (int i = 0; i < n1; i++)
        for (int j = 0; j < n0; j++)
            if (t1[i] == t0[j] && c1[i] - c0[j] > 30.0)
                spinning++;
    return spinning;
}

/* Runs fn(value) in a child of fork() (whose pool has not started) and returns
 * what it returned, or -1 if the child failed. */
static double in_child(double (*fn)(const char *), const char *value)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        const double r = fn(value);
        _exit(write(fd[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    double r = -1;
    if (read(fd[0], &r, sizeof r) != (ssize_t)sizeof r)
        r = -1;
    close(fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    return r;
}

int main(void)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIP: one core: a spinning worker would share it with the sleeper\n");
        return 0;
    }
    struct {
        const char *value;
        int spins_long; /* 1: expect the worker to spin through the idle */
    } cases[] = {
        {NULL, 0},      {"0", 0},        {"100", 0},      {"300000", 1},
        {"300000x", 0}, {"+300000", 0},  {" 300000", 0},  {"3e5", 0},
        {"1000001", 0}, {"-1", 0},       {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double idle = in_child(idle_after_jobs, cases[i].value);
        const char *shown = cases[i].value ? cases[i].value : "(unset)";
        if (idle < 0)
            fprintf(stderr, "ATTN_SPIN_US=\"%s\": the child failed\n", shown);
        CHECK(idle >= 0);
        if (idle < 0)
            continue;
        printf("ATTN_SPIN_US=\"%s\": %.1f ms of CPU over a 400 ms idle\n", shown, idle);
        if (cases[i].spins_long)
            CHECK(idle >= 60.0); /* the worker spins through the idle */
        else
            CHECK(idle < 25.0); /* no long spin */
    }
    const double n = in_child(spinners_after_jobs, NULL);
    if (n == -2) {
        printf("SKIP: no /proc/self/task/N/schedstat: the spinners are not counted\n");
    } else {
        printf("after jobs of 8 and 2 threads, %.0f thread(s) spin through the idle\n", n);
        CHECK(n == 1);
    }
    return check_summary("test_threads_spin");
}
