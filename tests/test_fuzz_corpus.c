/*
 * test_fuzz_corpus.c - replays the committed fuzz corpora of the file readers
 * (fuzz/corpus/npy, fuzz/corpus/safetensors, fuzz/corpus/weights) through the very
 * code of the libFuzzer targets, so every seed and every input that once crashed a
 * target (the regress_* files) runs on each build, with gcc, under the sanitizer CI
 * builds too, and without clang's fuzzer runtime.
 *
 * The targets' own checks apply (a status and a message for every failure, the
 * loaded arrays' invariants, round trips through the writers, a forward pass with
 * loaded weights, an allocation failure for half of the inputs); a broken one
 * aborts the program, which fails the test. The command-line corpus is replayed by
 * tests/test_fuzz_corpus.sh.
 */
/* The targets, renamed so that three fit in one program; fuzz_util.h first for its
 * _GNU_SOURCE. */
#include "../fuzz/fuzz_util.h"

#define LLVMFuzzerTestOneInput replay_npy
#define round_trip npy_round_trip
#include "../fuzz/fuzz_npy.c"
#undef LLVMFuzzerTestOneInput
#undef round_trip

#define LLVMFuzzerTestOneInput replay_safetensors
#define round_trip st_round_trip
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#undef round_trip

#define LLVMFuzzerTestOneInput replay_weights
#include "../fuzz/fuzz_weights.c"
#undef LLVMFuzzerTestOneInput

#include "check.h"

#include <dirent.h>
#include <sys/stat.h>

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif
#ifndef ATTN_TEST_TMP_DIR
#define ATTN_TEST_TMP_DIR "."
#endif

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every file of fuzz/corpus/NAME through fn, in name order; returns how many
 * ran, and counts the regress_* files in *regress. */
static int replay(const char *name, int (*fn)(const uint8_t *, size_t), int *regress)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/../../fuzz/corpus/%s", ATTN_TEST_DATA_DIR, name);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d)
        return 0;
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 4096)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], name_cmp);
    for (int i = 0; i < n; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (f) {
            static uint8_t buf[1 << 20];
            size_t len = fread(buf, 1, sizeof buf, f);
            fclose(f);
            /* A crash here names the input: the line before it. */
            fprintf(stderr, "   %s/%s (%zu bytes)\n", name, names[i], len);
            CHECK_INT(fn(buf, len), 0);
        }
        if (strncmp(names[i], "regress_", 8) == 0)
            (*regress)++;
        free(names[i]);
    }
    return n;
}

int main(void)
{
    /* The round trips write here (fuzz_work_dir reads the variable). */
    char work[4096];
    snprintf(work, sizeof work, "%s/fuzz_corpus_work", ATTN_TEST_TMP_DIR);
    mkdir(work, 0777);
    setenv("ATTN_FUZZ_WORK", work, 1);

    int regress = 0;
    TEST("every .npy corpus input loads or fails with a message, and what loads round-trips");
    int n_npy = replay("npy", replay_npy, &regress);
    TEST("every .safetensors corpus input opens or fails with a message; every tensor of "
         "what opens reads or fails, and what reads round-trips through the writer");
    int n_st = replay("safetensors", replay_safetensors, &regress);
    TEST("every weight-loader corpus input loads weights that fit and run, or fails with "
         "a message and cleared weights");
    int n_w = replay("weights", replay_weights, &regress);
    fprintf(stderr, "test_fuzz_corpus: %d npy, %d safetensors, %d weights inputs (%d "
                    "regression inputs)\n",
            n_npy, n_st, n_w, regress);
    CHECK(n_npy >= 10 && n_st >= 10 && n_w >= 10);
    char path[8192];
    snprintf(path, sizeof path, "%s/npy_round_trip.npy", work);
    remove(path);
    snprintf(path, sizeof path, "%s/st_round_trip.safetensors", work);
    remove(path);
    rmdir(work);
    return check_summary("test_fuzz_corpus");
}
