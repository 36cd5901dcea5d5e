/*
 * cuda/pad.cu — the copies of pad.h: one thread per element, grid-stride, 16-bit moves. The
 * caller's rows need not be 16-byte aligned (a contiguous tensor of d = 59 has rows 118 bytes
 * apart), so the copy never uses wider loads; it is memory bound and runs only for head dims
 * that are not multiples of 8.
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "pad.h"

namespace {

__global__ void pad_copy_kernel(const fa_cuda_pad_rows r, int to_buf) {
    /* to the buffer every column is written (the zero ones too); back only the real ones */
    const int w = to_buf ? r.dp : r.d;
    const int64_t n = r.nb * r.nt * r.nh * w;
    uint16_t *user = (uint16_t *)r.user, *buf = (uint16_t *)r.buf;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int x = (int)(i % w);
        const int64_t row = i / w; /* ((b * nt + t) * nh + h) */
        const int64_t h = row % r.nh, bt = row / r.nh;
        const int64_t t = bt % r.nt, b = bt / r.nt;
        const int64_t u = b * r.sb + t * r.st + h * r.sh + x;
        const int64_t k = row * r.dp + x;
        if (to_buf)
            buf[k] = x < r.d ? user[u] : (uint16_t)0;
        else
            user[u] = buf[k];
    }
}

} // namespace

extern "C" fa_status fa_cuda_pad_copy(const fa_cuda_pad_rows *r, int to_buf, void *stream,
                                      char *msg, size_t len) {
    const int64_t n = r->nb * r->nt * r->nh * (to_buf ? r->dp : r->d);
    if (n <= 0 || !r->user) return FA_OK;
    /* enough blocks to fill any GPU; the grid-stride loop takes the rest */
    const int64_t want = (n + 255) / 256;
    const int blocks = (int)(want < 8192 ? want : 8192);
    pad_copy_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(*r, to_buf);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(msg, len, "head-dim padding copy: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
