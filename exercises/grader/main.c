/*
 * main.c - the exercise grader: grades each exercise and prints one verdict line
 * per exercise, with the case, the diagnosis and a hint under a wrong one.
 *
 *   grade [EXERCISE...]     EXERCISE: 1, 2, 3, 4, 5 (= 5a and 5b), 5a, 5b, 6, 7 (= 7a
 *                           and 7b), 7a, 7b
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
 *
 * Each exercise is graded in a child process (fork), so that a learner's function
 * that crashes - a null mask read without a check, an index far outside its array -
 * gets a WRONG verdict naming the signal, and the other exercises are still graded.
 * A child that has not finished after GRADE_TIME_LIMIT seconds (default 10; every
 * exercise takes milliseconds) is stopped by an alarm: a loop that never ends.
 */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid, pipe, strsignal, alarm */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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
    {"7a", "softmax bwd", "07_sdpa_backward", grade_softmax_backward},
    {"7b", "head backward", "07_sdpa_backward", grade_sdpa_backward},
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

/* Reads exactly n bytes, or returns 0 at end of file or on an error. */
static int read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        p += got;
        n -= (size_t)got;
    }
    return 1;
}

/* Grades one exercise in a child process and hands its result back through a
 * pipe. A child that dies before sending the whole result (killed by a signal, or
 * stopped by a sanitizer's report) becomes a WRONG verdict that says how it died.
 * Where fork is not available the exercise is graded in this process. */
static unsigned time_limit(void)
{
    const char *s = getenv("GRADE_TIME_LIMIT");
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    return (s && *s && !*end && v > 0 && v <= 3600) ? (unsigned)v : 10u;
}

/* The case the child was running (grade_running writes it there): a page shared
 * with the child, so that a crash or a timeout can say which case it was on; NULL
 * where it could not be mapped. */
static char *running_case;
enum { RUNNING_SIZE = 512 };

static void grade_isolated(const exercise *ex, grade_result *r)
{
    const unsigned limit = time_limit();
    int fd[2];
    if (pipe(fd) != 0) {
        ex->grade(r);
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        ex->grade(r);
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        alarm(limit);
        grade_result mine;
        ex->grade(&mine);
        const char *p = (const char *)&mine;
        size_t left = sizeof mine;
        while (left > 0) {
            ssize_t put = write(fd[1], p, left);
            if (put < 0 && errno == EINTR)
                continue;
            if (put <= 0)
                _exit(3);
            p += put;
            left -= (size_t)put;
        }
        _exit(0);
    }
    close(fd[1]);
    int complete = read_all(fd[0], r, sizeof *r);
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (complete && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;

    grade_begin(r, 0);
    r->verdict = GRADE_WRONG;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        snprintf(r->id, sizeof r->id, "too-slow");
        snprintf(r->title, sizeof r->title, "your function had not returned after %u seconds: "
                 "a loop that never ends?", limit);
        snprintf(r->detail, sizeof r->detail,
                 "every exercise takes the grader milliseconds, so the program was stopped; "
                 "the grader went on with the other exercises");
        if (running_case && running_case[0])
            grade_appendf(r->detail, sizeof r->detail, ". It was on %s", running_case);
        snprintf(r->hint, sizeof r->hint,
                 "Check that each loop's counter moves towards its bound: for (int64_t j = 0; "
                 "j < T; j++). A missing j++, or i++ where the inner loop meant j++, never "
                 "ends (GRADE_TIME_LIMIT=N sets the limit in seconds).");
        return;
    }
    snprintf(r->id, sizeof r->id, "crashed");
    if (WIFSIGNALED(status))
        snprintf(r->title, sizeof r->title, "the program was killed by signal %d (%s) inside your "
                 "function", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(r->title, sizeof r->title, "the program stopped inside your function (exit "
                 "status %d; a sanitizer's report above says where)",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    snprintf(r->detail, sizeof r->detail,
             "your function did not return, so no case could be compared; the grader "
             "went on with the other exercises");
    if (running_case && running_case[0])
        grade_appendf(r->detail, sizeof r->detail, ". It crashed on %s", running_case);
    snprintf(r->hint, sizeof r->hint,
             "A crash is almost always a pointer read or written outside its array. Check "
             "every index against the shape written beside its pointer (row * row_length + "
             "column, loops that stop at < T, not <= T), and a pointer that may be NULL: "
             "exercises 3 and 4 are also called with mask = NULL (no mask), so read mask[...] "
             "only after checking it. To see the line: gdb -batch -ex 'set follow-fork-mode "
             "child' -ex run -ex bt --args build/exercises/grade_exercises %s", ex->number);
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
            fprintf(stderr, "grade: unknown exercise '%s' (use 1, 2, 3, 4, 5, 5a, 5b, 6, 7, 7a or 7b)\n",
                    argv[i]);
            return 2;
        }
    }

    void *page = mmap(NULL, RUNNING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
    running_case = page == MAP_FAILED ? NULL : page;
    printf("Grading %s/*.c against libattn's reference (attn_mask_padding, "
           "attn_mask_causal, attn_sdpa_ref, attn_sdpa_backward_ref, "
           "attn_tensor_transpose)%s%s\n\n",
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
        grade_running_to(running_case, RUNNING_SIZE);
        grade_isolated(ex, &r);
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
            if (r.cases_total > 0)
                printf("%*s(%s; %d of %d cases passed before this one)\n", 6, "", file,
                       r.cases_passed, r.cases_total);
            else
                printf("%*s(%s)\n", 6, "", file);
        }
    }
    if (todo)
        printf("\nTODO: open the file named, read what the comment at its top asks for, and "
               "write\nthe function's body where the TODO line is.\n");
    printf("\n%d of %d passed.%s\n", passed, graded,
           passed == graded ? "" : " Read the first verdict that is not PASS, fix, and run again.");
    return passed == graded ? 0 : 1;
}
