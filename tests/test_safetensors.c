/*
 * test_safetensors.c - the .safetensors reader and writer: round trips, files written
 * by the safetensors library, and the refusal of malformed files (never a crash or a
 * read past the buffer; CI runs this program under AddressSanitizer too).
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "io_test_util.h"
#include "compat_files.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "test_safetensors"

static const char *tmp(const char *name) { return io_tmp(PROG, name); }

static const char *data(const char *name) { return io_data(name); }

static void test_round_trip(void)
{
    TEST("tensors saved by attn_safetensors_save (float32 1-D to 4-D, int64, int32, bool, "
         "a strided view, names with quotes, backslashes, newlines and UTF-8) load back "
         "with their names, dtypes, shapes and values");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float f[2 * 3 * 4 * 5];
    for (int i = 0; i < 120; i++)
        f[i] = (float)i * 0.5f - 7.0f;
    int64_t ids[6] = {5, -1, INT64_MAX, 0, 3, 2};
    int32_t i32[3] = {INT32_MIN, 0, 9};
    uint8_t m[4] = {1, 0, 1, 1};
    attn_tensor t[7];
    const int64_t s4[4] = {2, 3, 4, 5}, s2[2] = {2, 3}, s1[1] = {3}, sm[2] = {2, 2};
    attn_tensor_init(&ctx, &t[0], ATTN_DTYPE_F32, f, 4, s4);
    attn_tensor_init(&ctx, &t[1], ATTN_DTYPE_F32, f, 1, s1);
    attn_tensor_init(&ctx, &t[2], ATTN_DTYPE_I64, ids, 2, s2);
    attn_tensor_init(&ctx, &t[3], ATTN_DTYPE_I32, i32, 1, s1);
    attn_tensor_init(&ctx, &t[4], ATTN_DTYPE_BOOL, m, 2, sm);
    attn_tensor base;
    attn_tensor_init(&ctx, &base, ATTN_DTYPE_F32, f, 2, s2);
    attn_tensor_transpose(&ctx, &base, 0, 1, &t[5]); /* (3, 2), strided */
    attn_tensor_init(&ctx, &t[6], ATTN_DTYPE_F32, f + 7, 1, s1);
    const char *names[7] = {"layers.0.attn.qkv.weight", "b", "token \"ids\"", "back\\slash",
                            "line\nbreak", "transposed", "caf\xc3\xa9 \xe2\x88\x9a"};
    CHECK_INT(attn_safetensors_save(&ctx, tmp("rt.safetensors"), names, t, 7), 0);

    attn_safetensors *st = NULL;
    int rc = attn_safetensors_open(&ctx, tmp("rt.safetensors"), &st);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s\n", ctx.message);
        return;
    }
    CHECK_INT(attn_safetensors_count(st), 7);
    for (int i = 0; i < 7; i++) {
        CHECK(attn_safetensors_has(st, names[i]));
        CHECK_STR_EQ(attn_safetensors_name(st, i), names[i]); /* data in the order given */
        attn_array a;
        CHECK_INT(attn_safetensors_get(&ctx, st, names[i], &a), 0);
        if (!a.buffer)
            continue;
        CHECK_INT(a.tensor.dtype, t[i].dtype);
        CHECK_INT(a.tensor.ndim, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            CHECK_INT(a.tensor.shape[d], t[i].shape[d]);
        /* Compare through a contiguous copy of the original (t[5] is strided). */
        attn_tensor c;
        attn_tensor_alloc(&ctx, &c, t[i].dtype, t[i].ndim, t[i].shape);
        attn_tensor_copy(&ctx, &t[i], &c);
        size_t bytes = (size_t)attn_tensor_numel(&c) * attn_dtype_size(c.dtype);
        CHECK(memcmp(a.tensor.data, c.data, bytes) == 0);
        attn_tensor_free(&ctx, &c);
        attn_array_free(&ctx, &a);
    }
    CHECK(!attn_safetensors_has(st, "missing"));
    CHECK(attn_safetensors_name(st, 7) == NULL);
    attn_array a;
    CHECK_INT(attn_safetensors_get(&ctx, st, "missing", &a), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "no tensor named 'missing'");
    attn_safetensors_close(&ctx, st);

    TEST("the saved header is padded with spaces to a multiple of 8 bytes and its length "
         "field matches it");
    size_t n;
    unsigned char *b = io_read(tmp("rt.safetensors"), &n);
    CHECK(b != NULL);
    if (b) {
        uint64_t h = io_le64(b);
        CHECK_INT(h % 8, 0);
        CHECK(h + 8 <= n);
        CHECK_INT(b[8], '{');
        free(b);
    }
}

/* Checks that tensor `name` of a file equals the float32 values of an .npy file. */
static void same_as_npy(attn_safetensors *st, const char *name, const char *npy)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a, b;
    int ra = attn_safetensors_get(&ctx, st, name, &a);
    if (ra)
        fprintf(stderr, "  %s\n", ctx.message);
    int rb = attn_npy_load(&ctx, data(npy), &b);
    CHECK_INT(ra, 0);
    CHECK_INT(rb, 0);
    if (ra || rb)
        return;
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
    CHECK_INT(a.tensor.ndim, b.tensor.ndim);
    int64_t n = attn_tensor_numel(&b.tensor);
    CHECK_INT(attn_tensor_numel(&a.tensor), n);
    CHECK(memcmp(a.tensor.data, b.tensor.data, (size_t)n * 4) == 0);
    attn_array_free(&ctx, &a);
    attn_array_free(&ctx, &b);
}

static void test_library_files(void)
{
    TEST("a file written by the safetensors library (with __metadata__) opens; F32, F16, "
         "F64 and BF16 tensors load as numpy's float32 conversion, bit for bit");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_safetensors *st = NULL;
    int rc = attn_safetensors_open(&ctx, data("files/ref_lib.safetensors"), &st);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s\n", ctx.message);
        return;
    }
    CHECK_INT(attn_safetensors_count(st), 10);
    same_as_npy(st, "w32", "files/ref_lib_w32.npy");
    same_as_npy(st, "w16", "files/ref_lib_w16.npy");
    same_as_npy(st, "w64", "files/ref_lib_w64.npy");

    TEST("int64 ids keep their dtype; BOOL and U8 load as bool");
    attn_array a;
    CHECK_INT(attn_safetensors_get(&ctx, st, "ids", &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_I64);
    for (int i = 0; i < 6 && a.buffer; i++)
        CHECK_INT(((int64_t *)a.tensor.data)[i], i);
    attn_array_free(&ctx, &a);
    CHECK_INT(attn_safetensors_get(&ctx, st, "mask", &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BOOL);
    CHECK_INT(a.tensor.ndim, 4);
    for (int i = 0; i < 3 && a.buffer; i++)
        for (int j = 0; j < 3; j++)
            CHECK_INT(((uint8_t *)a.tensor.data)[i * 3 + j], j <= i);
    attn_array_free(&ctx, &a);
    CHECK_INT(attn_safetensors_get(&ctx, st, "u8", &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BOOL);
    attn_array_free(&ctx, &a);

    TEST("a tensor attn cannot use (I8, 5-D, a scalar, an empty one) is refused by name "
         "when asked for, without spoiling the rest of the file");
    CHECK_INT(attn_safetensors_get(&ctx, st, "i8", &a), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "'i8' has dtype I8");
    CHECK_INT(attn_safetensors_get(&ctx, st, "five", &a), ATTN_STATUS_UNSUPPORTED);
    CHECK_STR_CONTAINS(ctx.message, "'five' has 5 dimensions");
    CHECK_INT(attn_safetensors_get(&ctx, st, "scalar", &a), ATTN_STATUS_UNSUPPORTED);
    CHECK_STR_CONTAINS(ctx.message, "'scalar' has 0 dimensions");
    CHECK_INT(attn_safetensors_get(&ctx, st, "empty", &a), ATTN_STATUS_UNSUPPORTED);
    CHECK_STR_CONTAINS(ctx.message, "'empty' is empty");
    CHECK(a.buffer == NULL);
    same_as_npy(st, "w32", "files/ref_lib_w32.npy");
    attn_safetensors_close(&ctx, st);

    rc = attn_safetensors_open(&ctx, data("files/ref_bf16.safetensors"), &st);
    CHECK_INT(rc, 0);
    if (!rc) {
        same_as_npy(st, "x", "files/ref_bf16_as_f32.npy");
        attn_safetensors_close(&ctx, st);
    }
}

static void test_manifest(void)
{
    TEST("every malformed .safetensors in tests/data/files/MANIFEST (truncated, header "
         "length 2^64-1, offsets out of range, overlapping, a gap, unknown dtype, "
         "overflowing shape, ...) is refused at open with a message naming the file and "
         "the problem");
    FILE *f = fopen(data("files/MANIFEST"), "r");
    CHECK(f != NULL);
    if (!f)
        return;
    char line[512];
    int count = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = '\0';
        if (!strstr(line, ".safetensors"))
            continue;
        char name[600];
        snprintf(name, sizeof(name), "files/%s", line);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_safetensors *st = (attn_safetensors *)&ctx; /* must be reset to NULL */
        int rc = attn_safetensors_open(&ctx, data(name), &st);
        CHECK(rc != 0);
        CHECK(st == NULL);
        CHECK_STR_CONTAINS(ctx.message, line);
        CHECK_STR_CONTAINS(ctx.message, tab + 1);
        CHECK(strchr(ctx.message, '\n') == NULL);
        count++;
    }
    fclose(f);
    CHECK(count >= 15);
}

static void test_save_errors(void)
{
    TEST("a save with a duplicate, empty or reserved name is refused and writes nothing");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float v[2] = {1, 2};
    attn_tensor t[2];
    const int64_t s[1] = {2};
    attn_tensor_init(&ctx, &t[0], ATTN_DTYPE_F32, v, 1, s);
    t[1] = t[0];
    const char *dup[2] = {"a", "a"}, *empty[2] = {"a", ""}, *meta[2] = {"__metadata__", "b"};
    CHECK_INT(attn_safetensors_save(&ctx, tmp("e.safetensors"), dup, t, 2),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "'a' is given twice");
    CHECK_INT(attn_safetensors_save(&ctx, tmp("e.safetensors"), empty, t, 2),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_safetensors_save(&ctx, tmp("e.safetensors"), meta, t, 2),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK(!io_exists(tmp("e.safetensors")));

    TEST("a save with a name that is not valid UTF-8 (a lone byte, an overlong form, an "
         "encoded surrogate, a cut sequence) is refused, since Python's safetensors "
         "would refuse the file, and writes nothing");
    const char *bad_utf8[4] = {"w\xff", "a\xc0\xaf" "b", "\xed\xa0\x80", "caf\xc3"};
    for (int k = 0; k < 4; k++) {
        const char *nm[2] = {"ok", bad_utf8[k]};
        CHECK_INT(attn_safetensors_save(&ctx, tmp("e.safetensors"), nm, t, 2),
                  ATTN_STATUS_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(ctx.message, "is not valid UTF-8");
        CHECK_STR_CONTAINS(ctx.message, "tensor 1");
        CHECK(strchr(ctx.message, '\n') == NULL);
    }
    CHECK(!io_exists(tmp("e.safetensors")));

    TEST("an empty file (no tensors) round-trips");
    CHECK_INT(attn_safetensors_save(&ctx, tmp("none.safetensors"), NULL, NULL, 0), 0);
    attn_safetensors *st = NULL;
    CHECK_INT(attn_safetensors_open(&ctx, tmp("none.safetensors"), &st), 0);
    CHECK_INT(attn_safetensors_count(st), 0);
    attn_safetensors_close(&ctx, st);
}

static void test_python_files(void)
{
    TEST("every tensor that Python's safetensors wrote (tests/data/compat/EXPECTED: F32, "
         "F16, BF16, F64, I32, I64, BOOL, U8, metadata, UTF-8 names) loads with the "
         "values Python reads, bit for bit, and file_dtype names the file's dtype");
    int n = compat_check_expected("st");
    CHECK(n >= 9);

    TEST("each edge case of the format in tests/data/compat/VERDICTS (\"__metadata__\": "
         "null, non-string metadata, names that are not UTF-8, leading zeros, ...) is "
         "accepted or refused as Python's safetensors does, but for the differences "
         "stated there");
    n = compat_check_verdicts("st");
    CHECK(n >= 20);

    TEST("a U8 tensor loads as bool and is still called uint8; BF16 is bfloat16");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_safetensors *st = NULL;
    CHECK_INT(attn_safetensors_open(&ctx, data("compat/st_numpy.safetensors"), &st), 0);
    attn_array a;
    CHECK_INT(attn_safetensors_get(&ctx, st, "u8", &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BOOL);
    CHECK_STR_EQ(a.file_dtype ? a.file_dtype : "(null)", "uint8");
    attn_array_free(&ctx, &a);
    CHECK(a.file_dtype == NULL);
    attn_safetensors_close(&ctx, st);
}

static void test_out_of_memory(void)
{
    TEST("an allocation failure at any point of open, get or save returns NO_MEMORY and "
         "frees everything it took");
    int done = 0;
    for (long k = 1; k < 200 && !done; k++) {
        attn_ctx ctx;
        io_failing_alloc fa;
        io_fa_ctx(&ctx, &fa, k);
        attn_safetensors *st = NULL;
        int rc = attn_safetensors_open(&ctx, data("files/ref_lib.safetensors"), &st);
        if (rc == 0) {
            attn_array a;
            rc = attn_safetensors_get(&ctx, st, "w16", &a);
            if (rc == 0) {
                done = 1;
                attn_array_free(&ctx, &a);
            }
            attn_safetensors_close(&ctx, st);
        }
        if (!done)
            CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
        CHECK_INT(fa.live, 0);
    }
    CHECK(done);
    float v[3] = {1, 2, 3};
    attn_tensor t;
    const int64_t s[1] = {3};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, v, 1, s);
    const char *names[1] = {"v"};
    done = 0;
    for (long k = 1; k < 20 && !done; k++) {
        attn_ctx ctx;
        io_failing_alloc fa;
        io_fa_ctx(&ctx, &fa, k);
        int rc = attn_safetensors_save(&ctx, tmp("oom.safetensors"), names, &t, 1);
        if (rc == 0)
            done = 1;
        else
            CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
        CHECK_INT(fa.live, 0);
    }
    CHECK(done);
}

static int no_temp_files_left(void) { return io_no_temp_files(PROG); }

static void test_mutations(void)
{
    TEST("3000 random mutations of valid files are each opened and read or refused with "
         "a message, never a crash or an out-of-bounds read");
    const char *seeds[3] = {"files/ref_lib.safetensors", "files/ref_st.safetensors",
                            "files/ref_bf16.safetensors"};
    uint64_t s = 0xabcdef12345ull;
    int opened = 0, refused = 0;
    for (int f = 0; f < 3; f++) {
        size_t n;
        unsigned char *orig = io_read(data(seeds[f]), &n);
        CHECK(orig != NULL);
        if (!orig)
            continue;
        unsigned char *b = malloc(n);
        for (int it = 0; it < 1000; it++) {
            memcpy(b, orig, n);
            size_t m = n;
            int muts = 1 + (int)(io_next(&s) % 3);
            for (int k = 0; k < muts; k++)
                m = io_mutate(b, m, &s);
            io_write(tmp("mut.safetensors"), b, m);
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            attn_safetensors *st = NULL;
            int rc = attn_safetensors_open(&ctx, tmp("mut.safetensors"), &st);
            if (rc) {
                refused++;
                if (!strstr(ctx.message, "mut.safetensors"))
                    CHECK_STR_CONTAINS(ctx.message, "mut.safetensors");
                CHECK(st == NULL);
                continue;
            }
            opened++;
            for (int64_t i = 0; i < attn_safetensors_count(st); i++) {
                attn_array a;
                if (attn_safetensors_get(&ctx, st, attn_safetensors_name(st, i), &a) == 0)
                    attn_array_free(&ctx, &a);
            }
            attn_safetensors_close(&ctx, st);
        }
        free(b);
        free(orig);
    }
    fprintf(stderr, "   (%d opened, %d refused)\n", opened, refused);
    CHECK(refused > 0);
    CHECK(opened > 0);
    CHECK(no_temp_files_left());
}

int main(void)
{
    test_round_trip();
    test_library_files();
    test_manifest();
    test_save_errors();
    test_python_files();
    test_out_of_memory();
    test_mutations();
    return check_summary(PROG);
}
