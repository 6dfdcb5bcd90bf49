/*
 * rng.c - random numbers that equal PyTorch's CPU generator, draw for draw.
 *
 * The chapter's experiment seeds PyTorch (`torch.manual_seed(seed)`), draws the input
 * with `torch.randn(B, T, E)` and then builds two nn.Linear layers, whose default
 * initialisation draws weight then bias from uniform distributions. This file
 * reproduces those draws so that `inspect_self_attention --seed 42` computes on the
 * same numbers as the chapter. It is not a general-purpose or cryptographic RNG.
 *
 * What PyTorch 2.x does on the CPU, and where each fact comes from (paths are in the
 * pytorch/pytorch repository; every claim was also checked against torch 2.15 from
 * PyPI by tests/golden/gen_rng.py and tests/test_rng.c):
 *
 * 1. The engine is MT19937 (Matsumoto and Nishimura, ACM TOMACS 8(1), 1998), the
 *    2002 "init_genrand" seeding: state[0] = seed & 0xffffffff,
 *    state[j] = 1812433253 * (state[j-1] ^ (state[j-1] >> 30)) + j.  The 64-bit seed
 *    of manual_seed is truncated to its low 32 bits.
 *    (aten/src/ATen/core/MT19937RNGEngine.h, mt19937_engine::init_with_uint32.)
 *    Its output is the standard one (std::mt19937 gives the same stream).
 * 2. manual_seed also forgets the cached Box-Muller normal
 *    (aten/src/ATen/CPUGeneratorImpl.cpp, CPUGeneratorImpl::set_current_seed).
 * 3. random() is one 32-bit output; random64() is two, the first one the high half:
 *    (hi << 32) | lo  (CPUGeneratorImpl.cpp, random64 and make64BitsFrom32Bits).
 * 4. A uniform float in [from, to) takes one random(), keeps its low 24 bits (the
 *    float mantissa, std::numeric_limits<float>::digits) and computes, in float,
 *    x = (v & 0xffffff) * 2^-24, then x * (to - from) + from.  A double takes one
 *    random64() and keeps 53 bits.  (aten/src/ATen/core/TransformationHelper.h,
 *    transformation::uniform_real; DistributionsHelper.h, uniform_real_distribution.)
 *    Measured: in torch's AVX2 and AVX-512 kernel builds (the default on any x86-64
 *    CPU with AVX2) the compiler fuses `x * (to - from) + from` into one FMA; in the
 *    baseline build (ATEN_CPU_CAPABILITY=default) it is a multiply then an add. The
 *    two differ in the last bit for about one draw in three.
 * 5. randn on a contiguous float tensor of 16 or more elements
 *    (aten/src/ATen/native/cpu/DistributionTemplates.h, normal_kernel and
 *    normal_fill / normal_fill_AVX2): first every element gets a uniform float in
 *    [0, 1) as in 4; then each full block of 16 is turned into normals by Box-Muller
 *    with u1 = 1 - data[j] and u2 = data[j + 8] for j < 8:
 *      r = sqrt(-2 log u1), theta = 2 pi u2,
 *      data[j] = r cos(theta), data[j + 8] = r sin(theta);
 *    if the size is not a multiple of 16, the LAST 16 elements are drawn again (16
 *    fresh uniforms, overwriting the tail of the previous block too) and transformed
 *    as one more block.  On AVX2/AVX-512 builds log, sin and cos are the float
 *    polynomials of avx_mathfun.h (Pommier's sse_mathfun port of the Cephes
 *    library's logf and sinf/cosf, S. L. Moshier, "Methods and Programs for
 *    Mathematical Functions", 1989), and the result is fma(n, std, mean).  The
 *    baseline build instead calls the C library's logf/cosf/sinf on floats, with
 *    theta = (float)(2.0 * pi * (double)u2).  Both are implemented below; the
 *    AVX2 one also needs the FMAs that GCC put into torch's vector code (see the
 *    note above cephes_logf).
 * 6. randn on fewer than 16 elements draws each element on its own with
 *    at::normal_distribution<double>: if the generator holds a cached normal it is
 *    returned (and forgotten); otherwise u1 and u2 are uniform doubles (4), and
 *      r = sqrt(-2 log1p(-u2)), theta = 2 pi u1,
 *    r sin(theta) is cached in the generator and r cos(theta) is returned, then
 *    rounded to float.  (DistributionsHelper.h, normal_distribution.)  The cache
 *    lives in the generator, so it carries over from one small randn call to the
 *    next; uniform draws and the 16-block path neither use nor clear it.
 * 7. nn.Linear(in, out).reset_parameters() (torch/nn/modules/linear.py) calls
 *    init.kaiming_uniform_(weight, a=sqrt(5)): in Python doubles,
 *    gain = sqrt(2 / (1 + a**2)), std = gain / sqrt(fan_in), bound = sqrt(3) * std
 *    (torch/nn/init.py), which is 1/sqrt(in) up to rounding; then the bias gets
 *    uniform(-1/sqrt(in), 1/sqrt(in)).  uniform_ casts the double bounds to float
 *    and draws in row-major order (4).
 *
 * PyTorch 1.13 (Debian 12's python3-torch 1.13.1+dfsg-4): its source differs from
 * 2.x in one place that matters here, the small-tensor path (6), which computes
 * r = sqrt(-2 log(1 - u2)) where 2.x has log1p(-u2); that can move the last bit of
 * the double, but in 300,000 float draws it changed none.  Run against the golden
 * files (`/usr/bin/python3 tests/golden/gen_rng.py --compare`), 1.13 draws every
 * case bit for bit like 2.15, with its AVX2 and AVX-512 dispatch (our AVX2 flavor)
 * and with ATEN_CPU_CAPABILITY=default (our DEFAULT flavor).  Where the two could
 * differ, we follow 2.x, the chapter's.
 *
 * Floating-point care: every float operation below is written as its own statement,
 * in the order PyTorch evaluates it, and the file asks the compiler not to contract
 * a * b + c into an FMA (FP_CONTRACT OFF for clang; GCC does not contract across
 * statements under -std=c11).  Where PyTorch's build does fuse, we call fmaf(),
 * which C11 defines as correctly rounded, so the result does not depend on the
 * machine: the same seed gives the same bits with or without -march=native.
 *
 * How far the match goes: measured with torch 2.15.0 (PyPI, x86-64, AVX-512 dispatch
 * and ATEN_CPU_CAPABILITY=avx2/default), randn of 1..4,000,000 elements and uniform_
 * with several bounds are bit-identical in both flavors.  The double path (6) uses
 * the C library's log1p/sin/cos, as torch does; a libm other than glibc's could
 * change a last bit there.
 */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define MT_N 624
#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

/* pi as c10::pi<double>, to double precision. */
#define RNG_PI 3.14159265358979323846

void attn_rng_seed(attn_rng *rng, uint64_t seed)
{
    if (!rng)
        return;
    rng->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (int j = 1; j < MT_N; j++) {
        uint32_t prev = rng->state[j - 1];
        rng->state[j] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)j;
    }
    rng->index = MT_N; /* the first draw regenerates the whole state */
    rng->has_next_normal = 0;
    rng->next_normal = 0.0;
    rng->flavor = ATTN_RNG_TORCH_AVX2;
}

/* One step of the recurrence: the upper bit of `upper`, the lower 31 of `lower`,
 * shifted and twisted, XOR the word M places on. */
static uint32_t mt_step(uint32_t upper, uint32_t lower, uint32_t far)
{
    uint32_t y = (upper & MT_UPPER) | (lower & MT_LOWER);
    return far ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
}

/* Regenerates all 624 words at once (the "twist" of MT19937), in three runs so that
 * no index wraps: word k uses words k + 1 and k + M (mod N) of the new-or-old state,
 * exactly as the reference implementation updates in place. */
static void mt_twist(attn_rng *rng)
{
    uint32_t *s = rng->state;
    int k = 0;
    for (; k < MT_N - MT_M; k++)
        s[k] = mt_step(s[k], s[k + 1], s[k + MT_M]);
    for (; k < MT_N - 1; k++)
        s[k] = mt_step(s[k], s[k + 1], s[k + MT_M - MT_N]);
    s[MT_N - 1] = mt_step(s[MT_N - 1], s[0], s[MT_M - 1]);
    rng->index = 0;
}

uint32_t attn_rng_u32(attn_rng *rng)
{
    if (!rng)
        return 0;
    if (rng->index < 0 || rng->index >= MT_N) /* also a struct that was never seeded */
        mt_twist(rng);
    uint32_t y = rng->state[rng->index++];
    /* Tempering. */
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t attn_rng_u64(attn_rng *rng)
{
    uint64_t hi = attn_rng_u32(rng);
    uint64_t lo = attn_rng_u32(rng);
    return (hi << 32) | lo;
}

/* A float in [0, 1): 24 random bits times 2^-24, exact. */
static float uniform01_f32(attn_rng *rng)
{
    return (float)(attn_rng_u32(rng) & 0xffffffu) * (1.0f / 16777216.0f);
}

/* A double in [0, 1): 53 random bits times 2^-53, exact. */
static double uniform01_f64(attn_rng *rng)
{
    return (double)(attn_rng_u64(rng) & ((UINT64_C(1) << 53) - 1)) *
           (1.0 / 9007199254740992.0);
}

void attn_rng_uniform(attn_rng *rng, float *out, int64_t n, float lo, float hi)
{
    if (!rng || !out)
        return;
    float width = hi - lo;
    for (int64_t i = 0; i < n; i++) {
        float x = uniform01_f32(rng);
        if (rng->flavor == ATTN_RNG_TORCH_DEFAULT) {
            float scaled = x * width;
            out[i] = scaled + lo;
        } else {
            out[i] = fmaf(x, width, lo);
        }
    }
}

/* ---------------------------------------------------------------------------------
 * The Cephes float polynomials used by torch's AVX2 normal_fill, one lane at a time.
 *
 * The constants are Cephes's published coefficients, written as PyTorch stores them
 * (decimal literals rounded to float). Each step is one IEEE float operation in the
 * order the vector code performs it, with one twist found by measurement: torch is
 * built by GCC with its default -ffp-contract=fast, and GCC's _mm256_mul_ps and
 * _mm256_add_ps are plain vector arithmetic, so in the AVX2/AVX-512 build the
 * compiler fuses each multiply whose only use is an add or subtract into an FMA.
 * Where two multiplies feed one add, the one computed first is fused. The fmaf()
 * calls below sit exactly where that happens; with them 4 million draws from
 * torch.randn match bit for bit (and without them about 1 in 1000 differ in the
 * last bit).
 * ------------------------------------------------------------------------------ */

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Natural log for x in (0, 1] (the only arguments Box-Muller passes). Splits
 * x = m * 2^e with m in [0.5, 1), moves m to [sqrt(1/2), sqrt(2)) - 1, and evaluates
 * Cephes logf's degree-9 polynomial. */
static float cephes_logf(float x)
{
    const float p[9] = {
        (float)7.0376836292E-2,  (float)-1.1514610310E-1, (float)1.1676998740E-1,
        (float)-1.2420140846E-1, (float)1.4249322787E-1,  (float)-1.6668057665E-1,
        (float)2.0000714765E-1,  (float)-2.4999993993E-1, (float)3.3333331174E-1,
    };
    const float q1 = (float)-2.12194440e-4;
    const float q2 = (float)0.693359375;
    const float sqrth = (float)0.707106781186547524;
    const float min_normal = bits_to_f32(0x00800000u);

    if (x < min_normal)
        x = min_normal;
    uint32_t bits = f32_to_bits(x);
    int32_t exponent = (int32_t)(bits >> 23) - 0x7f;
    x = bits_to_f32((bits & ~0x7f800000u) | f32_to_bits(0.5f));
    float e = (float)exponent;
    e = e + 1.0f;
    if (x < sqrth) {
        /* x = 2x - 1, computed as (x - 1) + x like the vector code. */
        float t = x;
        x = x - 1.0f;
        e = e - 1.0f;
        x = x + t;
    } else {
        x = x - 1.0f;
    }
    float z = x * x;
    float y = p[0];
    for (int i = 1; i < 9; i++)
        y = fmaf(y, x, p[i]);
    y = y * x;
    float e_q1 = e * q1;
    y = fmaf(y, z, e_q1); /* y*z is computed before e*q1, so it is the fused one */
    y = fmaf(-z, 0.5f, y);
    x = x + y;
    x = fmaf(e, q2, x);
    return x;
}

/* sin and cos of x >= 0 together (Cephes sinf/cosf: reduce by multiples of pi/4 with
 * a three-part pi/4, then one of two polynomials on [-pi/4, pi/4]). */
static void cephes_sincosf(float x, float *s, float *c)
{
    const float fopi = (float)1.27323954473516; /* 4 / pi */
    const float dp1 = (float)-0.78515625;
    const float dp2 = (float)-2.4187564849853515625e-4;
    const float dp3 = (float)-3.77489497744594108e-8;
    const float sincof[3] = {(float)-1.9515295891E-4, (float)8.3321608736E-3,
                             (float)-1.6666654611E-1};
    const float coscof[3] = {(float)2.443315711809948E-005, (float)-1.388731625493765E-003,
                             (float)4.166664568298827E-002};

    float y = x * fopi;
    int32_t j = (int32_t)y; /* truncation, as cvttps2dq */
    j = (j + 1) & ~1;
    y = (float)j;
    int sin_negate = (j & 4) != 0;
    int cos_negate = (~(j - 2) & 4) != 0;
    int octant_even = (j & 2) == 0; /* then sin uses the sine polynomial */

    /* x - j * pi/4 in three parts ("extended precision modular arithmetic"). */
    x = fmaf(y, dp1, x);
    x = fmaf(y, dp2, x);
    x = fmaf(y, dp3, x);

    float z = x * x;
    /* cosine polynomial: 1 - z/2 + z^2 (c0 z^2 + c1 z + c2) */
    float yc = coscof[0];
    yc = fmaf(yc, z, coscof[1]);
    yc = fmaf(yc, z, coscof[2]);
    yc = yc * z;
    float half_z = z * 0.5f;
    yc = fmaf(yc, z, -half_z); /* the earlier multiply, yc*z, is the fused one */
    yc = yc + 1.0f;
    /* sine polynomial: x + x z (s0 z^2 + s1 z + s2) */
    float ys = sincof[0];
    ys = fmaf(ys, z, sincof[1]);
    ys = fmaf(ys, z, sincof[2]);
    ys = ys * z;
    ys = fmaf(ys, x, x);

    float sv = octant_even ? ys : yc;
    float cv = octant_even ? yc : ys;
    *s = sin_negate ? -sv : sv;
    *c = cos_negate ? -cv : cv;
}

/* Box-Muller on one block of 16 uniforms in place (5 above). */
static void normal_block16(float *d, attn_rng_flavor flavor)
{
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - d[j]; /* [0, 1) -> (0, 1] so the log is finite */
        float u2 = d[j + 8];
        if (flavor == ATTN_RNG_TORCH_DEFAULT) {
            float r = sqrtf(-2.0f * logf(u1));
            float theta = (float)(2.0 * RNG_PI * (double)u2);
            float n1 = r * cosf(theta);
            float n2 = r * sinf(theta);
            /* `* std + mean` with std 1 and mean 0; + 0.0f turns -0 into +0. */
            d[j] = n1 + 0.0f;
            d[j + 8] = n2 + 0.0f;
        } else {
            const float two_pi = (float)(2.0f * RNG_PI);
            float lg = cephes_logf(u1);
            float r = sqrtf(-2.0f * lg);
            float theta = two_pi * u2;
            float sn, cs;
            cephes_sincosf(theta, &sn, &cs);
            float n1 = r * cs;
            float n2 = r * sn;
            d[j] = fmaf(n1, 1.0f, 0.0f);
            d[j + 8] = fmaf(n2, 1.0f, 0.0f);
        }
    }
}

double attn_rng_normal_f64(attn_rng *rng)
{
    if (!rng)
        return NAN;
    if (rng->has_next_normal) {
        rng->has_next_normal = 0;
        return rng->next_normal;
    }
    double u1 = uniform01_f64(rng);
    double u2 = uniform01_f64(rng);
    double r = sqrt(-2.0 * log1p(-u2));
    double theta = 2.0 * RNG_PI * u1;
    rng->next_normal = r * sin(theta);
    rng->has_next_normal = 1;
    return r * cos(theta);
}

void attn_rng_randn(attn_rng *rng, float *out, int64_t n)
{
    if (!rng || !out || n <= 0)
        return;
    if (n < 16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)attn_rng_normal_f64(rng);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = uniform01_f32(rng);
    for (int64_t i = 0; i + 16 <= n; i += 16)
        normal_block16(out + i, rng->flavor);
    if (n % 16 != 0) {
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++)
            tail[i] = uniform01_f32(rng);
        normal_block16(tail, rng->flavor);
    }
}

void attn_rng_linear_init(attn_rng *rng, float *weight, float *bias, int64_t out_features,
                          int64_t in_features)
{
    /* Nothing to draw for a NULL generator or weight, sizes below 1, or a weight
     * whose element count overflows. */
    if (!rng || !weight || out_features < 1 || in_features < 1 ||
        out_features > INT64_MAX / in_features)
        return;
    /* torch/nn/init.py, kaiming_uniform_ with a = sqrt(5), evaluated in doubles in
     * the same order as Python does. */
    double a = sqrt(5.0);
    double gain = sqrt(2.0 / (1.0 + a * a));
    double std = gain / sqrt((double)in_features);
    double bound = sqrt(3.0) * std;
    attn_rng_uniform(rng, weight, out_features * in_features, (float)-bound, (float)bound);
    if (bias) {
        double bias_bound = 1.0 / sqrt((double)in_features);
        attn_rng_uniform(rng, bias, out_features, (float)-bias_bound, (float)bias_bound);
    }
}
