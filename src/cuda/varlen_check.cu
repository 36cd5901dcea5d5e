/*
 * cuda/varlen_check.cu — device cu_seqlens arrays before a varlen launch: they start at 0, never
 * decrease, end at the tensors' token counts, and no sequence is longer than max_seqlen (when
 * given: the launch is sized by it). A bad array would make the kernels read and write out of
 * bounds, so either
 *   - the check (FA_DEVICE_CHECKS_SYNC, or maxima the host must learn): one tiny kernel and a
 *     copy of its answer back (a stream synchronisation), and the call fails cleanly before
 *     anything is written; or
 *   - the sanitiser (FA_DEVICE_CHECKS_ASYNC): the same kernel writes copies of the arrays that
 *     the launch reads instead, all zero when an array is bad (every sequence empty, so nothing
 *     is computed or written), and reports the bad element into the context's error word. No
 *     synchronisation, so it can be captured into a CUDA graph.
 * One block walks both arrays (batch <= 65535, checked by the backend).
 */
#include <limits.h>
#include <stdio.h>

#include "bad_index.cuh"

namespace {

struct CuArray {
    const int *cu;
    long long total, max_len; /* max_len 0: no bound */
};

/* The first rule element i of a (batch + 1 values) breaks, or FA_BAD_NONE; fills *r when
   given. */
__device__ int cu_rule(const CuArray &a, int i, int batch, int array, fa_bad_index *r) {
    const int v = a.cu[i], prev = i > 0 ? a.cu[i - 1] : 0;
    int kind = FA_BAD_NONE;
    long long limit = 0;
    if (i == 0) {
        if (v != 0) kind = FA_BAD_CU_START;
    } else if (v < prev) {
        kind = FA_BAD_CU_DECREASE;
    } else if (v > a.total) {
        kind = FA_BAD_CU_PAST, limit = a.total;
    } else if (a.max_len > 0 && (long long)v - prev > a.max_len) {
        kind = FA_BAD_CU_LONG, limit = a.max_len;
    } else if (i == batch && v != a.total) {
        kind = FA_BAD_CU_END, limit = a.total;
    }
    if (r && kind != FA_BAD_NONE) {
        r->array = array, r->i = i, r->j = 0, r->value = v, r->prev = prev, r->limit = limit;
        r->kind = kind;
    }
    return kind;
}

/* out (check): the record of the first bad element (cu_seqlens_q before _k), kind 0 when
   none, and the longest sequences. san_q/san_k (sanitiser): the copies; err: the error word. */
__global__ void varlen_kernel(CuArray q, CuArray k, int batch, fa_bad_index *out, int *max_out,
                              int *san_q, int *san_k, fa_bad_index *err) {
    __shared__ int first[2], longest[2];
    if (threadIdx.x < 2) first[threadIdx.x] = INT_MAX, longest[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i <= batch; i += blockDim.x)
        for (int w = 0; w < 2; w++) {
            const CuArray &a = w ? k : q;
            if (cu_rule(a, i, batch, w, nullptr) != FA_BAD_NONE) atomicMin(&first[w], i);
            if (i > 0) atomicMax(&longest[w], a.cu[i] - a.cu[i - 1]);
        }
    __syncthreads();
    const int w = first[0] != INT_MAX ? 0 : first[1] != INT_MAX ? 1 : -1;
    if (threadIdx.x == 0) {
        fa_bad_index r = {};
        if (w >= 0) cu_rule(w ? k : q, first[w], batch, w, &r);
        if (out) {
            *out = r;
            max_out[0] = longest[0], max_out[1] = longest[1];
        }
        if (w >= 0) fa::report_bad(err, r.kind, r.array, r.i, r.j, r.value, r.prev, r.limit);
    }
    if (!san_q) return;
    for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
        san_q[i] = w >= 0 ? 0 : q.cu[i];
        san_k[i] = w >= 0 ? 0 : k.cu[i];
    }
}

int threads_for(int64_t batch) {
    const int64_t t = (batch + 1 + 31) / 32 * 32;
    return t < 1024 ? (int)t : 1024;
}

CuArray array_of(const int32_t *cu, int64_t total, int64_t max_len) {
    return CuArray{cu, (long long)total, (long long)max_len};
}

} // namespace

extern "C" fa_status fa_cuda_varlen_check(const fa_problem *p, void *ws, void *stream,
                                          int64_t *max_q, int64_t *max_k, char *msg,
                                          size_t msg_len) {
    static_assert(sizeof(fa_bad_index) + 2 * sizeof(int) <= FA_CUDA_CHECK_BYTES, "check answer");
    cudaStream_t st = (cudaStream_t)stream;
    fa_bad_index *dev = (fa_bad_index *)ws;
    int *dev_max = (int *)(dev + 1);
    struct {
        fa_bad_index r;
        int longest[2];
    } host;
    varlen_kernel<<<1, threads_for(p->batch), 0, st>>>(
        array_of(p->cu_q, p->total_q, p->seqlen_q), array_of(p->cu_k, p->total_k, p->seqlen_k),
        (int)p->batch, dev, dev_max, nullptr, nullptr, nullptr);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(&host, ws, sizeof host, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "checking cu_seqlens: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    if (host.r.kind != FA_BAD_NONE) {
        fa_bad_index_format(&host.r, msg, msg_len);
        return FA_ERR_VARLEN;
    }
    *max_q = host.longest[0];
    *max_k = host.longest[1];
    return FA_OK;
}

extern "C" fa_status fa_cuda_varlen_sanitize(const fa_problem *p, int32_t *san_q, int32_t *san_k,
                                             fa_bad_index *err, void *stream, char *msg,
                                             size_t msg_len) {
    varlen_kernel<<<1, threads_for(p->batch), 0, (cudaStream_t)stream>>>(
        array_of(p->cu_q, p->total_q, p->seqlen_q), array_of(p->cu_k, p->total_k, p->seqlen_k),
        (int)p->batch, nullptr, nullptr, san_q, san_k, err);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "checking cu_seqlens: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
