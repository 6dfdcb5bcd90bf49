/*
 * fuzz_cli.c - libFuzzer target for the attn program's command line: the option
 * parser (tools/common_cli.c) and the `attn forward` / `attn sdpa` subcommands
 * (tools/cmd_forward.c, tools/cmd_sdpa.c) called as the program calls them.
 *
 * Input layout:
 *   byte 0        the subcommand: even -> forward, odd -> sdpa
 *   bytes 1..     the arguments, separated by NUL bytes (at most 48)
 *
 * A subcommand returns its exit status and never exits, so it can be called once per
 * input. It runs in a private directory (ATTN_FUZZ_WORK from fuzz/run.sh) that holds
 * small valid files copied from tests/data (weights, inputs, token ids, masks, q/k/v)
 * and a few malformed ones, under short names (fuzz/cli_files.txt lists them, and
 * the dictionary fuzz/cli.dict holds the names). A
 * '/' in an argument becomes '_', so every path the fuzzer makes up stays inside
 * that directory. After each input, files the run replaced are restored and new
 * files are removed, so every input sees the same directory.
 *
 * For any input the exit status is 0, 1 or 2 (SPEC section 4).
 */
/* fuzz_util.h first: it asks for _GNU_SOURCE (memfd_create) before any header. */
#include "fuzz_util.h"

#include "attn.h"
#include "cmds.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#if !defined(ATTN_FUZZ_DATA_DIR) || !defined(ATTN_FUZZ_DIR)
#error "ATTN_FUZZ_DATA_DIR (the source tree's tests/data) and ATTN_FUZZ_DIR (fuzz/) must be defined"
#endif

#define MAX_ARGS 48

/* The files every input can name, read from fuzz/cli_files.txt at start-up. */
#define MAX_FILES 64
static char data_files[MAX_FILES][2][256]; /* { name in the work directory, source } */
static int n_files = 0;

static void read_file_list(void)
{
    char list[4096];
    snprintf(list, sizeof(list), "%s/cli_files.txt", ATTN_FUZZ_DIR);
    FILE *f = fopen(list, "r");
    if (!f) {
        perror(list);
        exit(2);
    }
    char line[600];
    while (fgets(line, sizeof(line), f) && n_files < MAX_FILES) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = '\0';
        tab[strcspn(tab + 1, "\r\n") + 1] = '\0';
        snprintf(data_files[n_files][0], sizeof(data_files[0][0]), "%s", line);
        snprintf(data_files[n_files][1], sizeof(data_files[0][1]), "%s", tab + 1);
        n_files++;
    }
    fclose(f);
    if (n_files == 0) {
        fprintf(stderr, "%s: no files listed\n", list);
        exit(2);
    }
}

typedef struct held_file {
    unsigned char *bytes;
    size_t size;
    ino_t ino;
} held_file;

static held_file held[MAX_FILES];

static void write_file(const char *name, const unsigned char *b, size_t n)
{
    FILE *f = fopen(name, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        perror(name);
        exit(2);
    }
}

static void put_data_file(int i)
{
    write_file(data_files[i][0], held[i].bytes, held[i].size);
    struct stat sb;
    if (stat(data_files[i][0], &sb) != 0) {
        perror(data_files[i][0]);
        exit(2);
    }
    held[i].ino = sb.st_ino;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    read_file_list();
    for (int i = 0; i < n_files; i++) {
        char src[4096];
        snprintf(src, sizeof(src), "%s/%s", ATTN_FUZZ_DATA_DIR, data_files[i][1]);
        FILE *f = fopen(src, "rb");
        if (!f) {
            perror(src);
            exit(2);
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        held[i].bytes = malloc((size_t)n);
        held[i].size = (size_t)n;
        if (!held[i].bytes || fread(held[i].bytes, 1, (size_t)n, f) != (size_t)n) {
            perror(src);
            exit(2);
        }
        fclose(f);
    }
    /* libFuzzer reads and writes the corpus and artifacts by the paths it was given;
     * fuzz/run.sh gives absolute ones, so changing directory here is safe. */
    if (chdir(fuzz_work_dir()) != 0) {
        perror("fuzz: chdir");
        exit(2);
    }
    for (int i = 0; i < n_files; i++)
        put_data_file(i);
    return 0;
}

/* Puts the directory back as Initialize left it. */
static void restore_dir(void)
{
    for (int i = 0; i < n_files; i++) {
        struct stat sb;
        if (stat(data_files[i][0], &sb) != 0 || sb.st_ino != held[i].ino ||
            (size_t)sb.st_size != held[i].size)
            put_data_file(i);
    }
    DIR *d = opendir(".");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int known = 0;
        for (int i = 0; i < n_files && !known; i++)
            known = strcmp(e->d_name, data_files[i][0]) == 0;
        if (!known && remove(e->d_name) != 0)
            rmdir(e->d_name);
    }
    closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    int sdpa = data[0] & 1;
    /* One copy of the argument bytes, NUL-terminated, '/' made harmless. */
    char *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    for (size_t i = 0; i + 1 < size; i++)
        if (buf[i] == '/')
            buf[i] = '_';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = sdpa ? "sdpa" : "forward";
    if (size > 1) {
        for (char *p = buf; p < buf + size - 1 && argc <= MAX_ARGS; p += strlen(p) + 1)
            argv[argc++] = p;
    }
    argv[argc] = NULL;
    int rc = sdpa ? cmd_sdpa(argc, argv) : cmd_forward(argc, argv);
    FUZZ_ASSERT(rc == 0 || rc == 1 || rc == 2);
    free(buf);
    restore_dir();
    return 0;
}
