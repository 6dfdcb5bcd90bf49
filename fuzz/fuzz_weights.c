/*
 * fuzz_weights.c - libFuzzer target for the weight loader (attn_weights_load).
 *
 * Input layout:
 *   byte 0        num_heads: 0..250 as they are (0 must be refused), 251 -> -1,
 *                 252 -> INT64_MAX, 253 -> INT64_MIN, 254 -> 2^32, 255 -> 3
 *   byte 1        the prefix length L (0..255, cut to what is there)
 *   bytes 2..     L bytes of prefix (a NUL inside simply ends it), then the
 *                 .safetensors file
 *
 * For any input the loader returns a status, with a message on failure and w all
 * zero; on success the four weights fit each other and num_heads
 * (attn_mha_weights_check agrees), and a small forward pass with them (x [1, 3, E]
 * with a causal mask, for E up to 64) runs and fills the output. Half of the inputs
 * run with one allocation failing (see fuzz_ctx_init): the loader must then fail
 * cleanly, with w cleared and nothing leaked.
 */
/* fuzz_util.h first: it asks for _GNU_SOURCE (memfd_create) before any header. */
#include "fuzz_util.h"

#include "attn.h"

#include <string.h>

static int64_t heads_from_byte(uint8_t b)
{
    switch (b) {
    case 251: return -1;
    case 252: return INT64_MAX;
    case 253: return INT64_MIN;
    case 254: return (int64_t)1 << 32;
    case 255: return 3;
    default: return b;
    }
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static void small_forward(const attn_mha_weights *w, int64_t H, int64_t E)
{
    enum { T = 3 };
    float x[T * 64], y[T * 64], att[T * T * 64];
    for (int64_t i = 0; i < T * E; i++)
        x[i] = (float)((i * 37) % 11) * 0.25f - 1.0f;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 1;
    attn_tensor tx, ty, ta;
    const int64_t sx[3] = {1, T, E}, sa[4] = {1, H, T, T};
    FUZZ_ASSERT(attn_tensor_init(&ctx, &tx, ATTN_DTYPE_F32, x, 3, sx) == ATTN_OK);
    FUZZ_ASSERT(attn_tensor_init(&ctx, &ty, ATTN_DTYPE_F32, y, 3, sx) == ATTN_OK);
    FUZZ_ASSERT(attn_tensor_init(&ctx, &ta, ATTN_DTYPE_F32, att, 4, sa) == ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    int rc = attn_mha_forward(&ctx, w, H, &tx, &p, &ty, &ta);
    if (rc != ATTN_OK)
        fprintf(stderr, "forward failed: %s\n", ctx.message);
    FUZZ_ASSERT(rc == ATTN_OK);
    fuzz_sink(fuzz_touch(y, sizeof(float) * (size_t)(T * E)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int64_t H = heads_from_byte(data[0]);
    size_t plen = data[1];
    if (plen > size - 2)
        plen = size - 2;
    char prefix[256];
    memcpy(prefix, data + 2, plen);
    prefix[plen] = '\0';
    const uint8_t *file = data + 2 + plen;
    size_t fsize = size - 2 - plen;
    const char *path = fuzz_bytes_as_file(file, fsize);

    attn_ctx ctx;
    fuzz_alloc fa;
    fuzz_ctx_init(&ctx, &fa, data, size);
    attn_mha_weights w;
    memset(&w, 0xa5, sizeof(w)); /* the loader must clear what it does not fill */
    int rc = attn_weights_load(&ctx, path, prefix, H, &w);
    if (rc != ATTN_OK) {
        FUZZ_CHECK_FAILURE(ctx, rc);
        FUZZ_ASSERT(all_zero(&w, sizeof(w)));
        FUZZ_ASSERT(rc != ATTN_STATUS_NO_MEMORY || fa.failed);
        return 0;
    }
    int64_t E = -1;
    FUZZ_ASSERT(attn_mha_weights_check(&ctx, &w, H, &E) == ATTN_OK);
    FUZZ_ASSERT(E >= 1 && E % H == 0);
    FUZZ_ASSERT(w.w_qkv.shape[0] == 3 * E && w.w_qkv.shape[1] == E);
    FUZZ_ASSERT(w.b_qkv.shape[0] == 3 * E && w.w_o.shape[1] == E && w.b_o.shape[0] == E);
    fuzz_sink(fuzz_touch(w.w_qkv.data, sizeof(float) * (size_t)(3 * E * E)));
    fuzz_sink(fuzz_touch(w.b_qkv.data, sizeof(float) * (size_t)(3 * E)));
    fuzz_sink(fuzz_touch(w.w_o.data, sizeof(float) * (size_t)(E * E)));
    fuzz_sink(fuzz_touch(w.b_o.data, sizeof(float) * (size_t)E));
    if (E <= 64)
        small_forward(&w, H, E);
    attn_weights_free(&ctx, &w);
    FUZZ_ASSERT(all_zero(&w, sizeof(w)));
    return 0;
}
