/*
 * rows.h — the one mask rule: which keys a query row sees. Every kernel of both backends
 * (CPU through fa_row_keys of internal.h, each CUDA kernel directly) takes its row bounds,
 * its key-tile loop limits and its "this tile needs no mask" decisions from here.
 *
 * Every mask of the library (causal, sliding windows, varlen, KV cache) leaves query row i of
 * a sequence of sq queries and sk keys one contiguous run of keys [lo(i), hi(i)):
 *
 *     c(i)  = i + sk - sq                          the row's diagonal: bottom-right alignment
 *     lo(i) = max(0, c(i) - wl)       0 if wl = -1
 *     hi(i) = min(sk, c(i) + wr + 1)  sk if wr = -1
 *
 * empty when lo(i) >= hi(i). Causal is wr = 0. Both ends never decrease as i grows, which is
 * what lets a block of rows find its keys from its first and last rows alone. The formulas are
 * defined for any i, so kernels may ask about rows of a tile that lie past (or, aligned to a
 * sequence's end, before) the sequence.
 *
 * Windows arrive normalised (fa_window_norm, applied once by the dispatcher): wl and wr are -1
 * or smaller than the longest sequence's keys and queries. Kernels do not clamp them again.
 *
 * Integers: fa_row_t is int64_t in C, where the CPU backend's sizes are bounded only by memory,
 * and int32 in CUDA translation units (and in C under FA_ROWS_32, which the unit test uses to
 * check that width): the CUDA backend refuses sequences and token counts of 2^30 or more
 * (check_problem_scalars in cuda/backend.c), so with normalised windows every value below stays
 * inside int32 for rows up to 2^29 before or past a sequence, far more than a tile's.
 */
#ifndef FA_ROWS_H
#define FA_ROWS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FA_ROWS_FN static __host__ __device__ __forceinline__
#else
#define FA_ROWS_FN static inline
#endif

#if defined(__CUDACC__) || defined(FA_ROWS_32)
typedef int32_t fa_row_t;
#else
typedef int64_t fa_row_t;
#endif

/* A run of key columns or query rows [lo, hi); empty when lo >= hi. */
typedef struct fa_range {
    fa_row_t lo, hi;
} fa_range;

/* One sequence's mask: sq queries, sk keys, normalised windows (-1: unbounded). Built by
   fa_rows_of; diag = sk - sq is kept because every row's bounds start from it. */
typedef struct fa_rows {
    fa_row_t sq, sk, diag, wl, wr;
} fa_rows;

FA_ROWS_FN fa_row_t fa_row_min(fa_row_t a, fa_row_t b) { return a < b ? a : b; }
FA_ROWS_FN fa_row_t fa_row_max(fa_row_t a, fa_row_t b) { return a > b ? a : b; }

FA_ROWS_FN fa_rows fa_rows_of(fa_row_t sq, fa_row_t sk, fa_row_t wl, fa_row_t wr) {
    fa_rows r;
    r.sq = sq;
    r.sk = sk;
    r.diag = sk - sq;
    r.wl = wl;
    r.wr = wr;
    return r;
}

/* The first key row i sees, and one past its last: max(0, c - wl) and min(sk, c + wr + 1),
   written so that no intermediate leaves the range of c, sk and the windows (c + wr + 1 would,
   for rows past a sequence near the int32 limit). */
FA_ROWS_FN fa_row_t fa_rows_lo(fa_rows r, fa_row_t i) {
    return r.wl < 0 ? 0 : fa_row_max(i + r.diag, r.wl) - r.wl;
}
FA_ROWS_FN fa_row_t fa_rows_hi(fa_rows r, fa_row_t i) {
    return r.wr < 0 ? r.sk : fa_row_min(i + r.diag, r.sk - r.wr - 1) + r.wr + 1;
}

/* Rows [i0, i1) (i0 < i1): the keys some row sees, [lo(i0), hi(i1 - 1)) exactly (lo moves by
   at most one key a row and a non-empty run holds at least one, so the runs leave no gap; empty
   rows lie only at the ends). A block's key loop covers this run. */
FA_ROWS_FN fa_range fa_rows_union(fa_rows r, fa_row_t i0, fa_row_t i1) {
    fa_range k;
    k.lo = fa_rows_lo(r, i0);
    k.hi = fa_rows_hi(r, i1 - 1);
    return k;
}

/* Rows [i0, i1) (i0 < i1): the keys every row sees, [lo(i1 - 1), hi(i0)). A key tile inside it
   (fa_range_holds) needs no per-element mask. (A block wholly past a sequence, i1 <= i0, gets
   some run: its rows are never stored.) */
FA_ROWS_FN fa_range fa_rows_common(fa_rows r, fa_row_t i0, fa_row_t i1) {
    fa_range k;
    k.lo = fa_rows_lo(r, i1 - 1);
    k.hi = fa_rows_hi(r, i0);
    return k;
}

/* Keys [j0, j1) (0 <= j0 < j1 <= sk): the rows of [0, sq) that see at least one of them, one
   run since both ends of a row's range never decrease (the backward's key-major loops). */
FA_ROWS_FN fa_range fa_rows_seeing(fa_rows r, fa_row_t j0, fa_row_t j1) {
    fa_range q;
    q.lo = r.wr < 0 ? 0 : fa_row_max(0, j0 - r.diag - r.wr);
    q.hi = r.wl < 0 ? r.sq : fa_row_min(r.sq, j1 + r.wl - r.diag);
    return q;
}

/* Keys [j0, j1) (0 <= j0 < j1 <= sk): the rows of [0, sq) that see every one of them, one run
   by the same argument (lo(i) <= j0 and hi(i) >= j1). The mask rule for Inf and NaN looks for
   specials only among the other rows (cuda/masked_specials.cuh). */
FA_ROWS_FN fa_range fa_rows_seeing_all(fa_rows r, fa_row_t j0, fa_row_t j1) {
    fa_range q;
    q.lo = r.wr < 0 ? 0 : fa_row_max(0, j1 - 1 - r.diag - r.wr);
    q.hi = r.wl < 0 ? r.sq : fa_row_min(r.sq, j0 - r.diag + r.wl + 1);
    return q;
}

/* Whether [j0, j1) lies inside k. */
FA_ROWS_FN int fa_range_holds(fa_range k, fa_row_t j0, fa_row_t j1) {
    return k.lo <= j0 && j1 <= k.hi;
}

/* The tiles of n that cover the run k (k.lo >= 0): tile t holds [t n, t n + n). Empty, at
   k.lo / n, when k is. */
FA_ROWS_FN fa_range fa_range_tiles(fa_range k, fa_row_t n) {
    fa_range t;
    t.lo = k.lo / n;
    t.hi = k.hi > k.lo ? (k.hi - 1) / n + 1 : t.lo;
    return t;
}

/* A window side as the kernels take it: -1 (unbounded) for a negative width or one of at least
   len, which no row can reach when len bounds every sequence's keys (left side) or queries
   (right side); else w. Bounding windows by the lengths keeps the row arithmetic above within
   the lengths' own range. */
FA_ROWS_FN int64_t fa_window_norm(int64_t w, int64_t len) { return w < 0 || w >= len ? -1 : w; }

#endif /* FA_ROWS_H */
