/*
 * test_oom_libc.c - out of memory inside the C library. The readers and writers
 * take a stdio stream with fdopen(), and an output through a symbolic link is
 * resolved with realpath(); both allocate with malloc, not through attn_allocator,
 * and fail with errno ENOMEM when it does. That is out of memory, not a bad file:
 * the call must say ATTN_STATUS_NO_MEMORY (a program may retry it later, which an
 * IO error does not invite), leave the target untouched and no temporary behind.
 *
 * The two functions are wrapped at link time (-Wl,--wrap=fdopen,--wrap=realpath,
 * tests/CMakeLists.txt): the library's objects, linked into this program from
 * libattn.a, call the wrappers, which fail while `failing` is set.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failing; /* 1: fdopen and realpath fail with ENOMEM */

FILE *__real_fdopen(int fd, const char *mode);
char *__real_realpath(const char *path, char *resolved);
FILE *__wrap_fdopen(int fd, const char *mode);
char *__wrap_realpath(const char *path, char *resolved);

FILE *__wrap_fdopen(int fd, const char *mode)
{
    if (failing) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_fdopen(fd, mode);
}

char *__wrap_realpath(const char *path, char *resolved)
{
    if (failing) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realpath(path, resolved);
}

static char dir_[512];

static const char *path(const char *name)
{
    static char buf[4][600];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir_, name);
    return p;
}

/* Files in the test folder whose name starts with stem (the output itself or a
 * temporary of it). */
static int files_named(const char *stem)
{
    int n = 0;
    DIR *d = opendir(dir_);
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, stem, strlen(stem)) == 0;
    closedir(d);
    return n;
}

/* rc must be NO_MEMORY with a message saying so. */
static void expect_no_memory(const char *what, int rc, const attn_ctx *ctx)
{
    if (rc != ATTN_STATUS_NO_MEMORY)
        fprintf(stderr, "  %s: %s: %s\n", what, attn_status_name(rc), ctx->message);
    CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
    CHECK_STR_CONTAINS(ctx->message, "out of memory");
}

int main(void)
{
    snprintf(dir_, sizeof dir_, "%s", ATTN_TEST_TMP_DIR);
    float data[2 * 3];
    for (int i = 0; i < 6; i++)
        data[i] = (float)i;
    const int64_t shape[2] = {2, 3};
    attn_tensor t;
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, 2, shape);
    const char *names[1] = {"x"};
    const char *npy = path("oomlibc_in.npy"), *st = path("oomlibc_in.safetensors");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_npy_save(&ctx, npy, &t), ATTN_OK);
    CHECK_INT(attn_safetensors_save(&ctx, st, names, &t, 1), ATTN_OK);

    TEST("a reader whose stream cannot be allocated (fdopen: ENOMEM) fails with NO_MEMORY");
    failing = 1;
    attn_array a;
    expect_no_memory("attn_npy_load", attn_npy_load(&ctx, npy, &a), &ctx);
    attn_safetensors *sf = NULL;
    expect_no_memory("attn_safetensors_open", attn_safetensors_open(&ctx, st, &sf), &ctx);
    CHECK(sf == NULL);
    attn_mha_weights w;
    expect_no_memory("attn_weights_load", attn_weights_load(&ctx, st, NULL, 1, &w), &ctx);
    failing = 0;
    CHECK_INT(attn_npy_load(&ctx, npy, &a), ATTN_OK);
    attn_array_free(&ctx, &a);

    TEST("a writer whose stream cannot be allocated fails with NO_MEMORY, leaves the old "
         "file as it was and no temporary behind");
    const char *out = path("oomlibc_out.npy");
    float old[6] = {9, 9, 9, 9, 9, 9};
    attn_tensor t_old = t;
    t_old.data = old;
    CHECK_INT(attn_npy_save(&ctx, out, &t_old), ATTN_OK);
    failing = 1;
    expect_no_memory("attn_npy_save", attn_npy_save(&ctx, out, &t), &ctx);
    expect_no_memory("attn_safetensors_save",
                     attn_safetensors_save(&ctx, path("oomlibc_out.safetensors"), names, &t, 1),
                     &ctx);
    attn_output_set *set = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &set), ATTN_OK);
    expect_no_memory("attn_output_set_add_npy", attn_output_set_add_npy(&ctx, set, out, &t),
                     &ctx);
    attn_output_set_free(&ctx, set);
    failing = 0;
    CHECK_INT(files_named("oomlibc_out.npy"), 1); /* the old file, no temporary */
    CHECK_INT(files_named("oomlibc_out.safetensors"), 0);
    CHECK_INT(attn_npy_load(&ctx, out, &a), ATTN_OK);
    CHECK(a.tensor.data && memcmp(a.tensor.data, old, sizeof old) == 0);
    attn_array_free(&ctx, &a);

    TEST("an output through a symbolic link that cannot be resolved for want of memory "
         "(realpath: ENOMEM) fails with NO_MEMORY and leaves the file it names as it was");
    const char *link = path("oomlibc_link.npy");
    unlink(link);
    CHECK_INT(symlink(out, link), 0);
    failing = 1;
    expect_no_memory("attn_npy_save through a link", attn_npy_save(&ctx, link, &t), &ctx);
    failing = 0;
    CHECK_INT(attn_npy_load(&ctx, out, &a), ATTN_OK);
    CHECK(a.tensor.data && memcmp(a.tensor.data, old, sizeof old) == 0);
    attn_array_free(&ctx, &a);
    CHECK_INT(files_named("oomlibc_out.npy"), 1);
    CHECK_INT(attn_npy_save(&ctx, link, &t), ATTN_OK); /* and works once memory is back */

    unlink(link);
    unlink(out);
    unlink(npy);
    unlink(st);
    return check_summary("test_oom_libc");
}
