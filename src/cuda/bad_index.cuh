/*
 * cuda/bad_index.cuh — how kernels report a bad element of a device index array into the
 * context's error word (fa_bad_index of internal.h, in mapped host memory: FA_DEVICE_CHECKS_ASYNC).
 *
 * The first report wins and later ones are dropped until the host clears the word. Claiming it
 * needs an atomic, and device atomics on host memory are not atomic over every link (PCIe
 * without AtomicOps): so the claim is a try-lock in device memory, one per translation unit and
 * device. A launch's kernels all live in one translation unit, and launches of one context on
 * its stream run one after the other, so reporters that race share the lock. The fields are
 * written before the kind, with system fences between, so the host never sees half a record.
 * Only the error path pays: a report costs a few PCIe round trips.
 */
#ifndef FA_CUDA_BAD_INDEX_CUH
#define FA_CUDA_BAD_INDEX_CUH

#include "kernels.h"

namespace fa {

static __device__ int g_bad_index_busy;

static __device__ __noinline__ void report_bad(fa_bad_index *w, int kind, int array, int i,
                                               int j, int value, int prev, long long limit) {
    volatile fa_bad_index *v = w;
    if (!w || v->kind != FA_BAD_NONE) return;
    if (atomicCAS(&g_bad_index_busy, 0, 1) != 0) return; /* another report is being written */
    if (v->kind == FA_BAD_NONE) {
        v->array = array;
        v->i = i;
        v->j = j;
        v->value = value;
        v->prev = prev;
        v->limit = limit;
        __threadfence_system();
        v->kind = kind;
        __threadfence_system();
    }
    atomicExch(&g_bad_index_busy, 0);
}

} // namespace fa

#endif
