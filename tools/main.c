/*
 * main.c — the `flashattn` command: picks the subcommand; each lives in its own file.
 */
#include <stdio.h>
#include <string.h>

#include "common.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} commands[] = {
    {"info", cmd_info, "version, backends, CPU features, threads, kernels (--json too)"},
    {"demo", cmd_demo, "materialised (BLAS) vs flash attention: time, peak memory as seqlen grows"},
    {"check", cmd_check, "correctness sweep against the float64 reference (--json too)"},
    {"bench", cmd_bench, "timed forward/backward sweeps, GFLOP/s, optional JSON"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: flashattn <command> [options]   (flashattn <command> --help for more)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].what);
    fprintf(f, "\nEnvironment: FLASHATTN_LOG=1 prints every kernel choice, FLASHATTN_STRICT=1 "
               "turns fallbacks into errors,\nFLASHATTN_NUM_THREADS sets the CPU thread count.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("flashattn %s\n", fa_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0) {
            /* getopt names the program by argv[0] in its messages: "flashattn demo: ..." */
            static char name[32];
            snprintf(name, sizeof name, "flashattn %s", commands[i].name);
            argv[1] = name;
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "flashattn: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
