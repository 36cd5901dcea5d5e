/*
 * bench_device.c — where benchmark tensors live and how calls are timed. The CPU backend reads
 * host memory, filled in place, and is timed by the wall clock; the CUDA backend (when the tool
 * is built with FLASHATTN_TOOL_CUDA) gets device memory filled through a host staging buffer and
 * is timed by CUDA events. Everything else in `bench` is the same for both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef FLASHATTN_TOOL_CUDA
#include <cuda_runtime_api.h>
#endif

int bench_buf_alloc(bench_buf *b, fa_device dev, size_t bytes) {
    b->ptr = NULL;
    b->bytes = bytes;
    b->device = dev;
    if (dev == FA_DEVICE_CPU) {
        b->ptr = tool_alloc(bytes);
        if (!b->ptr) {
            fprintf(stderr, "flashattn bench: cannot allocate %zu bytes of host memory\n", bytes);
            return -1;
        }
        return 0;
    }
#ifdef FLASHATTN_TOOL_CUDA
    cudaError_t e = cudaMalloc(&b->ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        fprintf(stderr, "flashattn bench: cudaMalloc(%zu): %s\n", bytes, cudaGetErrorString(e));
        b->ptr = NULL;
        return -1;
    }
    return 0;
#else
    fprintf(stderr, "flashattn bench: this tool was built without CUDA support\n");
    return -1;
#endif
}

/* Normal values into host memory. Chunks of fixed size each get their own stream derived from
   one seed, so the result does not depend on the thread count; gigabytes of inputs would
   otherwise take one core many seconds. */
static void fill_host(void *data, fa_dtype dt, size_t n, uint64_t seed) {
    const size_t chunk = (size_t)1 << 20;
    size_t es = fa_dtype_size(dt);
    long long nchunks = (long long)((n + chunk - 1) / chunk);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (long long c = 0; c < nchunks; c++) {
        tool_rng r = tool_rng_seed(seed + 0x9e3779b97f4a7c15ull * (uint64_t)(c + 1));
        size_t lo = (size_t)c * chunk, len = n - lo < chunk ? n - lo : chunk;
        tool_fill_normal((char *)data + lo * es, dt, len, &r);
    }
}

int bench_buf_fill(bench_buf *b, fa_dtype dt, size_t n, tool_rng *r) {
    uint64_t seed = tool_rng_u64(r);
    if (b->device == FA_DEVICE_CPU) {
        fill_host(b->ptr, dt, n, seed);
        return 0;
    }
#ifdef FLASHATTN_TOOL_CUDA
    size_t bytes = n * fa_dtype_size(dt);
    void *host = tool_alloc(bytes);
    if (!host) {
        fprintf(stderr, "flashattn bench: cannot allocate %zu bytes of host memory\n", bytes);
        return -1;
    }
    fill_host(host, dt, n, seed);
    cudaError_t e = cudaMemcpy(b->ptr, host, bytes, cudaMemcpyHostToDevice);
    free(host);
    if (e != cudaSuccess) {
        fprintf(stderr, "flashattn bench: cudaMemcpy: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
#else
    (void)dt;
    (void)n;
    return -1;
#endif
}

int bench_buf_upload(bench_buf *b, size_t off, const void *host, size_t bytes) {
    if (off > b->bytes || bytes > b->bytes - off) {
        fprintf(stderr, "flashattn bench: upload of %zu bytes at %zu past a buffer of %zu\n",
                bytes, off, b->bytes);
        return -1;
    }
    if (b->device == FA_DEVICE_CPU) {
        memcpy((char *)b->ptr + off, host, bytes);
        return 0;
    }
#ifdef FLASHATTN_TOOL_CUDA
    cudaError_t e = cudaMemcpy((char *)b->ptr + off, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        fprintf(stderr, "flashattn bench: cudaMemcpy: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

int bench_buf_copy(bench_buf *dst, size_t dst_off, const bench_buf *src, size_t src_off,
                   size_t bytes) {
    if (dst_off > dst->bytes || bytes > dst->bytes - dst_off || src_off > src->bytes ||
        bytes > src->bytes - src_off || dst->device != src->device) {
        fprintf(stderr, "flashattn bench: bad copy of %zu bytes\n", bytes);
        return -1;
    }
    char *d = (char *)dst->ptr + dst_off;
    const char *s = (const char *)src->ptr + src_off;
    if (dst->device == FA_DEVICE_CPU) {
        memmove(d, s, bytes);
        return 0;
    }
#ifdef FLASHATTN_TOOL_CUDA
    /* the legacy default stream: where the timer's events and the library's work go */
    cudaError_t e = cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, 0);
    if (e != cudaSuccess) {
        fprintf(stderr, "flashattn bench: cudaMemcpyAsync: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

int bench_buf_fill_large(bench_buf *b, fa_dtype dt, size_t n, tool_rng *r) {
    const size_t seed_n = (size_t)1 << 25, es = fa_dtype_size(dt);
    if (n <= seed_n) return bench_buf_fill(b, dt, n, r);
    if (bench_buf_fill(b, dt, seed_n, r) != 0) return -1;
    /* windows of half the drawn block, each from its own offset, so that no two pieces of
       the cache line up element for element */
    const size_t win = seed_n / 2;
    uint64_t h = tool_rng_u64(r);
    for (size_t pos = seed_n; pos < n; pos += win) {
        size_t len = n - pos < win ? n - pos : win;
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        size_t from = (size_t)(h >> 33) % (seed_n - len + 1);
        if (bench_buf_copy(b, pos * es, b, from * es, len * es) != 0) return -1;
    }
    return bench_device_sync(b->device);
}

void bench_buf_free(bench_buf *b) {
    if (!b->ptr) return;
    if (b->device == FA_DEVICE_CPU) free(b->ptr);
#ifdef FLASHATTN_TOOL_CUDA
    else
        cudaFree(b->ptr);
#endif
    b->ptr = NULL;
}

int bench_device_sync(fa_device dev) {
    if (dev == FA_DEVICE_CPU) return 0; /* CPU calls return when their work is done */
#ifdef FLASHATTN_TOOL_CUDA
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "flashattn bench: cudaDeviceSynchronize: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

int bench_gpu_info(bench_gpu *g, char *err, size_t len) {
    memset(g, 0, sizeof *g);
#ifdef FLASHATTN_TOOL_CUDA
    struct cudaDeviceProp prop;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        snprintf(err, len, "no usable CUDA device: %s", cudaGetErrorString(e));
        return -1;
    }
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    g->cc_major = prop.major;
    g->cc_minor = prop.minor;
    g->sms = prop.multiProcessorCount;
    g->l2_bytes = (size_t)prop.l2CacheSize;
    g->mem_bytes = prop.totalGlobalMem;
    cudaDriverGetVersion(&g->driver_version);
    cudaRuntimeGetVersion(&g->runtime_version);
    return 0;
#else
    snprintf(err, len, "this flashattn command was built without CUDA support "
                       "(configure with -DFLASHATTN_WITH_CUDA=ON)");
    return -1;
#endif
}

struct bench_timer {
    fa_device dev;
    int max_calls;
    double *host_t0, *host_dt; /* CPU */
#ifdef FLASHATTN_TOOL_CUDA
    cudaEvent_t *ev;            /* CUDA: start and stop of call i at 2i, 2i + 1 */
#endif
};

void bench_timer_destroy(bench_timer *t) {
    if (!t) return;
#ifdef FLASHATTN_TOOL_CUDA
    if (t->ev)
        for (int i = 0; i < 2 * t->max_calls; i++)
            if (t->ev[i]) cudaEventDestroy(t->ev[i]);
    free(t->ev);
#endif
    free(t->host_t0);
    free(t->host_dt);
    free(t);
}

bench_timer *bench_timer_create(fa_device dev, int max_calls) {
    bench_timer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->dev = dev;
    t->max_calls = max_calls;
    if (dev == FA_DEVICE_CPU) {
        t->host_t0 = calloc((size_t)max_calls, sizeof(double));
        t->host_dt = calloc((size_t)max_calls, sizeof(double));
        if (!t->host_t0 || !t->host_dt) {
            bench_timer_destroy(t);
            return NULL;
        }
        return t;
    }
#ifdef FLASHATTN_TOOL_CUDA
    t->ev = calloc(2 * (size_t)max_calls, sizeof *t->ev);
    if (!t->ev) {
        bench_timer_destroy(t);
        return NULL;
    }
    for (int i = 0; i < 2 * max_calls; i++) {
        cudaError_t e = cudaEventCreate(&t->ev[i]);
        if (e != cudaSuccess) {
            fprintf(stderr, "flashattn bench: cudaEventCreate: %s\n", cudaGetErrorString(e));
            t->ev[i] = NULL;
            bench_timer_destroy(t);
            return NULL;
        }
    }
    return t;
#else
    bench_timer_destroy(t);
    return NULL;
#endif
}

/* Events go on the legacy default stream, which is where the library queues its work when
   no stream is set on the context (the benchmark never sets one). */
void bench_timer_start(bench_timer *t, int i) {
    if (t->dev == FA_DEVICE_CPU) {
        t->host_t0[i] = tool_now();
        return;
    }
#ifdef FLASHATTN_TOOL_CUDA
    cudaEventRecord(t->ev[2 * i], 0);
#endif
}

void bench_timer_stop(bench_timer *t, int i) {
    if (t->dev == FA_DEVICE_CPU) {
        t->host_dt[i] = tool_now() - t->host_t0[i];
        return;
    }
#ifdef FLASHATTN_TOOL_CUDA
    cudaEventRecord(t->ev[2 * i + 1], 0);
#endif
}

int bench_timer_read(bench_timer *t, int n, double *seconds, double *span, char *err,
                     size_t len) {
    *span = 0;
    if (t->dev == FA_DEVICE_CPU) {
        memcpy(seconds, t->host_dt, (size_t)n * sizeof *seconds);
        if (n > 0) *span = (t->host_t0[n - 1] + t->host_dt[n - 1] - t->host_t0[0]) / n;
        return 0;
    }
#ifdef FLASHATTN_TOOL_CUDA
    cudaError_t e = n > 0 ? cudaEventSynchronize(t->ev[2 * n - 1]) : cudaSuccess;
    if (e == cudaSuccess) e = cudaGetLastError();
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        float ms = 0;
        e = cudaEventElapsedTime(&ms, t->ev[2 * i], t->ev[2 * i + 1]);
        seconds[i] = 1e-3 * (double)ms;
    }
    if (e == cudaSuccess && n > 0) {
        float ms = 0;
        e = cudaEventElapsedTime(&ms, t->ev[0], t->ev[2 * n - 1]);
        *span = 1e-3 * (double)ms / n;
    }
    if (e != cudaSuccess) {
        snprintf(err, len, "CUDA error while timing: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
#else
    snprintf(err, len, "no CUDA support in this tool");
    return -1;
#endif
}
