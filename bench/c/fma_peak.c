/*
 * fma_peak.c — the fp32 FMA throughput this machine really delivers, the yardstick CPU
 * GFLOP/s are reported against (a nominal clock times lanes says little on shared machines).
 *
 * Each thread runs chains of independent vector FMAs, enough of them to hide the FMA latency
 * on both pipes; the widest ISA the CPU has is chosen at run time, so the tool itself needs
 * no -march flag.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#include "bench.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1

/* a = a*m + c with m < 1 converges to c/(1-m) = 1: no overflow, no denormals. Twelve named
   chains (an array would be kept in memory and measure the load/store ports instead). */
#define CHAINS(FMA)                                                                            \
    do {                                                                                       \
        a0 = FMA(a0, m, c); a1 = FMA(a1, m, c); a2 = FMA(a2, m, c); a3 = FMA(a3, m, c);        \
        a4 = FMA(a4, m, c); a5 = FMA(a5, m, c); a6 = FMA(a6, m, c); a7 = FMA(a7, m, c);        \
        a8 = FMA(a8, m, c); a9 = FMA(a9, m, c); a10 = FMA(a10, m, c); a11 = FMA(a11, m, c);    \
    } while (0)

__attribute__((target("avx512f"))) static float chains_avx512(long iters) {
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
           a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
           a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
           a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long i = 0; i < iters; i++) CHAINS(_mm512_fmadd_ps);
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float chains_avx2(long iters) {
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2),
           a3 = _mm256_set1_ps(3), a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5),
           a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7), a8 = _mm256_set1_ps(8),
           a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (long i = 0; i < iters; i++) CHAINS(_mm256_fmadd_ps);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}
#endif

typedef struct job {
    float (*fn)(long);
    long iters;
    volatile float sink;
} job;

static void *thread_main(void *arg) {
    job *j = arg;
    j->sink = j->fn(j->iters);
    return NULL;
}

/* Wall time of `threads` threads each running fn(iters). */
static double timed(float (*fn)(long), long iters, int threads) {
    pthread_t tid[256];
    job jobs[256];
    if (threads > 256) threads = 256;
    double t0 = tool_now();
    int started = 0;
    for (int t = 0; t < threads; t++) {
        jobs[t].fn = fn;
        jobs[t].iters = iters;
        if (pthread_create(&tid[t], NULL, thread_main, &jobs[t]) != 0) break;
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    return started == threads ? tool_now() - t0 : -1;
}

double bench_fma_peak(int threads, const char **isa) {
    *isa = "none";
#ifdef HAVE_X86
    float (*fn)(long) = NULL;
    int lanes = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        fn = chains_avx512;
        lanes = 16;
        *isa = "avx512f";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fn = chains_avx2;
        lanes = 8;
        *isa = "avx2+fma";
    }
    if (!fn || threads < 1) return 0;
    /* size the run to about 0.1 s per thread, then keep the best of three */
    long iters = 1 << 16;
    double t = timed(fn, iters, 1);
    while (t >= 0 && t < 0.02) {
        iters *= 4;
        t = timed(fn, iters, 1);
    }
    if (t < 0) return 0;
    iters = (long)((double)iters * 0.1 / t) + 1;
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        double s = timed(fn, iters, threads);
        if (s <= 0) return 0;
        double gflops = (double)threads * (double)iters * 12 * lanes * 2 / s * 1e-9;
        if (gflops > best) best = gflops;
    }
    return best;
#else
    (void)threads;
    return 0;
#endif
}
