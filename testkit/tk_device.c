/*
 * tk_device.c — device-memory hook of the testkit.
 *
 * The sweeps run every case on the CUDA backend too when one is present. Device tensors need
 * device buffers: each tk_buf gets a device mirror of its whole (padded, poisoned) allocation,
 * so strides, gaps and the written/not-written checks are identical on both backends.
 *
 * Built with FLASHATTN_TESTKIT_CUDA (testkit/CMakeLists.txt sets it when the library has the
 * CUDA backend); without it every entry point reports "no device" and the GPU runs skip.
 */
#include <string.h>

#include "testkit.h"

#ifdef FLASHATTN_TESTKIT_CUDA
#include <cuda_runtime_api.h>

int tk_device_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int tk_device_cc_major(void) {
    int cc = 0;
    return cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess ? cc
                                                                                           : 0;
}

int tk_device_upload(tk_buf *b) {
    if (!b->base) return 0;
    if (!b->dev && cudaMalloc(&b->dev, b->bytes) != cudaSuccess) {
        b->dev = NULL;
        return 1;
    }
    return cudaMemcpy(b->dev, b->base, b->bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}

int tk_device_download(tk_buf *b) {
    if (!b->dev) return 1;
    /* the library may have queued work on its stream: wait for it before copying back */
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    return cudaMemcpy(b->base, b->dev, b->bytes, cudaMemcpyDeviceToHost) != cudaSuccess;
}

void tk_device_free(tk_buf *b) {
    if (b->dev) cudaFree(b->dev);
    b->dev = NULL;
}

void *tk_device_copy_array(const void *host, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

void tk_device_free_array(void *p) {
    if (p) cudaFree(p);
}

int tk_device_read_array(void *host, const void *dev, size_t bytes) {
    return cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : 1;
}

#else /* no device support compiled in */

int tk_device_available(void) { return 0; }
int tk_device_cc_major(void) { return 0; }
int tk_device_upload(tk_buf *b) { (void)b; return 1; }
int tk_device_download(tk_buf *b) { (void)b; return 1; }
void tk_device_free(tk_buf *b) { b->dev = NULL; }
void *tk_device_copy_array(const void *host, size_t bytes) { (void)host; (void)bytes; return NULL; }
void tk_device_free_array(void *p) { (void)p; }
int tk_device_read_array(void *host, const void *dev, size_t bytes) {
    (void)host, (void)dev, (void)bytes;
    return 1;
}

#endif

fa_tensor tk_device_view(const tk_buf *b) {
    fa_tensor t = b->t;
    t.data = (char *)b->dev + ((const char *)b->t.data - (const char *)b->base);
    t.device = FA_DEVICE_CUDA;
    return t;
}
