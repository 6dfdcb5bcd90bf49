/*
 * test_embed_exit.c - a program's signal handler calls exit() while the main thread
 * is inside threaded attn calls (a SIGINT or SIGALRM handler that ends the program
 * this way is common, though exit is not async-signal-safe). exit() runs the pool's
 * destructor (src/runtime/threads.c), which must never wait for the pool's lock: the
 * interrupted thread may be holding it, and would wait for itself forever.
 *
 * Each round is a child process whose SIGALRM handler calls exit(0) after a varied
 * delay, while it loops on attn_sdpa with two threads; the parent gives it 2
 * seconds to end. Taking the lock outright hung about 1 round in 30 here.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS (CHECK_SANITIZED ? 60 : 300)

/* LeakSanitizer's check at exit takes the sanitizer allocator's locks, which the
 * interrupted thread may hold (attn_sdpa allocates its scratch), and then waits for
 * itself as the pool's destructor once did (about 1 round in 100 hung here). Its own
 * documented hook turns it off for this program; AddressSanitizer still checks the
 * memory accesses. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
    return 1;
}

/* Large enough that attn_sdpa wakes a second thread (attn__threads_for). */
enum { B = 1, H = 2, T = 128, D = 32, N = B * H * T * D };
static float q[N], k[N], v[N], o[N];

static void leave(int sig)
{
    (void)sig;
    exit(0);
}

static void child(long delay_us)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = leave;
    sigaction(SIGALRM, &sa, NULL);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    struct itimerval it = {{0, 0}, {0, delay_us}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (;;)
        if (attn_sdpa(&ctx, &tq, &tk, &tv, NULL, &to, NULL) != ATTN_OK)
            _exit(3);
}

/* 0 when the child exits 0 within 2 s; 1 when it hangs (then killed); 2 otherwise. */
static int outcome(pid_t pid)
{
    for (int waited_ms = 0; waited_ms < 2000; waited_ms += 5) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2;
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 1;
}

int main(void)
{
    TEST("exit() from a signal handler that interrupts threaded attn calls ends the "
         "process every time (300 rounds)");
    tu_fill(q, N, 1);
    tu_fill(k, N, 2);
    tu_fill(v, N, 3);
    int hung = 0, other = 0;
    fflush(NULL);
    for (int r = 0; r < ROUNDS; r++) {
        pid_t pid = fork();
        if (pid == 0)
            child(2000 + 13L * r);
        if (pid < 0) {
            other++;
            break;
        }
        const int o_ = outcome(pid);
        hung += o_ == 1;
        other += o_ == 2;
    }
    if (hung || other)
        fprintf(stderr, "   %d of %d rounds hung at exit, %d ended otherwise\n", hung, ROUNDS,
                other);
    CHECK_INT(hung, 0);
    CHECK_INT(other, 0);
    return check_summary("test_embed_exit");
}
