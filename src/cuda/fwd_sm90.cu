/*
 * cuda/fwd_sm90.cu — the host side of the Hopper forward (kernel: fwd_sm90.cuh): the tensor
 * maps, what the kernel refuses, the choices of tune_sm90.h (or those a test forces), the
 * work-tile parameters and the launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_sm90.cuh"
#include "fwd_sm90_serial.cuh"
#include "tma_map.cuh"

namespace fa {
namespace sm90 {

/* The kernel dimension for p's head dim, 0 for none. */
int kernel_dim(int64_t d) { return d == 64 || d == 128 || d == 256 ? (int)d : 0; }

/* f(C{}) for the tiling of kernel head dim D (Tiles<D>::Long when lng) */
template <typename F> auto with_cfg(int D, bool lng, F f) {
    switch (D) {
    case 64: return lng ? f(Tiles<64>::Long{}) : f(Tiles<64>::C{});
    case 128: return lng ? f(Tiles<128>::Long{}) : f(Tiles<128>::C{});
    default: return lng ? f(Tiles<256>::Long{}) : f(Tiles<256>::C{});
    }
}

/* Whether the series kernel (fwd_sm90_serial.cuh) takes p: it serves problems without varlen,
   softcap or ALiBi whose O its copy engine can store (o_map), and runs those where
   serial_wins (tune_sm90.h). Choice 1 forces it wherever it serves, 2 keeps the overlapped
   kernel. */
bool serial_for(const fa_problem *p, int D, int choice, bool masked, bool o_map) {
    const bool serves = !p->cu_q && !(p->softcap > 0.f) && !p->alibi && o_map;
    if (!serves || choice == 2) return false;
    return choice == 1 || serial_wins(p, D, masked);
}

/* Whether this build holds sm_90a code for the kernel (a build without it has only the empty
   body of the other targets' pass). Asked once: a fact of the build, and the query is a share
   of a small call's host time (perf python_door P1). */
template <typename C> bool has_sm90a() {
    static const bool yes = [] {
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, fwd_sm90_kernel<__half, C, OVERLAP>) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        return fa.binaryVersion == 90;
    }();
    return yes;
}

/* Whether p's inputs are FP8 (the e4m3 kernel: F8Tiles) */
bool is_f8(const fa_problem *p) {
    return p->dtype == FA_DTYPE_F8_E4M3 || p->dtype == FA_DTYPE_F8_E5M2;
}
/* What the FP8 kernel does not take of p (NULL: it takes it); backend.c refuses these with
   FA_ERR_DTYPE, as nothing else runs FP8 on the GPU */
const char *f8_refusal(const fa_problem *p) {
    if (p->dtype != FA_DTYPE_F8_E4M3) return "f8e5m2 inputs (the FP8 kernel takes f8e4m3)";
    if (p->d != 128 && p->d != 256) return "this head dim (FP8 is built for 128 and 256)";
    if (p->cu_q) return "varlen (not built for FP8)";
    if (p->softcap > 0.f) return "softcap (not built for FP8)";
    if (p->alibi) return "ALiBi (not built for FP8)";
    if (p->odtype != FA_DTYPE_BF16 && p->odtype != FA_DTYPE_F16)
        return "this output dtype (FP8 writes bf16 or f16)";
    return NULL;
}

/* f(C{}) for the FP8 tiling of kernel head dim D (128 or 256) */
template <typename F> auto with_f8(int D, F f) {
    return D == 128 ? f(F8Tiles<128>::C{}) : f(F8Tiles<256>::C{});
}

/* Why this kernel cannot take p (NULL: it can). */
const char *refusal(const fa_problem *p, const fa_cuda_launch *l) {
    if (l->cc != 90) return "not an sm_90 GPU";
    const int D = kernel_dim(p->d);
    if (!D) return "head dims other than 64, 128, 256 (not yet)";
    if (is_f8(p)) {
        const char *why = f8_refusal(p);
        if (why) return why;
    }
    if (!p->cu_q && p->batch > 1 && (p->q.sb == 0 || p->k.sb == 0 || p->v.sb == 0))
        return "a batch stride of 0";
    if (!has_sm90a<Tiles<128>::C>()) return "this build (no sm_90a code)";
    if (!encode_fn()) return "no cuTensorMapEncodeTiled in this driver";
    return NULL;
}

/* kern (a kernel of tiling C) on grid blocks */
template <typename C, typename K>
cudaError_t launch_kernel(K kern, const Args &a, int grid, cudaStream_t st) {
    cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);
    if (e != cudaSuccess) return e;
    kern<<<grid, C::THREADS, C::SMEM, st>>>(a);
    return cudaGetLastError();
}
template <typename T, typename C>
cudaError_t launch(const Args &a, int sched, int grid, cudaStream_t st) {
    auto kern = sched == PINGPONG && C::NC == 2 ? fwd_sm90_kernel<T, C, PINGPONG>
                                                : fwd_sm90_kernel<T, C, OVERLAP>;
    return launch_kernel<C>(kern, a, grid, st);
}
/* f(C{}) for the series kernel's tiling of kernel head dim D */
template <typename F> auto with_serial(int D, F f) {
    switch (D) {
    case 64: return f(SerialTiles<64>::C{});
    case 128: return f(SerialTiles<128>::C{});
    default: return f(SerialTiles<256>::C{});
    }
}
/* f(C{}) for the tiling that runs p: FP8's, the series kernel's or Tiles<D>'s */
template <typename F> auto with_tiling(bool f8, bool serial, int D, bool lng, F f) {
    return f8 ? with_f8(D, f) : serial ? with_serial(D, f) : with_cfg(D, lng, f);
}

/* The choices forced on every later call (fa_sm90_fwd_force_set; zero: the table's). */
fa_sm90_fwd_force g_force;

#ifdef FA_BRINGUP
#include "fwd_sm90_bringup.cuh" /* forced() with the environment's A/B switches; trace_dump */
#else
fa_sm90_fwd_force forced() { return g_force; }
#endif

} // namespace sm90
} // namespace fa

extern "C" void fa_sm90_fwd_force_set(const fa_sm90_fwd_force *f) {
    fa::sm90::g_force = f ? *f : fa_sm90_fwd_force{};
}

extern "C" const char *fa_sm90_fwd_f8_refusal(const fa_problem *p) {
    return fa::sm90::f8_refusal(p);
}

extern "C" int fa_sm90_fwd_covers(const fa_problem *p) { return fa::sm90::kernel_dim(p->d) != 0; }

extern "C" fa_status fa_sm90_fwd(const fa_problem *p, fa_cuda_launch *l) {
    using namespace fa::sm90;
    const char *why = refusal(p, l);
    if (why) {
        snprintf(l->msg, sizeof l->msg, "the sm90 forward does not take %s", why);
        return FA_ERR_UNSUPPORTED;
    }
    const fa_sm90_fwd_force f = forced();
    const int D = kernel_dim(p->d);
    const bool f8 = is_f8(p); /* its one tiling, O stored by the threads */
    const bool masked = p->win_left >= 0 || p->win_right >= 0;
    const bool lng = f.tiles ? f.tiles == 2 : long_tiles(p, D, masked);
    /* varlen: one sequence of all the tokens, batch 1 */
    const int64_t nb = p->cu_q ? 1 : p->batch;
    const int64_t tq = p->cu_q ? p->total_q : p->seqlen_q, tk = p->cu_q ? p->total_k : p->seqlen_k;
    Args a;
    memset(&a, 0, sizeof a);
    /* O through the copy engine where its strides allow a map (else the threads store it) */
    a.o_tma = !f8 && make_map(&a.to, &p->o, p->dtype, D, p->heads_q, tq, nb, O_ROWS) == CUDA_SUCCESS;
    /* a forced tiling or schedule is the overlapped kernel's (the test entries that force them
       keep covering it), unless the series kernel is forced too */
    const int serial_choice = f.serial ? f.serial : f.tiles || f.schedule ? 2 : 0;
    const bool serial = !f8 && serial_for(p, D, serial_choice, masked, a.o_tma);
    const int BN = with_tiling(f8, serial, D, lng, [](auto c) { return decltype(c)::BN; });
    const int BM = with_tiling(f8, serial, D, lng, [](auto c) { return decltype(c)::BM; });
    const size_t smem = with_tiling(f8, serial, D, lng, [](auto c) { return decltype(c)::SMEM; });
    if (smem > (size_t)l->smem_optin) {
        snprintf(l->msg, sizeof l->msg,
                 "the sm90 forward's %dx%d tiling needs %zu bytes of shared memory per block, "
                 "the GPU gives %zu", BM, BN, smem, (size_t)l->smem_optin);
        return FA_ERR_UNSUPPORTED;
    }
    CUresult r = make_map(&a.tq, &p->q, p->dtype, D, p->heads_q, tq, nb, 64);
    if (r == CUDA_SUCCESS) r = make_map(&a.tk, &p->k, p->dtype, D, p->heads_kv, tk, nb, BN);
    if (r == CUDA_SUCCESS) r = make_map(&a.tv, &p->v, p->dtype, D, p->heads_kv, tk, nb, BN);
    if (r != CUDA_SUCCESS) {
        snprintf(l->msg, sizeof l->msg,
                 "the sm90 forward does not take these strides (tensor map error %d)", (int)r);
        return FA_ERR_UNSUPPORTED;
    }
    a.o = p->o.data;
    a.lse = (float *)p->lse;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    a.cu_q = p->cu_q;
    a.cu_k = p->cu_k;
    a.seqlen_q = (int)p->seqlen_q;
    a.seqlen_k = (int)p->seqlen_k;
    a.group = (int)p->group;
    a.m = fa::score_mods_of(p);
    a.q_descale = p->q_descale;
    a.k_descale = p->k_descale;
    a.v_descale = p->v_descale;
    a.ds_sb = p->descale_sb;

    /* the work tiles (tile_of): pairs grouped so that a group's K and V take at most
       l2mb MB of the L2 (the H100 has 50 MB) */
    a.heads = (int)p->heads_q;
    a.batch = (int)p->batch;
    a.mblocks = (int)((p->seqlen_q + BM - 1) / BM);
    const int64_t tiles = (int64_t)a.mblocks * a.heads * a.batch;
    const double kv_bytes = (f8 ? 2.0 : 4.0) * (double)p->seqlen_k * (double)D / (double)p->group;
    const double l2mb = f.pairs ? 0.0 : l2mb_for(masked, kv_bytes);
    const double fit = l2mb * 1024 * 1024 / (kv_bytes > 1 ? kv_bytes : 1);
    a.group_hb = (int)(fit < 1 ? 1 : fit > a.heads * a.batch ? a.heads * a.batch : fit);
    if (tiles > INT32_MAX / 2) { /* tile indices run up to tiles + grid in an int */
        snprintf(l->msg, sizeof l->msg, "the sm90 forward takes at most 2^30 query blocks");
        return FA_ERR_UNSUPPORTED;
    }
    a.tiles = (int)tiles;
    const int pairs = a.heads * a.batch, groups = (pairs + a.group_hb - 1) / a.group_hb;
    a.div_group = FastDiv::of((uint32_t)(a.group_hb * a.mblocks));
    a.div_heads = FastDiv::of((uint32_t)a.heads);
    a.div_gsz = FastDiv::of((uint32_t)a.group_hb);
    a.div_gsz_last = FastDiv::of((uint32_t)(pairs - (groups - 1) * a.group_hb));

    a.lazy = f8 ? LAZY_F8 : LAZY; /* FP8: P rounds to e4m3, exact only at the max (tune_sm90.h) */
    const bool uneven = a.m.win_left >= 0 || a.m.win_right >= 0 || p->cu_q;
    /* the ping-pong turns are written for two consumers */
    const int sched = BM != 128 || serial ? (int)OVERLAP
                      : f.schedule ? f.schedule - 1
                      : f8 ? (int)OVERLAP /* FP8: the ping-pong turns only forced (untimed) */
                           : schedule_of(p, D, masked);
    /* the persistent grid: one block per SM (or the forced count), its tiles in the dynamic
       order (a counter in the workspace) or the static one (dynamic_order) */
    const int nq = with_tiling(f8, serial, D, lng, [](auto c) { return decltype(c)::NQ; });
    const bool dynamic = l->ws && l->ws_bytes >= 4 && dynamic_order(p, uneven, nq);
    const int blocks = f.blocks > 0 ? f.blocks : l->num_sms > 0 ? l->num_sms : 1;
    const int grid = a.tiles > blocks ? blocks : a.tiles;
    static const char *const sched_name[] = {"", "_pingpong"};
    const cudaStream_t st = (cudaStream_t)l->stream;
    cudaError_t e = cudaSuccess;
    if (dynamic && grid < a.tiles) { /* the kernel leaves it zero (next_tile) */
        a.counter = (int *)l->ws;
        if (!fa_cuda_ws_zero(l, a.counter, sizeof(int)))
            e = cudaMemsetAsync(a.counter, 0, sizeof(int), st);
        l->left_zero = a.counter;
        l->left_zero_bytes = sizeof(int);
    }
    if (e == cudaSuccess && a.tiles > 0 && f8)
        e = with_f8(D, [&](auto c) {
            using C = decltype(c);
            const bool bf = p->odtype == FA_DTYPE_BF16;
            if (sched == PINGPONG)
                return bf ? launch_kernel<C>(fwd_sm90_kernel<__nv_fp8_e4m3, C, PINGPONG, __nv_bfloat16>, a, grid, st)
                          : launch_kernel<C>(fwd_sm90_kernel<__nv_fp8_e4m3, C, PINGPONG, __half>, a, grid, st);
            return bf ? launch_kernel<C>(fwd_sm90_kernel<__nv_fp8_e4m3, C, OVERLAP, __nv_bfloat16>, a, grid, st)
                      : launch_kernel<C>(fwd_sm90_kernel<__nv_fp8_e4m3, C, OVERLAP, __half>, a, grid, st);
        });
    else if (e == cudaSuccess && a.tiles > 0 && serial)
        e = with_serial(D, [&](auto c) {
            using C = decltype(c);
            return p->dtype == FA_DTYPE_BF16
                       ? launch_kernel<C>(fwd_sm90_serial_kernel<__nv_bfloat16, C>, a, grid, st)
                       : launch_kernel<C>(fwd_sm90_serial_kernel<__half, C>, a, grid, st);
        });
    else if (e == cudaSuccess && a.tiles > 0)
        e = with_cfg(D, lng, [&](auto c) {
            return p->dtype == FA_DTYPE_BF16 ? launch<__nv_bfloat16, decltype(c)>(a, sched, grid, st)
                                             : launch<__half, decltype(c)>(a, sched, grid, st);
        });
#ifdef FA_SM90_TRACE
    if (e == cudaSuccess) trace_dump(st);
#endif
    if (f8) /* the output's dtype too: FP8 writes either */
        snprintf(l->kernel, sizeof l->kernel, "sm90_fwd_f8e4m3_d%d_o%s%s_%dx%d%s%s", D,
                 fa_dtype_name(p->odtype), fa_cuda_mask_name(p), BM, BN, sched_name[sched],
                 grid == a.tiles ? "" : a.counter ? "_dynamic" : "_static");
    else
    snprintf(l->kernel, sizeof l->kernel, "sm90_fwd_d%d_%s%s_%dx%d%s%s", D,
             fa_dtype_name(p->dtype), fa_cuda_mask_name(p), BM, BN,
             serial ? "_serial" : sched_name[sched],
             grid == a.tiles ? "" : a.counter ? "_dynamic" : "_static");
    l->tile_q = BM;
    l->tile_k = BN;
    l->threads = with_tiling(f8, serial, D, lng, [](auto c) { return decltype(c)::THREADS; });
    if (e != cudaSuccess) {
        snprintf(l->msg, sizeof l->msg, "%s: %s", l->kernel, cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
