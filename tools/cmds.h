/*
 * cmds.h - the subcommands of the `attn` program. Each lives in its own
 * tools/cmd_<name>.c and is listed in the table in tools/attn.c. The tools' own
 * names carry no `attn_` prefix: that one belongs to the library.
 *
 * A subcommand gets argv starting at its own name (argv[0] is "forward", ...), and
 * returns the process exit status: 0 on success, 2 on a usage error, 1 on any other
 * error, having printed one line naming the problem on stderr.
 */
#ifndef TOOLS_CMDS_H
#define TOOLS_CMDS_H

typedef struct cmd_entry {
    const char *name;
    const char *summary; /* one line for `attn --help` */
    int (*run)(int argc, char **argv);
} cmd_entry;

int cmd_forward(int argc, char **argv); /* tools/cmd_forward.c */
int cmd_decode(int argc, char **argv);  /* tools/cmd_decode.c */
int cmd_sdpa(int argc, char **argv);    /* tools/cmd_sdpa.c */
int cmd_bench(int argc, char **argv);   /* tools/cmd_bench.c and tools/bench_*.c */

#endif /* TOOLS_CMDS_H */
