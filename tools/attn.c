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
    {"decode", "attn forward --causal token by token through a KV cache (--prefill N)",
     cmd_decode},
    {"sdpa", "scaled dot-product attention on .npy arrays", cmd_sdpa},
    {"bench", "time attention (SPEC shapes S1-S8 or custom) against the machine's peak",
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
          "ENVIRONMENT\n"
          "    ATTN_ARCH            force a kernel path: ref, scalar, avx2, avx512,\n"
          "                         avx512bf16 or amx (the last two: avx512 with a\n"
          "                         bfloat16 kernel of their own)\n"
          "    ATTN_BF16_EMULATE    1: let avx512bf16 run on an AVX-512 CPU without\n"
          "                         AVX512-BF16, vdpbf16ps emulated (for testing)\n"
          "    ATTN_TILE            BRxBC: force the fused kernel's tile sizes\n"
          "    ATTN_MICROTILE       8x2 or 4x4: force the avx512 build's micro-tile\n"
          "                         shapes (the same bits; chosen per CPU otherwise)\n"
          "    ATTN_FAIL_ALLOC_AT   N: make the Nth allocation fail (for testing the\n"
          "                         out-of-memory paths; tests/test_cli_oom.sh uses it)\n",
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
