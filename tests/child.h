/*
 * child.h - run one variant of a test in a child process, with its results in memory
 * shared with the parent.
 *
 * Some of the library's choices are made once per process, from the environment, at
 * the first call that needs them: the micro-tile shape (ATTN_MICROTILE), the tiles
 * (ATTN_TILE), the path (ATTN_ARCH), the bfloat16 kernel (ATTN_BF16_EMULATE). A test
 * that compares two such choices runs each in a child that sets its variable before
 * its first library call and writes its results into shared memory, where the parent
 * compares them. The parent must call nothing of the library before the forks, or the
 * children would inherit its choice.
 *
 * Needs check.h included first (the children's failed checks decide their exit
 * status) and _DEFAULT_SOURCE defined before any system header (MAP_ANONYMOUS).
 */
#ifndef ATTN_TEST_CHILD_H
#define ATTN_TEST_CHILD_H

#include <stddef.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* The exit status of a child that cannot run its variant on this CPU or build. */
#define TU_CHILD_SKIPPED 77

/* Memory the children write and the parent reads, zeroed; NULL (and a failed check)
 * if it cannot be mapped. */
static inline void *tu_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p == MAP_FAILED ? NULL : p;
}

static inline void tu_shared_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

/* What a child ended with. */
typedef enum { TU_CHILD_PASSED, TU_CHILD_FAILED, TU_CHILD_SKIP } tu_child_end;

/* Runs fn(variant, res) in a child process and waits for it. The child exits with
 * fn's own _exit, or else 1 if any of its checks failed and 0 if none did; a child
 * that exits TU_CHILD_SKIPPED was skipped. A child that fails, crashes or cannot be
 * started counts as a failed check here, with the variant's name on stderr. */
static inline tu_child_end tu_run_child(void (*fn)(int variant, void *res), int variant,
                                        void *res, const char *name)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        fn(variant, res);
        fflush(NULL);
        _exit(check_failures_ > 0);
    }
    int status = 0;
    const int waited = pid > 0 && waitpid(pid, &status, 0) == pid;
    if (waited && WIFEXITED(status) && WEXITSTATUS(status) == TU_CHILD_SKIPPED)
        return TU_CHILD_SKIP;
    const int passed = waited && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!passed)
        fprintf(stderr, "   the %s child %s (status %d)\n", name,
                pid < 0 ? "could not be started" : "failed", status);
    CHECK(passed);
    return passed ? TU_CHILD_PASSED : TU_CHILD_FAILED;
}

#endif
