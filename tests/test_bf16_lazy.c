/*
 * test_bf16_lazy.c - the avx512bf16 path's weights taken against a stale max
 * (src/kernels/bf16_tile.h, b16_scores_weights): a full key tile whose scores stay
 * within 2^8 (base 2) of each row's running max takes its weights against that max
 * straight from the score product's registers; a tile with a score beyond it stops at
 * that block and takes the plain steps; after B16_LAZY_MISSES such tiles an item stops
 * trying; calls that do not ask for the log-sum-exp take 2^x by a degree-3 polynomial.
 *
 * The data is made to reach each of those branches: scores of one spread (every full
 * tile lazy), a ramp that puts each key tile 40 (base 2) above the one before (every
 * tile goes beyond at its first block; weights against a max left behind would
 * overflow float32 by the fourth tile), jumps of the same size at two keys in the middle
 * of a tile (one block goes beyond after others were taken; two such tiles end the
 * item's tries), a jump of 7.9 at one key a tile (weights near 2^8 kept against the
 * stale max), a fall of 11.5 a tile (weights that underflow), and two keys, one in
 * the first tile and one in a later full tile, whose scores are the same 1.1875 2^41
 * scale (a row that sees both gives each weight 1/2; the exponent S scale log2 e - m
 * log2 e taken by one FMA is off there by units in the last place of m log2 e, 2^11
 * to 2^15, so those weights must be taken from the scores rounded first, as the
 * float32 path does: else they are inf or 0, and the rows NaN), and a jump of 7.9 at
 * key 100, a later full tile for most rows, whose value row is bfloat16's largest
 * finite number, 3.39e38 (against the stale max its weight is up to 2^8, and O^T
 * would overflow where every weight against the true max is at most 1 and the
 * output finite: such a tile must take the plain steps), and the same value at key 70
 * with 40 keys of tile 2 scored 7.4 (base 2) above it whose values are 2^108, below
 * what alone would count as big (against key 70's max their weights are 2^7.4, and
 * they add 2^120.7 to an O^T that holds 3.39e38 already: an item whose values hold a
 * big one anywhere must keep its weights at most 1). Each runs with and
 * without the log-sum-exp, without a mask, causal top-left and bottom-right, with D
 * of 48, 64 and 128 and grouped-query heads. The shapes whose causal diagonal falls on
 * whole 64 x 64 tiles (Tq = Tk = 256 top-left, Tq 128 and Tk 320 either way) take
 * those tiles' weights against the stale max too (b16_diag_weights: hidden keys weight
 * 0, the blocks no row sees left out), and the fills reach its branches as well: a
 * diagonal tile within 2^8, one that goes beyond (the ramp, the jumps), one after the
 * item's tries ended, and a jump of 200 at key Tk - 4, which only the last rows of the
 * last diagonal tile see (its block of 16 rows at the diagonal must go beyond, or the
 * weight 2^200 overflows).
 *
 * Against a float64 oracle on the same bfloat16 arrays, each output must lie within
 * 2^-8 (max |v| + |exact|): every weight is rounded to bfloat16 (2^-9 relative) and the
 * output is divided by the sum of the rounded weights, so it stays a weighted mean of v
 * whose weights each move by at most about 2^-8 relative, and the output is rounded to
 * bfloat16 once (2^-9 relative). The errors' root mean square must stay within what
 * those roundings give on average at most (each uniform within half an ulp, at most
 * 2^-8 relative: the oracle sums each output's variance). The log-sum-exp must lie within 1e-4 of the oracle's plus what
 * float32 sums of the scores may lose (D 2^-24 of the scaled sum of |q_d k_d|: the
 * products of bfloat16 values are exact, their sums are not). 1, 2 and 3 threads give
 * the same bits.
 *
 * Each kernel runs in a child process, since the choice is made once per process: the
 * native one (vdpbf16ps) where the CPU has AVX512-BF16, and the emulated one
 * (ATTN_BF16_EMULATE=always: the same arithmetic by AVX-512F FMAs) on any AVX-512 CPU;
 * where both run, they must give the same bits. The AMX kernel, where the CPU has
 * AMX-BF16, is held to the same bounds and thread counts (not to the same bits: its
 * products sum in another order); its plain steps keep the stale max too
 * (B16_STALE_MAX), so the fills reach that rule's branches there: within 2^8, beyond
 * it, and a first tile. A kernel this machine cannot run is announced as skipped.
 */
#define _DEFAULT_SOURCE
#include "attn.h"
#include "check.h"
#include "child.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FILL_SPREAD, FILL_RAMP, FILL_JUMPS, FILL_NEAR, FILL_FALL, FILL_LATE, FILL_HUGE,
       FILL_VBIG, FILL_VBIG_LATER, FILL_COUNT };
static const char *const fill_names[] = {
    "one spread", "a ramp of 40 a tile", "jumps of 11.5 at keys 165 and 261",
    "a jump of 7.9 at key 37 of each tile", "a fall of 11.5 a tile",
    "a jump of 200 at key Tk - 4", "scores of 1.1875 2^41 scale at keys 40 and 300",
    "a jump of 7.9 at key 100, its value bfloat16's largest",
    "bfloat16's largest value at key 70, values of 2^108 7.4 above it at keys 130-169"};

typedef struct problem {
    int H, Hkv, Tq, Tk, D;
    int causal, fill, with_lse;
} problem;

/* (H, Hkv, Tq, Tk, D): 70 query rows (a tile and a tail), 525 keys (8 tiles of 64
 * and a tail); then whole tiles, the causal diagonal on whole tiles. */
static const int shapes[][5] = {{2, 2, 70, 525, 64},  {4, 2, 70, 525, 128},
                                {2, 1, 70, 525, 48},  {2, 2, 256, 256, 64},
                                {4, 2, 128, 320, 64}, {2, 1, 256, 256, 128}};
#define N_SHAPES 6
/* causal: 0 none, 1 top-left, 2 bottom-right. */
#define N_PROBLEMS (N_SHAPES * FILL_COUNT * 3 * 2)

static problem problem_of(int n)
{
    const int *s = shapes[n % N_SHAPES];
    n /= N_SHAPES;
    problem p = {s[0], s[1], s[2], s[3], s[4], 0, 0, 0};
    p.fill = n % FILL_COUNT;
    n /= FILL_COUNT;
    p.causal = n % 3;
    p.with_lse = n / 3;
    return p;
}

static int64_t out_count(const problem *p) { return (int64_t)p->H * p->Tq * p->D; }
static int64_t lse_count(const problem *p) { return (int64_t)p->H * p->Tq; }

/* The bytes one problem's results take in the shared block: out's bits, then lse. */
static int64_t result_bytes(const problem *p) { return out_count(p) * 2 + lse_count(p) * 4; }

static uint64_t rng_state;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* q and k in [-2, 2), v in [-1, 1); the fills other than FILL_SPREAD then set q's
 * column 0 to 2 and k's column 0 to a step over 2. A raw product of 64 sqrt(D / 64)
 * is 8 after the default scale 1 / sqrt(D): 8 log2(e) = 11.5 in base 2, beyond the
 * stale max's 8; FILL_NEAR's 44 sqrt(D / 64) is 7.9, within it, FILL_LATE's 1109
 * sqrt(D / 64) 200. FILL_HUGE's two keys are 1.1875 2^40 in column 0 and 0
 * elsewhere, so that both scores are exactly 1.1875 2^41 scale in float32 and in the
 * oracle (a power of two there would make the FMA's exponent exact). */
static void fill(const problem *p, uint16_t *q, uint16_t *k, uint16_t *v)
{
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(p->fill * 7919 + p->D * 31 + p->H);
    const int64_t nq = (int64_t)p->H * p->Tq, nk = (int64_t)p->Hkv * p->Tk;
    const float unit = sqrtf((float)p->D / 64.0f); /* raw products scale with sqrt(D) */
    for (int64_t i = 0; i < nq * p->D; i++)
        q[i] = attn__f32_to_bf16(2.0f * uniform());
    for (int64_t i = 0; i < nk * p->D; i++)
        k[i] = attn__f32_to_bf16(2.0f * uniform());
    for (int64_t i = 0; i < nk * p->D; i++)
        v[i] = attn__f32_to_bf16(uniform());
    if (p->fill == FILL_SPREAD)
        return;
    for (int64_t i = 0; i < nq; i++)
        q[i * p->D] = attn__f32_to_bf16(2.0f);
    for (int64_t r = 0; r < nk; r++) {
        const int64_t j = r % p->Tk, tile = j / 64;
        float k0 = attn__bf16_to_f32(k[r * p->D]);
        switch (p->fill) {
        case FILL_RAMP: /* 40 in base 2: 222 sqrt(D / 64) raw */
            k0 = 111.0f * unit * (float)tile;
            break;
        case FILL_FALL:
            k0 = -32.0f * unit * (float)tile;
            break;
        case FILL_JUMPS:
            if (j == 64 * 2 + 37 || j == 64 * 4 + 5)
                k0 = 32.0f * unit;
            break;
        case FILL_NEAR:
            if (j % 64 == 37)
                k0 = 22.0f * unit;
            break;
        case FILL_LATE:
            if (j == p->Tk - 4)
                k0 = 554.5f * unit;
            break;
        case FILL_VBIG:
            if (j == 100) {
                k0 = 22.0f * unit;
                for (int64_t e = 0; e < p->D; e++)
                    v[r * p->D + e] = 0x7f7f; /* 0x1.fep127 */
            }
            break;
        case FILL_VBIG_LATER:
            /* Column 0 alone makes the scores: 44 unit raw is 7.9 (base 2), 85 unit
             * 7.4 more. */
            if (j == 70 || (j >= 130 && j < 170)) {
                k0 = j == 70 ? 22.0f * unit : 42.5f * unit;
                for (int d = 1; d < p->D; d++)
                    k[r * p->D + d] = 0;
                for (int64_t e = 0; e < p->D; e++)
                    v[r * p->D + e] = j == 70 ? 0x7f7f : 0x7580; /* 2^108 */
            }
            break;
        case FILL_HUGE:
            if (j == 40 || j == 300) {
                k0 = 0x1.3p40f;
                for (int d = 1; d < p->D; d++)
                    k[r * p->D + d] = 0;
            }
            break;
        }
        k[r * p->D] = attn__f32_to_bf16(k0);
    }
}

/* The float64 oracle on the bfloat16 arrays: out [H, Tq, D], lse [H, Tq], each
 * row's bound on lse's error: 1e-4, plus what float32 sums of the scores may lose
 * (D 2^-24 times the scaled sum of |q_d k_d|, the largest over the row's keys), and
 * a bound on each output's expected squared error from bfloat16's roundings: each
 * weight p_j moves by up to half an ulp, at most 2^-8 of it, uniformly (variance at
 * most 2^-16 / 3 of p_j^2), which moves the output by p_j (v_j - out) times that; the
 * output's own rounding adds at most 2^-16 out^2 / 3. */
static void oracle(const problem *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                   double *out, double *lse, double *lse_tol, double *var)
{
    const double scale = 1.0 / sqrt((double)p->D);
    double *s = malloc((size_t)p->Tk * sizeof *s);
    for (int h = 0; h < p->H; h++) {
        const int hk = h / (p->H / p->Hkv);
        for (int i = 0; i < p->Tq; i++) {
            const uint16_t *qi = q + ((int64_t)h * p->Tq + i) * p->D;
            /* The keys row i sees: up to i (top-left), i + Tk - Tq (bottom-right). */
            const int last = p->causal == 2 ? i + p->Tk - p->Tq : i;
            const int seen = p->causal ? (last + 1 < p->Tk ? last + 1 : p->Tk) : p->Tk;
            double m = -INFINITY, mag = 0;
            for (int j = 0; j < seen; j++) {
                const uint16_t *kj = k + ((int64_t)hk * p->Tk + j) * p->D;
                double x = 0, a = 0;
                for (int d = 0; d < p->D; d++) {
                    const double qk = (double)attn__bf16_to_f32(qi[d]) * attn__bf16_to_f32(kj[d]);
                    x += qk;
                    a += fabs(qk);
                }
                s[j] = x * scale;
                m = s[j] > m ? s[j] : m;
                mag = a > mag ? a : mag;
            }
            double l = 0;
            for (int j = 0; j < seen; j++)
                l += s[j] = exp(s[j] - m);
            double *o = out + ((int64_t)h * p->Tq + i) * p->D;
            for (int d = 0; d < p->D; d++) {
                double acc = 0;
                for (int j = 0; j < seen; j++)
                    acc += s[j] * attn__bf16_to_f32(v[((int64_t)hk * p->Tk + j) * p->D + d]);
                o[d] = acc / l;
                double sum = o[d] * o[d];
                for (int j = 0; j < seen; j++) {
                    const double dv =
                        attn__bf16_to_f32(v[((int64_t)hk * p->Tk + j) * p->D + d]) - o[d];
                    sum += s[j] * s[j] / (l * l) * dv * dv;
                }
                var[((int64_t)h * p->Tq + i) * p->D + d] = ldexp(sum, -16) / 3;
            }
            lse[(int64_t)h * p->Tq + i] = m + log(l);
            lse_tol[(int64_t)h * p->Tq + i] = 1e-4 + ldexp(p->D * mag * scale, -24);
        }
    }
    free(s);
}

static void describe(const problem *p)
{
    fprintf(stderr, "   H %d over %d, Tq %d, Tk %d, D %d, %s, %s, %s\n", p->H, p->Hkv, p->Tq,
            p->Tk, p->D,
            p->causal == 2 ? "causal bottom-right" : p->causal ? "causal" : "no mask",
            fill_names[p->fill],
            p->with_lse ? "with lse" : "no lse");
}

/* The path the child runs: avx512bf16 (native or emulated) or amx. */
static attn_arch run_arch = ATTN_ARCH_AVX512_BF16;

/* Runs p on run_arch with `threads` threads into out16 and lse. */
static int run(const problem *p, uint16_t *q, uint16_t *k, uint16_t *v, int threads,
               uint16_t *out16, float *lse)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = run_arch;
    ctx.threads = threads;
    attn_tensor tq, tk, tv, to, tl;
    const int64_t qs[4] = {1, p->H, p->Tq, p->D}, ks[4] = {1, p->Hkv, p->Tk, p->D};
    const int64_t ls[3] = {1, p->H, p->Tq};
    attn_tensor_init(&ctx, &tq, ATTN_DTYPE_BF16, q, 4, qs);
    attn_tensor_init(&ctx, &tk, ATTN_DTYPE_BF16, k, 4, ks);
    attn_tensor_init(&ctx, &tv, ATTN_DTYPE_BF16, v, 4, ks);
    attn_tensor_init(&ctx, &to, ATTN_DTYPE_BF16, out16, 4, qs);
    attn_tensor_init(&ctx, &tl, ATTN_DTYPE_F32, lse, 3, ls);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.causal = p->causal == 2 ? ATTN_CAUSAL_BOTTOM_RIGHT
                 : p->causal    ? ATTN_CAUSAL_TOP_LEFT
                                : ATTN_CAUSAL_NONE;
    prm.lse = p->with_lse ? &tl : NULL;
    for (int64_t i = 0; i < lse_count(p); i++)
        lse[i] = 0.0f;
    const int rc = attn_sdpa(&ctx, &tq, &tk, &tv, &prm, &to, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "   attn_sdpa: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

/* Checks p against the oracle and across thread counts; writes the 1-thread results
 * to res. Returns the number of broken claims. */
static int check_problem(const problem *p, unsigned char *res)
{
    const int64_t nq = (int64_t)p->H * p->Tq * p->D, nk = (int64_t)p->Hkv * p->Tk * p->D;
    uint16_t *q = malloc((size_t)nq * 2), *k = malloc((size_t)nk * 2), *v = malloc((size_t)nk * 2);
    uint16_t *o[3];
    float *l[3];
    double *exact = malloc((size_t)nq * sizeof *exact);
    double *exact_lse = malloc((size_t)lse_count(p) * sizeof *exact_lse);
    double *lse_tol = malloc((size_t)lse_count(p) * sizeof *lse_tol);
    double *var = malloc((size_t)nq * sizeof *var);
    fill(p, q, k, v);
    oracle(p, q, k, v, exact, exact_lse, lse_tol, var);
    int broken = 0;
    for (int t = 0; t < 3; t++) {
        o[t] = malloc((size_t)nq * 2);
        l[t] = malloc((size_t)lse_count(p) * sizeof(float));
        broken += run(p, q, k, v, t + 1, o[t], l[t]) != ATTN_OK;
    }
    double vmax = 0, sq_err = 0, expected = 0;
    for (int64_t i = 0; i < nk; i++)
        vmax = fmax(vmax, fabs(attn__bf16_to_f32(v[i])));
    int64_t outside = 0, first = -1;
    for (int64_t i = 0; i < nq; i++) {
        const double got = attn__bf16_to_f32(o[0][i]), err = fabs(got - exact[i]);
        sq_err += err * err;
        expected += var[i];
        if (!(err <= ldexp(vmax + fabs(exact[i]), -8)) && outside++ == 0)
            first = i;
    }
    /* Thousands of independent roundings: the mean square lands near its expectation,
     * which `expected` bounds (the float32 sums and 2^x's error are 1e-5 of it). */
    const double rms = sqrt(sq_err / (double)nq), rms_bound = sqrt(expected / (double)nq);
    int64_t lse_outside = 0;
    if (p->with_lse)
        for (int64_t i = 0; i < lse_count(p); i++)
            if (!(fabs(l[0][i] - exact_lse[i]) <= lse_tol[i]) && lse_outside++ == 0) {
                describe(p);
                fprintf(stderr, "   lse[%lld] %.9g, exact %.9g (bound %.3g)\n", (long long)i,
                        l[0][i], exact_lse[i], lse_tol[i]);
            }
    if (outside) {
        describe(p);
        fprintf(stderr, "   %lld outputs beyond 2^-8 (max|v| + |exact|); out[%lld] %.6g, exact %.6g\n",
                (long long)outside, (long long)first, attn__bf16_to_f32(o[0][first]),
                exact[first]);
    }
    if (!(rms <= rms_bound)) {
        describe(p);
        fprintf(stderr, "   rms error %.3g above %.3g\n", rms, rms_bound);
    }
    broken += outside > 0 || !(rms <= rms_bound) || lse_outside > 0;
    for (int t = 1; t < 3; t++)
        if (memcmp(o[0], o[t], (size_t)nq * 2) != 0 ||
            memcmp(l[0], l[t], (size_t)lse_count(p) * sizeof(float)) != 0) {
            describe(p);
            fprintf(stderr, "   1 and %d threads give other bits\n", t + 1);
            broken++;
        }
    memcpy(res, o[0], (size_t)nq * 2);
    memcpy(res + nq * 2, l[0], (size_t)lse_count(p) * sizeof(float));
    for (int t = 0; t < 3; t++)
        free(o[t]), free(l[t]);
    free(q), free(k), free(v), free(exact), free(exact_lse), free(lse_tol), free(var);
    return broken;
}

/* The child for one kernel (0 native, 1 emulated, 2 AMX): every problem, its results
 * into res. Exits 0 when all hold, TU_CHILD_SKIPPED when this CPU cannot run the
 * kernel. */
static void child(int kernel, void *out)
{
    unsigned char *res = out;
    const int emulated = kernel == 1;
    if (emulated)
        setenv("ATTN_BF16_EMULATE", "always", 1);
    else
        unsetenv("ATTN_BF16_EMULATE");
    run_arch = kernel == 2 ? ATTN_ARCH_AMX : ATTN_ARCH_AVX512_BF16;
    /* so that the reason says which kernel runs */
    setenv("ATTN_ARCH", kernel == 2 ? "amx" : "avx512bf16", 1);
    if (!attn_arch_supported(run_arch) ||
        (kernel == 0 && !(attn_cpu_features() & ATTN_CPU_AVX512_BF16)))
        _exit(TU_CHILD_SKIPPED);
    /* The comparison of the two kernels means something only if each child runs the
     * kernel it names. */
    const char *reason = attn_arch_reason(NULL);
    int broken = (strstr(reason, "emulated") != NULL) != emulated;
    if (broken)
        fprintf(stderr, "   the %s child runs: %s\n", emulated ? "emulated" : "native", reason);
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        broken += check_problem(&p, res);
        res += result_bytes(&p);
    }
    fflush(NULL);
    _exit(broken > 0);
}

int main(void)
{
    int64_t total = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        total += result_bytes(&p);
    }
    const size_t bytes = 3 * (size_t)total;
    unsigned char *shared = tu_shared_alloc(bytes);
    if (!shared)
        return check_summary("test_bf16_lazy");
    static const char *const kernels[3] = {"native (vdpbf16ps)", "emulated (AVX-512F)",
                                           "AMX-BF16"};
    int ran[3] = {0, 0, 0};
    for (int e = 0; e < 3; e++) {
        char what[256];
        snprintf(what, sizeof what,
                 "the %s kernel: %d problems (every fill, causal top-left, bottom-right or "
                 "not, with and without lse) within the oracle's bounds, 1, 2 and 3 threads the same bits",
                 kernels[e], N_PROBLEMS);
        TEST(what);
        if (tu_run_child(child, e, shared + e * total, kernels[e]) == TU_CHILD_SKIP) {
            fprintf(stderr, "-- skipped: this CPU or build cannot run the %s kernel\n",
                    kernels[e]);
            continue;
        }
        ran[e] = 1;
    }
    TEST("the native and the emulated kernel give the same bits on every problem");
    if (ran[0] && ran[1]) {
        const unsigned char *a = shared, *b = shared + total;
        int differing = 0;
        for (int n = 0; n < N_PROBLEMS; n++) {
            const problem p = problem_of(n);
            if (memcmp(a, b, (size_t)result_bytes(&p)) != 0) {
                describe(&p);
                differing++;
            }
            a += result_bytes(&p);
            b += result_bytes(&p);
        }
        CHECK_INT(differing, 0);
    } else {
        fprintf(stderr, "-- skipped: needs both kernels\n");
    }
    tu_shared_free(shared, bytes);
    return check_summary("test_bf16_lazy");
}
