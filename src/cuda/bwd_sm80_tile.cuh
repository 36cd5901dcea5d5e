/*
 * cuda/bwd_sm80_tile.cuh — shared-memory tiles for the backward kernels: cp.async tile loads
 * and a warp-level GEMM that takes either operand from a tile stored in either orientation
 * (ldmatrix with or without .trans).
 *
 * Layout: a tile row of W 16-bit elements is stored with a pitch of LD = W + 8 elements. W / 8
 * (the 16-byte chunks of a row) is even for every tile, so the pitch is an odd number of
 * chunks and the 8 rows one ldmatrix reads land in 8 distinct 16-byte bank groups; the 32-bit
 * fragment stores of P and dS (8 rows x 4 words) hit 32 distinct banks. Unlike an XOR swizzle,
 * every fragment address is a per-thread base plus a compile-time offset, which keeps the
 * unrolled k-loops from holding dozens of precomputed addresses in registers.
 */
#ifndef FA_CUDA_BWD_SM80_TILE_CUH
#define FA_CUDA_BWD_SM80_TILE_CUH

#include "ptx.cuh"

namespace fa {
namespace bwd {

/* Byte offset of chunk c (8 elements) of row r in a tile of pitch LD elements. */
template <int LD> __device__ __forceinline__ uint32_t chunk_off(int r, int c) {
    static_assert(LD % 16 == 8, "pitch: an odd number of 16-byte chunks");
    return (uint32_t)(r * LD + c * 8) * 2u;
}

/* Byte offset of element (r, col). */
template <int LD> __device__ __forceinline__ uint32_t elem_off(int r, int col) {
    return (uint32_t)(r * LD + col) * 2u;
}

/*
 * cp.async of ROWS rows x LCH chunks (columns 0 .. LCH*8-1) into a tile of pitch LD. Rows >=
 * valid_rows and columns >= d are zero-filled (no global read). `g` points at row 0, which
 * must be a valid address (it stands in for the source of zero-filled chunks).
 * A thread always copies the same chunk column (of a row width rounded up to a power of two;
 * the lanes past LCH idle), stepping rows by THREADS / LCHP, so its source pointer advances
 * by one constant stride: no per-chunk 64-bit offsets for the compiler to keep in registers.
 */
template <int ROWS, int LCH, int LD, int THREADS, typename T>
__device__ __forceinline__ void load_rows(uint32_t tile, const T *g, int64_t row_stride,
                                          int valid_rows, int d, int tid) {
    constexpr int LCHP = LCH <= 4 ? 4 : LCH <= 8 ? 8 : LCH <= 16 ? 16 : 32;
    constexpr int STEP = THREADS / LCHP;
    static_assert(THREADS % LCHP == 0 && LCH <= 32, "chunk columns per thread");
    const int r0 = tid / LCHP, c = tid % LCHP;
    if (c >= LCH) return;
    const bool col_ok = c * 8 < d;
    const T *src = g + (int64_t)r0 * row_stride + c * 8;
    const int64_t step = (int64_t)STEP * row_stride;
    uint32_t dst = tile + chunk_off<LD>(r0, c);
#pragma unroll
    for (int i = 0; i < (ROWS + STEP - 1) / STEP; i++) {
        const int r = r0 + i * STEP;
        if (ROWS % STEP == 0 || r < ROWS) {
            const bool ok = col_ok && r < valid_rows;
            cp_async16(dst, ok ? src : g, ok);
        }
        src += step;
        dst += (uint32_t)(STEP * LD * 2);
    }
}

/* cp.async of n floats (n a multiple of 4, source 16-byte aligned) by threads [t0, t0 + n/4). */
__device__ __forceinline__ void load_floats(uint32_t dst, const float *src, int n, int tid,
                                            int t0) {
    const int i = tid - t0;
    if (i >= 0 && i < n / 4) cp_async16(dst + i * 16, src + i * 4, true);
}

/*
 * Fragment loads for mma.m16n8k16 (layouts in ptx.cuh), 16 rows at a time. Operand origins
 * (m0, n0, k0) are multiples of 16.
 *   ld_a:   A rows m0.., columns k0.. from a tile stored [m][k]
 *   ld_a_t: the same from a tile stored [k][m] (A^T in memory), through ldmatrix.trans
 *   ld_b:   B (k x n) columns n0..n0+15 from a tile stored [n][k]: b0, b1 of the n8 tile at n0
 *           and b2, b3 of the one at n0 + 8
 *   ld_b_t: the same from a tile stored [k][n], through ldmatrix.trans
 */
template <int LD>
__device__ __forceinline__ void ld_a(uint32_t tile, int m0, int k0, int lane, uint32_t (&a)[4]) {
    const int r = m0 + (lane & 15), c = (k0 >> 3) + (lane >> 4);
    ldmatrix_x4(tile + chunk_off<LD>(r, c), a[0], a[1], a[2], a[3]);
}
template <int LD>
__device__ __forceinline__ void ld_a_t(uint32_t tile, int m0, int k0, int lane, uint32_t (&a)[4]) {
    const int r = k0 + (lane & 7) + ((lane >> 4) << 3), c = (m0 >> 3) + ((lane >> 3) & 1);
    ldmatrix_x4_trans(tile + chunk_off<LD>(r, c), a[0], a[1], a[2], a[3]);
}
template <int LD>
__device__ __forceinline__ void ld_b(uint32_t tile, int n0, int k0, int lane, uint32_t &b0,
                                     uint32_t &b1, uint32_t &b2, uint32_t &b3) {
    const int r = n0 + (lane & 7) + ((lane >> 4) << 3), c = (k0 >> 3) + ((lane >> 3) & 1);
    ldmatrix_x4(tile + chunk_off<LD>(r, c), b0, b1, b2, b3);
}
template <int LD>
__device__ __forceinline__ void ld_b_t(uint32_t tile, int n0, int k0, int lane, uint32_t &b0,
                                       uint32_t &b1, uint32_t &b2, uint32_t &b3) {
    const int r = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), c = (n0 >> 3) + (lane >> 4);
    ldmatrix_x4_trans(tile + chunk_off<LD>(r, c), b0, b1, b2, b3);
}

/*
 * acc[MT][NT] (16 x 8 fp32 tiles) += A (MT*16 x KSTEPS*16) * B (KSTEPS*16 x NT*8) for one warp.
 * A_T / B_T pick the stored orientation of each operand (see ld_a / ld_b above); m0, n0, k0
 * are the operands' origins in their tiles.
 */
template <typename T, int MT, int NT, int KSTEPS, int LD_A, bool A_T, int LD_B, bool B_T>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], uint32_t sA, int am0, int ak0,
                                         uint32_t sB, int bn0, int bk0, int lane) {
    static_assert(NT % 2 == 0, "B fragments come in pairs of n8 tiles");
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (A_T)
                ld_a_t<LD_A>(sA, am0 + i * 16, ak0 + ks * 16, lane, af[i]);
            else
                ld_a<LD_A>(sA, am0 + i * 16, ak0 + ks * 16, lane, af[i]);
        }
#pragma unroll
        for (int j = 0; j < NT / 2; j++) {
            uint32_t b0, b1, b2, b3;
            if (B_T)
                ld_b_t<LD_B>(sB, bn0 + j * 16, bk0 + ks * 16, lane, b0, b1, b2, b3);
            else
                ld_b<LD_B>(sB, bn0 + j * 16, bk0 + ks * 16, lane, b0, b1, b2, b3);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                mma16816<T>(acc[i][2 * j], af[i], b0, b1);
                mma16816<T>(acc[i][2 * j + 1], af[i], b2, b3);
            }
        }
    }
}

template <int MT, int NT> __device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
}

/* Fire-and-forget fp32 adds to global memory (no return value: red, not atom). */
__device__ __forceinline__ void red_add2(float *p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(x) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p + 1), "f"(y) : "memory");
#endif
}

} // namespace bwd
} // namespace fa

#endif
