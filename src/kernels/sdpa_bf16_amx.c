/*
 * sdpa_bf16_amx.c - the bfloat16 tile path (sdpa_bf16.h) with its products on
 * AMX-BF16 tiles: the "amx" arch (Sapphire Rapids and later Xeons). CMake compiles
 * this file alone with -mamx-tile -mamx-bf16 -mavx512bf16; src/runtime/dispatch.c
 * runs it only where cpuid lists AMX-TILE, AMX-BF16 and AVX512-BF16, the OS saves
 * the tile state (XCR0 bits 17 and 18) and Linux granted this process the tile data
 * (arch_prctl(ARCH_REQ_XCOMP_PERM)).
 *
 * One tile multiply (tdpbf16ps) takes C [16][16] float32 += A [16][32 bfloat16] times
 * B [16][16 pairs], where B's row p holds, for each of C's 16 columns n, the pair of
 * elements 2p and 2p+1 of the reduction axis (Intel SDM, TDPBF16PS): exactly Qp's and
 * Pp's layout (bf16_tile.h), and A is 16 rows of Kp or Vt read in place. The eight
 * tile registers are used 2 x 2: C0-C3 the accumulators of 32 rows x 32 columns, A4
 * and A5 two row blocks, B6 and B7 two column blocks, every tile 16 rows of 64 bytes.
 * Every A and B tile is 1 KiB in a row, but Kp's, whose rows are 2 * dp bytes apart
 * (Vt is blocked by 32 keys for that: rows 2 * Tk bytes apart would fall in two of
 * L1's 64 sets).
 * Each item loads the configuration once and releases the tiles at its end, so a
 * worker holds the tile state only while it computes.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define B16_NATIVE_CVT 1
/* The sum of the weights as rounded by vdpbf16ps (AVX512-BF16 comes with AMX-BF16
 * on every such CPU; the same bits as the integer steps, fewer instructions). */
#define B16_DP(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
/* The products leave the softmax to the vector units, which bound this path: the
 * stale max and the degree-3 2^x (bf16_tile.h, b16_softmax). Overridable with -D
 * for timing one against the other. */
#ifndef B16_STALE_MAX
#define B16_STALE_MAX 1
#endif
#ifndef B16_PLAIN_COARSE
#define B16_PLAIN_COARSE 1
#endif
/* The score product of the next key tile is issued before this tile's softmax
 * (bf16_tile.h), so that the tiles work while the vector units compute weights. */
#define B16_OVERLAP 1

/* The tile configuration (palette 1): 16 rows of 64 bytes in tmm0-tmm7. */
static void b16_begin(float *cfg_floats)
{
    unsigned char *cfg = (unsigned char *)cfg_floats;
    memset(cfg, 0, 64);
    cfg[0] = 1; /* palette */
    for (int t = 0; t < 8; t++) {
        const uint16_t colsb = 64;
        memcpy(cfg + 16 + 2 * t, &colsb, sizeof colsb);
        cfg[48 + t] = 16;
    }
    _tile_loadconfig(cfg);
}

static void b16_end(void) { _tile_release(); }

/* ST[c][r] = sum_d Kp[c][d] Q[r][d]: C(x, y) = rows of keys c0 + 16x, columns of
 * query rows 16(g + y), summed over the dp / 32 blocks of D. The tiles leave no
 * registers to gather the max in, so cmax stays unfilled (returns 0); every key is
 * computed (seen unused). */
static int b16_scores(const uint16_t *kp, int64_t ldk, const uint16_t *qp, float *ST,
                      int64_t ldst, int64_t nkp, int64_t nr, int64_t dp, float *cmax,
                      const int64_t *seen)
{
    (void)cmax;
    (void)seen;
    const int64_t groups = nr / 16;
    for (int64_t c0 = 0; c0 < nkp; c0 += 32)
        for (int64_t g = 0; g < groups; g += 2) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t kb = 0; kb < dp / 32; kb++) {
                const uint16_t *a = kp + c0 * ldk + 32 * kb;
                const uint16_t *b = qp + (kb * groups + g) * 512;
                _tile_loadd(4, a, ldk * 2);
                _tile_loadd(5, a + 16 * ldk, ldk * 2);
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float *st = ST + c0 * ldst + 16 * g;
            _tile_stored(0, st, ldst * 4);
            _tile_stored(1, st + 16, ldst * 4);
            _tile_stored(2, st + 16 * ldst, ldst * 4);
            _tile_stored(3, st + 16 * ldst + 16, ldst * 4);
        }
    return 0;
}

/* OT[e][r] += sum_c Vt[e][c] P[r][c]: C(x, y) = rows of value columns e0 + 16x,
 * columns of query rows 16(g + y), loaded from OT, summed over the nkp / 32 blocks
 * of keys, stored back (every key: seen unused). The tiles load OT as it is, so the
 * key tile's correction alpha is bf16_tile.h's pass (b16_rescale) before this one:
 * B16_PV_SCALES is left 0. */
static void b16_pv(const uint16_t *vt, const uint16_t *pp, float *OT, int64_t ldo,
                   int64_t nkp, int64_t nr, int64_t dvp, const float *alpha, const int64_t *seen)
{
    (void)alpha;
    (void)seen;
    const int64_t groups = nr / 16;
    for (int64_t e0 = 0; e0 < dvp; e0 += 32)
        for (int64_t g = 0; g < groups; g += 2) {
            float *o = OT + e0 * ldo + 16 * g;
            _tile_loadd(0, o, ldo * 4);
            _tile_loadd(1, o + 16, ldo * 4);
            _tile_loadd(2, o + 16 * ldo, ldo * 4);
            _tile_loadd(3, o + 16 * ldo + 16, ldo * 4);
            for (int64_t kb = 0; kb < nkp / 32; kb++) {
                const uint16_t *a = vt + (kb * dvp + e0) * 32;
                const uint16_t *b = pp + (kb * groups + g) * 512;
                _tile_loadd(4, a, 64);
                _tile_loadd(5, a + 16 * 32, 64);
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, o, ldo * 4);
            _tile_stored(1, o + 16, ldo * 4);
            _tile_stored(2, o + 16 * ldo, ldo * 4);
            _tile_stored(3, o + 16 * ldo + 16, ldo * 4);
        }
}

#include "bf16_tile.h"

const attn__bf16_kernel attn__bf16_kernel_amx = {
    ATTN_ARCH_AMX, "AMX-BF16 tiles", b16_item, b16_vblock,
};
