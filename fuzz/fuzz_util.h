/*
 * fuzz_util.h - what the libFuzzer targets share: the input bytes as a file.
 *
 * The loaders take a path (they check the header against the file's size, which
 * they read with fstat), so each input is written to an in-memory file made with
 * memfd_create and handed over as /proc/self/fd/N. One memfd per process is reused:
 * it is truncated and rewritten for every input, and nothing touches the disk.
 */
#ifndef ATTN_FUZZ_UTIL_H
#define ATTN_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "attn.h"

/* Writes n bytes into the process's memfd and returns its path (static storage).
 * Exits the process when the memfd cannot be made: a broken harness, not a finding. */
static inline const char *fuzz_bytes_as_file(const uint8_t *data, size_t n)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("attn_fuzz_input", 0);
        if (fd < 0) {
            perror("fuzz: memfd_create");
            exit(2);
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) {
        perror("fuzz: ftruncate");
        exit(2);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, data + done, n - done, (off_t)done);
        if (w <= 0) {
            perror("fuzz: pwrite");
            exit(2);
        }
        done += (size_t)w;
    }
    return path;
}

/* Reads every byte of a loaded array's data, so that ASan reports a buffer that is
 * shorter than the tensor claims; the caller passes the result to fuzz_sink. */
static inline unsigned fuzz_touch(const void *p, size_t n)
{
    const unsigned char *b = p;
    unsigned acc = 0;
    for (size_t i = 0; i < n; i++)
        acc = acc * 31u + b[i];
    return acc;
}

static volatile unsigned fuzz_sink_;
static inline void fuzz_sink(unsigned v) { fuzz_sink_ += v; }

/* A check inside a target that must hold for any input: a failure is a finding. */
#define FUZZ_ASSERT(cond)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                          \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* A directory for files a target writes (round trips, CLI outputs). fuzz/run.sh
 * passes one in ATTN_FUZZ_WORK (under /dev/shm, so the writers' fsync costs nothing)
 * and removes it afterwards; without it a fresh attn-fuzz-XXXXXX directory is made. */
static inline const char *fuzz_work_dir(void)
{
    static char dir[4096];
    if (dir[0])
        return dir;
    const char *env = getenv("ATTN_FUZZ_WORK");
    if (env && env[0] && strlen(env) < sizeof(dir)) {
        snprintf(dir, sizeof(dir), "%s", env);
        return dir;
    }
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof(dir), "%s/attn-fuzz-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp");
        exit(2);
    }
    return dir;
}

/* Every failing call must leave its status and a message in ctx. */
#define FUZZ_CHECK_FAILURE(ctx, st)                                                   \
    do {                                                                              \
        FUZZ_ASSERT((st) < 0);                                                        \
        FUZZ_ASSERT((ctx).status == (st));                                            \
        FUZZ_ASSERT((ctx).message[0] != '\0');                                        \
    } while (0)

/* ---- allocation failures ---------------------------------------------------------
 *
 * Half of the inputs also run with an allocator that fails one allocation: which
 * one (the 1st .. 8th) is decided by a hash of the input, so a crash reproduces from
 * the input alone. Error paths after a failed allocation are where leaks and
 * double frees hide; LeakSanitizer (on in these builds) reports a leak as a crash. */
typedef struct fuzz_alloc {
    long count;   /* allocations so far */
    long fail_at; /* the one that fails (1-based), or 0 for none */
    int failed;   /* it happened */
} fuzz_alloc;

static void *fuzz_alloc_fn(void *user, size_t size)
{
    fuzz_alloc *fa = user;
    if (++fa->count == fa->fail_at) {
        fa->failed = 1;
        return NULL;
    }
    return malloc(size);
}

static void fuzz_free_fn(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

/* attn_ctx_init plus the failing allocator chosen by the input's FNV-1a hash. */
static inline void fuzz_ctx_init(attn_ctx *ctx, fuzz_alloc *fa, const uint8_t *data,
                                 size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ data[i]) * 1099511628211ull;
    memset(fa, 0, sizeof(*fa));
    fa->fail_at = (h >> 32) % 16 >= 8 ? (long)((h >> 32) % 8) + 1 : 0;
    attn_ctx_init(ctx);
    ctx->allocator.alloc = fuzz_alloc_fn;
    ctx->allocator.free = fuzz_free_fn;
    ctx->allocator.user = fa;
}

#endif /* ATTN_FUZZ_UTIL_H */
