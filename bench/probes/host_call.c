/*
 * host_call.c — host time per library call on the CUDA backend, no Python: the issue time of
 * back-to-back calls of the door's small forward and decode rows (loops of 10 and 50, started
 * with the GPU idle, median of 15 loops; a time that grows with the loop means the host waited
 * for the GPU), with the context's own workspace, a user workspace, and allocator callbacks
 * (the Python extension installs one). A lab probe for the PyTorch door's host overhead
 * (docs/perf/python_door.md).
 *
 *   cc -O2 bench/probes/host_call.c -Iinclude -Lbuild-gpu -lflashattn \
 *      -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -o /tmp/host_call
 */
#include <cuda_runtime.h>
#include <flashattn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void *cb_alloc(void *u, size_t n, void *s) {
    (void)u, (void)s;
    void *p = NULL;
    return cudaMalloc(&p, n) == cudaSuccess ? p : NULL; /* cudaMallocAsync would sync less */
}
static void cb_free(void *u, void *p, size_t n, void *s) { (void)u, (void)n, (void)s, cudaFree(p); }
static void *pool_p;
static void *pool_alloc(void *u, size_t n, void *s) { (void)u, (void)n, (void)s; return pool_p; }
static void pool_free(void *u, void *p, size_t n, void *s) { (void)u, (void)p, (void)n, (void)s; }

/* Median host µs per call of `run` over 15 loops of n calls, each started with the GPU idle. */
static double host_us(cudaStream_t st, int n, fa_status (*run)(fa_context *), fa_context *c) {
    double t[15];
    for (int r = -3; r < 15; r++) {
        cudaStreamSynchronize(st);
        double h0 = now();
        for (int i = 0; i < n; i++)
            if (run(c) != FA_OK) {
                fprintf(stderr, "host_call: %s\n", fa_last_error(c));
                exit(1);
            }
        double h1 = now();
        if (r >= 0) t[r] = (h1 - h0) / n * 1e6;
    }
    cudaStreamSynchronize(st);
    qsort(t, 15, sizeof t[0], cmp);
    return t[7];
}

static fa_tensor tq, tk, tv, to, dq, dout;
static fa_kvcache cache;
static fa_params pf, pd;
static fa_status run_fwd(fa_context *c) { return fa_fwd(c, &tq, &tk, &tv, &pf, &to, NULL); }
static fa_status run_decode(fa_context *c) {
    return fa_fwd_kvcache(c, &dq, &cache, NULL, NULL, &pd, 0, &dout, NULL);
}

static void *dev(size_t bytes) {
    void *p = NULL;
    cudaMalloc(&p, bytes);
    cudaMemset(p, 0, bytes);
    return p;
}

int main(void) {
    /* small forward: batch 1, 128 tokens, 16 heads, d 64, bf16, causal */
    const size_t fb = (size_t)128 * 16 * 64 * 2;
    tq = fa_tensor_bshd(dev(fb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 128, 16, 64);
    tk = fa_tensor_bshd(dev(fb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 128, 16, 64);
    tv = fa_tensor_bshd(dev(fb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 128, 16, 64);
    to = fa_tensor_bshd(dev(fb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 128, 16, 64);
    pf = fa_params_default();
    pf.causal = 1;
    /* decode: batch 1, 8192 cached tokens, 32 query heads over 8, d 128, bf16 */
    const size_t cb = (size_t)8192 * 8 * 128 * 2;
    dq = fa_tensor_bshd(dev(32 * 128 * 2), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 1, 32, 128);
    dout = fa_tensor_bshd(dev(32 * 128 * 2), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 1, 32, 128);
    cache.k = fa_tensor_bshd(dev(cb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 8192, 8, 128);
    cache.v = fa_tensor_bshd(dev(cb), FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, 8192, 8, 128);
    int32_t len = 8192, *seqlens = dev(4);
    cudaMemcpy(seqlens, &len, 4, cudaMemcpyHostToDevice);
    cache.seqlens = seqlens;
    pd = fa_params_default();
    pool_p = dev(1 << 22);
    cudaStream_t st;
    cudaStreamCreate(&st);
    const char *names[] = {"own workspace", "user workspace (fa_context_set_workspace)",
                           "allocator callback (cudaMalloc/cudaFree)", "allocator callback (a pool)"};
    const char *calls[] = {"small fwd", "decode"};
    fa_status (*runs[])(fa_context *) = {run_fwd, run_decode};
    for (int call = 0; call < 2; call++)
        for (int mode = 0; mode < 4; mode++) {
            fa_context *c;
            if (fa_context_create(&c, FA_BACKEND_CUDA) != FA_OK) return 1;
            fa_context_set_stream(c, st);
            if (mode == 1) fa_context_set_workspace(c, pool_p, 1 << 22);
            if (mode >= 2) {
                fa_allocator a = {sizeof a, mode == 2 ? cb_alloc : pool_alloc,
                                  mode == 2 ? cb_free : pool_free, NULL, 0};
                fa_context_set_allocator(c, &a);
            }
            const double t10 = host_us(st, 10, runs[call], c);
            const double t50 = host_us(st, 50, runs[call], c);
            printf("host_call: %-10s %-44s %7.2f us/call (10 calls) %7.2f (50)  %s\n",
                   calls[call], names[mode], t10, t50, fa_last_selection(c)->kernel);
            fa_context_destroy(c);
        }
    return 0;
}
