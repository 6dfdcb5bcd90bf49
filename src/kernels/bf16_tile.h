/*
 * bf16_tile.h - one work item of the bfloat16 tile path (sdpa_bf16.h says the
 * plan and the packed layouts). Included once per bfloat16 kernel, by
 * src/kernels/sdpa_bf16_amx.c, sdpa_bf16_dp.c and sdpa_bf16_avx512.c, each of which
 * first defines the two products and their set-up:
 *
 *   b16_begin(cfg)   before an item's first product (AMX: load the tile
 *                    configuration into the 64 bytes at cfg); b16_end() after its last
 *   b16_scores(kp, ldk, qp, ST, ldst, nkp, nr, dp)
 *                    ST[c][r] = sum_d Kp[c][d] Q[r][d] for keys c < nkp (rows of kp,
 *                    ldk elements apart) and query rows r < nr, from Qp's pairs
 *   b16_pv(vt, ldv, pp, OT, ldo, nkp, nr, dvp)
 *                    OT[e][r] += sum_c Vt[e][c] P[r][c] for e < dvp, c < nkp, r < nr,
 *                    from Pp's pairs
 *
 * and B16_NATIVE_CVT when it has AVX512-BF16's vcvtne2ps2bf16 (the weights are
 * then rounded to bfloat16 by it, else by integer steps that round the same way:
 * to nearest even, a NaN kept a NaN). nkp and nr are multiples of 32, dp and dvp
 * too. Everything between the products is the float32 tile path's own code
 * (fused_tile.h), built here for AVX-512.
 */
#ifndef ATTN_BF16_TILE_H
#define ATTN_BF16_TILE_H

/* The float32 tile path's steps, built for AVX-512 with the avx512 build's
 * micro-tile sizes (sdpa_fused_avx512.c); this file uses the tile steps only, so
 * the rest of the kernel body is compiled here unused. */
#define ATTN_SIMD_AVX512 1
#define FK_MR 8
#define FK_NV 2
#define FK_MK 8
#define FK_NQV 2
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "fused_kernel.h"
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "half.h"
#include "sdpa_bf16.h"

#include <immintrin.h>

/* Q rows i0 .. i0+nr-1 of (b, h), as bfloat16 pairs along D in B-operand layout:
 * qp[((c * (nr/16) + g) * 16 + p) * 32 + 2 q + u] = Q[i0 + 16 g + q][32 c + 2 p + u];
 * rows past Tq and columns past D are zeros. */
static void b16_pack_q(const attn__bf16_job *job, const uint16_t *qb, int64_t i0, int64_t nr,
                       uint16_t *qp)
{
    const attn__sdpa_shapes *s0 = job->s0;
    const int64_t D = s0->D, groups = nr / 16, rows = fk_min(nr, s0->Tq - i0);
    for (int64_t c = 0; c < job->dp / 32; c++)
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *dst = qp + (c * groups + g) * 512;
            for (int64_t q = 0; q < 16; q++) {
                const int64_t r = 16 * g + q;
                const uint16_t *src = qb + (i0 + r) * s0->q_s[2];
                for (int64_t d2 = 0; d2 < 32; d2++) {
                    const int64_t d = 32 * c + d2;
                    dst[(d2 / 2) * 32 + 2 * q + (d2 & 1)] =
                        r < rows && d < D ? src[d * s0->q_s[3]] : 0;
                }
            }
        }
}

/* The weights P^T (ST [nkp][br], float32, key-major) rounded to bfloat16 as pairs
 * along the keys in B-operand layout:
 * pp[((kc * (nr/16) + g) * 16 + p) * 32 + 2 q + u] = P[16 g + q][32 kc + 2 p + u]. */
static void b16_pack_p(const float *ST, int64_t br, int64_t nkp, int64_t nr, uint16_t *pp)
{
    const int64_t groups = nr / 16;
#ifdef B16_NATIVE_CVT
    /* vcvtne2ps2bf16 puts the first key's 16 weights in words 0-15 and the second's
     * in 16-31; vpermw interleaves them into pairs. */
    uint16_t idx[32];
    for (int q = 0; q < 16; q++) {
        idx[2 * q] = (uint16_t)q;
        idx[2 * q + 1] = (uint16_t)(16 + q);
    }
    const __m512i vidx = _mm512_loadu_si512(idx);
#else
    const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x00400000), hi = _mm512_set1_epi32((int)0xffff0000u);
#endif
    for (int64_t kp = 0; kp < nkp / 2; kp++) {
        const float *r0 = ST + (2 * kp) * br, *r1 = r0 + br;
        uint16_t *dst = pp + ((kp / 16) * groups) * 512 + (kp % 16) * 32;
        for (int64_t g = 0; g < groups; g++) {
            const __m512 a = _mm512_loadu_ps(r0 + 16 * g), b = _mm512_loadu_ps(r1 + 16 * g);
#ifdef B16_NATIVE_CVT
            const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            _mm512_storeu_si512(dst + g * 512, _mm512_permutexvar_epi16(vidx, x));
#else
            /* As attn__f32_to_bf16: + 0x7fff + the lowest kept bit, then the top 16
             * bits; a NaN gets its quiet bit instead, so it stays a NaN. */
            __m512i ua = _mm512_castps_si512(a), ub = _mm512_castps_si512(b);
            const __mmask16 na = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
            const __mmask16 nb = _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
            ua = _mm512_mask_or_epi32(
                _mm512_add_epi32(ua, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(ua, 16), one))),
                na, ua, quiet);
            ub = _mm512_mask_or_epi32(
                _mm512_add_epi32(ub, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(ub, 16), one))),
                nb, ub, quiet);
            /* The pair (first key, second key) is one 32-bit lane: low word, high word. */
            _mm512_storeu_si512(dst + g * 512,
                                _mm512_or_si512(_mm512_and_si512(ub, hi), _mm512_srli_epi32(ua, 16)));
#endif
        }
    }
}

/* O^T += P V for a PARTIAL tile whose values hold an inf or a NaN: a plain loop over
 * the visible (i, j) only, so that a masked key's value never reaches a row (its
 * weight is 0, but 0 * inf is NaN), with the weights rounded to bfloat16 as the
 * products see them. Such tiles are rare, so speed does not matter. */
static void b16_accumulate_visible(const fk_tile *t, const uint16_t *vt, int64_t tkp,
                                   int64_t j0, int64_t nkp, float *OT)
{
    const attn__sdpa_shapes *s = t->s;
    for (int64_t r = 0; r < t->i1 - t->i0; r++)
        for (int64_t c = 0; c < nkp; c++) {
            if (!fk_key_visible(s, t->b, t->h, t->i0 + r, j0 + c))
                continue;
            const float p = attn__bf16_to_f32(attn__f32_to_bf16(t->ST[c * t->br + r]));
            for (int64_t e = 0; e < s->Dv; e++)
                OT[e * t->br + r] += p * attn__bf16_to_f32(vt[e * tkp + j0 + c]);
        }
}

/* One (b, h, query tile) in the steps of sdpa_bf16.h. */
static void b16_item(void *arg, int64_t item, int worker)
{
    const attn__bf16_job *job = (const attn__bf16_job *)arg;
    const attn__sdpa_shapes *s = job->f.s, *s0 = job->s0;
    attn__bf16_ws w;
    attn__bf16_ws_layout(job, &w);
    /* Items go head by head, the heaviest query tiles of a causal head first, as on
     * the float32 path (fk_tile_begin). */
    const int64_t n_qt = job->f.n_qt, bh = item / n_qt, qt_index = n_qt - 1 - item % n_qt;
    fk_tile t;
    memset(&t, 0, sizeof t);
    t.s = s;
    t.b = bh / s->H;
    t.h = bh % s->H;
    t.br = job->f.br;
    t.bc = job->f.bc;
    t.dvp = job->dvp;
    t.i0 = qt_index * t.br;
    t.i1 = fk_min(t.i0 + t.br, s->Tq);
    t.nr = fk_round_up(t.i1 - t.i0, 32);
    float *ws = job->f.ws + (int64_t)worker * job->f.ws_floats;
    t.ST = ws + w.st;
    t.O = ws + w.o;
    t.m = ws + w.m;
    t.l = ws + w.l;
    t.alpha = ws + w.alpha;
    t.inv = ws + w.inv;
    float *OT = ws + w.ot;
    uint16_t *qp = (uint16_t *)(ws + w.qp), *pp = (uint16_t *)(ws + w.pp);
    t.ob = job->f.out + t.b * s->o_s[0] + t.h * s->o_s[1];
    t.slope = attn__alibi_slope(s, t.h);
    t.sink = attn__sink(s, t.h);

    const int64_t br = t.br, nr = t.nr, dvp = job->dvp, tkp = job->tkp, dp = job->dp;
    for (int64_t r = 0; r < nr; r++) {
        t.m[r] = t.sink;
        t.l[r] = t.sink > -INFINITY ? 1.0f : 0.0f;
    }
    memset(OT, 0, (size_t)(dvp * br) * sizeof(float));
    b16_pack_q(job, job->q + t.b * s0->q_s[0] + t.h * s0->q_s[1], t.i0, nr, qp);
    const int64_t hk = t.b * s->Hkv + t.h / s->group;
    const uint16_t *kp = job->kp + hk * tkp * dp, *vt = job->vt + hk * dvp * tkp;
    const uint8_t *vbad = job->vbad + hk * (tkp / 32);
    const __m512 vscale = _mm512_set1_ps(s->scale);

    b16_begin(ws + w.cfg);
    int64_t j_begin, j_end, lo, hi;
    fk_row_range(s, t.i0, &j_begin, &hi);
    fk_row_range(s, t.i1 - 1, &lo, &j_end);
    for (int64_t j0 = j_begin / t.bc * t.bc; j0 < j_end; j0 += t.bc) {
        const int64_t j1 = fk_min(j0 + t.bc, s->Tk);
        const int64_t nkp = fk_round_up(j1 - j0, 32);
        const int kind = fk_tile_kind(s, t.b, t.h, t.i0, t.i1, j0, j1, nkp);
        if (kind == FK_SKIP)
            continue;
        b16_scores(kp + j0 * dp, dp, qp, t.ST, br, nkp, nr, dp);
        for (int64_t c = 0; c < nkp; c++)
            for (int64_t r0 = 0; r0 < nr; r0 += 16)
                _mm512_storeu_ps(t.ST + c * br + r0,
                                 _mm512_mul_ps(_mm512_loadu_ps(t.ST + c * br + r0), vscale));
        if (fk_has_score_mod(s))
            fk_score_mod(&t, j0, nkp);
        if (kind == FK_PARTIAL)
            fk_hide(&t, j0, nkp);
        fk_softmax_stats(&t, nkp);
        /* O^T's columns are query rows: each scaled by its row's correction. */
        for (int64_t r0 = 0; r0 < nr; r0 += 16) {
            const __m512 va = _mm512_loadu_ps(t.alpha + r0);
            if (_mm512_cmp_ps_mask(va, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) == 0)
                continue;
            for (int64_t e = 0; e < dvp; e++)
                _mm512_storeu_ps(OT + e * br + r0, _mm512_mul_ps(_mm512_loadu_ps(OT + e * br + r0), va));
        }
        int bad = 0;
        if (kind == FK_PARTIAL)
            for (int64_t blk = j0 / 32; blk < (j0 + nkp) / 32; blk++)
                bad |= vbad[blk];
        if (bad) {
            b16_accumulate_visible(&t, vt, tkp, j0, nkp, OT);
        } else {
            b16_pack_p(t.ST, br, nkp, nr, pp);
            b16_pv(vt + j0, tkp, pp, OT, br, nkp, nr, dvp);
        }
    }
    b16_end();
    for (int64_t r = 0; r < nr; r++)
        for (int64_t e = 0; e < dvp; e++)
            t.O[r * dvp + e] = OT[e * br + r];
    fk_finish(&job->f, &t, worker);
}

#endif /* ATTN_BF16_TILE_H */
