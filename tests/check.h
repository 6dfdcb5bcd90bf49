/*
 * check.h - the tests' assertion macros. Each failing check prints the expression,
 * both values and where it stands, counts the failure, and the test goes on, so one
 * run shows every broken claim. A test program returns check_summary().
 */
#ifndef ATTN_CHECK_H
#define ATTN_CHECK_H

/* CHECK_SANITIZED is 1 when the test is built with AddressSanitizer or
 * ThreadSanitizer (GCC's __SANITIZE_*__ or Clang's __has_feature), which run it 10
 * to 20 times slower: the sweeps then take a quicker subset that still covers every
 * value of every axis. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define CHECK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define CHECK_SANITIZED 1
#endif
#endif
#ifndef CHECK_SANITIZED
#define CHECK_SANITIZED 0
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_failures_ = 0;
static int check_count_ = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        check_count_++;                                                             \
        if (!(cond)) {                                                              \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

#define CHECK_INT(a, b)                                                             \
    do {                                                                            \
        long long va_ = (long long)(a), vb_ = (long long)(b);                       \
        check_count_++;                                                             \
        if (va_ != vb_) {                                                           \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__,     \
                    __LINE__, #a, #b, va_, vb_);                                    \
        }                                                                           \
    } while (0)

/* |a - b| <= atol + rtol * |b|; NaN never passes unless both are NaN. */
#define CHECK_NEAR(a, b, atol, rtol)                                                \
    do {                                                                            \
        double va_ = (double)(a), vb_ = (double)(b);                                \
        check_count_++;                                                             \
        int ok_ = (isnan(va_) && isnan(vb_)) ||                                     \
                  fabs(va_ - vb_) <= (atol) + (rtol) * fabs(vb_);                   \
        if (!ok_) {                                                                 \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: %s ~ %s failed: %.9g vs %.9g (diff %.3g)\n",    \
                    __FILE__, __LINE__, #a, #b, va_, vb_, fabs(va_ - vb_));         \
        }                                                                           \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                             \
    do {                                                                            \
        const char *h_ = (hay), *n_ = (needle);                                     \
        check_count_++;                                                             \
        if (!h_ || !strstr(h_, n_)) {                                               \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__,    \
                    __LINE__, h_ ? h_ : "(null)", n_);                              \
        }                                                                           \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                          \
    do {                                                                            \
        const char *a_ = (a), *b_ = (b);                                            \
        check_count_++;                                                             \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                    \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" vs \"%s\"\n", __FILE__, \
                    __LINE__, #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");      \
        }                                                                           \
    } while (0)

/* Prints a line per test sentence so a log reads as the list of claims. */
#define TEST(sentence) fprintf(stderr, "-- %s\n", sentence)

static inline int check_summary(const char *prog)
{
    fprintf(stderr, "%s: %d checks, %d failed\n", prog, check_count_, check_failures_);
    return check_failures_ ? 1 : 0;
}

#endif /* ATTN_CHECK_H */
