/*
 * cuda/pad.cu — the copies of pad.h: one warp per row (its lanes stride along the columns, so
 * the accesses of a warp are contiguous), rows grid-stride, 16-bit moves. The caller's rows
 * need not be 16-byte aligned (a contiguous tensor of d = 59 has rows 118 bytes apart), so the
 * copy never uses wider loads; it is memory bound and runs only for head dims that are not
 * multiples of 8.
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "pad.h"

namespace {

constexpr int kRowsPerBlock = 8; /* warps per block, one row each at a time */

__global__ void pad_copy_kernel(const fa_cuda_pad_rows r, int to_buf) {
    /* to the buffer every column is written (the zero ones too); back only the real ones */
    const int w = to_buf ? r.dp : r.d;
    const int64_t rows = r.nb * r.nt * r.nh;
    const int64_t limit = r.tokens ? *r.tokens : r.nt;
    for (int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.y; row < rows;
         row += (int64_t)gridDim.x * kRowsPerBlock) {
        /* row = (b * nt + t) * nh + h: the divisions once per row, not per element */
        const int64_t h = row % r.nh, bt = row / r.nh;
        const int64_t t = bt % r.nt, b = bt / r.nt;
        if (t >= limit) continue; /* uniform over the warp */
        uint16_t *user = (uint16_t *)r.user + b * r.sb + t * r.st + h * r.sh;
        uint16_t *buf = (uint16_t *)r.buf + row * r.dp;
        for (int x = threadIdx.x; x < w; x += 32) {
            if (to_buf)
                buf[x] = x < r.d ? user[x] : (uint16_t)0;
            else
                user[x] = buf[x];
        }
    }
}

} // namespace

extern "C" fa_status fa_cuda_pad_copy(const fa_cuda_pad_rows *r, int to_buf, void *stream,
                                      char *msg, size_t len) {
    const int64_t rows = r->nb * r->nt * r->nh;
    if (rows <= 0 || !r->user) return FA_OK;
    /* enough blocks to fill any GPU; the grid-stride loop takes the rest */
    const int64_t want = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const int blocks = (int)(want < 16384 ? want : 16384);
    pad_copy_kernel<<<blocks, dim3(32, kRowsPerBlock), 0, (cudaStream_t)stream>>>(*r, to_buf);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(msg, len, "head-dim padding copy: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
