/*
 * cuda/bwd_sm90.cu — the host side of the Hopper backward's main kernels (bwd_sm90.cuh): what they
 * refuse, their tensor maps and their launch. bwd_sm80.cu runs the passes around them.
 */
#include <stdio.h>

#include "bwd_sm90.cuh"
#include "tma_map.cuh"

namespace fa {
namespace bwd {
namespace {

/* Asked once: a fact of the build (as fwd_sm90.cu's has_sm90a). */
bool has_sm90a() {
    static const bool yes = [] {
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, bwd_sm90_kernel<__half, Sm90Cfg<128>, true>) !=
            cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        return fa.binaryVersion == 90;
    }();
    return yes;
}

/* f(C{}) for the configuration of head dim D */
template <typename F> auto with_cfg(int D, F f) {
    return D == 64 ? f(Sm90Cfg<64>{}) : D == 128 ? f(Sm90Cfg<128>{}) : f(Sm90Cfg<256>{});
}

template <typename T, typename C, bool DQ>
cudaError_t launch(const Sm90Args &g, cudaStream_t st) {
    void (*kern)(Sm90Args);
    if constexpr (C::D == 256) kern = bwd_sm90_d256_kernel<T, C, DQ>;
    else kern = bwd_sm90_kernel<T, C, DQ>;
    cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);
    if (e != cudaSuccess) return e;
    const dim3 grid((g.a.seqlen_k + C::BN - 1) / C::BN, g.a.heads_kv * g.a.nsplit, g.a.batch);
    if (grid.x == 0) return cudaSuccess;
    kern<<<grid, C::THREADS, C::SMEM, st>>>(g);
    return cudaGetLastError();
}

template <typename T, typename C> cudaError_t launch_det(const Sm90Args &g, bool det, cudaStream_t st) {
    return det ? launch<T, C, false>(g, st) : launch<T, C, true>(g, st);
}

} // namespace

int sm90_bwd_covers(const fa_problem *p) { return p->d == 64 || p->d == 128 || p->d == 256; }

const char *sm90_bwd_prepare(const fa_problem *p, const fa_cuda_launch *l, Sm90Args *g, int *bm) {
    if (l->cc != 90) return "not an sm_90 GPU";
    if (!sm90_bwd_covers(p)) return "head dims other than 64, 128 and 256 (not yet)";
    const int D = (int)p->d;
    if (D == 256 && p->softcap > 0.f) return "softcap at d 256 (not yet)";
    if (with_cfg(D, [](auto c) { return decltype(c)::SMEM; }) > l->smem_optin) return "shared memory";
    if (!has_sm90a()) return "this build (no sm_90a code)";
    if (!sm90::encode_fn()) return "no cuTensorMapEncodeTiled in this driver";
    if (!p->cu_q && p->batch > 1 &&
        (p->q.sb == 0 || p->k.sb == 0 || p->v.sb == 0 || p->dout.sb == 0))
        return "a batch stride of 0";
    const int64_t nb = p->cu_q ? 1 : p->batch;
    const int64_t tq = p->cu_q ? p->total_q : p->seqlen_q, tk = p->cu_q ? p->total_k : p->seqlen_k;
    *bm = with_cfg(D, [](auto c) { return decltype(c)::BM; });
    const int bn = with_cfg(D, [](auto c) { return decltype(c)::BN; });
    CUresult r = sm90::make_map(&g->tq, &p->q, p->dtype, D, p->heads_q, tq, nb, *bm);
    if (r == CUDA_SUCCESS) r = sm90::make_map(&g->tdo, &p->dout, p->dtype, D, p->heads_q, tq, nb, *bm);
    if (r == CUDA_SUCCESS) r = sm90::make_map(&g->tk, &p->k, p->dtype, D, p->heads_kv, tk, nb, bn);
    if (r == CUDA_SUCCESS) r = sm90::make_map(&g->tv, &p->v, p->dtype, D, p->heads_kv, tk, nb, bn);
    if (r != CUDA_SUCCESS) return "these strides (a tensor map refused them)";
    return NULL;
}

cudaError_t run_sm90_main(const Sm90Args &g, fa_dtype dt, bool det, cudaStream_t st) {
    return with_cfg(g.a.d, [&](auto c) {
        return dt == FA_DTYPE_BF16 ? launch_det<__nv_bfloat16, decltype(c)>(g, det, st)
                                   : launch_det<__half, decltype(c)>(g, det, st);
    });
}

} // namespace bwd
} // namespace fa
