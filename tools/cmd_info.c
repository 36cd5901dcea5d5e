/*
 * cmd_info.c — `flashattn info`: what this build of the library is and can do here.
 *
 * The thread count is taken from a tiny real forward call rather than recomputed, so it shows
 * what the library actually uses (FLASHATTN_NUM_THREADS included); that call also proves the
 * library works on this machine.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: flashattn info\n"
               "\n"
               "Prints the library version, the backends compiled in, the CPU features the\n"
               "library detected, the worker-thread count and the kernels of this build.\n");
}

/* Runs a 1x16x1x16 forward and returns the selection's thread count (0 on failure). */
static int probe_threads(char *kernel, size_t len) {
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    if (st != FA_OK) {
        tool_fail(NULL, st, "info");
        return 0;
    }
    enum { N = 16, D = 16 };
    float *buf = tool_alloc(4 * N * D * sizeof(float));
    float lse[N];
    int threads = 0;
    if (buf) {
        tool_rng r = tool_rng_seed(1);
        tool_fill_random(buf, FA_DTYPE_F32, 3 * N * D, &r);
        fa_tensor q = fa_tensor_bshd(buf, FA_DTYPE_F32, FA_DEVICE_CPU, 1, N, 1, D);
        fa_tensor k = fa_tensor_bshd(buf + N * D, FA_DTYPE_F32, FA_DEVICE_CPU, 1, N, 1, D);
        fa_tensor v = fa_tensor_bshd(buf + 2 * N * D, FA_DTYPE_F32, FA_DEVICE_CPU, 1, N, 1, D);
        fa_tensor o = fa_tensor_bshd(buf + 3 * N * D, FA_DTYPE_F32, FA_DEVICE_CPU, 1, N, 1, D);
        fa_tensor l = fa_tensor_3d(lse, FA_DTYPE_F32, FA_DEVICE_CPU, 1, 1, N);
        st = fa_fwd(ctx, &q, &k, &v, NULL, &o, &l);
        if (st != FA_OK) {
            tool_fail(ctx, st, "info: probe forward");
        } else if (fa_last_selection(ctx)) {
            threads = fa_last_selection(ctx)->threads;
            snprintf(kernel, len, "%s", fa_last_selection(ctx)->kernel);
        }
        free(buf);
    }
    fa_context_destroy(ctx);
    return threads;
}

int cmd_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "flashattn info: unexpected argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    printf("flashattn %s (tool built against header %d.%d.%d)\n", fa_version(), FA_VERSION_MAJOR,
           FA_VERSION_MINOR, FA_VERSION_PATCH);
    printf("backends:     cpu%s\n", fa_has_cuda() ? ", cuda" : " (cuda not compiled in)");
    printf("cpu features: %s\n", fa_cpu_features());

    char kernel[64] = "";
    int threads = probe_threads(kernel, sizeof kernel);
    const char *env = getenv("FLASHATTN_NUM_THREADS");
    printf("threads:      %d (used by a probe forward on %s; %d CPUs online%s%s)\n", threads,
           *kernel ? kernel : "?", tool_online_cpus(), env ? ", FLASHATTN_NUM_THREADS=" : "",
           env ? env : "");

    int n = fa_kernel_count();
    printf("kernels:      %d\n", n);
    for (int i = 0; i < n; i++) {
        const char *name = fa_kernel_name(i);
        printf("  %s\n", name ? name : "(null)");
    }
    return threads > 0 ? 0 : 1;
}
