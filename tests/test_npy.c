/*
 * test_npy.c - the .npy reader and writer: round trips, what numpy writes, and the
 * refusal of malformed files (never a crash or a read past the buffer; CI runs this
 * program under AddressSanitizer too, see tests/asan_parsers.sh).
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

#define PROG "test_npy"

static const char *tmp(const char *name) { return io_tmp(PROG, name); }

static const char *data(const char *name) { return io_data(name); }

static int bits_equal(float a, float b)
{
    return memcmp(&a, &b, sizeof(float)) == 0;
}

static void test_round_trip_f32(void)
{
    TEST("a float32 array of 1 to 4 dimensions saved by attn_npy_save loads back bit for "
         "bit, with its shape");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float vals[2 * 3 * 5 * 7];
    for (int i = 0; i < 2 * 3 * 5 * 7; i++)
        vals[i] = (float)sin(i * 0.37) * 1e3f / (float)(i + 1);
    vals[3] = -0.0f;
    vals[4] = INFINITY;
    const int64_t shape[4] = {2, 3, 5, 7};
    for (int nd = 1; nd <= 4; nd++) {
        attn_tensor t;
        CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, vals, nd, shape + 4 - nd), 0);
        CHECK_INT(attn_npy_save(&ctx, tmp("rt.npy"), &t), 0);
        attn_array a;
        CHECK_INT(attn_npy_load(&ctx, tmp("rt.npy"), &a), 0);
        CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
        CHECK_INT(a.tensor.ndim, nd);
        for (int d = 0; d < nd; d++)
            CHECK_INT(a.tensor.shape[d], shape[4 - nd + d]);
        int64_t n = attn_tensor_numel(&t);
        int same = 1;
        for (int64_t i = 0; i < n; i++)
            same &= bits_equal(((float *)a.tensor.data)[i], vals[i]);
        CHECK(same);
        attn_array_free(&ctx, &a);
        CHECK(a.buffer == NULL);
    }
}

static void test_round_trip_ints(void)
{
    TEST("int64, int32 and bool arrays round-trip with their dtype and values");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int64_t i64[6] = {0, -1, INT64_MAX, INT64_MIN, 42, 7};
    int32_t i32[6] = {0, -1, INT32_MAX, INT32_MIN, 42, 7};
    uint8_t b[6] = {1, 0, 0, 1, 1, 0};
    const int64_t shape[2] = {2, 3};
    struct {
        attn_dtype dt;
        void *p;
        size_t es;
    } cases[3] = {{ATTN_DTYPE_I64, i64, 8}, {ATTN_DTYPE_I32, i32, 4}, {ATTN_DTYPE_BOOL, b, 1}};
    for (int c = 0; c < 3; c++) {
        attn_tensor t;
        attn_tensor_init(&ctx, &t, cases[c].dt, cases[c].p, 2, shape);
        CHECK_INT(attn_npy_save(&ctx, tmp("ints.npy"), &t), 0);
        attn_array a;
        CHECK_INT(attn_npy_load(&ctx, tmp("ints.npy"), &a), 0);
        CHECK_INT(a.tensor.dtype, cases[c].dt);
        CHECK(a.buffer && memcmp(a.tensor.data, cases[c].p, 6 * cases[c].es) == 0);
        attn_array_free(&ctx, &a);
    }
}

static void test_strided_save(void)
{
    TEST("a transposed view (strided, not contiguous) is saved in C order of the view");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i;
    attn_tensor t, tt;
    const int64_t shape[2] = {3, 4};
    attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, v, 2, shape);
    CHECK_INT(attn_tensor_transpose(&ctx, &t, 0, 1, &tt), 0);
    CHECK_INT(attn_npy_save(&ctx, tmp("tr.npy"), &tt), 0);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, tmp("tr.npy"), &a), 0);
    CHECK_INT(a.tensor.shape[0], 4);
    CHECK_INT(a.tensor.shape[1], 3);
    const float *p = a.tensor.data;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            CHECK_NEAR(p[i * 3 + j], v[j * 4 + i], 0, 0);
    attn_array_free(&ctx, &a);
}

static void test_header_layout(void)
{
    TEST("the saved header is numpy's: version 1.0, the dict numpy writes, data aligned "
         "to 64 bytes, a newline before the data");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float v[6] = {0};
    attn_tensor t;
    const int64_t shape[2] = {2, 3};
    attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, v, 2, shape);
    CHECK_INT(attn_npy_save(&ctx, tmp("hdr.npy"), &t), 0);
    size_t n;
    unsigned char *b = io_read(tmp("hdr.npy"), &n);
    CHECK(b != NULL);
    if (!b)
        return;
    CHECK(memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
    size_t hlen = (size_t)b[8] | ((size_t)b[9] << 8);
    CHECK_INT((10 + hlen) % 64, 0);
    CHECK_INT(n, 10 + hlen + 6 * 4);
    CHECK_INT(b[10 + hlen - 1], '\n');
    char text[256] = {0};
    memcpy(text, b + 10, hlen < 255 ? hlen : 255);
    CHECK_STR_CONTAINS(text, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    free(b);
}

/* Loads two files and checks they hold the same float32 values, bit for bit. */
static void same_floats(const char *a_name, const char *b_name)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a, b;
    int ra = attn_npy_load(&ctx, data(a_name), &a);
    if (ra)
        fprintf(stderr, "  %s\n", ctx.message);
    int rb = attn_npy_load(&ctx, data(b_name), &b);
    CHECK_INT(ra, 0);
    CHECK_INT(rb, 0);
    if (ra || rb)
        return;
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_F32);
    CHECK_INT(a.tensor.ndim, b.tensor.ndim);
    for (int d = 0; d < a.tensor.ndim; d++)
        CHECK_INT(a.tensor.shape[d], b.tensor.shape[d]);
    int64_t n = attn_tensor_numel(&a.tensor);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = ((float *)a.tensor.data)[i], y = ((float *)b.tensor.data)[i];
        if (!bits_equal(x, y)) {
            if (bad++ < 3)
                fprintf(stderr, "  %s[%lld] = %.9g but %s has %.9g\n", a_name, (long long)i,
                        x, b_name, y);
        }
    }
    CHECK_INT(bad, 0);
    attn_array_free(&ctx, &a);
    attn_array_free(&ctx, &b);
}

static void test_numpy_files(void)
{
    TEST("float64 and float16 files written by numpy load as numpy's own conversion to "
         "float32 (bit for bit, including -0, inf and subnormal halves)");
    same_floats("files/ref_f64.npy", "files/ref_f64_as_f32.npy");
    same_floats("files/ref_f16.npy", "files/ref_f16_as_f32.npy");

    TEST("big-endian, Fortran-order and version 2.0 files load to the same values as the "
         "C-order little-endian file");
    same_floats("files/ref_be_f4.npy", "files/ref_f32.npy");
    same_floats("files/ref_fortran.npy", "files/ref_f32.npy");
    same_floats("files/ref_v2.npy", "files/ref_f32.npy");

    TEST("the reference file holds what tests/golden/make_files.py wrote: i * 0.25 - 2 in "
         "shape (2, 3, 4)");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, data("files/ref_f32.npy"), &a), 0);
    CHECK_INT(a.tensor.ndim, 3);
    CHECK_INT(a.tensor.shape[0] * 100 + a.tensor.shape[1] * 10 + a.tensor.shape[2], 234);
    for (int i = 0; i < 24 && a.buffer; i++)
        CHECK_NEAR(((float *)a.tensor.data)[i], i * 0.25 - 2.0, 0, 0);
    attn_array_free(&ctx, &a);

    TEST("int32 and int64 token ids keep their dtype; bool and uint8 masks load as bool");
    CHECK_INT(attn_npy_load(&ctx, data("files/ref_i32.npy"), &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_I32);
    for (int i = 0; i < 10 && a.buffer; i++)
        CHECK_INT(((int32_t *)a.tensor.data)[i], i - 3);
    attn_array_free(&ctx, &a);
    CHECK_INT(attn_npy_load(&ctx, data("files/ref_i64.npy"), &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_I64);
    for (int i = 0; i < 10 && a.buffer; i++)
        CHECK_INT(((int64_t *)a.tensor.data)[i], (int64_t)i * 1000000007);
    attn_array_free(&ctx, &a);
    const char *masks[2] = {"files/ref_bool.npy", "files/ref_u8.npy"};
    for (int m = 0; m < 2; m++) {
        CHECK_INT(attn_npy_load(&ctx, data(masks[m]), &a), 0);
        CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BOOL);
        for (int i = 0; i < 4 && a.buffer; i++)
            for (int j = 0; j < 4; j++)
                CHECK_INT(((uint8_t *)a.tensor.data)[i * 4 + j] != 0, j <= i);
        attn_array_free(&ctx, &a);
    }
}

static void test_manifest(void)
{
    TEST("every malformed .npy in tests/data/files/MANIFEST is refused with a message "
         "that names the file and the problem");
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
        size_t len = strlen(line);
        if (len < 4 || strcmp(line + len - 4, ".npy") != 0)
            continue;
        char name[600];
        snprintf(name, sizeof(name), "files/%s", line);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_array a;
        int rc = attn_npy_load(&ctx, data(name), &a);
        CHECK(rc != 0);
        CHECK(a.buffer == NULL);
        CHECK_STR_CONTAINS(ctx.message, line);
        CHECK_STR_CONTAINS(ctx.message, tab + 1);
        CHECK(strchr(ctx.message, '\n') == NULL);
        count++;
    }
    fclose(f);
    CHECK(count >= 15);
}

static void test_errors(void)
{
    TEST("a missing file is an IO error naming the file; a dtype attn cannot save is "
         "refused");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, tmp("does_not_exist.npy"), &a), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "does_not_exist.npy");
    CHECK_INT(attn_npy_load(&ctx, data("files/bad_dtype_complex.npy"), &a), ATTN_STATUS_DTYPE);
    CHECK_INT(attn_npy_load(&ctx, data("files/bad_truncated_data.npy"), &a),
              ATTN_STATUS_FORMAT);
    CHECK_INT(attn_npy_load(&ctx, data("files/bad_shape_overflow.npy"), &a),
              ATTN_STATUS_OVERFLOW);
}

static void test_python_files(void)
{
    TEST("every array numpy wrote (tests/data/compat/EXPECTED: float32, float64, float16, "
         "int32, int64, bool, uint8, big-endian, Fortran order, format versions 1.0, 2.0 "
         "and 3.0) loads with the values numpy reads, bit for bit, and file_dtype names "
         "numpy's dtype");
    int n = compat_check_expected("npy");
    CHECK(n >= 19);

    TEST("each edge case of the format in tests/data/compat/VERDICTS (version 1.1, "
         "leading zeros, Python 2 sizes, escapes, ...) is accepted or refused as "
         "numpy's np.load does, but for the differences stated there");
    n = compat_check_verdicts("npy");
    CHECK(n >= 12);

    TEST("a uint8 array (token ids, say) loads as bool, as masks need, and file_dtype "
         "still calls it uint8 for messages about the file");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, data("compat/np_u8_ids.npy"), &a), 0);
    CHECK_INT(a.tensor.dtype, ATTN_DTYPE_BOOL);
    CHECK_STR_EQ(a.file_dtype ? a.file_dtype : "(null)", "uint8");
    attn_array_free(&ctx, &a);
    CHECK_INT(attn_npy_load(&ctx, data("files/ref_bool.npy"), &a), 0);
    CHECK_STR_EQ(a.file_dtype ? a.file_dtype : "(null)", "bool");
    attn_array_free(&ctx, &a);
}

static void test_header_text(void)
{
    TEST("the header's text is read by Python's rules: escapes in strings decode, a "
         "1-tuple needs its comma, sizes are plain decimal, the dict ends the header");
    static const struct {
        const char *dict;
        int ok;
        const char *phrase;
    } cases[] = {
        {"{'descr': '\\x3cf4', 'fortran_order': False, 'shape': (2,), }", 1, ""},
        {"{'descr': '\\u003cf4', 'fortran_order': False, 'shape': (2,), }", 1, ""},
        {"{'descr': '\\074f4', 'fortran_order': False, 'shape': (2,), }", 1, ""},
        {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}", 1, ""},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", 0, "expected ','"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (02,)}", 0, "leading zero"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2_0,)}", 0, "plain decimal"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", 0, "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (+2,)}", 0, "without a sign"},
        {"{'descr': '<f4\n', 'fortran_order': False, 'shape': (2,)}", 0, "line break"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 0, "after the dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'descr': '<f4'}", 0,
         "given twice"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        /* A version 1.0 file: preamble, the dict padded to 64 bytes, 2 floats. */
        unsigned char file[256] = "\x93NUMPY\x01\x00";
        size_t len = strlen(cases[k].dict), hlen = (10 + len + 1 + 63) / 64 * 64 - 10;
        file[8] = (unsigned char)hlen;
        file[9] = 0;
        memset(file + 10, ' ', hlen);
        memcpy(file + 10, cases[k].dict, len);
        file[10 + hlen - 1] = '\n';
        memset(file + 10 + hlen, 0, 8);
        io_write(tmp("text.npy"), file, 10 + hlen + 8);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_array a;
        int rc = attn_npy_load(&ctx, tmp("text.npy"), &a);
        if ((rc == 0) != cases[k].ok)
            fprintf(stderr, "  %s: %s\n", cases[k].dict, rc ? ctx.message : "loaded");
        CHECK_INT(rc == 0, cases[k].ok);
        if (rc) {
            CHECK_STR_CONTAINS(ctx.message, cases[k].phrase);
            CHECK_STR_CONTAINS(ctx.message, "at byte");
        } else {
            CHECK_INT(a.tensor.shape[0], 2);
        }
        attn_array_free(&ctx, &a);
    }
}

static int no_temp_files_left(void) { return io_no_temp_files(PROG); }

static void test_atomic(void)
{
    TEST("a save replaces an existing file whole; a failed save leaves it untouched and "
         "no temporary file behind");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float v[4] = {1, 2, 3, 4}, w[2] = {9, 8};
    attn_tensor t4, t2;
    const int64_t s4[1] = {4}, s2[1] = {2};
    attn_tensor_init(&ctx, &t4, ATTN_DTYPE_F32, v, 1, s4);
    attn_tensor_init(&ctx, &t2, ATTN_DTYPE_F32, w, 1, s2);
    CHECK_INT(attn_npy_save(&ctx, tmp("atomic.npy"), &t4), 0);
    CHECK_INT(attn_npy_save(&ctx, tmp("atomic.npy"), &t2), 0);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, tmp("atomic.npy"), &a), 0);
    CHECK_INT(a.tensor.shape[0], 2);
    attn_array_free(&ctx, &a);

    /* Out of memory at each allocation of a save: the old file stays. */
    for (long k = 1; k < 10; k++) {
        attn_ctx fctx;
        io_failing_alloc fa;
        io_fa_ctx(&fctx, &fa, k);
        int rc = attn_npy_save(&fctx, tmp("atomic.npy"), &t4);
        CHECK_INT(fa.live, 0);
        if (rc == 0)
            break;
        CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
        CHECK_INT(attn_npy_load(&ctx, tmp("atomic.npy"), &a), 0);
        CHECK_INT(a.tensor.shape[0], 2);
        attn_array_free(&ctx, &a);
    }

    char bad[1100];
    snprintf(bad, sizeof(bad), "%s/no_such_dir/x.npy", ATTN_TEST_TMP_DIR);
    CHECK_INT(attn_npy_save(&ctx, bad, &t2), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "no_such_dir/x.npy");
    CHECK(!io_exists(bad));
    CHECK(no_temp_files_left());
}

static void test_out_of_memory(void)
{
    TEST("an allocation failure at any point of a load returns NO_MEMORY and frees "
         "everything it took");
    const char *files[3] = {"files/ref_fortran.npy", "files/ref_f16.npy", "files/ref_f32.npy"};
    for (int f = 0; f < 3; f++) {
        int done = 0;
        for (long k = 1; k < 20 && !done; k++) {
            attn_ctx ctx;
            io_failing_alloc fa;
            io_fa_ctx(&ctx, &fa, k);
            attn_array a;
            int rc = attn_npy_load(&ctx, data(files[f]), &a);
            if (rc == 0) {
                done = 1;
                attn_array_free(&ctx, &a);
            } else {
                CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
            }
            CHECK_INT(fa.live, 0);
        }
        CHECK(done);
    }
}

static void test_mutations(void)
{
    TEST("3000 random mutations of valid files (flipped, overwritten, truncated bytes) are "
         "each loaded or refused with a message, never a crash or an out-of-bounds read");
    const char *seeds[3] = {"files/ref_f16.npy", "files/ref_fortran.npy", "files/ref_v2.npy"};
    uint64_t s = 0x1234567u;
    int loaded = 0, refused = 0;
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
            io_write(tmp("mut.npy"), b, m);
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            attn_array a;
            int rc = attn_npy_load(&ctx, tmp("mut.npy"), &a);
            if (rc == 0) {
                loaded++;
                CHECK(attn_tensor_numel(&a.tensor) >= 1);
                attn_array_free(&ctx, &a);
            } else {
                refused++;
                if (!strstr(ctx.message, "mut.npy")) {
                    CHECK_STR_CONTAINS(ctx.message, "mut.npy");
                }
                CHECK(a.buffer == NULL);
            }
        }
        free(b);
        free(orig);
    }
    fprintf(stderr, "   (%d loaded, %d refused)\n", loaded, refused);
    CHECK(refused > 0);
}

int main(void)
{
    test_round_trip_f32();
    test_round_trip_ints();
    test_strided_save();
    test_header_layout();
    test_numpy_files();
    test_manifest();
    test_errors();
    test_python_files();
    test_header_text();
    test_atomic();
    test_out_of_memory();
    test_mutations();
    return check_summary(PROG);
}
