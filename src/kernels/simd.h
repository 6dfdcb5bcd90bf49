/*
 * simd.h - the thin SIMD layer the fused kernels are written over; not installed.
 *
 * One kernel body (src/kernels/fused_kernel.h, src/kernels/gemm_kernel.h) is compiled three times:
 * by src/kernels/sdpa_fused.c with no ISA flags (portable C), by src/kernels/sdpa_fused_avx2.c with
 * -mavx2 -mfma and by src/kernels/sdpa_fused_avx512.c with -mavx512f -mavx512dq
 * -mavx512bw -mavx512vl (CMake adds the flags to those files only; the runtime
 * dispatch takes that path only when cpuid reports all four). Each of those files defines exactly one of
 *
 *     ATTN_SIMD_SCALAR   ATTN_SIMD_AVX2   ATTN_SIMD_AVX512
 *
 * before including this header, which then provides, for that instruction set:
 *
 *     simd_f32                a vector of SIMD_W floats (a plain float for SCALAR)
 *     simd_zero/set1/load/store/add/sub/mul/max/fma   (loads and stores unaligned;
 *                             simd_fma(a, b, c) = a * b + c)
 *     simd_hmax, simd_hsum    horizontal max and sum, in a fixed order
 *     simd_hsum4_scaled(o, a, b, c, d, scale)
 *                             o[0..3] = the horizontal sums of a, b, c and d, each
 *                             times scale: the four reduced together (see below)
 *     simd_load_n(p, n, fill) the first n < SIMD_W lanes from p, the others `fill`;
 *                             never touches memory past p + n
 *     simd_store_n(p, v, n)   the first n < SIMD_W lanes of v to p
 *     simd_load_strided(p, s) lane r from p[r * s] (a gather); the caller keeps
 *                             (SIMD_W - 1) * s within int32_t
 *     simd_transpose_block(dst, ldd, src, lds)
 *                             dst[c * ldd + r] = src[r * lds + c] for r, c < SIMD_W,
 *                             in registers; only where SIMD_HAS_TRANSPOSE is 1 (the
 *                             GEMM's and the backward's packing use it)
 *     simd_exp_nonpos(x)      e^x for x <= 0 (including -inf), see below
 *     simd_exp2_nonpos(x)     2^x for x <= 0 (including -inf), see below
 *     simd_div, simd_abs      a / b, |a|
 *     simd_copysign(a, b)     |a| with the sign of b
 *     simd_select_lt(a, b, x, y)  x where a < b, else y (y where either is NaN)
 *     simd_tanh(x)            tanh(x) for every x, built on simd_exp_nonpos, see below
 *
 * The choice is made by the defining file, not by the compiler's predefined macros,
 * so that an -march=native build still compiles the portable file as portable C.
 *
 * Nothing here allocates, branches on data or depends on the thread count, so a
 * result is the same bit for bit whoever computes it.
 */
#ifndef ATTN_SIMD_H
#define ATTN_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(ATTN_SIMD_AVX512) + defined(ATTN_SIMD_AVX2) + defined(ATTN_SIMD_SCALAR) != 1
#error "define exactly one of ATTN_SIMD_AVX512, ATTN_SIMD_AVX2, ATTN_SIMD_SCALAR"
#endif

/*
 * e^x for x <= 0, in the three instruction sets, by the same steps:
 *
 *   x < -87.33 (below the smallest normal float, and -inf): exactly 0, so a masked
 *   score gets weight exactly 0 and no denormal appears; NaN stays NaN;
 *   otherwise n = round(x log2 e), r = x - n ln 2 (ln 2 split in two so that n ln2_hi
 *   is exact, Cody and Waite), e^r by its Taylor series to degree 7 (|r| <= ln2 / 2,
 *   so the first dropped term is below 2^-27 relative), times 2^n built in the
 *   exponent bits. Measured worst error 0.9 ulp with FMA, 1.2 ulp without;
 *   tests/test_fused_exp.c holds every path to 2 ulp.
 */
#define SIMD_EXP_MIN (-87.33f)
#define SIMD_LOG2E 1.44269504088896341f
#define SIMD_LN2_HI 0.693359375f
#define SIMD_LN2_LO (-2.12194440e-4f)
#define SIMD_C2 (1.0f / 2.0f)
#define SIMD_C3 (1.0f / 6.0f)
#define SIMD_C4 (1.0f / 24.0f)
#define SIMD_C5 (1.0f / 120.0f)
#define SIMD_C6 (1.0f / 720.0f)
#define SIMD_C7 (1.0f / 5040.0f)

/* The portable scalar version: the SCALAR path's exp. */
static inline float simd_exp_nonpos_1(float x)
{
    if (x != x)
        return x; /* NaN stays NaN: a NaN score makes its row NaN, as in the reference */
    if (x < SIMD_EXP_MIN)
        return 0.0f; /* also -inf */
    /* x > 0 is outside the domain. The fused kernel passes one only in a row that a
     * NaN score already makes NaN (a vector max can drop a NaN and leave the row's
     * max below an earlier score), and it could be as large as FLT_MAX, where the
     * conversion of n to int32_t below would be undefined: so clamp it. */
    if (x > 0.0f)
        x = 0.0f;
    /* Adding 1.5 * 2^23 rounds to the nearest integer in the default rounding mode. */
    const float shifter = 12582912.0f;
    float n = (x * SIMD_LOG2E + shifter) - shifter; /* IEEE: not folded without fast-math */
    float r = x - n * SIMD_LN2_HI;
    r = r - n * SIMD_LN2_LO;
    float p = SIMD_C7;
    p = p * r + SIMD_C6;
    p = p * r + SIMD_C5;
    p = p * r + SIMD_C4;
    p = p * r + SIMD_C3;
    p = p * r + SIMD_C2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/*
 * 2^x for x <= 0, in the three instruction sets, by the same steps: the softmax's
 * exp when the scores are kept in base-2 units (each multiplied by log2(e) along with
 * the scale, as in FlashAttention-2's kernels), which needs no reduction by ln 2:
 *
 *   x < -126 (below the smallest normal float's exponent, and -inf): exactly 0, so a
 *   masked score gets weight exactly 0 and no denormal appears; NaN stays NaN;
 *   otherwise n = x rounded to the nearest integer (ties to even), r = x - n in
 *   [-1/2, 1/2], exact (for |x| < 1/2, n = 0; otherwise n is within a factor of 2
 *   of x, Sterbenz), 2^r by the degree-6 polynomial below, times 2^n (vscalefps, or
 *   built in the exponent bits), exact: at least 2^-126, a normal float.
 *
 * The polynomial is the minimax approximation of 2^r on [-1/2, 1/2] in relative
 * error with the constant term held at 1 (so 2^0 = 1 and 2^-k is exactly 2^-k),
 * found by the Remez exchange in 50-digit arithmetic: its own error is 2.0e-9
 * (2^-28.9), about 0.03 ulp; the rest is the coefficients' and the Horner steps'
 * roundings. Measured over every float32 x in [-126, 0] against double exp2: worst
 * 0.95 ulp with FMA (the AVX2 and AVX-512 paths, the same bits on every one of
 * those x), 1.23 ulp without (the scalar path); tests/test_fused_exp.c holds every
 * path to 2 ulp and the two vector paths to the same bits. An exact r matters:
 * vreduceps rounding down (r = x - floor(x) in [0, 1)) rounds 1 + x for x in
 * (-1, 0) toward -inf, which no AVX2 instruction does without a change of the
 * rounding mode, so the two paths' bits would differ.
 *
 * It is 10 vector instructions on AVX-512 (compare, vreduceps, subtract, six FMAs,
 * vscalefps) where simd_exp_nonpos takes 14 (its multiply by log2(e), rounding,
 * and Cody-Waite steps are what base-2 scores save).
 */
#define SIMD_EXP2_MIN (-126.0f)
#define SIMD_E2_C1 0x1.62e430p-1f
#define SIMD_E2_C2 0x1.ebfbdcp-3f
#define SIMD_E2_C3 0x1.c6aee8p-5f
#define SIMD_E2_C4 0x1.3b2d4cp-7f
#define SIMD_E2_C5 0x1.5f3e52p-10f
#define SIMD_E2_C6 0x1.41fbbcp-13f

/* The portable scalar version: the SCALAR path's 2^x. */
static inline float simd_exp2_nonpos_1(float x)
{
    if (x != x)
        return x; /* NaN stays NaN */
    if (x < SIMD_EXP2_MIN)
        return 0.0f; /* also -inf */
    /* x > 0 is outside the domain (see simd_exp_nonpos_1): clamp it, so that the
     * conversion of n to int32_t below stays defined. */
    if (x > 0.0f)
        x = 0.0f;
    /* Adding 1.5 * 2^23 rounds to the nearest integer in the default rounding mode. */
    const float shifter = 12582912.0f;
    const float n = (x + shifter) - shifter; /* IEEE: not folded without fast-math */
    const float r = x - n;
    float p = SIMD_E2_C6;
    p = p * r + SIMD_E2_C5;
    p = p * r + SIMD_E2_C4;
    p = p * r + SIMD_E2_C3;
    p = p * r + SIMD_E2_C2;
    p = p * r + SIMD_E2_C1;
    p = p * r + 1.0f;
    /* -126 <= n <= 0, so the biased exponent is 1 .. 127: a normal 2^n. */
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#if defined(ATTN_SIMD_AVX512)
#include <immintrin.h>

#define SIMD_W 16
typedef __m512 simd_f32;

static inline simd_f32 simd_zero(void) { return _mm512_setzero_ps(); }
static inline simd_f32 simd_set1(float x) { return _mm512_set1_ps(x); }
static inline simd_f32 simd_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void simd_store(float *p, simd_f32 v) { _mm512_storeu_ps(p, v); }
static inline simd_f32 simd_add(simd_f32 a, simd_f32 b) { return _mm512_add_ps(a, b); }
static inline simd_f32 simd_sub(simd_f32 a, simd_f32 b) { return _mm512_sub_ps(a, b); }
static inline simd_f32 simd_mul(simd_f32 a, simd_f32 b) { return _mm512_mul_ps(a, b); }
static inline simd_f32 simd_max(simd_f32 a, simd_f32 b) { return _mm512_max_ps(a, b); }
static inline simd_f32 simd_fma(simd_f32 a, simd_f32 b, simd_f32 c)
{
    return _mm512_fmadd_ps(a, b, c);
}
static inline simd_f32 simd_div(simd_f32 a, simd_f32 b) { return _mm512_div_ps(a, b); }
static inline simd_f32 simd_abs(simd_f32 a)
{
    return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a);
}
static inline simd_f32 simd_copysign(simd_f32 a, simd_f32 b)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    return _mm512_or_ps(_mm512_andnot_ps(sign, a), _mm512_and_ps(sign, b));
}
static inline simd_f32 simd_select_lt(simd_f32 a, simd_f32 b, simd_f32 x, simd_f32 y)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
static inline float simd_hmax(simd_f32 v) { return _mm512_reduce_max_ps(v); }
static inline float simd_hsum(simd_f32 v) { return _mm512_reduce_add_ps(v); }
/* Four vectors reduced together: the upper 256 bits of each added to its lower 256
 * (two vectors a register), then the upper 128 of that to its lower 128 (four
 * vectors a register, one a 128-bit lane), then within each lane (x0 + x2) +
 * (x1 + x3); one permute gathers the four sums, one multiply scales them. About
 * 15 instructions where four simd_hsum and four scalar multiplies take about 36. */
static inline void simd_hsum4_scaled(float *o, simd_f32 a, simd_f32 b, simd_f32 c, simd_f32 d,
                                     float scale)
{
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    const __m512 w = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
    const __m512 x = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));
    const __m512 g = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), x);
    _mm_storeu_ps(o, _mm_mul_ps(_mm512_castps512_ps128(g), _mm_set1_ps(scale)));
}
static inline simd_f32 simd_load_n(const float *p, int64_t n, float fill)
{
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << n) - 1u), p);
}
static inline void simd_store_n(float *p, simd_f32 v, int64_t n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}
static inline simd_f32 simd_load_strided(const float *p, int32_t stride)
{
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride));
    return _mm512_i32gather_ps(idx, p, 4);
}

static inline simd_f32 simd_exp_nonpos(simd_f32 x)
{
    /* Not below the minimum, or NaN (unordered): NaN then flows through to p. */
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SIMD_EXP_MIN), _CMP_NLT_UQ);
    /* No clamp of x to the minimum, as the other paths need before their integer
     * 2^n: below it the lane is masked to 0 whatever p and n are, and vscalefps
     * takes any n. */
    simd_f32 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SIMD_LOG2E)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    simd_f32 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SIMD_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SIMD_LN2_LO), r);
    simd_f32 p = _mm512_set1_ps(SIMD_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    /* p * 2^n in one instruction (vscalefps) rather than four (convert, add the
     * bias, shift into the exponent, multiply), on the FMA ports that the
     * products need: the same single rounding of the exact product, so the same
     * bits for every x <= 88 (checked over every such float32 when this and the
     * clamp's removal replaced the old steps), and inf rather than a wrapped
     * exponent above. */
    return _mm512_maskz_scalef_ps(live, p, n);
}

static inline simd_f32 simd_exp2_nonpos(simd_f32 x)
{
    /* Not below the minimum, or NaN (unordered): NaN then flows through r and p. */
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SIMD_EXP2_MIN), _CMP_NLT_UQ);
    /* r = x - round(x) in one instruction (vreduceps, AVX512DQ, with no fraction
     * bits kept, to nearest), exact, and n = x - r, exact: the AVX2 path's r and n. */
    const simd_f32 r = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const simd_f32 n = _mm512_sub_ps(x, r);
    simd_f32 p = _mm512_set1_ps(SIMD_E2_C6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_E2_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_E2_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_E2_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_E2_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_E2_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    /* p * 2^n in one instruction, exact (n >= -126, p near [0.7, 1.4]). */
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* Three rounds: 32-bit interleaves of row pairs, 64-bit interleaves of those pairs,
 * then two rounds of 128-bit lane shuffles that bring each column's four groups of
 * four rows together. Pure data movement: the floats are copied, never changed. */
#define SIMD_HAS_TRANSPOSE 1
static inline void simd_transpose_block(float *d, int64_t ld, const float *s, int64_t ls)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(s + i * ls);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 per lane */
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), e = _mm512_castps_pd(t[4 * i + 3]);
        /* r[4i + j], lane L: rows 4i .. 4i+3 of column j + 4L. */
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, e));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, e));
    }
    for (int j = 0; j < 4; j++) {
        const __m512 t1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88); /* columns j, j + 8 */
        const __m512 t2 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd); /* j + 4, j + 12 */
        const __m512 t3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        const __m512 t4 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
        _mm512_storeu_ps(d + j * ld, _mm512_shuffle_f32x4(t1, t3, 0x88));
        _mm512_storeu_ps(d + (j + 8) * ld, _mm512_shuffle_f32x4(t1, t3, 0xdd));
        _mm512_storeu_ps(d + (j + 4) * ld, _mm512_shuffle_f32x4(t2, t4, 0x88));
        _mm512_storeu_ps(d + (j + 12) * ld, _mm512_shuffle_f32x4(t2, t4, 0xdd));
    }
}

#elif defined(ATTN_SIMD_AVX2)
#include <immintrin.h>

#define SIMD_W 8
typedef __m256 simd_f32;

static inline simd_f32 simd_zero(void) { return _mm256_setzero_ps(); }
static inline simd_f32 simd_set1(float x) { return _mm256_set1_ps(x); }
static inline simd_f32 simd_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void simd_store(float *p, simd_f32 v) { _mm256_storeu_ps(p, v); }
static inline simd_f32 simd_add(simd_f32 a, simd_f32 b) { return _mm256_add_ps(a, b); }
static inline simd_f32 simd_sub(simd_f32 a, simd_f32 b) { return _mm256_sub_ps(a, b); }
static inline simd_f32 simd_mul(simd_f32 a, simd_f32 b) { return _mm256_mul_ps(a, b); }
static inline simd_f32 simd_max(simd_f32 a, simd_f32 b) { return _mm256_max_ps(a, b); }
static inline simd_f32 simd_fma(simd_f32 a, simd_f32 b, simd_f32 c)
{
    return _mm256_fmadd_ps(a, b, c);
}
static inline simd_f32 simd_div(simd_f32 a, simd_f32 b) { return _mm256_div_ps(a, b); }
static inline simd_f32 simd_abs(simd_f32 a)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a);
}
static inline simd_f32 simd_copysign(simd_f32 a, simd_f32 b)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(sign, a), _mm256_and_ps(sign, b));
}
static inline simd_f32 simd_select_lt(simd_f32 a, simd_f32 b, simd_f32 x, simd_f32 y)
{
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
static inline float simd_hmax(simd_f32 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float simd_hsum(simd_f32 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Four vectors reduced together: the upper 128 bits of each added to its lower 128
 * (two vectors a register, one a 128-bit lane), then within each lane (x0 + x2) +
 * (x1 + x3), the order of the AVX-512 build's last two steps; one unpack gathers
 * the four sums, one multiply scales them. */
static inline void simd_hsum4_scaled(float *o, simd_f32 a, simd_f32 b, simd_f32 c, simd_f32 d,
                                     float scale)
{
    /* ab = [a_lo + a_hi | b_lo + b_hi], cd likewise. */
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    /* w = [a0 + a2, c0 + c2, a1 + a3, c1 + c3 | the same of b and d]. */
    const __m256 w = _mm256_add_ps(_mm256_unpacklo_ps(ab, cd), _mm256_unpackhi_ps(ab, cd));
    /* Lanes 0 and 1 of each half: (x0 + x2) + (x1 + x3) of a, c | b, d. */
    const __m256 x = _mm256_add_ps(w, _mm256_permute_ps(w, 0x4E));
    const __m128 r = _mm_unpacklo_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    _mm_storeu_ps(o, _mm_mul_ps(r, _mm_set1_ps(scale)));
}

static inline __m256i simd_lanes_below(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline simd_f32 simd_load_n(const float *p, int64_t n, float fill)
{
    __m256i m = simd_lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m),
                            _mm256_castsi256_ps(m));
}
static inline void simd_store_n(float *p, simd_f32 v, int64_t n)
{
    _mm256_maskstore_ps(p, simd_lanes_below(n), v);
}
static inline simd_f32 simd_load_strided(const float *p, int32_t stride)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32(stride));
    return _mm256_i32gather_ps(p, idx, 4);
}

static inline simd_f32 simd_exp_nonpos(simd_f32 x)
{
    /* Not below the minimum, or NaN (unordered): NaN then flows through to p. */
    __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(SIMD_EXP_MIN), _CMP_NLT_UQ);
    /* No clamp of x to the minimum: below it (and at -inf) the conversion of n may
     * give any integer and p any value, NaN included, but the final `and` with
     * `live` makes the lane 0 all the same (every float32 gives the bits it gave
     * with the clamp: checked over all 2^32 when the clamp was dropped). */
    /* n = x * log2(e) rounded to the nearest integer, ties to even, by adding and
     * subtracting 1.5 * 2^23: in [2^23, 2^24) the floats are the integers, so the
     * sum rounds as vroundps would (the same n for every |x * log2(e)| < 2^22,
     * which covers every lane the final `and` keeps), and t holds 2^22 + n in its
     * low 23 bits, from which the exponent of 2^n is one integer add and a shift.
     * That is two uops fewer than vroundps (two uops on Intel cores) and
     * vcvtps2dq, all on the ports the products need; an odd constant (with the
     * bias 127 folded in) would round ties the other way. Checked over every
     * float32 x <= 0 and every NaN against those two: the same bits. */
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(SIMD_LOG2E)), magic);
    simd_f32 n = _mm256_sub_ps(t, magic);
    simd_f32 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SIMD_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SIMD_LN2_LO), r);
    simd_f32 p = _mm256_set1_ps(SIMD_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* (2^22 + n + 127) << 23: the bits above the exponent's fall off the top. */
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline simd_f32 simd_exp2_nonpos(simd_f32 x)
{
    /* Not below the minimum, or NaN (unordered): NaN then flows through to p. */
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(SIMD_EXP2_MIN), _CMP_NLT_UQ);
    /* n = x rounded to the nearest integer, ties to even, as vreduceps does, by
     * adding and subtracting 1.5 * 2^23 (see simd_exp_nonpos: t then holds 2^22 + n
     * in its low bits); r = x - n exact. Below the minimum (and at -inf) n and r may
     * be anything: the final `and` with `live` makes the lane 0. */
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_add_ps(x, magic);
    const __m256 r = _mm256_sub_ps(x, _mm256_sub_ps(t, magic));
    simd_f32 p = _mm256_set1_ps(SIMD_E2_C6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_E2_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_E2_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_E2_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_E2_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SIMD_E2_C1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n in the exponent bits, (2^22 + n + 127) << 23 (the bits above the
     * exponent's fall off the top); the product is exact, so these are the AVX-512
     * path's bits. */
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* 32-bit interleaves of row pairs, 64-bit interleaves of those, then the 128-bit
 * halves of rows 0-3 and 4-7 put together. Pure data movement. */
#define SIMD_HAS_TRANSPOSE 1
static inline void simd_transpose_block(float *d, int64_t ld, const float *s, int64_t ls)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(s + i * ls);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 per half */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 2; i++) {
        const __m256d a = _mm256_castps_pd(t[4 * i]), b = _mm256_castps_pd(t[4 * i + 2]);
        const __m256d c = _mm256_castps_pd(t[4 * i + 1]), e = _mm256_castps_pd(t[4 * i + 3]);
        /* r[4i + j], half H: rows 4i .. 4i+3 of column j + 4H. */
        r[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(c, e));
        r[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(c, e));
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_ps(d + j * ld, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
        _mm256_storeu_ps(d + (j + 4) * ld, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
    }
}

#else /* ATTN_SIMD_SCALAR */

#define SIMD_HAS_TRANSPOSE 0

#define SIMD_W 1
typedef float simd_f32;

static inline simd_f32 simd_zero(void) { return 0.0f; }
static inline simd_f32 simd_set1(float x) { return x; }
static inline simd_f32 simd_load(const float *p) { return *p; }
static inline void simd_store(float *p, simd_f32 v) { *p = v; }
static inline simd_f32 simd_add(simd_f32 a, simd_f32 b) { return a + b; }
static inline simd_f32 simd_sub(simd_f32 a, simd_f32 b) { return a - b; }
static inline simd_f32 simd_mul(simd_f32 a, simd_f32 b) { return a * b; }
static inline simd_f32 simd_max(simd_f32 a, simd_f32 b) { return a > b ? a : b; }
/* Two roundings (no fmaf): a software fmaf would be slow where FMA is missing. */
static inline simd_f32 simd_fma(simd_f32 a, simd_f32 b, simd_f32 c) { return a * b + c; }
static inline simd_f32 simd_div(simd_f32 a, simd_f32 b) { return a / b; }
static inline simd_f32 simd_abs(simd_f32 a) { return fabsf(a); }
static inline simd_f32 simd_copysign(simd_f32 a, simd_f32 b) { return copysignf(a, b); }
static inline simd_f32 simd_select_lt(simd_f32 a, simd_f32 b, simd_f32 x, simd_f32 y)
{
    return a < b ? x : y;
}
static inline float simd_hmax(simd_f32 v) { return v; }
static inline float simd_hsum(simd_f32 v) { return v; }
static inline void simd_hsum4_scaled(float *o, simd_f32 a, simd_f32 b, simd_f32 c, simd_f32 d,
                                     float scale)
{
    o[0] = a * scale, o[1] = b * scale, o[2] = c * scale, o[3] = d * scale;
}
/* With one lane, n is 0 (nothing) or 1 (the lane). */
static inline simd_f32 simd_load_n(const float *p, int64_t n, float fill)
{
    return n > 0 ? *p : fill;
}
static inline simd_f32 simd_load_strided(const float *p, int32_t stride)
{
    (void)stride;
    return *p;
}
static inline void simd_store_n(float *p, simd_f32 v, int64_t n)
{
    if (n > 0)
        *p = v;
}
static inline simd_f32 simd_exp_nonpos(simd_f32 x) { return simd_exp_nonpos_1(x); }
static inline simd_f32 simd_exp2_nonpos(simd_f32 x) { return simd_exp2_nonpos_1(x); }

#endif

/*
 * tanh(x) for every x (softcap's c * tanh(s / c)), in the three instruction sets, by
 * the same steps on a = |x|, the sign put back at the end (tanh is odd):
 *
 *   a < 0.55: the Taylor series of tanh, a + a z (c3 + z (c5 + ...)), z = a^2, to
 *   degree 21 (the coefficient of a^(2n-1) is 2^2n (2^2n - 1) B_2n / (2n)!, B the
 *   Bernoulli numbers; with z <= 0.3025 each term is at most 0.13 times the one
 *   before, so the first dropped term is below 2^-29 relative);
 *   otherwise (1 - e) / (1 + e) with e = e^(-2a) from simd_exp_nonpos: there e <= 0.34,
 *   so 1 - e loses at most one bit to cancellation, and e = 0 for a > 43.7 gives
 *   exactly 1 (and 1 at +-inf).
 *
 * NaN in, NaN out (the comparison sends it to the exp branch, which keeps it).
 * tests/test_fused_tanh.c holds every path to 3 ulp against libm's double tanh.
 */
#define SIMD_TANH_SMALL 0.55f

static inline simd_f32 simd_tanh(simd_f32 x)
{
    const simd_f32 a = simd_abs(x);
    const simd_f32 z = simd_mul(a, a);
    simd_f32 p = simd_set1((float)(18888466084.0 / 194896477400625.0));
    p = simd_fma(p, z, simd_set1((float)(-443861162.0 / 1856156927625.0)));
    p = simd_fma(p, z, simd_set1((float)(6404582.0 / 10854718875.0)));
    p = simd_fma(p, z, simd_set1((float)(-929569.0 / 638512875.0)));
    p = simd_fma(p, z, simd_set1((float)(21844.0 / 6081075.0)));
    p = simd_fma(p, z, simd_set1((float)(-1382.0 / 155925.0)));
    p = simd_fma(p, z, simd_set1((float)(62.0 / 2835.0)));
    p = simd_fma(p, z, simd_set1((float)(-17.0 / 315.0)));
    p = simd_fma(p, z, simd_set1((float)(2.0 / 15.0)));
    p = simd_fma(p, z, simd_set1((float)(-1.0 / 3.0)));
    const simd_f32 small = simd_fma(simd_mul(a, z), p, a);
    const simd_f32 e = simd_exp_nonpos(simd_mul(simd_set1(-2.0f), a));
    const simd_f32 one = simd_set1(1.0f);
    const simd_f32 large = simd_div(simd_sub(one, e), simd_add(one, e));
    return simd_copysign(simd_select_lt(a, simd_set1(SIMD_TANH_SMALL), small, large), x);
}

#endif /* ATTN_SIMD_H */
