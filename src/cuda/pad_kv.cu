/*
 * cuda/pad_kv.cu — the cache copies of pad_kv.h: one warp per row (lanes stride along the
 * columns), grid (row blocks, heads_kv, batch), rows of a sequence grid-stride, 16-bit moves
 * (the caller's rows of d = 59 are 118 bytes apart: no wider access is aligned).
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "bad_index.cuh"
#include "pad_kv.h"

namespace {

constexpr int kRows = 8;       /* warps per block, one row each at a time */
constexpr int kMaxBlocks = 512; /* row blocks per (sequence, kv head): the rest grid-strides */

/* The user's row of token t of sequence b, head hk (page clamped into the pool as the decode
   clamps it). */
__device__ __forceinline__ uint16_t *user_row(const fa_cuda_pad_cache &c, void *base,
                                              int64_t sb, int64_t st, int64_t sh, int b, int t,
                                              int hk) {
    int64_t off;
    if (c.block_table) {
        const int pi = t / c.page_size;
        const int page = min(max(c.block_table[b * c.bt_stride + pi], 0), c.num_pages - 1);
        off = (int64_t)page * sb + (int64_t)(t - pi * c.page_size) * st;
    } else {
        off = (int64_t)b * sb + (int64_t)t * st;
    }
    return (uint16_t *)base + off + (int64_t)hk * sh;
}

__device__ __forceinline__ int64_t buf_row(const fa_cuda_pad_cache &c, int b, int t, int hk) {
    return (((int64_t)b * c.capacity + t) * c.heads_kv + hk) * c.dp;
}

__device__ __forceinline__ bool bad_length(const fa_cuda_pad_cache &c, int n) {
    return n < 0 || n > c.capacity - c.seqlen_new;
}

__global__ void gather_kernel(const fa_cuda_pad_cache c) {
    const int hk = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
    const int n = c.seqlens[b];
    /* the decode's kv_len: the length after the append, clamped into [0, capacity] */
    const int L = (int)min((long long)max(n, 0) + c.seqlen_new, (long long)c.capacity);
    if (c.block_table && blockIdx.x == 0 && hk == 0 && threadIdx.y == 0 && lane == 0 &&
        bad_length(c, n)) /* array 1: the capacity is what a block_table row maps */
        fa::report_bad(c.bad, n < 0 ? FA_BAD_SEQLEN_NEGATIVE : FA_BAD_SEQLEN_ROOM, 1, b, 0, n,
                       c.seqlen_new, c.capacity);
    for (int t = blockIdx.x * kRows + threadIdx.y; t < L; t += gridDim.x * kRows) {
        if (c.block_table && hk == 0 && lane == 0 && t % c.page_size == 0) {
            const int pi = t / c.page_size, e = c.block_table[b * c.bt_stride + pi];
            if (e < 0 || e >= c.num_pages)
                fa::report_bad(c.bad, FA_BAD_PAGE, 0, b, pi, e, 0, c.num_pages);
        }
        const uint16_t *ku = user_row(c, c.k, c.k_sb, c.k_st, c.k_sh, b, t, hk);
        const uint16_t *vu = user_row(c, c.v, c.v_sb, c.v_st, c.v_sh, b, t, hk);
        uint16_t *kb = (uint16_t *)c.kbuf + buf_row(c, b, t, hk);
        uint16_t *vb = (uint16_t *)c.vbuf + buf_row(c, b, t, hk);
        for (int x = lane; x < c.dp; x += 32) {
            kb[x] = x < c.d ? ku[x] : (uint16_t)0;
            vb[x] = x < c.d ? vu[x] : (uint16_t)0;
        }
    }
}

__global__ void scatter_kernel(const fa_cuda_pad_cache c) {
    const int hk = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
    const int n = c.seqlens[b];
    if (bad_length(c, n)) return; /* the append wrote nothing for it */
    for (int t = blockIdx.x * kRows + threadIdx.y; t < c.seqlen_new; t += gridDim.x * kRows) {
        const int pos = n + t;
        if (c.block_table) { /* a bad page: the append skipped the row (and reported it) */
            const int e = c.block_table[b * c.bt_stride + pos / c.page_size];
            if (e < 0 || e >= c.num_pages) continue;
        }
        uint16_t *ku = user_row(c, c.k, c.k_sb, c.k_st, c.k_sh, b, pos, hk);
        uint16_t *vu = user_row(c, c.v, c.v_sb, c.v_st, c.v_sh, b, pos, hk);
        const uint16_t *kb = (const uint16_t *)c.kbuf + buf_row(c, b, pos, hk);
        const uint16_t *vb = (const uint16_t *)c.vbuf + buf_row(c, b, pos, hk);
        for (int x = lane; x < c.d; x += 32) {
            ku[x] = kb[x];
            vu[x] = vb[x];
        }
    }
}

fa_status launch(const fa_cuda_pad_cache *c, int rows, bool in, void *stream, char *msg,
                 size_t len) {
    if (c->batch <= 0 || c->heads_kv <= 0 || rows <= 0) return FA_OK;
    const int want = (rows + kRows - 1) / kRows;
    const dim3 grid(want < kMaxBlocks ? want : kMaxBlocks, c->heads_kv, c->batch);
    const dim3 block(32, kRows);
    if (in) gather_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(*c);
    else scatter_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(*c);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(msg, len, "head-dim padding copy of the cache: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}

} // namespace

extern "C" fa_status fa_cuda_pad_cache_in(const fa_cuda_pad_cache *c, void *stream, char *msg,
                                          size_t len) {
    return launch(c, c->capacity, true, stream, msg, len);
}

extern "C" fa_status fa_cuda_pad_cache_out(const fa_cuda_pad_cache *c, void *stream, char *msg,
                                           size_t len) {
    return launch(c, c->seqlen_new, false, stream, msg, len);
}
