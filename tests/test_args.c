/*
 * test_args.c - every public function of include/attn.h with bad arguments.
 *
 * attn is embedded in other programs and fed whatever a caller has: NULL pointers,
 * sizes below 1, negative strides, unknown dtypes, 0 or 5 dimensions, shapes whose
 * element count overflows 64 bits or whose byte count overflows size_t, tensors whose
 * strides reach past a 64-bit offset. Each such call must return its documented
 * status, leave that status and a non-empty message in ctx, and never crash. Each
 * call is made twice: with a context (status and message checked) and with ctx NULL
 * (the same status, nothing to write the message to).
 *
 * Functions that return void must accept NULL where the header says so; functions
 * that return a value without a context (attn_tensor_numel, attn_dtype_size, ...)
 * must return their documented "bad" value.
 *
 * The test reads include/attn.h and fails when a function declared there is not
 * exercised here, so a function added later cannot be skipped silently.
 *
 * The random number functions (src/core/rng.c) take no context and return no status: with
 * a NULL generator or buffer, sizes below 1 or an overflowing size they draw nothing.
 * The NULL cases run in a child process so that a crash fails the test instead of
 * ending it.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif
#ifndef ATTN_TEST_TMP_DIR
#define ATTN_TEST_TMP_DIR "."
#endif

/* ---- bookkeeping ----------------------------------------------------------------- */

static long bad_inputs = 0; /* calls made with a bad argument */

#define MAX_COVERED 160
static const char *covered[MAX_COVERED];
static int n_covered = 0;

static void covers(const char *fn)
{
    for (int i = 0; i < n_covered; i++)
        if (strcmp(covered[i], fn) == 0)
            return;
    if (n_covered < MAX_COVERED)
        covered[n_covered++] = fn;
}

/* One failing call: runs `call` (an expression that uses the attn_ctx pointer C)
 * with a fresh context and then with C = NULL; both must return `want`, and the
 * context must hold `want` and a message. */
#define EXPECT_FAIL(want, call)                                                        \
    do {                                                                               \
        attn_ctx ctx_;                                                                 \
        attn_ctx_init(&ctx_);                                                          \
        attn_ctx *C = &ctx_;                                                           \
        int rc_ = (call);                                                              \
        CHECK_INT(rc_, (want));                                                        \
        CHECK_INT(ctx_.status, (want));                                                \
        if (ctx_.message[0] == '\0') {                                                 \
            check_failures_++;                                                         \
            fprintf(stderr, "%s:%d: no message for %s\n", __FILE__, __LINE__, #call);  \
        }                                                                              \
        C = NULL;                                                                      \
        CHECK_INT((call), (want));                                                     \
        bad_inputs += 2;                                                               \
    } while (0)

/* A failure that comes from a field of the context (ctx->arch, ctx->impl): checked
 * with a context only, since a NULL context has the defaults. */
#define EXPECT_FAIL_CTX(want, setup, call)                                             \
    do {                                                                               \
        attn_ctx ctx_;                                                                 \
        attn_ctx_init(&ctx_);                                                          \
        attn_ctx *C = &ctx_;                                                           \
        setup;                                                                         \
        int rc_ = (call);                                                              \
        CHECK_INT(rc_, (want));                                                        \
        CHECK_INT(ctx_.status, (want));                                                \
        CHECK(ctx_.message[0] != '\0');                                                \
        bad_inputs++;                                                                  \
    } while (0)

/* The same, for a call whose result must be ATTN_OK (the valid baseline: it shows the
 * bad variants fail because of what was changed, not because of the rest). */
#define EXPECT_OK(call)                                                                \
    do {                                                                               \
        attn_ctx ctx_;                                                                 \
        attn_ctx_init(&ctx_);                                                          \
        attn_ctx *C = &ctx_;                                                           \
        int rc_ = (call);                                                              \
        if (rc_ != ATTN_OK) {                                                          \
            check_failures_++;                                                         \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,    \
                    attn_status_name(rc_), ctx_.message);                              \
        }                                                                              \
        check_count_++;                                                                \
    } while (0)

/* ---- bad tensors ----------------------------------------------------------------- */

/* One way to spoil a valid tensor, and the status it must cause. */
typedef struct variant {
    const char *what;
    int status;
} variant;

enum {
    V_DATA_NULL,
    V_NDIM_0,
    V_NDIM_5,
    V_NDIM_NEG,
    V_SIZE_0,      /* on every axis in turn */
    V_SIZE_NEG,    /* on every axis in turn */
    V_STRIDE_NEG,  /* on every axis in turn */
    V_DTYPE_99,
    V_DTYPE_NEG,
    V_NUMEL_OVF,   /* sizes 2^32 on every axis with stride 0: offsets fit, count does not */
    V_OFFSET_OVF,  /* a stride that carries the last offset past 2^63 */
    V_BYTES_OVF,   /* an offset that fits in 64 bits but its bytes do not fit size_t */
    V_WRONG_DTYPE, /* a valid dtype the argument does not take */
    V_COUNT
};

static const variant variants[V_COUNT] = {
    {"data NULL", ATTN_STATUS_INVALID_ARGUMENT},
    {"ndim 0", ATTN_STATUS_INVALID_ARGUMENT},
    {"ndim 5", ATTN_STATUS_INVALID_ARGUMENT},
    {"ndim -1", ATTN_STATUS_INVALID_ARGUMENT},
    {"a size of 0", ATTN_STATUS_INVALID_ARGUMENT},
    {"a size of -3", ATTN_STATUS_INVALID_ARGUMENT},
    {"a stride of -1", ATTN_STATUS_INVALID_ARGUMENT},
    {"dtype 99", ATTN_STATUS_DTYPE},
    {"dtype -1", ATTN_STATUS_DTYPE},
    {"an element count past 2^63", ATTN_STATUS_OVERFLOW},
    {"strides past a 64-bit offset", ATTN_STATUS_OVERFLOW},
    {"a byte offset past size_t", ATTN_STATUS_OVERFLOW},
    {"a dtype the call does not take", ATTN_STATUS_DTYPE},
};

/* How many tensors variant v makes from t (the per-axis ones make one per axis). */
static int variant_count(int v, const attn_tensor *t)
{
    return (v == V_SIZE_0 || v == V_SIZE_NEG || v == V_STRIDE_NEG) ? t->ndim : 1;
}

/* The k-th tensor of variant v made from the valid t; `wrong` is the dtype the
 * argument does not take. */
static attn_tensor spoil(const attn_tensor *t, int v, int k, attn_dtype wrong)
{
    attn_tensor b = *t;
    switch (v) {
    case V_DATA_NULL: b.data = NULL; break;
    case V_NDIM_0: b.ndim = 0; break;
    case V_NDIM_5: b.ndim = 5; break;
    case V_NDIM_NEG: b.ndim = -1; break;
    case V_SIZE_0: b.shape[k] = 0; break;
    case V_SIZE_NEG: b.shape[k] = -3; break;
    case V_STRIDE_NEG: b.shape[k] = b.shape[k] > 1 ? b.shape[k] : 2; b.stride[k] = -1; break;
    case V_DTYPE_99: b.dtype = (attn_dtype)99; break;
    case V_DTYPE_NEG: b.dtype = (attn_dtype)-1; break;
    case V_NUMEL_OVF:
        for (int i = 0; i < b.ndim; i++) {
            b.shape[i] = (int64_t)1 << 32;
            b.stride[i] = 0;
        }
        if (b.ndim == 1) /* one axis cannot overflow: use the largest size there is */
            b.shape[0] = INT64_MAX, b.stride[0] = 0;
        break;
    case V_OFFSET_OVF:
        b.shape[0] = 3;
        b.stride[0] = INT64_MAX / 2 + 1;
        break;
    case V_BYTES_OVF:
        b.shape[0] = 2;
        b.stride[0] = (int64_t)1 << 62; /* offset 2^62 fits; 2^62 * 4 bytes does not */
        if (attn_dtype_size(b.dtype) == 1) /* one byte each: the offset itself */
            b.stride[0] = INT64_MAX;
        if (attn_dtype_size(b.dtype) == 2) /* two bytes each: (2^63 - 1 + 1) * 2 = 2^64 */
            b.stride[0] = INT64_MAX;
        break;
    case V_WRONG_DTYPE: b.dtype = wrong; break;
    }
    return b;
}

/* The status variant v must give; a one-dimensional tensor whose only size is
 * INT64_MAX with stride 0 has a count that fits, so V_NUMEL_OVF needs 2+ dims. */
static int variant_status(int v, const attn_tensor *t)
{
    (void)t;
    return variants[v].status;
}

/* Runs every variant of the tensor at *slot (restoring it after each), expecting
 * the variant's status from `call`. V_WRONG_DTYPE is skipped when wrong == -2. */
#define FOR_EACH_VARIANT(slot, wrong, call)                                            \
    do {                                                                               \
        const attn_tensor saved_ = *(slot);                                            \
        for (int v_ = 0; v_ < V_COUNT; v_++) {                                         \
            if (v_ == V_WRONG_DTYPE && (int)(wrong) == -2)                             \
                continue;                                                              \
            if (v_ == V_NUMEL_OVF && saved_.ndim < 2)                                  \
                continue;                                                              \
            for (int k_ = 0; k_ < variant_count(v_, &saved_); k_++) {                  \
                *(slot) = spoil(&saved_, v_, k_, (attn_dtype)(wrong));                 \
                int before_ = check_failures_;                                         \
                EXPECT_FAIL(variant_status(v_, &saved_), call);                        \
                if (check_failures_ != before_)                                        \
                    fprintf(stderr, "  (that was %s = %s, axis %d, in %s)\n", #slot,   \
                            variants[v_].what, k_, #call);                             \
            }                                                                          \
        }                                                                              \
        *(slot) = saved_;                                                              \
    } while (0)

#define NO_WRONG_DTYPE (-2)

static attn_tensor make(attn_dtype dt, void *data, int ndim, int64_t a, int64_t b,
                        int64_t c, int64_t d)
{
    const int64_t shape[4] = {a, b, c, d};
    attn_tensor t;
    if (attn_tensor_init(NULL, &t, dt, data, ndim, shape) != ATTN_OK) {
        fprintf(stderr, "test setup: attn_tensor_init failed\n");
        exit(1);
    }
    return t;
}

/* ---- the tests ------------------------------------------------------------------- */

static void test_status_and_ctx(void)
{
    TEST("status names and messages exist for every status and an unknown one is "
         "named UNKNOWN; attn_ctx_init(NULL) does nothing");
    covers("attn_status_name");
    covers("attn_strerror");
    covers("attn_ctx_init");
    for (int s = ATTN_STATUS_UNSUPPORTED; s <= ATTN_OK; s++) {
        CHECK(strcmp(attn_status_name(s), "UNKNOWN") != 0);
        CHECK(strcmp(attn_strerror(s), "unknown status") != 0);
    }
    const int odd[] = {1, -11, 42, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        CHECK_STR_EQ(attn_status_name(odd[i]), "UNKNOWN");
        CHECK_STR_EQ(attn_strerror(odd[i]), "unknown status");
        bad_inputs += 2;
    }
    attn_ctx_init(NULL);
    covers("attn_ctx_release");
    attn_ctx_release(NULL);
    bad_inputs++;
}

static void test_dtype(void)
{
    TEST("an unknown dtype has size 0 and the name \"unknown\"");
    covers("attn_dtype_size");
    covers("attn_dtype_name");
    const int odd[] = {-1, 6, 99, INT_MAX}; /* 4 and 5 are bfloat16 and float16 */
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        CHECK_INT(attn_dtype_size((attn_dtype)odd[i]), 0);
        CHECK_STR_EQ(attn_dtype_name((attn_dtype)odd[i]), "unknown");
        bad_inputs += 2;
    }
}

/* An allocator that refuses anything above 1 MiB, so a huge request fails the same
 * way with or without a sanitizer's allocator underneath. */
static void *limited_alloc(void *user, size_t size)
{
    (void)user;
    return size > ((size_t)1 << 20) ? NULL : malloc(size);
}

static void test_tensor_init_alloc(void)
{
    TEST("attn_tensor_init and attn_tensor_alloc refuse a NULL tensor or shape, 0, 5 or "
         "-1 dims, sizes below 1, unknown dtypes, and counts or bytes that overflow");
    covers("attn_tensor_init");
    covers("attn_tensor_alloc");
    covers("attn_tensor_free");
    float buf[24];
    attn_tensor t;
    const int64_t ok[4] = {2, 3, 4, 1};
    EXPECT_OK(attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, 3, ok));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_init(C, NULL, ATTN_DTYPE_F32, buf, 3, ok));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, 3, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_alloc(C, NULL, ATTN_DTYPE_F32, 3, ok));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_alloc(C, &t, ATTN_DTYPE_F32, 3, NULL));
    const int ndims[] = {0, 5, -1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof ndims / sizeof ndims[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, ndims[i], ok));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_tensor_alloc(C, &t, ATTN_DTYPE_F32, ndims[i], ok));
    }
    const int dts[] = {-1, 6, 99}; /* 4 and 5 are bfloat16 and float16 */
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_tensor_init(C, &t, (attn_dtype)dts[i], buf, 3, ok));
        EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_tensor_alloc(C, &t, (attn_dtype)dts[i], 3, ok));
    }
    const int64_t small[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        for (int axis = 0; axis < 3; axis++) {
            int64_t s[4] = {2, 3, 4, 1};
            s[axis] = small[i];
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, 3, s));
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        attn_tensor_alloc(C, &t, ATTN_DTYPE_F32, 3, s));
        }
    /* Element counts past 2^63, and counts that fit but whose bytes do not. */
    const int64_t big64[4] = {(int64_t)1 << 32, (int64_t)1 << 32, 1, 1};
    const int64_t big64b[4] = {INT64_MAX, 2, 1, 1};
    const int64_t big64c[4] = {3037000500, 3037000500, 1, 1}; /* (2^31.5)^2 > 2^63 */
    const int64_t bytes_ovf[1] = {(int64_t)1 << 62};            /* * 4 bytes > 2^64 */
    const int64_t bytes_ovf8[2] = {(int64_t)1 << 31, (int64_t)1 << 31}; /* * 8 */
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, 2, big64));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_init(C, &t, ATTN_DTYPE_BOOL, buf, 2, big64b));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_init(C, &t, ATTN_DTYPE_BOOL, buf, 2, big64c));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_init(C, &t, ATTN_DTYPE_F32, buf, 1, bytes_ovf));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_init(C, &t, ATTN_DTYPE_I64, buf, 2, bytes_ovf8));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_alloc(C, &t, ATTN_DTYPE_F32, 2, big64));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_alloc(C, &t, ATTN_DTYPE_F32, 1, bytes_ovf));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_alloc(C, &t, ATTN_DTYPE_I64, 2, bytes_ovf8));

    TEST("attn_tensor_alloc of more memory than the allocator gives fails with "
         "NO_MEMORY and a message, and attn_tensor_free accepts NULL");
    const int64_t huge[1] = {(int64_t)1 << 40}; /* 4 TiB of float */
    attn_ctx limited;
    attn_ctx_init(&limited);
    limited.allocator.alloc = limited_alloc;
    int rc = attn_tensor_alloc(&limited, &t, ATTN_DTYPE_F32, 1, huge);
    CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
    CHECK_INT(limited.status, ATTN_STATUS_NO_MEMORY);
    CHECK(limited.message[0] != '\0');
    bad_inputs++;
    attn_tensor_free(&limited, NULL);
    attn_tensor_free(NULL, NULL);
    attn_tensor empty;
    memset(&empty, 0, sizeof empty);
    attn_tensor_free(&limited, &empty);
    bad_inputs += 3;
}

static void test_tensor_queries(void)
{
    TEST("attn_tensor_numel is -1 and attn_tensor_is_contiguous is 0 for a NULL or "
         "malformed tensor; numel is -1 when the count overflows");
    covers("attn_tensor_numel");
    covers("attn_tensor_is_contiguous");
    float buf[24];
    attn_tensor t = make(ATTN_DTYPE_F32, buf, 3, 2, 3, 4, 1);
    CHECK_INT(attn_tensor_numel(&t), 24);
    CHECK_INT(attn_tensor_is_contiguous(&t), 1);
    CHECK_INT(attn_tensor_numel(NULL), -1);
    CHECK_INT(attn_tensor_is_contiguous(NULL), 0);
    bad_inputs += 2;
    const int ndims[] = {0, 5, -1};
    for (size_t i = 0; i < 3; i++) {
        attn_tensor b = t;
        b.ndim = ndims[i];
        CHECK_INT(attn_tensor_numel(&b), -1);
        CHECK_INT(attn_tensor_is_contiguous(&b), 0);
        bad_inputs += 2;
    }
    attn_tensor b = t;
    b.shape[1] = -3;
    CHECK_INT(attn_tensor_numel(&b), -1);
    bad_inputs++;
    b = spoil(&t, V_NUMEL_OVF, 0, ATTN_DTYPE_F32);
    CHECK_INT(attn_tensor_numel(&b), -1);
    bad_inputs++;
    /* Contiguous strides of a shape whose count overflows: the answer may be either,
     * but the check must not overflow (UBSan watches). */
    b = t;
    b.ndim = 4;
    for (int i = 0; i < 4; i++)
        b.shape[i] = (int64_t)1 << 20;
    b.stride[3] = 1;
    b.stride[2] = (int64_t)1 << 20;
    b.stride[1] = (int64_t)1 << 40;
    b.stride[0] = (int64_t)1 << 60;
    (void)attn_tensor_is_contiguous(&b);
    bad_inputs++;
}

static void test_tensor_check(void)
{
    TEST("attn_tensor_check refuses NULL, NULL data, bad ndim, sizes below 1, negative "
         "strides, unknown dtypes, overflowing counts, offsets and bytes (NULL name ok)");
    covers("attn_tensor_check");
    float buf[24];
    attn_tensor t = make(ATTN_DTYPE_F32, buf, 3, 2, 3, 4, 1);
    EXPECT_OK(attn_tensor_check(C, &t, "t"));
    EXPECT_OK(attn_tensor_check(C, &t, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_check(C, NULL, "t"));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_check(C, NULL, NULL));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_check(C, &t, "t"));
    attn_tensor one = make(ATTN_DTYPE_BOOL, buf, 1, 5, 1, 1, 1);
    FOR_EACH_VARIANT(&one, NO_WRONG_DTYPE, attn_tensor_check(C, &one, NULL));
}

static void test_tensor_views(void)
{
    TEST("transpose, reshape, narrow and copy refuse bad tensors, NULL views, axes out "
         "of range, ranges outside the axis, shapes that do not match or overflow");
    covers("attn_tensor_transpose");
    covers("attn_tensor_reshape");
    covers("attn_tensor_narrow");
    covers("attn_tensor_copy");
    float buf[24], buf2[24];
    attn_tensor t = make(ATTN_DTYPE_F32, buf, 3, 2, 3, 4, 1), view;
    attn_tensor d = make(ATTN_DTYPE_F32, buf2, 3, 2, 3, 4, 1);

    EXPECT_OK(attn_tensor_transpose(C, &t, 0, 2, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_transpose(C, NULL, 0, 1, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_transpose(C, &t, 0, 1, NULL));
    const int axes[][2] = {{-1, 0}, {0, -1}, {3, 0}, {0, 3}, {INT_MIN, INT_MAX}};
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_tensor_transpose(C, &t, axes[i][0], axes[i][1], &view));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_transpose(C, &t, 0, 1, &view));

    const int64_t s6[2] = {6, 4}, s5[2] = {5, 4}, s0[2] = {0, 4}, sneg[2] = {-6, -4};
    const int64_t sovf[3] = {(int64_t)1 << 32, (int64_t)1 << 32, 2};
    EXPECT_OK(attn_tensor_reshape(C, &t, 2, s6, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, NULL, 2, s6, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 2, s6, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 2, NULL, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 0, s6, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 5, s6, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, -1, s6, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 2, s0, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &t, 2, sneg, &view));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_tensor_reshape(C, &t, 2, s5, &view));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_tensor_reshape(C, &t, 3, sovf, &view));
    attn_tensor tt;
    attn_tensor_transpose(NULL, &t, 0, 1, &tt);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_reshape(C, &tt, 2, s6, &view));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_reshape(C, &t, 2, s6, &view));

    EXPECT_OK(attn_tensor_narrow(C, &t, 1, 1, 2, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_narrow(C, NULL, 1, 1, 2, &view));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_narrow(C, &t, 1, 1, 2, NULL));
    const int bad_axes[] = {-1, 3, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof bad_axes / sizeof bad_axes[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_tensor_narrow(C, &t, bad_axes[i], 0, 1, &view));
    const int64_t ranges[][2] = {{-1, 1},        {0, 0},          {0, -1},
                                 {2, 2},         {3, 1},          {0, 4},
                                 {INT64_MAX, 1}, {1, INT64_MAX},  {INT64_MIN, 2},
                                 {0, INT64_MIN}, {INT64_MAX, INT64_MAX}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_tensor_narrow(C, &t, 1, ranges[i][0], ranges[i][1], &view));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_narrow(C, &t, 0, 0, 1, &view));

    EXPECT_OK(attn_tensor_copy(C, &t, &d));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_copy(C, NULL, &d));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_copy(C, &t, NULL));
    attn_tensor di = make(ATTN_DTYPE_I32, buf2, 3, 2, 3, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_tensor_copy(C, &t, &di));
    attn_tensor ds = make(ATTN_DTYPE_F32, buf2, 3, 3, 2, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_tensor_copy(C, &t, &ds));
    attn_tensor d2 = make(ATTN_DTYPE_F32, buf2, 2, 6, 4, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_tensor_copy(C, &t, &d2));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_copy(C, &t, &d));
    FOR_EACH_VARIANT(&d, NO_WRONG_DTYPE, attn_tensor_copy(C, &t, &d));

    /* attn_tensor_convert: float32 into bfloat16 (half of buf2's bytes); integer
     * dtypes, other shapes and overlap refused. */
    covers("attn_tensor_convert");
    attn_tensor dh = make(ATTN_DTYPE_BF16, buf2, 3, 2, 3, 4, 1);
    EXPECT_OK(attn_tensor_convert(C, &t, &dh));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_convert(C, NULL, &dh));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_convert(C, &t, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_tensor_convert(C, &t, &di));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_tensor_convert(C, &di, &dh));
    attn_tensor dhs = make(ATTN_DTYPE_F16, buf2, 3, 3, 2, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_tensor_convert(C, &t, &dhs));
    attn_tensor self_h = make(ATTN_DTYPE_BF16, t.data, 3, 2, 3, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_tensor_convert(C, &t, &self_h));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_tensor_convert(C, &t, &dh));
    FOR_EACH_VARIANT(&dh, NO_WRONG_DTYPE, attn_tensor_convert(C, &t, &dh));
}

static void test_shapes(void)
{
    TEST("attn_shape_format takes a NULL or 0-byte buffer, NULL shape, ndim below 1 or "
         "above 4; attn_broadcast_shape refuses NULLs, bad ndims and sizes below 1");
    covers("attn_shape_format");
    covers("attn_broadcast_shape");
    const int64_t shape[5] = {2, 5, 16, 7, 9};
    char buf[8];
    int n = attn_shape_format(NULL, 0, 3, shape);
    CHECK_INT(n, (int)strlen("(2, 5, 16)"));
    CHECK_INT(attn_shape_format(buf, 0, 3, shape), n);
    CHECK_INT(attn_shape_format(buf, sizeof buf, 3, shape), n);
    CHECK_INT((int)strlen(buf), (int)sizeof buf - 1); /* cut, terminated */
    CHECK(attn_shape_format(buf, sizeof buf, 3, NULL) >= 2);
    CHECK(attn_shape_format(buf, sizeof buf, -1, shape) >= 2);
    CHECK(attn_shape_format(buf, sizeof buf, INT_MIN, shape) >= 2);
    CHECK(attn_shape_format(buf, sizeof buf, 5, shape) >= 2);
    CHECK(attn_shape_format(buf, sizeof buf, INT_MAX, shape) >= 2);
    bad_inputs += 7;

    int nd;
    int64_t out[4];
    const int64_t a[2] = {5, 1}, b[3] = {2, 1, 7}, zero[2] = {0, 1}, neg[2] = {5, -1};
    const int64_t nb[2] = {4, 5}; /* 5 against 7 */
    EXPECT_OK(attn_broadcast_shape(C, 2, a, 3, b, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, NULL, 3, b, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, a, 3, NULL, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, a, 3, b, NULL, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, a, 3, b, &nd, NULL));
    const int ndims[] = {0, 5, -1, INT_MAX};
    for (size_t i = 0; i < sizeof ndims / sizeof ndims[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_broadcast_shape(C, ndims[i], a, 3, b, &nd, out));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_broadcast_shape(C, 2, a, ndims[i], b, &nd, out));
    }
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, zero, 3, b, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 2, neg, 3, b, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_broadcast_shape(C, 3, b, 2, neg, &nd, out));
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, attn_broadcast_shape(C, 2, nb, 3, b, &nd, out));
}

static void test_masks(void)
{
    TEST("the mask functions refuse bad tensors, wrong dtypes, wrong output shapes, "
         "lengths and sizes below 1, and shapes that do not broadcast");
    covers("attn_mask_padding");
    covers("attn_mask_causal");
    covers("attn_mask_and");
    covers("attn_mask_check");
    int64_t ids_buf[6] = {1, 2, 0, 3, 0, 0};
    /* Aligned for any dtype, so that the wrong-dtype variants (the bytes described as
     * float32 or int32) meet the dtype check and not attn_tensor_check's alignment. */
    _Alignas(8) uint8_t pad_buf[6], causal_buf[9], both_buf[18], m2[9];
    attn_tensor ids = make(ATTN_DTYPE_I64, ids_buf, 2, 2, 3, 1, 1);
    attn_tensor pad = make(ATTN_DTYPE_BOOL, pad_buf, 4, 2, 1, 1, 3);
    attn_tensor causal = make(ATTN_DTYPE_BOOL, causal_buf, 4, 1, 1, 3, 3);
    attn_tensor both = make(ATTN_DTYPE_BOOL, both_buf, 4, 2, 1, 3, 3);

    EXPECT_OK(attn_mask_padding(C, &ids, 0, &pad));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_padding(C, NULL, 0, &pad));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_padding(C, &ids, 0, NULL));
    FOR_EACH_VARIANT(&ids, ATTN_DTYPE_F32, attn_mask_padding(C, &ids, 0, &pad));
    FOR_EACH_VARIANT(&pad, ATTN_DTYPE_F32, attn_mask_padding(C, &ids, 0, &pad));
    attn_tensor ids3 = make(ATTN_DTYPE_I64, ids_buf, 3, 1, 2, 3, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_padding(C, &ids3, 0, &pad));
    attn_tensor pad_wrong = make(ATTN_DTYPE_BOOL, pad_buf, 4, 1, 2, 1, 3);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_padding(C, &ids, 0, &pad_wrong));
    attn_tensor pad_3d = make(ATTN_DTYPE_BOOL, pad_buf, 3, 2, 1, 3, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_padding(C, &ids, 0, &pad_3d));

    EXPECT_OK(attn_mask_causal(C, 3, &causal));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_causal(C, 3, NULL));
    const int64_t bad_T[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof bad_T / sizeof bad_T[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_causal(C, bad_T[i], &causal));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_causal(C, 4, &causal));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_causal(C, INT64_MAX, &causal));
    FOR_EACH_VARIANT(&causal, ATTN_DTYPE_F32, attn_mask_causal(C, 3, &causal));

    EXPECT_OK(attn_mask_and(C, &pad, &causal, &both));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_and(C, NULL, &causal, &both));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_and(C, &pad, NULL, &both));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_and(C, &pad, &causal, NULL));
    FOR_EACH_VARIANT(&pad, ATTN_DTYPE_I32, attn_mask_and(C, &pad, &causal, &both));
    FOR_EACH_VARIANT(&causal, ATTN_DTYPE_I32, attn_mask_and(C, &pad, &causal, &both));
    FOR_EACH_VARIANT(&both, ATTN_DTYPE_F32, attn_mask_and(C, &pad, &causal, &both));
    attn_tensor c4 = make(ATTN_DTYPE_BOOL, m2, 2, 2, 4, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, attn_mask_and(C, &pad, &c4, &both));
    attn_tensor both_wrong = make(ATTN_DTYPE_BOOL, both_buf, 4, 1, 2, 3, 3);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mask_and(C, &pad, &causal, &both_wrong));

    EXPECT_OK(attn_mask_check(C, &both, 2, 4, 3, 3));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mask_check(C, NULL, 2, 4, 3, 3));
    FOR_EACH_VARIANT(&both, ATTN_DTYPE_F32, attn_mask_check(C, &both, 2, 4, 3, 3));
    const int64_t bad_sizes[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++)
        for (int axis = 0; axis < 4; axis++) {
            int64_t s[4] = {2, 4, 3, 3};
            s[axis] = bad_sizes[i];
            /* A mask of all ones broadcasts to anything: only the size check can
             * refuse these. */
            attn_tensor ones = make(ATTN_DTYPE_BOOL, m2, 1, 1, 1, 1, 1);
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        attn_mask_check(C, &ones, s[0], s[1], s[2], s[3]));
        }
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, attn_mask_check(C, &both, 3, 4, 3, 3));
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, attn_mask_check(C, &both, 2, 4, 5, 3));
}

static void test_linear(void)
{
    TEST("attn_linear refuses bad x, W, b and y, non-float32 dtypes, shapes that do not "
         "fit, and an unknown ctx->arch; b may be NULL");
    covers("attn_linear");
    float x_buf[2 * 3 * 4], w_buf[5 * 4], b_buf[5], y_buf[2 * 3 * 5];
    memset(x_buf, 0, sizeof x_buf);
    memset(w_buf, 0, sizeof w_buf);
    memset(b_buf, 0, sizeof b_buf);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, 2, 3, 4, 1);
    attn_tensor W = make(ATTN_DTYPE_F32, w_buf, 2, 5, 4, 1, 1);
    attn_tensor b = make(ATTN_DTYPE_F32, b_buf, 1, 5, 1, 1, 1);
    attn_tensor y = make(ATTN_DTYPE_F32, y_buf, 3, 2, 3, 5, 1);
    EXPECT_OK(attn_linear(C, &x, &W, &b, &y));
    EXPECT_OK(attn_linear(C, &x, &W, NULL, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear(C, NULL, &W, &b, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear(C, &x, NULL, &b, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear(C, &x, &W, &b, NULL));
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, attn_linear(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&W, ATTN_DTYPE_I32, attn_linear(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&b, ATTN_DTYPE_I32, attn_linear(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&y, ATTN_DTYPE_I32, attn_linear(C, &x, &W, &b, &y));
    attn_tensor W_in = make(ATTN_DTYPE_F32, w_buf, 2, 4, 5, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W_in, NULL, &y));
    attn_tensor W3 = make(ATTN_DTYPE_F32, w_buf, 3, 1, 5, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W3, NULL, &y));
    attn_tensor b4 = make(ATTN_DTYPE_F32, b_buf, 1, 4, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W, &b4, &y));
    attn_tensor b2 = make(ATTN_DTYPE_F32, b_buf, 2, 1, 5, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W, &b2, &y));
    attn_tensor y_lead = make(ATTN_DTYPE_F32, y_buf, 3, 3, 2, 5, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W, &b, &y_lead));
    attn_tensor y_nd = make(ATTN_DTYPE_F32, y_buf, 2, 6, 5, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W, &b, &y_nd));
    attn_tensor y_out = make(ATTN_DTYPE_F32, y_buf, 3, 2, 3, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear(C, &x, &W, &b, &y_out));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    attn_linear(C, &x, &W, &b, &y));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)-1,
                    attn_linear(C, &x, &W, &b, &y));
}

/* attn_linear_workspace_size checks what attn_linear checks. */
static int linear_ws_as_call(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                             const attn_tensor *b, attn_tensor *y)
{
    size_t bytes = 1;
    int rc = attn_linear_workspace_size(ctx, x, W, b, y, &bytes);
    if (rc != ATTN_OK && bytes != 0) {
        check_failures_++;
        fprintf(stderr, "attn_linear_workspace_size failed but left *bytes = %zu\n", bytes);
    }
    return rc;
}

/* attn_linear_pack, freeing what it packs, so that a call can be repeated. */
static int linear_pack_as_call(attn_ctx *ctx, const attn_tensor *W, const attn_tensor *b)
{
    attn_linear_packed *pw = (attn_linear_packed *)&pw; /* must be set to NULL on failure */
    int rc = attn_linear_pack(ctx, W, b, &pw);
    if (rc != ATTN_OK && pw != NULL) {
        check_failures_++;
        fprintf(stderr, "attn_linear_pack failed but left *out = %p\n", (void *)pw);
    }
    if (rc == ATTN_OK)
        attn_linear_packed_free(ctx, pw);
    return rc;
}

static void test_linear_packed(void)
{
    TEST("attn_linear_workspace_size, attn_linear_pack and attn_linear_forward_packed refuse "
         "what attn_linear refuses, NULL outputs and packed weights, and a weight packed for "
         "another arch; attn_linear_packed_free accepts NULL");
    covers("attn_linear_workspace_size");
    covers("attn_linear_pack");
    covers("attn_linear_packed_free");
    covers("attn_linear_forward_packed");
    static float x_buf[2 * 3 * 4], w_buf[5 * 4], b_buf[5], y_buf[2 * 3 * 5];
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, 2, 3, 4, 1);
    attn_tensor W = make(ATTN_DTYPE_F32, w_buf, 2, 5, 4, 1, 1);
    attn_tensor b = make(ATTN_DTYPE_F32, b_buf, 1, 5, 1, 1, 1);
    attn_tensor y = make(ATTN_DTYPE_F32, y_buf, 3, 2, 3, 5, 1);

    EXPECT_OK(linear_ws_as_call(C, &x, &W, &b, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear_workspace_size(C, &x, &W, &b, &y, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, linear_ws_as_call(C, NULL, &W, &b, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, linear_ws_as_call(C, &x, NULL, &b, &y));
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, linear_ws_as_call(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&W, ATTN_DTYPE_I32, linear_ws_as_call(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&b, ATTN_DTYPE_I32, linear_ws_as_call(C, &x, &W, &b, &y));
    FOR_EACH_VARIANT(&y, ATTN_DTYPE_I32, linear_ws_as_call(C, &x, &W, &b, &y));
    attn_tensor y_out = make(ATTN_DTYPE_F32, y_buf, 3, 2, 3, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, linear_ws_as_call(C, &x, &W, &b, &y_out));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    linear_ws_as_call(C, &x, &W, &b, &y));

    EXPECT_OK(linear_pack_as_call(C, &W, &b));
    EXPECT_OK(linear_pack_as_call(C, &W, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear_pack(C, &W, &b, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, linear_pack_as_call(C, NULL, &b));
    FOR_EACH_VARIANT(&W, ATTN_DTYPE_I32, linear_pack_as_call(C, &W, &b));
    FOR_EACH_VARIANT(&b, ATTN_DTYPE_I32, linear_pack_as_call(C, &W, &b));
    attn_tensor W3 = make(ATTN_DTYPE_F32, w_buf, 3, 1, 5, 4, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, linear_pack_as_call(C, &W3, NULL));
    attn_tensor b4 = make(ATTN_DTYPE_F32, b_buf, 1, 4, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, linear_pack_as_call(C, &W, &b4));
    attn_tensor b2 = make(ATTN_DTYPE_F32, b_buf, 2, 1, 5, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, linear_pack_as_call(C, &W, &b2));
    /* W [2^62, 2^62] through stride 0: its count overflows before any packing. */
    attn_tensor Wbig = W;
    Wbig.shape[0] = Wbig.shape[1] = (int64_t)1 << 62;
    Wbig.stride[0] = Wbig.stride[1] = 0;
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, linear_pack_as_call(C, &Wbig, NULL));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    linear_pack_as_call(C, &W, &b));
    attn_linear_packed_free(NULL, NULL);

    attn_linear_packed *pw = NULL;
    CHECK_INT(attn_linear_pack(NULL, &W, &b, &pw), ATTN_OK);
    EXPECT_OK(attn_linear_forward_packed(C, &x, pw, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear_forward_packed(C, &x, NULL, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear_forward_packed(C, NULL, pw, &y));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_linear_forward_packed(C, &x, pw, NULL));
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, attn_linear_forward_packed(C, &x, pw, &y));
    FOR_EACH_VARIANT(&y, ATTN_DTYPE_I32, attn_linear_forward_packed(C, &x, pw, &y));
    attn_tensor x_in = make(ATTN_DTYPE_F32, x_buf, 3, 2, 4, 3, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear_forward_packed(C, &x_in, pw, &y));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear_forward_packed(C, &x, pw, &y_out));
    attn_tensor y_lead = make(ATTN_DTYPE_F32, y_buf, 3, 3, 2, 5, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear_forward_packed(C, &x, pw, &y_lead));
    attn_tensor y_nd = make(ATTN_DTYPE_F32, y_buf, 2, 6, 5, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_linear_forward_packed(C, &x, pw, &y_nd));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    attn_linear_forward_packed(C, &x, pw, &y));
    /* Packed for the default arch, run on another one. */
    const attn_arch other = attn_arch_selected(NULL) == ATTN_ARCH_REF ? ATTN_ARCH_SCALAR
                                                                       : ATTN_ARCH_REF;
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = other,
                    attn_linear_forward_packed(C, &x, pw, &y));
    attn_linear_packed_free(NULL, pw);
}

/* The attention calls share one contract; each is run through the same checks. */
typedef int (*sdpa_fn)(attn_ctx *, const attn_tensor *, const attn_tensor *,
                       const attn_tensor *, const attn_sdpa_params *, attn_tensor *,
                       attn_tensor *);

/* checks_ctx: 0 = the call reads neither ctx->arch nor ctx->impl, 1 = ctx->arch,
 * 2 = both. */
static void sdpa_contract(const char *name, sdpa_fn f, int checks_ctx)
{
    enum { B = 2, H = 2, Tq = 3, Tk = 4, D = 4, Dv = 3 };
    static float q_buf[B * H * Tq * D], k_buf[B * H * Tk * D], v_buf[B * H * Tk * Dv];
    static float o_buf[B * H * Tq * Dv], w_buf[B * H * Tq * Tk];
    static uint8_t m_buf[B * Tk];
    for (int i = 0; i < B * Tk; i++)
        m_buf[i] = 1;
    attn_tensor q = make(ATTN_DTYPE_F32, q_buf, 4, B, H, Tq, D);
    attn_tensor k = make(ATTN_DTYPE_F32, k_buf, 4, B, H, Tk, D);
    attn_tensor v = make(ATTN_DTYPE_F32, v_buf, 4, B, H, Tk, Dv);
    attn_tensor out = make(ATTN_DTYPE_F32, o_buf, 4, B, H, Tq, Dv);
    attn_tensor w = make(ATTN_DTYPE_F32, w_buf, 4, B, H, Tq, Tk);
    attn_tensor mask = make(ATTN_DTYPE_BOOL, m_buf, 4, B, 1, 1, Tk);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &mask;

    fprintf(stderr, "   %s\n", name);
    EXPECT_OK(f(C, &q, &k, &v, &p, &out, &w));
    EXPECT_OK(f(C, &q, &k, &v, NULL, &out, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, NULL, &k, &v, &p, &out, &w));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, NULL, &v, &p, &out, &w));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, NULL, &p, &out, &w));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, NULL, &w));
    FOR_EACH_VARIANT(&q, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &w));
    FOR_EACH_VARIANT(&k, ATTN_DTYPE_I64, f(C, &q, &k, &v, &p, &out, &w));
    FOR_EACH_VARIANT(&v, ATTN_DTYPE_BOOL, f(C, &q, &k, &v, &p, &out, &w));
    FOR_EACH_VARIANT(&out, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &w));
    FOR_EACH_VARIANT(&w, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &w));
    FOR_EACH_VARIANT(&mask, ATTN_DTYPE_F32, f(C, &q, &k, &v, &p, &out, &w));

    /* Shapes that do not fit together. */
    attn_tensor k_d = make(ATTN_DTYPE_F32, k_buf, 4, B, H, Tk, D - 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k_d, &v, &p, &out, &w));
    attn_tensor v_t = make(ATTN_DTYPE_F32, v_buf, 4, B, H, Tk - 1, Dv);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v_t, &p, &out, &w));
    attn_tensor k_h = make(ATTN_DTYPE_F32, k_buf, 4, B, 1, Tk, D);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k_h, &v, &p, &out, &w));
    attn_tensor v_b = make(ATTN_DTYPE_F32, v_buf, 4, 1, H, Tk, Dv);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v_b, &p, &out, &w));
    attn_tensor out_d = make(ATTN_DTYPE_F32, o_buf, 4, B, H, Tq, Dv - 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out_d, &w));
    attn_tensor out_3 = make(ATTN_DTYPE_F32, o_buf, 3, B * H, Tq, Dv, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out_3, &w));
    attn_tensor w_t = make(ATTN_DTYPE_F32, w_buf, 4, B, H, Tk, Tq);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &w_t));

    /* Parameters. */
    attn_sdpa_params bad = p;
    const int causals[] = {-1, 3, INT_MAX};
    for (size_t i = 0; i < sizeof causals / sizeof causals[0]; i++) {
        bad = p;
        bad.causal = causals[i];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &w));
    }
    const int modes[] = {-1, 2, 99, INT_MAX};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        bad = p;
        bad.empty_rows = (attn_empty_rows)modes[i];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &w));
    }
    const float scales[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        bad = p;
        bad.has_scale = 1;
        bad.scale = scales[i];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &w));
    }
    /* Section 6's options. */
    const int64_t windows[][2] = {{-2, 0}, {0, -2}, {INT64_MIN, -1}};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        bad = p;
        bad.has_window = 1;
        bad.window_left = windows[i][0];
        bad.window_right = windows[i][1];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &w));
    }
    const float softcaps[] = {-1.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof softcaps / sizeof softcaps[0]; i++) {
        bad = p;
        bad.softcap = softcaps[i];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &w));
    }
    static float per_head[2 * H], bias_buf[B * H * Tq * Tk], lse_buf[B * H * Tq];
    attn_tensor heads3 = make(ATTN_DTYPE_F32, per_head, 1, H + 1, 1, 1, 1);
    attn_tensor heads2d = make(ATTN_DTYPE_F32, per_head, 2, 1, H, 1, 1);
    attn_tensor heads_i32 = make(ATTN_DTYPE_I32, per_head, 1, H, 1, 1, 1);
    const attn_tensor *bad_heads[] = {&heads3, &heads2d, &heads_i32};
    for (size_t i = 0; i < 3; i++) {
        bad = p;
        bad.sinks = bad_heads[i];
        EXPECT_FAIL(i == 2 ? ATTN_STATUS_DTYPE : ATTN_STATUS_SHAPE_MISMATCH,
                    f(C, &q, &k, &v, &bad, &out, &w));
        bad = p;
        bad.alibi_slopes = bad_heads[i];
        EXPECT_FAIL(i == 2 ? ATTN_STATUS_DTYPE : ATTN_STATUS_SHAPE_MISMATCH,
                    f(C, &q, &k, &v, &bad, &out, &w));
    }
    attn_tensor bias_bad = make(ATTN_DTYPE_F32, bias_buf, 4, B, H, Tk, Tq);
    attn_tensor bias_bool = make(ATTN_DTYPE_BOOL, bias_buf, 4, B, 1, 1, Tk);
    bad = p;
    bad.bias = &bias_bad;
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &bad, &out, &w));
    bad.bias = &bias_bool;
    EXPECT_FAIL(ATTN_STATUS_DTYPE, f(C, &q, &k, &v, &bad, &out, &w));
    attn_tensor lse_bad = make(ATTN_DTYPE_F32, lse_buf, 3, B, H, Tq - 1, 1);
    attn_tensor lse_4d = make(ATTN_DTYPE_F32, lse_buf, 4, 1, B, H, Tq);
    bad = p;
    bad.lse = &lse_bad;
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &bad, &out, &w));
    bad.lse = &lse_4d;
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &bad, &out, &w));
    /* Grouped-query heads that do not divide, and outputs that overlap inputs. */
    attn_tensor q3 = make(ATTN_DTYPE_F32, q_buf, 4, B, H + 1, Tq, D);
    attn_tensor o3 = make(ATTN_DTYPE_F32, o_buf, 4, B, H + 1, Tq, Dv);
    static float o3_buf[B * (H + 1) * Tq * Dv];
    o3.data = o3_buf;
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q3, &k, &v, &p, &o3, NULL));
    attn_tensor out_on_k = make(ATTN_DTYPE_F32, k_buf, 4, B, H, Tq, Dv);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out_on_k, &w));
    attn_tensor w_on_out = make(ATTN_DTYPE_F32, o_buf, 4, B, H, Tq, Tk);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &w_on_out));

    uint8_t m5[5] = {1, 1, 1, 1, 1};
    attn_tensor mask5 = make(ATTN_DTYPE_BOOL, m5, 1, 5, 1, 1, 1);
    bad = p;
    bad.mask = &mask5;
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, f(C, &q, &k, &v, &bad, &out, &w));
    attn_tensor mask3b = make(ATTN_DTYPE_BOOL, m_buf, 4, 1, 1, 2, Tk); /* Tq is 3 */
    bad.mask = &mask3b;
    EXPECT_FAIL(ATTN_STATUS_MASK_BROADCAST, f(C, &q, &k, &v, &bad, &out, &w));

    /* A context that asks for a kernel or instruction set that does not exist (the
     * reference uses neither field). */
    if (checks_ctx) {
        EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                        f(C, &q, &k, &v, &p, &out, &w));
        EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)-1,
                        f(C, &q, &k, &v, &p, &out, &w));
    }
    if (checks_ctx == 2) {
        EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->impl = (attn_impl)7,
                        f(C, &q, &k, &v, &p, &out, &w));
        EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->impl = (attn_impl)-1,
                        f(C, &q, &k, &v, &p, &out, &w));
    }
}

/* attn_sdpa_workspace_size checks what attn_sdpa checks. */
static int sdpa_workspace_size_as_call(attn_ctx *ctx, const attn_tensor *q,
                                       const attn_tensor *k, const attn_tensor *v,
                                       const attn_sdpa_params *p, attn_tensor *out,
                                       attn_tensor *weights)
{
    size_t bytes = 1;
    int rc = attn_sdpa_workspace_size(ctx, q, k, v, p, out, weights, &bytes);
    CHECK(rc == ATTN_OK || bytes == 0);
    return rc;
}

static void test_sdpa(void)
{
    TEST("attn_sdpa, attn_sdpa_ref and attn_sdpa_fused refuse the same bad tensors, "
         "shapes, masks, scales, empty_rows values and contexts with the same statuses; "
         "attn_sdpa_params_init(NULL) does nothing");
    covers("attn_sdpa_params_init");
    covers("attn_sdpa");
    covers("attn_sdpa_ref");
    covers("attn_sdpa_fused");
    attn_sdpa_params_init(NULL);
    bad_inputs++;
    sdpa_contract("attn_sdpa", attn_sdpa, 2);
    sdpa_contract("attn_sdpa_ref", attn_sdpa_ref, 0);
    sdpa_contract("attn_sdpa_fused", attn_sdpa_fused, 1);
    covers("attn_alibi_slopes");
    float slopes[4];
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_alibi_slopes(C, 4, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_alibi_slopes(C, 0, slopes));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_alibi_slopes(C, -1, slopes));
    covers("attn_sdpa_workspace_size");
    sdpa_contract("attn_sdpa_workspace_size", sdpa_workspace_size_as_call, 2);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_sdpa_workspace_size(C, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
}

typedef int (*sdpa_bwd_fn)(attn_ctx *, const attn_tensor *, const attn_tensor *,
                           const attn_tensor *, const attn_sdpa_params *, const attn_tensor *,
                           const attn_tensor *, const attn_tensor *, const attn_sdpa_grads *);

/* attn_sdpa_backward_workspace_size as a backward call, so that it meets the same
 * bad arguments; *bytes must be 0 whenever it fails. */
static int sdpa_backward_workspace_as_call(attn_ctx *ctx, const attn_tensor *q,
                                           const attn_tensor *k, const attn_tensor *v,
                                           const attn_sdpa_params *p, const attn_tensor *out,
                                           const attn_tensor *lse, const attn_tensor *dout,
                                           const attn_sdpa_grads *g)
{
    size_t bytes = 1;
    int rc = attn_sdpa_backward_workspace_size(ctx, q, k, v, p, out, lse, dout, g, &bytes);
    CHECK(rc == ATTN_OK || bytes == 0);
    return rc;
}

static void sdpa_backward_contract(const char *name, sdpa_bwd_fn f)
{
    enum { B = 2, H = 4, Hkv = 2, Tq = 3, Tk = 4, D = 4, Dv = 3 };
    static float q_buf[B * H * Tq * D], k_buf[B * Hkv * Tk * D], v_buf[B * Hkv * Tk * Dv];
    static float o_buf[B * H * Tq * Dv], l_buf[B * H * Tq], do_buf[B * H * Tq * Dv];
    static float dq_buf[B * H * Tq * D], dk_buf[B * Hkv * Tk * D], dv_buf[B * Hkv * Tk * Dv];
    static float b_buf[H * Tk], db_buf[H * Tk], s_buf[H], ds_buf[H];
    attn_tensor q = make(ATTN_DTYPE_F32, q_buf, 4, B, H, Tq, D);
    attn_tensor k = make(ATTN_DTYPE_F32, k_buf, 4, B, Hkv, Tk, D);
    attn_tensor v = make(ATTN_DTYPE_F32, v_buf, 4, B, Hkv, Tk, Dv);
    attn_tensor out = make(ATTN_DTYPE_F32, o_buf, 4, B, H, Tq, Dv);
    attn_tensor lse = make(ATTN_DTYPE_F32, l_buf, 3, B, H, Tq, 1);
    attn_tensor dout = make(ATTN_DTYPE_F32, do_buf, 4, B, H, Tq, Dv);
    attn_tensor dq = make(ATTN_DTYPE_F32, dq_buf, 4, B, H, Tq, D);
    attn_tensor dk = make(ATTN_DTYPE_F32, dk_buf, 4, B, Hkv, Tk, D);
    attn_tensor dv = make(ATTN_DTYPE_F32, dv_buf, 4, B, Hkv, Tk, Dv);
    attn_tensor bias = make(ATTN_DTYPE_F32, b_buf, 4, 1, H, 1, Tk);
    attn_tensor dbias = make(ATTN_DTYPE_F32, db_buf, 4, 1, H, 1, Tk);
    attn_tensor sinks = make(ATTN_DTYPE_F32, s_buf, 1, H, 1, 1, 1);
    attn_tensor dsinks = make(ATTN_DTYPE_F32, ds_buf, 1, H, 1, 1, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.bias = &bias;
    p.sinks = &sinks;
    attn_sdpa_grads g = {&dq, &dk, &dv, &dbias, &dsinks};

    fprintf(stderr, "   %s\n", name);
    EXPECT_OK(f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    attn_sdpa_grads g3 = {&dq, &dk, &dv, NULL, NULL};
    EXPECT_OK(f(C, &q, &k, &v, NULL, &out, &lse, &dout, &g3));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, NULL, &k, &v, &p, &out, &lse, &dout, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, NULL, &v, &p, &out, &lse, &dout, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, NULL, &p, &out, &lse, &dout, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, NULL, &lse, &dout, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, NULL, &dout, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, NULL, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, &dout, NULL));
    attn_sdpa_grads no_dk = {&dq, NULL, &dv, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, &dout, &no_dk));
    FOR_EACH_VARIANT(&q, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&out, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&lse, ATTN_DTYPE_I64, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dout, ATTN_DTYPE_BOOL, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dq, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dk, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dv, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dbias, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));
    FOR_EACH_VARIANT(&dsinks, ATTN_DTYPE_I32, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g));

    /* Shapes that do not fit: each gradient has its input's shape, dbias the bias's
     * own (not the broadcast one), lse [B, H, Tq], dout out's. */
    attn_tensor lse_t = make(ATTN_DTYPE_F32, l_buf, 3, B, H, Tq - 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse_t, &dout, &g));
    attn_tensor lse_4 = make(ATTN_DTYPE_F32, l_buf, 4, 1, B, H, Tq);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse_4, &dout, &g));
    attn_tensor do_d = make(ATTN_DTYPE_F32, do_buf, 4, B, H, Tq, Dv - 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &do_d, &g));
    attn_tensor dk_h = make(ATTN_DTYPE_F32, dq_buf, 4, B, H, Tk, D);
    attn_sdpa_grads g_dk = {&dq, &dk_h, &dv, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g_dk));
    attn_tensor dq_d = make(ATTN_DTYPE_F32, dq_buf, 4, B, H, Tq, D - 1);
    attn_sdpa_grads g_dq = {&dq_d, &dk, &dv, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g_dq));
    attn_tensor dv_t = make(ATTN_DTYPE_F32, dv_buf, 4, B, Hkv, Tk - 1, Dv);
    attn_sdpa_grads g_dv = {&dq, &dk, &dv_t, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g_dv));
    attn_tensor db_full = make(ATTN_DTYPE_F32, db_buf, 4, 1, 1, 1, Tk);
    attn_sdpa_grads g_db = {&dq, &dk, &dv, &db_full, NULL};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g_db));
    attn_tensor ds_h = make(ATTN_DTYPE_F32, ds_buf, 1, H - 1, 1, 1, 1);
    attn_sdpa_grads g_ds = {&dq, &dk, &dv, NULL, &ds_h};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &q, &k, &v, &p, &out, &lse, &dout, &g_ds));

    /* The forward's lse output is refused; dbias and dsinks need their inputs. */
    attn_sdpa_params bad = p;
    bad.lse = &lse;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &lse, &dout, &g3));
    bad = p;
    bad.bias = NULL;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &lse, &dout, &g));
    bad = p;
    bad.sinks = NULL;
    attn_sdpa_grads g_s = {&dq, &dk, &dv, NULL, &dsinks};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &lse, &dout, &g_s));
    bad = p;
    bad.causal = 7;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &bad, &out, &lse, &dout, &g));

    /* Gradients that share memory with an input or with each other. */
    attn_tensor dq_on_q = make(ATTN_DTYPE_F32, q_buf, 4, B, H, Tq, D);
    attn_sdpa_grads a1 = {&dq_on_q, &dk, &dv, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, &dout, &a1));
    attn_tensor dv_on_dk = make(ATTN_DTYPE_F32, dk_buf, 4, B, Hkv, Tk, Dv);
    attn_sdpa_grads a2 = {&dq, &dk, &dv_on_dk, NULL, NULL};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, &dout, &a2));
    attn_tensor ds_on_bias = make(ATTN_DTYPE_F32, b_buf, 1, H, 1, 1, 1);
    attn_sdpa_grads a3 = {&dq, &dk, &dv, NULL, &ds_on_bias};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &q, &k, &v, &p, &out, &lse, &dout, &a3));
}

static void test_sdpa_backward(void)
{
    TEST("attn_sdpa_backward, attn_sdpa_backward_ref and "
         "attn_sdpa_backward_workspace_size refuse the same bad tensors, shapes, "
         "parameters (the forward's lse among them) and overlapping gradients with the "
         "same statuses");
    covers("attn_sdpa_backward");
    covers("attn_sdpa_backward_ref");
    covers("attn_sdpa_backward_workspace_size");
    sdpa_backward_contract("attn_sdpa_backward", attn_sdpa_backward);
    sdpa_backward_contract("attn_sdpa_backward_ref", attn_sdpa_backward_ref);
    sdpa_backward_contract("attn_sdpa_backward_workspace_size", sdpa_backward_workspace_as_call);
    attn_tensor t = make(ATTN_DTYPE_F32, (float[1]){0}, 1, 1, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_sdpa_backward_workspace_size(C, &t, &t, &t, NULL, &t, &t, &t, NULL, NULL));
}

typedef int (*mha_bwd_fn)(attn_ctx *, const attn_mha_weights *, int64_t, const attn_tensor *,
                          const attn_sdpa_params *, const attn_tensor *, const attn_mha_grads *);

/* attn_mha_backward_workspace_size as a backward call, so that it meets the same bad
 * arguments; *bytes must be 0 whenever it fails. */
static int mha_backward_workspace_as_call(attn_ctx *ctx, const attn_mha_weights *w,
                                          int64_t H, const attn_tensor *x,
                                          const attn_sdpa_params *p, const attn_tensor *dout,
                                          const attn_mha_grads *g)
{
    size_t bytes = 1;
    int rc = attn_mha_backward_workspace_size(ctx, w, H, x, p, dout, g, &bytes);
    CHECK(rc == ATTN_OK || bytes == 0);
    return rc;
}

static void mha_backward_contract(const char *name, mha_bwd_fn f)
{
    enum { E = 4, B = 2, T = 3, H = 2 };
    static float wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E], x_buf[B * T * E],
        dy_buf[B * T * E], dx_buf[B * T * E], dwqkv_buf[3 * E * E], dbqkv_buf[3 * E],
        dwo_buf[E * E], dbo_buf[E], l_buf[B * H * T];
    attn_mha_weights w;
    w.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, 3 * E, E, 1, 1);
    w.b_qkv = make(ATTN_DTYPE_F32, bqkv, 1, 3 * E, 1, 1, 1);
    w.w_o = make(ATTN_DTYPE_F32, wo, 2, E, E, 1, 1);
    w.b_o = make(ATTN_DTYPE_F32, bo, 1, E, 1, 1, 1);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, B, T, E, 1);
    attn_tensor dy = make(ATTN_DTYPE_F32, dy_buf, 3, B, T, E, 1);
    attn_tensor dx = make(ATTN_DTYPE_F32, dx_buf, 3, B, T, E, 1);
    attn_tensor dwqkv = make(ATTN_DTYPE_F32, dwqkv_buf, 2, 3 * E, E, 1, 1);
    attn_tensor dbqkv = make(ATTN_DTYPE_F32, dbqkv_buf, 1, 3 * E, 1, 1, 1);
    attn_tensor dwo = make(ATTN_DTYPE_F32, dwo_buf, 2, E, E, 1, 1);
    attn_tensor dbo = make(ATTN_DTYPE_F32, dbo_buf, 1, E, 1, 1, 1);
    attn_mha_grads g = {&dx, &dwqkv, &dbqkv, &dwo, &dbo};

    fprintf(stderr, "   %s\n", name);
    EXPECT_OK(f(C, &w, H, &x, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, NULL, H, &x, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, NULL, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, NULL, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, &dy, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, 0, &x, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, 3, &x, NULL, &dy, &g));
    attn_tensor *slots[5] = {&dx, &dwqkv, &dbqkv, &dwo, &dbo};
    for (int i = 0; i < 5; i++) {
        attn_mha_grads missing = g;
        attn_tensor **fields[5] = {&missing.dx, &missing.dw_qkv, &missing.db_qkv,
                                   &missing.dw_o, &missing.db_o};
        *fields[i] = NULL;
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, &dy, &missing));
        FOR_EACH_VARIANT(slots[i], ATTN_DTYPE_I32, f(C, &w, H, &x, NULL, &dy, &g));
    }
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, f(C, &w, H, &x, NULL, &dy, &g));
    FOR_EACH_VARIANT(&dy, ATTN_DTYPE_BOOL, f(C, &w, H, &x, NULL, &dy, &g));
    FOR_EACH_VARIANT(&w.w_o, ATTN_DTYPE_I32, f(C, &w, H, &x, NULL, &dy, &g));

    /* Shapes: dout must be x's, each gradient its parameter's. */
    attn_tensor dy_t = make(ATTN_DTYPE_F32, dy_buf, 3, B, T - 1, E, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, &x, NULL, &dy_t, &g));
    attn_tensor dwqkv_t = make(ATTN_DTYPE_F32, dwqkv_buf, 2, E, 3 * E, 1, 1);
    attn_mha_grads g_t = {&dx, &dwqkv_t, &dbqkv, &dwo, &dbo};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, &x, NULL, &dy, &g_t));
    attn_tensor dbo_t = make(ATTN_DTYPE_F32, dbo_buf, 2, 1, E, 1, 1);
    attn_mha_grads g_b = {&dx, &dwqkv, &dbqkv, &dwo, &dbo_t};
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, &x, NULL, &dy, &g_b));

    /* The forward's lse output is refused; gradients may not overlap inputs or each
     * other. */
    attn_tensor lse = make(ATTN_DTYPE_F32, l_buf, 3, B, H, T, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, &p, &dy, &g));
    attn_tensor dx_on_dy = make(ATTN_DTYPE_F32, dy_buf, 3, B, T, E, 1);
    attn_mha_grads a1 = {&dx_on_dy, &dwqkv, &dbqkv, &dwo, &dbo};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, &dy, &a1));
    attn_tensor dwo_on_wo = make(ATTN_DTYPE_F32, wo, 2, E, E, 1, 1);
    attn_mha_grads a2 = {&dx, &dwqkv, &dbqkv, &dwo_on_wo, &dbo};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, &dy, &a2));
    attn_tensor dbqkv_on_dwqkv = make(ATTN_DTYPE_F32, dwqkv_buf, 1, 3 * E, 1, 1, 1);
    attn_mha_grads a3 = {&dx, &dwqkv, &dbqkv_on_dwqkv, &dwo, &dbo};
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, &x, NULL, &dy, &a3));
}

static void test_mha_backward(void)
{
    TEST("attn_mha_backward and attn_mha_backward_workspace_size refuse the same NULL "
         "arguments, bad tensors, shapes, head counts, the forward's lse and overlapping "
         "gradients with the same statuses");
    covers("attn_mha_backward");
    covers("attn_mha_backward_workspace_size");
    mha_backward_contract("attn_mha_backward", attn_mha_backward);
    mha_backward_contract("attn_mha_backward_workspace_size", mha_backward_workspace_as_call);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_backward_workspace_size(C, NULL, 1, NULL, NULL, NULL, NULL, NULL));
}

static void test_mha(void)
{
    TEST("attn_mha_weights_check and attn_mha_forward refuse NULL weights, bad weight "
         "tensors and shapes, num_heads below 1 or not dividing E, bad x and out, and a "
         "workspace whose size overflows");
    covers("attn_mha_weights_check");
    covers("attn_mha_forward");
    enum { E = 4, B = 2, T = 3, H = 2 };
    static float wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E], x_buf[B * T * E],
        o_buf[B * T * E], a_buf[B * H * T * T];
    attn_mha_weights w;
    w.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, 3 * E, E, 1, 1);
    w.b_qkv = make(ATTN_DTYPE_F32, bqkv, 1, 3 * E, 1, 1, 1);
    w.w_o = make(ATTN_DTYPE_F32, wo, 2, E, E, 1, 1);
    w.b_o = make(ATTN_DTYPE_F32, bo, 1, E, 1, 1, 1);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, B, T, E, 1);
    attn_tensor out = make(ATTN_DTYPE_F32, o_buf, 3, B, T, E, 1);
    attn_tensor att = make(ATTN_DTYPE_F32, a_buf, 4, B, H, T, T);
    int64_t e = 0;

    EXPECT_OK(attn_mha_weights_check(C, &w, H, &e));
    EXPECT_OK(attn_mha_weights_check(C, &w, H, NULL));
    EXPECT_OK(attn_mha_forward(C, &w, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_weights_check(C, NULL, H, &e));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_forward(C, NULL, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_forward(C, &w, H, NULL, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_forward(C, &w, H, &x, NULL, NULL, &att));
    const int64_t heads[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_weights_check(C, &w, heads[i], &e));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_mha_forward(C, &w, heads[i], &x, NULL, &out, NULL));
    }
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &w, 3, &e));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &w, INT64_MAX, &e));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward(C, &w, 3, &x, NULL, &out, NULL));
    attn_tensor *slots[4] = {&w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o};
    for (int s = 0; s < 4; s++) {
        FOR_EACH_VARIANT(slots[s], ATTN_DTYPE_I32, attn_mha_weights_check(C, &w, H, &e));
        FOR_EACH_VARIANT(slots[s], ATTN_DTYPE_I32,
                         attn_mha_forward(C, &w, H, &x, NULL, &out, &att));
    }
    /* Weight shapes that do not fit each other. */
    attn_mha_weights bw = w;
    bw.w_o = make(ATTN_DTYPE_F32, wo, 2, E, E - 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    bw = w;
    bw.w_o = make(ATTN_DTYPE_F32, wo, 1, E * E, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    bw = w;
    bw.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, 2 * E, E, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    bw = w;
    bw.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, E, 3 * E, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    bw = w;
    bw.b_qkv = make(ATTN_DTYPE_F32, bqkv, 1, E, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    bw = w;
    bw.b_o = make(ATTN_DTYPE_F32, bo, 2, 1, E, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_weights_check(C, &bw, H, &e));
    /* E so large that 3E would overflow: w_o [E, E] has a count past 2^63 first. */
    bw = w;
    bw.w_o.shape[0] = bw.w_o.shape[1] = (int64_t)1 << 62;
    bw.w_o.stride[0] = bw.w_o.stride[1] = 0;
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_mha_weights_check(C, &bw, H, &e));

    /* x and out. */
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, attn_mha_forward(C, &w, H, &x, NULL, &out, &att));
    FOR_EACH_VARIANT(&out, ATTN_DTYPE_I32, attn_mha_forward(C, &w, H, &x, NULL, &out, &att));
    FOR_EACH_VARIANT(&att, ATTN_DTYPE_I32, attn_mha_forward(C, &w, H, &x, NULL, &out, &att));
    attn_tensor x2 = make(ATTN_DTYPE_F32, x_buf, 2, B * T, E, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward(C, &w, H, &x2, NULL, &out, NULL));
    attn_tensor xe = make(ATTN_DTYPE_F32, x_buf, 3, B, E, T, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward(C, &w, H, &xe, NULL, &out, NULL));
    attn_tensor ot = make(ATTN_DTYPE_F32, o_buf, 3, T, B, E, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward(C, &w, H, &x, NULL, &ot, NULL));
    attn_tensor at = make(ATTN_DTYPE_F32, a_buf, 4, B, H + 1, T, T - 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward(C, &w, H, &x, NULL, &out, &at));
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.empty_rows = (attn_empty_rows)5;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_forward(C, &w, H, &x, &p, &out, NULL));
    /* x [2^30, 2^30, E] read through stride 0: its count fits in 64 bits, but the
     * workspace [B, T, 4E] does not. */
    attn_tensor xb = x, ob = out;
    xb.shape[0] = ob.shape[0] = (int64_t)1 << 30;
    xb.shape[1] = ob.shape[1] = (int64_t)1 << 30;
    xb.stride[0] = xb.stride[1] = ob.stride[0] = ob.stride[1] = 0;
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_mha_forward(C, &w, H, &xb, NULL, &ob, NULL));
}

/* attn_mha_workspace_size and attn_mha_packed_workspace_size check what the
 * forward calls check; *bytes is 0 after a failure. */
static int mha_ws_as_call(attn_ctx *ctx, const attn_mha_weights *w, int64_t H,
                          const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                          attn_tensor *att)
{
    size_t bytes = 1;
    int rc = attn_mha_workspace_size(ctx, w, H, x, p, out, att, &bytes);
    if (rc != ATTN_OK && bytes != 0) {
        check_failures_++;
        fprintf(stderr, "attn_mha_workspace_size failed but left *bytes = %zu\n", bytes);
    }
    return rc;
}

static int mha_packed_ws_as_call(attn_ctx *ctx, const attn_mha_packed *pw, int64_t H,
                                 const attn_tensor *x, const attn_sdpa_params *p,
                                 attn_tensor *out, attn_tensor *att)
{
    size_t bytes = 1;
    int rc = attn_mha_packed_workspace_size(ctx, pw, H, x, p, out, att, &bytes);
    if (rc != ATTN_OK && bytes != 0) {
        check_failures_++;
        fprintf(stderr, "attn_mha_packed_workspace_size failed but left *bytes = %zu\n", bytes);
    }
    return rc;
}

/* attn_mha_pack, freeing what it packs. */
static int mha_pack_as_call(attn_ctx *ctx, const attn_mha_weights *w)
{
    attn_mha_packed *pw = (attn_mha_packed *)&pw; /* must be set to NULL on failure */
    int rc = attn_mha_pack(ctx, w, &pw);
    if (rc != ATTN_OK && pw != NULL) {
        check_failures_++;
        fprintf(stderr, "attn_mha_pack failed but left *out = %p\n", (void *)pw);
    }
    if (rc == ATTN_OK)
        attn_mha_packed_free(ctx, pw);
    return rc;
}

/* The checks every multi-head call shares: the head count (call_heads reads it
 * from Hh) and bad x, out and attention weights (call). */
#define MHA_CALL_CHECKS(call_heads, call)                                              \
    do {                                                                               \
        const int64_t heads_[] = {0, -1, INT64_MIN};                                   \
        for (size_t i_ = 0; i_ < sizeof heads_ / sizeof heads_[0]; i_++) {             \
            int64_t Hh = heads_[i_];                                                   \
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, call_heads);                     \
        }                                                                              \
        {                                                                              \
            int64_t Hh = 3;                                                            \
            EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, call_heads);                       \
        }                                                                              \
        FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, call);                                    \
        FOR_EACH_VARIANT(&out, ATTN_DTYPE_I32, call);                                  \
        FOR_EACH_VARIANT(&att, ATTN_DTYPE_I32, call);                                  \
    } while (0)

static void test_mha_packed(void)
{
    TEST("attn_mha_workspace_size, attn_mha_pack, attn_mha_forward_packed and "
         "attn_mha_packed_workspace_size refuse what attn_mha_forward refuses, NULL "
         "outputs and packed weights, a workspace whose size overflows, and weights "
         "packed for another arch; attn_mha_packed_free accepts NULL");
    covers("attn_mha_workspace_size");
    covers("attn_mha_pack");
    covers("attn_mha_packed_free");
    covers("attn_mha_forward_packed");
    covers("attn_mha_packed_workspace_size");
    enum { E = 4, B = 2, T = 3, H = 2 };
    static float wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E], x_buf[B * T * E],
        o_buf[B * T * E], a_buf[B * H * T * T];
    attn_mha_weights w;
    w.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, 3 * E, E, 1, 1);
    w.b_qkv = make(ATTN_DTYPE_F32, bqkv, 1, 3 * E, 1, 1, 1);
    w.w_o = make(ATTN_DTYPE_F32, wo, 2, E, E, 1, 1);
    w.b_o = make(ATTN_DTYPE_F32, bo, 1, E, 1, 1, 1);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, B, T, E, 1);
    attn_tensor out = make(ATTN_DTYPE_F32, o_buf, 3, B, T, E, 1);
    attn_tensor att = make(ATTN_DTYPE_F32, a_buf, 4, B, H, T, T);
    attn_sdpa_params bad_p;
    attn_sdpa_params_init(&bad_p);
    bad_p.empty_rows = (attn_empty_rows)5;
    /* x [2^30, 2^30, E] read through stride 0: the workspace does not fit. */
    attn_tensor xb = x, ob = out;
    xb.shape[0] = ob.shape[0] = (int64_t)1 << 30;
    xb.shape[1] = ob.shape[1] = (int64_t)1 << 30;
    xb.stride[0] = xb.stride[1] = ob.stride[0] = ob.stride[1] = 0;

    /* The workspace query for unpacked weights. */
    EXPECT_OK(mha_ws_as_call(C, &w, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_workspace_size(C, &w, H, &x, NULL, &out, &att, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, mha_ws_as_call(C, NULL, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, mha_ws_as_call(C, &w, H, NULL, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, mha_ws_as_call(C, &w, H, &x, NULL, NULL, &att));
    MHA_CALL_CHECKS(mha_ws_as_call(C, &w, Hh, &x, NULL, &out, NULL),
                    mha_ws_as_call(C, &w, H, &x, NULL, &out, &att));
    FOR_EACH_VARIANT(&w.w_qkv, ATTN_DTYPE_I32, mha_ws_as_call(C, &w, H, &x, NULL, &out, &att));
    FOR_EACH_VARIANT(&w.b_o, ATTN_DTYPE_I32, mha_ws_as_call(C, &w, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, mha_ws_as_call(C, &w, H, &x, &bad_p, &out, NULL));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, mha_ws_as_call(C, &w, H, &xb, NULL, &ob, NULL));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    mha_ws_as_call(C, &w, H, &x, NULL, &out, &att));

    /* Packing. */
    EXPECT_OK(mha_pack_as_call(C, &w));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_mha_pack(C, &w, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, mha_pack_as_call(C, NULL));
    attn_tensor *slots[4] = {&w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o};
    for (int s = 0; s < 4; s++)
        FOR_EACH_VARIANT(slots[s], ATTN_DTYPE_I32, mha_pack_as_call(C, &w));
    attn_mha_weights bw = w;
    bw.w_qkv = make(ATTN_DTYPE_F32, wqkv, 2, 2 * E, E, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, mha_pack_as_call(C, &bw));
    bw = w;
    bw.b_o = make(ATTN_DTYPE_F32, bo, 1, E - 1, 1, 1, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, mha_pack_as_call(C, &bw));
    bw = w;
    bw.w_o.shape[0] = bw.w_o.shape[1] = (int64_t)1 << 62;
    bw.w_o.stride[0] = bw.w_o.stride[1] = 0;
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, mha_pack_as_call(C, &bw));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    mha_pack_as_call(C, &w));
    attn_mha_packed_free(NULL, NULL);

    /* The forward call and the workspace query on packed weights. */
    attn_mha_packed *pw = NULL;
    CHECK_INT(attn_mha_pack(NULL, &w, &pw), ATTN_OK);
    EXPECT_OK(attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    EXPECT_OK(mha_packed_ws_as_call(C, pw, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_packed_workspace_size(C, pw, H, &x, NULL, &out, &att, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed(C, NULL, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                mha_packed_ws_as_call(C, NULL, H, &x, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed(C, pw, H, NULL, NULL, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed(C, pw, H, &x, NULL, NULL, &att));
    MHA_CALL_CHECKS(attn_mha_forward_packed(C, pw, Hh, &x, NULL, &out, NULL),
                    attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    MHA_CALL_CHECKS(mha_packed_ws_as_call(C, pw, Hh, &x, NULL, &out, NULL),
                    mha_packed_ws_as_call(C, pw, H, &x, NULL, &out, &att));
    attn_tensor xe = make(ATTN_DTYPE_F32, x_buf, 3, B, E, T, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward_packed(C, pw, H, &xe, NULL, &out, NULL));
    attn_tensor ot = make(ATTN_DTYPE_F32, o_buf, 3, T, B, E, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward_packed(C, pw, H, &x, NULL, &ot, NULL));
    attn_tensor at = make(ATTN_DTYPE_F32, a_buf, 4, B, H + 1, T, T - 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &at));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed(C, pw, H, &x, &bad_p, &out, NULL));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_mha_forward_packed(C, pw, H, &xb, NULL, &ob, NULL));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, mha_packed_ws_as_call(C, pw, H, &xb, NULL, &ob, NULL));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = (attn_arch)42,
                    attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->impl = (attn_impl)9,
                    attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    const attn_arch other = attn_arch_selected(NULL) == ATTN_ARCH_REF ? ATTN_ARCH_SCALAR
                                                                       : ATTN_ARCH_REF;
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = other,
                    attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    EXPECT_FAIL_CTX(ATTN_STATUS_INVALID_ARGUMENT, C->arch = other,
                    mha_packed_ws_as_call(C, pw, H, &x, NULL, &out, &att));

    /* With RoPE: NULL rope is the plain call; what the plain call refuses is
     * refused, and so is every bad RoPE parameter. D = E / H = 2 is even; one head
     * makes D = 4, three heads do not divide E, so an odd D needs its own weights. */
    covers("attn_mha_forward_packed_rope");
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    EXPECT_OK(attn_mha_forward_packed_rope(C, pw, H, &x, NULL, NULL, &out, &att));
    EXPECT_OK(attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &rp, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, NULL, H, &x, NULL, &rp, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, NULL, NULL, &rp, &out, &att));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &rp, NULL, &att));
    MHA_CALL_CHECKS(attn_mha_forward_packed_rope(C, pw, Hh, &x, NULL, &rp, &out, NULL),
                    attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &rp, &out, &att));
    attn_rope_params bad_r = rp;
    bad_r.base = 0.0f;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &bad_r, &out, &att));
    bad_r.base = INFINITY;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &bad_r, &out, &att));
    bad_r = rp;
    bad_r.pairing = (attn_rope_pairing)7;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &bad_r, &out, &att));
    bad_r = rp;
    bad_r.offset = -1;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &bad_r, &out, &att));
    bad_r.offset = INT64_MAX - 1; /* + T = 3 positions overflows */
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW,
                attn_mha_forward_packed_rope(C, pw, H, &x, NULL, &bad_r, &out, &att));
    bad_r.offset = INT64_MAX - 2; /* the last of T = 3 rows at INT64_MAX itself: taken */
    CHECK_INT(attn_mha_forward_packed_rope(NULL, pw, H, &x, NULL, &bad_r, &out, &att), ATTN_OK);
    attn_mha_packed_free(NULL, pw);
    {
        /* E = 3, one head: D = 3 is odd, which RoPE cannot pair. */
        static float w3[9 * 3], b3[9], o3[9], c3[3], x3b[2 * 3], y3b[2 * 3];
        attn_mha_weights w_odd;
        w_odd.w_qkv = make(ATTN_DTYPE_F32, w3, 2, 9, 3, 1, 1);
        w_odd.b_qkv = make(ATTN_DTYPE_F32, b3, 1, 9, 1, 1, 1);
        w_odd.w_o = make(ATTN_DTYPE_F32, o3, 2, 3, 3, 1, 1);
        w_odd.b_o = make(ATTN_DTYPE_F32, c3, 1, 3, 1, 1, 1);
        attn_tensor x3 = make(ATTN_DTYPE_F32, x3b, 3, 1, 2, 3, 1);
        attn_tensor y3 = make(ATTN_DTYPE_F32, y3b, 3, 1, 2, 3, 1);
        attn_mha_packed *p3 = NULL;
        CHECK_INT(attn_mha_pack(NULL, &w_odd, &p3), ATTN_OK);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH,
                    attn_mha_forward_packed_rope(C, p3, 1, &x3, NULL, &rp, &y3, NULL));
        attn_mha_packed_free(NULL, p3);
    }
}

static void test_files(void)
{
    TEST("the .npy and .safetensors functions refuse NULL paths, handles, names and "
         "outputs, missing files and directories, and bad tensors to save; the free "
         "and close functions accept NULL");
    covers("attn_array_free");
    covers("attn_npy_load");
    covers("attn_npy_save");
    covers("attn_safetensors_open");
    covers("attn_safetensors_close");
    covers("attn_safetensors_count");
    covers("attn_safetensors_name");
    covers("attn_safetensors_has");
    covers("attn_safetensors_get");
    covers("attn_safetensors_save");
    const char *good_npy = ATTN_TEST_DATA_DIR "/files/ref_f32.npy";
    const char *good_st = ATTN_TEST_DATA_DIR "/files/ref_st.safetensors";
    const char *missing = ATTN_TEST_DATA_DIR "/no/such/file";
    const char *dir = ATTN_TEST_DATA_DIR;
    const char *out_npy = ATTN_TEST_TMP_DIR "/test_args_out.npy";
    const char *out_st = ATTN_TEST_TMP_DIR "/test_args_out.safetensors";
    const char *no_dir = ATTN_TEST_TMP_DIR "/no/such/dir/out.npy";
    attn_array a;

    attn_array_free(NULL, NULL);
    memset(&a, 0, sizeof a);
    attn_array_free(NULL, &a);
    bad_inputs += 2;

    EXPECT_OK((attn_npy_load(C, good_npy, &a), attn_array_free(C, &a), ATTN_OK));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load(C, NULL, &a));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load(C, good_npy, NULL));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_load(C, missing, &a));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_load(C, dir, &a));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_load(C, "", &a));
    covers("attn_npy_load_flags");
    EXPECT_OK((attn_npy_load_flags(C, good_npy, ATTN_LOAD_HALF, &a), attn_array_free(C, &a), ATTN_OK));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load_flags(C, good_npy, 2u, &a));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load_flags(C, good_npy, ~0u, &a));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load_flags(C, NULL, 0, &a));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_load_flags(C, good_npy, 0, NULL));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_load_flags(C, missing, ATTN_LOAD_HALF, &a));

    float buf[6] = {1, 2, 3, 4, 5, 6};
    attn_tensor t = make(ATTN_DTYPE_F32, buf, 2, 2, 3, 1, 1);
    EXPECT_OK(attn_npy_save(C, out_npy, &t));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_save(C, NULL, &t));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_save(C, "", &t));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_npy_save(C, out_npy, NULL));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_save(C, no_dir, &t));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_npy_save(C, dir, &t));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, attn_npy_save(C, out_npy, &t));

    attn_safetensors *st = NULL;
    EXPECT_OK((attn_safetensors_open(C, good_st, &st), attn_safetensors_close(C, st), ATTN_OK));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_open(C, NULL, &st));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_open(C, good_st, NULL));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_safetensors_open(C, missing, &st));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_safetensors_open(C, dir, &st));
    attn_safetensors_close(NULL, NULL);
    bad_inputs++;

    CHECK_INT(attn_safetensors_count(NULL), 0);
    CHECK(attn_safetensors_name(NULL, 0) == NULL);
    CHECK_INT(attn_safetensors_has(NULL, "x"), 0);
    bad_inputs += 3;
    if (attn_safetensors_open(NULL, good_st, &st) == ATTN_OK) {
        int64_t n = attn_safetensors_count(st);
        CHECK(n >= 1);
        CHECK(attn_safetensors_name(st, -1) == NULL);
        CHECK(attn_safetensors_name(st, n) == NULL);
        CHECK(attn_safetensors_name(st, INT64_MIN) == NULL);
        CHECK(attn_safetensors_name(st, INT64_MAX) == NULL);
        CHECK_INT(attn_safetensors_has(st, NULL), 0);
        CHECK_INT(attn_safetensors_has(st, ""), 0);
        bad_inputs += 6;
        const char *first = attn_safetensors_name(st, 0);
        EXPECT_OK((attn_safetensors_get(C, st, first, &a), attn_array_free(C, &a), ATTN_OK));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get(C, NULL, first, &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get(C, st, NULL, &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get(C, st, first, NULL));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get(C, st, "", &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_safetensors_get(C, st, "no such tensor\n\x01", &a));
        covers("attn_safetensors_get_flags");
        EXPECT_OK((attn_safetensors_get_flags(C, st, first, ATTN_LOAD_HALF, &a),
                   attn_array_free(C, &a), ATTN_OK));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get_flags(C, st, first, 4u, &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get_flags(C, NULL, first, 0, &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get_flags(C, st, NULL, 0, &a));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_get_flags(C, st, first, 0, NULL));
        attn_safetensors_close(NULL, st);
    } else {
        CHECK(!"test_args: cannot open the reference .safetensors file");
    }

    const char *names[2] = {"a", "b"};
    attn_tensor ts[2] = {t, t};
    EXPECT_OK(attn_safetensors_save(C, out_st, names, ts, 2));
    EXPECT_OK(attn_safetensors_save(C, out_st, NULL, NULL, 0));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_save(C, NULL, names, ts, 2));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_save(C, "", names, ts, 2));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_save(C, out_st, NULL, ts, 2));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_save(C, out_st, names, NULL, 2));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_safetensors_save(C, out_st, names, ts, -1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_safetensors_save(C, out_st, names, ts, INT64_MIN));
    const char *bad_names[][2] = {{NULL, "b"}, {"a", NULL}, {"", "b"},
                                  {"__metadata__", "b"}, {"a", "a"}};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                    attn_safetensors_save(C, out_st, bad_names[i], ts, 2));
    EXPECT_FAIL(ATTN_STATUS_IO, attn_safetensors_save(C, no_dir, names, ts, 2));
    FOR_EACH_VARIANT(&ts[1], NO_WRONG_DTYPE, attn_safetensors_save(C, out_st, names, ts, 2));
    remove(out_npy);
    remove(out_st);
}

/* One output set with one add (npy, safetensors or bytes as `kind` says) and, when
 * that succeeds, a commit; the set is freed either way. Returns the first failure. */
static int one_output(attn_ctx *c, int kind, const char *path, const attn_tensor *t,
                      const char *const *names, int64_t n, const void *bytes, size_t size)
{
    attn_output_set *s = NULL;
    int rc = attn_output_set_create(c, &s);
    if (rc)
        return rc;
    rc = kind == 0   ? attn_output_set_add_npy(c, s, path, t)
         : kind == 1 ? attn_output_set_add_safetensors(c, s, path, names, t, n)
                     : attn_output_set_add_bytes(c, s, path, bytes, size);
    if (!rc)
        rc = attn_output_set_commit(c, s);
    attn_output_set_free(c, s);
    return rc;
}

/* A set whose first add fails refuses its commit; a committed set refuses a second
 * commit and any add. Returns the status of the call under test (`which`). */
static int spent_set(attn_ctx *c, int which, const char *path, const attn_tensor *t)
{
    attn_output_set *s = NULL;
    int rc = attn_output_set_create(c, &s);
    if (rc)
        return rc;
    if (which == 0) {
        attn_output_set_add_npy(c, s, "", t);
        rc = attn_output_set_commit(c, s);
    } else {
        rc = attn_output_set_commit(c, s); /* an empty set commits fine */
        if (!rc)
            rc = which == 1 ? attn_output_set_commit(c, s)
                            : attn_output_set_add_npy(c, s, path, t);
    }
    attn_output_set_free(c, s);
    return rc;
}

static void test_output_sets(void)
{
    TEST("the output-set functions refuse NULL sets, names, tensors and data, a "
         "directory or a missing directory as a target, two names for one file, a "
         "set whose add failed and a set already committed; free accepts NULL");
    covers("attn_output_set_create");
    covers("attn_output_set_add_npy");
    covers("attn_output_set_add_safetensors");
    covers("attn_output_set_add_bytes");
    covers("attn_output_set_commit");
    covers("attn_output_set_free");
    covers("attn_output_remove_temporaries");
    const char *out = ATTN_TEST_TMP_DIR "/test_args_set.npy";
    const char *out_dot = "./test_args_set_dot.npy";
    const char *no_dir = ATTN_TEST_TMP_DIR "/no/such/dir/out.npy";
    float buf[6] = {1, 2, 3, 4, 5, 6};
    attn_tensor t = make(ATTN_DTYPE_F32, buf, 2, 2, 3, 1, 1);
    const char *names[1] = {"a"};

    EXPECT_OK(one_output(C, 0, out, &t, NULL, 0, NULL, 0));
    EXPECT_OK(one_output(C, 1, out, &t, names, 1, NULL, 0));
    EXPECT_OK(one_output(C, 2, out, NULL, NULL, 0, "abc", 3));
    EXPECT_OK(one_output(C, 2, out, NULL, NULL, 0, NULL, 0));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_output_set_create(C, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_output_set_add_npy(C, NULL, out, &t));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_output_set_add_safetensors(C, NULL, out, names, &t, 1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_output_set_add_bytes(C, NULL, out, "a", 1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_output_set_commit(C, NULL));
    for (int kind = 0; kind < 3; kind++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, kind, NULL, &t, names, 1, "a", 1));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, kind, "", &t, names, 1, "a", 1));
        EXPECT_FAIL(ATTN_STATUS_IO, one_output(C, kind, no_dir, &t, names, 1, "a", 1));
        EXPECT_FAIL(ATTN_STATUS_IO,
                    one_output(C, kind, ATTN_TEST_DATA_DIR, &t, names, 1, "a", 1));
    }
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, 0, out, NULL, NULL, 0, NULL, 0));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, 1, out, &t, NULL, 1, NULL, 0));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, 1, out, &t, names, -1, NULL, 0));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, one_output(C, 2, out, NULL, NULL, 0, NULL, 5));
    FOR_EACH_VARIANT(&t, NO_WRONG_DTYPE, one_output(C, 0, out, &t, NULL, 0, NULL, 0));
    for (int which = 0; which < 3; which++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, spent_set(C, which, out, &t));

    /* Two names for one new file, in one set: refused at the second add. The test runs
     * in the build's test folder, so "./NAME" and its absolute name are one file. */
    {
        char abs_dot[1200];
        char cwd[1024];
        if (getcwd(cwd, sizeof cwd)) {
            snprintf(abs_dot, sizeof abs_dot, "%s/%s", cwd, out_dot + 2);
            attn_ctx c;
            attn_ctx_init(&c);
            attn_output_set *s = NULL;
            CHECK_INT(attn_output_set_create(&c, &s), ATTN_OK);
            CHECK_INT(attn_output_set_add_npy(&c, s, out_dot, &t), ATTN_OK);
            CHECK_INT(attn_output_set_add_npy(&c, s, abs_dot, &t), ATTN_STATUS_INVALID_ARGUMENT);
            CHECK_STR_CONTAINS(c.message, "same file");
            CHECK_INT(attn_output_set_commit(&c, s), ATTN_STATUS_INVALID_ARGUMENT);
            attn_output_set_free(&c, s);
            CHECK(access(out_dot, F_OK) != 0);
            bad_inputs += 2;
        }
    }
    attn_output_set_free(NULL, NULL);
    attn_output_remove_temporaries(); /* nothing live: a no-op that must not crash */
    bad_inputs += 2;
    remove(out);
}

/* attn_gqa_workspace_size and attn_gqa_pack as calls that check *bytes and *out. */
static int gqa_ws_as_call(attn_ctx *ctx, const attn_gqa_weights *w, int64_t H, int64_t Hkv,
                          const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                          attn_tensor *att)
{
    size_t bytes = 1;
    int rc = attn_gqa_workspace_size(ctx, w, H, Hkv, x, p, out, att, &bytes);
    if (rc != ATTN_OK && bytes != 0) {
        check_failures_++;
        fprintf(stderr, "attn_gqa_workspace_size failed but left *bytes = %zu\n", bytes);
    }
    return rc;
}

static int gqa_pack_as_call(attn_ctx *ctx, const attn_gqa_weights *w, int64_t H, int64_t Hkv)
{
    attn_mha_packed *pw = (attn_mha_packed *)&pw; /* must be set to NULL on failure */
    int rc = attn_gqa_pack(ctx, w, H, Hkv, &pw);
    if (rc != ATTN_OK && pw != NULL) {
        check_failures_++;
        fprintf(stderr, "attn_gqa_pack failed but left *out = %p\n", (void *)pw);
    }
    if (rc == ATTN_OK)
        attn_mha_packed_free(ctx, pw);
    return rc;
}

/* Every grouped-query call on the same arguments: forward, workspace size, pack
 * (which ignores x and out) and the weights check. */
static int gqa_any(attn_ctx *ctx, int which, const attn_gqa_weights *w, int64_t H,
                   int64_t Hkv, const attn_tensor *x, attn_tensor *out, attn_tensor *att)
{
    int64_t e, d;
    switch (which) {
    case 0: return attn_gqa_forward(ctx, w, H, Hkv, x, NULL, out, att);
    case 1: return gqa_ws_as_call(ctx, w, H, Hkv, x, NULL, out, att);
    case 2: return gqa_pack_as_call(ctx, w, H, Hkv);
    default: return attn_gqa_weights_check(ctx, w, H, Hkv, &e, &d);
    }
}

typedef int (*gqa_bwd_fn)(attn_ctx *, const attn_gqa_weights *, int64_t, int64_t,
                          const attn_tensor *, const attn_sdpa_params *,
                          const attn_rope_params *, const attn_tensor *,
                          const attn_gqa_grads *);

/* attn_gqa_backward_workspace_size as a backward call, so that it meets the same bad
 * arguments; *bytes must be 0 whenever it fails. */
static int gqa_backward_workspace_as_call(attn_ctx *ctx, const attn_gqa_weights *w, int64_t H,
                                          int64_t Hkv, const attn_tensor *x,
                                          const attn_sdpa_params *p,
                                          const attn_rope_params *rope,
                                          const attn_tensor *dout, const attn_gqa_grads *g)
{
    size_t bytes = 1;
    int rc = attn_gqa_backward_workspace_size(ctx, w, H, Hkv, x, p, rope, dout, g, &bytes);
    CHECK(rc == ATTN_OK || bytes == 0);
    return rc;
}

static void gqa_backward_contract(const char *name, gqa_bwd_fn f)
{
    /* H = 2 query heads, Hkv = 1, head_dim 2 (even, for RoPE): H*D = 4 = E. */
    enum { E = 4, B = 2, T = 3, H = 2, HKV = 1, D = 2 };
    static float wq[H * D * E], wk[HKV * D * E], wv[HKV * D * E], wo[E * H * D], bq[H * D],
        bk[HKV * D], bv[HKV * D], bo[E], x_buf[B * T * E], dy_buf[B * T * E],
        dx_buf[B * T * E], dwq_buf[H * D * E], dwk_buf[HKV * D * E], dwv_buf[HKV * D * E],
        dwo_buf[E * H * D], dbq_buf[H * D], dbk_buf[HKV * D], dbv_buf[HKV * D], dbo_buf[E],
        l_buf[B * H * T];
    attn_gqa_weights w;
    w.w_q = make(ATTN_DTYPE_F32, wq, 2, H * D, E, 1, 1);
    w.w_k = make(ATTN_DTYPE_F32, wk, 2, HKV * D, E, 1, 1);
    w.w_v = make(ATTN_DTYPE_F32, wv, 2, HKV * D, E, 1, 1);
    w.w_o = make(ATTN_DTYPE_F32, wo, 2, E, H * D, 1, 1);
    w.b_q = make(ATTN_DTYPE_F32, bq, 1, H * D, 1, 1, 1);
    w.b_k = make(ATTN_DTYPE_F32, bk, 1, HKV * D, 1, 1, 1);
    w.b_v = make(ATTN_DTYPE_F32, bv, 1, HKV * D, 1, 1, 1);
    w.b_o = make(ATTN_DTYPE_F32, bo, 1, E, 1, 1, 1);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, B, T, E, 1);
    attn_tensor dy = make(ATTN_DTYPE_F32, dy_buf, 3, B, T, E, 1);
    attn_tensor dx = make(ATTN_DTYPE_F32, dx_buf, 3, B, T, E, 1);
    attn_tensor dwq = make(ATTN_DTYPE_F32, dwq_buf, 2, H * D, E, 1, 1);
    attn_tensor dwk = make(ATTN_DTYPE_F32, dwk_buf, 2, HKV * D, E, 1, 1);
    attn_tensor dwv = make(ATTN_DTYPE_F32, dwv_buf, 2, HKV * D, E, 1, 1);
    attn_tensor dwo = make(ATTN_DTYPE_F32, dwo_buf, 2, E, H * D, 1, 1);
    attn_tensor dbq = make(ATTN_DTYPE_F32, dbq_buf, 1, H * D, 1, 1, 1);
    attn_tensor dbk = make(ATTN_DTYPE_F32, dbk_buf, 1, HKV * D, 1, 1, 1);
    attn_tensor dbv = make(ATTN_DTYPE_F32, dbv_buf, 1, HKV * D, 1, 1, 1);
    attn_tensor dbo = make(ATTN_DTYPE_F32, dbo_buf, 1, E, 1, 1, 1);
    attn_gqa_grads g = {&dx, &dwq, &dwk, &dwv, &dwo, &dbq, &dbk, &dbv, &dbo};
    attn_rope_params rp;
    attn_rope_params_init(&rp);

    fprintf(stderr, "   %s\n", name);
    EXPECT_OK(f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g));
    EXPECT_OK(f(C, &w, H, HKV, &x, NULL, &rp, &dy, &g));
    /* Bias gradients are optional, and may be asked for without the biases. */
    attn_gqa_grads nob = {&dx, &dwq, &dwk, &dwv, &dwo, NULL, NULL, NULL, NULL};
    EXPECT_OK(f(C, &w, H, HKV, &x, NULL, NULL, &dy, &nob));
    attn_gqa_weights nb = w;
    nb.b_q.data = nb.b_k.data = nb.b_v.data = nb.b_o.data = NULL;
    EXPECT_OK(f(C, &nb, H, HKV, &x, NULL, NULL, &dy, &g));

    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, NULL, H, HKV, &x, NULL, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, NULL, NULL, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, NULL, NULL, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, NULL, &dy, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, 0, HKV, &x, NULL, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, 0, &x, NULL, NULL, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, 2, 2, &x, NULL, NULL, &dy, &g));
    attn_tensor *slots[9] = {&dx, &dwq, &dwk, &dwv, &dwo, &dbq, &dbk, &dbv, &dbo};
    for (int i = 0; i < 9; i++) {
        attn_gqa_grads missing = g;
        attn_tensor **fields[5] = {&missing.dx, &missing.dw_q, &missing.dw_k, &missing.dw_v,
                                   &missing.dw_o};
        if (i < 5) {
            *fields[i] = NULL;
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        f(C, &w, H, HKV, &x, NULL, NULL, &dy, &missing));
        }
        FOR_EACH_VARIANT(slots[i], ATTN_DTYPE_I32, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g));
    }
    FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g));
    FOR_EACH_VARIANT(&dy, ATTN_DTYPE_BOOL, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g));
    FOR_EACH_VARIANT(&w.w_k, ATTN_DTYPE_I32, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g));

    /* Shapes: dout must be x's, each gradient its parameter's. */
    attn_tensor dy_t = make(ATTN_DTYPE_F32, dy_buf, 3, B, T - 1, E, 1);
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, HKV, &x, NULL, NULL, &dy_t, &g));
    attn_gqa_grads g_t = g;
    g_t.dw_k = &dwq; /* [H*D, E] where [Hkv*D, E] is due */
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g_t));
    attn_tensor dbo_t = make(ATTN_DTYPE_F32, dbo_buf, 2, 1, E, 1, 1);
    attn_gqa_grads g_b = g;
    g_b.db_o = &dbo_t;
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &g_b));

    /* RoPE's parameters are checked as the forward checks them. */
    attn_rope_params neg = rp, pair = rp, huge = rp, base0 = rp;
    neg.offset = -1;
    pair.pairing = (attn_rope_pairing)7;
    huge.offset = INT64_MAX;
    base0.base = 0.0f;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, &neg, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, &pair, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, &base0, &dy, &g));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, f(C, &w, H, HKV, &x, NULL, &huge, &dy, &g));
    attn_rope_params edge = rp; /* the last of T rows at INT64_MAX itself: taken */
    edge.offset = INT64_MAX - (T - 1);
    EXPECT_OK(f(C, &w, H, HKV, &x, NULL, &edge, &dy, &g));

    /* The forward's lse output is refused; gradients may not overlap inputs or each
     * other. */
    attn_tensor lse = make(ATTN_DTYPE_F32, l_buf, 3, B, H, T, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, &p, NULL, &dy, &g));
    attn_tensor dx_on_dy = make(ATTN_DTYPE_F32, dy_buf, 3, B, T, E, 1);
    attn_gqa_grads a1 = g;
    a1.dx = &dx_on_dy;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &a1));
    attn_tensor dwv_on_wv = make(ATTN_DTYPE_F32, wv, 2, HKV * D, E, 1, 1);
    attn_gqa_grads a2 = g;
    a2.dw_v = &dwv_on_wv;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &a2));
    attn_tensor dbk_on_dwk = make(ATTN_DTYPE_F32, dwk_buf, 1, HKV * D, 1, 1, 1);
    attn_gqa_grads a3 = g;
    a3.db_k = &dbk_on_dwk;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, f(C, &w, H, HKV, &x, NULL, NULL, &dy, &a3));
}

static void test_gqa_backward(void)
{
    TEST("attn_gqa_backward and attn_gqa_backward_workspace_size refuse the same NULL "
         "arguments, bad tensors, shapes, head counts, RoPE parameters, the forward's lse "
         "and overlapping gradients with the same statuses; bias gradients are optional");
    covers("attn_gqa_backward");
    covers("attn_gqa_backward_workspace_size");
    gqa_backward_contract("attn_gqa_backward", attn_gqa_backward);
    gqa_backward_contract("attn_gqa_backward_workspace_size", gqa_backward_workspace_as_call);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_gqa_backward_workspace_size(C, NULL, 1, 1, NULL, NULL, NULL, NULL, NULL,
                                                 NULL));
}

static void test_gqa(void)
{
    TEST("attn_gqa_weights_check, attn_gqa_forward, attn_gqa_workspace_size and "
         "attn_gqa_pack refuse NULL weights, bad weight and bias tensors, head counts "
         "below 1, H not a multiple of Hkv, projections whose rows do not match the head "
         "counts, bad x and out; a bias with NULL data is no bias; weights packed for "
         "num_heads H refuse another count in attn_mha_forward_packed");
    covers("attn_gqa_weights_check");
    covers("attn_gqa_forward");
    covers("attn_gqa_workspace_size");
    covers("attn_gqa_pack");
    /* H = 2 query heads, Hkv = 1, head_dim 3: H*D = 6 differs from E = 4. */
    enum { E = 4, B = 2, T = 3, H = 2, HKV = 1, D = 3 };
    static float wq[H * D * E], wk[HKV * D * E], wv[HKV * D * E], wo[E * H * D], bq[H * D],
        bk[HKV * D], bv[HKV * D], bo[E], x_buf[B * T * E], o_buf[B * T * E],
        a_buf[B * H * T * T];
    attn_gqa_weights w;
    w.w_q = make(ATTN_DTYPE_F32, wq, 2, H * D, E, 1, 1);
    w.w_k = make(ATTN_DTYPE_F32, wk, 2, HKV * D, E, 1, 1);
    w.w_v = make(ATTN_DTYPE_F32, wv, 2, HKV * D, E, 1, 1);
    w.w_o = make(ATTN_DTYPE_F32, wo, 2, E, H * D, 1, 1);
    w.b_q = make(ATTN_DTYPE_F32, bq, 1, H * D, 1, 1, 1);
    w.b_k = make(ATTN_DTYPE_F32, bk, 1, HKV * D, 1, 1, 1);
    w.b_v = make(ATTN_DTYPE_F32, bv, 1, HKV * D, 1, 1, 1);
    w.b_o = make(ATTN_DTYPE_F32, bo, 1, E, 1, 1, 1);
    attn_tensor x = make(ATTN_DTYPE_F32, x_buf, 3, B, T, E, 1);
    attn_tensor out = make(ATTN_DTYPE_F32, o_buf, 3, B, T, E, 1);
    attn_tensor att = make(ATTN_DTYPE_F32, a_buf, 4, B, H, T, T);
    int64_t e = 0, d = 0;
    EXPECT_OK(attn_gqa_weights_check(C, &w, H, HKV, &e, &d));
    CHECK_INT(e, E);
    CHECK_INT(d, D);
    EXPECT_OK(attn_gqa_weights_check(C, &w, H, HKV, NULL, NULL));
    for (int c = 0; c < 4; c++)
        EXPECT_OK(gqa_any(C, c, &w, H, HKV, &x, &out, &att));
    /* No biases at all is a Llama block. */
    attn_gqa_weights nb = w;
    nb.b_q.data = nb.b_k.data = nb.b_v.data = nb.b_o.data = NULL;
    for (int c = 0; c < 4; c++)
        EXPECT_OK(gqa_any(C, c, &nb, H, HKV, &x, &out, &att));

    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_gqa_workspace_size(C, &w, H, HKV, &x, NULL, &out, &att, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_gqa_pack(C, &w, H, HKV, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_gqa_forward(C, &w, H, HKV, NULL, NULL, &out, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_gqa_forward(C, &w, H, HKV, &x, NULL, NULL, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, gqa_ws_as_call(C, &w, H, HKV, NULL, NULL, &out, NULL));
    for (int c = 0; c < 4; c++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, gqa_any(C, c, NULL, H, HKV, &x, &out, &att));
        const int64_t bad_heads[] = {0, -1, INT64_MIN};
        for (size_t i = 0; i < sizeof bad_heads / sizeof bad_heads[0]; i++) {
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        gqa_any(C, c, &w, bad_heads[i], HKV, &x, &out, NULL));
            EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                        gqa_any(C, c, &w, H, bad_heads[i], &x, &out, NULL));
        }
        /* H = 3 gives D = 2 (k has 3 rows, not 2); H = 4 does not divide 6 rows;
         * Hkv = 2 wants 6 rows of k; Hkv = 3 does not divide H = 2; INT64_MAX
         * query heads do not divide the rows. */
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, 3, 1, &x, &out, NULL));
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, 4, 1, &x, &out, NULL));
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, 2, 2, &x, &out, NULL));
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, 2, 3, &x, &out, NULL));
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, INT64_MAX, 1, &x, &out, NULL));
        /* Each weight tensor spoiled in every way, with the wrong dtype too. */
        attn_tensor *ws[4] = {&w.w_q, &w.w_k, &w.w_v, &w.w_o};
        for (int s = 0; s < 4; s++)
            FOR_EACH_VARIANT(ws[s], ATTN_DTYPE_I32, gqa_any(C, c, &w, H, HKV, &x, &out, &att));
        /* A bias spoiled in every way but a NULL pointer (which means no bias). */
        attn_tensor *bs[4] = {&w.b_q, &w.b_k, &w.b_v, &w.b_o};
        for (int s = 0; s < 4; s++) {
            const attn_tensor saved = *bs[s];
            for (int v = 0; v < V_COUNT; v++) {
                if (v == V_DATA_NULL || (v == V_NUMEL_OVF && saved.ndim < 2))
                    continue;
                for (int k = 0; k < variant_count(v, &saved); k++) {
                    *bs[s] = spoil(&saved, v, k, ATTN_DTYPE_I32);
                    EXPECT_FAIL(variant_status(v, &saved),
                                gqa_any(C, c, &w, H, HKV, &x, &out, &att));
                }
            }
            *bs[s] = saved;
        }
        /* Shapes that do not match each other. */
        attn_gqa_weights bw = w;
        bw.w_v = make(ATTN_DTYPE_F32, wv, 2, HKV * D, E - 1, 1, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
        bw = w;
        bw.w_o = make(ATTN_DTYPE_F32, wo, 2, E, H * D - 1, 1, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
        bw = w;
        bw.w_q = make(ATTN_DTYPE_F32, wq, 3, H, D, E, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
        bw = w;
        bw.b_k = make(ATTN_DTYPE_F32, bk, 1, HKV * D - 1, 1, 1, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
        bw = w;
        bw.b_o = make(ATTN_DTYPE_F32, bo, 2, E, 1, 1, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
        bw = w;
        bw.w_q.shape[0] = (int64_t)1 << 62;
        bw.w_q.stride[0] = 0;
        EXPECT_FAIL(ATTN_STATUS_OVERFLOW, gqa_any(C, c, &bw, H, HKV, &x, &out, NULL));
    }
    /* x, out and the attention weights, for the calls that take them. */
    for (int c = 0; c < 2; c++) {
        FOR_EACH_VARIANT(&x, ATTN_DTYPE_I32, gqa_any(C, c, &w, H, HKV, &x, &out, &att));
        FOR_EACH_VARIANT(&out, ATTN_DTYPE_I32, gqa_any(C, c, &w, H, HKV, &x, &out, &att));
        FOR_EACH_VARIANT(&att, ATTN_DTYPE_I32, gqa_any(C, c, &w, H, HKV, &x, &out, &att));
        attn_tensor xe = make(ATTN_DTYPE_F32, x_buf, 3, B, E, T, 1);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, H, HKV, &xe, &out, NULL));
        attn_tensor at = make(ATTN_DTYPE_F32, a_buf, 4, B, HKV, T, T);
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, gqa_any(C, c, &w, H, HKV, &x, &out, &at));
        /* The output may not overlap a weight. */
        attn_tensor ow = make(ATTN_DTYPE_F32, wo, 3, 1, T, E, 1);
        attn_tensor x1 = make(ATTN_DTYPE_F32, x_buf, 3, 1, T, E, 1);
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, gqa_any(C, c, &w, H, HKV, &x1, &ow, NULL));
    }
    /* Packed grouped-query weights remember their head size and key/value heads. */
    attn_mha_packed *pw = NULL;
    CHECK_INT(attn_gqa_pack(NULL, &w, H, HKV, &pw), ATTN_OK);
    EXPECT_OK(attn_mha_forward_packed(C, pw, H, &x, NULL, &out, &att));
    const int64_t other_heads[] = {1, 3, 6, 0, -1};
    for (size_t i = 0; i < sizeof other_heads / sizeof other_heads[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH,
                    attn_mha_forward_packed(C, pw, other_heads[i], &x, NULL, &out, NULL));
    attn_mha_packed_free(NULL, pw);
}

static void test_weights(void)
{
    TEST("attn_weights_load refuses a NULL w or path, num_heads below 1, a prefix over "
         "300 bytes and missing files; attn_weights_free accepts NULL and cleared weights");
    covers("attn_weights_load");
    covers("attn_weights_free");
    const char *good = ATTN_TEST_DATA_DIR "/golden/mha_chapter_pad_causal/weights.safetensors";
    attn_mha_weights w;
    EXPECT_OK((attn_weights_load(C, good, "", 3, &w), attn_weights_free(C, &w), ATTN_OK));
    EXPECT_OK((attn_weights_load(C, good, NULL, 3, &w), attn_weights_free(C, &w), ATTN_OK));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load(C, good, "", 3, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load(C, NULL, "", 3, &w));
    const int64_t heads[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load(C, good, "", heads[i], &w));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load(C, good, "", 5, &w));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load(C, good, "", INT64_MAX, &w));
    char long_prefix[400];
    memset(long_prefix, 'p', sizeof long_prefix - 1);
    long_prefix[sizeof long_prefix - 1] = '\0';
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load(C, good, long_prefix, 3, &w));
    EXPECT_FAIL(ATTN_STATUS_IO,
                attn_weights_load(C, ATTN_TEST_DATA_DIR "/no/such.safetensors", "", 3, &w));
    EXPECT_FAIL(ATTN_STATUS_FORMAT, attn_weights_load(C, good, "no.such.prefix.", 3, &w));
    attn_weights_free(NULL, NULL);
    memset(&w, 0, sizeof w);
    attn_weights_free(NULL, &w);
    bad_inputs += 2;

    TEST("attn_weights_load_gqa refuses a NULL w or path, head counts below 1, H not a "
         "multiple of Hkv, projections that do not match the head counts, a long prefix, "
         "missing files and names, and a fused name set; attn_gqa_weights_free accepts "
         "NULL and cleared weights");
    covers("attn_weights_load_gqa");
    covers("attn_gqa_weights_free");
    const char *gqa = ATTN_TEST_DATA_DIR "/golden_gqa/gqa_h4_kv2_nobias_causal/weights.safetensors";
    const char *pre = "model.layers.0.self_attn.";
    attn_gqa_weights g;
    EXPECT_OK((attn_weights_load_gqa(C, gqa, pre, 4, 2, &g), attn_gqa_weights_free(C, &g), ATTN_OK));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load_gqa(C, gqa, pre, 4, 2, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load_gqa(C, NULL, pre, 4, 2, &g));
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load_gqa(C, gqa, pre, heads[i], 2, &g));
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load_gqa(C, gqa, pre, 4, heads[i], &g));
    }
    /* Hkv = 3 does not divide H = 4; H = 8 makes D = 2 and k_proj would need 4 rows
     * (it has 8); Hkv = 4 wants 16 rows of k_proj; H = 3 does not divide 16 rows. */
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load_gqa(C, gqa, pre, 4, 3, &g));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load_gqa(C, gqa, pre, 8, 2, &g));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load_gqa(C, gqa, pre, 4, 4, &g));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_weights_load_gqa(C, gqa, pre, 3, 1, &g));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_weights_load_gqa(C, gqa, long_prefix, 4, 2, &g));
    EXPECT_FAIL(ATTN_STATUS_IO,
                attn_weights_load_gqa(C, ATTN_TEST_DATA_DIR "/no/such.safetensors", pre, 4, 2, &g));
    EXPECT_FAIL(ATTN_STATUS_FORMAT, attn_weights_load_gqa(C, gqa, "", 4, 2, &g));
    EXPECT_FAIL(ATTN_STATUS_FORMAT, attn_weights_load_gqa(C, good, "", 3, 3, &g));
    attn_gqa_weights_free(NULL, NULL);
    memset(&g, 0, sizeof g);
    attn_gqa_weights_free(NULL, &g);
    bad_inputs += 2;
}

static void test_dispatch_threads(void)
{
    TEST("the dispatch, thread and version queries take NULL contexts, unknown arch values and "
         "names, and thread counts below 1 or absurdly high");
    covers("attn_arch_name");
    covers("attn_arch_parse");
    covers("attn_arch_supported");
    covers("attn_arch_best");
    covers("attn_arch_selected");
    covers("attn_arch_reason");
    covers("attn_threads_online");
    covers("attn_threads_resolve");
    covers("attn_cpu_features");
    covers("attn_cpu_features_string");
    /* No arguments to get wrong: the bits are ATTN_CPU_* only, and the words name
     * each of the four features whether present or not. */
    CHECK((attn_cpu_features() & ~(ATTN_CPU_F16C | ATTN_CPU_AVX512_BF16 | ATTN_CPU_AVX512_FP16 |
                                   ATTN_CPU_AMX_BF16)) == 0);
    CHECK_STR_CONTAINS(attn_cpu_features_string(), "avx512-bf16");
    CHECK_STR_CONTAINS(attn_cpu_features_string(), "amx-bf16");
    /* attn_version takes nothing either: the library's version is the header's. */
    covers("attn_version");
    CHECK_STR_EQ(attn_version(), ATTN_VERSION_STRING);
    const int odd[] = {-1, 7, 42, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        CHECK_STR_EQ(attn_arch_name((attn_arch)odd[i]), "unknown");
        CHECK_INT(attn_arch_supported((attn_arch)odd[i]), 0);
        bad_inputs += 2;
    }
    attn_arch a = ATTN_ARCH_AUTO;
    CHECK_INT(attn_arch_parse(NULL, &a), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_arch_parse("avx2", NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_arch_parse(NULL, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    const char *names[] = {"", "AVX2", "avx2 ", "avx", "unknown", "sse"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK_INT(attn_arch_parse(names[i], &a), ATTN_STATUS_INVALID_ARGUMENT);
    bad_inputs += 3 + (long)(sizeof names / sizeof names[0]);
    attn_arch best = attn_arch_best();
    CHECK(best >= ATTN_ARCH_REF && best <= ATTN_ARCH_AMX);
    attn_arch sel = attn_arch_selected(NULL);
    CHECK(sel >= ATTN_ARCH_REF && sel <= ATTN_ARCH_AMX);
    CHECK(attn_arch_reason(NULL) != NULL && attn_arch_reason(NULL)[0] != '\0');
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = (attn_arch)42;
    CHECK(attn_arch_reason(&ctx) != NULL && attn_arch_reason(&ctx)[0] != '\0');
    sel = attn_arch_selected(&ctx); /* not a path: the automatic choice is reported */
    CHECK(sel == attn_arch_selected(NULL));
    ctx.arch = (attn_arch)-1;
    CHECK(attn_arch_selected(&ctx) == attn_arch_selected(NULL));
    bad_inputs += 5;

    int online = attn_threads_online();
    CHECK(online >= 1);
    CHECK(attn_threads_resolve(NULL) >= 1);
    const int counts[] = {-1, -1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        ctx.threads = counts[i];
        int t = attn_threads_resolve(&ctx);
        CHECK(t >= 1);
        CHECK(t <= (counts[i] > 0 ? 4096 : online));
        bad_inputs++;
    }
}

static void test_rope_and_kv_cache(void)
{
    TEST("RoPE refuses NULL tensors, an odd head dim, a base that is not a positive finite "
         "number, a negative offset, an unknown pairing, another shape or dtype and an out "
         "that overlaps x; the KV cache refuses bad configs, small or misaligned memory, "
         "sequences out of range, shapes that do not fit, a full cache, a truncate that "
         "grows, an empty view, a top-left causal attend, queries longer than a sequence, "
         "a NULL bytes, and dtypes that are neither float32 nor the cache's (its config's, "
         "k, v, q, out, weights)");
    covers("attn_rope_params_init");
    covers("attn_rope_apply");
    covers("attn_rope_backward");
    covers("attn_kv_cache_bytes");
    covers("attn_kv_cache_create");
    covers("attn_kv_cache_free");
    covers("attn_kv_cache_length");
    covers("attn_kv_cache_append");
    covers("attn_kv_cache_truncate");
    covers("attn_kv_cache_view");
    covers("attn_kv_cache_attend");
    covers("attn_kv_cache_workspace_size");

    /* RoPE. */
    static float xb[2 * 3 * 4], ob[2 * 3 * 4], x5[2 * 3 * 5];
    attn_tensor x, out, odd, other, f64;
    const int64_t sh[3] = {2, 3, 4}, sh5[3] = {2, 3, 5}, sh2[3] = {2, 3, 2};
    attn_tensor_init(NULL, &x, ATTN_DTYPE_F32, xb, 3, sh);
    attn_tensor_init(NULL, &out, ATTN_DTYPE_F32, ob, 3, sh);
    attn_tensor_init(NULL, &odd, ATTN_DTYPE_F32, x5, 3, sh5);
    attn_tensor_init(NULL, &other, ATTN_DTYPE_F32, ob, 3, sh2);
    f64 = out;
    f64.dtype = ATTN_DTYPE_I32;
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    attn_rope_params_init(NULL); /* NULL-safe */
    CHECK(rp.pairing == ATTN_ROPE_INTERLEAVED && rp.base == 10000.0f && rp.offset == 0);
    EXPECT_OK(attn_rope_apply(C, &rp, &x, &out));
    EXPECT_OK(attn_rope_apply(C, NULL, &x, &x));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &rp, NULL, &out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &rp, &x, NULL));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_rope_apply(C, &rp, &odd, &odd));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_rope_apply(C, &rp, &x, &other));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_rope_apply(C, &rp, &x, &f64));
    const float bases[] = {0.0f, -1.0f, INFINITY, NAN};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        attn_rope_params b = rp;
        b.base = bases[i];
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &b, &x, &out));
    }
    attn_rope_params neg = rp, pair = rp, huge = rp;
    neg.offset = -1;
    pair.pairing = (attn_rope_pairing)7;
    huge.offset = INT64_MAX;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &neg, &x, &out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &pair, &x, &out));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_rope_apply(C, &huge, &x, &out));
    attn_tensor shifted = x; /* the same memory one element further: overlaps x */
    shifted.data = xb + 1;
    shifted.shape[0] = 1;
    attn_tensor x1 = x;
    x1.shape[0] = 1;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_apply(C, &rp, &x1, &shifted));
    /* attn_rope_backward makes attn_rope_apply's checks. */
    EXPECT_OK(attn_rope_backward(C, &rp, &x, &out));
    EXPECT_OK(attn_rope_backward(C, NULL, &x, &x));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_backward(C, &rp, NULL, &out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_backward(C, &rp, &x, NULL));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_rope_backward(C, &rp, &odd, &odd));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_rope_backward(C, &rp, &x, &other));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_rope_backward(C, &rp, &x, &f64));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_backward(C, &neg, &x, &out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_backward(C, &pair, &x, &out));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_rope_backward(C, &huge, &x, &out));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_rope_backward(C, &rp, &x1, &shifted));

    /* The cache: B 2, Hkv 1, capacity 4, D 4. */
    attn_kv_cache_config cfg = {2, 1, 4, 4, 0, ATTN_DTYPE_F32};
    size_t bytes = 0;
    EXPECT_OK(attn_kv_cache_bytes(C, &cfg, &bytes));
    CHECK(bytes > 2 * 2 * 4 * 4 * sizeof(float));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_bytes(C, NULL, &bytes));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_bytes(C, &cfg, NULL));
    const attn_kv_cache_config bad[] = {{0, 1, 4, 4, 0, ATTN_DTYPE_F32},
                                        {2, 0, 4, 4, 0, ATTN_DTYPE_F32},
                                        {2, 1, 0, 4, 0, ATTN_DTYPE_F32},
                                        {2, 1, 4, -1, 0, ATTN_DTYPE_F32},
                                        {2, 1, 4, 4, -3, ATTN_DTYPE_F32}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_bytes(C, &bad[i], &bytes));
    const attn_kv_cache_config ovf = {INT64_MAX / 2, 4, INT64_MAX / 4, 8, 0, ATTN_DTYPE_F32};
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_kv_cache_bytes(C, &ovf, &bytes));
    attn_kv_cache *kc = NULL;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_create(C, &cfg, NULL, 0, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_create(C, &bad[0], NULL, 0, &kc));
    EXPECT_FAIL(ATTN_STATUS_OVERFLOW, attn_kv_cache_create(C, &ovf, NULL, 0, &kc));
    CHECK(kc == NULL);
    CHECK_INT(attn_kv_cache_bytes(NULL, &cfg, &bytes), ATTN_OK); /* the failures above cleared it */
    unsigned char *mem = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_create(C, &cfg, mem, bytes - 1, &kc));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_create(C, &cfg, mem + 8, bytes, &kc));
    EXPECT_OK((attn_kv_cache_create(C, &cfg, mem, bytes, &kc), attn_kv_cache_free(C, kc),
               ATTN_OK));
    attn_kv_cache_free(NULL, NULL);
    bad_inputs++;

    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &kc), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(kc, 0), 0);
    CHECK_INT(attn_kv_cache_length(kc, 2), -1);
    CHECK_INT(attn_kv_cache_length(kc, -1), -1);
    CHECK_INT(attn_kv_cache_length(NULL, 0), -1);
    bad_inputs += 3;
    static float kb[2 * 1 * 3 * 4], vb[2 * 1 * 3 * 4], k5b[2 * 1 * 3 * 5], qb[2 * 2 * 1 * 4],
        obuf[2 * 2 * 1 * 4], wb[2 * 2 * 1 * 4];
    attn_tensor k3 = tu_tensor4(kb, 2, 1, 3, 4), v3 = tu_tensor4(vb, 2, 1, 3, 4);
    attn_tensor k5 = tu_tensor4(k5b, 2, 1, 3, 5), k1 = tu_tensor4(kb, 1, 1, 3, 4),
                v1 = tu_tensor4(vb, 1, 1, 3, 4);
    attn_tensor q = tu_tensor4(qb, 2, 2, 1, 4), o = tu_tensor4(obuf, 2, 2, 1, 4),
                w = tu_tensor4(wb, 2, 2, 1, 4), q3 = tu_tensor4(qb, 1, 2, 1, 4);
    /* Attend before anything was appended: the queries have no keys. */
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q, NULL, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_view(C, kc, 0, &k1, &v1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, NULL, 0, &k3, &v3, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, 0, NULL, &v3, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, 1, &k3, &v3, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, -1, &k1, &v1, NULL));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_kv_cache_append(C, kc, 0, &k5, &v3, NULL));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_kv_cache_append(C, kc, 0, &k3, &v1, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, 0, &k3, &v3, &pair));
    CHECK_INT(attn_kv_cache_append(&ctx, kc, 0, &k3, &v3, &rp), ATTN_OK);
    /* 3 of 4 positions held: 3 more do not fit, and nothing is appended. */
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, 0, &k3, &v3, NULL));
    CHECK_INT(attn_kv_cache_length(kc, 0), 3);
    CHECK_INT(attn_kv_cache_length(kc, 1), 3);
    attn_tensor kv_view;
    CHECK_INT(attn_kv_cache_view(&ctx, kc, 1, &kv_view, NULL), ATTN_OK);
    /* k overlapping the cache's own memory is refused. */
    attn_tensor kv1 = kv_view;
    kv1.shape[2] = 1;
    attn_tensor vv1 = tu_tensor4(vb, 1, 1, 1, 4);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_append(C, kc, 0, &kv1, &vv1, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_view(C, NULL, 0, &k1, &v1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_view(C, kc, 2, &k1, &v1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_truncate(C, NULL, 0, 1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_truncate(C, kc, 0, 4));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_truncate(C, kc, 0, -1));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_truncate(C, kc, 5, 1));
    EXPECT_OK(attn_kv_cache_truncate(C, kc, 1, 3));

    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    EXPECT_OK(attn_kv_cache_attend(C, kc, 0, &q, &p, &rp, &o, &w));
    attn_tensor o1 = tu_tensor4(obuf, 1, 2, 1, 4), w3 = tu_tensor4(wb, 2, 2, 1, 3);
    EXPECT_OK(attn_kv_cache_attend(C, kc, 1, &q3, NULL, NULL, &o1, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q, &p, NULL, &o, &o));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, NULL, 0, &q, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, NULL, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q, &p, NULL, NULL, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 1, &q, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_kv_cache_attend(C, kc, 0, &q, &p, NULL, &o, &w3));
    EXPECT_FAIL(ATTN_STATUS_SHAPE_MISMATCH, attn_kv_cache_attend(C, kc, 0, &k3, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q, &p, &pair, &o, NULL));
    attn_sdpa_params tl = p;
    tl.causal = ATTN_CAUSAL_TOP_LEFT;
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q, &tl, NULL, &o, NULL));
    attn_tensor q2 = tu_tensor4(qb, 2, 2, 2, 4);
    CHECK_INT(attn_kv_cache_truncate(&ctx, kc, -1, 1), ATTN_OK);
    CHECK_INT(attn_kv_cache_length(kc, 1), 1);
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT, attn_kv_cache_attend(C, kc, 0, &q2, &p, NULL, &o, NULL));
    bytes = 0;
    EXPECT_OK(attn_kv_cache_workspace_size(C, kc, 0, &q, &p, NULL, &o, &w, &bytes));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_kv_cache_workspace_size(C, kc, 0, &q, &p, NULL, &o, &w, NULL));
    EXPECT_FAIL(ATTN_STATUS_INVALID_ARGUMENT,
                attn_kv_cache_workspace_size(C, kc, 0, &q, &tl, NULL, &o, &w, &bytes));
    CHECK(bytes == 0);

    /* A 16-bit cache (SPEC section 10): the config's dtype, and q, k, v, out each
     * float32 or the cache's dtype; any other dtype is refused, naming it. */
    const attn_kv_cache_config bad_dt[] = {{2, 1, 4, 4, 0, ATTN_DTYPE_I32},
                                           {2, 1, 4, 4, 0, (attn_dtype)99}};
    attn_kv_cache *none = NULL;
    for (size_t i = 0; i < sizeof bad_dt / sizeof bad_dt[0]; i++) {
        EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_bytes(C, &bad_dt[i], &bytes));
        EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_create(C, &bad_dt[i], NULL, 0, &none));
    }
    CHECK(none == NULL);
    const attn_kv_cache_config cfg16 = {2, 1, 4, 4, 0, ATTN_DTYPE_BF16};
    size_t bytes16 = 0, bytes32 = 0;
    EXPECT_OK(attn_kv_cache_bytes(C, &cfg16, &bytes16));
    EXPECT_OK(attn_kv_cache_bytes(C, &cfg, &bytes32));
    CHECK(bytes16 < bytes32);
    attn_kv_cache *kc16 = NULL;
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg16, NULL, 0, &kc16), ATTN_OK);
    static uint16_t k16b[2 * 1 * 3 * 4], v16b[2 * 1 * 3 * 4], q16b[2 * 2 * 1 * 4],
        o16b[2 * 2 * 1 * 4];
    const int64_t s_kv[4] = {2, 1, 3, 4}, s_q[4] = {2, 2, 1, 4};
    attn_tensor kbf, vbf, khf, qbf, qhf, obf, ohf, wbf;
    attn_tensor_init(NULL, &kbf, ATTN_DTYPE_BF16, k16b, 4, s_kv);
    attn_tensor_init(NULL, &vbf, ATTN_DTYPE_BF16, v16b, 4, s_kv);
    attn_tensor_init(NULL, &khf, ATTN_DTYPE_F16, k16b, 4, s_kv);
    attn_tensor_init(NULL, &qbf, ATTN_DTYPE_BF16, q16b, 4, s_q);
    attn_tensor_init(NULL, &qhf, ATTN_DTYPE_F16, q16b, 4, s_q);
    attn_tensor_init(NULL, &obf, ATTN_DTYPE_BF16, o16b, 4, s_q);
    attn_tensor_init(NULL, &ohf, ATTN_DTYPE_F16, o16b, 4, s_q);
    attn_tensor_init(NULL, &wbf, ATTN_DTYPE_BF16, wb, 4, s_q);
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_append(C, kc16, 0, &khf, &vbf, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_append(C, kc16, 0, &kbf, &khf, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_append(C, kc, 0, &kbf, &vbf, NULL));
    /* Rounding needs the context's converters: a context forcing a path this CPU
     * cannot run is refused, as attend refuses it. */
    if (!attn_arch_supported(ATTN_ARCH_AMX))
        EXPECT_FAIL_CTX(ATTN_STATUS_UNSUPPORTED, ctx_.arch = ATTN_ARCH_AMX,
                        attn_kv_cache_append(C, kc16, 0, &kbf, &vbf, NULL));
    EXPECT_OK(attn_kv_cache_append(C, kc16, 0, &kbf, &vbf, &rp));
    EXPECT_OK(attn_kv_cache_attend(C, kc16, 0, &qbf, &p, &rp, &obf, NULL));
    EXPECT_OK(attn_kv_cache_attend(C, kc16, 0, &q, &p, NULL, &obf, &w));
    EXPECT_OK(attn_kv_cache_attend(C, kc16, 0, &qbf, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_attend(C, kc16, 0, &qhf, &p, NULL, &obf, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_attend(C, kc16, 0, &qbf, &p, NULL, &ohf, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_attend(C, kc16, 0, &qbf, &p, NULL, &obf, &wbf));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_attend(C, kc, 0, &qbf, &p, NULL, &o, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE, attn_kv_cache_attend(C, kc, 0, &q, &p, NULL, &obf, NULL));
    EXPECT_FAIL(ATTN_STATUS_DTYPE,
                attn_kv_cache_workspace_size(C, kc16, 0, &qhf, &p, NULL, &obf, NULL, &bytes));
    EXPECT_OK(attn_kv_cache_workspace_size(C, kc16, 0, &qbf, &p, NULL, &obf, NULL, &bytes));
    attn_tensor view16;
    EXPECT_OK(attn_kv_cache_view(C, kc16, 0, &view16, NULL));
    CHECK_INT(view16.dtype, ATTN_DTYPE_BF16);
    attn_kv_cache_free(&ctx, kc16);
    attn_kv_cache_free(&ctx, kc);
    free(mem);
}

/* ---- the random number functions ----------------------------------------------- */

typedef void (*child_fn)(void);

/* Runs fn in a child process; 1 if it returned normally. */
static int survives(child_fn fn)
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* The child's crash report (from a sanitizer build) is noise here. */
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        fn();
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void rng_seed_null(void) { attn_rng_seed(NULL, 1); }
static void rng_u32_null(void) { (void)attn_rng_u32(NULL); }
static void rng_u64_null(void) { (void)attn_rng_u64(NULL); }
static void rng_normal_null(void) { (void)attn_rng_normal_f64(NULL); }
static void rng_randn_null_rng(void)
{
    float x[4];
    attn_rng_randn(NULL, x, 4);
}
static void rng_randn_null_out(void)
{
    attn_rng r;
    attn_rng_seed(&r, 1);
    attn_rng_randn(&r, NULL, 4);
}
static void rng_uniform_null_out(void)
{
    attn_rng r;
    attn_rng_seed(&r, 1);
    attn_rng_uniform(&r, NULL, 4, 0.0f, 1.0f);
}
static void rng_linear_null_weight(void)
{
    attn_rng r;
    attn_rng_seed(&r, 1);
    attn_rng_linear_init(&r, NULL, NULL, 4, 4);
}
static void rng_linear_overflow(void)
{
    /* out * in overflows int64 (signed overflow: UBSan stops here); it must be
     * refused as a size below 1 rather than wrap to 0. */
    attn_rng r;
    attn_rng_seed(&r, 1);
    float w[1];
    attn_rng_linear_init(&r, w, NULL, INT64_MIN, 4);
}
static void rng_bad_index(void)
{
    attn_rng r;
    attn_rng_seed(&r, 1);
    r.index = -5; /* a corrupted or uninitialised struct */
    (void)attn_rng_u32(&r);
}

static void test_rng(void)
{
    TEST("the random number functions with sizes below 1 do nothing, and with NULL "
         "pointers, overflowing sizes or a corrupted state they survive (in a child process)");
    covers("attn_rng_seed");
    covers("attn_rng_u32");
    covers("attn_rng_u64");
    covers("attn_rng_normal_f64");
    covers("attn_rng_randn");
    covers("attn_rng_uniform");
    covers("attn_rng_linear_init");
    attn_rng r, r0;
    attn_rng_seed(&r, 42);
    r0 = r;
    float sentinel[2] = {123.0f, 456.0f};
    const int64_t sizes[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        attn_rng_randn(&r, sentinel, sizes[i]);
        attn_rng_uniform(&r, sentinel, sizes[i], 0.0f, 1.0f);
        bad_inputs += 2;
    }
    /* out_features * in_features elements are drawn: none when either is 0 or one is
     * negative (INT64_MIN is left to the child process below: the product overflows). */
    attn_rng_linear_init(&r, sentinel, NULL, 0, 4);
    attn_rng_linear_init(&r, sentinel, NULL, -1, 4);
    attn_rng_linear_init(&r, sentinel, NULL, 4, 0);
    attn_rng_linear_init(&r, sentinel, NULL, 4, -1);
    bad_inputs += 4;
    /* Nothing was drawn or written. */
    CHECK(sentinel[0] == 123.0f && sentinel[1] == 456.0f);
    CHECK(memcmp(&r, &r0, sizeof r) == 0);

    static const struct {
        const char *what;
        child_fn fn;
    } cases[] = {
        {"attn_rng_seed(NULL, ...)", rng_seed_null},
        {"attn_rng_u32(NULL)", rng_u32_null},
        {"attn_rng_u64(NULL)", rng_u64_null},
        {"attn_rng_normal_f64(NULL)", rng_normal_null},
        {"attn_rng_randn(NULL, x, 4)", rng_randn_null_rng},
        {"attn_rng_randn(rng, NULL, 4)", rng_randn_null_out},
        {"attn_rng_uniform(rng, NULL, 4, ...)", rng_uniform_null_out},
        {"attn_rng_linear_init(rng, NULL, NULL, 4, 4)", rng_linear_null_weight},
        {"attn_rng_linear_init(rng, w, NULL, INT64_MIN, 4)", rng_linear_overflow},
        {"attn_rng u32 with rng->index = -5", rng_bad_index},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ok = survives(cases[i].fn);
        bad_inputs++;
        if (ok != 1)
            fprintf(stderr, "   %s does not survive\n", cases[i].what);
        CHECK_INT(ok, 1);
    }
}

/* ---- every function of the header is exercised ---------------------------------- */

static void test_header_coverage(void)
{
    TEST("every function declared in include/attn.h is called with bad arguments here");
    const char *path = ATTN_TEST_DATA_DIR "/../../include/attn.h";
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    char line[512];
    int declared = 0, missing = 0;
    while (fgets(line, sizeof line, f)) {
        /* A declaration starts in column 0 with a type and names attn_xxx( . */
        if (line[0] == ' ' || line[0] == '\t' || line[0] == '/' || line[0] == '*' ||
            line[0] == '#' || line[0] == '\n' || strncmp(line, "typedef", 7) == 0)
            continue;
        for (char *p = strstr(line, "attn_"); p; p = strstr(p + 1, "attn_")) {
            if (p > line && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z')))
                continue;
            size_t n = 0;
            while ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= '0' && p[n] <= '9') ||
                   p[n] == '_')
                n++;
            if (p[n] != '(')
                continue;
            char name[96];
            if (n >= sizeof name)
                continue;
            memcpy(name, p, n);
            name[n] = '\0';
            declared++;
            int found = 0;
            for (int i = 0; i < n_covered && !found; i++)
                found = strcmp(covered[i], name) == 0;
            if (!found) {
                missing++;
                fprintf(stderr, "   %s is declared in attn.h but not tested here\n", name);
            }
            break;
        }
    }
    fclose(f);
    fprintf(stderr, "   %d functions declared, %d covered, %d missing\n", declared,
            declared - missing, missing);
    CHECK(declared >= 50);
    CHECK_INT(missing, 0);
}

int main(void)
{
    test_status_and_ctx();
    test_dtype();
    test_tensor_init_alloc();
    test_tensor_queries();
    test_tensor_check();
    test_tensor_views();
    test_shapes();
    test_masks();
    test_linear();
    test_linear_packed();
    test_sdpa();
    test_sdpa_backward();
    test_mha();
    test_mha_backward();
    test_mha_packed();
    test_gqa();
    test_gqa_backward();
    test_files();
    test_output_sets();
    test_weights();
    test_dispatch_threads();
    test_rng();
    test_rope_and_kv_cache();
    test_header_coverage();
    fprintf(stderr, "test_args: %ld bad inputs tried\n", bad_inputs);
    /* The README: "tests/test_args.c tries more than 8000 of them". */
    CHECK(bad_inputs > 8000);
    return check_summary("test_args");
}
