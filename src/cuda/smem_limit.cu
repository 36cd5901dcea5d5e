/*
 * smem_limit.cu — fa_cuda_smem_limit (kernels.h): a kernel's dynamic shared memory limit, set
 * once per kernel and device.
 */
#include <cuda_runtime.h>

#include <mutex>

#include "kernels.h"

namespace {

/* Kernels and devices whose limit is set: an open-addressed table, which never shrinks (the
   library has a few hundred kernels; a full table only means setting the attribute again). */
struct Entry {
    const void *kern;
    int device, bytes;
};
constexpr unsigned SLOTS = 2048;
Entry g_set[SLOTS];
std::mutex g_lock;

unsigned slot_of(const void *kern, int device) {
    const unsigned long long h = (unsigned long long)(size_t)kern * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 40 ^ (unsigned)device) % SLOTS;
}

} // namespace

/* The attribute belongs to the kernel in the device's context and stays set, so calls after
   the first skip the runtime call, a share of a small call's host time (perf python_door P1). */
extern "C" int fa_cuda_smem_limit(const void *kern, int bytes) {
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return (int)e;
    std::lock_guard<std::mutex> hold(g_lock);
    unsigned i = slot_of(kern, device), n = 0;
    for (; n < SLOTS && g_set[i].kern; n++, i = (i + 1) % SLOTS)
        if (g_set[i].kern == kern && g_set[i].device == device && g_set[i].bytes >= bytes)
            return (int)cudaSuccess;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && n < SLOTS) g_set[i] = Entry{kern, device, bytes};
    return (int)e;
}
