/*
 * test_output.c - the output set (include/attn.h, "Output sets") through the
 * library's API: what is on disk before and after each step of a set's life, the
 * temporary names, the removal of temporaries for a signal handler, the message of
 * the remaining window (a rename failing after another succeeded) and an
 * out-of-memory sweep. tests/test_output_cli.sh tries the same guarantee through the
 * programs; tests/test_output_threads.c under ThreadSanitizer.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "io_test_util.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define P(name) io_tmp("test_output_lib", name)

/* The names in the test folder that start with "test_output_lib_<stem>" and hold
 * ".tmp.": the temporary files of that output. Returns how many; the first is
 * copied to first (when not NULL). */
static int temporaries(const char *stem, char *first, size_t cap)
{
    DIR *d = opendir(ATTN_TEST_TMP_DIR);
    if (!d)
        return -1;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "test_output_lib_%s", stem);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".tmp.")) {
            if (n == 0 && first)
                snprintf(first, cap, "%s/%s", ATTN_TEST_TMP_DIR, e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static int file_equals(const char *path, const char *text)
{
    size_t n;
    unsigned char *b = io_read(path, &n);
    int same = b && n == strlen(text) && memcmp(b, text, n) == 0;
    free(b);
    return same;
}

static attn_tensor small_tensor(float *buf)
{
    attn_tensor t;
    const int64_t shape[2] = {2, 3};
    for (int i = 0; i < 6; i++)
        buf[i] = (float)i + 0.5f;
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, buf, 2, shape);
    return t;
}

static void test_nothing_before_commit(void)
{
    TEST("until the commit only temporary files exist, named 'NAME.tmp.' plus 12 random "
         "letters, and the targets are untouched; the commit puts every file in place "
         "and leaves no temporary file");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    io_write(P("a.npy"), "old a", 5);
    remove(P("b.safetensors"));
    remove(P("c.svg"));
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_output_set *s = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &s), ATTN_OK);
    const char *names[1] = {"t"};
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("a.npy"), &t), ATTN_OK);
    CHECK_INT(attn_output_set_add_safetensors(&ctx, s, P("b.safetensors"), names, &t, 1), ATTN_OK);
    CHECK_INT(attn_output_set_add_bytes(&ctx, s, P("c.svg"), "<svg/>", 6), ATTN_OK);
    char first[1024] = "";
    CHECK_INT(temporaries("a.npy.tmp.", first, sizeof first), 1);
    const char *tail = strstr(first, ".tmp.");
    CHECK_INT(tail ? (long long)strlen(tail + 5) : -1, 12);
    CHECK_INT(temporaries("b.safetensors.tmp.", NULL, 0), 1);
    CHECK_INT(temporaries("c.svg.tmp.", NULL, 0), 1);
    CHECK(file_equals(P("a.npy"), "old a"));
    CHECK(!io_exists(P("b.safetensors")));
    CHECK(!io_exists(P("c.svg")));
    CHECK_INT(attn_output_set_commit(&ctx, s), ATTN_OK);
    attn_output_set_free(&ctx, s);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, P("a.npy"), &a), ATTN_OK);
    if (a.buffer) {
        CHECK_INT(a.tensor.shape[1], 3);
        CHECK_NEAR(((float *)a.tensor.data)[5], 5.5f, 0, 0);
        attn_array_free(&ctx, &a);
    }
    CHECK(file_equals(P("c.svg"), "<svg/>"));
    CHECK_INT(temporaries("", NULL, 0), 0);
}

static void test_failed_add_changes_nothing(void)
{
    TEST("a set whose later add fails (a directory as the target) changes no output: "
         "commit refuses, free removes the temporary files, the old file stays");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    io_write(P("keep.npy"), "old keep", 8);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_output_set *s = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &s), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("keep.npy"), &t), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, ATTN_TEST_TMP_DIR, &t), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "is a directory");
    CHECK_INT(attn_output_set_commit(&ctx, s), ATTN_STATUS_INVALID_ARGUMENT);
    attn_output_set_free(&ctx, s);
    CHECK(file_equals(P("keep.npy"), "old keep"));
    CHECK_INT(temporaries("", NULL, 0), 0);
}

static void test_modes_and_devices(void)
{
    TEST("a 0600 file replaced stays 0600; /dev/null in a set is written and stays a "
         "device; /dev/full fails with 'No space left on device' and the set's regular "
         "file keeps its old contents");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    io_write(P("private.npy"), "secret", 6);
    chmod(P("private.npy"), 0600);
    CHECK_INT(attn_npy_save(NULL, P("private.npy"), &t), ATTN_OK);
    struct stat st;
    CHECK_INT(stat(P("private.npy"), &st), 0);
    CHECK_INT(st.st_mode & 0777, 0600);

    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_npy_save(&ctx, "/dev/null", &t), ATTN_OK);
    CHECK_INT(stat("/dev/null", &st), 0);
    CHECK(S_ISCHR(st.st_mode));

    io_write(P("keep2.npy"), "old keep2", 9);
    attn_output_set *s = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &s), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("keep2.npy"), &t), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, "/dev/full", &t), ATTN_OK);
    CHECK_INT(attn_output_set_commit(&ctx, s), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "/dev/full: cannot write: No space left on device");
    attn_output_set_free(&ctx, s);
    CHECK(file_equals(P("keep2.npy"), "old keep2"));
    CHECK_INT(temporaries("", NULL, 0), 0);
}

static void test_remove_temporaries(void)
{
    TEST("attn_output_remove_temporaries (what a signal handler calls) unlinks the "
         "temporary files of an open set; its commit then fails naming the output and "
         "changes no file");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    io_write(P("sig.npy"), "old sig", 7);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_output_set *s = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &s), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("sig.npy"), &t), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("sig2.npy"), &t), ATTN_OK);
    CHECK_INT(temporaries("sig", NULL, 0), 2);
    attn_output_remove_temporaries();
    CHECK_INT(temporaries("sig", NULL, 0), 0);
    CHECK_INT(attn_output_set_commit(&ctx, s), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "sig.npy: cannot put the new file in place");
    CHECK_STR_CONTAINS(ctx.message, "no output was changed");
    attn_output_set_free(&ctx, s);
    CHECK(file_equals(P("sig.npy"), "old sig"));
    CHECK(!io_exists(P("sig2.npy")));
}

static void test_remaining_window(void)
{
    TEST("the remaining window: when a rename fails after another succeeded, the "
         "message names the output that failed and the one already replaced, and no "
         "temporary file is left");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    io_write(P("win1.npy"), "old 1", 5);
    io_write(P("win2.npy"), "old 2", 5);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_output_set *s = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &s), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("win1.npy"), &t), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, s, P("win2.npy"), &t), ATTN_OK);
    /* The second rename is made to fail by taking its temporary file away, as a
     * directory removed in that instant would. */
    char tmp2[1024] = "";
    CHECK_INT(temporaries("win2.npy.tmp.", tmp2, sizeof tmp2), 1);
    CHECK_INT(unlink(tmp2), 0);
    CHECK_INT(attn_output_set_commit(&ctx, s), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "win2.npy: cannot put the new file in place");
    CHECK_STR_CONTAINS(ctx.message, "1 output(s) of this run were already replaced");
    CHECK_STR_CONTAINS(ctx.message, "win1.npy");
    attn_output_set_free(&ctx, s);
    CHECK(!file_equals(P("win1.npy"), "old 1"));
    CHECK(file_equals(P("win2.npy"), "old 2"));
    CHECK_INT(temporaries("", NULL, 0), 0);
}

static void test_long_names(void)
{
    TEST("names of 245 to 255 characters are written and replaced (the temporary name is "
         "shortened to fit NAME_MAX); 256 fails with a message naming the file");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    const int lens[4] = {245, 250, 255, 256};
    for (int k = 0; k < 4; k++) {
        char base[300], path[1400];
        int stem = (int)strlen("test_output_lib_");
        memset(base, 'n', sizeof base);
        memcpy(base, "test_output_lib_", (size_t)stem);
        base[lens[k]] = '\0';
        snprintf(path, sizeof path, "%s/%s", ATTN_TEST_TMP_DIR, base);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        int want = lens[k] <= 255 ? ATTN_OK : ATTN_STATUS_IO;
        CHECK_INT(attn_npy_save(&ctx, path, &t), want);
        CHECK_INT(attn_npy_save(&ctx, path, &t), want);
        if (want != ATTN_OK)
            CHECK_STR_CONTAINS(ctx.message, "nnnn");
        remove(path);
    }
    CHECK_INT(temporaries("", NULL, 0), 0);
}

static int set_of_three(attn_ctx *ctx, const attn_tensor *t)
{
    const char *names[1] = {"t"};
    attn_output_set *s = NULL;
    int rc = attn_output_set_create(ctx, &s);
    if (rc)
        return rc;
    rc = attn_output_set_add_npy(ctx, s, P("oom_a.npy"), t);
    if (!rc)
        rc = attn_output_set_add_safetensors(ctx, s, P("oom_b.safetensors"), names, t, 1);
    if (!rc)
        rc = attn_output_set_add_npy(ctx, s, "/dev/null", t);
    if (!rc)
        rc = attn_output_set_commit(ctx, s);
    attn_output_set_free(ctx, s);
    return rc;
}

static void test_out_of_memory(void)
{
    TEST("out of memory at every allocation of a three-output set (file, file, device): "
         "NO_MEMORY, no output changed, no temporary file, nothing leaked; then success");
    float buf[6];
    attn_tensor t = small_tensor(buf);
    int n;
    for (n = 1; n < 200; n++) {
        io_write(P("oom_a.npy"), "old", 3);
        remove(P("oom_b.safetensors"));
        attn_ctx ctx;
        io_failing_alloc fa;
        io_fa_ctx(&ctx, &fa, n);
        int rc = set_of_three(&ctx, &t);
        CHECK_INT(fa.live, 0);
        if (rc == ATTN_OK)
            break;
        CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
        CHECK(file_equals(P("oom_a.npy"), "old"));
        CHECK(!io_exists(P("oom_b.safetensors")));
        CHECK_INT(temporaries("", NULL, 0), 0);
    }
    CHECK(n > 3);
    CHECK(n < 200);
    CHECK(!file_equals(P("oom_a.npy"), "old"));
    CHECK(io_exists(P("oom_b.safetensors")));
    fprintf(stderr, "   %d allocations made to fail\n", n - 1);
}

int main(void)
{
    test_nothing_before_commit();
    test_failed_add_changes_nothing();
    test_modes_and_devices();
    test_remove_temporaries();
    test_remaining_window();
    test_long_names();
    test_out_of_memory();
    return check_summary("test_output");
}
