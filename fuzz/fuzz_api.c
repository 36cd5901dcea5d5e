/*
 * fuzz_api.c — libFuzzer target: the input's bytes become one public call on the CPU backend
 * (fa_fwd, fa_bwd, fa_fwd_kvcache or fa_merge_attn: small shapes, odd and overlapping strides,
 * huge strides on unit dimensions, every fa_params option, varlen prefix sums, KV-cache
 * lengths and page tables, tensor contents with NaN, Inf, huge and subnormal values), with
 * every tensor inside one heap arena of exactly the bytes they span, so that ASan catches a
 * read or write past them. Index arrays and ALiBi slopes are heap blocks of exactly the
 * documented length. It aborts (libFuzzer reports it) when:
 *  - a call fails and any byte of the arena changed, or fa_last_error() is empty;
 *  - a call succeeds and wrote a byte that belongs to no output element;
 *  - a call succeeds on finite inputs whose exact results are finite (fuzz_oracle.h) and an
 *    output element is not finite (an LSE may be -inf: a row that sees no key).
 * Hostile fields (zero, negative or overflowing shapes and strides, bad ranks, dtypes,
 * devices, NULL or misaligned data) are made before the arena is laid out, so the arena
 * always holds every tensor the library could accept: an ASan report is the library's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "fuzz_call.h"

#define FZ_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "fuzz_api: " __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                              \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

enum { OP_FWD, OP_BWD, OP_KV, OP_MERGE };
static const char *const op_name[] = {"fa_fwd", "fa_bwd", "fa_fwd_kvcache", "fa_merge_attn"};

static fa_context *ctx;

/* A head dim: mostly small, sometimes one of the kernels' edges, 257 to be refused. */
static int64_t pick_d(fz *f) {
    static const int64_t d[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64, 65, 96, 128, 256, 257};
    return fz_one_in(f, 3) ? d[fz_pick(f, (int)(sizeof d / sizeof *d))] : fz_range(f, 1, 8);
}

/* A sequence length: mostly below one tile, sometimes across a tile edge. */
static int64_t pick_len(fz *f) {
    static const int64_t n[] = {17, 33, 63, 64, 65, 70};
    return fz_one_in(f, 8) ? n[fz_pick(f, 6)] : fz_range(f, 1, 9);
}

static int64_t pick_window(fz *f) {
    static const int64_t w[] = {0, 1, 2, 5, 100, -2, INT64_MAX, INT64_MIN};
    return fz_one_in(f, 2) ? -1 : w[fz_pick(f, 8)];
}

static float pick_scale(fz *f) {
    static const float s[] = {0, 0, 0, 0.37f, 1.0f, 0x1p126f, 0x1p127f, -1.0f, NAN};
    return fz_one_in(f, 8) ? fz_bits_f32(f) : s[fz_pick(f, 9)];
}

static float pick_softcap(fz *f) {
    static const float s[] = {0, 0, 0, 0, 0.5f, 30.0f, 1e-30f, -1.0f, INFINITY, NAN};
    return fz_one_in(f, 8) ? fz_bits_f32(f) : s[fz_pick(f, 10)];
}

/* ALiBi slopes in a heap block of exactly the values the documented stride makes the call
   read (batch rows of heads_q); a stride the library must refuse gets one row. */
static void pick_alibi(fz *f, fz_call *c, int64_t batch, int64_t hq) {
    if (!fz_one_in(f, 4)) return;
    const int64_t strides[] = {0, hq, hq + 3, hq - 1, -1, batch == 1 ? INT64_MAX : hq};
    const int64_t sb = strides[fz_pick(f, 6)];
    const int64_t n = sb >= hq ? (batch - 1) * sb + hq : hq;
    c->slopes = fz_block(c, (size_t)n * sizeof(float));
    c->nslopes = n;
    static const float v[] = {0.5f, -0.25f, 0.0f, 0x1p64f, -0x1p64f, 0x1.000002p64f, NAN, INFINITY};
    for (int64_t i = 0; i < n; i++)
        c->slopes[i] = fz_one_in(f, 4) ? v[fz_pick(f, 8)] : (float)fz_range(f, 0, 255) / 64.0f;
    c->prm.alibi_slopes = c->slopes;
    c->prm.alibi_batch_stride = sb;
}

static void pick_options(fz *f, fz_call *c, int64_t batch, int64_t hq) {
    c->prm = fa_params_default();
    c->prm.softmax_scale = pick_scale(f);
    c->prm.causal = fz_one_in(f, 3);
    c->prm.window_left = pick_window(f);
    c->prm.window_right = pick_window(f);
    c->prm.softcap = pick_softcap(f);
    c->prm.deterministic = (int)fz_u8(f);
    pick_alibi(f, c, batch, hq);
}

/* Varlen prefix sums (batch + 1 values, heap blocks of exactly that), lengths up to sq / sk,
   empty sequences included; sometimes one entry broken. Returns the token counts. */
static void pick_varlen(fz *f, fz_call *c, int64_t batch, int64_t sq, int64_t sk, int64_t *tq,
                        int64_t *tk) {
    int32_t *cu[2] = {fz_block(c, (size_t)(batch + 1) * 4), fz_block(c, (size_t)(batch + 1) * 4)};
    int64_t mx[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        cu[s][0] = 0;
        for (int64_t b = 0; b < batch; b++) {
            const int32_t len = (int32_t)fz_range(f, 0, s ? sk : sq);
            cu[s][b + 1] = cu[s][b] + len;
            if (len > mx[s]) mx[s] = len;
        }
        if (fz_one_in(f, 8)) {
            static const int32_t bad[] = {-1, 1, INT32_MAX, INT32_MIN};
            cu[s][fz_range(f, 0, batch)] = bad[fz_pick(f, 4)];
        }
    }
    *tq = cu[0][batch] > 0 ? cu[0][batch] : 1;
    *tk = cu[1][batch] > 0 ? cu[1][batch] : 1;
    c->prm.cu_seqlens_q = cu[0];
    c->prm.cu_seqlens_k = cu[1];
    c->prm.batch = fz_one_in(f, 16) ? -fz_range(f, 0, 1) : batch;
    const int64_t m[] = {0, mx[0], mx[0] + 5, mx[0] - 1, -1};
    const int64_t mk[] = {0, mx[1], mx[1] + 5, mx[1] - 1, -1};
    c->prm.max_seqlen_q = m[fz_one_in(f, 2) ? fz_pick(f, 5) : 0];
    c->prm.max_seqlen_k = mk[fz_one_in(f, 2) ? fz_pick(f, 5) : 0];
}

static fa_dtype pick_dtype(fz *f) {
    static const fa_dtype t[] = {FA_DTYPE_F32, FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    return fz_one_in(f, 16) ? FA_DTYPE_F64 : t[fz_pick(f, 4)];
}

/* fa_fwd and fa_bwd: q, k, v, out (and dout, dq, dk, dv), lse. */
static void build_attn(fz *f, fz_call *c, int bwd) {
    const fa_dtype dt = pick_dtype(f);
    const int64_t b = fz_range(f, 1, 3), sq = pick_len(f), sk = pick_len(f);
    const int64_t hkv = fz_range(f, 1, 3), hq = hkv * fz_range(f, 1, 3), d = pick_d(f);
    pick_options(f, c, b, hq);
    const int varlen = fz_one_in(f, 3);
    int64_t tq = 0, tk = 0;
    if (varlen) pick_varlen(f, c, b, sq, sk, &tq, &tk);
    const int64_t qs[4] = {b, sq, hq, d}, ks[4] = {b, sk, hkv, d};
    const int64_t qt[3] = {tq, hq, d}, kt[3] = {tk, hkv, d};
    const int nd = varlen ? 3 : 4;
    const int64_t *qsh = varlen ? qt : qs, *ksh = varlen ? kt : ks;
    const int64_t lb[3] = {b, hq, sq}, lv[2] = {hq, tq};
    const fa_dtype lt = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    c->q = fz_add(c, f, "q", nd, qsh, dt, FZ_IN);
    c->k = fz_add(c, f, "k", nd, ksh, dt, FZ_IN);
    c->v = fz_add(c, f, "v", nd, ksh, dt, FZ_IN);
    c->o = fz_add(c, f, "out", nd, qsh, dt, bwd ? FZ_IN : FZ_OUT);
    const int want_lse = bwd ? !fz_one_in(f, 16) : !fz_one_in(f, 4);
    c->lse = want_lse ? fz_add(c, f, "lse", nd - 1, varlen ? lv : lb, lt, bwd ? FZ_LSE_IN : FZ_LSE_OUT)
                      : -1;
    if (bwd) {
        c->dout = fz_add(c, f, "dout", nd, qsh, dt, FZ_IN);
        c->dq = fz_add(c, f, "dq", nd, qsh, dt, FZ_OUT);
        c->dk = fz_add(c, f, "dk", nd, ksh, dt, FZ_OUT);
        c->dv = fz_add(c, f, "dv", nd, ksh, dt, FZ_OUT);
    }
    c->algo = fz_one_in(f, 4) ? (fz_one_in(f, 2) ? FA_ALGO_NAIVE : FA_ALGO_PLAIN) : FA_ALGO_AUTO;
    c->sq = sq, c->sk = sk, c->group = hq / hkv, c->d = d;
    if (c->algo != FA_ALGO_AUTO || dt == FA_DTYPE_F64)
        /* varlen sequences are at most sq x sk each (or the call is refused): small sizes */
        /* the naive backward recomputes P and makes about four passes more than the forward */
        c->reference_macs = b * hq * sq * sk * d * (bwd ? 8 : 2);
}

/* fa_fwd_kvcache: q, the cache (contiguous or paged), optional k_new / v_new, out, lse. */
static void build_kv(fz *f, fz_call *c) {
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    const fa_dtype dt = dts[fz_pick(f, 3)];
    const int64_t b = fz_range(f, 1, 3), sq = fz_one_in(f, 4) ? pick_len(f) : fz_range(f, 1, 3);
    const int64_t hkv = fz_range(f, 1, 3), hq = hkv * fz_range(f, 1, 3), d = pick_d(f);
    pick_options(f, c, b, hq);
    const int paged = fz_one_in(f, 2), append = fz_one_in(f, 2);
    const int64_t sn = append ? fz_range(f, 1, 3) : 0;
    int64_t rows, len, cap;
    if (paged) {
        const int64_t page = fz_range(f, 1, 5), pages = fz_range(f, 1, 8);
        const int64_t maxp = fz_range(f, 1, 4), bts = maxp + fz_range(f, 0, 2);
        const int64_t nbt = (b - 1) * bts + maxp;
        int32_t *bt = fz_block(c, (size_t)nbt * 4);
        for (int64_t i = 0; i < nbt; i++) {
            static const int32_t bad[] = {-1, INT32_MAX, INT32_MIN};
            bt[i] = (int32_t)(fz_u8(f) % pages);
            if (fz_one_in(f, 16)) bt[i] = fz_one_in(f, 2) ? (int32_t)pages : bad[fz_pick(f, 3)];
        }
        c->cache.block_table = bt;
        c->cache.block_table_stride = fz_one_in(f, 16) ? maxp - 1 : bts;
        c->cache.max_pages = fz_one_in(f, 16) ? 0 : maxp;
        rows = pages, len = page, cap = maxp * page;
    } else {
        rows = b, len = pick_len(f), cap = len;
    }
    int32_t *sl = fz_block(c, (size_t)b * 4);
    for (int64_t i = 0; i < b; i++) {
        static const int32_t bad[] = {-1, INT32_MAX, INT32_MIN};
        const int64_t room = cap - sn;
        sl[i] = room >= 0 ? (int32_t)fz_range(f, 0, room < 255 ? room : 255) : 0;
        if (fz_one_in(f, 16)) sl[i] = fz_one_in(f, 2) ? (int32_t)(room + 1) : bad[fz_pick(f, 3)];
    }
    c->cache.seqlens = sl;
    const int64_t qs[4] = {b, sq, hq, d}, cs[4] = {rows, len, hkv, d}, ns[4] = {b, sn, hkv, d};
    const int64_t ls[3] = {b, hq, sq};
    c->q = fz_add(c, f, "q", 4, qs, dt, FZ_IN);
    c->k = fz_add(c, f, "cache->k", 4, cs, dt, append ? FZ_INOUT : FZ_IN);
    c->v = fz_add(c, f, "cache->v", 4, cs, dt, append ? FZ_INOUT : FZ_IN);
    c->o = fz_add(c, f, "out", 4, qs, dt, FZ_OUT);
    c->lse = fz_one_in(f, 4) ? -1 : fz_add(c, f, "lse", 3, ls, FA_DTYPE_F32, FZ_LSE_OUT);
    if (append) {
        c->knew = fz_add(c, f, "k_new", 4, ns, dt, FZ_IN);
        c->vnew = fz_add(c, f, "v_new", 4, ns, dt, FZ_IN);
    }
    static const int splits[] = {0, 0, 1, 2, 3, 7, 64, -1};
    c->num_splits = splits[fz_pick(f, 8)];
    c->algo = fz_one_in(f, 16) ? FA_ALGO_NAIVE : FA_ALGO_AUTO;
    c->sq = sq, c->sk = cap + sn, c->group = hq / hkv, c->d = d;
    if (c->algo == FA_ALGO_NAIVE) /* the reference's cost, bounded as build_attn's is */
        c->reference_macs = b * hq * sq * (cap + sn) * d * 2;
}

/* fa_merge_attn: n parts (BSHD or THD) and their LSEs, out (any of the three dtypes), lse. */
static void build_merge(fz *f, fz_call *c) {
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    const fa_dtype pdt = dts[fz_pick(f, 3)], odt = dts[fz_pick(f, 3)];
    const int64_t b = fz_range(f, 1, 3), s = pick_len(f), h = fz_range(f, 1, 4), d = pick_d(f);
    const int thd = fz_one_in(f, 3);
    c->nparts = fz_one_in(f, 16) ? -fz_range(f, 0, 1) : (int)fz_range(f, 1, FZ_MAX_PARTS);
    const int64_t os[4] = {b, s, h, d}, ot[3] = {b * s, h, d}, ls[3] = {b, h, s}, lt[2] = {h, b * s};
    const int nd = thd ? 3 : 4;
    for (int i = 0; i < (c->nparts > 0 ? c->nparts : 0); i++) {
        c->part_o[i] = fz_add(c, f, "out_parts[i]", nd, thd ? ot : os, pdt, FZ_IN);
        c->part_l[i] = fz_add(c, f, "lse_parts[i]", nd - 1, thd ? lt : ls, FA_DTYPE_F32, FZ_LSE_PART);
    }
    c->o = fz_add(c, f, "out", nd, thd ? ot : os, odt, FZ_OUT);
    c->lse = fz_one_in(f, 4) ? -1 : fz_add(c, f, "lse", nd - 1, thd ? lt : ls, FA_DTYPE_F32, FZ_LSE_OUT);
}

static fa_status run_call(fz_call *c) {
    fa_tensor *t = c->view;
#define T(i) ((i) >= 0 ? &t[i] : NULL)
    switch (c->op) {
    case OP_FWD: return fa_fwd(ctx, T(c->q), T(c->k), T(c->v), &c->prm, T(c->o), T(c->lse));
    case OP_BWD:
        return fa_bwd(ctx, T(c->q), T(c->k), T(c->v), T(c->o), T(c->dout), T(c->lse), &c->prm,
                      T(c->dq), T(c->dk), T(c->dv));
    case OP_KV:
        c->cache.k = t[c->k];
        c->cache.v = t[c->v];
        return fa_fwd_kvcache(ctx, T(c->q), &c->cache, T(c->knew), T(c->vnew), &c->prm,
                              c->num_splits, T(c->o), T(c->lse));
    default: {
        fa_tensor po[FZ_MAX_PARTS], pl[FZ_MAX_PARTS];
        for (int i = 0; i < c->nparts; i++) po[i] = t[c->part_o[i]], pl[i] = t[c->part_l[i]];
        return fa_merge_attn(ctx, c->nparts, po, pl, T(c->o), T(c->lse));
    }
    }
#undef T
}

static void dump_value(void *user, uint8_t *p) {
    const fa_tensor *t = user;
    fprintf(stderr, " %.9g", fz_get(t->dtype, p));
}

/* FUZZ_DUMP=1: the decoded call on stderr (up to 64 values a tensor), to study a finding. */
static void dump_call(const fz_call *c, int threads, int strict) {
    const fa_params *p = &c->prm;
    fprintf(stderr,
            "%s algo %d threads %d strict %d vmode %d scale %g causal %d window %lld,%lld "
            "softcap %g alibi %s (stride %lld) varlen %s deterministic %d\n",
            op_name[c->op], (int)c->algo, threads, strict, c->vmode, (double)p->softmax_scale,
            p->causal, (long long)p->window_left, (long long)p->window_right, (double)p->softcap,
            p->alibi_slopes ? "yes" : "no", (long long)p->alibi_batch_stride,
            p->cu_seqlens_q ? "yes" : "no", p->deterministic);
    for (int i = 0; i < c->nt; i++) {
        const fa_tensor *t = &c->view[i];
        fprintf(stderr, "  %-8s %-4s data %s shape [", c->name[i], fa_dtype_name(t->dtype),
                t->data ? "set" : "NULL");
        for (int j = 0; j < t->ndim && j < 4; j++)
            fprintf(stderr, "%s%lld", j ? " " : "", (long long)t->shape[j]);
        fprintf(stderr, "] stride [");
        for (int j = 0; j < t->ndim && j < 4; j++)
            fprintf(stderr, "%s%lld", j ? " " : "", (long long)t->stride[j]);
        fprintf(stderr, "]%s\n", c->sane[i] ? "" : " (broken)");
        int64_t n = 1;
        for (int j = 0; j < t->ndim && j < 4; j++) n *= t->shape[j];
        if (c->sane[i] && t->data && n <= 64) {
            fprintf(stderr, "    ");
            fz_each(t, dump_value, (void *)t);
            fputc('\n', stderr);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx && fa_context_create(&ctx, FA_BACKEND_CPU) != FA_OK) abort();
    fz f = {data, size};
    fz_call c;
    fz_call_init(&c, fz_u32(&f));
    c.op = fz_pick(&f, 4);
    switch (c.op) {
    case OP_FWD: build_attn(&f, &c, 0); break;
    case OP_BWD: build_attn(&f, &c, 1); break;
    case OP_KV: build_kv(&f, &c); break;
    default: build_merge(&f, &c); break;
    }
    const int threads = (int)fz_range(&f, 1, 3), strict = fz_one_in(&f, 8);
    /* the reference algorithms take seconds beyond this under ASan (a 22 s unit at b 3, 9
       heads, 70 x 70, d 257 backward): such inputs are not this target's, whose calls must
       each run in milliseconds; the tiled kernels take every size it draws */
    const int too_slow = c.reference_macs > ((int64_t)1 << 22);
    if (too_slow || !fz_layout(&c, &f)) { /* or a valid tensor too large for the arena */
        fz_call_free(&c);
        return 0;
    }
    FZ_CHECK(fa_context_set_threads(ctx, threads) == FA_OK, "set_threads");
    FZ_CHECK(fa_context_set_algo(ctx, c.algo) == FA_OK, "set_algo");
    FZ_CHECK(fa_context_set_strict(ctx, strict) == FA_OK, "set_strict");
    if (getenv("FUZZ_DUMP")) dump_call(&c, threads, strict);
    memcpy(c.before, c.arena, c.arena_bytes);
    const fa_status st = run_call(&c);
    const char *msg = fa_last_error(ctx);
    if (getenv("FUZZ_DUMP")) {
        fprintf(stderr, "status %s: %s; after the call:\n", fa_status_string(st), msg);
        dump_call(&c, threads, strict);
    }
    if (st != FA_OK) {
        FZ_CHECK(msg && msg[0], "%s failed (%s) without a message", op_name[c.op],
                 fa_status_string(st));
        FZ_CHECK(memcmp(c.before, c.arena, c.arena_bytes) == 0,
                 "%s failed (%s: %s) but changed the arena", op_name[c.op], fa_status_string(st),
                 msg);
    } else {
        const int64_t at = fz_stray_write(&c);
        FZ_CHECK(at < 0, "%s wrote arena byte %lld, which belongs to no output element",
                 op_name[c.op], (long long)at);
        const char *bad = fz_oracle(&c);
        FZ_CHECK(!bad, "%s: finite inputs with finite exact results, but %s", op_name[c.op], bad);
    }
    fz_call_free(&c);
    return 0;
}
