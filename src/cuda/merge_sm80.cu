/*
 * cuda/merge_sm80.cu — merges partial attention results over disjoint key sets with the
 * log-sum-exp correction: lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse) out_s.
 * Serves fa_merge_attn and the split-KV decode. A part whose lse is -inf carries no weight;
 * a row no part saw gets out 0, lse -inf.
 */
#include <math.h>
#include <stdio.h>

#include "merge_sm80.h"
#include "ptx.cuh"

namespace {

template <typename P> __device__ __forceinline__ float ld(const P *p);
template <> __device__ __forceinline__ float ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ld<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
template <typename P> __device__ __forceinline__ void st(P *p, float x);
template <> __device__ __forceinline__ void st<float>(float *p, float x) { *p = x; }
template <> __device__ __forceinline__ void st<__half>(__half *p, float x) { *p = __float2half_rn(x); }
template <> __device__ __forceinline__ void st<__nv_bfloat16>(__nv_bfloat16 *p, float x) {
    *p = __float2bfloat16_rn(x);
}

/* One block per row (b, t, h), one thread per column. The parts' LSEs are read once, all at
   once, into shared memory; each thread then reads its column of every part with independent
   loads (the sums wait on no load but their own), so a merge of many parts costs about one
   memory latency, not one per part. */
template <typename P, typename T>
__global__ void merge_kernel(const __grid_constant__ fa_cuda_merge_args a) {
    __shared__ float w[FA_CUDA_MERGE_MAX_PARTS];
    __shared__ fa_cuda_merge_part sp[FA_CUDA_MERGE_MAX_PARTS];
    __shared__ float total;
    const int64_t row = blockIdx.x;
    const int64_t h = row % a.heads, t = (row / a.heads) % a.seqlen, b = row / (a.heads * a.seqlen);
    const int x = threadIdx.x;
    /* Part descriptors into shared memory with constant indices only: a kernel parameter read
       at a run-time index makes the compiler copy all 4 KB of them to local memory, per
       thread (decode_sm80.md, v3). */
    if (a.strided) {
        if (x < a.n) {
            sp[x] = a.parts[0];
            sp[x].o = (const P *)a.parts[0].o + x * a.o_step;
            sp[x].lse = a.parts[0].lse + x * a.lse_step;
        }
    } else {
#pragma unroll
        for (int s = 0; s < FA_CUDA_MERGE_MAX_PARTS; s++)
            if (s == x && s < a.n) sp[s] = a.parts[s];
    }
    __syncthreads();
    if (x < a.n) {
        const fa_cuda_merge_part &p = sp[x];
        w[x] = p.lse[b * p.lse_sb + h * p.lse_sh + t * p.lse_st];
    }
    __syncthreads();
    if (x < 32) { /* warp 0: max, weights, their sum */
        float M = -INFINITY;
        for (int s = x; s < a.n; s += 32) M = fmaxf(M, w[s]);
        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float Mu = M == -INFINITY ? 0.f : M;
        float sum = 0.f;
        for (int s = x; s < a.n; s += 32) {
            const float e = __expf(w[s] - Mu);
            w[s] = e;
            sum += e;
        }
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (x == 0) {
            total = sum;
            if (a.lse) a.lse[b * a.lse_sb + h * a.lse_sh + t * a.lse_st] = sum > 0.f ? Mu + logf(sum) : -INFINITY;
        }
    }
    __syncthreads();
    if (x >= a.d) return;
    float acc = 0.f;
#pragma unroll 8
    for (int s = 0; s < a.n; s++) {
        const fa_cuda_merge_part &p = sp[s];
        const float v = w[s] > 0.f ? ld<P>((const P *)p.o + b * p.sb + t * p.st + h * p.sh + x) : 0.f;
        acc += w[s] * v; /* parts of weight 0 (lse -inf) are never read: may be unwritten */
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    st<T>((T *)a.o + b * a.sb + t * a.st + h * a.sh + x, acc * inv);
}

template <typename P>
cudaError_t launch_out(const fa_cuda_merge_args &a, fa_dtype out, cudaStream_t st, int blocks) {
    /* one thread per column, at least the parts' count, whole warps */
    int threads = (int)(a.d > a.n ? a.d : a.n);
    threads = (threads + 31) / 32 * 32;
    switch (out) {
    case FA_DTYPE_F16: merge_kernel<P, __half><<<blocks, threads, 0, st>>>(a); break;
    case FA_DTYPE_BF16: merge_kernel<P, __nv_bfloat16><<<blocks, threads, 0, st>>>(a); break;
    default: merge_kernel<P, float><<<blocks, threads, 0, st>>>(a); break;
    }
    return cudaGetLastError();
}

} // namespace

extern "C" fa_status fa_cuda_merge(const fa_cuda_merge_args *a, fa_dtype part_dtype,
                                   fa_dtype out_dtype, void *stream, char *msg, size_t len) {
    const int64_t rows = a->batch * a->seqlen * a->heads;
    if (rows == 0) return FA_OK;
    if (rows > 0x7fffffff) {
        snprintf(msg, len, "merge: %lld rows are too many for one launch", (long long)rows);
        return FA_ERR_UNSUPPORTED;
    }
    const int blocks = (int)rows;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    switch (part_dtype) {
    case FA_DTYPE_F16: e = launch_out<__half>(*a, out_dtype, st, blocks); break;
    case FA_DTYPE_BF16: e = launch_out<__nv_bfloat16>(*a, out_dtype, st, blocks); break;
    default: e = launch_out<float>(*a, out_dtype, st, blocks); break;
    }
    if (e != cudaSuccess) {
        snprintf(msg, len, "merge: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
