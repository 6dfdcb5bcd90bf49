/*
 * output.c - the one output writer. Every file the library and its programs write
 * (.npy arrays, .safetensors tensor sets, the experiment's SVG) goes through an
 * output set; include/attn.h ("Output sets") states the guarantee and
 * docs/reliability.md explains it.
 *
 * The life of one output set:
 *
 *   add     Each output's name is examined before anything is written: a
 *           directory is refused; a device, FIFO or "-" (standard output) is
 *           written directly, so its bytes are kept in memory until the commit; a
 *           regular file (existing or new) gets a temporary file beside it, made
 *           with O_CREAT | O_EXCL under a name with a random part (getrandom, or
 *           /dev/urandom), and the bytes go there at once. Two names that reach
 *           the same file (a hard or symbolic link, "./x" and "x") are refused
 *           here, by comparing st_dev/st_ino of existing files and of the parent
 *           directory plus the last name component for new ones.
 *   commit  1. every temporary file is flushed, fsync'd and closed;
 *           2. the direct outputs are written (a full device fails here);
 *           3. only then is each temporary file renamed over its target, and the
 *              directories are synced.
 *           Any failure in 1 or 2 removes every temporary file: no target changes.
 *           A failing rename in 3 after an earlier one succeeded is the one window
 *           left; the message names the outputs that were already replaced.
 *
 * Why rename: POSIX rename() replaces the target atomically when both names are in
 * the same directory, so a reader sees the old file or the whole new one, never
 * half of one.
 *
 * Interrupted runs: a library cannot own the process's signal handlers, so every
 * live temporary file is listed in a fixed table of lock-free slots, and
 * attn_output_remove_temporaries() - async-signal-safe - unlinks them for a
 * handler that the program installs (tools/common_cli.c does this).
 *
 * Nothing here is shared between threads except that table, whose slots change
 * only by atomic compare-and-swap; output sets of different threads are
 * independent.
 */
#define _XOPEN_SOURCE 700 /* realpath; POSIX.1-2008 with XSI */

#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

/* ---- the table of live temporary files ---------------------------------------- */

/* A signal handler may only touch lock-free atomics (C11 7.14.1.1). */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the live-temporary table needs lock-free ints");

enum { LIVE_SLOTS = 256 };
enum { SLOT_FREE, SLOT_CLAIMED, SLOT_LIVE, SLOT_UNLINKING };

/* A slot's path is written while the slot is CLAIMED by its owner and read only by
 * a handler that moved the slot from LIVE to UNLINKING, so the two never overlap. */
static atomic_int live_state[LIVE_SLOTS];
static const char *live_path[LIVE_SLOTS];
/* The process that listed the slot: a child of fork() inherits the table, but the
 * temporaries in it are its parent's, which a handler in the child must not unlink. */
static pid_t live_pid[LIVE_SLOTS];

/* Lists path (which must stay valid until live_remove) and returns its slot, or -1
 * when every slot is taken: that temporary file is then not removed on a signal,
 * which costs nothing but tidiness. */
static int live_add(const char *path)
{
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int expect = SLOT_FREE;
        if (atomic_compare_exchange_strong(&live_state[i], &expect, SLOT_CLAIMED)) {
            live_path[i] = path;
            live_pid[i] = getpid();
            atomic_store(&live_state[i], SLOT_LIVE);
            return i;
        }
    }
    return -1;
}

static void live_remove(int slot)
{
    if (slot < 0)
        return;
    for (;;) {
        int expect = SLOT_LIVE;
        if (atomic_compare_exchange_strong(&live_state[slot], &expect, SLOT_CLAIMED))
            break;
        /* A handler on another thread is unlinking this file right now; it gives the
         * slot back within one system call. */
        sched_yield();
    }
    live_path[slot] = NULL;
    atomic_store(&live_state[slot], SLOT_FREE);
}

void attn_output_remove_temporaries(void)
{
    const pid_t self = getpid(); /* async-signal-safe */
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int expect = SLOT_LIVE;
        if (atomic_compare_exchange_strong(&live_state[i], &expect, SLOT_UNLINKING)) {
            if (live_pid[i] == self)
                unlink(live_path[i]); /* async-signal-safe (POSIX.1-2008, 2.4.3) */
            atomic_store(&live_state[i], SLOT_LIVE);
        }
    }
}

/* ---- memory with the set's allocator ------------------------------------------ */

static void *a_alloc(const attn_allocator *a, attn_ctx *ctx, size_t n, const char *what)
{
    if (n == 0)
        n = 1;
    void *p = a->alloc ? a->alloc(a->user, n) : malloc(n);
    if (!p)
        attn__fail(ctx, ATTN_STATUS_NO_MEMORY, "out of memory allocating %zu bytes for %s",
                   n, what);
    return p;
}

static void a_free(const attn_allocator *a, void *p)
{
    if (!p)
        return;
    if (a->free)
        a->free(a->user, p);
    else
        free(p);
}

static char *a_strdup(const attn_allocator *a, attn_ctx *ctx, const char *s, size_t n,
                      const char *what)
{
    char *c = a_alloc(a, ctx, n + 1, what);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

/* ---- the byte sink ------------------------------------------------------------- */

int attn__wfile_write(attn_ctx *ctx, attn__wfile *wf, const void *buf, size_t n)
{
    if (wf->failed)
        return ATTN_STATUS_IO;
    if (n == 0)
        return ATTN_OK;
    if (wf->f) {
        if (fwrite(buf, 1, n, wf->f) != n) {
            wf->failed = 1;
            return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot write: %s", wf->path,
                              strerror(errno));
        }
        return ATTN_OK;
    }
    /* A direct output: keep the bytes until the commit, growing by doubling. */
    if (n > SIZE_MAX - wf->len) {
        wf->failed = 1;
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: the output does not fit in memory",
                          wf->path);
    }
    if (wf->len + n > wf->cap) {
        size_t cap = wf->cap ? wf->cap : 4096;
        while (cap < wf->len + n)
            cap = cap > SIZE_MAX / 2 ? wf->len + n : cap * 2;
        unsigned char *m = a_alloc(wf->alloc, ctx, cap, "an output held for a device");
        if (!m) {
            wf->failed = 1;
            return ATTN_STATUS_NO_MEMORY;
        }
        if (wf->len)
            memcpy(m, wf->mem, wf->len);
        a_free(wf->alloc, wf->mem);
        wf->mem = m;
        wf->cap = cap;
    }
    memcpy(wf->mem + wf->len, buf, n);
    wf->len += n;
    return ATTN_OK;
}

static int host_is_big_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 0;
}

int attn__wfile_write_tensor(attn_ctx *ctx, attn__wfile *wf, const attn_tensor *t)
{
    size_t es = attn_dtype_size(t->dtype);
    int64_t shape[4], stride[4];
    attn__as4d(t, shape, stride);
    int swap = host_is_big_endian() && es > 1;
    const unsigned char *base = t->data;

    /* Contiguous little-endian data goes out in one call; anything else through a
     * staging buffer, element by element in C order. */
    if (!swap && attn_tensor_is_contiguous(t)) {
        int64_t n = attn_tensor_numel(t);
        return attn__wfile_write(ctx, wf, base, (size_t)n * es);
    }
    /* 4 KiB on the stack, as the kernels' frames take: a program's thread may have a
     * 64 KiB stack (tests/test_embed_stack.c), which a 64 KiB stage overflowed. */
    enum { STAGE = 1 << 12 };
    unsigned char stage[STAGE];
    size_t used = 0;
    for (int64_t i0 = 0; i0 < shape[0]; i0++)
        for (int64_t i1 = 0; i1 < shape[1]; i1++)
            for (int64_t i2 = 0; i2 < shape[2]; i2++)
                for (int64_t i3 = 0; i3 < shape[3]; i3++) {
                    const unsigned char *src =
                        base + (size_t)attn__off4(stride, i0, i1, i2, i3) * es;
                    if (used + es > STAGE) {
                        int st = attn__wfile_write(ctx, wf, stage, used);
                        if (st != ATTN_OK)
                            return st;
                        used = 0;
                    }
                    for (size_t b = 0; b < es; b++)
                        stage[used + b] = swap ? src[es - 1 - b] : src[b];
                    used += es;
                }
    return attn__wfile_write(ctx, wf, stage, used);
}

/* ---- the output set ------------------------------------------------------------ */

typedef enum out_kind {
    OUT_RENAME, /* a regular file: temporary file + rename */
    OUT_DIRECT, /* a device or FIFO, opened and written at commit */
    OUT_STDOUT  /* "-": file descriptor 1, written at commit */
} out_kind;

typedef struct out_entry {
    out_kind kind;
    char *path;   /* the caller's name, for messages */
    char *target; /* OUT_RENAME: what the temporary file is renamed to */
    char *tmp;    /* OUT_RENAME: the temporary file, while it exists */
    int slot;     /* tmp's slot in the live table, or -1 */
    attn__wfile wf;
    /* Identity, for the same-file check: an existing file's (dev, ino), or for a
     * new file its directory's (dev, ino) and its last name component. */
    int is_new;
    dev_t dev;
    ino_t ino;
    char *name;
    int renamed;
} out_entry;

struct attn_output_set {
    attn_allocator alloc; /* the creating context's allocator, used throughout */
    out_entry *e;
    int n, cap;
    int broken; /* an add failed: commit writes nothing */
    int spent;  /* committed (or failed to): only free is left */
};

int attn_output_set_create(attn_ctx *ctx, attn_output_set **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_output_set_create: out is NULL");
    *out = NULL;
    attn_allocator a = {NULL, NULL, NULL};
    if (ctx)
        a = ctx->allocator;
    /* The set keeps this allocator for all its memory: both functions or neither. */
    int rc = attn__allocator_check(ctx, &a);
    if (rc != ATTN_OK)
        return rc;
    attn_output_set *s = a_alloc(&a, ctx, sizeof *s, "an output set");
    if (!s)
        return ATTN_STATUS_NO_MEMORY;
    memset(s, 0, sizeof *s);
    s->alloc = a;
    *out = s;
    return ATTN_OK;
}

/* Removes an entry's temporary file (if any) and frees what it holds. The file is
 * unlinked before its slot is given up, so a signal in between finds nothing to
 * leave behind. */
static void entry_discard(attn_output_set *s, out_entry *e)
{
    if (e->wf.f) {
        fclose(e->wf.f);
        e->wf.f = NULL;
    }
    if (e->tmp) {
        unlink(e->tmp);
        live_remove(e->slot);
        e->slot = -1;
        a_free(&s->alloc, e->tmp);
        e->tmp = NULL;
    }
    a_free(&s->alloc, e->wf.mem);
    a_free(&s->alloc, e->path);
    a_free(&s->alloc, e->target);
    a_free(&s->alloc, e->name);
    memset(e, 0, sizeof *e);
    e->slot = -1;
}

void attn_output_set_free(attn_ctx *ctx, attn_output_set *set)
{
    (void)ctx;
    if (!set)
        return;
    for (int i = 0; i < set->n; i++)
        entry_discard(set, &set->e[i]);
    attn_allocator a = set->alloc;
    a_free(&a, set->e);
    a_free(&a, set);
}

/* Random letters and digits for a temporary name. 0 on success. */
static int random_name(char *out, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[32];
    if (n > sizeof r)
        return -1;
    size_t got = 0;
#if defined(__linux__)
    while (got < n) {
        ssize_t k = getrandom(r + got, n - got, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += (size_t)k;
    }
#endif
    if (got < n) {
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return -1;
        while (got < n) {
            ssize_t k = read(fd, r + got, n - got);
            if (k <= 0) {
                if (k < 0 && errno == EINTR)
                    continue;
                close(fd);
                return -1;
            }
            got += (size_t)k;
        }
        close(fd);
    }
    /* 62 letters: a byte modulo 62 is slightly uneven, which costs a fraction of a
     * bit of the 71 the name carries. */
    for (size_t i = 0; i < n; i++)
        out[i] = abc[r[i] % 62];
    return 0;
}

/* 1 when path still names the file e was found to be. Two existing outputs with one
 * identity are one file (a hard link, "./x" and "x") only if the first name still
 * leads there: another process may have replaced the first file since it was looked
 * at, and the file system may have given its freed inode number to the second. */
static int still_names(const char *path, const out_entry *e)
{
    struct stat st;
    int found = strcmp(path, "-") == 0 ? fstat(STDOUT_FILENO, &st) : stat(path, &st);
    return found == 0 && st.st_dev == e->dev && st.st_ino == e->ino;
}

/* Decides how e->path is written and fills e's kind, target and identity. */
static int entry_classify(attn_ctx *ctx, attn_output_set *s, out_entry *e)
{
    const char *path = e->path;
    struct stat st;
    int retries = 0;
again:
    if (strcmp(path, "-") == 0) {
        if (fstat(STDOUT_FILENO, &st) != 0)
            return attn__fail(ctx, ATTN_STATUS_IO, "-: standard output is not open: %s",
                              strerror(errno));
        e->kind = OUT_STDOUT;
        e->dev = st.st_dev;
        e->ino = st.st_ino;
        return ATTN_OK;
    }
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return attn__fail(ctx, ATTN_STATUS_IO, "%s: is a directory, not a file", path);
        e->dev = st.st_dev;
        e->ino = st.st_ino;
        if (!S_ISREG(st.st_mode)) {
            /* A name for what standard output already is (/dev/stdout, /dev/fd/1 on a
             * pipe) is written through descriptor 1: reopening it by name can be
             * refused (a pipe made by another user) and would lose its mode. */
            struct stat out;
            e->kind = fstat(STDOUT_FILENO, &out) == 0 && out.st_dev == st.st_dev &&
                              out.st_ino == st.st_ino
                          ? OUT_STDOUT
                          : OUT_DIRECT;
            return ATTN_OK;
        }
        e->kind = OUT_RENAME;
        struct stat lst;
        if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
            /* Write through the link, as the shell's '>' does, but refuse a link
             * another user planted (Linux's fs.protected_symlinks refuses such links
             * in shared directories; realpath would bypass that rule). */
            if (lst.st_uid != geteuid() && lst.st_uid != 0)
                return attn__fail(ctx, ATTN_STATUS_IO,
                                  "%s: is a symbolic link owned by another user (uid %ld); "
                                  "not following it",
                                  path, (long)lst.st_uid);
            char *real = realpath(path, NULL);
            if (!real && errno == ENOMEM)
                return attn__fail(ctx, ATTN_STATUS_NO_MEMORY,
                                  "%s: out of memory resolving the link", path);
            if (!real)
                return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot resolve the link: %s",
                                  path, strerror(errno));
            e->target = a_strdup(&s->alloc, ctx, real, strlen(real), "an output name");
            free(real);
        } else {
            e->target = a_strdup(&s->alloc, ctx, path, strlen(path), "an output name");
        }
        return e->target ? ATTN_OK : ATTN_STATUS_NO_MEMORY;
    }
    if (errno != ENOENT)
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot write there: %s", path,
                          strerror(errno));
    struct stat lst;
    if (lstat(path, &lst) == 0) {
        /* The name appeared between stat and lstat (another writer renamed its file
         * into place): look again rather than call it a dangling link. */
        if (!S_ISLNK(lst.st_mode) && retries++ < 8)
            goto again;
        return attn__fail(ctx, ATTN_STATUS_IO,
                          "%s: is a symbolic link to a file that does not exist; not "
                          "following it",
                          path);
    }

    /* A new file: its identity is its directory and its last name component. */
    e->kind = OUT_RENAME;
    e->is_new = 1;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base)
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: names a directory, not a file", path);
    char *dir = slash ? a_strdup(&s->alloc, ctx, path, slash == path ? 1 : (size_t)(slash - path),
                                 "a directory name")
                      : a_strdup(&s->alloc, ctx, ".", 1, "a directory name");
    if (!dir)
        return ATTN_STATUS_NO_MEMORY;
    int rc = ATTN_OK;
    if (stat(dir, &st) != 0)
        rc = attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot create: directory %s: %s", path, dir,
                        strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rc = attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot create: %s is not a directory", path,
                        dir);
    a_free(&s->alloc, dir);
    if (rc)
        return rc;
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->name = a_strdup(&s->alloc, ctx, base, strlen(base), "an output name");
    e->target = a_strdup(&s->alloc, ctx, path, strlen(path), "an output name");
    return e->name && e->target ? ATTN_OK : ATTN_STATUS_NO_MEMORY;
}

/* Creates e's temporary file beside e->target and opens it for writing. An
 * existing target's permission bits (and, for root, its owner) go to the new
 * file, so replacing a 0600 file leaves a 0600 file. */
static int entry_open_temporary(attn_ctx *ctx, attn_output_set *s, out_entry *e)
{
    enum { RANDOM = 12 };
    static const char mid[] = ".tmp.";
    const char *slash = strrchr(e->target, '/');
    size_t dirlen = slash ? (size_t)(slash - e->target) + 1 : 0;
    size_t baselen = strlen(e->target) - dirlen;
    /* The temporary name keeps as much of the target's name as NAME_MAX allows, so a
     * 255-character name still gets a temporary file in its own directory. */
    size_t keep = NAME_MAX - (sizeof mid - 1) - RANDOM;
    if (baselen < keep)
        keep = baselen;
    size_t len = dirlen + keep + (sizeof mid - 1) + RANDOM;
    char *tmp = a_alloc(&s->alloc, ctx, len + 1, "a temporary file name");
    if (!tmp)
        return ATTN_STATUS_NO_MEMORY;
    memcpy(tmp, e->target, dirlen + keep);
    memcpy(tmp + dirlen + keep, mid, sizeof mid - 1);
    tmp[len] = '\0';

    int fd = -1, err = 0;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        if (random_name(tmp + len - RANDOM, RANDOM) != 0) {
            a_free(&s->alloc, tmp);
            return attn__fail(ctx, ATTN_STATUS_IO,
                              "%s: cannot draw random bytes for a temporary file name",
                              e->path);
        }
        /* Listed before it exists: a signal between open() and the listing would
         * otherwise leave the file behind. */
        int slot = live_add(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        err = errno;
        if (fd >= 0) {
            e->slot = slot;
        } else {
            live_remove(slot);
            if (err != EEXIST)
                break;
        }
    }
    if (fd < 0) {
        a_free(&s->alloc, tmp);
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot create a temporary file beside it: %s",
                          e->path, strerror(err));
    }
    e->tmp = tmp;
    if (!e->is_new) {
        struct stat st;
        if (stat(e->target, &st) == 0) {
            if (geteuid() == 0 && (st.st_uid != geteuid() || st.st_gid != getegid()) &&
                fchown(fd, st.st_uid, st.st_gid) != 0) {
                /* Keeping the owner is a courtesy; the content is what was asked for. */
            }
            if (fchmod(fd, st.st_mode & 07777 & ~(mode_t)(S_ISUID | S_ISGID)) != 0) {
                err = errno;
                close(fd);
                return attn__fail(ctx, ATTN_STATUS_IO,
                                  "%s: cannot give the new file the old one's permissions: %s",
                                  e->path, strerror(err));
            }
        }
    }
    e->wf.f = fdopen(fd, "wb");
    if (!e->wf.f) {
        err = errno;
        close(fd);
        /* The C library could not allocate the stream: out of memory, not a bad file. */
        if (err == ENOMEM)
            return attn__fail(ctx, ATTN_STATUS_NO_MEMORY,
                              "%s: out of memory opening a stream on it", e->path);
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot open a stream: %s", e->path,
                          strerror(err));
    }
    return ATTN_OK;
}

/* Starts an output: checks the name, refuses a second name for a file already in
 * the set, and opens the sink. On success *out is the new entry (the set's last). */
static int add_begin(attn_ctx *ctx, attn_output_set *s, const char *path, out_entry **out)
{
    *out = NULL;
    if (!s)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "the output set is NULL");
    if (s->spent)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "the output set was already committed; create a new one");
    if (!path || !path[0]) {
        s->broken = 1;
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "no output file name given");
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4;
        out_entry *e = a_alloc(&s->alloc, ctx, (size_t)cap * sizeof *e, "an output set");
        if (!e) {
            s->broken = 1;
            return ATTN_STATUS_NO_MEMORY;
        }
        if (s->n)
            memcpy(e, s->e, (size_t)s->n * sizeof *e);
        a_free(&s->alloc, s->e);
        s->e = e;
        s->cap = cap;
    }
    out_entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    e->slot = -1;
    s->n++;
    int rc = ATTN_OK;
    e->path = a_strdup(&s->alloc, ctx, path, strlen(path), "an output name");
    if (!e->path)
        rc = ATTN_STATUS_NO_MEMORY;
    if (!rc)
        rc = entry_classify(ctx, s, e);
    for (int i = 0; i < s->n - 1 && !rc; i++) {
        const out_entry *p = &s->e[i];
        if (p->is_new == e->is_new && p->dev == e->dev && p->ino == e->ino &&
            (e->is_new ? strcmp(p->name, e->name) == 0 : still_names(p->path, e)))
            rc = attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                            "%s and %s are the same file; each output needs a file of its own",
                            p->path, e->path);
    }
    e->wf.path = e->path;
    e->wf.alloc = &s->alloc;
    if (!rc && e->kind == OUT_RENAME)
        rc = entry_open_temporary(ctx, s, e);
    if (rc) {
        entry_discard(s, e);
        s->n--;
        s->broken = 1;
        return rc;
    }
    *out = e;
    return ATTN_OK;
}

/* Ends an output started by add_begin: a failed write drops it and breaks the set. */
static int add_end(attn_output_set *s, out_entry *e, int rc)
{
    if (rc) {
        entry_discard(s, e);
        s->n--;
        s->broken = 1;
    }
    return rc;
}

int attn_output_set_add_npy(attn_ctx *ctx, attn_output_set *set, const char *path,
                            const attn_tensor *t)
{
    if (!t) {
        if (set)
            set->broken = 1;
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: the tensor is NULL",
                          path ? path : "(null)");
    }
    out_entry *e;
    int rc = add_begin(ctx, set, path, &e);
    if (rc)
        return rc;
    return add_end(set, e, attn__npy_write(ctx, &e->wf, t));
}

int attn_output_set_add_safetensors(attn_ctx *ctx, attn_output_set *set, const char *path,
                                    const char *const *names, const attn_tensor *tensors,
                                    int64_t n)
{
    out_entry *e;
    int rc = add_begin(ctx, set, path, &e);
    if (rc)
        return rc;
    return add_end(set, e, attn__safetensors_write(ctx, &e->wf, names, tensors, n));
}

int attn_output_set_add_bytes(attn_ctx *ctx, attn_output_set *set, const char *path,
                              const void *data, size_t size)
{
    if (!data && size > 0) {
        if (set)
            set->broken = 1;
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: %zu bytes from NULL",
                          path ? path : "(null)", size);
    }
    out_entry *e;
    int rc = add_begin(ctx, set, path, &e);
    if (rc)
        return rc;
    return add_end(set, e, attn__wfile_write(ctx, &e->wf, data, size));
}

/* The test hook ATTN_TEST_OUTPUT_PAUSE_MS=N: sleep N milliseconds after every
 * temporary file is complete and synced and before anything is renamed, so a test
 * can send a signal in that window. Documented in docs/reliability.md. */
static void test_pause(void)
{
    const char *v = getenv("ATTN_TEST_OUTPUT_PAUSE_MS");
    if (!v || !*v)
        return;
    char *end;
    long ms = strtol(v, &end, 10);
    if (*end || ms <= 0 || ms > 600000)
        return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Writes a direct output (a device, FIFO or standard output). */
static int entry_write_direct(attn_ctx *ctx, out_entry *e)
{
    int fd = STDOUT_FILENO;
    if (e->kind == OUT_DIRECT) {
        /* Opening a FIFO waits for its reader, as the shell's '>' does. */
        do
            fd = open(e->path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
            return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot open: %s", e->path,
                              strerror(errno));
    }
    int err = write_all(fd, e->wf.mem, e->wf.len) != 0 ? errno : 0;
    if (fd != STDOUT_FILENO && close(fd) != 0 && !err && errno != EINTR)
        err = errno;
    if (err)
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot write: %s", e->path,
                          strerror(err));
    return ATTN_OK;
}

/* Best effort: makes the renames durable. A file system that cannot sync a
 * directory (EINVAL) loses nothing the rename did not already promise. */
static void sync_directory_of(const char *target)
{
    const char *slash = strrchr(target, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if ((size_t)(slash - target) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", slash == target ? 1 : (int)(slash - target), target);
    else
        return;
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int attn_output_set_commit(attn_ctx *ctx, attn_output_set *set)
{
    if (!set)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "the output set is NULL");
    if (set->spent)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "the output set was already committed; create a new one");
    set->spent = 1;
    int rc = ATTN_OK;
    if (set->broken)
        rc = attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                        "an output of this set could not be added, so none was written");

    /* 1. Every temporary file complete, synced and closed. */
    for (int i = 0; i < set->n && !rc; i++) {
        out_entry *e = &set->e[i];
        if (e->kind != OUT_RENAME)
            continue;
        int err = 0;
        if (e->wf.failed)
            err = EIO;
        else if (fflush(e->wf.f) != 0 || fsync(fileno(e->wf.f)) != 0)
            err = errno ? errno : EIO;
        if (fclose(e->wf.f) != 0 && !err)
            err = errno ? errno : EIO;
        e->wf.f = NULL;
        if (err)
            rc = attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot write: %s", e->path,
                            strerror(err));
    }
    if (!rc)
        test_pause();

    /* 2. The direct outputs, before any rename, so a full device leaves every
     * regular file as it was. */
    for (int i = 0; i < set->n && !rc; i++)
        if (set->e[i].kind != OUT_RENAME)
            rc = entry_write_direct(ctx, &set->e[i]);

    /* 3. The renames. */
    int renamed = 0;
    for (int i = 0; i < set->n && !rc; i++) {
        out_entry *e = &set->e[i];
        if (e->kind != OUT_RENAME)
            continue;
        if (rename(e->tmp, e->target) != 0) {
            int err = errno;
            char done[256] = "";
            size_t used = 0;
            for (int j = 0; j < i; j++)
                if (set->e[j].renamed && used < sizeof done) {
                    int w = snprintf(done + used, sizeof done - used, "%s%s", used ? ", " : "",
                                     set->e[j].path);
                    used += w > 0 ? (size_t)w : 0;
                }
            if (renamed)
                rc = attn__fail(ctx, ATTN_STATUS_IO,
                                "%s: cannot put the new file in place: %s; %d output(s) of "
                                "this run were already replaced (%s), the others keep their "
                                "old contents",
                                e->path, strerror(err), renamed, done);
            else
                rc = attn__fail(ctx, ATTN_STATUS_IO,
                                "%s: cannot put the new file in place: %s; no output was "
                                "changed",
                                e->path, strerror(err));
            break;
        }
        e->renamed = 1;
        renamed++;
        live_remove(e->slot);
        e->slot = -1;
        a_free(&set->alloc, e->tmp);
        e->tmp = NULL;
    }
    if (!rc)
        for (int i = 0; i < set->n; i++)
            if (set->e[i].renamed)
                sync_directory_of(set->e[i].target);

    /* Whatever is left (on failure) goes: the entries' temporary files and buffers. */
    for (int i = 0; i < set->n; i++)
        entry_discard(set, &set->e[i]);
    set->n = 0;
    return rc;
}
