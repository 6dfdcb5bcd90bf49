/*
 * io_test_util.h - helpers for the file-format tests (test_npy, test_safetensors,
 * test_weights, test_golden): paths in the build's test folder, writing raw bytes,
 * a deterministic byte mutator for the robustness sweeps, and an allocator that
 * fails on the n-th call for the out-of-memory sweeps.
 */
#ifndef ATTN_IO_TEST_UTIL_H
#define ATTN_IO_TEST_UTIL_H

#include "attn.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A path in the build's test folder, "<tmp>/<prog>_<name>", or in tests/data. The
 * result lives in one of four rotating buffers, so up to four paths can be in use
 * at once (e.g. the arguments of one call). */
static inline const char *io_tmp(const char *prog, const char *name)
{
    static char buf[4][1024];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s_%s", ATTN_TEST_TMP_DIR, prog, name);
    return buf[k];
}

static inline const char *io_data(const char *name)
{
    static char buf[4][1024];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", ATTN_TEST_DATA_DIR, name);
    return buf[k];
}

/* 1 when the test folder holds no temporary file ("<prog>_*.tmp.*") that a writer
 * of the program `prog` left behind. */
static inline int io_no_temp_files(const char *prog)
{
    DIR *d = opendir(ATTN_TEST_TMP_DIR);
    if (!d)
        return 0;
    int clean = 1;
    size_t len = strlen(prog);
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prog, len) == 0 && e->d_name[len] == '_' &&
            strstr(e->d_name, ".tmp."))
            clean = 0;
    closedir(d);
    return clean;
}

static inline int io_write(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(buf, 1, n, f) : 0;
    fclose(f);
    return w == n ? 0 : -1;
}

/* Reads a whole file into a malloc'd buffer; *n gets its size. NULL on failure. */
static inline unsigned char *io_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    if (b && len > 0 && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)(len > 0 ? len : 0);
    return b;
}

static inline uint64_t io_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

static inline int io_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

/* A fixed xorshift sequence, so a failing mutation can be replayed. */
static inline uint64_t io_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One mutation of `n` bytes: flip a byte, set one to a boundary value, or overwrite
 * a run with 0xff. Returns the (possibly shorter) new length: some mutations
 * truncate. */
static inline size_t io_mutate(unsigned char *b, size_t n, uint64_t *s)
{
    if (n == 0)
        return 0;
    uint64_t r = io_next(s);
    size_t at = (size_t)(io_next(s) % n);
    switch (r % 6) {
    case 0:
        b[at] ^= (unsigned char)(1u << (io_next(s) % 8));
        break;
    case 1:
        b[at] = (unsigned char)"\x00\xff\x7f\x80'\"{}[](),:0123456789"[io_next(s) % 24];
        break;
    case 2:
        for (size_t k = at; k < n && k < at + 8; k++)
            b[k] = 0xff;
        break;
    case 3:
        return at; /* truncate */
    case 4:
        b[at] = (unsigned char)io_next(s);
        break;
    default:
        if (at + 1 < n) { /* swap two bytes */
            unsigned char t = b[at];
            b[at] = b[at + 1];
            b[at + 1] = t;
        }
        break;
    }
    return n;
}

/* An allocator that fails on call number `fail_at` (1-based; 0 = never) and counts
 * what is still allocated, so a test can check that a failing load frees all. */
typedef struct io_failing_alloc {
    long calls;
    long fail_at;
    long live;
} io_failing_alloc;

static inline void *io_fa_alloc(void *user, size_t size)
{
    io_failing_alloc *fa = user;
    fa->calls++;
    if (fa->fail_at && fa->calls == fa->fail_at)
        return NULL;
    void *p = malloc(size);
    if (p)
        fa->live++;
    return p;
}

static inline void io_fa_free(void *user, void *p)
{
    io_failing_alloc *fa = user;
    fa->live--;
    free(p);
}

static inline void io_fa_ctx(attn_ctx *ctx, io_failing_alloc *fa, long fail_at)
{
    attn_ctx_init(ctx);
    fa->calls = 0;
    fa->fail_at = fail_at;
    fa->live = 0;
    ctx->allocator.alloc = io_fa_alloc;
    ctx->allocator.free = io_fa_free;
    ctx->allocator.user = fa;
}

#endif /* ATTN_IO_TEST_UTIL_H */
