/* Uses the installed attn: the chapter's causal mask for T = 3 and one attention
 * call; prints the version it was compiled against, the version of the library it
 * runs on, and the causal weight row of query 1. It is C that also compiles as
 * C++ (tests/test_install.sh builds it both ways), so that attn.h's extern "C"
 * is checked by a link. */
#include <attn.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    float q[3 * 2] = {1, 0, 0, 1, 1, 1}, out[3 * 2], w[3 * 3];
    const int64_t s[4] = {1, 1, 3, 2}, ws[4] = {1, 1, 3, 3};
    attn_tensor tq, to, tw;
    attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, s);
    attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, out, 4, s);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 4, ws);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    int rc = attn_sdpa(NULL, &tq, &tq, &tq, &p, &to, &tw);
    printf("attn %s library %s status %s row1 %.3f %.3f %.3f\n", ATTN_VERSION_STRING,
           attn_version(), attn_status_name(rc), w[3], w[4], w[5]);
    return rc == ATTN_OK && w[5] == 0.0f && strcmp(attn_version(), ATTN_VERSION_STRING) == 0 ? 0 : 1;
}
