/*
 * attn_cmds.h - the subcommands of the `attn` program. Each lives in its own
 * tools/attn_<name>.c and is listed in the table in tools/attn.c.
 *
 * A subcommand gets argv starting at its own name (argv[0] is "forward", ...), and
 * returns the process exit status: 0 on success, 2 on a usage error, 1 on any other
 * error, having printed one line naming the problem on stderr.
 */
#ifndef ATTN_CMDS_H
#define ATTN_CMDS_H

typedef struct attn_cmd {
    const char *name;
    const char *summary; /* one line for `attn --help` */
    int (*run)(int argc, char **argv);
} attn_cmd;

/* tools/attn_forward.c and tools/attn_sdpa.c */
int attn_cmd_forward(int argc, char **argv);
int attn_cmd_sdpa(int argc, char **argv);
int attn_cmd_bench(int argc, char **argv); /* tools/attn_bench.c */

#endif
