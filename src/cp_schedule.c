/*
 * cp_schedule.c — which attention calls rank r makes against source s's K/V shard.
 *
 * Rule per pair (query chunk i, key chunk j), with a causal mask: j > i is skipped (every key
 * after every query), j == i is causal (one square chunk), j < i is full; without a mask all
 * pairs are full. Pairs are coalesced into few calls: the rank's own shard is one causal call
 * over the whole shard (a shard is a run of increasing positions with sq == sk, so the local
 * bottom-right causal mask is exactly the global one); elsewhere no pair is causal, and
 * consecutive query chunks seeing the same key chunks share one call per contiguous run of
 * them. The same rule as python/flashattn/distributed/_schedule.py, so both rings agree.
 */
#include "cp_schedule.h"

#include "flashattn.h"

int fa_cp_layout_ok(int layout) { return layout == FA_CP_CONTIGUOUS || layout == FA_CP_ZIGZAG; }

int fa_cp_spans(int64_t seqlen, int world, int rank, int layout, fa_cp_span *spans) {
    if (seqlen < 0 || world < 1 || rank < 0 || rank >= world || !fa_cp_layout_ok(layout))
        return 0;
    /* S = q * c + m: the first m chunks take one token more, so shards differ by at most one */
    const int64_t c = layout == FA_CP_ZIGZAG ? 2 * (int64_t)world : world;
    const int64_t q = seqlen / c, m = seqlen % c;
    const int64_t idx[2] = {rank, 2 * (int64_t)world - 1 - rank};
    const int n = layout == FA_CP_ZIGZAG ? 2 : 1;
    int64_t local = 0;
    for (int i = 0; i < n; i++) {
        const int64_t j = idx[i];
        spans[i].chunk = j;
        spans[i].start = j * q + (j < m ? j : m);
        spans[i].len = q + (j < m ? 1 : 0);
        spans[i].local = local;
        local += spans[i].len;
    }
    return n;
}

int64_t fa_cp_shard_len(int64_t seqlen, int world, int rank, int layout) {
    fa_cp_span sp[2];
    const int n = fa_cp_spans(seqlen, world, rank, layout, sp);
    if (!n) return -1;
    return n == 2 ? sp[0].len + sp[1].len : sp[0].len;
}

int fa_cp_blocks(int64_t seqlen, int world, int rank, int source, int causal, int layout,
                 fa_cp_block *out) {
    fa_cp_span qs[2], ks[2];
    const int nq = fa_cp_spans(seqlen, world, rank, layout, qs);
    const int nk = fa_cp_spans(seqlen, world, source, layout, ks);
    if (!nq || !nk) return -1;
    if (source == rank) {
        const int64_t len = fa_cp_shard_len(seqlen, world, rank, layout);
        if (len == 0) return 0;
        out[0] = (fa_cp_block){0, len, 0, len, causal != 0};
        return 1;
    }
    /* query groups: [q0, q1) and the mask of key spans they see (bit i: span i) */
    int64_t g0[2], g1[2];
    unsigned gseen[2];
    int ng = 0;
    for (int a = 0; a < nq; a++) {
        unsigned seen = 0;
        for (int b = 0; b < nk; b++) /* distinct ranks hold distinct chunks: never causal */
            if ((!causal || ks[b].chunk < qs[a].chunk) && ks[b].len > 0) seen |= 1u << b;
        if (qs[a].len == 0 || !seen) continue;
        if (ng && g1[ng - 1] == qs[a].local && gseen[ng - 1] == seen) {
            g1[ng - 1] = qs[a].local + qs[a].len;
        } else {
            g0[ng] = qs[a].local;
            g1[ng] = qs[a].local + qs[a].len;
            gseen[ng] = seen;
            ng++;
        }
    }
    int n = 0;
    for (int g = 0; g < ng; g++) {
        int64_t r0[2], r1[2];
        int nr = 0;
        for (int b = 0; b < nk; b++) {
            if (!(gseen[g] >> b & 1u)) continue;
            if (nr && r1[nr - 1] == ks[b].local) {
                r1[nr - 1] = ks[b].local + ks[b].len;
            } else {
                r0[nr] = ks[b].local;
                r1[nr] = ks[b].local + ks[b].len;
                nr++;
            }
        }
        for (int i = 0; i < nr; i++) out[n++] = (fa_cp_block){g0[g], g1[g], r0[i], r1[i], 0};
    }
    return n;
}
