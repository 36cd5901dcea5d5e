/*
 * cuda/varlen_check.cu — checks device cu_seqlens arrays before a varlen launch: they start at
 * 0, never decrease and end at the tensors' token counts. Without it a bad array would make
 * kernels read and write out of bounds; with it the call fails cleanly before anything is
 * written. Costs one tiny kernel and a 16-byte copy back (a stream synchronisation).
 */
#include <stdio.h>

#include "kernels.h"

namespace {

/* out[0]: first bad index of cu_q or -1; out[1]: of cu_k; out[2], out[3]: longest sequences */
__global__ void check_kernel(const int *cu_q, const int *cu_k, int batch, long long total_q,
                             long long total_k, int *out) {
    if (threadIdx.x == 0) {
        out[0] = out[1] = -1;
        out[2] = out[3] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
        const int *cus[2] = {cu_q, cu_k};
        const long long totals[2] = {total_q, total_k};
        for (int w = 0; w < 2; w++) {
            const int *cu = cus[w];
            bool bad = i == 0 ? cu[0] != 0
                              : cu[i] < cu[i - 1] || (i == batch && cu[i] != totals[w]);
            if (bad) atomicCAS(&out[w], -1, i);
            if (i > 0) atomicMax(&out[2 + w], cu[i] - cu[i - 1]);
        }
    }
}

} // namespace

extern "C" fa_status fa_cuda_varlen_check(const fa_problem *p, int64_t total_q, int64_t total_k,
                                          void *ws, void *stream, int64_t *max_q, int64_t *max_k,
                                          char *msg, size_t msg_len) {
    cudaStream_t st = (cudaStream_t)stream;
    int *dev = (int *)ws;
    int host[4];
    check_kernel<<<1, 256, 0, st>>>(p->cu_q, p->cu_k, (int)p->batch, (long long)total_q,
                                    (long long)total_k, dev);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "checking cu_seqlens: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    for (int w = 0; w < 2; w++)
        if (host[w] >= 0) {
            snprintf(msg, msg_len,
                     "cu_seqlens_%s[%d] breaks the rule: starts at 0, never decreases, ends at "
                     "the tensor's %lld tokens",
                     w ? "k" : "q", host[w], (long long)(w ? total_k : total_q));
            return FA_ERR_VARLEN;
        }
    *max_q = host[2];
    *max_k = host[3];
    return FA_OK;
}
