/*
 * cpu/kvcache.c — decoding against a KV cache on the CPU: the append of k_new/v_new, then
 * attention over the cache with an online softmax, split along the keys when the batch and
 * heads alone cannot keep the threads busy.
 *
 * A work item is one (sequence, block of kv heads, tile of packed query rows, key chunk). The
 * rows of a tile are the seqlen_q positions of every query head that reads a kv head (GQA
 * packing), so each K/V row is loaded and widened to fp32 once for the whole group; a
 * decode's block holds several kv heads (head_block), each key tile read head after head.
 * Decoding has few rows per head, and none of them is padding: the scores are dot products
 * along the head dim (decode_dot.h), written query-major, where the softmax reduces along
 * contiguous rows, and P V runs on exactly the head's rows (fa_tm_gemm_exact). A GQA group of
 * 4 once filled 4 of 16 score columns and 4 of 4 rows; of 1, 1 of 16 and 1 of 4.
 *
 * Split-KV: with splits > 1 the key range of each item's rows is cut into BK-aligned chunks;
 * each chunk writes its normalised fp32 partial output and LSE into the workspace, and
 * fa_cpu_merge combines them with the log-sum-exp correction (the fa_merge_attn kernel).
 */
#include <math.h>
#include <string.h>

#include "decode_dot.h"
#include "kvcache.h"
#include "../rotary.h"
#include "team.h"
#include "tile_math.h"

#define BQ FA_TM_BQ
#define BK FA_TM_BK
/* The fewest keys worth a chunk of their own: below this the merge and the per-item setup
   cost more than the parallelism gains. */
#define MIN_CHUNK 256
#define MAX_AUTO_SPLITS 64

typedef struct kv_bufs {
    float *q;     /* BQ x dp: packed query rows, zero beyond d */
    float *kf;    /* BK x dp: K tile */
    float *vf;    /* BK x dp: V tile */
    float *s;     /* BQ x BK: scores query-major, then unnormalised probabilities */
    float *o;     /* BQ x dp: output accumulator, scaled by exp(-m) */
    float *m, *l; /* BQ: running max and sum of each row */
} kv_bufs;

/* Places the buffers at base (or only counts, base NULL); returns floats per thread. */
static size_t kv_layout(int64_t d, float *base, kv_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->q = fa_tm_take(base, &off, BQ * dp);
    b->kf = fa_tm_take(base, &off, BK * dp);
    b->vf = fa_tm_take(base, &off, BK * dp);
    b->s = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->o = fa_tm_take(base, &off, BQ * dp);
    b->m = fa_tm_take(base, &off, BQ);
    b->l = fa_tm_take(base, &off, BQ);
    return off;
}

fa_cpu_tiles FA_ISA_FN(fa_cpu_kv_tiles)(void) {
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

/* ---- the plan ---- */

static int64_t row_tiles(const fa_problem *p) { return (p->seqlen_q * p->group + BQ - 1) / BQ; }

/* Kv heads per work item. A decode's few rows per head leave room in a tile for several
   heads, and their K and V rows lie side by side in the cache ([.., t, hk, d], paged too): an
   item that reads its heads' rows of a key tile one head after another consumes the block's
   part of each cache row, where one head's item read a d-wide slice of each (256 of every
   2048 bytes at 8 heads, d 128, f16), a stride the prefetchers and the TLB follow poorly:
   1.03-1.41x at 32k keys (bench/results/cpu/decode.md). A key tile's rows are in use until
   the block's last head has read them, so the block's K and V tiles are kept to half a
   512 KiB L2. */
#define HEAD_BLOCK_BYTES (256 << 10)
static int64_t head_block(const fa_problem *p) {
    const int64_t rows = p->seqlen_q * p->group;
    if (rows > BQ) return 1;
    const int64_t tile = (int64_t)BK * p->d * (int64_t)fa_dtype_size(p->dtype) * 2;
    int64_t hb = BQ / rows;
    if (hb > HEAD_BLOCK_BYTES / tile) hb = HEAD_BLOCK_BYTES / tile;
    if (hb > p->heads_kv) hb = p->heads_kv;
    return hb > 1 ? hb : 1;
}

static int64_t head_blocks(const fa_problem *p) {
    return (p->heads_kv + head_block(p) - 1) / head_block(p);
}

/* The first cache row sequence b attends to: its left padding (0 without cache_leftpad). */
static inline int64_t kv_first(const fa_problem *p, int64_t b) {
    return p->kv_leftpad ? p->kv_leftpad[b] : 0;
}

/* Keys the rows of sequence b can see at most: rows' ranges only move right with i, so the
   union lies within [lo(0), hi(sq - 1)). */
static int64_t visible_keys(const fa_problem *p, int64_t b) {
    int64_t sk = fa_kv_len(p, b), lo, hi, unused;
    fa_row_keys(p, 0, p->seqlen_q, sk, &lo, &unused);
    fa_row_keys(p, p->seqlen_q - 1, p->seqlen_q, sk, &unused, &hi);
    if (lo < kv_first(p, b)) lo = kv_first(p, b);
    return hi > lo ? hi - lo : 0;
}

/* Splits when the items without splitting leave threads idle: the fewest that reach 85% of
   the best thread occupancy any count up to the cap reaches, each chunk >= MIN_CHUNK keys. */
static int auto_splits(const fa_problem *p, int64_t units, int threads) {
    if (units >= threads) return 1;
    int64_t vis = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t v = visible_keys(p, b);
        if (v > vis) vis = v;
    }
    int64_t cap = vis / MIN_CHUNK;
    if (cap > MAX_AUTO_SPLITS) cap = MAX_AUTO_SPLITS;
    if (cap <= 1) return 1;
    double eff[MAX_AUTO_SPLITS + 1], best = 0;
    for (int64_t s = 1; s <= cap; s++) {
        int64_t n = units * s, waves = (n + threads - 1) / threads;
        eff[s] = (double)n / (double)(waves * threads);
        if (eff[s] > best) best = eff[s];
    }
    for (int64_t s = 1; s <= cap; s++)
        if (eff[s] >= 0.85 * best) return (int)s;
    return 1;
}

/* Workspace after the threads' tiles: the merge's part descriptors, then every split's LSE
   [batch, heads_q, seqlen_q] and output [batch, seqlen_q, heads_q, d], fp32. */
typedef struct kv_partials {
    fa_merge_part *parts;
    float *lse, *o;
    int64_t rows; /* batch * heads_q * seqlen_q: one split's LSE count */
} kv_partials;

static size_t partials_layout(const fa_problem *p, int splits, char *base, kv_partials *pt,
                              int *overflow) {
    int64_t rows = p->batch * p->heads_q * p->seqlen_q, floats, bytes;
    size_t head = ((size_t)splits * sizeof(fa_merge_part) + 63) & ~(size_t)63;
    pt->rows = rows;
    if (__builtin_mul_overflow(rows, p->d + 1, &floats) ||
        __builtin_mul_overflow(floats, (int64_t)splits * 4, &bytes) ||
        (uint64_t)bytes > SIZE_MAX - head) {
        *overflow = 1;
        return 0;
    }
    if (base) {
        pt->parts = (fa_merge_part *)base;
        pt->lse = (float *)(base + head);
        pt->o = pt->lse + (size_t)splits * rows;
    }
    return head + (size_t)bytes;
}

fa_cpu_kv_plan FA_ISA_FN(fa_cpu_kv_plan_of)(const fa_problem *p, int threads) {
    fa_cpu_kv_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.threads = threads < 1 ? 1 : threads;
    int64_t units = p->batch * head_blocks(p) * row_tiles(p);
    pl.splits = p->num_splits > 0 ? p->num_splits : auto_splits(p, units, pl.threads);
    if (__builtin_mul_overflow(units, (int64_t)pl.splits, &pl.items)) pl.overflow = 1;
    kv_bufs unused;
    pl.ws_bytes = FA_TM_WS_SLACK + (size_t)pl.threads * kv_layout(p->d, NULL, &unused) * 4;
    if (pl.splits > 1) {
        kv_partials pt;
        size_t extra = partials_layout(p, pl.splits, NULL, &pt, &pl.overflow);
        if (extra > SIZE_MAX - pl.ws_bytes) pl.overflow = 1;
        pl.ws_bytes += extra;
    }
    if (pl.overflow) pl.ws_bytes = 0;
    return pl;
}

/* ---- the append ---- */

/* Row (b, t, head hk) of the cache operand a (k or v): through the block table when paged. */
FA_TM_INLINE void *kv_row(const fa_problem *p, const fa_operand *a, size_t es, int64_t b,
                          int64_t t, int64_t hk) {
    if (!p->block_table) return fa_tm_row(a, es, b, t, hk);
    const int64_t page = p->block_table[b * p->bt_stride + t / p->page_size];
    return fa_tm_row(a, es, page, t % p->page_size, hk);
}

/* Row (b, t) of k_new into the cache at pos: copied, or rotated as position pos (fused
   rotary: in fp32, stored once in the cache's dtype). */
static void append_k(const fa_problem *p, size_t es, int64_t b, int64_t t, int64_t pos,
                     int64_t h) {
    void *dst = kv_row(p, &p->k, es, b, pos, h);
    const void *src = fa_tm_row(&p->k_new, es, b, t, h);
    if (!p->rot_dim) {
        memcpy(dst, src, (size_t)p->d * es);
        return;
    }
    float x[FA_MAX_HEAD_DIM];
    fa_tm_load_row(x, src, p->dtype, (int)p->d, (int)p->d, 1.0f);
    fa_rotary_row(x, p, pos);
    fa_tm_store_row(dst, p->dtype, x, (int)p->d, 1.0f);
}

static void append_item(void *arg, int64_t w) {
    const fa_problem *p = arg;
    const size_t es = fa_dtype_size(p->dtype), bytes = (size_t)p->d * es;
    const int64_t b = w / p->seqlen_new, t = w % p->seqlen_new, pos = p->kv_seqlens[b] + t;
    for (int64_t h = 0; h < p->heads_kv; h++) {
        append_k(p, es, b, t, pos, h);
        memcpy(kv_row(p, &p->v, es, b, pos, h), fa_tm_row(&p->v_new, es, b, t, h), bytes);
    }
}

/* The copy runs on the calling thread below 65536 elements a side: a team costs more than
   copying that much. */
static void append(const fa_problem *p, int threads) {
    if (!p->k_new.data) return;
    const int64_t n = p->batch * p->seqlen_new;
    fa_cpu_for(n * p->heads_kv * p->d > 65536 ? threads : 1, n, append_item, (void *)p);
}

/* ---- attention ---- */

/* The packed rows of one kv head of an item: row r is query position i[r] of query head h[r]
   = hk group + g[r]. The positions, masks and key ranges are every head's; h is that of the
   head rows_head set last. */
typedef struct kv_rows {
    fa_tm_qrows q;  /* visible keys of each row within the item's chunk, and their union */
    int64_t i[BQ], g[BQ], h[BQ], diag[BQ];
    int alibi;
} kv_rows;

/* The query heads of the rows for kv head hk. */
static void rows_head(kv_rows *R, const fa_problem *p, int64_t hk) {
    for (int r = 0; r < R->q.n; r++) R->h[r] = hk * p->group + R->g[r];
}

/* Fills the rows of tile rt, then narrows them to chunk s of their union (BK-aligned). */
static void rows_init(kv_rows *R, const fa_problem *p, int64_t b, int64_t hk, int64_t rt,
                      int s, int splits) {
    const int64_t sq = p->seqlen_q, sk = fa_kv_len(p, b), r0 = rt * BQ;
    const int64_t nrows = sq * p->group;
    const int nr = nrows - r0 < BQ ? (int)(nrows - r0) : BQ;
    R->q.n = nr;
    R->alibi = p->alibi != NULL;
    for (int r = 0; r < nr; r++) {
        const int64_t pr = r0 + r;
        R->i[r] = pr % sq;
        R->g[r] = pr / sq;
        R->diag[r] = R->i[r] + sk - sq;
        fa_row_keys(p, R->i[r], sq, sk, &R->q.lo[r], &R->q.hi[r]);
        /* rows before the left padding are no keys (and are never read) */
        if (R->q.lo[r] < kv_first(p, b)) R->q.lo[r] = kv_first(p, b);
    }
    fa_tm_qrows_bounds(&R->q);
    rows_head(R, p, hk);
    const int64_t u0 = R->q.ulo, u1 = R->q.uhi;
    int64_t c0 = u0, c1 = u1;
    if (splits > 1 && u0 < u1) {
        const int64_t per = ((u1 - u0 + splits - 1) / splits + BK - 1) / BK * BK;
        c0 = u0 + s * per;
        c1 = c0 + per < u1 ? c0 + per : u1;
    }
    for (int r = 0; r < nr; r++) {
        if (R->q.lo[r] < c0) R->q.lo[r] = c0;
        if (R->q.hi[r] > c1) R->q.hi[r] = c1;
    }
    fa_tm_qrows_bounds(&R->q);
}

/* The rows' masks seen from key tile j0 (padding rows see nothing). */
FA_TM_INLINE void rel_init(fa_tm_rel *rel, const kv_rows *R, int64_t j0) {
    for (int r = 0; r < BQ; r++) {
        const int real = r < R->q.n;
        rel->lo[r] = real ? fa_tm_clampk(R->q.lo[r] - j0) : 0;
        rel->hi[r] = real ? fa_tm_clampk(R->q.hi[r] - j0) : 0;
        rel->diag[r] = real ? (float)(R->diag[r] - j0) : 0.0f;
    }
}

/* ALiBi with a slope per row (the rows of a tile belong to several heads). Masked scores are
   -inf already and stay so. */
FA_TM_INLINE void alibi_rows(float *restrict sm, const float *slope, int nr, const fa_tm_rel *rel,
                             int nk) {
    for (int r = 0; r < nr; r++) {
        float *restrict s = sm + (ptrdiff_t)r * BK;
        const float sl = slope[r], dg = rel->diag[r];
        FA_TM_SIMD
        for (int j = 0; j < nk; j++) /* in double, rounded once: see tile_math.h */
            s[j] = (float)((double)s[j] - (double)sl * fabsf(dg - (float)j));
    }
}

/* Online softmax along each row of a query-major score tile: scores become probabilities
   relative to the row's new max; l and the accumulator row are rescaled to it. A row that
   has seen no visible key yet keeps max -inf and gets zero probabilities (never NaN). */
FA_TM_INLINE void softmax_rows(const kv_bufs *B, int nr, int nk, int dp) {
    for (int r = 0; r < nr; r++) {
        float *restrict s = B->s + (ptrdiff_t)r * BK;
        float mx = B->m[r];
        for (int j = 0; j < nk; j++) mx = s[j] > mx ? s[j] : mx;
        if (mx == -INFINITY) {
            memset(s, 0, (size_t)nk * sizeof(float));
            continue;
        }
        const float alpha = expf(B->m[r] - mx);
        const float sum = fa_vexp_row(s, s, nk, 1.0f, mx);
        B->l[r] = B->l[r] * alpha + sum;
        B->m[r] = mx;
        if (alpha != 1.0f) {
            float *restrict o = B->o + (ptrdiff_t)r * dp;
            FA_TM_SIMD
            for (int x = 0; x < dp; x++) o[x] *= alpha;
        }
    }
}

FA_TM_INLINE void prefetch_row(const void *row, size_t bytes) {
#if defined(__GNUC__)
    const char *c = (const char *)row;
    for (size_t x = 0; x < bytes; x += 64) __builtin_prefetch(c + x, 0, 3);
    __builtin_prefetch(c + bytes - 1, 0, 3);
#else
    (void)row, (void)bytes;
#endif
}

/* K and V rows [j0, j0 + nk) of the item's sequence and kv head, fetching the rows of the
   next tile meanwhile (rows of one head sit heads_kv * d apart, a stride the hardware
   prefetchers do not follow, and pages are scattered). */
FA_TM_INLINE void load_kv(const kv_bufs *B, const fa_problem *p, int64_t b, int64_t hk,
                          int64_t j0, int nk, int64_t next_end) {
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    for (int j = 0; j < nk; j++) {
        const int64_t t = j0 + j, tn = t + BK;
        fa_tm_load_row(B->kf + (ptrdiff_t)j * dp, kv_row(p, &p->k, es, b, t, hk), dt, d, dp,
                       1.0f);
        fa_tm_load_row(B->vf + (ptrdiff_t)j * dp, kv_row(p, &p->v, es, b, t, hk), dt, d, dp,
                       1.0f);
        if (tn < next_end) {
            prefetch_row(kv_row(p, &p->k, es, b, tn, hk), (size_t)d * es);
            prefetch_row(kv_row(p, &p->v, es, b, tn, hk), (size_t)d * es);
        }
    }
}

/* The tile's K and V rows read where they lie, or NULL when they must be loaded: fp32 rows of
   a contiguous cache whose head dim is a whole number of 16-float blocks are already what the
   matmuls take (rows st apart, no padding columns), so copying them into the tiles would
   only read them twice. The next tile's rows are fetched meanwhile, as load_kv does. */
FA_TM_INLINE int kv_in_place(const fa_problem *p, int64_t b, int64_t hk, int64_t j0, int nk,
                             int64_t next_end, const float **k, const float **v) {
    if (p->dtype != FA_DTYPE_F32 || p->block_table || p->d % 16 || p->k.st <= 0 ||
        p->v.st <= 0)
        return 0;
    *k = (const float *)fa_tm_row(&p->k, 4, b, j0, hk);
    *v = (const float *)fa_tm_row(&p->v, 4, b, j0, hk);
    for (int j = 0; j < nk && j0 + BK + j < next_end; j++) {
        prefetch_row(fa_tm_row(&p->k, 4, b, j0 + BK + j, hk), (size_t)p->d * 4);
        prefetch_row(fa_tm_row(&p->v, 4, b, j0 + BK + j, hk), (size_t)p->d * 4);
    }
    return 1;
}

/* Where an item's rows go: the output (one split) or the split's fp32 partials. */
static void store_rows(const fa_problem *p, const kv_bufs *B, const kv_rows *R, int64_t b,
                       int s, int splits, const kv_partials *pt, float vd) {
    const fa_dtype dt = p->odtype; /* FP8 inputs write a wider output */
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int64_t sq = p->seqlen_q, hq = p->heads_q;
    float *lse = (float *)p->lse;
    for (int r = 0; r < R->q.n; r++) {
        const int64_t i = R->i[r], h = R->h[r];
        const int empty = R->q.lo[r] >= R->q.hi[r];
        float *restrict o = B->o + (ptrdiff_t)r * dp;
        float row_lse = -INFINITY;
        if (!empty) {
            /* V's descale (FP8; else 1) scales the finished row, partials included: the
               merge is linear in them */
            const float li = B->l[r];
            FA_TM_SIMD
            for (int x = 0; x < d; x++) o[x] = o[x] / li * vd;
            row_lse = B->m[r] + logf(li);
        }
        if (splits > 1) { /* an empty chunk's output is never read: only its LSE */
            const int64_t row = (b * sq + i) * hq + h;
            pt->lse[s * pt->rows + (b * hq + h) * sq + i] = row_lse;
            if (!empty) memcpy(pt->o + ((size_t)s * pt->rows + row) * d, o, (size_t)d * 4);
            continue;
        }
        void *orow = fa_tm_row(&p->o, es, b, i, h);
        if (empty)
            fa_tm_store_zero(orow, dt, d);
        else
            fa_tm_store_row(orow, dt, o, d, 1.0f);
        if (lse) lse[b * p->lse_sb + h * p->lse_sh + i * p->lse_st] = row_lse;
    }
}

/* Kv head t's share of an item's buffers: its rows of q, o, m and l (the score tile and the
   K/V tiles are reused head after head). */
static kv_bufs head_bufs(const kv_bufs *B, int t, int nr, int dp) {
    kv_bufs h = *B;
    h.q += (ptrdiff_t)t * nr * dp;
    h.o += (ptrdiff_t)t * nr * dp;
    h.m += t * nr;
    h.l += t * nr;
    return h;
}

FA_TM_HOT
static void kv_item(const fa_problem *p, int64_t w, int splits, float *ws, const kv_partials *pt) {
    const int64_t nrt = row_tiles(p), nhb = head_blocks(p), hb = head_block(p);
    const int s = (int)(w % splits);
    const int64_t rt = w / splits % nrt, bh = w / splits / nrt;
    const int64_t b = bh / nhb, hk0 = bh % nhb * hb;
    const int nh = (int)(p->heads_kv - hk0 < hb ? p->heads_kv - hk0 : hb);
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    kv_bufs B;
    kv_layout(d, ws, &B);
    kv_rows R;
    rows_init(&R, p, b, hk0, rt, s, splits);
    const int nr = R.q.n;
    /* FP8: Q's and K's descales join the softmax scale (1 for other dtypes) */
    float scale[BQ], vd[BQ], slope[BQ]; /* slope: per row of every head, t nr + r */
    for (int t = 0; t < nh; t++) {
        const int64_t hk = hk0 + t;
        scale[t] = p->scale * fa_descale(p, p->q_descale, b, hk) *
                   fa_descale(p, p->k_descale, b, hk);
        vd[t] = fa_descale(p, p->v_descale, b, hk);
        if (t) rows_head(&R, p, hk);
        for (int r = 0; r < nr; r++) slope[t * nr + r] = fa_alibi_slope(p, b, R.h[r]);
        float *q = B.q + (ptrdiff_t)t * nr * dp;
        for (int r = 0; r < nr; r++)
            fa_tm_load_row(q + (ptrdiff_t)r * dp, fa_tm_row(&p->q, es, b, R.i[r], R.h[r]), dt,
                           d, dp, 1.0f);
        /* fused rotary: each query row rotated in fp32 as it is used (q itself is not
           written) */
        if (p->rot_dim)
            for (int r = 0; r < nr; r++)
                fa_rotary_row(q + (ptrdiff_t)r * dp, p, fa_rotary_q_pos(p, b, R.i[r]));
    }
    memset(B.o, 0, (size_t)(nh * nr) * dp * sizeof(float));
    for (int r = 0; r < nh * nr; r++) {
        B.m[r] = -INFINITY;
        B.l[r] = 0.0f;
    }

    fa_tm_rel rel;
    for (int64_t j0 = R.q.ulo; j0 < R.q.uhi; j0 += BK) {
        const int nk = R.q.uhi - j0 < BK ? (int)(R.q.uhi - j0) : BK;
        const int kind = fa_tm_classify(&R.q, j0, j0 + nk);
        if (kind == FA_TM_NONE) continue;
        rel_init(&rel, &R, j0);
        /* the heads in turn: each reads its slice of the same cache rows */
        for (int t = 0; t < nh; t++) {
            const int64_t hk = hk0 + t;
            const kv_bufs H = head_bufs(&B, t, nr, dp);
            const float *kt = H.kf, *vt = H.vf;
            ptrdiff_t ldk = dp, ldv = dp;
            if (kv_in_place(p, b, hk, j0, nk, R.q.uhi, &kt, &vt)) {
                ldk = (ptrdiff_t)p->k.st;
                ldv = (ptrdiff_t)p->v.st;
            } else {
                load_kv(&H, p, b, hk, j0, nk, R.q.uhi);
            }
            fa_dd_scores(nr, nk, kt, ldk, H.q, dp, dp, H.s, BK, scale[t]);
            fa_tm_scores_qmajor(H.s, NULL, nr, nk, &rel, 1.0f, p->softcap, 0.0f,
                                kind == FA_TM_PARTIAL);
            if (R.alibi) alibi_rows(H.s, slope + t * nr, nr, &rel, nk);
            softmax_rows(&H, nr, nk, dp);
            /* O[r][x] += sum_j P[r][j] V[j][x]; where the tile has a mask edge and V an Inf
               or NaN, the masked keys are skipped (their P is 0, but 0 * Inf or NaN is NaN) */
            if (kind == FA_TM_PARTIAL && !fa_tm_rows_finite(vt, nk, dp, ldv))
                fa_tm_gemm_vis(nr, dp, nk, rel.lo, rel.hi, 0, H.s, BK, 1, vt, ldv, H.o, dp);
            else
                fa_tm_gemm_exact(nr, dp, nk, H.s, BK, 1, vt, ldv, H.o, dp);
        }
    }
    for (int t = 0; t < nh; t++) {
        const kv_bufs H = head_bufs(&B, t, nr, dp);
        rows_head(&R, p, hk0 + t);
        store_rows(p, &H, &R, b, s, splits, pt, vd[t]);
    }
}

/* The merge of the splits' partials into out / lse, as fa_merge_attn would do it. */
static void merge_splits(const fa_problem *p, int splits, const kv_partials *pt, int threads) {
    const int64_t sq = p->seqlen_q, hq = p->heads_q, d = p->d;
    for (int s = 0; s < splits; s++) {
        fa_merge_part *m = &pt->parts[s];
        m->o.data = pt->o + (size_t)s * pt->rows * d;
        m->o.sb = sq * hq * d;
        m->o.st = hq * d;
        m->o.sh = d;
        m->lse = pt->lse + (size_t)s * pt->rows;
        m->lse_sb = hq * sq;
        m->lse_sh = sq;
        m->lse_st = 1;
    }
    fa_merge_problem m = {splits, pt->parts, FA_DTYPE_F32, p->odtype, p->batch, sq, hq, d,
                          p->o, (float *)p->lse, p->lse_sb, p->lse_sh, p->lse_st};
    fa_cpu_merge(&m, fa_cpu_team(threads, fa_cpu_merge_flops(&m)));
}

typedef struct kv_run {
    const fa_problem *p;
    int splits;
    float *tiles;
    size_t per_thread;
    const kv_partials *pt;
} kv_run;

static void kv_run_item(void *arg, int64_t w) {
    const kv_run *r = arg;
    kv_item(r->p, w, r->splits, r->tiles + r->per_thread * (size_t)fa_tm_tid(), r->pt);
}

void FA_ISA_FN(fa_cpu_fwd_kvcache)(const fa_problem *p, const fa_cpu_kv_plan *plan, void *ws) {
    const int threads = plan->threads, splits = plan->splits;
    append(p, threads);
    kv_bufs unused;
    const size_t per_thread = kv_layout(p->d, NULL, &unused);
    float *tiles = fa_tm_align(ws);
    kv_partials pt;
    memset(&pt, 0, sizeof pt);
    if (splits > 1) {
        int overflow = 0;
        partials_layout(p, splits, (char *)(tiles + per_thread * (size_t)threads), &pt, &overflow);
    }
    kv_run r = {p, splits, tiles, per_thread, &pt};
    fa_cpu_for(threads, plan->items, kv_run_item, &r);
    if (splits > 1) merge_splits(p, splits, &pt, threads);
}
