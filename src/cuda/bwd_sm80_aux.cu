/*
 * cuda/bwd_sm80_aux.cu — the backward's memory-bound passes around the main kernel:
 *   pre:      D_i = rowsum(dO_i * O_i) (fp32 from the 16-bit values), LSE_i * log2(e) (+inf
 *             for rows without keys and for the padding rows of the last tile), and zeroes
 *             of the fp32 dQ accumulator;
 *   post dQ:  accumulator (8x8-blocked) * scale -> dq in its dtype and strides;
 *   post dKV: the GQA splits' fp32 partials of dK, dV summed in split order -> dk, dv.
 * Workspace layout: bwd_sm80.cu.
 */
#include "bwd_sm80.cuh"
#include "ptx.cuh"

namespace fa {
namespace bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kPostRows = 64;

/* Block (row tile of kRowPad, query head, sequence); 8 lanes per row, 32 rows per pass. */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    bwd_pre_kernel(const __grid_constant__ BwdArgs a, int D, int zero_dq) {
    const int i0 = blockIdx.x * kRowPad, h = blockIdx.y, b = blockIdx.z;
    const Seq s = seq_of(a, b);
    if (i0 >= s.sq) return; /* the tile holding the last row writes the padding */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sub = lane >> 3, cl = lane & 7, nch = a.d / 8;
    const int64_t w = (int64_t)h * a.ws_rows + ws_row0(a, b, s.q0) + i0;

    for (int pass = 0; pass < kRowPad / 32; pass++) {
        const int r = pass * 32 + warp * 4 + sub, i = i0 + r;
        float acc = 0.f;
        if (i < s.sq) {
            const T *orow = (const T *)a.o + s.bq * a.o_sb + (int64_t)(s.q0 + i) * a.o_st +
                            (int64_t)h * a.o_sh;
            const T *grow = (const T *)a.dout + s.bq * a.do_sb + (int64_t)(s.q0 + i) * a.do_st +
                            (int64_t)h * a.do_sh;
            for (int c = cl; c < nch; c += 8) {
                const uint4 ov = *(const uint4 *)(orow + c * 8);
                const uint4 gv = *(const uint4 *)(grow + c * 8);
                const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float2 x = unpack2<T>(ow[k]), y = unpack2<T>(gw[k]);
                    acc = fmaf(x.x, y.x, acc);
                    acc = fmaf(x.y, y.y, acc);
                }
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        if (cl == 0) {
            float l2 = INFINITY;
            if (i < s.sq) {
                const float l = a.lse[s.bq * a.lse_sb + (int64_t)h * a.lse_sh +
                                      (int64_t)(s.q0 + i) * a.lse_st];
                l2 = l == -INFINITY ? INFINITY : l * kLog2e;
            }
            a.dsum[w + r] = i < s.sq ? acc : 0.f;
            a.lse2[w + r] = l2;
        }
    }

    if (zero_dq) { /* the whole tile: the main kernel adds zeros into its padding rows */
        const int n = kRowPad * D / 4;
        float4 *dst = (float4 *)(a.dq_acc + w * D);
        for (int k = tid; k < n; k += kThreads) dst[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <typename T> __device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
    uint4 o;
    o.x = pack2<T>(x[0], x[1]);
    o.y = pack2<T>(x[2], x[3]);
    o.z = pack2<T>(x[4], x[5]);
    o.w = pack2<T>(x[6], x[7]);
    return o;
}

/* Block (kPostRows query rows, query head, sequence); a thread per 8-column chunk of a row,
   read from the accumulator's 8x8 blocks (bwd_sm80.cu), the 8 rows of a block in
   neighbouring lanes. */
template <typename T>
__global__ void __launch_bounds__(kThreads) bwd_post_dq_kernel(const __grid_constant__ BwdArgs a, int D) {
    static_assert(kPostRows % 8 == 0, "whole 8-row blocks");
    const int i0 = blockIdx.x * kPostRows, h = blockIdx.y, b = blockIdx.z;
    const Seq s = seq_of(a, b);
    if (i0 >= s.sq) return;
    const int rows = min(kPostRows, s.sq - i0), nch = a.d / 8;
    const float *src = a.dq_acc + ((int64_t)h * a.ws_rows + ws_row0(a, b, s.q0) + i0) * D;
    T *dst = (T *)a.dq + s.bq * a.dq_sb + (int64_t)(s.q0 + i0) * a.dq_st + (int64_t)h * a.dq_sh;
    for (int idx = threadIdx.x; idx < kPostRows * nch; idx += kThreads) {
        const int g = idx & 7, c = (idx >> 3) % nch, rb = (idx >> 3) / nch, r = rb * 8 + g;
        if (r >= rows) continue;
        const float4 *p = (const float4 *)(src + (int64_t)rb * 8 * D + c * 64 + g * 8);
        const float4 u = p[0], v = p[1];
        const float x[8] = {u.x * a.scale, u.y * a.scale, u.z * a.scale, u.w * a.scale,
                            v.x * a.scale, v.y * a.scale, v.z * a.scale, v.w * a.scale};
        *(uint4 *)(dst + (int64_t)r * a.dq_st + c * 8) = pack8<T>(x);
    }
}

/* Block (kPostRows keys, kv head, sequence); the splits are summed in index order, so the
   result does not depend on scheduling. */
template <typename T>
__global__ void __launch_bounds__(kThreads) bwd_post_dkv_kernel(const __grid_constant__ BwdArgs a, int D) {
    const int j0 = blockIdx.x * kPostRows, hkv = blockIdx.y, b = blockIdx.z;
    const Seq s = seq_of(a, b);
    if (j0 >= s.sk) return;
    const int rows = min(kPostRows, s.sk - j0), nch = a.d / 8;
    const int64_t split_stride = (int64_t)a.heads_kv * a.kv_rows * D;
    const int64_t prow = (int64_t)hkv * a.kv_rows + kv_row0(a, b, s.k0) + j0;
    T *dkg = (T *)a.dk + s.bk * a.dk_sb + (int64_t)(s.k0 + j0) * a.dk_st + (int64_t)hkv * a.dk_sh;
    T *dvg = (T *)a.dv + s.bk * a.dv_sb + (int64_t)(s.k0 + j0) * a.dv_st + (int64_t)hkv * a.dv_sh;
    for (int idx = threadIdx.x; idx < rows * nch; idx += kThreads) {
        const int r = idx / nch, c = idx % nch;
        float xk[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        float xv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        const int64_t off = (prow + r) * D + c * 8;
        for (int sp = 0; sp < a.nsplit; sp++) {
            const float4 *pk = (const float4 *)(a.dk_part + sp * split_stride + off);
            const float4 *pv = (const float4 *)(a.dv_part + sp * split_stride + off);
            const float4 k0 = pk[0], k1 = pk[1], v0 = pv[0], v1 = pv[1];
            xk[0] += k0.x, xk[1] += k0.y, xk[2] += k0.z, xk[3] += k0.w;
            xk[4] += k1.x, xk[5] += k1.y, xk[6] += k1.z, xk[7] += k1.w;
            xv[0] += v0.x, xv[1] += v0.y, xv[2] += v0.z, xv[3] += v0.w;
            xv[4] += v1.x, xv[5] += v1.y, xv[6] += v1.z, xv[7] += v1.w;
        }
        *(uint4 *)(dkg + (int64_t)r * a.dk_st + c * 8) = pack8<T>(xk);
        *(uint4 *)(dvg + (int64_t)r * a.dv_st + c * 8) = pack8<T>(xv);
    }
}

} // namespace

cudaError_t run_pre(const BwdArgs &a, const Plan &pl, fa_dtype dt, bool zero_dq, cudaStream_t st) {
    const dim3 grid((a.seqlen_q + kRowPad - 1) / kRowPad, a.heads_q, a.batch);
    if (grid.x == 0) return cudaSuccess;
    if (dt == FA_DTYPE_BF16)
        bwd_pre_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(a, pl.D, zero_dq);
    else
        bwd_pre_kernel<__half><<<grid, kThreads, 0, st>>>(a, pl.D, zero_dq);
    return cudaGetLastError();
}

cudaError_t run_post_dq(const BwdArgs &a, const Plan &pl, fa_dtype dt, cudaStream_t st) {
    const dim3 grid((a.seqlen_q + kPostRows - 1) / kPostRows, a.heads_q, a.batch);
    if (grid.x == 0) return cudaSuccess;
    if (dt == FA_DTYPE_BF16)
        bwd_post_dq_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(a, pl.D);
    else
        bwd_post_dq_kernel<__half><<<grid, kThreads, 0, st>>>(a, pl.D);
    return cudaGetLastError();
}

cudaError_t run_post_dkv(const BwdArgs &a, const Plan &pl, fa_dtype dt, cudaStream_t st) {
    const dim3 grid((a.seqlen_k + kPostRows - 1) / kPostRows, a.heads_kv, a.batch);
    if (grid.x == 0) return cudaSuccess;
    if (dt == FA_DTYPE_BF16)
        bwd_post_dkv_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(a, pl.D);
    else
        bwd_post_dkv_kernel<__half><<<grid, kThreads, 0, st>>>(a, pl.D);
    return cudaGetLastError();
}

} // namespace bwd
} // namespace fa
