/*
 * grade_common.c - buffers with sentinels, the comparison, and the order in which a
 * case's verdict is decided: not written at all, written out of bounds, partly
 * written, right, one of the known mistakes, not finite, or wrong in another way.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grader.h"

/* Entries the learner has not written hold this NaN: its payload is not one that
 * arithmetic produces, so a computed NaN is never taken for "not written". */
#define SENTINEL_BITS 0xffc0a5a5u
/* A variant entry that matches anything (a different payload again). */
#define ANY_BITS 0x7fc0dca0u
#define SENTINEL_BYTE 0xa5u
#define GUARD 16

/* The tolerance: float32 sums taken in another order than the reference's differ
 * by a few units in the last place per term, far below 1e-5 for the values here
 * (weights in [0, 1], outputs of order 1). The mistakes the grader names change
 * entries by far more on the cases it runs; the broken files in exercises/tests/
 * show each one told apart from the right answer. */
#define ATOL 1e-5
#define RTOL 1e-4

#define MAX_BUFFERS 512
static void *buffers[MAX_BUFFERS];
static int nbuffers;

static void *keep(void *p)
{
    if (!p || nbuffers == MAX_BUFFERS) {
        fprintf(stderr, "grader: out of memory or too many buffers\n");
        exit(2); /* the grader is a program, not the library: it may stop here */
    }
    buffers[nbuffers++] = p;
    return p;
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

float grade_any(void) { return float_of(ANY_BITS); }

float *grade_alloc_f(int64_t n)
{
    float *p = keep(malloc((size_t)(n + GUARD) * sizeof *p));
    for (int64_t i = 0; i < n + GUARD; i++)
        p[i] = float_of(SENTINEL_BITS);
    return p;
}

uint8_t *grade_alloc_u8(int64_t n)
{
    uint8_t *p = keep(malloc((size_t)(n + GUARD)));
    memset(p, SENTINEL_BYTE, (size_t)(n + GUARD));
    return p;
}

void grade_free_all(void)
{
    while (nbuffers > 0)
        free(buffers[--nbuffers]);
}

void grade_appendf(char *buf, size_t size, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
}

void grade_randn(attn_rng *rng, float *out, int64_t n, float scale)
{
    attn_rng_randn(rng, out, n);
    for (int64_t i = 0; i < n; i++)
        out[i] *= scale;
}

static char *running;
static size_t running_size;

void grade_running_to(char *buf, size_t size)
{
    running = buf;
    running_size = size;
    if (buf && size)
        buf[0] = '\0';
}

void grade_running(const char *where)
{
    if (running && running_size)
        snprintf(running, running_size, "%s", where);
}

void grade_begin(grade_result *r, int cases)
{
    memset(r, 0, sizeof *r);
    r->cases_total = cases;
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* "[1, 3]" for the flat index of an entry of an array of this shape. */
static void format_index(char *buf, size_t size, int ndim, const int64_t *shape, int64_t flat)
{
    int64_t idx[4];
    for (int i = ndim - 1; i >= 0; i--) {
        idx[i] = flat % shape[i];
        flat /= shape[i];
    }
    buf[0] = '\0';
    grade_appendf(buf, size, "[");
    for (int i = 0; i < ndim; i++)
        grade_appendf(buf, size, "%s%lld", i ? ", " : "", (long long)idx[i]);
    grade_appendf(buf, size, "]");
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    buf[0] = '\0';
    grade_appendf(buf, size, "[");
    for (int i = 0; i < ndim; i++)
        grade_appendf(buf, size, "%s%lld", i ? ", " : "", (long long)shape[i]);
    grade_appendf(buf, size, "]");
}

static int close_enough(float got, float want)
{
    if (bits_of(want) == ANY_BITS)
        return 1;
    if (isnan(want))
        return isnan(got) && bits_of(got) != SENTINEL_BITS;
    if (isinf(want))
        return got == want;
    if (!isfinite(got))
        return 0;
    return fabs((double)got - (double)want) <= ATOL + RTOL * fabs((double)want);
}

/* Index of the first entry that does not match, or -1. */
static int64_t first_mismatch(const float *got, const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!close_enough(got[i], want[i]))
            return i;
    return -1;
}

static void set_verdict(grade_result *r, int verdict, const char *id, const char *title,
                        const char *hint)
{
    r->verdict = verdict;
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->title, sizeof r->title, "%s", title);
    snprintf(r->hint, sizeof r->hint, "%s", hint);
}

static void describe_value(char *buf, size_t size, float x)
{
    if (bits_of(x) == SENTINEL_BITS)
        snprintf(buf, size, "never written");
    else
        snprintf(buf, size, "%.6g", (double)x);
}

/* "weights[1, 3] = 0.25, expected 0" for the first entry that differs from the
 * reference, after the case's description. */
static void describe_first_difference(grade_result *r, const char *where, int nout,
                                      const grade_output *outs)
{
    r->detail[0] = '\0';
    grade_appendf(r->detail, sizeof r->detail, "%s", where);
    for (int k = 0; k < nout; k++) {
        int64_t n = numel(outs[k].ndim, outs[k].shape);
        int64_t i = first_mismatch(outs[k].got, outs[k].want, n);
        if (i < 0)
            continue;
        char idx[64], got[32], want[32];
        format_index(idx, sizeof idx, outs[k].ndim, outs[k].shape, i);
        describe_value(got, sizeof got, outs[k].got[i]);
        describe_value(want, sizeof want, outs[k].want[i]);
        grade_appendf(r->detail, sizeof r->detail, ": %s%s is %s, expected %s", outs[k].name,
                      idx, got, want);
        return;
    }
}

int grade_case(grade_result *r, const char *where, int nout, const grade_output *outs,
               int nvar, const grade_variant *vars, const grade_mistake *if_not_finite)
{
    /* 1. Nothing written anywhere: the function is still the stub. */
    int untouched = 1;
    for (int k = 0; k < nout && untouched; k++) {
        int64_t n = numel(outs[k].ndim, outs[k].shape);
        for (int64_t i = 0; i < n + GUARD; i++)
            if (bits_of(outs[k].got[i]) != SENTINEL_BITS) {
                untouched = 0;
                break;
            }
    }
    if (untouched) {
        set_verdict(r, GRADE_TODO, "not-implemented", "not implemented yet",
                    "Open the file, read what the comment at its top asks for, and write "
                    "the function's body where the TODO line is.");
        snprintf(r->detail, sizeof r->detail, "%s: no entry of the output was written", where);
        return 0;
    }

    for (int k = 0; k < nout; k++) {
        int64_t n = numel(outs[k].ndim, outs[k].shape);
        char shape[64];
        format_shape(shape, sizeof shape, outs[k].ndim, outs[k].shape);
        /* 2. Written past the end: an index computed with the wrong shape. */
        for (int64_t i = n; i < n + GUARD; i++)
            if (bits_of(outs[k].got[i]) != SENTINEL_BITS) {
                set_verdict(r, GRADE_WRONG, "out-of-bounds",
                            "wrote past the end of an output (wrong shape or index)",
                            "Each output has exactly the shape written beside its pointer; "
                            "check the bounds of your loops and the index arithmetic "
                            "(row * row_length + column).");
                snprintf(r->detail, sizeof r->detail,
                         "%s: %s %s has %lld entries, and entry %lld was written", where,
                         outs[k].name, shape, (long long)n, (long long)i);
                return 0;
            }
        /* 3. Partly written: a loop that stops early or skips entries. */
        for (int64_t i = 0; i < n; i++)
            if (bits_of(outs[k].got[i]) == SENTINEL_BITS) {
                char idx[64];
                format_index(idx, sizeof idx, outs[k].ndim, outs[k].shape, i);
                set_verdict(r, GRADE_WRONG, "not-written",
                            "some entries of an output were never written",
                            "Every entry of the output must be set, masked ones included "
                            "(a masked weight is 0, not left alone); check that your loops "
                            "cover the whole shape.");
                snprintf(r->detail, sizeof r->detail, "%s: %s%s of %s %s was never written",
                         where, outs[k].name, idx, outs[k].name, shape);
                return 0;
            }
    }

    /* 4. Right. */
    int right = 1;
    for (int k = 0; k < nout && right; k++)
        right = first_mismatch(outs[k].got, outs[k].want, numel(outs[k].ndim, outs[k].shape)) < 0;
    if (right) {
        r->cases_passed++;
        return 1;
    }

    describe_first_difference(r, where, nout, outs);

    /* 5. One of the known mistakes, in the order the exercise lists them. */
    for (int v = 0; v < nvar; v++) {
        int applies = 1, matches = 1;
        for (int k = 0; k < nout; k++)
            if (!vars[v].values[k])
                applies = 0;
        if (!applies)
            continue;
        for (int k = 0; k < nout && matches; k++)
            matches = first_mismatch(outs[k].got, vars[v].values[k],
                                     numel(outs[k].ndim, outs[k].shape)) < 0;
        if (matches) {
            set_verdict(r, GRADE_WRONG, vars[v].mistake->id, vars[v].mistake->title,
                        vars[v].mistake->hint);
            return 0;
        }
    }

    /* 6. Infinities or NaN where the reference has none. */
    for (int k = 0; k < nout; k++) {
        int64_t n = numel(outs[k].ndim, outs[k].shape);
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(outs[k].got[i]) && isfinite(outs[k].want[i])) {
                if (if_not_finite)
                    set_verdict(r, GRADE_WRONG, if_not_finite->id, if_not_finite->title,
                                if_not_finite->hint);
                else
                    set_verdict(r, GRADE_WRONG, "not-finite",
                                "the output has NaN or infinite entries",
                                "NaN comes from 0/0, inf - inf or -inf - (-inf); inf from "
                                "exp() of a large number. Print the intermediate values of the "
                                "row named above and see where the first one appears.");
                return 0;
            }
    }

    /* 7. Wrong in a way the grader has no name for. */
    set_verdict(r, GRADE_WRONG, "wrong-values",
                "the values differ from the reference, and not by a mistake the grader knows",
                "Compare your loop with the formula at the top of the file on the case "
                "named above, entry by entry; print the row that differs.");
    return 0;
}

int grade_mask_case(grade_result *r, const char *where, const char *name, int ndim,
                    const int64_t *shape, const uint8_t *got, const uint8_t *want, int nvar,
                    const grade_variant *vars)
{
    int64_t n = numel(ndim, shape);
    char sh[64];
    format_shape(sh, sizeof sh, ndim, shape);

    int untouched = 1;
    for (int64_t i = 0; i < n + GUARD && untouched; i++)
        untouched = got[i] == SENTINEL_BYTE;
    if (untouched) {
        set_verdict(r, GRADE_TODO, "not-implemented", "not implemented yet",
                    "Open the file, read what the comment at its top asks for, and write "
                    "the function's body where the TODO line is.");
        snprintf(r->detail, sizeof r->detail, "%s: no entry of the mask was written", where);
        return 0;
    }
    for (int64_t i = n; i < n + GUARD; i++)
        if (got[i] != SENTINEL_BYTE) {
            set_verdict(r, GRADE_WRONG, "out-of-bounds",
                        "wrote past the end of the mask (wrong shape or index)",
                        "The mask has exactly the shape written beside its pointer; check the "
                        "bounds of your loops and the index arithmetic.");
            snprintf(r->detail, sizeof r->detail,
                     "%s: %s %s has %lld entries, and entry %lld was written", where, name, sh,
                     (long long)n, (long long)i);
            return 0;
        }
    for (int64_t i = 0; i < n; i++)
        if (got[i] != 0 && got[i] != 1) {
            char idx[64];
            format_index(idx, sizeof idx, ndim, shape, i);
            if (got[i] == SENTINEL_BYTE)
                set_verdict(r, GRADE_WRONG, "not-written",
                            "some entries of the mask were never written",
                            "Every entry must be set, to 1 or to 0; check that your loops "
                            "cover the whole shape.");
            else
                set_verdict(r, GRADE_WRONG, "not-boolean", "the mask holds values other than 0 and 1",
                            "Write 1 for \"may attend\" and 0 for \"masked\", e.g. "
                            "mask[...] = (condition); a comparison in C is already 0 or 1.");
            snprintf(r->detail, sizeof r->detail, "%s: %s%s is %d", where, name, idx,
                     (int)got[i]);
            return 0;
        }

    float *gotf = grade_alloc_f(n), *wantf = grade_alloc_f(n);
    for (int64_t i = 0; i < n; i++) {
        gotf[i] = got[i] ? 1.0f : 0.0f;
        wantf[i] = want[i] ? 1.0f : 0.0f;
    }
    grade_output out = {name, ndim, {0}, gotf, wantf};
    memcpy(out.shape, shape, (size_t)ndim * sizeof *shape);
    return grade_case(r, where, 1, &out, nvar, vars, NULL);
}

void grade_library_failed(grade_result *r, const char *what, const attn_ctx *ctx, int status)
{
    set_verdict(r, GRADE_WRONG, "grader-error", "the grader's own reference call failed",
                "This is a bug in the grader or the library, not in your exercise; please "
                "report it with the message above.");
    snprintf(r->detail, sizeof r->detail, "%s failed with %s: %s", what,
             attn_status_name(status), ctx->message);
}
