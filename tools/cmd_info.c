/*
 * cmd_info.c — `flashattn info`: what this build of the library is and can do here, as text
 * or (--json) as one JSON object with the same facts.
 *
 * The thread count is taken from a tiny real forward call rather than recomputed, so it shows
 * what the library actually uses (FLASHATTN_NUM_THREADS included); that call also proves the
 * library works on this machine.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#ifdef FLASHATTN_TOOL_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: flashattn info [--json]\n"
               "\n"
               "Prints the library version, the backends compiled in, the CPU features the\n"
               "library detected, the worker-thread count, the CUDA devices (in a CUDA build)\n"
               "and the kernels of this build.\n"
               "\n"
               "  --json      the same facts as one JSON object on stdout\n"
               "  -h, --help  this text\n");
}

/* One CUDA device as the runtime sees it. */
typedef struct cuda_dev {
    char name[256];
    int cc_major, cc_minor, sms;
    double mem_bytes;
} cuda_dev;

/* The CUDA devices (at most max) into devs; returns their count, or -1 with the reason in
   err (no CUDA in this build, no driver, no device). */
static int cuda_devices(cuda_dev *devs, int max, char *err, size_t len) {
#ifdef FLASHATTN_TOOL_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, len, "no usable CUDA device: %s", cudaGetErrorString(e));
        return -1;
    }
    int got = 0;
    for (int i = 0; i < n && got < max; i++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        snprintf(devs[got].name, sizeof devs[got].name, "%s", prop.name);
        devs[got].cc_major = prop.major;
        devs[got].cc_minor = prop.minor;
        devs[got].sms = prop.multiProcessorCount;
        devs[got].mem_bytes = (double)prop.totalGlobalMem;
        got++;
    }
    return got;
#else
    (void)devs;
    (void)max;
    snprintf(err, len, "this build of the tool cannot list CUDA devices");
    return -1;
#endif
}

/* Runs a 1x256x1x16 forward and returns the selection's thread count (0 on failure): 4.2
   MFLOP, above the work below which a CPU call runs on the calling thread alone (2^20 FLOPs,
   src/cpu/team.h), so that the count is the one real work gets. */
static int probe_threads(char *kernel, size_t len) {
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    if (st != FA_OK) {
        tool_fail(NULL, st, "info");
        return 0;
    }
    enum { N = 256, D = 16 };
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

/* Everything info reports. */
typedef struct info {
    char kernel[64];
    int threads;
    const char *env_threads;
    cuda_dev devs[16];
    int ndev;
    char cuda_err[256];
} info;

static void print_text(const info *in) {
    printf("flashattn %s (tool built against header %d.%d.%d)\n", fa_version(), FA_VERSION_MAJOR,
           FA_VERSION_MINOR, FA_VERSION_PATCH);
    printf("backends:     cpu%s\n", fa_has_cuda() ? ", cuda" : " (cuda not compiled in)");
    printf("cpu features: %s\n", fa_cpu_features());
    printf("threads:      %d (used by a probe forward on %s; %d CPUs online%s%s)\n", in->threads,
           *in->kernel ? in->kernel : "?", tool_online_cpus(),
           in->env_threads ? ", FLASHATTN_NUM_THREADS=" : "",
           in->env_threads ? in->env_threads : "");
    /* a build without CUDA has no device line: "backends" already says so */
    if (fa_has_cuda()) {
        if (in->ndev < 0) printf("cuda devices: none (%s)\n", in->cuda_err);
        else printf("cuda devices: %d\n", in->ndev);
        for (int i = 0; i < in->ndev; i++)
            printf("  %d: %s (sm %d.%d, %d SMs, %.1f GiB)\n", i, in->devs[i].name,
                   in->devs[i].cc_major, in->devs[i].cc_minor, in->devs[i].sms,
                   in->devs[i].mem_bytes / (1024.0 * 1024 * 1024));
    }
    int n = fa_kernel_count();
    printf("kernels:      %d\n", n);
    for (int i = 0; i < n; i++) {
        const char *name = fa_kernel_name(i);
        printf("  %s\n", name ? name : "(null)");
    }
}

/* The same facts as one object; numbers where the text has numbers, lists where it has lists,
   null for what is unknown. */
static int print_json(const info *in) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", fa_version());
    char hdr[32];
    snprintf(hdr, sizeof hdr, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    cJSON_AddStringToObject(o, "header_version", hdr);
    cJSON *backends = cJSON_AddArrayToObject(o, "backends");
    cJSON_AddItemToArray(backends, cJSON_CreateString("cpu"));
    if (fa_has_cuda()) cJSON_AddItemToArray(backends, cJSON_CreateString("cuda"));
    cJSON *feats = cJSON_AddArrayToObject(o, "cpu_features");
    char fbuf[512];
    snprintf(fbuf, sizeof fbuf, "%s", fa_cpu_features());
    for (char *save = NULL, *t = strtok_r(fbuf, " ", &save); t; t = strtok_r(NULL, " ", &save))
        cJSON_AddItemToArray(feats, cJSON_CreateString(t));
    cJSON *th = cJSON_AddObjectToObject(o, "threads");
    cJSON_AddNumberToObject(th, "count", in->threads);
    if (*in->kernel) cJSON_AddStringToObject(th, "probe_kernel", in->kernel);
    else cJSON_AddNullToObject(th, "probe_kernel");
    cJSON_AddNumberToObject(th, "cpus_online", tool_online_cpus());
    if (in->env_threads) cJSON_AddStringToObject(th, "FLASHATTN_NUM_THREADS", in->env_threads);
    else cJSON_AddNullToObject(th, "FLASHATTN_NUM_THREADS");
    cJSON *cuda = cJSON_AddObjectToObject(o, "cuda");
    cJSON_AddBoolToObject(cuda, "compiled_in", fa_has_cuda());
    cJSON *devs = cJSON_AddArrayToObject(cuda, "devices");
    for (int i = 0; i < in->ndev; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddStringToObject(d, "name", in->devs[i].name);
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", in->devs[i].cc_major, in->devs[i].cc_minor);
        cJSON_AddStringToObject(d, "compute_capability", cc);
        cJSON_AddNumberToObject(d, "sms", in->devs[i].sms);
        cJSON_AddNumberToObject(d, "memory_bytes", in->devs[i].mem_bytes);
        cJSON_AddItemToArray(devs, d);
    }
    if (in->ndev < 0) cJSON_AddStringToObject(cuda, "error", in->cuda_err);
    else cJSON_AddNullToObject(cuda, "error");
    cJSON *kernels = cJSON_AddArrayToObject(o, "kernels");
    for (int i = 0; i < fa_kernel_count(); i++) {
        const char *name = fa_kernel_name(i);
        cJSON_AddItemToArray(kernels, name ? cJSON_CreateString(name) : cJSON_CreateNull());
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) {
        fprintf(stderr, "flashattn info: out of memory writing JSON\n");
        return -1;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return 0;
}

int cmd_info(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
            continue;
        }
        fprintf(stderr, "flashattn info: unexpected argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    info in;
    memset(&in, 0, sizeof in);
    in.threads = probe_threads(in.kernel, sizeof in.kernel);
    in.env_threads = getenv("FLASHATTN_NUM_THREADS");
    in.ndev = -1;
    if (fa_has_cuda())
        in.ndev = cuda_devices(in.devs, 16, in.cuda_err, sizeof in.cuda_err);
    else
        snprintf(in.cuda_err, sizeof in.cuda_err, "cuda not compiled in");
    if (json) {
        if (print_json(&in) != 0) return 1;
    } else {
        print_text(&in);
    }
    return in.threads > 0 ? 0 : 1;
}
