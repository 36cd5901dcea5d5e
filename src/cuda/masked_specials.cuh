/*
 * cuda/masked_specials.cuh — the mask rule for Inf and NaN on the sm80 kernels (header,
 * "Special values"): a key a row cannot see does not contribute to that row, Inf or NaN
 * included. The tensor cores multiply a masked pair's P or dS, exactly 0, anyway, and 0 times
 * Inf is NaN, so the products that sum over keys (O += P V, dQ += dS K) or over query rows
 * (dV += P^T dO, dK += dS^T Q) would carry a masked special into rows that cannot see it.
 * docs/masked_specials_cuda.md has the history and the measurements.
 *
 * On tiles with a mask edge only (they already take a branch of their own), before such a
 * product, nf_scan_zero scans the summed operand's rows that some row of the other side
 * cannot see, in shared memory, and sets each Inf or NaN there to 0. Finite inputs pay only
 * the scan. What the pairs that do see each other lose by the zeroing:
 *   - nothing where the special also reaches them through P or dS: K (through S), Q (S), and
 *     V in the backward (dP); the products there carry it;
 *   - the special's own term where P does not carry it: V in the forward, dO in dV. Those
 *     terms are Inf or NaN, so their class is all that is kept, 2 bits per accumulator
 *     element in a shared table (NfTableSink) that is added where the accumulator is stored:
 *     +Inf, -Inf, or NaN where both signs or a NaN meet.
 */
#ifndef FA_CUDA_MASKED_SPECIALS_CUH
#define FA_CUDA_MASKED_SPECIALS_CUH

#include "../rows.h"
#include "ptx.cuh"

namespace fa {

/* The exponent field of T: all ones is Inf or NaN. */
template <typename T> struct NfExp;
template <> struct NfExp<__half> { static constexpr uint32_t E = 0x7C00u; };
template <> struct NfExp<__nv_bfloat16> { static constexpr uint32_t E = 0x7F80u; };

/* Whether any of the eight 16-bit halves of a 16-byte chunk is Inf or NaN: an all-ones
   exponent plus its lowest bit carries into the half's sign bit, and nothing else does
   (tests/test_masked_specials.cu checks every pattern on the host). */
template <typename T> __host__ __device__ __forceinline__ bool nf_chunk(const uint32_t (&v)[4]) {
    constexpr uint32_t E = NfExp<T>::E, M = E | (E << 16), A = (E & -E) * 0x10001u;
    return ((((v[0] & M) + A) | ((v[1] & M) + A) | ((v[2] & M) + A) | ((v[3] & M) + A)) &
            0x80008000u) != 0;
}

/* The same for the chunk at shared address a. */
template <typename T> __device__ __forceinline__ bool nf_chunk_at(uint32_t a) {
    uint32_t v[4];
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(a));
    return nf_chunk<T>(v);
}

/* x is neither Inf nor NaN (a bit test: fast-math builds may fold isfinite). */
__device__ __forceinline__ bool nf_finite(float x) {
    return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u;
}

/* Which accumulator rows see which rows s of the scanned operand: the zeroed specials' terms
   go to those (a sink's mark, with class bits 1 for a +Inf or NaN, 2 for a -Inf or NaN). */
struct NfMap {
    fa_rows rk;            /* the mask (rows.h); query rows at or past rk.sq see no key */
    int key_lo;            /* keys below it are seen by no row (the decode's left padding) */
    int group;             /* query row of a row index x: x / group (decode: packed rows) */
    bool rows_are_queries; /* the accumulator's rows are query rows (else keys, s query rows) */
    int row0;              /* accumulator row r is row0 + r */
    int sum0;              /* the operand's tile row s is key (or query row) sum0 + s */
    __device__ __forceinline__ bool sees(int r, int s) const {
        const int o = sum0 + s, x = row0 + r;
        const int q = (rows_are_queries ? x : o) / group, key = rows_are_queries ? o : x;
        return q < rk.sq && key >= key_lo && key >= fa_rows_lo(rk, q) && key < fa_rows_hi(rk, q);
    }
};

__device__ __forceinline__ uint32_t nf_value(uint32_t bits) {
    return bits == 3u ? 0x7FC00000u : bits == 1u ? 0x7F800000u : 0xFF800000u;
}

/* A block's table of terms for an accumulator of `rows` x D held in registers until the end:
   a word that says whether any is set, then 2 bits per (row, column). Cleared at the start
   (nf_table_clear), read where the accumulator is stored (nf_table_apply). */
template <int ROWS, int D> struct NfTable {
    static constexpr int WORDS = 1 + ROWS * D / 16;
    static constexpr size_t BYTES = (size_t)WORDS * 4;
};

__device__ __forceinline__ void nf_table_clear(uint32_t table, int words, int t, int n) {
    for (int i = t; i < words; i += n)
        asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(table + 4u * i));
}

struct NfTableSink {
    uint32_t table;
    int rows, d;
    __device__ __forceinline__ void mark(const NfMap &m, int s, int c, uint32_t bits) const {
        for (int r = 0; r < rows; r++) {
            if (!m.sees(r, s)) continue;
            const int x = r * d + c;
            asm volatile("atom.shared.or.b32 _, [%0], %1;\n" ::"r"(table + 4u * (1 + x / 16)),
                         "r"(bits << (2 * (x % 16))));
            asm volatile("st.shared.u32 [%0], 1;\n" ::"r"(table));
        }
    }
};

/* Where only the zeroing matters: the pairs that see each other keep the special through P
   or dS (NfNoSink); or only that some was zeroed (NfFlagSink: a shared word set to 1). */
struct NfNoSink {
    __device__ __forceinline__ void mark(const NfMap &, int, int, uint32_t) const {}
};
struct NfFlagSink {
    uint32_t word;
    __device__ __forceinline__ void mark(const NfMap &, int, int, uint32_t) const {
        asm volatile("st.shared.u32 [%0], 1;\n" ::"r"(word));
    }
};

/* Where chunk ch (8 elements, 16 bytes) of row s of a 16-bit tile lies. NfRows<LD>: rows of LD
   elements (the sm80 kernels' padded tiles); NfSw128<PANEL>: 64-column panels of PANEL bytes,
   128-byte rows whose chunks are XORed with the row's low 3 bits (the Hopper kernels' tiles, as
   the copy engine writes them with the 128-byte swizzle). */
template <int LD> struct NfRows {
    static __device__ __forceinline__ uint32_t at(uint32_t tile, int s, int ch) {
        return tile + (uint32_t)(s * LD + ch * 8) * 2u;
    }
};
template <uint32_t PANEL> struct NfSw128 {
    static __device__ __forceinline__ uint32_t at(uint32_t tile, int s, int ch) {
        return tile + (uint32_t)(ch / 8) * PANEL + (uint32_t)s * 128u +
               (uint32_t)((ch % 8) ^ (s % 8)) * 16u;
    }
};

/*
 * The scan and zeroing on rows [r0, r1) of a 16-bit tile (chunks where layout L puts them, CH
 * chunks of 8 a row), skipping rows [x0, x1), which every row of the other side sees (their
 * specials reach all of those rows anyway): each Inf or NaN goes to `sink` and is zeroed.
 * Thread t of n takes every n-th chunk; the caller's barrier then makes the zeros visible.
 *
 * Outlined, so that the main loops' code stays as it was. ptxas may still spend more
 * registers on a kernel with the call (the sm80 d 64 forward: 168 -> 240); where that would
 * cost blocks per multiprocessor, the kernel's __launch_bounds__ holds it (FwdCfg::MINB).
 */
template <typename T, typename L, int CH, typename Sink>
__device__ __noinline__ void nf_scan_zero(uint32_t tile, int r0, int r1, int x0, int x1, NfMap m,
                                          Sink sink, int t, int n) {
    constexpr uint32_t E = NfExp<T>::E, SIGN = 0x8000u;
    for (int i = t; i < (r1 - r0) * CH; i += n) {
        const int s = r0 + i / CH;
        if (s >= x0 && s < x1) continue;
        const uint32_t a = L::at(tile, s, i % CH);
        if (!nf_chunk_at<T>(a)) continue;
        for (int k = 0; k < 8; k++) {
            uint32_t w;
            asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(w) : "r"(a + 2u * k));
            if ((w & E) != E) continue;
            sink.mark(m, s, (i % CH) * 8 + k, (w & ~(E | SIGN)) ? 3u : (w & SIGN) ? 2u : 1u);
            asm volatile("st.shared.u16 [%0], 0;\n" ::"r"(a + 2u * k));
        }
    }
}

/* The scan alone, for a kernel that must zero only after a barrier (other warps still read the
   tile): whether this thread's chunks of those rows hold an Inf or NaN; the caller votes
   (__syncthreads_or in place of a barrier it has anyway) and zeroes on a hit. */
template <typename T, typename L, int CH>
__device__ __noinline__ bool nf_scan(uint32_t tile, int r0, int r1, int x0, int x1, int t, int n) {
    bool bad = false;
    for (int i = t; i < (r1 - r0) * CH; i += n) {
        const int s = r0 + i / CH;
        if (s >= x0 && s < x1) continue;
        bad |= nf_chunk_at<T>(L::at(tile, s, i % CH));
    }
    return bad;
}

/* Adds the table's terms to a warp's MT x NT accumulator fragments (m16n8 C tiles, ptx.cuh)
   whose rows start at table row r0 and columns at c0: +Inf, -Inf, or NaN for both. */
template <int D, int MT, int NT>
__device__ __forceinline__ void nf_table_apply(float (&acc)[MT][NT][4], uint32_t table, int r0,
                                               int c0, int lane) {
    uint32_t dirty;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(dirty) : "r"(table));
    if (!dirty) return;
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = (r0 + i * 16 + g + (e >> 1) * 8) * D + c0 + j * 8 + 2 * t4 + (e & 1);
                uint32_t w;
                asm volatile("ld.shared.u32 %0, [%1];\n"
                             : "=r"(w)
                             : "r"(table + 4u * (1 + x / 16)));
                const uint32_t bits = (w >> (2 * (x % 16))) & 3u;
                if (bits) acc[i][j][e] += __uint_as_float(nf_value(bits));
            }
}

/* After a product that read a tile zeroed under NfFlagSink (word set), with the same barrier
   in every thread: the tile's `rows` rows (first d columns, CH chunks) again from global
   memory g, for the tiles after, and the word cleared. */
template <typename T, typename L, int CH>
__device__ __noinline__ void nf_restore(uint32_t tile, const T *g, int64_t stride, int rows, int d,
                                        uint32_t word, int t, int n) {
    uint32_t set;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(set) : "r"(word));
    if (!set) return;
    __syncthreads(); /* every thread has read the word and is done with the zeroed tile */
    for (int i = t; i < rows * CH; i += n) {
        if (i % CH * 8 >= d) continue;
        const uint4 v = *(const uint4 *)(g + (int64_t)(i / CH) * stride + i % CH * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(L::at(tile, i / CH, i % CH)),
                     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
    }
    if (t == 0) asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(word));
}

/* The bits of (row r, column c), for the decode's final rows. */
__device__ __forceinline__ uint32_t nf_table_bits(uint32_t table, int d, int r, int c) {
    const int x = r * d + c;
    uint32_t w;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w) : "r"(table + 4u * (1 + x / 16)));
    return (w >> (2 * (x % 16))) & 3u;
}

} // namespace fa

#endif
