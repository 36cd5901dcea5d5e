/*
 * cpu/fwd_amx_f32.c — the AMX forward for fp32 inputs (cpu_fwd_amx_bf16x6_f32): the tile
 * machinery of fwd_amx_tile.h with three bf16 parts per value (amx_split.h), driven so that
 * the workspace stays O(tile).
 */
#include "fwd_amx_tile.h"

/* ---- fp32: key tiles split per thread ---- */

/*
 * The fp32 forward does not pack K and V per call: three bf16 parts of them would take 1.5x
 * their size in the workspace, which stays O(tile) (tests/test_big.c). A thread splits each
 * key tile itself, into its own buffers, and runs GQ query tiles of one head on it, so that
 * the split's cost is shared (cpu.md). The split reads K and V rows straight from the
 * tensors, prefetched (see fetch_rows and pack_block_to).
 */
#define GQ 8

typedef struct split_ws {
    amx_bufs b[GQ];   /* own buffers per query tile; the shared ones are the same in each */
    uint16_t *k, *vt; /* the key tile: BK keys of K and of V^T, blocks of 32 keys as packed */
} split_ws;

/* Places a thread's buffers at base (or only counts, base NULL); returns its floats. */
static size_t split_layout(int dp, float *base, split_ws *w) {
    size_t off = 0;
    const size_t tile = (size_t)BK * dp * SPLIT_PARTS / 2; /* floats: bf16 pairs */
    w->k = (uint16_t *)fa_tm_take(base, &off, tile);
    w->vt = (uint16_t *)fa_tm_take(base, &off, tile);
    amx_layout_shared(dp, SPLIT_PARTS, base, &off, &w->b[0]);
    for (int g = 0; g < GQ; g++) {
        w->b[g].stg = w->b[0].stg;
        w->b[g].st = w->b[0].st;
        w->b[g].pt = w->b[0].pt;
        amx_layout_own(dp, SPLIT_PARTS, base, &off, &w->b[g]);
    }
    return off;
}

/* Query tiles t0 .. t0 + GQ - 1 of head h of sequence b; Q, K and V are split times mul's
   (amx_split.h: parts under 2^-126 read as zero; V * 2^-120 erred 0.023 at O's scale without
   its scale), and p's scale is the scores' for the scaled Q and K. */
FA_TM_HOT
static void split_item(const fa_problem *p, int64_t b, int64_t h, int64_t t0, const split_ws *w,
                       int dp, const split_muls *mul) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const int parts = SPLIT_PARTS;
    const int64_t bq = p->cu_q ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h);
    fa_tm_qrows q[GQ];
    int nq[GQ], nq32[GQ], n = 0;
    int64_t lo = INT64_MAX, hi = INT64_MIN; /* keys some row of the tiles sees */
    for (; n < GQ && (t0 + n) * BQ < sq; n++) {
        const int64_t i0 = (t0 + n) * BQ;
        const amx_bufs *B = &w->b[n];
        nq[n] = sq - i0 < BQ ? (int)(sq - i0) : BQ;
        nq32[n] = pad32(nq[n]);
        fa_tm_qrows_init(&q[n], p, i0, nq[n], sq, sk);
        load_q(p, B, bq, q0 + i0, h, nq[n], nq32[n], dp, parts, mul->q);
        memset(B->ot, 0, (size_t)dp * BQ * sizeof(float));
        for (int i = 0; i < BQ; i++) {
            B->m[i] = -INFINITY;
            B->l[i] = 0.0f;
        }
        if (q[n].ulo < q[n].uhi) {
            if (q[n].ulo < lo) lo = q[n].ulo;
            if (q[n].uhi > hi) hi = q[n].uhi;
        }
    }
    /* key tiles start on 32-key blocks; keys before a tile's ulo are masked out */
    for (int64_t j0 = lo < hi ? lo & ~(int64_t)31 : hi; j0 < hi; j0 += BK) {
        const int nk = hi - j0 < BK ? (int)(hi - j0) : BK;
        ktile t[GQ];
        int any = 0;
        for (int g = 0; g < n; g++) {
            const int64_t uhi = q[g].uhi;
            t[g].kind = FA_TM_NONE;
            if (q[g].ulo >= uhi || j0 >= uhi) continue;
            t[g].j0 = j0;
            t[g].nk = uhi - j0 < nk ? (int)(uhi - j0) : nk;
            t[g].nk32 = pad32(t[g].nk);
            t[g].kind = fa_tm_classify(&q[g], j0, j0 + t[g].nk);
            t[g].k = w->k;
            t[g].vt = w->vt;
            any |= t[g].kind != FA_TM_NONE;
        }
        if (!any) continue;
        AMX_FENCE();
        for (int j = 0; j < nk; j += KS) {
            const size_t off = (size_t)j * dp * parts;
            pack_block_to(p, w->b[0].stg, b, hk, j0 + j, w->k + off, w->vt + off, dp, parts,
                          mul->k, mul->v);
        }
        /* the next tile's rows, a share per query tile that runs */
        int runs = 0;
        for (int g = 0; g < n; g++) runs += t[g].kind != FA_TM_NONE;
        const int64_t share = (BK + runs - 1) / runs;
        row_fetch f = {p, b, hk, j0 + BK, 0};
        for (int g = 0; g < n; g++)
            if (t[g].kind != FA_TM_NONE) {
                f.r1 = f.r0 + share < hi ? f.r0 + share : hi;
                key_tile(p, &q[g], &w->b[g], &t[g], slope, nq[g], nq32[g], dp, parts, &f);
                f.r0 = f.r1;
            }
    }
    AMX_FENCE();
    float *lse = (float *)p->lse;
    /* the stores without FTZ: O / mul->v is subnormal where O is, and rounds there as plain
       fp32 does instead of flushing (V * 2^-120: 2^-6 errors at O's scale with FTZ) */
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr & ~0x8000u);
    for (int g = 0; g < n; g++) {
        const int64_t i0 = (t0 + g) * BQ;
        const fa_tm_qrows *rows = &q[g];
        store_out(p, &w->b[g], rows, bq, q0 + i0, h, nq[g], 1.0f / mul->v);
        /* m + log(l) in double: under the lazy max (fwd_amx_tile.h) m can lie up to LAZY below
           the row's max, and logf(l) of such an l (up to e^8 n) would err by half an ulp of
           a number near 8, twice what LSE itself needs, which the backward's P = exp(s - LSE)
           passes on to dV, past the 2x rule at d 256 */
        if (lse)
            for (int i = 0; i < nq[g]; i++)
                lse[b * p->lse_sb + h * p->lse_sh + (q0 + i0 + i) * p->lse_st] =
                    rows->lo[i] >= rows->hi[i]
                        ? -INFINITY
                        : (float)((double)w->b[g].m[i] + log((double)w->b[g].l[i]));
    }
    _mm_setcsr(csr);
}

size_t fa_cpu_amx_f32_fwd_ws(const fa_problem *p, int threads) {
    split_ws w;
    return FA_TM_WS_SLACK +
           (size_t)threads * split_layout(pad32((int)p->d), NULL, &w) * sizeof(float);
}

void fa_cpu_amx_f32_fwd(const fa_problem *p, void *ws, int threads) {
    const int dp = pad32((int)p->d);
    float *base = fa_tm_align(ws);
    split_ws unused;
    const size_t per_thread = split_layout(dp, NULL, &unused);
    amx_config cfg;
    amx_config_init(&cfg);
    const int64_t ntq = (p->seqlen_q + BQ - 1) / BQ; /* varlen: the longest sequence */
    const int64_t ng = (ntq + GQ - 1) / GQ;
    const int64_t items = p->batch * p->heads_q * ng;
    /* the items see the scores' scale for the scaled Q and K */
    const split_muls mul = split_muls_fp32(p, threads, 0);
    fa_problem ps = *p;
    ps.scale = mul.sscale;
#pragma omp parallel num_threads(threads)
    {
        split_ws w;
        split_layout(dp, base + per_thread * (size_t)fa_tm_tid(), &w);
        /* the tile state is per thread: configure it in each one, release it after */
        _tile_loadconfig(&cfg);
        const unsigned csr = split_mxcsr_enter();
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < items; it++) {
            /* last tiles first: under a causal mask they are the longest */
            const int64_t g = ng - 1 - it % ng, bh = it / ng;
            split_item(&ps, bh / p->heads_q, bh % p->heads_q, g * GQ, &w, dp, &mul);
        }
        split_mxcsr_leave(csr);
        _tile_release();
    }
}

