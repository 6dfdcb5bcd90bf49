/*
 * test_port_bias_view.c - a bias given as an expanded view gets the gradient of each
 * of its elements (found by tools/port_check.py).
 *
 * A porter builds the additive bias the way numpy and PyTorch make it cheap: a
 * [1, H, Tq, 1] array expanded to [B, H, Tq, Tk] without a copy (np.broadcast_to,
 * torch's expand), so the tensor has the full shape with stride 0 on the expanded
 * axes. attn_sdpa reads it as it reads a contiguous copy. attn_sdpa_backward's dbias
 * has the bias's own shape, [B, H, Tq, Tk] here, and the header promises every
 * element written: each must be that element's gradient, as for the contiguous
 * copy. Before the fix, the contract took the bias's stride-0 axes for broadcast
 * axes and summed over them into element 0, leaving the rest of dbias unwritten.
 *
 * Checked on the reference and every instruction set the machine has, with 1 and 2
 * threads: dbias of the view equals dbias of the contiguous copy bit for bit (the
 * same kernel on the same values), and the summed gradient of the genuinely
 * broadcast [1, H, Tq, 1] bias equals the view's summed over B and Tk within float32
 * rounding (2e-6 + 1e-5 of the sum of absolute terms).
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { B = 2, H = 4, HKV = 2, TQ = 3, TK = 17, D = 16 };

/* dbias for q, k, v, dout and the given bias, under (impl, arch, threads). */
static int grad_bias(attn_impl impl, attn_arch arch, int threads, const attn_tensor *q,
                     const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                     const attn_tensor *bias, attn_tensor *dbias, char *label, size_t cap)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    snprintf(label, cap, "%s %dt",
             impl == ATTN_IMPL_REF ? "ref" : attn_arch_name(attn_arch_selected(&ctx)), threads);
    static float out_d[B * H * TQ * D], lse_d[B * H * TQ];
    static float dq_d[B * H * TQ * D], dk_d[B * HKV * TK * D], dv_d[B * HKV * TK * D];
    attn_tensor out = tu_tensor4(out_d, B, H, TQ, D);
    attn_tensor lse = tu_tensor3(lse_d, B, H, TQ);
    attn_tensor dq = tu_tensor4(dq_d, B, H, TQ, D);
    attn_tensor dk = tu_tensor4(dk_d, B, HKV, TK, D), dv = tu_tensor4(dv_d, B, HKV, TK, D);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    p.softcap = 20.0f;
    p.bias = bias;
    p.lse = &lse;
    int rc = attn_sdpa(&ctx, q, k, v, &p, &out, NULL);
    if (rc == ATTN_OK) {
        p.lse = NULL;
        attn_sdpa_grads g = {&dq, &dk, &dv, dbias, NULL};
        rc = attn_sdpa_backward(&ctx, q, k, v, &p, &out, &lse, dout, &g);
    }
    if (rc)
        fprintf(stderr, "  %s: %s\n", label, ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

int main(void)
{
    static float qd[B * H * TQ * D], kd[B * HKV * TK * D], vd[B * HKV * TK * D];
    static float dod[B * H * TQ * D], small[H * TQ], full[B * H * TQ * TK];
    static float dview[B * H * TQ * TK], dcopy[B * H * TQ * TK], dsmall[H * TQ];
    tu_fill(qd, B * H * TQ * D, 1);
    tu_fill(kd, B * HKV * TK * D, 2);
    tu_fill(vd, B * HKV * TK * D, 3);
    tu_fill(dod, B * H * TQ * D, 4);
    tu_fill(small, H * TQ, 5);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < TQ; i++)
                for (int j = 0; j < TK; j++)
                    full[((b * H + h) * TQ + i) * TK + j] = small[h * TQ + i];
    attn_tensor q = tu_tensor4(qd, B, H, TQ, D), k = tu_tensor4(kd, B, HKV, TK, D);
    attn_tensor v = tu_tensor4(vd, B, HKV, TK, D), dout = tu_tensor4(dod, B, H, TQ, D);
    /* The view: small's [1, H, Tq, 1] data seen as [B, H, Tq, Tk], stride 0 on B and Tk. */
    attn_tensor view = tu_tensor4(small, B, H, TQ, TK);
    view.stride[0] = 0;
    view.stride[1] = TQ;
    view.stride[2] = 1;
    view.stride[3] = 0;
    attn_tensor copy = tu_tensor4(full, B, H, TQ, TK);
    attn_tensor bsmall = tu_tensor4(small, 1, H, TQ, 1);
    attn_tensor gview = tu_tensor4(dview, B, H, TQ, TK), gcopy = tu_tensor4(dcopy, B, H, TQ, TK);
    attn_tensor gsmall = tu_tensor4(dsmall, 1, H, TQ, 1);

    TEST("a bias given as an expanded view (stride 0 on axes of size > 1) gets each "
         "element's own gradient in dbias, the same bits as its contiguous copy, on every "
         "path with 1 and 2 threads; the broadcast [1, H, Tq, 1] bias gets their sum");
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int path = 0; path < 4; path++) {
        const attn_impl impl = path == 0 ? ATTN_IMPL_REF : ATTN_IMPL_AUTO;
        const attn_arch arch = path == 0 ? ATTN_ARCH_AUTO : archs[path - 1];
        if (path > 0 && !attn_arch_supported(arch))
            continue;
        for (int t = 1; t <= 2; t++) {
            char label[64];
            /* NaN everywhere first, so an element left unwritten shows. */
            for (int n = 0; n < B * H * TQ * TK; n++)
                dview[n] = dcopy[n] = NAN;
            CHECK_INT(grad_bias(impl, arch, t, &q, &k, &v, &dout, &view, &gview, label,
                                sizeof label),
                      0);
            CHECK_INT(grad_bias(impl, arch, t, &q, &k, &v, &dout, &copy, &gcopy, label,
                                sizeof label),
                      0);
            CHECK_INT(grad_bias(impl, arch, t, &q, &k, &v, &dout, &bsmall, &gsmall, label,
                                sizeof label),
                      0);
            int differ = -1;
            for (int n = 0; n < B * H * TQ * TK && differ < 0; n++)
                if (memcmp(&dview[n], &dcopy[n], sizeof(float)) != 0)
                    differ = n;
            if (differ >= 0)
                fprintf(stderr, "  %s: dbias[%d] of the view is %.9g, of the copy %.9g\n",
                        label, differ, dview[differ], dcopy[differ]);
            CHECK(differ < 0);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < TQ; i++) {
                    double sum = 0.0, abs_sum = 0.0;
                    for (int b = 0; b < B; b++)
                        for (int j = 0; j < TK; j++) {
                            const float g = dcopy[((b * H + h) * TQ + i) * TK + j];
                            sum += g;
                            abs_sum += fabs(g);
                        }
                    CHECK_NEAR(dsmall[h * TQ + i], sum, 2e-6 + 1e-5 * abs_sum, 0.0);
                }
        }
    }
    return check_summary("test_port_bias_view");
}
