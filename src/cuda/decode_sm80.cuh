/*
 * cuda/decode_sm80.cuh — attention of a few query tokens against a KV cache (flash-decoding).
 *
 * Decoding reads the whole cache to produce a handful of rows, so it is bound by memory
 * bandwidth, and batch x kv heads alone rarely fills the GPU. Hence:
 *   - GQA packing: the group x seqlen_q query rows that share a kv head form one block's rows
 *     ("packed rows", 16 per block), so each K/V byte is read once per kv head, not per
 *     query head;
 *   - split-KV: the keys of a sequence are cut into num_splits chunks computed by separate
 *     blocks, each writing an fp32 partial output and its LSE; the last of a row block's
 *     split blocks to finish (an atomic count) merges them with the LSE correction, so a
 *     decode step is one kernel (a separate merge launch was a fifth of a batch-1 call);
 *   - inside a block the 4 warps take turns over key tiles of BNW keys (split-K across warps,
 *     unlike the prefill kernel): each warp streams its own tiles through its own
 *     STAGES-deep ring of shared memory with cp.async (no block barrier in the loop), keeps its own
 *     running max / sum / output, and the warps are merged once at the end.
 * Paged caches are read through the block table row by row (a page holds >= 16 rows, a tile
 * of BNW rows touches at most a few pages). Masks, softcap and ALiBi are those of the prefill
 * kernel, with the diagonal at c(t) = t + L - seqlen_q for query token t of a sequence of L
 * keys (cache + appended tokens).
 */
#ifndef FA_CUDA_DECODE_SM80_CUH
#define FA_CUDA_DECODE_SM80_CUH

#include <math.h>

#include "bad_index.cuh"
#include "kernels.h"
#include "masked_specials.cuh"
#include "ptx.cuh"
#include "score_mods.cuh"

namespace fa {

struct DecodeArgs {
    const void *q;
    const void *k, *v; /* the cache (contiguous [b, t, h, d] or page pool [page, row, h, d]) */
    int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh;
    const int *seqlens;     /* [batch] tokens in the cache before the append */
    const int *block_table; /* NULL: contiguous */
    const int *leftpad;     /* [batch] first row each sequence attends to; NULL: 0 */
    int64_t bt_stride;
    int page_size, num_pages, capacity, seqlen_new;
    int page_shift;         /* log2(page_size) when it is a power of two, else -1 */
    int seqlen_q, group, heads_q, d;
    int rows;               /* group * seqlen_q packed rows per kv head */
    ScoreMods m;
    int num_splits, chunk;  /* keys per split (a multiple of the block's key step) */
    fa_bad_index *bad;      /* the error word bad lengths and pages are reported into */
    /* results: final (num_splits == 1) ... */
    void *o;
    int64_t o_sb, o_st, o_sh;
    float *lse;
    int64_t lse_sb, lse_sh, lse_st;
    /* ... or fp32 partials [split][b][t][h][d] and their LSE [split][b][h][t], merged by the
       split block that finishes last for its rows: counters [b][hk][row block], zero on entry */
    float *part_o, *part_lse;
    int *counters;
};

template <int D_> struct DecodeCfg {
    static constexpr int D = D_;
    static constexpr int NW = 4, THREADS = 128;
    /* keys per warp tile: small tiles keep shared memory per block low enough for several
       blocks per multiprocessor, whose warps hide each other's latency (one warp per
       scheduler left the memory system idle between tiles) */
    static constexpr int BNW = 16;
    static constexpr int LD = D + 8;
    static constexpr int TILE = BNW * LD * 2;      /* bytes of one K or V tile */
    /* tiles of a warp in flight at once, plus one: at d 128 a block takes 109 KB, two per
       multiprocessor (the split heuristic sizes the grid to whole waves of them) */
    static constexpr int STAGES = 3;
    /* blocks per multiprocessor the registers must allow (__launch_bounds__) where the kernel
       without the masked-special repair reached more: d 32, 117 registers, four (ptxas gave
       the kernel with the repair's outlined call 137, three; masked_specials.cuh) */
    static constexpr int MINB = D_ == 32 ? 4 : 1;
    static constexpr int WARP_SMEM = 2 * STAGES * TILE; /* K, V x STAGES buffers */
    static constexpr size_t SMEM_Q = (size_t)16 * LD * 2;
    /* then the table of masked specials (masked_specials.cuh) */
    static constexpr size_t SMEM_NF = SMEM_Q + (size_t)NW * WARP_SMEM;
    static constexpr size_t SMEM = SMEM_NF + NfTable<16, D>::BYTES;
    /* the final cross-warp merge reuses the tiles: NW x 16 rows x D fp32 + max/sum */
    static_assert((size_t)NW * 16 * D * 4 + 2 * NW * 16 * 4 <= (size_t)NW * WARP_SMEM,
                  "merge scratch fits in the K/V buffers");
};

/* Keys of sequence b: its length after the append, clamped into [0, capacity]. */
__device__ __forceinline__ int kv_len(const DecodeArgs &a, int b) {
    return (int)min((long long)max(a.seqlens[b], 0) + a.seqlen_new, (long long)a.capacity);
}

/* The first row of sequence b's keys: its left padding, clamped into [0, its clamped length
   before the append] (a bad value is reported by check_sequence). */
__device__ __forceinline__ int kv_first(const DecodeArgs &a, int b) {
    if (!a.leftpad) return 0;
    const int n = min(max(a.seqlens[b], 0), max(a.capacity - a.seqlen_new, 0));
    return min(max(a.leftpad[b], 0), n);
}

/*
 * The checks of FA_DEVICE_CHECKS_ASYNC, which the loads' clamps make safe to run last: a bad
 * length of sequence b (by its first block), a bad block_table entry among the pages of the
 * split's keys (by the split's first block: all the splits together cover every page of the
 * sequence's keys, as the synchronous check does). At the end of the kernel rather than in
 * its main loop or before it, where the code of a report costs the loop registers.
 */
template <int THREADS>
__device__ __forceinline__ void check_sequence(const DecodeArgs &a, int b, int split, int rb,
                                               int tid) {
    if (blockIdx.y != 0 || rb != 0) return;
    const int n = a.seqlens[b];
    if (tid == 0 && split == 0 && (n < 0 || n > a.capacity - a.seqlen_new))
        report_bad(a.bad, n < 0 ? FA_BAD_SEQLEN_NEGATIVE : FA_BAD_SEQLEN_ROOM,
                   a.block_table != nullptr, b, 0, n, a.seqlen_new, a.capacity); /* kv_rule */
    if (tid == 0 && split == 0 && a.leftpad && (a.leftpad[b] < 0 || a.leftpad[b] > n))
        report_bad(a.bad, FA_BAD_LEFTPAD, 0, b, 0, a.leftpad[b], 0, n);
    if (!a.block_table) return;
    const int k0 = split * a.chunk, k1 = min(kv_len(a, b), k0 + a.chunk);
    if (k0 >= k1) return;
    const int last = (k1 - 1) / a.page_size;
    for (int pi = k0 / a.page_size + tid; pi <= last; pi += THREADS) {
        const int e = a.block_table[b * a.bt_stride + pi];
        if (e < 0 || e >= a.num_pages)
            report_bad(a.bad, FA_BAD_PAGE, 0, b, pi, e, 0, a.num_pages);
    }
}

/* Row address of cache token j of sequence b, head hk (contiguous or paged). */
__device__ __forceinline__ const char *cache_row(const DecodeArgs &a, const void *base,
                                                 int64_t sb, int64_t st, int64_t sh, int b,
                                                 int j, int hk, int esz) {
    int64_t off;
    if (a.block_table) {
        /* shifts for the usual power-of-two pages: a run-time division costs ~20 instructions,
           paid for every row of every tile */
        const int pi = a.page_shift >= 0 ? j >> a.page_shift : j / a.page_size;
        const int pr = a.page_shift >= 0 ? j & (a.page_size - 1) : j - pi * a.page_size;
        /* clamped: a bad entry (check_sequence reports it) must not send reads out of the pool */
        const int page = min(max(a.block_table[b * a.bt_stride + pi], 0), a.num_pages - 1);
        off = (int64_t)page * sb + (int64_t)pr * st;
    } else {
        off = (int64_t)b * sb + (int64_t)j * st;
    }
    return (const char *)base + (off + (int64_t)hk * sh) * esz;
}

/* One warp issues cp.async for keys [j0, j0 + BNW) of K and V (rows past `end` zero-filled). */
template <typename T, typename C>
__device__ __forceinline__ void decode_load(const DecodeArgs &a, uint32_t sk, uint32_t sv, int b,
                                            int hk, int j0, int end, int lane) {
    constexpr int CPR = C::D / 8;
#pragma unroll
    for (int c = lane; c < C::BNW * CPR; c += 32) {
        const int r = c / CPR, x = c % CPR, j = j0 + r;
        const bool ok = j < end && x * 8 < a.d;
        const char *ks = ok ? cache_row(a, a.k, a.k_sb, a.k_st, a.k_sh, b, j, hk, sizeof(T)) + x * 16
                            : (const char *)a.k;
        const char *vs = ok ? cache_row(a, a.v, a.v_sb, a.v_st, a.v_sh, b, j, hk, sizeof(T)) + x * 16
                            : (const char *)a.v;
        const uint32_t so = (uint32_t)(r * C::LD + x * 8) * 2;
        cp_async16(sk + so, ks, ok);
        cp_async16(sv + so, vs, ok);
    }
    cp_async_commit();
}

/*
 * The common tile in few instructions: all BNW rows inside the range and in one page (always
 * for a contiguous cache; for pages of a power of two >= BNW rows when the tile starts on a
 * multiple of BNW). Each lane's chunks are then fixed offsets from the tile's first row, set
 * once per block; a tile costs one row address (one block table read when paged) and a 64-bit
 * add per chunk. decode_load, which addresses every row through cache_row, was ~250 integer
 * instructions per warp tile: the decode kernel's largest share of issued instructions and of
 * its instruction-fetch stalls (ncu, batch 1 x 8k). Head dims whose chunks per row do not
 * divide a warp (96, 192) keep decode_load.
 */
template <typename T, typename C> struct DecodeTileLoader {
    static constexpr int CPR = C::D / 8;
    static constexpr bool ENABLED = 32 % CPR == 0;
    static constexpr int RP = ENABLED ? 32 / CPR : 1; /* rows per pass of the warp */
    static constexpr int N = C::BNW / RP;            /* chunks per lane per tile */
    const char *k0, *v0;       /* row 0 of (b, hk): contiguous; (page 0, hk): paged */
    int64_t kst, vst, kpg, vpg; /* bytes per token and per page */
    int64_t lk, lv;            /* this lane's first chunk within a tile */
    uint32_t ls;               /* ... and in shared memory */
    bool okx;                  /* its columns inside d */

    __device__ __forceinline__ DecodeTileLoader(const DecodeArgs &a, int b, int hk, int lane) {
        const int r = lane / CPR, x = lane % CPR;
        const int64_t e = sizeof(T);
        kst = a.k_st * e, vst = a.v_st * e;
        kpg = a.k_sb * e, vpg = a.v_sb * e;
        const int64_t bo = a.block_table ? 0 : b;
        k0 = (const char *)a.k + (bo * a.k_sb + (int64_t)hk * a.k_sh) * e;
        v0 = (const char *)a.v + (bo * a.v_sb + (int64_t)hk * a.v_sh) * e;
        lk = r * kst + x * 16, lv = r * vst + x * 16;
        ls = (uint32_t)(r * C::LD + x * 8) * 2;
        okx = x * 8 < a.d;
    }
    __device__ __forceinline__ bool fits(const DecodeArgs &a, int j0, int end) const {
        return j0 + C::BNW <= end &&
               (!a.block_table || (a.page_shift >= 4 && (j0 & (C::BNW - 1)) == 0));
    }
    __device__ __forceinline__ void load(const DecodeArgs &a, uint32_t sk, uint32_t sv, int b,
                                         int j0) const {
        const char *kt = k0, *vt = v0;
        int j = j0;
        if (a.block_table) {
            const int page = min(max(a.block_table[b * a.bt_stride + (j0 >> a.page_shift)], 0),
                                 a.num_pages - 1);
            kt += page * kpg, vt += page * vpg;
            j = j0 & (a.page_size - 1);
        }
        kt += j * kst + lk, vt += j * vst + lv;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint32_t so = ls + (uint32_t)(i * RP * C::LD) * 2;
            cp_async16(sk + so, kt + i * RP * kst, okx);
            cp_async16(sv + so, vt + i * RP * vst, okx);
        }
        cp_async_commit();
    }
};

/*
 * Split-KV: called by every split block of (row block rb, kv head hk, sequence b) after it has
 * written its partials. The block that finishes last (the count its thread 0 draws) merges the
 * splits' partials of those rows: lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse)
 * out_s (as merge_sm80.cu), into o and lse, and sets the count back to zero. The fence before
 * the count publishes this block's partials; the one after it orders the last block's reads
 * after everybody's writes, and the reads bypass L1 (__ldcg).
 * The merge is a chain of L2 round trips at the end of the call, so it takes few: each thread
 * sums 4 columns of one row, reading U splits' LSEs and outputs at once with a running max
 * (one round trip for up to U splits, not one per split: decode_sm80.md, v9).
 */
template <typename T, typename C>
__device__ __forceinline__ void decode_merge_last(const DecodeArgs &a, int rb, int hk, int b,
                                                  int row0, int tid) {
    constexpr int D = C::D, U = 16;
    __shared__ int last;
    __syncthreads(); /* every thread's partial stores issued */
    if (tid == 0) {
        __threadfence();
        int *cnt = a.counters + ((int64_t)b * gridDim.y + hk) * (gridDim.x / a.num_splits) + rb;
        last = atomicAdd(cnt, 1) == a.num_splits - 1;
        if (last) *cnt = 0; /* every split has counted: ready for the next call */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int ns = a.num_splits;
    const int64_t row_step = (int64_t)gridDim.z * a.seqlen_q * a.heads_q; /* one split's rows */
    for (int c = tid; c < 16 * (D / 4); c += C::THREADS) {
        const int r = c / (D / 4), x = (c % (D / 4)) * 4, pr = row0 + r;
        if (pr >= a.rows || x >= a.d) continue;
        const int t = pr / a.group, h = hk * a.group + pr % a.group;
        const int64_t row1 = ((int64_t)b * a.seqlen_q + t) * a.heads_q + h; /* in a split */
        const float *lse_src = a.part_lse + ((int64_t)b * a.heads_q + h) * a.seqlen_q + t;
        const float4 *src = (const float4 *)(a.part_o + row1 * a.d + x);
        const int64_t stride = row_step * a.d / 4; /* float4s from one split to the next */
        float M = -INFINITY, sum = 0.f, o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
        for (int s0 = 0; s0 < ns; s0 += U) {
            float ls[U];
            float4 u[U];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const bool in = s0 + k < ns;
                ls[k] = in ? __ldcg(lse_src + (s0 + k) * row_step) : -INFINITY;
                u[k] = in ? __ldcg(src + (s0 + k) * stride) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float Mn = M;
#pragma unroll
            for (int k = 0; k < U; k++) Mn = fmaxf(Mn, ls[k]);
            const float Mu = Mn == -INFINITY ? 0.f : Mn;
            const float f = __expf(M - Mu); /* 0 while M is -inf */
            sum *= f, o0 *= f, o1 *= f, o2 *= f, o3 *= f;
#pragma unroll
            for (int k = 0; k < U; k++) {
                const float wk = __expf(ls[k] - Mu);
                sum += wk;
                o0 += wk * u[k].x, o1 += wk * u[k].y, o2 += wk * u[k].z, o3 += wk * u[k].w;
            }
            M = Mn;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        T *dst = (T *)a.o + (int64_t)b * a.o_sb + (int64_t)t * a.o_st + (int64_t)h * a.o_sh + x;
        uint2 pk;
        pk.x = pack2<T>(o0 * inv, o1 * inv);
        pk.y = pack2<T>(o2 * inv, o3 * inv);
        *(uint2 *)dst = pk;
        if (a.lse && x == 0)
            a.lse[(int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + (int64_t)t * a.lse_st] =
                sum > 0.f ? (M == -INFINITY ? 0.f : M) + logf(sum) : -INFINITY;
    }
}

/* grid: (row blocks * num_splits, heads_kv, batch) */
template <typename T, typename C>
__global__ void __launch_bounds__(C::THREADS, C::MINB) decode_sm80_kernel(const __grid_constant__ DecodeArgs a) {
    constexpr int D = C::D, LD = C::LD, BNW = C::BNW, DT = D / 8, NT = BNW / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int split = blockIdx.x % a.num_splits, rb = blockIdx.x / a.num_splits;
    const int hk = blockIdx.y, b = blockIdx.z;
    /* a bad length (check_sequence reports it) is clamped into [0, capacity] so that no read
       leaves the cache */
    const int L = kv_len(a, b);
    const int row0 = rb * 16;
    /* the mask (rows.h) of query token t = packed row / group against the sequence's L keys */
    auto rk = [&]() { return fa_rows_of(a.seqlen_q, L, a.m.win_left, a.m.win_right); };
    const int diag = L - a.seqlen_q;

    /* packed row r -> query token r / group, query head hk * group + r % group */
    const uint32_t sQ = smem_addr(smem);
    for (int c = tid; c < 16 * (D / 8); c += C::THREADS) {
        const int r = c / (D / 8), x = c % (D / 8), pr = row0 + r;
        const bool ok = pr < a.rows && x * 8 < a.d;
        const int t = pr / a.group, h = hk * a.group + pr % a.group;
        const char *src = ok ? (const char *)a.q +
                                   ((int64_t)b * a.q_sb + (int64_t)t * a.q_st + (int64_t)h * a.q_sh) * sizeof(T) + x * 16
                             : (const char *)a.q;
        cp_async16(sQ + (uint32_t)(r * LD + x * 8) * 2, src, ok);
    }
    cp_async_commit();

    /* this split's keys, and those some row of the block sees */
    const int k_begin = split * a.chunk, k_end = min(L, k_begin + a.chunk);
    const int last_row = min(row0 + 15, a.rows - 1);
    fa_range seen = fa_rows_union(rk(), row0 / a.group, last_row / a.group + 1);
    /* keys before the left padding are no keys: every row's range starts at lp at the least */
    const int lp = kv_first(a, b);
    seen.lo = max(seen.lo, lp);
    /* kb on a multiple of BNW (tiles then start on page rows the fast loader takes); keys
       before the first row's window start are masked like any edge */
    const int kb = max(k_begin, seen.lo & ~(BNW - 1)), ke = min(k_end, seen.hi);

    const uint32_t wbase = sQ + (uint32_t)C::SMEM_Q + warp * C::WARP_SMEM;
    auto kbuf = [&](int i) { return wbase + (uint32_t)(i % C::STAGES) * 2 * C::TILE; };
    auto vbuf = [&](int i) { return kbuf(i) + C::TILE; };

    /* tiles of this warp: kb + (warp + 4 i) * BNW */
    const int step = C::NW * BNW;
    const int first = kb + warp * BNW;
    int ntiles = first < ke ? (ke - first + step - 1) / step : 0;

    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const bool fancy = a.m.softcap > 0.f || a.m.alibi != nullptr;

    const DecodeTileLoader<T, C> tl(a, b, hk, lane);
    auto load_tile = [&](int i) {
        const int j0 = first + i * step;
        if constexpr (DecodeTileLoader<T, C>::ENABLED)
            if (tl.fits(a, j0, ke)) return tl.load(a, kbuf(i), vbuf(i), b, j0);
        decode_load<T, C>(a, kbuf(i), vbuf(i), b, hk, j0, ke, lane);
    };
    /* the first STAGES - 1 tiles in flight, one cp.async group each (empty past the end) */
#pragma unroll
    for (int i = 0; i < C::STAGES - 1; i++) {
        if (i < ntiles) load_tile(i);
        else cp_async_commit();
    }
    const uint32_t sNf = sQ + (uint32_t)C::SMEM_NF;
    nf_table_clear(sNf, NfTable<16, D>::WORDS, tid, C::THREADS);
    cp_async_wait<C::STAGES - 1>(); /* the Q group */
    __syncthreads(); /* Q visible to every warp (and the cleared table) */

    const uint32_t q_off = ((lane & 15) * LD + (lane >> 4) * 8) * 2;
    const uint32_t k_off = ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
    const uint32_t v_off = (((((lane >> 3) & 1) << 3) + (lane & 7)) * LD + (lane >> 4) * 8) * 2;
    /* per-thread rows g and g + 8 (query tokens t_r): their key ranges, the keys both see
       (a tile inside them needs no mask), and ALiBi slopes */
    int lo_r[2], hi_r[2], c_r[2], t_r[2];
    float slope_r[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int pr = min(row0 + g + hr * 8, a.rows - 1);
        t_r[hr] = pr / a.group;
        lo_r[hr] = max(fa_rows_lo(rk(), t_r[hr]), lp);
        hi_r[hr] = fa_rows_hi(rk(), t_r[hr]);
        c_r[hr] = t_r[hr] + diag;
        const int h = hk * a.group + pr % a.group;
        slope_r[hr] = alibi_slope_log2(a.m, b, h);
    }
    fa_range both = fa_rows_common(rk(), t_r[0], t_r[1] + 1);
    both.lo = max(both.lo, lp); /* a tile reaching below lp needs the mask */
    /* the keys all 16 rows see: a special elsewhere must not reach the rows that cannot */
    fa_range all = fa_rows_common(rk(), row0 / a.group, last_row / a.group + 1);
    all.lo = max(all.lo, lp);

    for (int i = 0; i < ntiles; i++) {
        const int j0 = first + i * step;
        const int ahead = i + C::STAGES - 1;
        if (ahead < ntiles)
            load_tile(ahead);
        else
            cp_async_commit();
        cp_async_wait<C::STAGES - 1>(); /* tile i landed (this lane's part) */
        __syncwarp();                   /* ... and every lane's */
        const uint32_t sK = kbuf(i), sV = vbuf(i);

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[4];
            ldmatrix_x4(sQ + q_off + kk * 32, qa[0], qa[1], qa[2], qa[3]);
#pragma unroll
            for (int j = 0; j < NT / 2; j++) {
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4(sK + k_off + (j * 16 * LD + kk * 16) * 2, b0, b1, b2, b3);
                mma16816<T>(s[2 * j], qa, b0, b1);
                mma16816<T>(s[2 * j + 1], qa, b2, b3);
            }
        }
        float mul = a.m.scale_log2;
        const bool edge = !(fa_range_holds(both, j0, j0 + BNW) && j0 + BNW <= ke);
        if (fancy || __any_sync(0xffffffffu, edge)) {
            mul = 1.f;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hr = e >> 1, col = j0 + j * 8 + t4 * 2 + (e & 1);
                    const float x = score_log2(a.m, s[j][e], slope_r[hr], c_r[hr], col);
                    s[j][e] = (col >= lo_r[hr] && col < hi_r[hr] && col < ke) ? x : -INFINITY;
                }
        }
        uint32_t pa[BNW / 16][4];
        float alpha[2];
        float m_use[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
            mx = __fmul_ru(quad_max(mx), mul); /* rounded up: with_row_exp (ptx.cuh) */
            const float m_new = fmaxf(m[hr], mx);
            m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
            alpha[hr] = fast_exp2(m[hr] - m_use[hr]);
            m[hr] = m_new;
        }
        float sum[2] = {0.f, 0.f};
        with_row_exp(m_use, [&](auto ex) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const float p0 = ex(hr, s[j][2 * hr], mul, m_use[hr]);
                    const float p1 = ex(hr, s[j][2 * hr + 1], mul, m_use[hr]);
                    sum[hr] += p0 + p1;
                    pa[j / 2][hr + 2 * (j % 2)] = pack2<T>(p0, p1);
                }
        });
#pragma unroll
        for (int hr = 0; hr < 2; hr++) l[hr] = l[hr] * alpha[hr] + sum[hr];
        /* the max settles after the first tiles: skip the D / 2 multiplies while it stays */
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int j = 0; j < DT; j++) {
                acc[j][0] *= alpha[0];
                acc[j][1] *= alpha[0];
                acc[j][2] *= alpha[1];
                acc[j][3] *= alpha[1];
            }
        }
        /* An Inf or NaN in V of a key some row cannot see (left padding, past a diagonal)
           must not reach that row through P V: such keys' V rows are scanned, and each
           special is zeroed, its term kept for the rows that see it (masked_specials.cuh) */
        const int nv = min(BNW, ke - j0);
        if (!fa_range_holds(all, j0, j0 + nv)) {
            nf_scan_zero<T, NfRows<LD>, D / 8>(sV, 0, nv, all.lo - j0, all.hi - j0,
                                               NfMap{rk(), lp, a.group, true, row0, j0},
                                               NfTableSink{sNf, 16, D}, lane, 32);
            __syncwarp();
        }
#pragma unroll
        for (int kk = 0; kk < BNW / 16; kk++)
#pragma unroll
            for (int j = 0; j < DT / 2; j++) {
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4_trans(sV + v_off + (kk * 16 * LD + j * 16) * 2, b0, b1, b2, b3);
                mma16816<T>(acc[2 * j], pa[kk], b0, b1);
                mma16816<T>(acc[2 * j + 1], pa[kk], b2, b3);
            }
        __syncwarp(); /* this buffer is refilled STAGES - 1 tiles from now */
    }

    /* merge the 4 warps through shared memory (reusing the K/V buffers) */
    __syncthreads();
    float *so = (float *)(smem + C::SMEM_Q);              /* [NW][16][D] */
    float *sm = so + C::NW * 16 * D, *sl = sm + C::NW * 16; /* [NW][16] */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = g + hr * 8;
        const float lt = quad_sum(l[hr]);
        if (t4 == 0) {
            sm[warp * 16 + r] = m[hr];
            sl[warp * 16 + r] = lt;
        }
#pragma unroll
        for (int j = 0; j < DT; j++) {
            so[(warp * 16 + r) * D + j * 8 + t4 * 2] = acc[j][2 * hr];
            so[(warp * 16 + r) * D + j * 8 + t4 * 2 + 1] = acc[j][2 * hr + 1];
        }
    }
    __syncthreads();

    uint32_t nf_dirty; /* terms of masked-edge specials to add (masked_specials.cuh) */
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(nf_dirty) : "r"(sNf));
    /* thread -> (row, 8 columns): rows of this block, D / 8 column groups */
    for (int c = tid; c < 16 * (D / 8); c += C::THREADS) {
        const int r = c / (D / 8), x = (c % (D / 8)) * 8, pr = row0 + r;
        if (pr >= a.rows || x >= a.d) continue;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < C::NW; w++) M = fmaxf(M, sm[w * 16 + r]);
        const float Mu = M == -INFINITY ? 0.f : M;
        float wsum = 0.f, wt[C::NW];
#pragma unroll
        for (int w = 0; w < C::NW; w++) {
            wt[w] = fast_exp2(sm[w * 16 + r] - Mu);
            wsum += wt[w] * sl[w * 16 + r];
        }
        const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
        float out[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < C::NW; w++) v += wt[w] * so[(w * 16 + r) * D + x + e];
            out[e] = v * inv;
            if (nf_dirty) {
                const uint32_t bits = nf_table_bits(sNf, D, r, x + e);
                if (bits) out[e] += __uint_as_float(nf_value(bits));
            }
        }
        const float lse = wsum > 0.f ? Mu * 0.6931471805599453f + logf(wsum) : -INFINITY;
        const int t = pr / a.group, h = hk * a.group + pr % a.group;
        if (a.num_splits == 1) {
            T *dst = (T *)a.o + (int64_t)b * a.o_sb + (int64_t)t * a.o_st + (int64_t)h * a.o_sh + x;
            uint4 pk;
            pk.x = pack2<T>(out[0], out[1]);
            pk.y = pack2<T>(out[2], out[3]);
            pk.z = pack2<T>(out[4], out[5]);
            pk.w = pack2<T>(out[6], out[7]);
            *(uint4 *)dst = pk;
            if (a.lse && x == 0)
                a.lse[(int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + (int64_t)t * a.lse_st] = lse;
        } else {
            const int64_t row = (((int64_t)split * gridDim.z + b) * a.seqlen_q + t) * a.heads_q + h;
            float4 *dst = (float4 *)(a.part_o + row * a.d + x);
            dst[0] = make_float4(out[0], out[1], out[2], out[3]);
            dst[1] = make_float4(out[4], out[5], out[6], out[7]);
            if (x == 0)
                a.part_lse[(((int64_t)split * gridDim.z + b) * a.heads_q + h) * a.seqlen_q + t] = lse;
        }
    }
    check_sequence<C::THREADS>(a, b, split, rb, tid);
    if (a.num_splits > 1) decode_merge_last<T, C>(a, rb, hk, b, row0, tid);
}

template <typename T, int D>
cudaError_t decode_sm80_run(const DecodeArgs &a, int row_blocks, int heads_kv, int batch,
                            cudaStream_t st);

#define FA_DECODE_SM80_DEFINE(T, D_)                                                          \
    template <>                                                                               \
    cudaError_t decode_sm80_run<T, D_>(const DecodeArgs &a, int row_blocks, int heads_kv,     \
                                       int batch, cudaStream_t st) {                          \
        using C = DecodeCfg<D_>;                                                              \
        auto kern = decode_sm80_kernel<T, C>;                                                 \
        cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);    \
        if (e != cudaSuccess) return e;                                                       \
        kern<<<dim3(row_blocks * a.num_splits, heads_kv, batch), C::THREADS, C::SMEM, st>>>(a); \
        return cudaGetLastError();                                                            \
    }

} // namespace fa

#endif
