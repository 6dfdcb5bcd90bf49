/*
 * test_tensor.c - tensors, shapes as Python tuples, broadcasting, status names and
 * the linear projection: the pieces every other part stands on.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_shapes(void)
{
    char buf[128];
    TEST("shapes print as Python tuples: (2, 5, 16), (5,) and ()");
    const int64_t s3[3] = {2, 5, 16}, s1[1] = {5};
    attn_shape_format(buf, sizeof buf, 3, s3);
    CHECK_STR_EQ(buf, "(2, 5, 16)");
    attn_shape_format(buf, sizeof buf, 1, s1);
    CHECK_STR_EQ(buf, "(5,)");
    attn_shape_format(buf, sizeof buf, 0, s1);
    CHECK_STR_EQ(buf, "()");
    TEST("a short buffer gets a truncated, terminated string and the needed length");
    char small[5];
    CHECK_INT(attn_shape_format(small, sizeof small, 3, s3), 10);
    CHECK_STR_EQ(small, "(2, ");
}

static void test_init_and_views(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    float data[2 * 3 * 4];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i;
    attn_tensor t, v;
    const int64_t shape[3] = {2, 3, 4};
    TEST("a contiguous tensor has row-major strides and its element count");
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 3, shape), ATTN_OK);
    CHECK_INT(t.stride[0], 12);
    CHECK_INT(t.stride[1], 4);
    CHECK_INT(t.stride[2], 1);
    CHECK_INT(attn_tensor_numel(&t), 24);
    CHECK(attn_tensor_is_contiguous(&t));

    TEST("a transpose is a view: element (b, j, i) of the view is element (b, i, j) of the tensor");
    CHECK_INT(attn_tensor_transpose(&ctx, &t, 1, 2, &v), ATTN_OK);
    CHECK_INT(v.shape[1], 4);
    CHECK_INT(v.shape[2], 3);
    CHECK(!attn_tensor_is_contiguous(&v));
    CHECK(((float *)v.data)[1 * v.stride[0] + 3 * v.stride[1] + 2 * v.stride[2]] == data[1 * 12 + 2 * 4 + 3]);

    TEST("copying a view into a contiguous tensor lays its elements out in row-major order");
    float out[24];
    attn_tensor c;
    const int64_t cs[3] = {2, 4, 3};
    attn_tensor_init(&ctx, &c, ATTN_DTYPE_F32, out, 3, cs);
    CHECK_INT(attn_tensor_copy(&ctx, &v, &c), ATTN_OK);
    CHECK(out[0 * 12 + 1 * 3 + 2] == data[0 * 12 + 2 * 4 + 1]);

    TEST("reshape keeps the element count and refuses another one or a non-contiguous view");
    const int64_t r2[2] = {6, 4}, r_bad[2] = {5, 5};
    CHECK_INT(attn_tensor_reshape(&ctx, &t, 2, r2, &c), ATTN_OK);
    CHECK_INT(c.stride[0], 4);
    CHECK_INT(attn_tensor_reshape(&ctx, &t, 2, r_bad, &c), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "cannot reshape (2, 3, 4) into (5, 5)");
    CHECK_INT(attn_tensor_reshape(&ctx, &v, 2, r2, &c), ATTN_STATUS_INVALID_ARGUMENT);

    TEST("narrow selects a range of an axis without a copy, and refuses a range outside it");
    CHECK_INT(attn_tensor_narrow(&ctx, &t, 2, 1, 2, &c), ATTN_OK);
    CHECK(((float *)c.data)[0] == 1.0f);
    CHECK_INT(c.shape[2], 2);
    CHECK_INT(attn_tensor_narrow(&ctx, &t, 2, 3, 2, &c), ATTN_STATUS_INVALID_ARGUMENT);

    TEST("a size below 1 is refused with the shape in the message");
    const int64_t zero[2] = {3, 0};
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 2, zero), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "(3, 0)");
    TEST("more than 4 dimensions, or none, are refused");
    const int64_t five[5] = {1, 1, 1, 1, 1};
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 5, five), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 0, five), ATTN_STATUS_INVALID_ARGUMENT);
    TEST("sizes whose product overflows 64 bits or size_t are refused");
    const int64_t big[3] = {INT64_C(1) << 31, INT64_C(1) << 31, 4};
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 3, big), ATTN_STATUS_OVERFLOW);
    const int64_t big2[2] = {INT64_C(1) << 61, 2};
    CHECK_INT(attn_tensor_init(&ctx, &t, ATTN_DTYPE_F32, data, 2, big2), ATTN_STATUS_OVERFLOW);
    CHECK_STR_CONTAINS(ctx.message, "size_t");
    TEST("attn_tensor_alloc gives zeroed memory and refuses an impossible size");
    CHECK_INT(attn_tensor_alloc(&ctx, &t, ATTN_DTYPE_I64, 3, shape), ATTN_OK);
    int64_t sum = 0;
    for (int i = 0; i < 24; i++)
        sum += ((int64_t *)t.data)[i];
    CHECK_INT(sum, 0);
    attn_tensor_free(&ctx, &t);
    CHECK(t.data == NULL);
    CHECK_INT(attn_tensor_alloc(&ctx, &t, ATTN_DTYPE_F32, 2, big2), ATTN_STATUS_OVERFLOW);
}

static void test_broadcast(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int nd;
    int64_t out[4];
    TEST("[B,1,1,T] and [1,1,T,T] broadcast to [B,1,T,T]");
    const int64_t a[4] = {2, 1, 1, 5}, b[4] = {1, 1, 5, 5};
    CHECK_INT(attn_broadcast_shape(&ctx, 4, a, 4, b, &nd, out), ATTN_OK);
    CHECK_INT(nd, 4);
    CHECK(out[0] == 2 && out[1] == 1 && out[2] == 5 && out[3] == 5);
    TEST("shapes are right-aligned: (5,) and (3, 1) give (3, 5)");
    const int64_t c[1] = {5}, d[2] = {3, 1};
    CHECK_INT(attn_broadcast_shape(&ctx, 1, c, 2, d, &nd, out), ATTN_OK);
    CHECK(nd == 2 && out[0] == 3 && out[1] == 5);
    TEST("(5, 5) and (2, 1, 3, 3) do not broadcast, and the message names both");
    const int64_t e[2] = {5, 5}, f[4] = {2, 1, 3, 3};
    CHECK_INT(attn_broadcast_shape(&ctx, 2, e, 4, f, &nd, out), ATTN_STATUS_MASK_BROADCAST);
    CHECK_STR_CONTAINS(ctx.message, "(5, 5) and (2, 1, 3, 3) do not broadcast");
}

static void test_status(void)
{
    TEST("every status has a name and a description; unknown codes say so");
    const int codes[] = {ATTN_OK, ATTN_STATUS_INVALID_ARGUMENT, ATTN_STATUS_SHAPE_MISMATCH,
                         ATTN_STATUS_MASK_BROADCAST, ATTN_STATUS_EMPTY_ROW, ATTN_STATUS_OVERFLOW,
                         ATTN_STATUS_NO_MEMORY, ATTN_STATUS_DTYPE, ATTN_STATUS_IO,
                         ATTN_STATUS_FORMAT, ATTN_STATUS_UNSUPPORTED};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        CHECK(strcmp(attn_status_name(codes[i]), "UNKNOWN") != 0);
        CHECK(strcmp(attn_strerror(codes[i]), "unknown status") != 0);
    }
    CHECK_STR_EQ(attn_status_name(ATTN_STATUS_EMPTY_ROW), "EMPTY_ROW");
    CHECK_STR_EQ(attn_status_name(-999), "UNKNOWN");
    CHECK_STR_EQ(attn_strerror(12345), "unknown status");
    TEST("a NULL context is allowed everywhere and keeps no message");
    const int64_t zero[1] = {0};
    attn_tensor t;
    CHECK_INT(attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, NULL, 1, zero), ATTN_STATUS_INVALID_ARGUMENT);
}

static void test_linear(void)
{
    TEST("linear computes y = x W^T + b in nn.Linear's [out, in] layout (checked against doubles)");
    enum { N = 7, IN = 13, OUT = 5 };
    float x[N * IN], W[OUT * IN], b[OUT], y[N * OUT];
    tu_fill(x, N * IN, 1);
    tu_fill(W, OUT * IN, 2);
    tu_fill(b, OUT, 3);
    attn_tensor tx, tw, tb, ty;
    const int64_t xs[2] = {N, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[2] = {N, OUT};
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, x, 2, xs);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, W, 2, ws);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, bs);
    attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, y, 2, ys);
    CHECK_INT(attn_linear(NULL, &tx, &tw, &tb, &ty), ATTN_OK);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double acc = b[o];
            for (int i = 0; i < IN; i++)
                acc += (double)x[n * IN + i] * W[o * IN + i];
            CHECK_NEAR(y[n * OUT + o], acc, 1e-5, 1e-5); /* 13-term float sums of values in [-1, 1] */
        }
    TEST("linear without a bias adds nothing");
    float y2[N * OUT];
    ty.data = y2;
    CHECK_INT(attn_linear(NULL, &tx, &tw, NULL, &ty), ATTN_OK);
    for (int n = 0; n < N * OUT; n++)
        CHECK_NEAR(y2[n] + b[n % OUT], y[n], 1e-6, 0);
    TEST("linear refuses a weight whose in_features differ from x's last axis, naming both shapes");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    const int64_t ws_bad[2] = {OUT, IN - 1};
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, W, 2, ws_bad);
    CHECK_INT(attn_linear(&ctx, &tx, &tw, &tb, &ty), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "weight (5, 12) does not fit x (7, 13)");
}

int main(void)
{
    test_shapes();
    test_init_and_views();
    test_broadcast();
    test_status();
    test_linear();
    return check_summary("test_tensor");
}
