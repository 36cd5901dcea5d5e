/*
 * cuda/fwd_sm80.cu — fa_sm80_fwd: flattens a validated fa_problem into the kernel's arguments,
 * picks the kernel for the head dim and dtype, launches it and names it.
 */
#include <stdio.h>

#include "fwd_sm80.cuh"

extern "C" const char *fa_cuda_mask_name(const fa_problem *p) {
    if (p->causal) return p->win_left < 0 ? "_causal" : "_causal_local";
    return (p->win_left >= 0 || p->win_right >= 0) ? "_local" : "";
}

extern "C" int fa_cuda_kernel_dim(int64_t d) {
    static const int dims[] = {32, 64, 96, 128, 192, 256};
    for (int D : dims)
        if (d <= D) return D;
    return 0;
}

namespace {

template <typename T>
cudaError_t run_dim(int D, const fa::FwdArgs &a, bool drop, int batch, int heads, int max_sq, size_t optin,
                    cudaStream_t st, fa::FwdShape *shape) {
    switch (D) {
    case 32: return fa::fwd_sm80_run<T, 32>(a, drop, batch, heads, max_sq, optin, st, shape);
    case 64: return fa::fwd_sm80_run<T, 64>(a, drop, batch, heads, max_sq, optin, st, shape);
    case 96: return fa::fwd_sm80_run<T, 96>(a, drop, batch, heads, max_sq, optin, st, shape);
    case 128: return fa::fwd_sm80_run<T, 128>(a, drop, batch, heads, max_sq, optin, st, shape);
    case 192: return fa::fwd_sm80_run<T, 192>(a, drop, batch, heads, max_sq, optin, st, shape);
    default: return fa::fwd_sm80_run<T, 256>(a, drop, batch, heads, max_sq, optin, st, shape);
    }
}


} // namespace

extern "C" fa_status fa_sm80_fwd(const fa_problem *p, fa_cuda_launch *l) {
    fa::FwdArgs a;
    a.q = p->q.data;
    a.k = p->k.data;
    a.v = p->v.data;
    a.o = p->o.data;
    a.lse = (float *)p->lse;
    a.q_sb = p->q.sb, a.q_st = p->q.st, a.q_sh = p->q.sh;
    a.k_sb = p->k.sb, a.k_st = p->k.st, a.k_sh = p->k.sh;
    a.v_sb = p->v.sb, a.v_st = p->v.st, a.v_sh = p->v.sh;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    a.cu_q = p->cu_q;
    a.cu_k = p->cu_k;
    a.seqlen_q = (int)p->seqlen_q;
    a.seqlen_k = (int)p->seqlen_k;
    a.group = (int)p->group;
    a.d = (int)p->d;
    a.m = fa::score_mods_of(p);
    const bool drop = p->drop_p > 0; /* the dispatcher bounded the counter words (dispatch.c) */
    a.drop.d = fa_drop_init(p->drop_seed, p->drop_offset, p->drop_p);
    a.drop.scale = fa_drop_scale(p->drop_p);
    a.drop.heads_q = (int)p->heads_q;

    const int D = fa_cuda_kernel_dim(p->d);
    const cudaStream_t st = (cudaStream_t)l->stream;
    const int batch = (int)p->batch, heads = (int)p->heads_q, max_sq = (int)p->seqlen_q;
    fa::FwdShape shape = {0, 0, 0};
    cudaError_t e = p->dtype == FA_DTYPE_BF16
                        ? run_dim<__nv_bfloat16>(D, a, drop, batch, heads, max_sq, l->smem_optin, st, &shape)
                        : run_dim<__half>(D, a, drop, batch, heads, max_sq, l->smem_optin, st, &shape);
    snprintf(l->kernel, sizeof l->kernel, "sm80_fwd_d%d_%s%s%s", D, fa_dtype_name(p->dtype),
             fa_cuda_mask_name(p), drop ? "_dropout" : "");
    l->tile_q = shape.bm;
    l->tile_k = shape.bn;
    l->threads = shape.threads;
    if (e != cudaSuccess) {
        snprintf(l->msg, sizeof l->msg, "%s: %s", l->kernel, cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
