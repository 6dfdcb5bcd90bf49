/*
 * test_output_fork.c - attn_output_remove_temporaries() in a child of fork().
 * attn.h: it "unlinks every temporary file that an output set of this process has
 * open now". A child of fork() inherits the table of live temporaries (a copy of
 * the parent's memory) but none of the sets are its own: if its SIGTERM handler
 * calls the function, as a worker process of a server would, it must not unlink the
 * temporaries of the parent's sets, whose commit would then fail with the output
 * lost.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    TEST("a child of fork() calling attn_output_remove_temporaries leaves the parent's "
         "temporary files alone: the parent's commit still succeeds");
    char out[600];
    snprintf(out, sizeof out, "%s/output_fork.npy", ATTN_TEST_TMP_DIR);
    unlink(out);
    float data[6] = {1, 2, 3, 4, 5, 6};
    const int64_t shape[2] = {2, 3};
    attn_tensor t;
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, 2, shape);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_output_set *set = NULL;
    CHECK_INT(attn_output_set_create(&ctx, &set), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, set, out, &t), ATTN_OK); /* its temporary exists */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        attn_output_remove_temporaries(); /* as a SIGTERM handler of the child would */
        _exit(0);
    }
    CHECK(pid > 0);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    const int rc = attn_output_set_commit(&ctx, set);
    if (rc != ATTN_OK)
        fprintf(stderr, "   commit: %s: %s\n", attn_status_name(rc), ctx.message);
    CHECK_INT(rc, ATTN_OK);
    attn_output_set_free(&ctx, set);
    attn_array a;
    CHECK_INT(attn_npy_load(&ctx, out, &a), ATTN_OK);
    if (ctx.status == ATTN_OK) {
        CHECK(memcmp(a.tensor.data, data, sizeof data) == 0);
        attn_array_free(&ctx, &a);
    }

    TEST("the parent's own call still removes its temporaries (and the commit then "
         "fails, naming the output)");
    CHECK_INT(attn_output_set_create(&ctx, &set), ATTN_OK);
    CHECK_INT(attn_output_set_add_npy(&ctx, set, out, &t), ATTN_OK);
    attn_output_remove_temporaries();
    CHECK(attn_output_set_commit(&ctx, set) != ATTN_OK);
    CHECK_STR_CONTAINS(ctx.message, "output_fork.npy");
    attn_output_set_free(&ctx, set);
    unlink(out);
    return check_summary("test_output_fork");
}
