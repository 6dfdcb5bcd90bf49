/*
 * main.c - the exercise grader: grades each exercise and prints one verdict line
 * per exercise, with the case, the diagnosis and a hint under a wrong one.
 *
 *   grade [EXERCISE...]     EXERCISE: 1, 2, 3, 4, 5 (= 5a and 5b), 5a, 5b, 6
 *
 * A verdict line starts with PASS, TODO or WRONG, then the exercise's number; a
 * WRONG line names the mistake in brackets, e.g. "[masked-zero]" (the ids are
 * listed in docs/exercises.md). The exit status is 0 when every graded exercise
 * passes, 1 otherwise, 2 for a usage error.
 *
 * The same main is built against several sets of exercise files (CMake passes
 * GRADE_SET, the folder graded, and for the grader's self-test GRADE_SWAP_STEM /
 * GRADE_SWAP_FILE, one file replaced by a deliberately broken one), so that the
 * verdict names the file that was graded.
 */
#include <stdio.h>
#include <string.h>

#include "grader.h"

#ifndef GRADE_SET
#define GRADE_SET "exercises"
#endif
#ifndef GRADE_SWAP_STEM
#define GRADE_SWAP_STEM ""
#define GRADE_SWAP_FILE ""
#endif

typedef struct exercise {
    const char *number;
    const char *name;
    const char *stem;
    void (*grade)(grade_result *r);
} exercise;

static const exercise EXERCISES[] = {
    {"1", "padding mask", "01_padding_mask", grade_padding_mask},
    {"2", "causal mask", "02_causal_mask", grade_causal_mask},
    {"3", "masked softmax", "03_masked_softmax", grade_masked_softmax},
    {"4", "attention", "04_sdpa", grade_sdpa},
    {"5a", "split heads", "05_heads", grade_split_heads},
    {"5b", "merge heads", "05_heads", grade_merge_heads},
    {"6", "online softmax", "06_online_softmax", grade_online_softmax},
};
enum { NEXERCISES = sizeof EXERCISES / sizeof EXERCISES[0] };

/* "5" selects 5a and 5b; "5a" only 5a. */
static int selected(const exercise *e, int argc, char **argv)
{
    if (argc < 2)
        return 1;
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (strcmp(argv[i], e->number) == 0 ||
            (strncmp(argv[i], e->number, n) == 0 && e->number[n] >= 'a' && e->number[n] <= 'z'))
            return 1;
    }
    return 0;
}

/* Prints text after `lead`, wrapped at 90 columns under an indent of 6. */
static void print_wrapped(const char *lead, const char *text)
{
    const int width = 90, indent = 6;
    int col = printf("%*s%s", indent, "", lead);
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, " ");
        if (col > indent && col + 1 + (int)len > width) {
            printf("\n%*s", indent + (int)strlen(lead), "");
            col = indent + (int)strlen(lead);
        } else if (col > indent + (int)strlen(lead)) {
            putchar(' ');
            col++;
        }
        printf("%.*s", (int)len, p);
        col += (int)len;
        p += len;
    }
    putchar('\n');
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (int e = 0; e < NEXERCISES; e++) {
            char *one[2] = {argv[0], argv[i]};
            known |= selected(&EXERCISES[e], 2, one);
        }
        if (!known) {
            fprintf(stderr, "grade: unknown exercise '%s' (use 1, 2, 3, 4, 5, 5a, 5b or 6)\n",
                    argv[i]);
            return 2;
        }
    }

    printf("Grading %s/*.c against libattn's reference (attn_mask_padding, "
           "attn_mask_causal, attn_sdpa_ref, attn_tensor_transpose)%s%s\n\n",
           GRADE_SET, GRADE_SWAP_FILE[0] ? ", with " : "", GRADE_SWAP_FILE);
    int graded = 0, passed = 0, todo = 0;
    for (int e = 0; e < NEXERCISES; e++) {
        const exercise *ex = &EXERCISES[e];
        if (!selected(ex, argc, argv))
            continue;
        char file[256];
        if (strcmp(ex->stem, GRADE_SWAP_STEM) == 0)
            snprintf(file, sizeof file, "%s", GRADE_SWAP_FILE);
        else
            snprintf(file, sizeof file, "%s/%s.c", GRADE_SET, ex->stem);
        grade_result r;
        ex->grade(&r);
        graded++;
        if (r.verdict == GRADE_PASS) {
            passed++;
            printf("PASS  %-3s %-15s %d of %d cases (%s)\n", ex->number, ex->name,
                   r.cases_passed, r.cases_total, file);
        } else if (r.verdict == GRADE_TODO) {
            printf("TODO  %-3s %-15s not implemented yet (%s)\n", ex->number, ex->name, file);
            todo++;
        } else {
            printf("WRONG %-3s %-15s [%s] %s\n", ex->number, ex->name, r.id, r.title);
            print_wrapped("", r.detail);
            print_wrapped("hint: ", r.hint);
            printf("%*s(%s; %d of %d cases passed before this one)\n", 6, "", file,
                   r.cases_passed, r.cases_total);
        }
    }
    if (todo)
        printf("\nTODO: open the file named, read what the comment at its top asks for, and "
               "write\nthe function's body where the TODO line is.\n");
    printf("\n%d of %d passed.%s\n", passed, graded,
           passed == graded ? "" : " Read the first verdict that is not PASS, fix, and run again.");
    return passed == graded ? 0 : 1;
}
