/*
 * kv_errors.c — the bad-input branches of fa_fwd_kvcache, fa_fwd_kvcache_workspace_size and
 * fa_merge_attn (CPU), one broken argument at a time on top of a valid call, as
 * test_errors.c does for fa_fwd: each returns its exact status with a message, reports no
 * selection, and writes nothing — every tensor, the cache and its index arrays live in one
 * arena that must be byte-identical after the failed call.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sweep.h"
#include "testkit.h"

/* The valid call: q [2, 2, 4, 8] f32 (GQA 4/2), 2 new tokens per sequence, cached 3 and 5;
   paged: pool of 6 pages of 4 rows, block_table rows of 3 pages 4 entries apart;
   contiguous: [2, 8, 2, 8]. */
enum { B = 2, SQ = 2, HQ = 4, HKV = 2, D = 8, SN = 2, NP = 6, PS = 4, MP = 3, BTS = 4,
       LEN = 8 };
enum { CAP = 1 << 17 }; /* room per region for the largest mutation (head dim 300, f64) */
enum { R_Q, R_K, R_V, R_KN, R_VN, R_O, R_LSE, R_SEQ, R_BT, R_P0, R_P1, R_L0, R_L1, R_COS,
       R_SIN, R_LPAD, NR };
/* rotary tables [RO, D / 2]: as long as the paged capacity, MP * PS */
enum { RO = MP * PS };
#define ARENA_BYTES ((size_t)NR * CAP)

static unsigned char *arena, *snapshot;
static void *region(int i) { return arena + (size_t)i * CAP; }

typedef struct kargs {
    fa_context *ctx;
    fa_tensor q, kn, vn, o, lse;
    fa_kvcache cache;
    const fa_tensor *pq, *pkn, *pvn;
    fa_tensor *po, *plse;
    const fa_kvcache *pcache;
    fa_params prm;
    const fa_params *pp;
    fa_tensor cos, sin; /* the rotary tables, used when a mutation sets prm.rotary_cos/sin */
    int32_t *lpad;
    int splits;
    int32_t *seqlens, *bt;
    float slopes[HQ];
    /* merge: out = o, lse = lse */
    int n;
    fa_tensor parts[2], lparts[2];
    const fa_tensor *pparts, *plparts;
} kargs;

static void reset(kargs *a, fa_context *ctx, int contiguous) {
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    const fa_dtype f = FA_DTYPE_F32;
    const fa_device c = FA_DEVICE_CPU;
    a->q = fa_tensor_bshd(region(R_Q), f, c, B, SQ, HQ, D);
    a->o = fa_tensor_bshd(region(R_O), f, c, B, SQ, HQ, D);
    a->lse = fa_tensor_3d(region(R_LSE), f, c, B, HQ, SQ);
    a->kn = fa_tensor_bshd(region(R_KN), f, c, B, SN, HKV, D);
    a->vn = fa_tensor_bshd(region(R_VN), f, c, B, SN, HKV, D);
    a->seqlens = region(R_SEQ);
    a->bt = region(R_BT);
    a->seqlens[0] = 3;
    a->seqlens[1] = 5;
    const int32_t bt[B * BTS] = {4, 1, -1, -9, 0, 5, -1, -9}; /* -1: unused, -9: the gap */
    memcpy(a->bt, bt, sizeof bt);
    if (contiguous) {
        a->cache.k = fa_tensor_bshd(region(R_K), f, c, B, LEN, HKV, D);
        a->cache.v = fa_tensor_bshd(region(R_V), f, c, B, LEN, HKV, D);
    } else {
        a->cache.k = fa_tensor_bshd(region(R_K), f, c, NP, PS, HKV, D);
        a->cache.v = fa_tensor_bshd(region(R_V), f, c, NP, PS, HKV, D);
        a->cache.block_table = a->bt;
        a->cache.block_table_stride = BTS;
        a->cache.max_pages = MP;
    }
    a->cache.seqlens = a->seqlens;
    a->pq = &a->q;
    a->pkn = &a->kn;
    a->pvn = &a->vn;
    a->po = &a->o;
    a->plse = &a->lse;
    a->pcache = &a->cache;
    a->cos = fa_tensor_2d(region(R_COS), f, c, RO, D / 2);
    a->sin = fa_tensor_2d(region(R_SIN), f, c, RO, D / 2);
    a->lpad = region(R_LPAD);
    a->lpad[0] = 1;
    a->lpad[1] = 5;
    a->prm = fa_params_default();
    a->pp = &a->prm;
    for (int h = 0; h < HQ; h++) a->slopes[h] = 0.25f;
    a->n = 2;
    for (int s = 0; s < 2; s++) {
        a->parts[s] = fa_tensor_bshd(region(R_P0 + s), f, c, B, SQ, HQ, D);
        a->lparts[s] = fa_tensor_3d(region(R_L0 + s), f, c, B, HQ, SQ);
    }
    a->pparts = a->parts;
    a->plparts = a->lparts;
    memset(region(R_O), 0xff, CAP); /* outputs poisoned */
    memset(region(R_LSE), 0xff, CAP);
}

enum { OP_CALL = 1, OP_WS = 2, OP_MERGE = 4, OP_KV = 3 };

static fa_status call(kargs *a, int op) {
    size_t bytes;
    switch (op) {
    case OP_CALL:
        return fa_fwd_kvcache(a->ctx, a->pq, a->pcache, a->pkn, a->pvn, a->pp, a->splits, a->po,
                              a->plse);
    case OP_WS:
        return fa_fwd_kvcache_workspace_size(a->ctx, a->pq, a->pcache, a->pkn, a->pvn, a->pp,
                                             a->splits, &bytes);
    default:
        return fa_merge_attn(a->ctx, a->n, a->pparts, a->plparts, a->po, a->plse);
    }
}

static const char *op_name(int op) {
    return op == OP_CALL ? "fa_fwd_kvcache"
           : op == OP_WS ? "fa_fwd_kvcache_workspace_size"
                         : "fa_merge_attn";
}

/* ---- the mutations ---- */

static void with_d(fa_tensor *t, int64_t d) { /* a contiguous tensor with head dim d */
    if (t->ndim < 3 || t->shape[t->ndim - 1] != D) return;
    t->shape[t->ndim - 1] = d;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static void each(kargs *a, void (*f)(fa_tensor *, int64_t), int64_t x) {
    fa_tensor *all[] = {&a->q, &a->kn, &a->vn, &a->o, &a->lse, &a->cache.k, &a->cache.v,
                        &a->parts[0], &a->parts[1], &a->lparts[0], &a->lparts[1]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) f(all[i], x);
}
static void set_dtype(fa_tensor *t, int64_t dt) {
    if (t->ndim == 4) t->dtype = (fa_dtype)dt;
}
static void set_cuda(fa_tensor *t, int64_t unused) {
    (void)unused;
    t->device = FA_DEVICE_CUDA;
}

typedef void (*mutator)(kargs *a);
typedef struct bad {
    const char *name;
    mutator m;
    fa_status want;
    int ops;
    int contiguous; /* start from the contiguous cache (else paged) */
} bad;

/* The fused rotary embedding over all D columns, valid as it stands. */
static void rotary(kargs *a) {
    a->prm.rotary_cos = &a->cos;
    a->prm.rotary_sin = &a->sin;
    a->prm.rotary_interleaved = 1;
}
static void fp8_inputs(kargs *a) {
    fa_tensor *in[] = {&a->q, &a->kn, &a->vn, &a->cache.k, &a->cache.v};
    for (int i = 0; i < 5; i++) in[i]->dtype = FA_DTYPE_F8_E4M3;
}

#define MUT(fn, body) \
    static void fn(kargs *a) { body; }
MUT(null_q, a->pq = NULL)
MUT(null_out, a->po = NULL)
MUT(null_cache, a->pcache = NULL)
MUT(null_seqlens, a->cache.seqlens = NULL)
MUT(only_k_new, a->pvn = NULL)
MUT(only_v_new, a->pkn = NULL)
MUT(null_q_data, a->q.data = NULL)
MUT(null_cache_k_data, a->cache.k.data = NULL)
MUT(q_ndim3, a->q.ndim = 3)
MUT(cache_k_ndim3, a->cache.k.ndim = 3)
MUT(lse_ndim2, a->lse.ndim = 2)
MUT(out_shape, a->o.shape[1] = 1)
MUT(cache_v_shape, a->cache.v.shape[1] = PS - 1)
MUT(q_head_dim, a->q.shape[3] = 4; a->o.shape[3] = 4)
MUT(contig_batch, a->cache.k.shape[0] = 1; a->cache.v.shape[0] = 1)
MUT(kn_batch, a->kn.shape[0] = 1; a->vn.shape[0] = 1)
MUT(kn_heads, a->kn.shape[2] = 1; a->vn.shape[2] = 1)
MUT(kn_head_dim, a->kn.shape[3] = 4; a->vn.shape[3] = 4)
MUT(vn_differs, a->vn.shape[1] = 1)
MUT(lse_shape, a->lse.shape[2] = 1)
MUT(sq_zero, a->q.shape[1] = 0; a->o.shape[1] = 0; a->lse.shape[2] = 0)
MUT(seqlen_negative, a->seqlens[1] = -1)
MUT(no_room_contig, a->seqlens[1] = LEN - SN + 1)
MUT(no_room_paged, a->seqlens[0] = MP * PS - SN + 1)
MUT(head_dim_257, each(a, with_d, 257))
MUT(gqa_4_of_3, a->cache.k.shape[2] = 3; a->cache.v.shape[2] = 3; a->kn.shape[2] = 3;
    a->vn.shape[2] = 3)
MUT(cache_k_f16, a->cache.k.dtype = FA_DTYPE_F16)
MUT(kn_bf16, a->kn.dtype = FA_DTYPE_BF16)
MUT(out_f16, a->o.dtype = FA_DTYPE_F16)
MUT(lse_f64, a->lse.dtype = FA_DTYPE_F64)
MUT(all_f64, each(a, set_dtype, FA_DTYPE_F64))
MUT(all_f8, each(a, set_dtype, FA_DTYPE_F8_E4M3))
MUT(q_last_stride, a->q.stride[3] = 2)
MUT(cache_k_stride0, a->cache.k.stride[1] = 0)
MUT(vn_negative_stride, a->vn.stride[0] = -a->vn.stride[0])
MUT(cache_on_cuda, a->cache.k.device = FA_DEVICE_CUDA; a->cache.v.device = FA_DEVICE_CUDA)
MUT(all_on_cuda, each(a, set_cuda, 0))
MUT(cu_seqlens_set, a->prm.cu_seqlens_q = a->seqlens)
MUT(varlen_batch_set, a->prm.batch = B)
MUT(max_seqlen_set, a->prm.max_seqlen_k = LEN)
MUT(splits_negative, a->splits = -1)
MUT(max_pages_zero, a->cache.max_pages = 0)
MUT(bt_stride_short, a->cache.block_table_stride = MP - 1)
MUT(page_outside_pool, a->bt[1] = NP)
MUT(used_page_negative, a->bt[BTS + 1] = -1)
MUT(append_collision, a->seqlens[1] = 4; a->bt[BTS + 1] = 1)
MUT(huge_max_pages, a->cache.max_pages = (int64_t)1 << 40;
    a->cache.block_table_stride = (int64_t)1 << 40)
MUT(out_overlaps_q, a->o.data = (float *)region(R_Q) + 5)
MUT(out_overlaps_cache, a->o.data = region(R_K))
MUT(lse_overlaps_cache_v, a->lse.data = (float *)region(R_V) + 100)
MUT(kn_overlaps_cache, a->kn.data = (float *)region(R_K) + 8)
MUT(q_overlaps_cache, a->q.data = region(R_V))
MUT(out_overlaps_seqlens, a->o.data = region(R_SEQ))
MUT(cache_overlaps_bt, a->cache.k.data = region(R_BT))
MUT(scale_nan, a->prm.softmax_scale = NAN)
MUT(softcap_negative, a->prm.softcap = -1.0f)
MUT(dropout_on, a->prm.dropout_p = 0.1f)
MUT(window_below, a->prm.window_left = -2)
MUT(causal_window_right, a->prm.causal = 1; a->prm.window_right = 3)
MUT(alibi_stride_short, a->prm.alibi_slopes = a->slopes; a->prm.alibi_batch_stride = HQ - 1)
MUT(scale_huge, a->prm.softmax_scale = 3e38f)
MUT(alibi_nan, a->prm.alibi_slopes = a->slopes; a->slopes[2] = NAN)
MUT(lse_overlaps_out, a->lse.data = (float *)region(R_O) + 7)
MUT(out_rows_alias, a->o.stride[1] = D)
MUT(cache_k_heads_alias, a->cache.k.stride[2] = D - 2) /* written: k_new is appended */
MUT(algo_naive, fa_context_set_algo(a->ctx, FA_ALGO_NAIVE))
MUT(algo_plain, fa_context_set_algo(a->ctx, FA_ALGO_PLAIN))
/* merge */
MUT(merge_n0, a->n = 0)
MUT(merge_parts_null, a->pparts = NULL)
MUT(merge_lparts_null, a->plparts = NULL)
MUT(merge_out_null, a->po = NULL)
MUT(merge_out_ndim2, a->o.ndim = 2)
MUT(merge_part_shape, a->parts[1].shape[2] = 2)
MUT(merge_lpart_shape, a->lparts[0].shape[1] = 1)
MUT(merge_parts_f64, a->parts[0].dtype = FA_DTYPE_F64; a->parts[1].dtype = FA_DTYPE_F64)
MUT(merge_parts_mixed, a->parts[1].dtype = FA_DTYPE_F16)
MUT(merge_lpart_f16, a->lparts[1].dtype = FA_DTYPE_F16)
MUT(merge_out_f8, a->o.dtype = FA_DTYPE_F8_E4M3)
MUT(merge_out_overlaps_part, a->o.data = region(R_P1))
MUT(merge_lse_overlaps_lpart, a->lse.data = region(R_L0))
MUT(merge_part_on_cuda, a->parts[0].device = FA_DEVICE_CUDA)
MUT(merge_head_dim_300, each(a, with_d, 300))
MUT(merge_part_last_stride, a->parts[0].stride[3] = 2)
/* a part LSE of finite values but one: kept outside the arena, which later cases reuse */
static float lse_bad[B * HQ * SQ];
static void lpart_with(kargs *a, float x) {
    for (int i = 0; i < B * HQ * SQ; i++) lse_bad[i] = -0.5f * (float)i;
    lse_bad[B * HQ * SQ - 2] = x;
    a->lparts[1].data = lse_bad;
}
MUT(merge_lpart_nan, lpart_with(a, NAN))
MUT(merge_lpart_inf, lpart_with(a, INFINITY))
MUT(merge_lse_overlaps_out, a->lse.data = (float *)region(R_O) + 1)
MUT(merge_out_heads_alias, a->o.stride[2] = D / 2)
MUT(rot_only_cos, a->prm.rotary_cos = &a->cos)
MUT(rot_only_sin, a->prm.rotary_sin = &a->sin)
MUT(rot_no_append, rotary(a); a->pkn = a->pvn = NULL)
MUT(rot_dim_past_d, rotary(a); a->cos.shape[1] = a->sin.shape[1] = D / 2 + 1;
    a->cos.stride[0] = a->sin.stride[0] = D / 2 + 1)
MUT(rot_short_paged, rotary(a); a->cos.shape[0] = a->sin.shape[0] = RO - 1)
MUT(rot_short_contig, rotary(a); a->cos.shape[0] = a->sin.shape[0] = LEN - 1)
/* queries past the new keys (causal, sq 3 > 2 new) need rows up to the capacity + 1 */
MUT(rot_short_for_queries, rotary(a); a->prm.causal = 1; a->q.shape[1] = a->o.shape[1] = 3;
    a->lse.shape[2] = 3; a->q.stride[0] = a->o.stride[0] = 3 * HQ * D; a->lse.stride[1] = 3;
    a->lse.stride[0] = 3 * HQ)
MUT(rot_sin_shape, rotary(a); a->sin.shape[0] = RO + 1)
MUT(rot_tables_f16, rotary(a); a->cos.dtype = a->sin.dtype = FA_DTYPE_F16)
MUT(rot_tables_mixed, rotary(a); a->sin.dtype = FA_DTYPE_BF16)
MUT(rot_fp8, rotary(a); fp8_inputs(a))
MUT(rot_on_cuda, rotary(a); a->cos.device = FA_DEVICE_CUDA)
MUT(rot_ndim3, rotary(a); a->sin.ndim = 3)
MUT(rot_last_stride, rotary(a); a->cos.stride[1] = 2)
MUT(rot_null_data, rotary(a); a->sin.data = NULL)
MUT(rot_cache_overlaps_cos, rotary(a); a->cache.k.data = region(R_COS))
MUT(rot_out_overlaps_sin, rotary(a); a->o.data = region(R_SIN))
MUT(lpad_paged, a->prm.cache_leftpad = a->lpad)
MUT(lpad_past_len, a->prm.cache_leftpad = a->lpad; a->lpad[1] = 6)
MUT(lpad_negative, a->prm.cache_leftpad = a->lpad; a->lpad[0] = -1)
MUT(lpad_out_overlaps, a->prm.cache_leftpad = a->lpad; a->o.data = region(R_LPAD))
MUT(lpad_cache_overlaps, a->prm.cache_leftpad = a->lpad; a->cache.v.data = region(R_LPAD))
#undef MUT

#define KV(nm, fn, st) {nm, fn, st, OP_KV, 0}
#define KVC(nm, fn, st) {nm, fn, st, OP_KV, 1}  /* contiguous cache */
#define CALL(nm, fn, st) {nm, fn, st, OP_CALL, 0} /* not checked by workspace queries */
#define MERGE(nm, fn, st) {nm, fn, st, OP_MERGE, 0}
static const bad bads[] = {
    KV("kv: null q", null_q, FA_ERR_NULL_POINTER),
    CALL("kv: null out", null_out, FA_ERR_NULL_POINTER),
    KV("kv: null cache", null_cache, FA_ERR_NULL_POINTER),
    KV("kv: null cache->seqlens", null_seqlens, FA_ERR_NULL_POINTER),
    KV("kv: k_new without v_new", only_k_new, FA_ERR_NULL_POINTER),
    KV("kv: v_new without k_new", only_v_new, FA_ERR_NULL_POINTER),
    KV("kv: null q->data", null_q_data, FA_ERR_NULL_POINTER),
    KV("kv: null cache->k.data", null_cache_k_data, FA_ERR_NULL_POINTER),
    KV("kv: q ndim 3", q_ndim3, FA_ERR_SHAPE),
    KV("kv: cache->k ndim 3", cache_k_ndim3, FA_ERR_SHAPE),
    CALL("kv: lse ndim 2", lse_ndim2, FA_ERR_SHAPE),
    CALL("kv: out shape != q shape", out_shape, FA_ERR_SHAPE),
    KV("kv: cache->v shape != cache->k shape", cache_v_shape, FA_ERR_SHAPE),
    KV("kv: q head dim != cache head dim", q_head_dim, FA_ERR_SHAPE),
    KVC("kv: contiguous cache batch != q batch", contig_batch, FA_ERR_SHAPE),
    KV("kv: k_new batch wrong", kn_batch, FA_ERR_SHAPE),
    KV("kv: k_new heads wrong", kn_heads, FA_ERR_SHAPE),
    KV("kv: k_new head dim wrong", kn_head_dim, FA_ERR_SHAPE),
    KV("kv: v_new shape != k_new shape", vn_differs, FA_ERR_SHAPE),
    CALL("kv: lse shape wrong", lse_shape, FA_ERR_SHAPE),
    KV("kv: seqlen_q 0", sq_zero, FA_ERR_SHAPE),
    KV("kv: seqlens negative", seqlen_negative, FA_ERR_SHAPE),
    KVC("kv: append past max_len", no_room_contig, FA_ERR_SHAPE),
    KV("kv: append past max_pages * page_size", no_room_paged, FA_ERR_SHAPE),
    KV("kv: head dim 257", head_dim_257, FA_ERR_HEAD_DIM),
    KV("kv: heads 4 over 3", gqa_4_of_3, FA_ERR_GQA),
    KV("kv: cache->k f16, q f32", cache_k_f16, FA_ERR_DTYPE),
    KV("kv: k_new bf16", kn_bf16, FA_ERR_DTYPE),
    CALL("kv: out f16", out_f16, FA_ERR_DTYPE),
    CALL("kv: lse f64", lse_f64, FA_ERR_DTYPE),
    KV("kv: f64 (not FA_ALGO_NAIVE)", all_f64, FA_ERR_DTYPE),
    /* FP8 inputs are valid (test_fp8.c); an FP8 out is not. The workspace query has no out. */
    CALL("kv: f8e4m3 out", all_f8, FA_ERR_DTYPE),
    KV("kv: q last stride 2", q_last_stride, FA_ERR_STRIDE),
    KV("kv: cache->k stride 0", cache_k_stride0, FA_ERR_STRIDE),
    KV("kv: v_new negative stride", vn_negative_stride, FA_ERR_STRIDE),
    KV("kv: cache on cuda, q on cpu", cache_on_cuda, FA_ERR_DEVICE),
    KV("kv: cuda tensors on a cpu context", all_on_cuda, FA_ERR_DEVICE),
    KV("kv: cu_seqlens_q set", cu_seqlens_set, FA_ERR_VARLEN),
    KV("kv: params.batch set", varlen_batch_set, FA_ERR_VARLEN),
    KV("kv: max_seqlen_k set", max_seqlen_set, FA_ERR_VARLEN),
    KV("kv: num_splits -1", splits_negative, FA_ERR_INVALID_ARGUMENT),
    KV("kv: max_pages 0", max_pages_zero, FA_ERR_INVALID_ARGUMENT),
    KV("kv: block_table_stride < max_pages", bt_stride_short, FA_ERR_INVALID_ARGUMENT),
    KV("kv: block_table entry past the pool", page_outside_pool, FA_ERR_INVALID_ARGUMENT),
    KV("kv: block_table entry -1 for a used page", used_page_negative,
       FA_ERR_INVALID_ARGUMENT),
    KV("kv: two sequences append to one page row", append_collision, FA_ERR_INVALID_ARGUMENT),
    KV("kv: max_pages * page_size overflows", huge_max_pages, FA_ERR_OVERFLOW),
    CALL("kv: out overlaps q", out_overlaps_q, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: out overlaps the cache", out_overlaps_cache, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: lse overlaps cache->v", lse_overlaps_cache_v, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: k_new overlaps the cache it is appended to", kn_overlaps_cache,
         FA_ERR_INVALID_ARGUMENT),
    CALL("kv: q overlaps the cache being appended to", q_overlaps_cache,
         FA_ERR_INVALID_ARGUMENT),
    CALL("kv: out overlaps cache->seqlens", out_overlaps_seqlens, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: appended cache overlaps block_table", cache_overlaps_bt, FA_ERR_INVALID_ARGUMENT),
    KV("kv: scale NaN", scale_nan, FA_ERR_INVALID_ARGUMENT),
    KV("kv: softcap -1", softcap_negative, FA_ERR_INVALID_ARGUMENT),
    KV("kv: dropout 0.1 (inference only)", dropout_on, FA_ERR_UNSUPPORTED),
    KV("kv: window_left -2", window_below, FA_ERR_INVALID_ARGUMENT),
    KV("kv: causal with window_right 3", causal_window_right, FA_ERR_INVALID_ARGUMENT),
    KV("kv: alibi_batch_stride < heads_q", alibi_stride_short, FA_ERR_INVALID_ARGUMENT),
    KV("kv: scale 3e38", scale_huge, FA_ERR_INVALID_ARGUMENT),
    KV("kv: alibi slope NaN", alibi_nan, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: lse overlaps out", lse_overlaps_out, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: out seq stride = head stride", out_rows_alias, FA_ERR_INVALID_ARGUMENT),
    CALL("kv: appended cache->k aliases itself", cache_k_heads_alias, FA_ERR_INVALID_ARGUMENT),
    KV("kv: FA_ALGO_NAIVE context", algo_naive, FA_ERR_UNSUPPORTED),
    KV("kv: FA_ALGO_PLAIN context", algo_plain, FA_ERR_UNSUPPORTED),
    KV("kv: rotary_cos without rotary_sin", rot_only_cos, FA_ERR_NULL_POINTER),
    KV("kv: rotary_sin without rotary_cos", rot_only_sin, FA_ERR_NULL_POINTER),
    KV("kv: rotary without k_new/v_new", rot_no_append, FA_ERR_NULL_POINTER),
    KV("kv: rotary_dim 10 > head dim 8", rot_dim_past_d, FA_ERR_SHAPE),
    KV("kv: rotary seqlen_ro < max_pages * page_size", rot_short_paged, FA_ERR_SHAPE),
    KVC("kv: rotary seqlen_ro < max_len", rot_short_contig, FA_ERR_SHAPE),
    KV("kv: rotary seqlen_ro short of causal queries past the new keys",
       rot_short_for_queries, FA_ERR_SHAPE),
    KV("kv: rotary_sin shape != rotary_cos shape", rot_sin_shape, FA_ERR_SHAPE),
    KV("kv: rotary tables f16, q f32", rot_tables_f16, FA_ERR_DTYPE),
    KV("kv: rotary_cos f32, rotary_sin bf16", rot_tables_mixed, FA_ERR_DTYPE),
    KV("kv: rotary with FP8 inputs", rot_fp8, FA_ERR_DTYPE),
    KV("kv: rotary_cos on cuda", rot_on_cuda, FA_ERR_DEVICE),
    KV("kv: rotary_sin ndim 3", rot_ndim3, FA_ERR_SHAPE),
    KV("kv: rotary_cos last stride 2", rot_last_stride, FA_ERR_STRIDE),
    KV("kv: rotary_sin->data NULL", rot_null_data, FA_ERR_NULL_POINTER),
    CALL("kv: appended cache overlaps rotary_cos", rot_cache_overlaps_cos,
         FA_ERR_INVALID_ARGUMENT),
    CALL("kv: out overlaps rotary_sin", rot_out_overlaps_sin, FA_ERR_INVALID_ARGUMENT),
    KV("kv: cache_leftpad with a paged cache", lpad_paged, FA_ERR_UNSUPPORTED),
    KVC("kv: cache_leftpad[1] 6 > seqlens[1] 5", lpad_past_len, FA_ERR_INVALID_ARGUMENT),
    KVC("kv: cache_leftpad[0] -1", lpad_negative, FA_ERR_INVALID_ARGUMENT),
    {"kv: out overlaps cache_leftpad", lpad_out_overlaps, FA_ERR_INVALID_ARGUMENT, OP_CALL, 1},
    {"kv: appended cache overlaps cache_leftpad", lpad_cache_overlaps, FA_ERR_INVALID_ARGUMENT,
     OP_CALL, 1},
    MERGE("merge: n 0", merge_n0, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: out_parts NULL", merge_parts_null, FA_ERR_NULL_POINTER),
    MERGE("merge: lse_parts NULL", merge_lparts_null, FA_ERR_NULL_POINTER),
    MERGE("merge: out NULL", merge_out_null, FA_ERR_NULL_POINTER),
    MERGE("merge: out ndim 2", merge_out_ndim2, FA_ERR_SHAPE),
    MERGE("merge: a part's shape differs", merge_part_shape, FA_ERR_SHAPE),
    MERGE("merge: a part LSE's shape differs", merge_lpart_shape, FA_ERR_SHAPE),
    MERGE("merge: parts f64", merge_parts_f64, FA_ERR_DTYPE),
    MERGE("merge: parts of two dtypes", merge_parts_mixed, FA_ERR_DTYPE),
    MERGE("merge: a part LSE f16", merge_lpart_f16, FA_ERR_DTYPE),
    MERGE("merge: out f8e4m3", merge_out_f8, FA_ERR_DTYPE),
    MERGE("merge: out overlaps a part", merge_out_overlaps_part, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: lse overlaps a part LSE", merge_lse_overlaps_lpart, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: a part on cuda", merge_part_on_cuda, FA_ERR_DEVICE),
    MERGE("merge: head dim 300", merge_head_dim_300, FA_ERR_HEAD_DIM),
    MERGE("merge: a part's last stride 2", merge_part_last_stride, FA_ERR_STRIDE),
    MERGE("merge: a part's lse NaN", merge_lpart_nan, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: a part's lse +inf", merge_lpart_inf, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: lse overlaps out", merge_lse_overlaps_out, FA_ERR_INVALID_ARGUMENT),
    MERGE("merge: out head stride < head_dim", merge_out_heads_alias, FA_ERR_INVALID_ARGUMENT),
};

static void expect_failure(kargs *a, int op, fa_status want, const char *what) {
    memcpy(snapshot, arena, ARENA_BYTES);
    fa_status st = call(a, op);
    sweep_expect_failure(a->ctx, st, want, what, op_name(op), snapshot, arena, ARENA_BYTES, 0);
}

static void one_bad(void **state) {
    const bad *b = *state;
    for (int op = OP_CALL; op <= OP_MERGE; op <<= 1) {
        if (!(b->ops & op)) continue;
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
        kargs a;
        reset(&a, ctx, b->contiguous);
        b->m(&a);
        expect_failure(&a, op, b->want, b->name);
        fa_context_destroy(ctx);
    }
}

/* The unbroken calls succeed (so each failure above is due to its mutation), and so do the
   legal variations: no append, ALiBi, a shared read-only page, an interleaved K/V cache. */
static void valid_calls_pass(void **state) {
    (void)state;
    for (int variant = 0; variant < 10; variant++)
        for (int op = OP_CALL; op <= OP_MERGE; op <<= 1) {
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            kargs a;
            reset(&a, ctx, variant == 1 || variant == 5 || variant == 8 || variant == 9);
            if (variant == 2) a.pkn = a.pvn = NULL;
            if (variant == 3) {
                a.prm.alibi_slopes = a.slopes;
                a.prm.causal = 1;
                a.splits = 3;
            }
            if (variant == 4) a.bt[BTS] = a.bt[0]; /* both read page 4; appends elsewhere */
            if (variant == 5) {                   /* k and v rows interleaved in one buffer */
                a.cache.k.stride[2] = a.cache.v.stride[2] = 2 * D;
                a.cache.k.stride[1] = a.cache.v.stride[1] = 2 * HKV * D;
                a.cache.k.stride[0] = a.cache.v.stride[0] = 2 * HKV * D * LEN;
                a.cache.v.data = (float *)a.cache.k.data + D;
            }
            if (variant == 6) a.plse = NULL;
            if (variant == 7) rotary(&a); /* paged, tables of exactly the capacity */
            if (variant == 8) {            /* contiguous: tables longer than needed, left pads */
                rotary(&a);
                a.prm.cache_leftpad = a.lpad;
                a.prm.rotary_interleaved = 0;
            }
            if (variant == 9) { /* a pad equal to the length, no append */
                a.prm.cache_leftpad = a.lpad;
                a.pkn = a.pvn = NULL;
            }
            fa_status st = call(&a, op);
            if (st != FA_OK)
                fail_msg("valid %s call (variant %d): %s: %s", op_name(op), variant,
                         fa_status_string(st), fa_last_error(ctx));
            assert_string_equal(fa_last_error(ctx), "");
            fa_context_destroy(ctx);
        }
}

static void null_context(void **state) {
    (void)state;
    kargs a;
    reset(&a, NULL, 0);
    memcpy(snapshot, arena, ARENA_BYTES);
    for (int op = OP_CALL; op <= OP_MERGE; op <<= 1)
        assert_int_equal(call(&a, op), FA_ERR_NULL_POINTER);
    assert_memory_equal(snapshot, arena, ARENA_BYTES);
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    reset(&a, ctx, 0);
    assert_int_equal(fa_fwd_kvcache_workspace_size(ctx, a.pq, a.pcache, a.pkn, a.pvn, NULL, 0,
                                                   NULL),
                     FA_ERR_NULL_POINTER);
    assert_true(fa_last_error(ctx)[0] != 0);
    fa_context_destroy(ctx);
}

/* A user workspace one byte short fails before anything is written: outputs, cache (no
   append) and workspace alike. Forced splits make sure there is a workspace to undercut. */
static void workspace_too_small(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    kargs a;
    reset(&a, ctx, 0);
    a.splits = 2;
    size_t need = 0;
    assert_int_equal(fa_fwd_kvcache_workspace_size(ctx, a.pq, a.pcache, a.pkn, a.pvn, NULL, 2,
                                                   &need),
                     FA_OK);
    assert_true(need > 0);
    unsigned char *ws = malloc(need);
    assert_non_null(ws);
    memset(ws, 0x5a, need);
    assert_int_equal(fa_context_set_workspace(ctx, ws, need - 1), FA_OK);
    expect_failure(&a, OP_CALL, FA_ERR_WORKSPACE, "workspace one byte short");
    for (size_t i = 0; i < need; i++)
        if (ws[i] != 0x5a) fail_msg("fa_fwd_kvcache wrote into a workspace it rejected");
    /* exactly the size asked for is enough */
    assert_int_equal(fa_context_set_workspace(ctx, ws, need), FA_OK);
    fa_status st = call(&a, OP_CALL);
    if (st != FA_OK) fail_msg("%s: %s", fa_status_string(st), fa_last_error(ctx));
    free(ws);
    fa_context_destroy(ctx);
}

#define N_EXTRA 3
static struct CMUnitTest g_tests[N_EXTRA + sizeof bads / sizeof *bads];

static int setup(void) {
    if (arena) return 0;
    arena = malloc(ARENA_BYTES);
    snapshot = malloc(ARENA_BYTES);
    if (!arena || !snapshot) return 1;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x6b76657272ull);
    for (size_t i = 0; i < ARENA_BYTES / sizeof(float); i++)
        ((float *)arena)[i] = (float)tk_rng_normal(&r);
    return 0;
}

const struct CMUnitTest *kv_error_tests(size_t *n) {
    *n = 0;
    if (setup()) return g_tests;
    const struct CMUnitTest extra[N_EXTRA] = {
        cmocka_unit_test(valid_calls_pass), cmocka_unit_test(null_context),
        cmocka_unit_test(workspace_too_small),
    };
    size_t k = 0;
    for (int i = 0; i < N_EXTRA; i++) g_tests[k++] = extra[i];
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++)
        g_tests[k++] = (struct CMUnitTest){bads[i].name, one_bad, NULL, NULL, (void *)&bads[i]};
    *n = k;
    return g_tests;
}
