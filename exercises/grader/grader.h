/*
 * grader.h - what the exercise grader's parts share.
 *
 * The grader runs each exercise on several cases (the chapter's shapes and awkward
 * ones: a single key, Tq != Tk, D != Dv, large scores), compares the learner's
 * arrays with libattn's reference, and when they differ, compares them with
 * deliberately wrong answers it computes itself, one per classic mistake. The
 * first mistake whose answer the learner's matches is the diagnosis.
 *
 * Output buffers are filled with a sentinel and followed by a guard of sentinel
 * entries, so the grader can tell "never written" (a stub, or a loop that stops
 * early) and "written past the end" (a wrong shape) from wrong values.
 */
#ifndef ATTN_EXERCISE_GRADER_H
#define ATTN_EXERCISE_GRADER_H

#include <stdint.h>

#include "attn.h"
#include "exercises.h"

enum grade_verdict { GRADE_PASS = 0, GRADE_TODO = 1, GRADE_WRONG = 2 };

typedef struct grade_result {
    int verdict;
    int cases_passed;
    int cases_total;
    char id[48];       /* the diagnosis, e.g. "masked-zero" */
    char title[256];   /* one line saying what is wrong */
    char detail[1024]; /* the case and the first entry that differs */
    char hint[1024];   /* what to look at */
} grade_result;

/* A classic mistake: a stable id (docs/exercises.md lists them), what it is, and
 * a hint that says why it is wrong and what to change. */
typedef struct grade_mistake {
    const char *id;
    const char *title;
    const char *hint;
} grade_mistake;

/* One output of a case: the learner's guarded buffer and the reference's answer. */
typedef struct grade_output {
    const char *name; /* "weights" */
    int ndim;
    int64_t shape[4];
    const float *got;
    const float *want;
} grade_output;

#define GRADE_MAX_OUTPUTS 3

/* A mistake's answer for this case, one array per output; a NULL array means the
 * mistake cannot be told apart on this case (the grader skips it). */
typedef struct grade_variant {
    const grade_mistake *mistake;
    const float *values[GRADE_MAX_OUTPUTS];
} grade_variant;

/* Float buffers of n entries plus a guard, every entry the sentinel; byte buffers
 * likewise. They live until grade_free_all(). */
float *grade_alloc_f(int64_t n);
uint8_t *grade_alloc_u8(int64_t n);
void grade_free_all(void);

/* A value a variant may hold where any answer is acceptable (a mistake that makes
 * 0/0 in one row, say): it matches everything. */
float grade_any(void);

/* Says which case is about to call the learner's function (its `where`), so that
 * a crash or an endless loop inside it can be reported with the case: the text
 * goes to the buffer grade_running_to names (main's page shared with the child
 * process that grades; NULL: nowhere), and an exercise starts with it empty. */
void grade_running_to(char *buf, size_t size);
void grade_running(const char *where);

/* Starts a result for an exercise with `cases` cases. */
void grade_begin(grade_result *r, int cases);
/* Checks one case. Returns 1 when every output matches the reference; otherwise
 * fills r (verdict, diagnosis, detail naming `where`) and returns 0. When the
 * learner's output is not finite where the reference's is, and no variant
 * matched, `if_not_finite` (may be NULL) is the diagnosis. */
int grade_case(grade_result *r, const char *where, int nout, const grade_output *outs,
               int nvar, const grade_variant *vars, const grade_mistake *if_not_finite);
/* The same for a byte mask: checks that every entry was written with 0 or 1, then
 * compares as grade_case does (the variants hold 0.0f and 1.0f). */
int grade_mask_case(grade_result *r, const char *where, const char *name, int ndim,
                    const int64_t *shape, const uint8_t *got, const uint8_t *want, int nvar,
                    const grade_variant *vars);
/* Records that libattn's reference itself failed (never expected). */
void grade_library_failed(grade_result *r, const char *what, const attn_ctx *ctx, int status);

/* Appends a formatted string to buf (size bytes), truncating safely. */
void grade_appendf(char *buf, size_t size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Random inputs, from the library's seeded generator so every run grades the
 * same numbers. */
void grade_randn(attn_rng *rng, float *out, int64_t n, float scale);

/* Each exercise's grader. */
void grade_padding_mask(grade_result *r);
void grade_causal_mask(grade_result *r);
void grade_masked_softmax(grade_result *r);
void grade_sdpa(grade_result *r);
void grade_split_heads(grade_result *r);
void grade_merge_heads(grade_result *r);
void grade_online_softmax(grade_result *r);
void grade_softmax_backward(grade_result *r);
void grade_sdpa_backward(grade_result *r);

#endif /* ATTN_EXERCISE_GRADER_H */
