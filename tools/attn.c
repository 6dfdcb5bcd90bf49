/*
 * attn.c - the `attn` program: one binary, several subcommands.
 *
 *   attn forward ...   multi-head self-attention with weights from a file
 *   attn decode ...    the same, token by token through a KV cache
 *   attn sdpa ...      scaled dot-product attention on .npy arrays
 *   attn bench ...     the benchmark
 *
 * This file only dispatches; each subcommand is tools/cmd_<name>.c, and every
 * one parses its options with the one parser of tools/common_cli.c.
 */
#include "attn.h"
#include "cmds.h"
#include "common_cli.h"

#include <stdio.h>
#include <string.h>

/* Subcommands register here: { "name", "one-line summary", function }. */
static const cmd_entry commands[] = {
    {"forward", "multi-head self-attention with weights from a .safetensors file",
     cmd_forward},
    {"decode", "attn forward --causal token by token through a KV cache",
     cmd_decode},
    {"sdpa", "scaled dot-product attention on .npy arrays", cmd_sdpa},
    {"bench", "time attention (shapes S1-S9 or custom) against the FMA peak",
     cmd_bench},
    {NULL, NULL, NULL}, /* placeholder so the table is never empty */
};

static void usage(FILE *f)
{
    fputs("NAME\n"
          "    attn - self-attention from scratch: scaled dot-product attention and\n"
          "    multi-head self-attention (chapter 11 of the tutorial) on .npy and\n"
          "    .safetensors files\n"
          "\n"
          "SYNOPSIS\n"
          "    attn COMMAND [OPTIONS]\n"
          "    attn --help | --version\n"
          "    attn help COMMAND         (the same as attn COMMAND --help)\n"
          "\n"
          "COMMANDS\n",
          f);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].name)
            fprintf(f, "    %-9s %s\n", commands[i].name, commands[i].summary);
    fputs("\n"
          "    Run 'attn COMMAND --help' for a command's options.\n"
          "\n"
          CLI_HELP_NUMBERS
          "\n"
          CLI_HELP_EXIT
          "\n"
          CLI_HELP_ENVIRONMENT
          CLI_HELP_BENCH_CLOCK
          "\n"
          "EXAMPLES\n"
          "    attn sdpa --query q.npy --key k.npy --value v.npy --causal --output o.npy\n"
          "    attn forward --weights mha.safetensors --num-heads 4 --input x.npy \\\n"
          "        --causal --output y.npy\n"
          "\n"
          "SEE ALSO\n"
          "    attn forward --help, attn decode --help, attn sdpa --help,\n"
          "    attn bench --help; docs/files-and-cli.md (the files and the command\n"
          "    line), docs/decoding.md, docs/gradients.md, docs/half-precision.md,\n"
          "    docs/performance.md.\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        /* A usage error is one line on stderr, like every other; the manual is
         * for --help. */
        fprintf(stderr, "attn: missing COMMAND: forward, decode, sdpa or bench (run 'attn --help')\n");
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") && argc > 2) {
        /* "attn help sdpa", as git and go do: the command's own manual. */
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (commands[i].name && !strcmp(argv[2], commands[i].name)) {
                static char help_flag[] = "--help";
                char *args[3] = {argv[2], help_flag, NULL};
                return commands[i].run(2, args);
            }
        fprintf(stderr, "attn: no command '%s' to give help on (run 'attn --help' for the "
                        "list)\n", argv[2]);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("attn %s\n", ATTN_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].name && !strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "attn: unknown command '%s' (run 'attn --help' for the list)\n", cmd);
    return CLI_EXIT_USAGE;
}
