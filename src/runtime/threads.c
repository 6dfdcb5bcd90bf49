/*
 * threads.c - a small pthread pool of our own for the fast kernels.
 *
 * Workers are created on first use (as many as the largest call has asked for,
 * at most ATTN_POOL_MAX) and then wait between calls, so a call pays a wake-up,
 * not a thread creation. A worker that finishes a job first spins for the next
 * one for a while (ATTN_SPIN_US, 100 microseconds by default), and the caller
 * spins for its workers' last items, before either sleeps on a condition
 * variable: waking a sleeping thread takes some tens of microseconds (more on a
 * virtual machine, where the sleeping core has halted), which is as long as a
 * whole small call, a decoding step's included. OpenMP's runtimes do the same
 * (OMP_WAIT_POLICY, GOMP_SPINCOUNT). The calling thread works too (as
 * worker 0). Items are handed out from one atomic counter; each item must write
 * results that depend on the item alone, so the answer never depends on the
 * thread count or the schedule (tests/test_threads.c checks that bit for bit).
 *
 * Two callers on different threads do not share the pool: the second one, finding
 * it busy, runs its items on its own thread. A child of fork() starts with an
 * empty pool (its workers did not survive the fork). Nothing here allocates; the kernel's
 * scratch is allocated by the caller, one slice per worker.
 *
 * When the library is unloaded (dlclose of libattn.so) or the process exits, a
 * destructor stops the workers and joins them: a worker left asleep in code that
 * dlclose unmaps would crash when woken, and each load would leave more of them.
 */
#if defined(__linux__)
#define _GNU_SOURCE 1 /* sched_getaffinity, CPU_COUNT: the cores this process may use */
#else
#define _POSIX_C_SOURCE 200809L /* pthread_sigmask */
#endif
#include "threads.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#define ATTN_POOL_MAX 64

/* How long a worker waits for the next job, and the caller for its workers, by
 * spinning before sleeping: ATTN_SPIN_US microseconds, 0 to sleep at once (where
 * the process shares its cores with other busy threads), at most one second. */
#define ATTN_SPIN_US_DEFAULT 100
#define ATTN_SPIN_US_MAX 1000000

/* Below this many floating-point operations per thread, a thread is not worth
 * waking (a wake-up and a join cost some tens of microseconds on a busy machine). */
#define ATTN_FLOPS_PER_THREAD 1.0e6

typedef struct pool_job {
    attn__task_fn fn;
    void *arg;
    int64_t n_items;
    _Atomic int64_t next;
} pool_job;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t done;
    int started;              /* workers created: ids 1 .. started */
    _Atomic uint64_t generation; /* bumped for every job (read unlocked by spinners) */
    uint64_t start_gen[ATTN_POOL_MAX + 1];
    pool_job *job;
    int participants;         /* workers 1 .. participants run the current job */
    _Atomic int active;       /* of those, how many have not finished (also unlocked) */
    int busy;                 /* a caller owns the pool */
    _Atomic int stopping;     /* the destructor asks the workers to return */
    pthread_t thread[ATTN_POOL_MAX + 1]; /* worker id's thread, to join */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, {0}, NULL, 0, 0, 0, 0, {0}};

static void run_items(pool_job *job, int worker)
{
    for (;;) {
        int64_t item = atomic_fetch_add(&job->next, 1);
        if (item >= job->n_items)
            return;
        job->fn(job->arg, item, worker);
    }
}

/* ---- Spinning before sleeping ---------------------------------------------------- */

static int64_t spin_ns = (int64_t)ATTN_SPIN_US_DEFAULT * 1000;
static pthread_once_t spin_once = PTHREAD_ONCE_INIT;

/* ATTN_SPIN_US, read once per process: decimal digits only, at most
 * ATTN_SPIN_US_MAX; anything else leaves the default. */
static void spin_read_env(void)
{
    const char *e = getenv("ATTN_SPIN_US");
    if (!e || !*e)
        return;
    int64_t us = 0;
    for (const char *c = e; *c; c++) {
        if (*c < '0' || *c > '9' || us > ATTN_SPIN_US_MAX)
            return;
        us = us * 10 + (*c - '0');
    }
    if (us <= ATTN_SPIN_US_MAX)
        spin_ns = us * 1000;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* What a spinner waits for, read without the lock; the sleeper's loop that
 * follows checks it again under the lock, so a spin that gives up early only
 * costs the sleep it tried to avoid. */
static int new_job_or_stop(uint64_t seen)
{
    return atomic_load_explicit(&pool.generation, memory_order_acquire) != seen ||
           atomic_load_explicit(&pool.stopping, memory_order_acquire);
}

static int workers_done(uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&pool.active, memory_order_acquire) == 0;
}

static void spin_until(int (*ready)(uint64_t), uint64_t arg)
{
    if (spin_ns <= 0 || ready(arg))
        return;
    const int64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if (ready(arg))
            return;
        if ((i & 63) == 0 && now_ns() - t0 > spin_ns)
            return;
    }
}

/* Whether this thread is taking or holds pool.lock as a caller (set before it
 * asks for the lock, cleared after it lets go): exit() from a signal handler
 * that interrupted this thread there must not wait for the lock (pool_shutdown).
 * Workers block every signal and never need it. */
static _Thread_local int caller_in_lock;

static void caller_lock(void)
{
    caller_in_lock = 1;
    pthread_mutex_lock(&pool.lock);
}

static void caller_unlock(void)
{
    pthread_mutex_unlock(&pool.lock);
    caller_in_lock = 0;
}

static void *worker_main(void *arg)
{
    const int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    uint64_t seen = pool.start_gen[id];
    /* Only a worker that took part in the last job spins for the next one: a job
     * of fewer threads than the pool has wakes the others too (one broadcast), and
     * those, likely not needed next either, would take the cores from the ones
     * that are. */
    int took_part = 0;
    for (;;) {
        if (took_part && pool.generation == seen && !pool.stopping) {
            pthread_mutex_unlock(&pool.lock);
            spin_until(new_job_or_stop, seen);
            pthread_mutex_lock(&pool.lock);
        }
        while (pool.generation == seen && !pool.stopping)
            pthread_cond_wait(&pool.wake, &pool.lock);
        if (pool.stopping)
            break;
        seen = pool.generation;
        took_part = id <= pool.participants;
        if (!took_part)
            continue;
        pool_job *job = pool.job;
        pthread_mutex_unlock(&pool.lock);
        run_items(job, id);
        pthread_mutex_lock(&pool.lock);
        if (--pool.active == 0)
            pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* A child of fork() has none of the parent's workers: it starts with an empty,
 * idle pool (and fresh locks, which the fork may have caught held). */
static void pool_after_fork_child(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = 0;
    pool.job = NULL;
    pool.participants = 0;
    pool.active = 0;
    pool.busy = pool.stopping; /* after the destructor, calls stay on their callers */
    caller_in_lock = 0; /* the forking thread's flag: a fork from a signal handler
                           that interrupted its caller_lock() copied it set */
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pool_register_atfork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

/* With pool.lock held: makes sure workers 1 .. want exist; returns how many do. */
static int pool_grow(int want)
{
    /* Workers start with every signal blocked (a thread inherits its creator's
     * mask): a signal sent to the process then runs the program's handler on one of
     * the program's own threads, never inside the library's, where a handler that
     * calls exit() or longjmp()s would stop a worker holding the pool's lock. */
    sigset_t all, before;
    sigfillset(&all);
    const int masked = pool.started < want && pthread_sigmask(SIG_BLOCK, &all, &before) == 0;
    while (pool.started < want) {
        pthread_attr_t attr;
        pthread_t thread;
        int id = pool.started + 1;
        pool.start_gen[id] = pool.generation;
        if (pthread_attr_init(&attr) != 0)
            break;
        /* Joinable: the destructor joins the workers. */
        int rc = pthread_create(&thread, &attr, worker_main, (void *)(intptr_t)id);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        pool.thread[id] = thread;
        pool.started = id;
    }
    if (masked)
        pthread_sigmask(SIG_SETMASK, &before, NULL);
    return pool.started < want ? pool.started : want;
}

void attn__parallel_for(int threads, int64_t n_items, attn__task_fn fn, void *arg)
{
    pool_job job;
    job.fn = fn;
    job.arg = arg;
    job.n_items = n_items;
    atomic_init(&job.next, 0);
    if (threads > ATTN_POOL_MAX + 1)
        threads = ATTN_POOL_MAX + 1;
    if ((int64_t)threads > n_items)
        threads = (int)n_items;
    if (threads <= 1) {
        run_items(&job, 0);
        return;
    }
    /* No cancellation inside: pthread_cond_wait below is a cancellation point, and a
     * caller cancelled there would leave the lock held, the pool busy and its job
     * (on this stack) with the workers, hanging every later call of the process. A
     * pending cancel acts at the caller's next cancellation point after the call. */
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    /* The child handler is registered before the lock is first taken: a fork
     * while this thread holds the lock must find the handler there to give the
     * child fresh locks, or the child's next call would wait on a lock no thread
     * of the child will ever release. */
    pthread_once(&atfork_once, pool_register_atfork);
    pthread_once(&spin_once, spin_read_env);
    caller_lock();
    if (pool.busy) {
        caller_unlock();
        run_items(&job, 0);
        pthread_setcancelstate(cancel_state, NULL);
        return;
    }
    pool.busy = 1;
    const int helpers = pool_grow(threads - 1);
    pool.job = &job;
    pool.participants = helpers;
    pool.active = helpers;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    caller_unlock();

    run_items(&job, 0);

    spin_until(workers_done, 0);
    caller_lock();
    while (pool.active > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pool.job = NULL;
    pool.busy = 0;
    caller_unlock();
    pthread_setcancelstate(cancel_state, NULL);
}

/* At dlclose or exit: stops the workers and waits until they have returned, so no
 * thread runs the library's code once it is unmapped. A caller still inside a call
 * at exit keeps the pool (its workers end with the process); every later call runs
 * on its caller's thread. exit() from a signal handler that interrupted this very
 * thread while it held the lock (or was taking it) must not wait for itself, so
 * that case returns at once. Anyone else holds the lock for a moment only (a
 * worker between its spin and its sleep, right after a call, often does), so the
 * lock is waited for, but for at most a second, in case a program's thread sits
 * in a signal handler of its own with the lock held. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((destructor))
#endif
static void pool_shutdown(void)
{
    if (caller_in_lock)
        return;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    if (pthread_mutex_timedlock(&pool.lock, &deadline) != 0)
        return;
    if (pool.busy) {
        pthread_mutex_unlock(&pool.lock);
        return;
    }
    pool.busy = 1; /* never cleared: no later call wakes or starts a worker */
    pool.stopping = 1;
    const int started = pool.started;
    pool.started = 0;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int id = 1; id <= started; id++)
        pthread_join(pool.thread[id], NULL);
}

/* The cores this process may run on: the online ones, or fewer where its CPU
 * affinity says so (taskset, a container's cpuset, numactl), as OpenMP's runtimes
 * count them; a worker per online core there would share cores and wait on each
 * other at every call's end. Counted once per process (sysconf reads /sys on
 * Linux: a microsecond, more than the chapter's whole problem), at the first call
 * that asks, so an affinity set before that call is the one that counts. */
static pthread_once_t online_once = PTHREAD_ONCE_INIT;
static int online_cores = 1;

static void online_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const long allowed = CPU_COUNT(&set);
        if (allowed >= 1 && (n < 1 || allowed < n))
            n = allowed;
    }
#endif
    online_cores = n < 1 ? 1 : n > ATTN_POOL_MAX + 1 ? ATTN_POOL_MAX + 1 : (int)n;
}

int attn_threads_online(void)
{
    pthread_once(&online_once, online_count);
    return online_cores;
}

int attn_threads_resolve(const attn_ctx *ctx)
{
    int t = ctx ? ctx->threads : 0;
    if (t <= 0)
        return attn_threads_online();
    return t > ATTN_POOL_MAX + 1 ? ATTN_POOL_MAX + 1 : t;
}

int attn__threads_for(const attn_ctx *ctx, double flops, int64_t n_items)
{
    int t = attn_threads_resolve(ctx);
    if ((int64_t)t > n_items)
        t = (int)(n_items < 1 ? 1 : n_items);
    double by_work = flops / ATTN_FLOPS_PER_THREAD;
    if (by_work < (double)t)
        t = by_work < 1.0 ? 1 : (int)by_work;
    return t;
}
