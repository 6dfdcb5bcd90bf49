/*
 * half_golden.h - the 16-bit golden cases' reader, shared by tests/test_half.c
 * (tests/data/golden_half, from tests/golden/gen_half.py) and tests/test_kv_half.c
 * (tests/data/golden_kv_half, from tests/golden/gen_kv_half.py): each case is a
 * folder of .npy arrays and a case.txt of key=value lines, which the generator
 * writes and these fields name. A key a case does not write stays empty (or 0).
 */
#ifndef ATTN_HALF_GOLDEN_H
#define ATTN_HALF_GOLDEN_H

#include "attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct half_case {
    char dir[512], dtype[8], window[32], softcap[32], bias[32], mask[32], sinks[32];
    int causal, alibi;
    double torch_err; /* PyTorch's own error against the float64 oracle */
} half_case;

/* Reads dir/case.txt into c; 0 when it cannot be opened. */
static int read_case(const char *dir, half_case *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char p[600], line[256];
    snprintf(p, sizeof p, "%s/case.txt", dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = 0;
        const char *key = line, *val = eq + 1;
#define HALF_STR(name)                                                                     \
    if (strcmp(key, #name) == 0)                                                           \
        snprintf(c->name, sizeof c->name, "%s", val);
        HALF_STR(dtype)
        HALF_STR(window)
        HALF_STR(softcap)
        HALF_STR(bias)
        HALF_STR(mask)
        HALF_STR(sinks)
#undef HALF_STR
        if (strcmp(key, "causal") == 0)
            c->causal = atoi(val);
        if (strcmp(key, "alibi") == 0)
            c->alibi = atoi(val);
        if (strcmp(key, "torch_err") == 0)
            c->torch_err = atof(val);
    }
    fclose(f);
    return 1;
}

/* Loads the case's array `name` (a file in its folder); prints the library's
 * message when that fails. */
static int load(attn_ctx *ctx, const half_case *c, const char *name, attn_array *a)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", c->dir, name);
    int rc = attn_npy_load(ctx, p, a);
    if (rc)
        fprintf(stderr, "  %s\n", ctx->message);
    return rc;
}

/* Calls run(name) for every case that folder's MANIFEST names (blank lines and
 * lines starting with '#' skipped); returns how many, or -1 when the MANIFEST cannot
 * be opened. */
static int for_each_case(const char *folder, void (*run)(const char *name))
{
    char p[600], line[256];
    snprintf(p, sizeof p, "%s/MANIFEST", folder);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#')
            continue;
        run(line);
        cases++;
    }
    fclose(f);
    return cases;
}

#endif /* ATTN_HALF_GOLDEN_H */
