/*
 * cuda/cp_sm80.cu — the ring's merge and copy kernels (cp_kernels.h). Memory-bound and small
 * beside the attention: plain grid-stride loops, fp32 arithmetic, any strides.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

#include "cp_kernels.h"

namespace {

template <typename T> __device__ __forceinline__ float ld(const T *p);
template <> __device__ __forceinline__ float ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ld<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
template <typename T> __device__ __forceinline__ void st(T *p, float x);
template <> __device__ __forceinline__ void st<float>(float *p, float x) { *p = x; }
template <> __device__ __forceinline__ void st<__half>(__half *p, float x) { *p = __float2half_rn(x); }
template <> __device__ __forceinline__ void st<__nv_bfloat16>(__nv_bfloat16 *p, float x) {
    *p = __float2bfloat16_rn(x);
}

/* One element per iteration; the flat index is split into (b, t, h, x) so any strides work. */
template <typename TD, typename TS, bool ADD>
__global__ void copy_kernel(TD *dst, int64_t dsb, int64_t dst_, int64_t dsh, const TS *src,
                            int64_t ssb, int64_t sst, int64_t ssh, int64_t T, int64_t H,
                            int64_t X, int64_t total) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t x = i % X, h = (i / X) % H, t = (i / (X * H)) % T, b = i / (X * H * T);
        const float v = ld(src + b * ssb + t * sst + h * ssh + x);
        TD *d = dst + b * dsb + t * dst_ + h * dsh + x;
        st(d, ADD ? ld(d) + v : v);
    }
}

/* log(exp(a) + exp(b)), -inf when both are -inf (never NaN from -inf - -inf). */
__device__ __forceinline__ float logaddexp(float a, float b) {
    const float m = fmaxf(a, b);
    if (m == -INFINITY) return -INFINITY;
    return m + log1pf(expf(-fabsf(a - b)));
}

/* One warp per row (b, t, h): every lane reads the row's two LSEs before lane 0 writes the new
   one (__syncwarp), so no lane sees a half-updated row. acc := acc + w (o - acc) with
   w = exp(lse_o - lse_new): one pass, exact at w = 0 and w = 1 (the Python ring's lerp). */
template <typename T>
__global__ void merge_kernel(float *acc_o, float *acc_lse, const T *part_o, const float *part_lse,
                             int64_t n, int64_t H, int64_t D, int64_t q0, int64_t nt,
                             int64_t rows, int first) {
    const int lane = threadIdx.x & 31;
    const int64_t per_block = blockDim.x / 32, warps = (int64_t)gridDim.x * per_block;
    for (int64_t r = blockIdx.x * per_block + threadIdx.x / 32; r < rows; r += warps) {
        const int64_t h = r % H, t = q0 + (r / H) % nt, b = r / (H * nt);
        const int64_t li = (b * H + h) * n + t, oi = ((b * n + t) * H + h) * D;
        const float lp = part_lse[li];
        const float la = first ? -INFINITY : acc_lse[li];
        const float ln = logaddexp(la, lp);
        /* a row no key reached in either part keeps out 0, lse -inf: weight 0, no 0 * inf */
        const float w = ln == -INFINITY ? 0.0f : expf(lp - ln);
        for (int64_t x = lane; x < D; x += 32) {
            const float o = ld(part_o + oi + x);
            float *a = acc_o + oi + x;
            *a = first ? w * o : *a + w * (o - *a);
        }
        __syncwarp();
        if (lane == 0) acc_lse[li] = ln;
    }
}

int blocks_for(int64_t work, int per_block) {
    int64_t b = (work + per_block - 1) / per_block;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

template <typename TD, typename TS>
cudaError_t launch_copy(const fa_cp_view *d, const fa_cp_view *s, int64_t B, int64_t T,
                        int64_t H, int64_t X, int add, cudaStream_t stream) {
    const int64_t total = B * T * H * X;
    const int threads = 256, blocks = blocks_for(total, threads);
    TD *dd = (TD *)d->data;
    const TS *ss = (const TS *)s->data;
    if (add)
        copy_kernel<TD, TS, true><<<blocks, threads, 0, stream>>>(
            dd, d->sb, d->st, d->sh, ss, s->sb, s->st, s->sh, T, H, X, total);
    else
        copy_kernel<TD, TS, false><<<blocks, threads, 0, stream>>>(
            dd, d->sb, d->st, d->sh, ss, s->sb, s->st, s->sh, T, H, X, total);
    return cudaGetLastError();
}

template <typename TD>
cudaError_t launch_copy_src(const fa_cp_view *d, const fa_cp_view *s, int64_t B, int64_t T,
                            int64_t H, int64_t X, int add, cudaStream_t stream) {
    switch (s->dtype) {
    case FA_DTYPE_F32: return launch_copy<TD, float>(d, s, B, T, H, X, add, stream);
    case FA_DTYPE_F16: return launch_copy<TD, __half>(d, s, B, T, H, X, add, stream);
    case FA_DTYPE_BF16: return launch_copy<TD, __nv_bfloat16>(d, s, B, T, H, X, add, stream);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" fa_status fa_cp_copy(const fa_cp_view *dst, const fa_cp_view *src, int64_t B,
                                int64_t T, int64_t H, int64_t X, int add, void *stream,
                                char *msg, size_t len) {
    if (B * T * H * X == 0) return FA_OK;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    /* accumulation is fp32 only: adding into a 16-bit buffer would round at every step */
    if (add && dst->dtype != FA_DTYPE_F32) e = cudaErrorInvalidValue;
    else switch (dst->dtype) {
    case FA_DTYPE_F32: e = launch_copy_src<float>(dst, src, B, T, H, X, add, s); break;
    case FA_DTYPE_F16: e = launch_copy_src<__half>(dst, src, B, T, H, X, add, s); break;
    case FA_DTYPE_BF16: e = launch_copy_src<__nv_bfloat16>(dst, src, B, T, H, X, add, s); break;
    default: e = cudaErrorInvalidValue;
    }
    if (e == cudaSuccess) return FA_OK;
    snprintf(msg, len, "context-parallel copy kernel: %s", cudaGetErrorString(e));
    return FA_ERR_CUDA;
}

extern "C" fa_status fa_cp_merge(float *acc_o, float *acc_lse, const void *part_o,
                                 fa_dtype dtype, const float *part_lse, int64_t B, int64_t n,
                                 int64_t H, int64_t D, int64_t q0, int64_t q1, int first,
                                 void *stream, char *msg, size_t len) {
    const int64_t nt = q1 - q0, rows = B * nt * H;
    if (rows == 0) return FA_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const int threads = 256, blocks = blocks_for(rows, threads / 32);
    if (dtype == FA_DTYPE_F16)
        merge_kernel<__half><<<blocks, threads, 0, s>>>(acc_o, acc_lse, (const __half *)part_o,
                                                        part_lse, n, H, D, q0, nt, rows, first);
    else
        merge_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(
            acc_o, acc_lse, (const __nv_bfloat16 *)part_o, part_lse, n, H, D, q0, nt, rows,
            first);
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return FA_OK;
    snprintf(msg, len, "context-parallel merge kernel: %s", cudaGetErrorString(e));
    return FA_ERR_CUDA;
}
