/*
 * isa_gate — runs a test program at the CPU instruction-set level FLASHATTN_CPU_ISA names
 * (set by CTest), or exits 77 (skipped) when this CPU or build lacks that level, so that a
 * forced level fails only when its kernels are wrong. Usage: isa_gate PROGRAM [ARGS...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/isa.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: FLASHATTN_CPU_ISA=LEVEL isa_gate PROGRAM [ARGS...]\n");
        return 2;
    }
    const char *want = getenv("FLASHATTN_CPU_ISA");
    if (want && *want) {
        const char *why;
        if (!fa_cpu_isa_active(&why)) {
            printf("skipped: %s\n", why);
            return 77;
        }
    }
    execv(argv[1], argv + 1);
    perror(argv[1]);
    return 1;
}
