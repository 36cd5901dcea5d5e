/*
 * cuda/bwd_sm80_run.cuh — the per-head-dim entry run_d<D> (declared in bwd_sm80.cuh): picks
 * the configuration the plan chose and the dtype, queues the main kernel (unless the Hopper
 * one runs instead) and, in deterministic mode, the dQ kernel. Each bwd_sm80_d<D>.cu expands it once, so the head dims
 * compile in parallel.
 */
#ifndef FA_CUDA_BWD_SM80_RUN_CUH
#define FA_CUDA_BWD_SM80_RUN_CUH

#include "bwd_sm80_dq.cuh"
#include "bwd_sm80_main.cuh"

namespace fa {
namespace bwd {

template <typename T, typename C, bool DROP>
cudaError_t run_cfg(const BwdArgs &a, bool det, cudaStream_t st) {
    return det ? launch_main<T, C, false, DROP>(a, st) : launch_main<T, C, true, DROP>(a, st);
}

/* The plan's configuration with or without dropout (a template parameter: the kernels
   without it stay as they were). */
template <typename T, typename C>
cudaError_t run_cfg(const BwdArgs &a, bool det, bool drop, cudaStream_t st) {
    return drop ? run_cfg<T, C, true>(a, det, st) : run_cfg<T, C, false>(a, det, st);
}

template <typename T, typename C> cudaError_t run_dq(const BwdArgs &a, bool drop, cudaStream_t st) {
    return drop ? launch_dq<T, C, true>(a, st) : launch_dq<T, C, false>(a, st);
}

template <typename T, int D>
cudaError_t run_dim(const BwdArgs &a, const Plan &pl, bool det, cudaStream_t st) {
    using TL = Tiles<D>;
    cudaError_t e = cudaSuccess;
    if (!pl.sm90) switch (pl.cfg) {
        case 0: e = run_cfg<T, typename TL::Big>(a, det, pl.drop, st); break;
        case 1: e = run_cfg<T, typename TL::Mid>(a, det, pl.drop, st); break;
        default: e = run_cfg<T, typename TL::Small>(a, det, pl.drop, st); break;
        }
    if (e != cudaSuccess || !det) return e;
    return pl.dq_cfg == 0 ? run_dq<T, typename TL::Dq>(a, pl.drop, st)
                          : run_dq<T, typename TL::DqSmall>(a, pl.drop, st);
}

} // namespace bwd
} // namespace fa

#define FA_BWD_RUN_DEFINE(D)                                                                  \
    namespace fa {                                                                            \
    namespace bwd {                                                                           \
    cudaError_t run_d##D(const BwdArgs &a, const Plan &pl, fa_dtype dt, bool det,             \
                         cudaStream_t st) {                                                   \
        return dt == FA_DTYPE_BF16 ? run_dim<__nv_bfloat16, D>(a, pl, det, st)                \
                                   : run_dim<__half, D>(a, pl, det, st);                      \
    }                                                                                         \
    }                                                                                         \
    }

#endif
