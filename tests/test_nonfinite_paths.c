/*
 * test_nonfinite_paths.c - one rule for non-finite values on every path: a NaN or
 * an inf in q, k or v reaches every row whose softmax includes that key, exactly as
 * the reference (and PyTorch) computes it - so a key whose weight underflowed to 0
 * but that is not masked still poisons its row (0 * NaN = NaN, 0 * inf = NaN) - and
 * a masked key never reaches the output.
 *
 * For problems on the fused kernel's row path (Tq <= 8), its split-key form (long
 * key axes without the weights) and its tile path (key tiles that are full,
 * partial, or both), with no mask, the causal flag, a padding
 * mask and a random mask, a NaN, +inf or -inf is put in one element of q, k or v
 * (a value also at a key whose weight underflows to exactly 0), and every
 * instruction-set path this machine runs, with 1 and 2 threads, is compared with
 * the reference:
 *
 *   - every element of out and of the weights is of the same class (finite, NaN,
 *     +inf, -inf) as the reference's;
 *   - every row the bad element does not reach keeps exactly the bits that path
 *     gives without it (and so does the reference);
 *   - a NaN reaches every row that sees it (the reference is checked for that too,
 *     so that the comparison cannot pass on two wrong answers).
 *
 * tests/test_nonfinite.c holds the contract's sentences on one small causal head;
 * this file sweeps the kernel's paths.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MASK_NONE, MASK_CAUSAL, MASK_PADDING, MASK_RANDOM };
static const char *const mask_names[] = {"none", "causal", "padding", "random"};

typedef struct problem {
    int B, H, Tq, Tk, D, Dv, mask;
    const char *what; /* which path and which key tiles it exercises */
    int no_weights;   /* 1: the weights are not asked for, so that a long key axis
                         takes the row path's split-key form (fused_split.h) */
} problem;

/* Where the bad value goes: tensor 'q', 'k' or 'v', element (B-1, H-1, row, col)
 * (row is a query row for q, a key for k and v). With `underflow`, the scores are
 * arranged so that key `row` scores at least 200 below every other key of every
 * row (so its weight is exactly 0 on every path: expf and the kernel's exp both
 * give 0 there) without being masked. */
typedef struct placement {
    char tensor;
    int row, col;
    float value;
    int underflow;
    int keys_positive; /* component `col` of every key made positive (|k| + 0.1) */
} placement;

/* One problem's data; the mask is [B, 1, Tq, Tk] (random), [B, 1, 1, Tk] (padding)
 * or absent. */
typedef struct data {
    const problem *pb;
    float *q, *k, *v;
    unsigned char *mask;
    float scale;
} data;

static int visible(const data *d, int b, int i, int j)
{
    const problem *pb = d->pb;
    switch (pb->mask) {
    case MASK_CAUSAL:
        return j <= i;
    case MASK_PADDING:
        return d->mask[(size_t)b * pb->Tk + j] != 0;
    case MASK_RANDOM:
        return d->mask[((size_t)b * pb->Tq + i) * pb->Tk + j] != 0;
    default:
        return 1;
    }
}

/* Runs attention on d with the reference (arch REF) or the fused kernel on arch. */
static void run(const data *d, attn_arch arch, int threads, float *out, float *w)
{
    const problem *pb = d->pb;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    if (arch == ATTN_ARCH_REF) {
        ctx.impl = ATTN_IMPL_REF;
    } else {
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = arch;
    }
    ctx.threads = threads;
    attn_tensor tq = tu_tensor4(d->q, pb->B, pb->H, pb->Tq, pb->D),
                tk = tu_tensor4(d->k, pb->B, pb->H, pb->Tk, pb->D),
                tv = tu_tensor4(d->v, pb->B, pb->H, pb->Tk, pb->Dv),
                to = tu_tensor4(out, pb->B, pb->H, pb->Tq, pb->Dv),
                tw = tu_tensor4(w, pb->B, pb->H, pb->Tq, pb->Tk), tm;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.has_scale = 1;
    p.scale = d->scale;
    p.causal = pb->mask == MASK_CAUSAL;
    p.empty_rows = ATTN_EMPTY_ROWS_ZERO; /* the random mask hides some rows entirely */
    if (pb->mask == MASK_PADDING || pb->mask == MASK_RANDOM) {
        const int64_t ms[4] = {pb->B, 1, pb->mask == MASK_RANDOM ? pb->Tq : 1, pb->Tk};
        attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, d->mask, 4, ms);
        p.mask = &tm;
    }
    if (pb->no_weights)
        memset(w, 0, (size_t)pb->B * pb->H * pb->Tq * pb->Tk * sizeof(float));
    int rc = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, pb->no_weights ? NULL : &tw);
    if (rc != ATTN_OK)
        fprintf(stderr, "attn_sdpa on %s: %s\n", attn_arch_name(arch), ctx.message);
    CHECK_INT(rc, ATTN_OK);
}

/* 0 finite, 1 NaN, 2 +inf, 3 -inf. */
static int fclass(float x)
{
    if (isnan(x))
        return 1;
    if (isinf(x))
        return x > 0 ? 2 : 3;
    return 0;
}

/* Fills d's inputs: uniform in [-1, 1) from fixed seeds, the mask, the underflow
 * arrangement when asked, and with `bad` the bad element. The bad element is in
 * (b, h) = (B-1, H-1). */
static void fill(data *d, const placement *pl, int bad)
{
    const problem *pb = d->pb;
    const size_t nq = (size_t)pb->B * pb->H * pb->Tq * pb->D;
    const size_t nk = (size_t)pb->B * pb->H * pb->Tk * pb->D;
    const size_t nv = (size_t)pb->B * pb->H * pb->Tk * pb->Dv;
    const size_t bh = (size_t)(pb->B - 1) * pb->H + (pb->H - 1);
    tu_fill(d->q, (int64_t)nq, 11);
    tu_fill(d->k, (int64_t)nk, 12);
    tu_fill(d->v, (int64_t)nv, 13);
    uint64_t seed = 14;
    for (size_t x = 0; x < (size_t)pb->B * pb->Tq * pb->Tk; x++)
        d->mask[x] = tu_uniform(&seed) > -0.4f; /* about 70 % visible */
    if (pb->mask == MASK_PADDING) /* samples b >= B/2 pad their last quarter */
        for (int b = 0; b < pb->B; b++)
            for (int j = 0; j < pb->Tk; j++)
                d->mask[(size_t)b * pb->Tk + j] = !(b >= pb->B / 2 && j >= pb->Tk - pb->Tk / 4);
    if (pb->mask == MASK_RANDOM) /* query row 1 of every sample sees no key */
        for (int b = 0; b < pb->B; b++)
            memset(d->mask + ((size_t)b * pb->Tq + 1) * pb->Tk, 0, (size_t)pb->Tk);
    if (pl->keys_positive)
        for (size_t x = (size_t)pl->col; x < nk; x += (size_t)pb->D)
            d->k[x] = fabsf(d->k[x]) + 0.1f;
    d->scale = 1.0f / sqrtf((float)pb->D);
    if (pl->underflow) {
        /* Component 0 of every query is 1, key `row`'s is -300, the others stay in
         * [-1, 1): with scale 1 and D <= 64 its score is at least 300 - 2 D >= 172
         * below every other key's, where exp is exactly 0 on every path. */
        d->scale = 1.0f;
        for (size_t i = 0; i < nq; i += (size_t)pb->D)
            d->q[i] = 1.0f;
        d->k[(bh * pb->Tk + pl->row) * pb->D] = -300.0f;
    }
    if (!bad)
        return;
    if (pl->tensor == 'q')
        d->q[(bh * pb->Tq + pl->row) * pb->D + pl->col] = pl->value;
    else if (pl->tensor == 'k')
        d->k[(bh * pb->Tk + pl->row) * pb->D + pl->col] = pl->value;
    else
        d->v[(bh * pb->Tk + pl->row) * pb->Dv + pl->col] = pl->value;
}

/* The number of rows of out/weights (in a and b, each [no] then [nw]) outside the
 * reached rows of (B-1, H-1) whose bits differ. */
static int unreached_changed(const problem *pb, const int *reached, const float *a,
                             const float *b)
{
    const size_t no = (size_t)pb->B * pb->H * pb->Tq * pb->Dv;
    int changed = 0;
    for (int bi = 0; bi < pb->B; bi++)
        for (int h = 0; h < pb->H; h++)
            for (int i = 0; i < pb->Tq; i++) {
                if (bi == pb->B - 1 && h == pb->H - 1 && reached[i])
                    continue;
                const size_t row = ((size_t)bi * pb->H + h) * pb->Tq + i;
                changed += memcmp(a + row * pb->Dv, b + row * pb->Dv, pb->Dv * sizeof(float)) ||
                           memcmp(a + no + row * pb->Tk, b + no + row * pb->Tk,
                                  pb->Tk * sizeof(float));
            }
    return changed;
}

/* Runs one placement on one problem and checks every path against the reference. */
static void check_case(const problem *pb, const placement *pl)
{
    const size_t nq = (size_t)pb->B * pb->H * pb->Tq * pb->D;
    const size_t nk = (size_t)pb->B * pb->H * pb->Tk * pb->D;
    const size_t nv = (size_t)pb->B * pb->H * pb->Tk * pb->Dv;
    const size_t no = (size_t)pb->B * pb->H * pb->Tq * pb->Dv;
    const size_t nw = (size_t)pb->B * pb->H * pb->Tq * pb->Tk;
    data d = {pb, malloc(nq * sizeof(float)), malloc(nk * sizeof(float)),
              malloc(nv * sizeof(float)), malloc((size_t)pb->B * pb->Tq * pb->Tk), 1.0f};
    float *buf = malloc(4 * (no + nw) * sizeof(float));
    int *reached = calloc((size_t)pb->Tq, sizeof(int));
    if (!d.q || !d.k || !d.v || !d.mask || !buf || !reached) {
        CHECK(!"out of memory");
        goto done;
    }
    float *ref0 = buf, *ref1 = ref0 + no + nw, *fu0 = ref1 + no + nw, *fu1 = fu0 + no + nw;
    char label[160];
    snprintf(label, sizeof label, "B=%d H=%d Tq=%d Tk=%d D=%d Dv=%d mask %s (%s): %g in %c[%d][%d]%s",
             pb->B, pb->H, pb->Tq, pb->Tk, pb->D, pb->Dv, mask_names[pb->mask], pb->what,
             (double)pl->value, pl->tensor, pl->row, pl->col,
             pl->underflow ? ", its key's weight underflowed to 0" :
             pl->keys_positive ? ", every score of its row -inf" : "");

    fill(&d, pl, 0);
    run(&d, ATTN_ARCH_REF, 1, ref0, ref0 + no);
    fill(&d, pl, 1);
    run(&d, ATTN_ARCH_REF, 1, ref1, ref1 + no);

    /* The rows of (B-1, H-1) that the bad element reaches. */
    for (int i = 0; i < pb->Tq; i++)
        reached[i] = pl->tensor == 'q' ? i == pl->row : visible(&d, pb->B - 1, i, pl->row);

    /* The reference itself: a NaN reaches every row that sees it (in v, its
     * column), and rows it does not reach keep their bits. */
    int ref_missing = 0;
    for (int i = 0; i < pb->Tq; i++)
        if (reached[i] && isnan(pl->value)) {
            const size_t row = ((size_t)(pb->B - 1) * pb->H + (pb->H - 1)) * pb->Tq + i;
            ref_missing += !isnan(ref1[row * pb->Dv + (pl->tensor == 'v' ? pl->col : 0)]);
        }
    const int ref_changed = unreached_changed(pb, reached, ref1, ref0);
    if (ref_missing || ref_changed)
        fprintf(stderr, "%s: the reference: %d rows miss the NaN, %d unreached rows changed\n",
                label, ref_missing, ref_changed);
    CHECK_INT(ref_missing, 0);
    CHECK_INT(ref_changed, 0);

    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            fill(&d, pl, 0);
            run(&d, archs[a], threads, fu0, fu0 + no);
            fill(&d, pl, 1);
            run(&d, archs[a], threads, fu1, fu1 + no);
            int class_diff = 0;
            size_t first = 0;
            for (size_t x = 0; x < no + nw; x++)
                if (fclass(fu1[x]) != fclass(ref1[x]) && class_diff++ == 0)
                    first = x;
            const int changed = unreached_changed(pb, reached, fu1, fu0);
            if (class_diff)
                fprintf(stderr,
                        "%s; %s, %d thread(s): %d elements differ in class from the "
                        "reference, the first %s[%zu]: %g here, %g in the reference\n",
                        label, attn_arch_name(archs[a]), threads, class_diff,
                        first < no ? "out" : "weights", first < no ? first : first - no,
                        (double)fu1[first], (double)ref1[first]);
            if (changed)
                fprintf(stderr, "%s; %s, %d thread(s): %d rows the bad value does not reach "
                                "changed their bits\n",
                        label, attn_arch_name(archs[a]), threads, changed);
            CHECK_INT(class_diff, 0);
            CHECK_INT(changed, 0);
        }
    }
done:
    free(d.q), free(d.k), free(d.v), free(d.mask), free(buf), free(reached);
}

/* The issue's case: Tq query rows, Tk keys, D = Dv = 4, scale 1; every query is
 * (1, 0, 0, 0), key 0 is (-100, 0, 0, 0) and the other keys 0, so key 0 scores 100
 * below the row's maximum (its weight underflows to 0 in the kernel's exp, to a
 * subnormal in expf) and its value row is NaN. Every output element must be NaN. */
static void check_issue_case(int Tq, int Tk)
{
    enum { D = 4 };
    float q[16 * D], k[8 * D], v[8 * D], o[16 * D];
    memset(q, 0, sizeof q);
    memset(k, 0, sizeof k);
    for (int i = 0; i < Tq; i++)
        q[i * D] = 1.0f;
    k[0] = -100.0f;
    for (int x = 0; x < Tk * D; x++)
        v[x] = x < D ? NAN : 1.0f;
    const attn_arch archs[4] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.impl = archs[a] == ATTN_ARCH_REF ? ATTN_IMPL_REF : ATTN_IMPL_FUSED;
            ctx.arch = archs[a];
            ctx.threads = threads;
            attn_tensor tq = tu_tensor4(q, 1, 1, Tq, D), tk = tu_tensor4(k, 1, 1, Tk, D),
                        tv = tu_tensor4(v, 1, 1, Tk, D), to = tu_tensor4(o, 1, 1, Tq, D);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.has_scale = 1;
            p.scale = 1.0f;
            for (int x = 0; x < Tq * D; x++)
                o[x] = 0.0f;
            CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), ATTN_OK);
            int finite = 0;
            for (int x = 0; x < Tq * D; x++)
                finite += !isnan(o[x]);
            if (finite)
                fprintf(stderr, "Tq=%d Tk=%d, %s, %d thread(s): %d of %d outputs are not NaN "
                                "(out[0] = %g, the reference's is NaN)\n",
                        Tq, Tk, attn_arch_name(archs[a]), threads, finite, Tq * D,
                        (double)o[0]);
            CHECK_INT(finite, 0);
        }
    }
}

int main(void)
{
    TEST("issue 9's case: a NaN value at an unmasked key whose weight underflowed to 0 makes "
         "every row NaN on every path (Tq = 16 with Tk = 8 and 7 on the tile path, Tq = 4 "
         "on the row path)");
    check_issue_case(16, 8);
    check_issue_case(16, 7);
    check_issue_case(4, 8);
    check_issue_case(4, 7);

    static const problem problems[] = {
        {1, 1, 4, 8, 4, 4, MASK_NONE, "row path", 0},
        {2, 1, 8, 8, 5, 5, MASK_CAUSAL, "row path, causal", 0},
        {2, 2, 1, 37, 16, 17, MASK_PADDING, "row path, one query: a decoding step", 0},
        {2, 1, 6, 50, 12, 12, MASK_RANDOM, "row path, random mask, an empty row", 0},
        {2, 2, 8, 1200, 16, 16, MASK_NONE, "row path, long keys, two threads", 0},
        {1, 1, 16, 8, 4, 4, MASK_NONE, "tile path, one full key tile", 0},
        {1, 1, 16, 7, 4, 4, MASK_NONE, "tile path, one partial key tile", 0},
        {2, 2, 70, 130, 33, 16, MASK_NONE, "tile path, full key tiles and a partial one", 0},
        {2, 2, 70, 130, 16, 20, MASK_PADDING, "tile path, full, partial and skipped key tiles", 0},
        {2, 2, 130, 130, 16, 16, MASK_CAUSAL, "tile path, diagonal and skipped key tiles", 0},
        /* Partial key tiles whose values the kernel reads where they lie (unit
         * stride, Dv a multiple of the vector, no key past Tk) and checks there for
         * inf and NaN, packing only a tile that holds one (fk_value_tile). */
        {1, 2, 128, 128, 16, 64, MASK_CAUSAL, "tile path, diagonal key tiles read in place", 0},
        {2, 2, 70, 128, 16, 32, MASK_PADDING, "tile path, padded key tiles read in place", 0},
        {1, 2, 40, 70, 8, 24, MASK_RANDOM, "tile path, random mask, an empty row", 0},
        /* Without the weights and with at least 512 keys, the split-key form: no
         * mask (every key visible, the max taken a vector at a time) and padding. */
        {1, 2, 1, 1100, 16, 16, MASK_NONE, "split path: a decoding step, five key chunks", 1},
        {2, 1, 3, 700, 8, 8, MASK_PADDING, "split path: three queries, padding", 1},
    };
    const float values[3] = {NAN, INFINITY, -INFINITY};
    const int nproblems = (int)(sizeof problems / sizeof problems[0]);

    TEST("a NaN, +inf or -inf in q, k or v reaches exactly the rows the reference says, in "
         "the same class (NaN, +inf, -inf) element by element, on every path and thread "
         "count; rows it does not reach keep their bits");
    for (int n = 0; n < nproblems; n++) {
        const problem *pb = &problems[n];
        for (int t = 0; t < 3; t++) {
            const char tensor = "qkv"[t];
            const int len = tensor == 'q' ? pb->Tq : pb->Tk;
            const int width = tensor == 'v' ? pb->Dv : pb->D;
            const int rows[3] = {0, len / 2, len - 1};
            for (int r = 0; r < 3; r++)
                for (int x = 0; x < 3; x++) {
                    placement pl = {tensor, rows[r], (rows[r] * 7 + 3) % width, values[x], 0, 0};
                    check_case(pb, &pl);
                }
        }
    }

    TEST("a NaN, +inf or -inf value at a key that is not masked but whose weight underflowed "
         "to exactly 0 still reaches every row that sees the key (0 * NaN = NaN, 0 * inf = NaN)");
    for (int n = 0; n < nproblems; n++) {
        const problem *pb = &problems[n];
        const int rows[3] = {0, pb->Tk / 2, pb->Tk - 1};
        for (int r = 0; r < 3; r++)
            for (int x = 0; x < 3; x++) {
                placement pl = {'v', rows[r], (rows[r] * 5 + 1) % pb->Dv, values[x], 1, 0};
                check_case(pb, &pl);
            }
    }

    TEST("-inf in a query whose every visible key is positive there gives every score of its "
         "row -inf: the row is NaN (exp(-inf - -inf)), as in the reference, not empty");
    for (int n = 0; n < nproblems; n++) {
        const problem *pb = &problems[n];
        const int rows[2] = {0, pb->Tq - 1};
        for (int r = 0; r < 2; r++) {
            placement pl = {'q', rows[r], 2 % pb->D, -INFINITY, 0, 1};
            check_case(pb, &pl);
        }
    }
    return check_summary("test_nonfinite_paths");
}
