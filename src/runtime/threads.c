/*
 * threads.c - a small pthread pool of our own for the fast kernels.
 *
 * Workers are created on first use (as many as the largest call has asked for,
 * at most ATTN_POOL_MAX) and then sleep on a condition variable between calls, so
 * a call pays a wake-up, not a thread creation. The calling thread works too (as
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
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#define ATTN_POOL_MAX 64

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
    uint64_t generation;      /* bumped for every job */
    uint64_t start_gen[ATTN_POOL_MAX + 1];
    pool_job *job;
    int participants;         /* workers 1 .. participants run the current job */
    int active;               /* of those, how many have not finished */
    int busy;                 /* a caller owns the pool */
    int stopping;             /* the destructor asks the workers to return */
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

static void *worker_main(void *arg)
{
    const int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    uint64_t seen = pool.start_gen[id];
    for (;;) {
        while (pool.generation == seen && !pool.stopping)
            pthread_cond_wait(&pool.wake, &pool.lock);
        if (pool.stopping)
            break;
        seen = pool.generation;
        if (id > pool.participants)
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
    pthread_mutex_lock(&pool.lock);
    if (pool.busy) {
        pthread_mutex_unlock(&pool.lock);
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
    pthread_mutex_unlock(&pool.lock);

    run_items(&job, 0);

    pthread_mutex_lock(&pool.lock);
    while (pool.active > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pool.job = NULL;
    pool.busy = 0;
    pthread_mutex_unlock(&pool.lock);
    pthread_setcancelstate(cancel_state, NULL);
}

/* At dlclose or exit: stops the workers and waits until they have returned, so no
 * thread runs the library's code once it is unmapped. A caller still inside a call
 * at exit keeps the pool (its workers end with the process); every later call runs
 * on its caller's thread. trylock, not lock: exit() from a signal handler that
 * interrupted this very thread while it held the lock must not wait for itself. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((destructor))
#endif
static void pool_shutdown(void)
{
    if (pthread_mutex_trylock(&pool.lock) != 0)
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
