/*
 * cuda/fwd_sm90.cu — the Hopper forward (sm_90a), FlashAttention-3's structure in CUDA C with
 * inline PTX (wgmma.cuh):
 *
 *   warpgroup 0, the producer: one thread issues every load. Q (128 rows) once, then K and V
 *     tiles of 128 keys into a ring of STAGES slots in shared memory, by the copy engine (TMA,
 *     128-byte swizzle, zero fill past the tensor's end), each slot's copies completing on its
 *     `full` mbarrier; it waits on the slot's `empty` mbarrier before refilling it. It gives
 *     its registers away (setmaxnreg) and keeps 40.
 *   warpgroups 1 and 2, the consumers: 64 query rows each. Per key tile:
 *       S = Q K^T      wgmma m64n128k16, A and B from shared memory (K-major), 8 k-steps
 *       mask / online softmax in registers (running max and sum, O rescaled), P to 16 bits
 *                      in the A-fragment layout (C-to-A identity, ptx.cuh)
 *       O += P V       wgmma with A from registers, B = V from shared memory (MN-major)
 *     then release the slot (256 arrivals on `empty`).
 *
 * This first version serves head dim 128, fp16/bf16, BSHD, causal or not (bottom-right), GQA;
 * fa_sm90_fwd refuses everything else with a reason, and the dispatcher then runs the sm80
 * kernel and records why. Not yet: the ping-pong schedule between the consumers and the
 * overlap of one tile's softmax with the next tile's S product (issue 7).
 *
 * Shared memory (1024-byte aligned pieces; a 128-byte-swizzled tile of 64 columns is rows of
 * 128 bytes, so a 128-column tile is two such halves):
 *   Q   [consumer][half][64 rows][128 B]           32 KB
 *   K   [stage][half][128 keys][128 B]             32 KB per stage
 *   V   [stage][half][128 keys][128 B]             32 KB per stage
 *   mbarriers: q, full[STAGES], empty[STAGES]
 */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ptx.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A_DEVICE 1
#endif

namespace fa {
namespace sm90 {

constexpr int D = 128, BM = 128, BN = 128, STAGES = 2, THREADS = 384;
constexpr uint32_t Q_HALF = 64 * 128, Q_WG = 2 * Q_HALF;    /* bytes */
constexpr uint32_t KV_HALF = BN * 128, KV_TILE = 2 * KV_HALF;
constexpr uint32_t OFF_Q = 0, OFF_K = 2 * Q_WG, OFF_V = OFF_K + STAGES * KV_TILE;
constexpr uint32_t OFF_BAR = OFF_V + STAGES * KV_TILE;
constexpr size_t SMEM = OFF_BAR + 8 * (1 + 2 * STAGES) + 1024; /* + aligning the base */
static_assert(OFF_K % 1024 == 0 && OFF_V % 1024 == 0 && KV_HALF % 1024 == 0 && OFF_Q == 0,
              "swizzled tiles start on 1024-byte boundaries");

struct Args {
    CUtensorMap tq, tk, tv; /* (d, head, token, batch); boxes (64, 1, 64 or 128, 1) */
    void *o;
    float *lse;
    int64_t o_sb, o_st, o_sh, lse_sb, lse_sh, lse_st;
    int seqlen_q, seqlen_k, group;
    int causal; /* bottom-right: key j visible to query i iff j <= i + seqlen_k - seqlen_q */
    float scale_log2;
    uint32_t v_lead, v_stride; /* V's descriptor offsets (see desc_sw128) */
};

template <typename T>
__global__ void __launch_bounds__(THREADS, 1) fwd_sm90_kernel(const __grid_constant__ Args a) {
#ifdef FA_SM90A_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t bar_q = base + OFF_BAR, bar_full = bar_q + 8, bar_empty = bar_full + 8 * STAGES;
    const int tid = threadIdx.x, wg = tid / 128;
    const int m_block = gridDim.x - 1 - blockIdx.x; /* longest causal rows first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int sq = a.seqlen_q, sk = a.seqlen_k, diag = sk - sq, row0 = m_block * BM;
    /* key tiles [0, ntiles): under the causal mask the block's last row sees keys up to
       row0 + BM - 1 + diag; tiles past that are never loaded */
    const int n_end = a.causal ? min(sk, row0 + BM + diag) : sk;
    const int ntiles = n_end > 0 ? (n_end + BN - 1) / BN : 0;

    if (tid == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, 256);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        regs_dec<40>();
        if (tid == 0) {
            mbar_expect_tx(bar_q, 2 * Q_WG);
            for (int c = 0; c < 2; c++)
                for (int x = 0; x < 2; x++)
                    tma_load4(base + OFF_Q + c * Q_WG + x * Q_HALF, &a.tq, bar_q, x * 64, h,
                              row0 + 64 * c, b);
            /* tiles from the last (the diagonal one under a causal mask) to the first */
            for (int it = 0; it < ntiles; it++) {
                const int n = ntiles - 1 - it, s = it % STAGES;
                const uint32_t ph = (uint32_t)(it / STAGES) & 1u;
                mbar_wait(bar_empty + 8 * s, ph ^ 1u); /* a fresh barrier passes parity 1 */
                mbar_expect_tx(bar_full + 8 * s, 2 * KV_TILE);
                for (int x = 0; x < 2; x++) {
                    tma_load4(base + OFF_K + s * KV_TILE + x * KV_HALF, &a.tk, bar_full + 8 * s,
                              x * 64, hk, n * BN, b);
                    tma_load4(base + OFF_V + s * KV_TILE + x * KV_HALF, &a.tv, bar_full + 8 * s,
                              x * 64, hk, n * BN, b);
                }
            }
        }
        return;
    }
    regs_inc<232>();

    /* ---- consumer warpgroup c: query rows row0 + 64 c .. + 63 ---- */
    const int c = wg - 1, wtid = tid - 128 * wg, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int r_lo = row0 + 64 * c + 16 * warp + g; /* this thread's rows: r_lo, r_lo + 8 */
    const uint32_t sQ = base + OFF_Q + c * Q_WG;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    mbar_wait(bar_q, 0);
    for (int it = 0; it < ntiles; it++) {
        const int n = ntiles - 1 - it, s = it % STAGES, kcol0 = n * BN;
        mbar_wait(bar_full + 8 * s, (uint32_t)(it / STAGES) & 1u);
        const uint32_t sK = base + OFF_K + s * KV_TILE, sV = base + OFF_V + s * KV_TILE;

        /* S = Q K^T: k-step kk reads 32 bytes into the 128-byte rows of half kk / 4 */
        float sc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) sc[i] = 0.f;
        wg_pin(sc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t off = (kk % 4) * 32u;
            const uint64_t da = desc_sw128(sQ + (kk / 4) * Q_HALF + off, 16, 1024);
            const uint64_t db = desc_sw128(sK + (kk / 4) * KV_HALF + off, 16, 1024);
            Wgmma<T>::ss(sc, da, db, 1);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin(sc);

        /* masks: keys past the sequence, and past the diagonal under the causal mask */
        const bool edge = kcol0 + BN > sk || (a.causal && kcol0 + BN - 1 > row0 + diag);
        if (edge) {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = kcol0 + 8 * j + 2 * t4 + (e & 1), row = r_lo + 8 * (e >> 1);
                    if (col >= sk || (a.causal && col > row + diag)) sc[4 * j + e] = -INFINITY;
                }
        }

        /* online softmax; P leaves as A fragments: k-step kk covers n8 tiles 2kk, 2kk+1 */
        uint32_t pa[8][4];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 16; j++) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
            mx = quad_max(mx) * a.scale_log2;
            const float m_new = fmaxf(m[hr], mx);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = fast_exp2(m[hr] - m_use);
            m[hr] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float p0 = fast_exp2(fmaf(sc[4 * j + 2 * hr], a.scale_log2, -m_use));
                const float p1 = fast_exp2(fmaf(sc[4 * j + 2 * hr + 1], a.scale_log2, -m_use));
                sum += p0 + p1;
                pa[j / 2][hr + 2 * (j % 2)] = pack2<T>(p0, p1);
            }
            l[hr] = l[hr] * alpha + sum;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                o[4 * j + 2 * hr] *= alpha;
                o[4 * j + 2 * hr + 1] *= alpha;
            }
        }

        /* O += P V: k-step kk is keys 16kk.. = rows 16kk.. of both V halves (16 KB apart) */
        wg_pin(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            Wgmma<T>::rs(o, pa[kk], desc_sw128(sV + kk * 16 * 128, a.v_lead, a.v_stride), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin(o);
        mbar_arrive(bar_empty + 8 * s); /* this thread is done with the slot */
    }

    /* O / l and LSE = m ln2 + log l; rows past the sequence are not stored */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = r_lo + 8 * hr;
        const float lt = quad_sum(l[hr]);
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        if (row >= sq) continue;
        T *orow = (T *)a.o + (int64_t)b * a.o_sb + (int64_t)row * a.o_st + (int64_t)h * a.o_sh;
#pragma unroll
        for (int j = 0; j < 16; j++)
            *(uint32_t *)(orow + 8 * j + 2 * t4) =
                pack2<T>(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
        if (a.lse && t4 == 0)
            a.lse[(int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + (int64_t)row * a.lse_st] =
                lt > 0.f ? m[hr] * 0.6931471805599453f + logf(lt) : -INFINITY;
    }
#endif
}

/* cuTensorMapEncodeTiled, through the runtime (the library links no libcuda) */
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

/* The 4-D map (d, head, token, batch) of a BSHD operand, boxes of 64 columns x `rows`. */
CUresult make_map(CUtensorMap *m, const fa_operand *op, fa_dtype dt, int64_t heads,
                  int64_t tokens, int64_t batch, int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)tokens,
                                (cuuint64_t)batch};
    /* a dimension of length 1 is never stepped, and its stride may come as anything (0
       included, which the encoder refuses): give it the packed one */
    const int64_t sh = heads > 1 ? op->sh : D, sb = batch > 1 ? op->sb : op->st * tokens;
    const cuuint64_t strides[3] = {(cuuint64_t)sh * 2, (cuuint64_t)op->st * 2, (cuuint64_t)sb * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, estr[4] = {1, 1, 1, 1};
    return encode_fn()(m, dt == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                       4, op->data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* Why this kernel cannot take p (NULL: it can). */
const char *refusal(const fa_problem *p, const fa_cuda_launch *l) {
    if (l->cc != 90) return "not an sm_90 GPU";
    if (p->d != 128) return "head dim other than 128 (not yet)";
    if (p->cu_q) return "varlen (not yet)";
    if (p->softcap > 0.f || p->alibi) return "softcap or ALiBi (not yet)";
    if (p->win_left >= 0 || p->win_right > 0) return "a sliding window (not yet)";
    if (p->batch > 1 && (p->q.sb == 0 || p->k.sb == 0 || p->v.sb == 0))
        return "a batch stride of 0";
    if (SMEM > l->smem_optin) return "shared memory";
    /* a build without sm_90a code has only the empty sm_80 body of the kernel */
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, fwd_sm90_kernel<__half>) != cudaSuccess || fa.binaryVersion != 90) {
        cudaGetLastError();
        return "this build (no sm_90a code)";
    }
    if (!encode_fn()) return "no cuTensorMapEncodeTiled in this driver";
    return NULL;
}

template <typename T> cudaError_t launch(const Args &a, int mblocks, int heads, int batch,
                                         cudaStream_t st) {
    auto kern = fwd_sm90_kernel<T>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)SMEM);
    if (e != cudaSuccess) return e;
    kern<<<dim3(mblocks, heads, batch), THREADS, SMEM, st>>>(a);
    return cudaGetLastError();
}

} // namespace sm90
} // namespace fa

extern "C" fa_status fa_sm90_fwd(const fa_problem *p, fa_cuda_launch *l) {
    using namespace fa::sm90;
    const char *why = refusal(p, l);
    if (why) {
        snprintf(l->msg, sizeof l->msg, "the sm90 forward does not take %s", why);
        return FA_ERR_UNSUPPORTED;
    }
    Args a;
    memset(&a, 0, sizeof a);
    CUresult r = make_map(&a.tq, &p->q, p->dtype, p->heads_q, p->seqlen_q, p->batch, 64);
    if (r == CUDA_SUCCESS)
        r = make_map(&a.tk, &p->k, p->dtype, p->heads_kv, p->seqlen_k, p->batch, BN);
    if (r == CUDA_SUCCESS)
        r = make_map(&a.tv, &p->v, p->dtype, p->heads_kv, p->seqlen_k, p->batch, BN);
    if (r != CUDA_SUCCESS) {
        snprintf(l->msg, sizeof l->msg,
                 "the sm90 forward does not take these strides (tensor map error %d)", (int)r);
        return FA_ERR_UNSUPPORTED;
    }
    a.o = p->o.data;
    a.lse = (float *)p->lse;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    a.seqlen_q = (int)p->seqlen_q;
    a.seqlen_k = (int)p->seqlen_k;
    a.group = (int)p->group;
    a.causal = p->win_right == 0;
    a.scale_log2 = p->scale * 1.4426950408889634f;
    a.v_lead = KV_HALF;
    a.v_stride = 1024;
    /* bring-up aid until the kernel has run on a GPU: the two offsets of the MN-major V
       descriptor swapped (FLASHATTN_SM90_VDESC=swap) */
    const char *vd = getenv("FLASHATTN_SM90_VDESC");
    if (vd && strcmp(vd, "swap") == 0) a.v_lead = 1024, a.v_stride = KV_HALF;

    const int mblocks = (int)((p->seqlen_q + BM - 1) / BM);
    const cudaStream_t st = (cudaStream_t)l->stream;
    cudaError_t e = cudaSuccess;
    if (mblocks > 0)
        e = p->dtype == FA_DTYPE_BF16
                ? launch<__nv_bfloat16>(a, mblocks, (int)p->heads_q, (int)p->batch, st)
                : launch<__half>(a, mblocks, (int)p->heads_q, (int)p->batch, st);
    snprintf(l->kernel, sizeof l->kernel, "sm90_fwd_d128_%s%s", fa_dtype_name(p->dtype),
             a.causal ? "_causal" : "");
    l->tile_q = BM;
    l->tile_k = BN;
    l->threads = THREADS;
    if (e != cudaSuccess) {
        snprintf(l->msg, sizeof l->msg, "%s: %s", l->kernel, cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
