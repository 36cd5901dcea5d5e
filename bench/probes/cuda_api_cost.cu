/*
 * cuda_api_cost.cu — host time per call of the CUDA runtime calls a library call may make
 * (median of 15 loops of 200): what a per-call check or query costs against the launch itself.
 * Lab probe for the host overhead of a small call (docs/perf/python_door.md).
 *
 *   nvcc -O2 -arch=sm_90a bench/probes/cuda_api_cost.cu -o /tmp/cuda_api_cost && /tmp/cuda_api_cost
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__global__ void empty_kernel(int *p) {
    if (p && threadIdx.x == 1000) *p = 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define TIME(name, ...)                                                                       \
    do {                                                                                      \
        double t[15];                                                                         \
        for (int r = -2; r < 15; r++) {                                                       \
            cudaStreamSynchronize(st);                                                        \
            double h0 = now();                                                                \
            for (int i = 0; i < 200; i++) { __VA_ARGS__; }                                         \
            double h1 = now();                                                                \
            if (r >= 0) t[r] = (h1 - h0) / 200 * 1e6;                                         \
        }                                                                                     \
        cudaStreamSynchronize(st);                                                            \
        qsort(t, 15, sizeof t[0], cmp);                                                       \
        printf("cuda_api_cost: %-48s %6.3f us\n", name, t[7]);                                \
    } while (0)

int main(void) {
    cudaStream_t st;
    cudaStreamCreate(&st);
    int *d;
    cudaMalloc(&d, 1 << 20);
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
    volatile int sink = 0;
    TIME("cudaGetDevice", int x; cudaGetDevice(&x); sink += x);
    TIME("cudaPointerGetAttributes (device pointer)",
         cudaPointerAttributes a; cudaPointerGetAttributes(&a, d + i); sink += a.type);
    TIME("cudaStreamIsCapturing", cudaStreamCaptureStatus c; cudaStreamIsCapturing(st, &c);
         sink += c);
    TIME("cudaFuncGetAttributes", cudaFuncAttributes fa;
         cudaFuncGetAttributes(&fa, empty_kernel); sink += fa.binaryVersion);
    TIME("cudaFuncSetAttribute (max dynamic smem)",
         cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    TIME("getenv (absent name)", sink += getenv("FLASHATTN_NOT_SET_ANYWHERE") != NULL);
    TIME("cudaGetLastError", sink += cudaGetLastError());
    TIME("empty_kernel<<<16, 384, 0>>>", empty_kernel<<<16, 384, 0, st>>>(d));
    TIME("empty_kernel<<<16, 384, 100000 smem>>>", empty_kernel<<<16, 384, 100000, st>>>(d));
    TIME("cudaMemsetAsync 4 bytes", cudaMemsetAsync(d, 0, 4, st));
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    TIME("cudaEventRecord", cudaEventRecord(ev, st));
    printf("sink %d\n", (int)sink);
    return 0;
}
