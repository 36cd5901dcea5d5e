/*
 * cuda/bwd_sm80.cu — fa_sm80_bwd and its workspace: the FlashAttention-2 backward on sm_80+
 * (mma.sync m16n8k16, ldmatrix, cp.async; no CUTLASS); and fa_sm90_bwd, the same passes with
 * the Hopper main kernel (bwd_sm90.cuh: wgmma, TMA) in place of step 2 for d 64, 128 and 256.
 *
 * Kernels, in stream order:
 *   1. pre (bwd_sm80_aux.cu): D_i = rowsum(dO * O) and LSE * log2(e) per query row into the
 *      workspace; zeroes the fp32 dQ accumulator.
 *   2. main (bwd_sm80_main.cuh): grid (key tile, kv head x split, sequence), 8 warps. K_j, V_j
 *      stay in shared memory; the block walks every (query head of its split, query tile that
 *      can see key tile j: with bottom-right aligned masks that is one computable run of
 *      rows), recomputes S = Q K^T and P = exp(S - LSE), and accumulates dV += P^T dO and
 *      dK += dS^T Q in registers, dS = P * (dP - D), dP = dO V^T. dQ_i += dS K goes to the
 *      fp32 accumulator with red.global.add (not in deterministic mode).
 *   3. deterministic mode: dq (bwd_sm80_dq.cuh), a block per query tile looping over key tiles
 *      (recomputing S, P, dP, dS), so dQ is summed in one fixed order without atomics.
 *      Otherwise post dQ: accumulator * scale -> dq.
 *   4. post dKV when the GQA group was split: partials summed in split order -> dk, dv.
 *
 * Tiles (query rows x keys, 8 warps): d32/d64 128 x 128, d96/d128 64 x 128, d192/d256 64 x 64;
 * Q and dO double-buffered (all head dims on H100; on A100's 163 KB d64/d128/d192/d256 run
 * single-buffered). Smaller tiles for 99 KB parts (sm_86/89; none for d256). Shared tiles have
 * rows padded by 16 bytes: conflict-free ldmatrix with immediate-offset addressing.
 *
 * GQA: a block sums dK/dV over the query heads of its kv head in registers, so dK/dV are
 * deterministic and need no workspace. When kv heads x key tiles would leave the GPU
 * underfilled (MQA, short sequences), the group's heads are split over nsplit blocks that
 * write fp32 partials, summed in order by post dKV.
 *
 * Workspace (each region 256-byte aligned, plus 256 bytes to align the base):
 *   dsum   f32 [heads_q][ws_rows]        D_i
 *   lse2   f32 [heads_q][ws_rows]        LSE_i * log2(e), +inf where LSE = -inf or padding
 *   dq_acc f32 [heads_q][ws_rows][D]     unscaled dQ (not in deterministic mode), each 8 rows
 *                                        x 8 columns block stored as 64 consecutive floats
 *                                        (rows counted from each sequence's first): one
 *                                        warp's red.v2 of an m16n8 C fragment half then adds
 *                                        256 contiguous bytes, one L2 request per 128 bytes
 *                                        instead of one per row
 *   dk_part, dv_part f32 [nsplit][heads_kv][kv_rows][D]  (only when nsplit > 1)
 * Rows: BSHD: b * round_up(seqlen_q, 128) + i; varlen: round_up4(cu_q[b]) + 132 b + i, so each
 * sequence owns whole 128-row tiles and row starts stay 16-byte aligned; ws_rows is sized from
 * total_q (varlen) so the workspace does not depend on max_seqlen. kv_rows: the key token index
 * (b * seqlen_k + j, or the global token for varlen). D is the kernel head dim.
 */
#include <stdio.h>

#include "bwd_sm80.cuh"
#include "bwd_sm90.cuh"

namespace {

using namespace fa::bwd;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Shape {
    int bm, bn;
    size_t smem;
};

template <typename C> Shape shape_of() { return Shape{C::BM, C::BN, C::SMEM}; }

/* out[0..2]: Big, Mid, Small; out[3..4]: Dq, DqSmall */
template <int D> void shapes(Shape out[5]) {
    out[0] = shape_of<typename Tiles<D>::Big>();
    out[1] = shape_of<typename Tiles<D>::Mid>();
    out[2] = shape_of<typename Tiles<D>::Small>();
    out[3] = shape_of<typename Tiles<D>::Dq>();
    out[4] = shape_of<typename Tiles<D>::DqSmall>();
}

Plan make_plan(const fa_problem *p, const fa_cuda_launch *l) {
    Plan pl = {};
    pl.D = fa_cuda_kernel_dim(p->d);
    Shape sh[5];
    switch (pl.D) {
    case 32: shapes<32>(sh); break;
    case 64: shapes<64>(sh); break;
    case 96: shapes<96>(sh); break;
    case 128: shapes<128>(sh); break;
    case 192: shapes<192>(sh); break;
    default: shapes<256>(sh); break;
    }
    pl.cfg = -1;
    for (int i = 0; i < 3 && pl.cfg < 0; i++)
        if (sh[i].smem <= l->smem_optin) pl.cfg = i;
    const Shape &use = sh[pl.cfg < 0 ? 2 : pl.cfg]; /* none fits: report the smallest */
    pl.bm = use.bm;
    pl.bn = use.bn;
    pl.smem = use.smem;
    pl.dq_cfg = sh[3].smem <= l->smem_optin ? 0 : sh[4].smem <= l->smem_optin ? 1 : -1;
    pl.dq_smem = sh[pl.dq_cfg == 1 ? 4 : 3].smem;

    const bool varlen = p->cu_q != NULL;
    const int64_t batch = p->batch, hq = p->heads_q, hkv = p->heads_kv, group = p->group;
    if (varlen) {
        pl.sq_pad = 0;
        pl.ws_rows = round_up(p->total_q + (int64_t)kVarlenGap * batch, 4);
        pl.kv_rows = p->total_k;
    } else {
        pl.sq_pad = (int)round_up(p->seqlen_q, kRowPad);
        pl.ws_rows = batch * pl.sq_pad;
        pl.kv_rows = batch * p->seqlen_k;
    }

    /* Split the GQA group when the grid would not give every SM two blocks. Only totals that
       the workspace query and the launch both know go in (varlen: total_k, not the maximum). */
    const int64_t ktiles = varlen ? (p->total_k + pl.bn - 1) / pl.bn
                                  : batch * ((p->seqlen_k + pl.bn - 1) / pl.bn);
    const int64_t blocks = ktiles * hkv, target = 2 * (int64_t)(l->num_sms > 0 ? l->num_sms : 1);
    pl.nsplit = 1;
    pl.heads_per_split = (int)group;
    if (group > 1 && blocks < target) {
        int64_t want = blocks > 0 ? (target + blocks - 1) / blocks : group;
        if (want > group) want = group;
        pl.heads_per_split = (int)((group + want - 1) / want);
        pl.nsplit = (int)((group + pl.heads_per_split - 1) / pl.heads_per_split);
    }

    size_t off = 0;
    auto take = [&off](int64_t bytes) {
        const size_t o = off;
        off += (size_t)round_up(bytes, 256);
        return o;
    };
    pl.off_dsum = take(hq * pl.ws_rows * 4);
    pl.off_lse2 = take(hq * pl.ws_rows * 4);
    pl.off_dq = p->deterministic ? 0 : take(hq * pl.ws_rows * pl.D * 4);
    pl.off_dk = pl.off_dv = 0;
    if (pl.nsplit > 1) {
        pl.off_dk = take((int64_t)pl.nsplit * hkv * pl.kv_rows * pl.D * 4);
        pl.off_dv = take((int64_t)pl.nsplit * hkv * pl.kv_rows * pl.D * 4);
    }
    pl.bytes = off + 256;
    return pl;
}

fa_status fail(fa_cuda_launch *l, cudaError_t e, const char *what) {
    snprintf(l->msg, sizeof l->msg, "%s (%s): %s", l->kernel, what, cudaGetErrorString(e));
    return FA_ERR_CUDA;
}

} // namespace

extern "C" size_t fa_sm80_bwd_workspace(const fa_problem *p, const fa_cuda_launch *l) {
    return make_plan(p, l).bytes;
}

/* The backward's kernels in order; hopper: the main kernel is bwd_sm90.cuh's, which first
   checks that it can take p (FA_ERR_UNSUPPORTED with the reason, nothing queued, if not). */
static fa_status run_bwd(const fa_problem *p, fa_cuda_launch *l, bool hopper) {
    Plan pl = make_plan(p, l);
    const bool det = p->deterministic != 0;
    Sm90Args g;
    pl.drop = p->drop_p > 0; /* the dispatcher bounded the counter words (dispatch.c) */
    if (hopper && pl.drop) { /* the backend never asks; refused rather than run undropped */
        snprintf(l->msg, sizeof l->msg, "the sm90 backward has no dropout");
        return FA_ERR_UNSUPPORTED;
    }
    if (hopper) {
        int bm = 0;
        const char *why = sm90_bwd_prepare(p, l, &g, &bm);
        if (why) {
            snprintf(l->msg, sizeof l->msg, "the sm90 backward does not take %s", why);
            return FA_ERR_UNSUPPORTED;
        }
        pl.sm90 = true;
        pl.bm = bm;
        pl.bn = 128;
    }
    snprintf(l->kernel, sizeof l->kernel, "%s_bwd_d%d_%s%s%s%s", hopper ? "sm90" : "sm80", pl.D,
             fa_dtype_name(p->dtype), fa_cuda_mask_name(p), det ? "_det" : "",
             pl.drop ? "_dropout" : "");
    l->tile_q = pl.bm;
    l->tile_k = pl.bn;
    l->threads = 256;
    if (pl.cfg < 0 || (det && pl.dq_cfg < 0)) {
        snprintf(l->msg, sizeof l->msg,
                 "%s needs %zu bytes of shared memory per block; this GPU allows %zu", l->kernel,
                 pl.cfg < 0 ? pl.smem : pl.dq_smem, l->smem_optin);
        return FA_ERR_UNSUPPORTED;
    }
    if (!p->lse) {
        snprintf(l->msg, sizeof l->msg, "%s: the backward needs the forward's LSE", l->kernel);
        return FA_ERR_INVALID_ARGUMENT;
    }
    if (!l->ws || l->ws_bytes < pl.bytes) {
        snprintf(l->msg, sizeof l->msg, "%s: workspace of %zu bytes, needs %zu", l->kernel,
                 l->ws_bytes, pl.bytes);
        return FA_ERR_WORKSPACE;
    }
    char *base = (char *)(((uintptr_t)l->ws + 255) & ~(uintptr_t)255);

    BwdArgs a;
    a.q = p->q.data, a.k = p->k.data, a.v = p->v.data, a.o = p->o.data, a.dout = p->dout.data;
    a.dq = p->dq.data, a.dk = p->dk.data, a.dv = p->dv.data;
    a.lse = (const float *)p->lse;
    a.q_sb = p->q.sb, a.q_st = p->q.st, a.q_sh = p->q.sh;
    a.k_sb = p->k.sb, a.k_st = p->k.st, a.k_sh = p->k.sh;
    a.v_sb = p->v.sb, a.v_st = p->v.st, a.v_sh = p->v.sh;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.do_sb = p->dout.sb, a.do_st = p->dout.st, a.do_sh = p->dout.sh;
    a.dq_sb = p->dq.sb, a.dq_st = p->dq.st, a.dq_sh = p->dq.sh;
    a.dk_sb = p->dk.sb, a.dk_st = p->dk.st, a.dk_sh = p->dk.sh;
    a.dv_sb = p->dv.sb, a.dv_st = p->dv.st, a.dv_sh = p->dv.sh;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    a.cu_q = p->cu_q, a.cu_k = p->cu_k;
    a.batch = (int)p->batch, a.heads_q = (int)p->heads_q, a.heads_kv = (int)p->heads_kv;
    a.group = (int)p->group, a.d = (int)p->d;
    a.seqlen_q = (int)p->seqlen_q, a.seqlen_k = (int)p->seqlen_k;
    /* normalised by the dispatcher (rows.h): -1, or below the longest sequence (< 2^30) */
    a.win_left = (int)p->win_left;
    a.win_right = (int)p->win_right;
    a.scale = p->scale;
    a.scale_log2 = p->scale * kLog2e;
    a.softcap = p->softcap > 0.f ? p->softcap : 0.f;
    a.softcap_inv = p->softcap > 0.f ? p->scale / p->softcap : 0.f;
    a.alibi = p->alibi, a.alibi_sb = p->alibi_sb;
    a.dsum = (float *)(base + pl.off_dsum);
    a.lse2 = (float *)(base + pl.off_lse2);
    a.dq_acc = det ? nullptr : (float *)(base + pl.off_dq);
    a.dk_part = pl.nsplit > 1 ? (float *)(base + pl.off_dk) : nullptr;
    a.dv_part = pl.nsplit > 1 ? (float *)(base + pl.off_dv) : nullptr;
    a.ws_rows = pl.ws_rows, a.kv_rows = pl.kv_rows, a.sq_pad = pl.sq_pad;
    a.nsplit = pl.nsplit, a.heads_per_split = pl.heads_per_split;
    a.drop.d = fa_drop_init(p->drop_seed, p->drop_offset, p->drop_p);
    a.drop.scale = fa_drop_scale(p->drop_p);
    a.drop.heads_q = (int)p->heads_q;

    const cudaStream_t st = (cudaStream_t)l->stream;
    cudaError_t e = run_pre(a, pl, p->dtype, !det, st);
    if (e != cudaSuccess) return fail(l, e, "pre");
    if (hopper) {
        g.a = a;
        e = run_sm90_main(g, p->dtype, det, st);
        if (e != cudaSuccess) return fail(l, e, "main");
    }
    switch (pl.D) {
    case 32: e = run_d32(a, pl, p->dtype, det, st); break;
    case 64: e = run_d64(a, pl, p->dtype, det, st); break;
    case 96: e = run_d96(a, pl, p->dtype, det, st); break;
    case 128: e = run_d128(a, pl, p->dtype, det, st); break;
    case 192: e = run_d192(a, pl, p->dtype, det, st); break;
    default: e = run_d256(a, pl, p->dtype, det, st); break;
    }
    if (e != cudaSuccess) return fail(l, e, det ? "main, dq" : "main");
    if (!det) {
        e = run_post_dq(a, pl, p->dtype, st);
        if (e != cudaSuccess) return fail(l, e, "post dq");
    }
    if (pl.nsplit > 1) {
        e = run_post_dkv(a, pl, p->dtype, st);
        if (e != cudaSuccess) return fail(l, e, "post dkv");
    }
    return FA_OK;
}

extern "C" fa_status fa_sm80_bwd(const fa_problem *p, fa_cuda_launch *l) { return run_bwd(p, l, false); }
extern "C" fa_status fa_sm90_bwd(const fa_problem *p, fa_cuda_launch *l) { return run_bwd(p, l, true); }
extern "C" int fa_sm90_bwd_covers(const fa_problem *p) { return fa::bwd::sm90_bwd_covers(p); }
