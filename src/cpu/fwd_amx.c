/*
 * cpu/fwd_amx.c — FlashAttention forward on AMX (the `amx` level, isa.h): the bf16 driver and
 * the level's table. The tile machinery is fwd_amx_tile.h's; fp32 inputs go to
 * fwd_amx_f32.c.
 *
 * Work item = one query tile of one (batch, head). K and V are packed once per call into the
 * workspace (K as zero-padded bf16 rows, V transposed in blocks of 32 keys), not once per
 * query tile: every query tile of every head of a GQA group then reads them as contiguous
 * 1 KiB tiles. This costs a copy of K and V in the workspace (PyTorch's CPU flash attention
 * does the same); the per-thread buffers stay O(tile).
 */
#include "fwd_amx_tile.h"

/* ---- packed K and V (shared by all threads, written once per call) ---- */

typedef struct amx_pack {
    uint16_t *k;  /* per kv head: rows of dp bf16, head dim zero-padded, keys padded to 32 */
    uint16_t *vt; /* same offsets: per block of 32 keys, dp rows of 32 keys (V transposed) */
    int64_t rows; /* rows per kv head, all sequences */
    int dp;       /* head dim padded to 32 */
} amx_pack;

/* Rows of one kv head: each sequence gets its length padded to 32 (varlen: the token offset
   plus 32 per earlier sequence bounds every padded prefix). */
static int64_t pack_rows(const fa_problem *p) {
    return p->cu_k ? p->total_k + 32 * p->batch : p->batch * pad32l(p->seqlen_k);
}

static int64_t pack_row0(const fa_problem *p, int64_t b) {
    return p->cu_k ? p->cu_k[b] + 32 * b : b * pad32l(p->seqlen_k);
}

static size_t pack_bytes(const fa_problem *p) {
    const size_t dp = (size_t)pad32((int)p->d);
    const size_t one = (size_t)p->heads_kv * (size_t)pack_rows(p) * dp * 2;
    return (one + 63) & ~(size_t)63;
}

/* Packs keys [j, j + 32) of kv head hk of sequence b into the call's bf16 copy. */
static void pack_block(const fa_problem *p, const amx_pack *pk, uint16_t *stg, int64_t b,
                       int64_t hk, int64_t j) {
    const size_t off = (size_t)(hk * pk->rows + pack_row0(p, b) + j) * (size_t)pk->dp;
    pack_block_to(p, stg, b, hk, j, pk->k + off, pk->vt + off, pk->dp, 1, 1.0f, 1.0f);
}

/* ---- one work item ---- */

/* The first key tile at or after j0 (a multiple of 32) that some query row of the tile sees;
   0 when there is none left. */
static int find_tile(const fa_tm_qrows *rows, const amx_pack *pk, size_t head0, int64_t j0,
                     ktile *t) {
    for (; j0 < rows->uhi; j0 += BK) {
        const int nk = rows->uhi - j0 < BK ? (int)(rows->uhi - j0) : BK;
        const int kind = fa_tm_classify(rows, j0, j0 + nk);
        if (kind == FA_TM_NONE) continue;
        t->j0 = j0;
        t->nk = nk;
        t->nk32 = pad32(nk);
        t->kind = kind;
        t->k = pk->k + head0 + (size_t)j0 * pk->dp;
        t->vt = pk->vt + head0 + (size_t)j0 * pk->dp;
        return 1;
    }
    return 0;
}

FA_TM_HOT
static void amx_item(const fa_problem *p, const amx_pack *pk, int64_t b, int64_t h, int64_t i0,
                     float *ws) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    if (i0 >= sq) return;
    const int dp = pk->dp, parts = 1;
    const int nq = sq - i0 < BQ ? (int)(sq - i0) : BQ, nq32 = pad32(nq);
    const int64_t bq = p->cu_q ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h);
    amx_bufs B;
    amx_layout(dp, parts, ws, &B);

    fa_tm_qrows q;
    fa_tm_qrows_init(&q, p, i0, nq, sq, sk);
    const fa_tm_qrows *rows = &q;

    load_q(p, &B, bq, q0 + i0, h, nq, nq32, dp, parts, 1.0f);
    memset(B.ot, 0, (size_t)dp * BQ * sizeof(float));
    for (int i = 0; i < BQ; i++) {
        B.m[i] = -INFINITY;
        B.l[i] = 0.0f;
    }

    const size_t head0 = (size_t)(hk * pk->rows + pack_row0(p, b)) * (size_t)dp;
    ktile t;
    /* key tiles start on the packing's 32-key blocks; keys before ulo are masked out */
    int64_t j0 = rows->ulo < rows->uhi ? rows->ulo & ~(int64_t)31 : rows->uhi;
    for (; find_tile(&q, pk, head0, j0, &t); j0 = t.j0 + BK)
        key_tile(p, &q, &B, &t, slope, nq, nq32, dp, parts, NULL);
    AMX_FENCE();

    store_out(p, &B, rows, bq, q0 + i0, h, nq, 1.0f);
    float *lse = (float *)p->lse;
    if (lse)
        for (int i = 0; i < nq; i++)
            lse[b * p->lse_sb + h * p->lse_sh + (q0 + i0 + i) * p->lse_st] =
                rows->lo[i] >= rows->hi[i] ? -INFINITY : B.m[i] + logf(B.l[i]);
}

/* ---- entry points ---- */

/* Every bf16 forward, and every fp32 one unless FLASHATTN_CPU_F32_AMX=0 sends those to the
   avx512 level's FMA kernel: all masks, softcap, ALiBi, GQA, varlen, strides, head dims to
   256; not dropout. */
static int amx_takes(const fa_problem *p) {
    /* no dropout here: the avx512 tiled kernel applies dropout.h's mask (backend.c says so) */
    if (p->d > 256 || p->drop_p > 0) return 0;
    return p->dtype == FA_DTYPE_BF16 || (p->dtype == FA_DTYPE_F32 && fa_cpu_f32_amx_enabled());
}

/* The fp32 forward's name says how its products run: six split-bf16 products each. */
static const char *amx_method(const fa_problem *p) {
    return p->dtype == FA_DTYPE_F32 ? "bf16x6" : NULL;
}

static fa_cpu_tiles amx_tiles(const fa_problem *p) {
    (void)p;
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

static size_t amx_ws(const fa_problem *p, int threads) {
    if (threads < 1) threads = 1;
    if (p->dtype == FA_DTYPE_F32) {
        return fa_cpu_amx_f32_fwd_ws(p, threads);
    }
    amx_bufs b;
    return FA_TM_WS_SLACK + 2 * pack_bytes(p) +
           (size_t)threads * amx_layout(pad32((int)p->d), 1, NULL, &b) * sizeof(float);
}

static void amx_fwd(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    if (p->dtype == FA_DTYPE_F32) {
        fa_cpu_amx_f32_fwd(p, ws, threads);
        return;
    }
    amx_pack pk;
    pk.dp = pad32((int)p->d);
    pk.rows = pack_rows(p);
    char *base = (char *)fa_tm_align(ws);
    pk.k = (uint16_t *)base;
    pk.vt = (uint16_t *)(base + pack_bytes(p));
    float *tbase = (float *)(base + 2 * pack_bytes(p));
    amx_bufs unused;
    const size_t per_thread = amx_layout(pk.dp, 1, NULL, &unused);

    amx_config cfg;
    amx_config_init(&cfg);

    const int64_t nkb = pad32l(p->seqlen_k) / KS; /* 32-key blocks of the longest sequence */
    const int64_t packs = p->heads_kv * p->batch * nkb;
    const int64_t ntq = (p->seqlen_q + BQ - 1) / BQ; /* varlen: the longest sequence */
    const int64_t items = p->batch * p->heads_q * ntq;
#pragma omp parallel num_threads(threads)
    {
        float *mine = tbase + per_thread * (size_t)fa_tm_tid();
        amx_bufs B;
        amx_layout(pk.dp, 1, mine, &B);
#pragma omp for schedule(static)
        for (int64_t w = 0; w < packs; w++) {
            const int64_t hk = w / (p->batch * nkb), b = w / nkb % p->batch, j = w % nkb * KS;
            int64_t q0, sq, k0, sk;
            fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
            if (j < sk) pack_block(p, &pk, B.stg, b, hk, j);
        }
        /* the tile state is per thread: configure it in each one, release it after */
        _tile_loadconfig(&cfg);
#pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < items; w++) {
            /* last tiles first: under a causal mask they are the longest */
            const int64_t t = ntq - 1 - w % ntq, bh = w / ntq;
            amx_item(p, &pk, bh / p->heads_q, bh % p->heads_q, t * BQ, mine);
        }
        _tile_release();
    }
}

static void vexp_array(float *x, size_t n) {
    size_t i = 0;
    for (; i + FA_VW <= n; i += FA_VW) fa_vstore(x + i, fa_vexp(fa_vload(x + i)));
    if (i < n) fa_vexp_row(x + i, x + i, (int)(n - i), 1.0f, 0.0f);
}

/* The amx level: its own forward and backward for bf16 and fp32 (bwd_amx.c), the avx512
   level's kernels for everything else. */
extern const fa_cpu_isa_ops fa_cpu_isa_ops_avx512;

const fa_cpu_isa_ops fa_cpu_isa_ops_amx = {
    .name = "amx",
    .fwd_tiles = amx_tiles,
    .fwd_ws = amx_ws,
    .fwd = amx_fwd,
    .bwd_tiles = fa_cpu_amx_bwd_tiles,
    .bwd_ws = fa_cpu_amx_bwd_ws,
    .bwd = fa_cpu_amx_bwd,
    .exp = vexp_array,
    .base = &fa_cpu_isa_ops_avx512,
    .fwd_takes = amx_takes,
    .fwd_method = amx_method,
    .bwd_method = fa_cpu_amx_bwd_method,
    .bwd_takes = fa_cpu_amx_bwd_takes,
};
