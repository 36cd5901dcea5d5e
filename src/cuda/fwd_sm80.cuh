/*
 * cuda/fwd_sm80.cuh — the FlashAttention-2 forward kernel for sm_80 and later (mma.sync).
 *
 * One block computes BM query rows of one (batch, head); its NW warps split those rows
 * (WM = BM / NW each, no split of the key dimension across warps, so the online softmax needs
 * no cross-warp reduction). Per key tile of BN rows:
 *     S = Q K^T (fp32 in registers)  ->  mask / softcap / ALiBi  ->  online softmax
 *     (running max m, running sum l, rescale of O)  ->  O += P V with P packed to 16 bits
 *     straight from the S registers (C fragment pairs == A fragment, see ptx.cuh).
 * Shared memory holds Q (loaded once), two K tiles and one V tile. Loads are cp.async and
 * overlap the math: V(n) is in flight during S = Q K(n)^T and the softmax, K(n-1) from the
 * softmax of iteration n to the start of the next.
 * Rows are padded by 16 bytes so the 8 rows an ldmatrix reads fall in distinct banks.
 *
 * Key tiles are visited from the last visible one down to the first; tiles no row of the block
 * can see (causal, windows) are never loaded. Only tiles that straddle a mask edge or the end
 * of the sequence pay for per-element masking.
 *
 * Dropout (DROP, a template parameter so that the kernels without it are unchanged): P enters
 * P V times its factor (dropout_sm80.cuh: 0 or 1 / (1 - p)), after the row sum has taken it
 * undropped, so l and LSE are the plain softmax's, as the CPU backend's (cpu/fwd_tiled.c).
 */
#ifndef FA_CUDA_FWD_SM80_CUH
#define FA_CUDA_FWD_SM80_CUH

#include <math.h>

#include <type_traits>

#include "dropout_sm80.cuh"
#include "kernels.h"
#include "masked_specials.cuh"
#include "ptx.cuh"
#include "score_mods.cuh"

namespace fa {

/* Everything the kernel reads, flattened from fa_problem (kernel parameters are constant
   memory, so this costs no registers until used). */
struct FwdArgs {
    const void *q, *k, *v;
    void *o;
    float *lse;
    int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, o_sb, o_st, o_sh;
    int64_t lse_sb, lse_sh, lse_st;
    const int *cu_q, *cu_k;
    int seqlen_q, seqlen_k, group, d;
    ScoreMods m;
    DropArgs drop; /* read by the DROP kernels only */
};

/* MINB_: blocks per multiprocessor the kernel's registers must allow (__launch_bounds__), set
   where the kernel without the masked-special repair reaches more than one: that repair's
   outlined call otherwise lets ptxas spend up to 70 more registers (masked_specials.cuh). */
template <int D_, int BM_, int BN_, int NW_, int MINB_ = 1> struct FwdCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_, NW = NW_, MINB = MINB_;
    static constexpr int THREADS = NW * 32;
    static constexpr int WM = BM / NW; /* query rows per warp */
    static constexpr int MT = WM / 16; /* m16 tiles per warp */
    static constexpr int NT = BN / 8;  /* n8 tiles of S */
    static constexpr int DT = D / 8;   /* n8 tiles of O */
    static constexpr int LD = D + 8;   /* padded shared-memory row, elements */
    /* Q, K x 2, V, then the table of masked specials (masked_specials.cuh) */
    static constexpr size_t SMEM_NF = (size_t)(BM + 3 * BN) * LD * 2;
    static constexpr size_t SMEM = SMEM_NF + NfTable<BM, D>::BYTES;
    static_assert(WM % 16 == 0, "each warp owns whole m16 tiles");
    static_assert(BN % 16 == 0 && D % 16 == 0, "k16 steps");
};

/* Issues cp.async for a tile of R rows x D columns; rows at or past `valid` and columns past d
   are zero-filled. Thread tid always copies the same 16-byte column chunk, of rows
   tid / CPR + i * (THREADS / CPR), so one pointer and one shared address advance by constant
   steps (few live registers). */
template <int R, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile(uint32_t smem, const char *gbase, int64_t row_stride_b,
                                          int valid, int d, int tid) {
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
    constexpr int STEP = THREADS / CPR > 0 ? THREADS / CPR : 1;
    if constexpr (THREADS % CPR == 0) {
        const int r0 = tid / CPR, x = tid % CPR;
        const bool col_ok = x * 8 < d;
        const char *src = gbase + r0 * row_stride_b + x * 16;
        uint32_t dst = smem + (uint32_t)(r0 * LD + x * 8) * 2;
#pragma unroll
        for (int i = 0; i < R / STEP; i++) {
            const bool ok = col_ok && r0 + i * STEP < valid;
            cp_async16(dst, ok ? src : gbase, ok);
            src += STEP * row_stride_b;
            dst += STEP * LD * 2;
        }
    } else {
#pragma unroll
        for (int c = tid; c < R * CPR; c += THREADS) {
            const int r = c / CPR, x = c % CPR;
            const bool ok = r < valid && x * 8 < d;
            cp_async16(smem + (uint32_t)(r * LD + x * 8) * 2, ok ? gbase + r * row_stride_b + x * 16 : gbase, ok);
        }
    }
}

template <typename T, typename C, bool DROP>
__global__ void __launch_bounds__(C::THREADS, DROP ? 1 : C::MINB)
    fwd_sm80_kernel(const __grid_constant__ FwdArgs a) {
    constexpr int D = C::D, BM = C::BM, BN = C::BN, LD = C::LD;
    constexpr int MT = C::MT, NT = C::NT, DT = C::DT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sQ = smem_addr(smem_raw);
    const uint32_t sV = sQ + BM * LD * 2;
    const uint32_t sK = sV + BN * LD * 2; /* two buffers: K(nb) is read while K(nb-1) lands */
    auto k_buf = [&](int nb) { return sK + (uint32_t)(nb & 1) * BN * LD * 2; };
    const uint32_t sNf = sQ + (uint32_t)C::SMEM_NF;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int m_block = gridDim.x - 1 - blockIdx.x; /* longest causal rows first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;

    int q0 = 0, k0 = 0, sq = a.seqlen_q, sk = a.seqlen_k;
    int64_t bq = b, bk = b;
    if (a.cu_q) {
        q0 = a.cu_q[b];
        sq = a.cu_q[b + 1] - q0;
        k0 = a.cu_k[b];
        sk = a.cu_k[b + 1] - k0;
        bq = bk = 0;
    }
    const int row0 = m_block * BM;
    if (row0 >= sq) return;
    const int rows = min(BM, sq - row0);

    /* the block's keys (rows.h): the tiles of those some row sees are visited, and a tile
       inside those every row sees needs no mask */
    auto rk = [&]() { return fa_rows_of(sq, sk, a.m.win_left, a.m.win_right); };
    const int diag = sk - sq; /* c(i) = i + diag */
    const fa_range ktiles = fa_range_tiles(fa_rows_union(rk(), row0, row0 + rows), BN);
    const fa_range every = fa_rows_common(rk(), row0, row0 + rows);

    const T *qg = (const T *)a.q + bq * a.q_sb + (int64_t)(q0 + row0) * a.q_st + h * a.q_sh;
    const T *kg = (const T *)a.k + bk * a.k_sb + (int64_t)k0 * a.k_st + hk * a.k_sh;
    const T *vg = (const T *)a.v + bk * a.v_sb + (int64_t)k0 * a.v_st + hk * a.v_sh;

    float acc[MT][DT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < DT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        row_max[i][0] = row_max[i][1] = -INFINITY;
        row_sum[i][0] = row_sum[i][1] = 0.f;
    }

    const int g = lane >> 2, t4 = lane & 3;
    const float slope = alibi_slope_log2(a.m, b, h);
    const bool fancy = a.m.softcap > 0.f || a.m.alibi != nullptr; /* uniform per launch */

    if (ktiles.hi > ktiles.lo) {
        const int nb_first = ktiles.lo, nb_last = ktiles.hi - 1;
        nf_table_clear(sNf, NfTable<BM, D>::WORDS, tid, C::THREADS);
        load_tile<BM, D, LD, C::THREADS>(sQ, (const char *)qg, a.q_st * 2, rows, a.d, tid);
        load_tile<BN, D, LD, C::THREADS>(k_buf(nb_last), (const char *)(kg + (int64_t)nb_last * BN * a.k_st),
                                         a.k_st * 2, sk - nb_last * BN, a.d, tid);
        /* the first V tile with them: otherwise it is requested only once Q has landed, and
           short sequences wait for it */
        load_tile<BN, D, LD, C::THREADS>(sV, (const char *)(vg + (int64_t)nb_last * BN * a.v_st),
                                         a.v_st * 2, sk - nb_last * BN, a.d, tid);
        cp_async_commit();

        /* ldmatrix lane addresses (bytes, relative to the tile) */
        const uint32_t q_off = ((warp * C::WM + (lane & 15)) * LD + (lane >> 4) * 8) * 2;
        const uint32_t k_off = ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
        const uint32_t v_off = (((((lane >> 3) & 1) << 3) + (lane & 7)) * LD + (lane >> 4) * 8) * 2;

        for (int nb = nb_last; nb >= nb_first; nb--) {
            const int kcol0 = nb * BN;
            cp_async_wait<0>();
            /* K(nb) (in the first iteration also Q and V(nb)) visible to all; every warp is
               done with V(nb+1) and K(nb+1), whose buffers the next two copies overwrite */
            __syncthreads();
            if (nb != nb_last)
                load_tile<BN, D, LD, C::THREADS>(sV, (const char *)(vg + (int64_t)kcol0 * a.v_st),
                                                 a.v_st * 2, sk - kcol0, a.d, tid);
            cp_async_commit(); /* possibly empty */
            const uint32_t sKn = k_buf(nb);

            /* S = Q K^T */
            float s[MT][NT][4];
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int i = 0; i < MT; i++)
                    ldmatrix_x4(sQ + q_off + (i * 16 * LD + kk * 16) * 2, qa[i][0], qa[i][1],
                                qa[i][2], qa[i][3]);
#pragma unroll
                for (int j = 0; j < NT / 2; j++) {
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4(sKn + k_off + (j * 16 * LD + kk * 16) * 2, b0, b1, b2, b3);
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        mma16816<T>(s[i][2 * j], qa[i], b0, b1);
                        mma16816<T>(s[i][2 * j + 1], qa[i], b2, b3);
                    }
                }
            }

            /* K(nb-1) only now: issued at the top, its copies (address arithmetic, LSU slots)
               delayed the first fragment loads of the product above (fwd_sm80.md) */
            if (nb > nb_first) {
                const int kn = (nb - 1) * BN;
                load_tile<BN, D, LD, C::THREADS>(k_buf(nb - 1), (const char *)(kg + (int64_t)kn * a.k_st),
                                                 a.k_st * 2, sk - kn, a.d, tid);
            }
            cp_async_commit(); /* possibly empty: keeps "V is the older group" true */

            /* Plain scores stay raw: the softmax folds scale * log2(e) into one FMA. Softcap
               and ALiBi need the scores themselves, so they convert to log2 units first. */
            float mul = a.m.scale_log2;
            if (fancy) {
                mul = 1.f;
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int c = row0 + warp * C::WM + i * 16 + g + hr * 8 + diag;
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int col = kcol0 + j * 8 + t4 * 2 + e;
                                s[i][j][hr * 2 + e] = score_log2(a.m, s[i][j][hr * 2 + e], slope, c, col);
                            }
                    }
            }
            /* masking only where the tile straddles a mask edge or the end of the keys */
            const bool edge = !fa_range_holds(every, kcol0, kcol0 + BN);
            if (edge) {
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int r = row0 + warp * C::WM + i * 16 + g + hr * 8;
                        const int lo = fa_rows_lo(rk(), r) - kcol0 - t4 * 2;
                        const int hi = fa_rows_hi(rk(), r) - kcol0 - t4 * 2;
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                if (j * 8 + e < lo || j * 8 + e >= hi)
                                    s[i][j][hr * 2 + e] = -INFINITY;
                    }
            }

            /* online softmax; P leaves as 16-bit A fragments so the fp32 scores die here */
            uint32_t pa[MT][BN / 16][4];
            float alphas[MT][2];
            bool rescale = false;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                float m_use[2];
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        mx = fmaxf(mx, fmaxf(s[i][j][hr * 2], s[i][j][hr * 2 + 1]));
                    mx = __fmul_ru(quad_max(mx), mul); /* rounded up: with_row_exp (ptx.cuh) */
                    const float m_new = fmaxf(row_max[i][hr], mx);
                    /* a row that has seen no key yet keeps m = -inf; exp2(x - 0) of its -inf
                       scores is 0, so nothing NaN enters the sums */
                    m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
                    alphas[i][hr] = fast_exp2(row_max[i][hr] - m_use[hr]);
                    row_max[i][hr] = m_new;
                    rescale |= alphas[i][hr] != 1.f;
                }
                float sum[2] = {0.f, 0.f};
                /* dropout: the keep bits of this m16 x BN piece (rows in sequence terms) */
                uint32_t keep[2][(NT + 7) / 8];
                if constexpr (DROP)
                    drop_bits<NT>(a.drop.d, (uint32_t)(b * a.drop.heads_q + h),
                                  (uint32_t)(row0 + warp * C::WM + i * 16 + g), (uint32_t)kcol0,
                                  lane, keep);
                with_row_exp(m_use, [&](auto ex) {
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            float p0 = ex(hr, s[i][j][hr * 2], mul, m_use[hr]);
                            float p1 = ex(hr, s[i][j][hr * 2 + 1], mul, m_use[hr]);
                            sum[hr] += p0 + p1; /* undropped: l is the softmax's */
                            if constexpr (DROP) {
                                p0 *= drop_factor<NT>(keep, hr, j, 0, a.drop.scale);
                                p1 *= drop_factor<NT>(keep, hr, j, 1, a.drop.scale);
                            }
                            /* C tile j, row half hr -> A fragment (k step j/2), register
                               hr + 2 * (j % 2) (see ptx.cuh) */
                            pa[i][j / 2][hr + 2 * (j % 2)] = pack2<T>(p0, p1);
                        }
                });
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    row_sum[i][hr] = row_sum[i][hr] * alphas[i][hr] + sum[hr];
            }
            /* Once the running maxima settle, most tiles change no row's maximum: skip the
               multiplications by exactly 1 (a warp-uniform branch, no approximation). */
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < DT; j++) {
                        acc[i][j][0] *= alphas[i][0];
                        acc[i][j][1] *= alphas[i][0];
                        acc[i][j][2] *= alphas[i][1];
                        acc[i][j][3] *= alphas[i][1];
                    }
            }

            cp_async_wait<1>(); /* this thread's copies of V(nb) landed */

            /* An Inf or NaN in V of a key some row cannot see must not reach that row through
               P V (0 times it is NaN): on mask-edge tiles, each thread scans the chunks of those
               keys' V rows it copied itself (load_tile gives chunk i to thread i % THREADS, as
               nf_scan_zero takes them), so the barrier below publishes the zeros too; each
               special is zeroed, its term kept for the rows that see it (masked_specials.cuh) */
            const int nv = min(BN, sk - kcol0);
            if (edge && !fa_range_holds(every, kcol0, kcol0 + nv))
                nf_scan_zero<T, NfRows<LD>, D / 8>(sV, 0, nv, every.lo - kcol0,
                                                   every.hi - kcol0,
                                                   NfMap{rk(), 0, 1, true, row0, kcol0},
                                                   NfTableSink{sNf, BM, D}, tid, C::THREADS);
            __syncthreads(); /* V(nb) visible (K(nb-1) may still be landing) */

            /* O += P V */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
                for (int j = 0; j < DT / 2; j++) {
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4_trans(sV + v_off + (kk * 16 * LD + j * 16) * 2, b0, b1, b2, b3);
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        mma16816<T>(acc[i][2 * j], pa[i][kk], b0, b1);
                        mma16816<T>(acc[i][2 * j + 1], pa[i][kk], b2, b3);
                    }
                }
            }
        }
    }

    if (ktiles.hi > ktiles.lo) nf_table_apply<D>(acc, sNf, warp * C::WM, 0, lane);

    /* Normalise; stage O through the warp's own rows of the Q tile (only this warp ever read
       them, and no copy is in flight) so global stores are whole 16-byte row pieces. */
    const uint32_t my_rows = sQ + warp * C::WM * LD * 2;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float l = quad_sum(row_sum[i][hr]);
            const int r = warp * C::WM + i * 16 + g + hr * 8;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const uint32_t srow = my_rows + ((i * 16 + g + hr * 8) * LD + t4 * 2) * 2;
#pragma unroll
            for (int j = 0; j < DT; j++) {
                const uint32_t v = pack2<T>(acc[i][j][hr * 2] * inv, acc[i][j][hr * 2 + 1] * inv);
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(srow + j * 16), "r"(v));
            }
            if (a.lse && t4 == 0 && r < rows) {
                const float lse = l > 0.f ? row_max[i][hr] * 0.6931471805599453f + logf(l)
                                          : -INFINITY;
                a.lse[bq * a.lse_sb + h * a.lse_sh + (int64_t)(q0 + row0 + r) * a.lse_st] = lse;
            }
        }
    __syncwarp();
    T *og = (T *)a.o + bq * a.o_sb + (int64_t)(q0 + row0 + warp * C::WM) * a.o_st + h * a.o_sh;
    constexpr int CPR = D / 8;
    const int my_valid = rows - warp * C::WM; /* rows of this warp inside the sequence */
#pragma unroll
    for (int c = lane; c < C::WM * CPR; c += 32) {
        const int r = c / CPR, x = c % CPR;
        if (r < my_valid && x * 8 < a.d) {
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(my_rows + (r * LD + x * 8) * 2));
            *(uint4 *)(og + (int64_t)r * a.o_st + x * 8) = v;
        }
    }
}

/* Launches one configuration; returns the CUDA error (cudaSuccess when queued). */
template <typename T, typename C, bool DROP>
cudaError_t fwd_sm80_launch(const FwdArgs &a, int batch, int heads, int max_sq,
                            cudaStream_t stream) {
    auto kern = fwd_sm80_kernel<T, C, DROP>;
    cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);
    if (e != cudaSuccess) return e;
    dim3 grid((max_sq + C::BM - 1) / C::BM, heads, batch);
    kern<<<grid, C::THREADS, C::SMEM, stream>>>(a);
    return cudaGetLastError();
}

/*
 * Tile shapes per kernel head dim: rows of Q per block, rows of K/V per tile, warps. `Big` is
 * the shape tuned for sm_80/sm_90 (up to 227 KB of shared memory per block); `Small` serves
 * GPUs with less (sm_86/89: 99 KB) and is the same type where Big fits everywhere.
 */
template <int D> struct FwdTiles;
template <> struct FwdTiles<32> { using Big = FwdCfg<32, 128, 128, 4>; using Small = Big; };
/* d 64: 168 registers, three blocks a multiprocessor */
template <> struct FwdTiles<64> { using Big = FwdCfg<64, 128, 64, 4, 3>; using Small = Big; };
template <> struct FwdTiles<96> { using Big = FwdCfg<96, 128, 64, 4>; using Small = Big; };
template <> struct FwdTiles<128> { using Big = FwdCfg<128, 128, 64, 4>; using Small = Big; };
template <> struct FwdTiles<192> {
    using Big = FwdCfg<192, 128, 64, 8>;
    using Small = FwdCfg<192, 64, 32, 4>;
};
template <> struct FwdTiles<256> {
    using Big = FwdCfg<256, 128, 64, 8>;
    using Small = FwdCfg<256, 64, 32, 4>;
};

/* The shape of the dropout kernels where Big spills with the Philox work added (ptxas -v):
   d 96 and 128 (two m16 tiles per warp, a 64-key S) take 32-key tiles, as FlashAttention-2's
   dropout forward does, and d 32 64-key ones, which frees the S registers the generator
   needs. Elsewhere Big. */
template <int D> struct FwdDropTile { using type = typename FwdTiles<D>::Big; };
template <> struct FwdDropTile<32> { using type = FwdCfg<32, 128, 64, 4>; };
template <> struct FwdDropTile<96> { using type = FwdCfg<96, 128, 32, 4>; };
template <> struct FwdDropTile<128> { using type = FwdCfg<128, 128, 32, 4>; };

struct FwdShape {
    int bm, bn, threads;
};

/* Runs the kernel for head dim D (defined in fwd_sm80_d<D>.cu, one file per D so they build
   in parallel). */
template <typename T, int D>
cudaError_t fwd_sm80_run(const FwdArgs &a, bool drop, int batch, int heads, int max_sq,
                         size_t smem_optin, cudaStream_t stream, FwdShape *shape);

#define FA_FWD_SM80_DEFINE(T, D)                                                              \
    template <>                                                                               \
    cudaError_t fwd_sm80_run<T, D>(const FwdArgs &a, bool drop, int batch, int heads,         \
                                   int max_sq, size_t smem_optin, cudaStream_t stream,        \
                                   FwdShape *shape) {                                         \
        using Big = FwdTiles<D>::Big;                                                         \
        using Small = FwdTiles<D>::Small;                                                     \
        using BigDrop = FwdDropTile<D>::type;                                                 \
        /* where Small is Big, its dropout variant is BigDrop's shape too */                  \
        using SmallDrop = std::conditional_t<std::is_same_v<Small, Big>, BigDrop, Small>;     \
        if (Big::SMEM <= smem_optin && drop) {                                                \
            *shape = FwdShape{BigDrop::BM, BigDrop::BN, BigDrop::THREADS};                    \
            return fwd_sm80_launch<T, BigDrop, true>(a, batch, heads, max_sq, stream);        \
        }                                                                                     \
        if (Big::SMEM <= smem_optin) {                                                        \
            *shape = FwdShape{Big::BM, Big::BN, Big::THREADS};                                \
            return fwd_sm80_launch<T, Big, false>(a, batch, heads, max_sq, stream);           \
        }                                                                                     \
        if (drop) {                                                                           \
            *shape = FwdShape{SmallDrop::BM, SmallDrop::BN, SmallDrop::THREADS};              \
            return fwd_sm80_launch<T, SmallDrop, true>(a, batch, heads, max_sq, stream);      \
        }                                                                                     \
        *shape = FwdShape{Small::BM, Small::BN, Small::THREADS};                              \
        return fwd_sm80_launch<T, Small, false>(a, batch, heads, max_sq, stream);             \
    }

} // namespace fa

#endif
