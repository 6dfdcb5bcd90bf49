/*
 * rope.c - rotary position embedding (RoPE; Su et al., RoFormer, arXiv 2104.09864).
 *
 * Pair k of a row at position p turns by the angle p * inv_freq[k], with
 * inv_freq[k] = 1 / base^(2k / D). The float32 recipe is the one of the
 * tutorial's chapter 21 (build_rope_cache in src/llm_tutor/models/modern_attention.py
 * of fengjikui/llm-tutor): the exponent 2k / D is a float32 division, inv_freq is
 * 1 / base**exponent in float32, the angle is the float32 product of the position
 * (a float32 arange) and inv_freq, and cos and sin are taken of that float32 angle.
 * Every step here rounds to float32 at the same place, and the rotation is two
 * products and one sum per output, each rounded (the file is built without FMA
 * contraction: C11 mode), so a result differs from PyTorch's only where its pow,
 * cos or sin differ from the C library's in the last bit.
 *
 * The pairings differ only in which features form pair k: interleaved (2k, 2k+1;
 * chapter 21's apply_rope, GPT-J) or half (k, k + D/2; Llama and GPT-NeoX, whose
 * rotate_half puts -x[k + D/2] beside x[k]).
 */
#include "rope.h"

#include <math.h>
#include <string.h>

/* Pairs handled per pass: their inv_freq, cos and sin live on the stack, so a row
 * of any width is rotated without allocating. */
#define ROPE_CHUNK 128

void attn_rope_params_init(attn_rope_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->pairing = ATTN_ROPE_INTERLEAVED;
    p->base = 10000.0f;
    p->offset = 0;
}

int attn__rope_check(attn_ctx *ctx, const attn_rope_params *p, int64_t D, int check_offset)
{
    if (p->pairing != ATTN_ROPE_INTERLEAVED && p->pairing != ATTN_ROPE_HALF)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "unknown RoPE pairing %d (0 interleaved, 1 half)", (int)p->pairing);
    if (!(p->base > 0.0f) || isinf(p->base))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "RoPE base %g must be a positive finite number", (double)p->base);
    if (check_offset && p->offset < 0)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "RoPE offset %lld must be at least 0", (long long)p->offset);
    if (D % 2 != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "RoPE needs an even head dim: D=%lld is odd", (long long)D);
    return ATTN_OK;
}

void attn__rope_run(const attn_rope_params *p, int64_t H, int64_t T, int64_t D,
                    const float *x, const int64_t xs[3], float *out, const int64_t os[3],
                    int64_t pos0)
{
    attn__rope_rotate(p, 0, H, T, D, x, xs, out, os, pos0);
}

void attn__rope_rotate(const attn_rope_params *p, int inverse, int64_t H, int64_t T, int64_t D,
                       const float *x, const int64_t xs[3], float *out, const int64_t os[3],
                       int64_t pos0)
{
    const int64_t half = D / 2;
    /* Feature index of the pair's first and second member, per unit of k. */
    const int64_t step = p->pairing == ATTN_ROPE_HALF ? 1 : 2;
    const int64_t second = p->pairing == ATTN_ROPE_HALF ? half : 1;
    float inv_freq[ROPE_CHUNK], cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    for (int64_t k0 = 0; k0 < half; k0 += ROPE_CHUNK) {
        const int64_t nk = half - k0 < ROPE_CHUNK ? half - k0 : ROPE_CHUNK;
        for (int64_t k = 0; k < nk; k++) {
            const float e = (float)(2 * (k0 + k)) / (float)D;
            inv_freq[k] = 1.0f / powf(p->base, e);
        }
        for (int64_t t = 0; t < T; t++) {
            /* One position's angles serve every head. */
            const float pos = (float)(pos0 + t);
            for (int64_t k = 0; k < nk; k++) {
                const float angle = pos * inv_freq[k];
                cs[k] = cosf(angle);
                /* The inverse turns by -angle: sin(-a) = -sin(a) exactly in float,
                 * and cos is even, so the inverse is the forward with s negated. */
                sn[k] = inverse ? -sinf(angle) : sinf(angle);
            }
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + h * xs[0] + t * xs[1];
                float *orow = out + h * os[0] + t * os[1];
                for (int64_t k = 0; k < nk; k++) {
                    const int64_t i0 = (k0 + k) * step, i1 = i0 + second;
                    /* Both members are read before either is written: out may be x. */
                    const float a = xr[i0 * xs[2]], b = xr[i1 * xs[2]];
                    const float ac = a * cs[k], bs = b * sn[k];
                    const float as = a * sn[k], bc = b * cs[k];
                    orow[i0 * os[2]] = ac - bs;
                    orow[i1 * os[2]] = as + bc;
                }
            }
        }
    }
}

/* The checks and the loop that attn_rope_apply and attn_rope_backward share; fn
 * names the caller in the messages. */
static int rope_call(attn_ctx *ctx, const char *fn, int inverse, const attn_rope_params *p,
                     const attn_tensor *x, attn_tensor *out)
{
    attn_rope_params defaults;
    if (!p) {
        attn_rope_params_init(&defaults);
        p = &defaults;
    }
    if (!x || !out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                          !x ? "x" : "out");
    int rc;
    if ((rc = attn_tensor_check(ctx, x, "x")) || (rc = attn_tensor_check(ctx, out, "out")))
        return rc;
    if (x->dtype != ATTN_DTYPE_F32 || out->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s: %s must be float32, not %s", fn,
                          x->dtype != ATTN_DTYPE_F32 ? "x" : "out",
                          attn_dtype_name(x->dtype != ATTN_DTYPE_F32 ? x->dtype : out->dtype));
    int64_t xsh[4], xst[4], osh[4], ost[4];
    attn__as4d(x, xsh, xst);
    attn__as4d(out, osh, ost);
    if (x->ndim != out->ndim || memcmp(xsh, osh, sizeof xsh) != 0) {
        char a[128], b[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s: out has shape %s; expected x's shape %s", fn,
                          attn__shape_str(out, a, sizeof a), attn__shape_str(x, b, sizeof b));
    }
    if ((rc = attn__rope_check(ctx, p, xsh[3], 1)))
        return rc;
    /* Rows sit at offset .. offset + T - 1: the last must fit (T >= 1 here). */
    if (p->offset > INT64_MAX - (xsh[2] - 1))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "RoPE offset %lld plus %lld rows overflows", (long long)p->offset,
                          (long long)xsh[2]);
    if ((rc = attn__no_overlap(ctx, fn, out, "out", x, "x", 1)))
        return rc;
    for (int64_t b = 0; b < xsh[0]; b++)
        attn__rope_rotate(p, inverse, xsh[1], xsh[2], xsh[3],
                          (const float *)x->data + b * xst[0], xst + 1,
                          (float *)out->data + b * ost[0], ost + 1, p->offset);
    return ATTN_OK;
}

int attn_rope_apply(attn_ctx *ctx, const attn_rope_params *p, const attn_tensor *x,
                    attn_tensor *out)
{
    return rope_call(ctx, "attn_rope_apply", 0, p, x, out);
}

int attn_rope_backward(attn_ctx *ctx, const attn_rope_params *p, const attn_tensor *dy,
                       attn_tensor *dx)
{
    return rope_call(ctx, "attn_rope_backward", 1, p, dy, dx);
}
