/*
 * host_read.c — the read bandwidth of host memory: what a CPU decode step, which reads its
 * K/V cache once and writes almost nothing, can at best do. A copy (the decode sweep's other
 * reference) also writes, and memcpy runs on one thread; this reads a buffer larger than the
 * caches on every thread the decode calls use, summing its words so that no load is dropped.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"

static uint64_t read_once(const uint64_t *w, size_t n, int threads) {
    uint64_t sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
    for (size_t i = 0; i < n; i++) sum += w[i];
    return sum;
}

double bench_host_read_bps(const void *buf, size_t bytes, int threads, int reps,
                           double *median_s) {
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_num_procs();
#else
    threads = 1;
#endif
    const size_t n = bytes / sizeof(uint64_t);
    double t[16];
    if (reps > 16) reps = 16;
    if (reps < 1) reps = 1;
    volatile uint64_t sink = read_once(buf, n, threads); /* warm-up: pages touched, team up */
    for (int r = 0; r < reps; r++) {
        const double t0 = tool_now();
        sink += read_once(buf, n, threads);
        t[r] = tool_now() - t0;
    }
    (void)sink;
    *median_s = tool_median(t, reps);
    return *median_s > 0 ? (double)(n * sizeof(uint64_t)) / *median_s : 0;
}
