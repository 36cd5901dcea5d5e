/*
 * test_errors.c — the bad-input suite.
 *
 * Every validation branch documented in flashattn.h, one broken argument at a time on top of a
 * valid call, for each entry point it applies to (fa_fwd, fa_bwd, the workspace queries). Each
 * must return its exact status, leave a non-empty fa_last_error() and write nothing: all
 * tensors live in one arena, outputs poisoned, and the arena must be byte-identical after the
 * failed call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

enum { B = 2, SQ = 5, SK = 7, HQ = 4, HKV = 2, D = 8, TQ = B * SQ, TK = B * SK };
/* Room per tensor for the largest mutation (head dim 257, f64). */
enum { CAP = B * SK * HQ * 260 * 8 };
enum { T_Q, T_K, T_V, T_O, T_LSE, T_DOUT, T_DQ, T_DK, T_DV, NT };

static unsigned char *arena;
static unsigned char *snapshot;
#define ARENA_BYTES ((size_t)NT * CAP)

typedef struct args {
    fa_context *ctx;
    fa_tensor t[NT];
    fa_tensor *p[NT]; /* what the call receives; a mutation may set one to NULL */
    fa_params prm;
    const fa_params *pp;
    int32_t cu_q[B + 1], cu_k[B + 1];
    float slopes[B * HQ];
} args;

static void *region(int i) { return arena + (size_t)i * CAP; }

/* A valid call: BSHD f32, GQA 4/2, or its varlen twin (same tokens, THD). */
static void args_reset(args *a, fa_context *ctx, int varlen) {
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    for (int i = 0; i < NT; i++) {
        int kv = i == T_K || i == T_V || i == T_DK || i == T_DV;
        if (i == T_LSE)
            a->t[i] = varlen ? fa_tensor_2d(region(i), FA_DTYPE_F32, FA_DEVICE_CPU, HQ, TQ)
                             : fa_tensor_3d(region(i), FA_DTYPE_F32, FA_DEVICE_CPU, B, HQ, SQ);
        else if (varlen)
            a->t[i] = fa_tensor_3d(region(i), FA_DTYPE_F32, FA_DEVICE_CPU, kv ? TK : TQ,
                                   kv ? HKV : HQ, D);
        else
            a->t[i] = fa_tensor_bshd(region(i), FA_DTYPE_F32, FA_DEVICE_CPU, B, kv ? SK : SQ,
                                     kv ? HKV : HQ, D);
        a->p[i] = &a->t[i];
    }
    a->prm = fa_params_default();
    a->pp = &a->prm;
    for (int b = 0; b < B * HQ; b++) a->slopes[b] = 0.25f;
    if (varlen) {
        for (int b = 0; b <= B; b++) {
            a->cu_q[b] = b * SQ;
            a->cu_k[b] = b * SK;
        }
        a->prm.cu_seqlens_q = a->cu_q;
        a->prm.cu_seqlens_k = a->cu_k;
        a->prm.batch = B;
        a->prm.max_seqlen_q = SQ;
        a->prm.max_seqlen_k = SK;
    }
    /* every output poisoned (the forward's out/lse too: they are only validated, never read,
       when the backward fails) */
    for (int i = T_O; i < NT; i++)
        if (i != T_DOUT) memset(region(i), 0xff, CAP);
}

enum { OP_FWD = 1, OP_BWD = 2, OP_WS = 4, OP_ALL = 7, OP_FB = 3 };

static fa_status call(args *a, int op) {
    size_t bytes = 0;
    switch (op) {
    case OP_FWD:
        return fa_fwd(a->ctx, a->p[T_Q], a->p[T_K], a->p[T_V], a->pp, a->p[T_O], a->p[T_LSE]);
    case OP_BWD:
        return fa_bwd(a->ctx, a->p[T_Q], a->p[T_K], a->p[T_V], a->p[T_O], a->p[T_DOUT],
                      a->p[T_LSE], a->pp, a->p[T_DQ], a->p[T_DK], a->p[T_DV]);
    default: {
        const fa_tensor *q = a->p[T_Q], *k = a->p[T_K], *v = a->p[T_V];
        fa_status s1 = fa_fwd_workspace_size(a->ctx, q, k, v, a->pp, &bytes);
        fa_status s2 = fa_bwd_workspace_size(a->ctx, q, k, v, a->pp, &bytes);
        return s1 != s2 ? (fa_status)-1 : s1; /* both must agree */
    }
    }
}

/* ---- the mutations ---- */

typedef void (*mutator)(args *a);
typedef struct bad {
    const char *name;
    mutator m;
    fa_status want;
    int ops;
    int varlen; /* start from the varlen call */
} bad;

static void all_tensors(args *a, void (*f)(fa_tensor *)) {
    for (int i = 0; i < NT; i++) f(&a->t[i]);
}
static void set_f64(fa_tensor *t) { t->dtype = FA_DTYPE_F64; }
static void set_f8(fa_tensor *t) {
    if (t->ndim >= 3 && t->shape[t->ndim - 1] == D) t->dtype = FA_DTYPE_F8_E4M3;
}
static void set_cuda(fa_tensor *t) { t->device = FA_DEVICE_CUDA; }
static void contiguous_d(fa_tensor *t, int64_t d) { /* BSHD/THD tensor with head dim d */
    if (t->shape[t->ndim - 1] != D) return;
    t->shape[t->ndim - 1] = d;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i] > 0 ? t->shape[i] : 1; /* strides stay valid: only the size is bad */
    }
}
static void d257(fa_tensor *t) { contiguous_d(t, 257); }
static void d0(fa_tensor *t) { contiguous_d(t, 0); }

#define MUT(fn, body) \
    static void fn(args *a) { body; }
MUT(null_q, a->p[T_Q] = NULL)
MUT(null_k, a->p[T_K] = NULL)
MUT(null_v, a->p[T_V] = NULL)
MUT(null_out, a->p[T_O] = NULL)
MUT(null_dout, a->p[T_DOUT] = NULL)
MUT(null_dq, a->p[T_DQ] = NULL)
MUT(null_dk, a->p[T_DK] = NULL)
MUT(null_dv, a->p[T_DV] = NULL)
MUT(null_lse, a->p[T_LSE] = NULL)
MUT(null_q_data, a->t[T_Q].data = NULL)
/* 2^61.4 elements of 4 bytes: fits the address type, not ptrdiff_t (fuzz/ found a kernel
   write wrapped by such a span) */
static void span_past_ptrdiff(args *a) {
    fa_tensor *t = &a->t[T_Q];
    for (int i = 0; i < 4; i++) t->shape[i] = 1, t->stride[i] = 1;
    t->shape[0] = 2;
    t->stride[0] = INT64_MAX / 3;
}
/* a span of exactly 2^63 elements: its message must not overflow either (fuzz/ found it) */
static void span_2_63(args *a) {
    fa_tensor *t = &a->t[T_Q];
    for (int i = 0; i < 4; i++) t->shape[i] = 1, t->stride[i] = 1;
    t->shape[0] = 2;
    t->stride[0] = INT64_MAX;
}
/* elements not aligned to their size: loading them is undefined behaviour (fuzz/ found it) */
MUT(misaligned_q, a->t[T_Q].data = (char *)a->t[T_Q].data + 1)
MUT(misaligned_dv, a->t[T_DV].data = (char *)a->t[T_DV].data + 2)
MUT(null_v_data, a->t[T_V].data = NULL)
MUT(null_out_data, a->t[T_O].data = NULL)
MUT(null_dk_data, a->t[T_DK].data = NULL)
MUT(ndim3_q, a->t[T_Q].ndim = 3)
MUT(ndim5_k, a->t[T_K].ndim = 5)
MUT(ndim0_v, a->t[T_V].ndim = 0)
MUT(ndim4_lse, a->t[T_LSE].ndim = 4)
MUT(v_seq_differs, a->t[T_V].shape[1] = SK - 1)
MUT(k_headdim_differs, a->t[T_K].shape[3] = 4; a->t[T_V].shape[3] = 4; a->t[T_DK].shape[3] = 4;
    a->t[T_DV].shape[3] = 4)
MUT(batch_differs, a->t[T_K].shape[0] = 1; a->t[T_V].shape[0] = 1; a->t[T_DK].shape[0] = 1;
    a->t[T_DV].shape[0] = 1)
MUT(out_shape, a->t[T_O].shape[1] = SQ - 1)
MUT(dout_shape, a->t[T_DOUT].shape[2] = HQ - 1)
MUT(dq_shape, a->t[T_DQ].shape[2] = 2)
MUT(dk_shape, a->t[T_DK].shape[1] = SK + 1)
MUT(dv_shape, a->t[T_DV].shape[0] = 1)
MUT(lse_shape, a->t[T_LSE].shape[2] = SQ - 1)
MUT(lse_heads, a->t[T_LSE].shape[1] = HKV)
MUT(seqlen_q_zero, a->t[T_Q].shape[1] = 0; a->t[T_O].shape[1] = 0; a->t[T_DOUT].shape[1] = 0;
    a->t[T_DQ].shape[1] = 0; a->t[T_LSE].shape[2] = 0)
MUT(seqlen_k_negative, for (int i = T_K; i <= T_V; i++) a->t[i].shape[1] = -3;
    a->t[T_DK].shape[1] = -3; a->t[T_DV].shape[1] = -3)
MUT(batch_zero, for (int i = 0; i < NT; i++) a->t[i].shape[0] = 0)
MUT(heads_kv_zero, a->t[T_K].shape[2] = 0; a->t[T_V].shape[2] = 0; a->t[T_DK].shape[2] = 0;
    a->t[T_DV].shape[2] = 0)
MUT(head_dim_zero, all_tensors(a, d0))
MUT(head_dim_257, all_tensors(a, d257))
MUT(k_is_f16, a->t[T_K].dtype = FA_DTYPE_F16)
MUT(out_is_bf16, a->t[T_O].dtype = FA_DTYPE_BF16)
MUT(dq_is_f16, a->t[T_DQ].dtype = FA_DTYPE_F16)
MUT(f64_auto, all_tensors(a, set_f64))
MUT(f64_plain, all_tensors(a, set_f64); fa_context_set_algo(a->ctx, FA_ALGO_PLAIN))
MUT(f8, all_tensors(a, set_f8))
MUT(unknown_dtype, a->t[T_Q].dtype = (fa_dtype)77)
MUT(lse_is_f16, a->t[T_LSE].dtype = FA_DTYPE_F16)
MUT(lse_is_f64, a->t[T_LSE].dtype = FA_DTYPE_F64)
MUT(q_last_stride, a->t[T_Q].stride[3] = 2)
MUT(out_last_stride, a->t[T_O].stride[3] = 0)
MUT(k_zero_stride, a->t[T_K].stride[1] = 0)
MUT(v_negative_stride, a->t[T_V].stride[0] = -a->t[T_V].stride[0])
MUT(dv_negative_stride, a->t[T_DV].stride[2] = -1)
MUT(lse_zero_stride, a->t[T_LSE].stride[0] = 0)
static void gqa_4_of_3(args *a) { /* heads are dimension ndim-2 in BSHD and THD alike */
    int kv[] = {T_K, T_V, T_DK, T_DV};
    for (int i = 0; i < 4; i++) a->t[kv[i]].shape[a->t[kv[i]].ndim - 2] = 3;
}
MUT(cu_q_decreasing, a->cu_q[1] = TQ + 1)
MUT(cu_k_not_from_zero, a->cu_k[0] = 1)
MUT(cu_k_last_not_total, a->cu_k[B] = TK - 1)
MUT(cu_q_last_not_total, a->cu_q[B] = TQ + 2)
MUT(cu_k_null, a->prm.cu_seqlens_k = NULL)
MUT(cu_q_null, a->prm.cu_seqlens_q = NULL)
MUT(max_seqlen_q_short, a->prm.max_seqlen_q = SQ - 1)
MUT(max_seqlen_k_short, a->prm.max_seqlen_k = 1)
MUT(max_seqlen_negative, a->prm.max_seqlen_k = -1)
MUT(varlen_batch_zero, a->prm.batch = 0)
MUT(cu_with_bshd, a->prm.cu_seqlens_q = a->cu_q; a->prm.cu_seqlens_k = a->cu_k;
    a->prm.batch = B)
MUT(huge_shape, a->t[T_Q] = fa_tensor_bshd(region(T_Q), FA_DTYPE_F32, FA_DEVICE_CPU,
                                           (int64_t)1 << 40, (int64_t)1 << 30, HQ, D))
MUT(huge_stride, a->t[T_K].stride[0] = INT64_MAX / 2)
MUT(beyond_address_space, a->t[T_V].data = (void *)(UINTPTR_MAX - 64))
MUT(scale_negative, a->prm.softmax_scale = -1.0f)
MUT(scale_nan, a->prm.softmax_scale = NAN)
MUT(scale_inf, a->prm.softmax_scale = INFINITY)
MUT(softcap_negative, a->prm.softcap = -0.5f)
MUT(softcap_nan, a->prm.softcap = NAN)
MUT(softcap_inf, a->prm.softcap = INFINITY)
MUT(window_left_below, a->prm.window_left = -2)
MUT(window_right_below, a->prm.window_right = -7)
MUT(alibi_stride_negative, a->prm.alibi_slopes = a->slopes; a->prm.alibi_batch_stride = -1)
MUT(alibi_stride_short, a->prm.alibi_slopes = a->slopes; a->prm.alibi_batch_stride = HQ - 1)
MUT(scale_huge, a->prm.softmax_scale = 3e38f)
MUT(scale_past_bound, a->prm.softmax_scale = nextafterf(FA_MAX_SOFTMAX_SCALE, INFINITY))
MUT(alibi_nan, a->prm.alibi_slopes = a->slopes; a->slopes[3] = NAN)
MUT(alibi_inf_row1, a->prm.alibi_slopes = a->slopes; a->prm.alibi_batch_stride = HQ;
    a->slopes[HQ + 2] = INFINITY)
MUT(alibi_minus_inf, a->prm.alibi_slopes = a->slopes; a->slopes[0] = -INFINITY)
MUT(alibi_huge, a->prm.alibi_slopes = a->slopes; a->slopes[1] = 1e20f)
MUT(all_on_cuda, all_tensors(a, set_cuda))
MUT(k_on_cuda, a->t[T_K].device = FA_DEVICE_CUDA)
MUT(dq_on_cuda, a->t[T_DQ].device = FA_DEVICE_CUDA)
MUT(unknown_device, a->t[T_Q].device = (fa_device)9)
MUT(out_overlaps_q, a->t[T_O].data = (float *)region(T_Q) + 3)
MUT(lse_overlaps_k, a->t[T_LSE].data = region(T_K))
/* outputs that alias themselves or each other (the inputs' strides stay as they are) */
MUT(out_heads_alias, a->t[T_O].stride[a->t[T_O].ndim - 2] = D - 1)
MUT(dq_rows_alias, a->t[T_DQ].stride[a->t[T_DQ].ndim - 3] = D)
MUT(lse_overlaps_out, a->t[T_LSE].data = (float *)region(T_O) + 5)
MUT(lse_self_alias, a->t[T_LSE].stride[a->t[T_LSE].ndim - 2] = 1)
MUT(dv_is_dk, a->t[T_DV].data = region(T_DK))
MUT(dv_one_row_on, a->t[T_DV].data = (float *)region(T_DK) + HKV * D) /* dv row t is dk row t+1 */
MUT(dv_half_element, a->t[T_DV].data = (char *)region(T_DK) + 2)
MUT(dk_overlaps_dout, a->t[T_DK].data = region(T_DOUT))
#undef MUT

static const bad bads[] = {
    {"null q", null_q, FA_ERR_NULL_POINTER, OP_ALL, 0},
    {"null k", null_k, FA_ERR_NULL_POINTER, OP_ALL, 0},
    {"null v", null_v, FA_ERR_NULL_POINTER, OP_ALL, 0},
    {"null out", null_out, FA_ERR_NULL_POINTER, OP_FB, 0},
    {"null dout", null_dout, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"null dq", null_dq, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"null dk", null_dk, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"null dv", null_dv, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"null lse in bwd", null_lse, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"null q->data", null_q_data, FA_ERR_NULL_POINTER, OP_ALL, 0},
    {"misaligned q->data", misaligned_q, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"span of 2^63 elements", span_2_63, FA_ERR_OVERFLOW, OP_FB, 0},
    {"span past PTRDIFF_MAX bytes", span_past_ptrdiff, FA_ERR_OVERFLOW, OP_WS, 0},
    {"misaligned dv->data", misaligned_dv, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
    {"null v->data", null_v_data, FA_ERR_NULL_POINTER, OP_ALL, 0},
    {"null out->data", null_out_data, FA_ERR_NULL_POINTER, OP_FB, 0},
    {"null dk->data", null_dk_data, FA_ERR_NULL_POINTER, OP_BWD, 0},
    {"q ndim 3 (bshd)", ndim3_q, FA_ERR_SHAPE, OP_ALL, 0},
    {"k ndim 5", ndim5_k, FA_ERR_SHAPE, OP_ALL, 0},
    {"v ndim 0", ndim0_v, FA_ERR_SHAPE, OP_ALL, 0},
    {"lse ndim 4", ndim4_lse, FA_ERR_SHAPE, OP_FB, 0},
    {"v seqlen != k seqlen", v_seq_differs, FA_ERR_SHAPE, OP_ALL, 0},
    {"k head dim != q head dim", k_headdim_differs, FA_ERR_SHAPE, OP_ALL, 0},
    {"k batch != q batch", batch_differs, FA_ERR_SHAPE, OP_ALL, 0},
    {"out shape != q shape", out_shape, FA_ERR_SHAPE, OP_FB, 0},
    {"dout shape != q shape", dout_shape, FA_ERR_SHAPE, OP_BWD, 0},
    {"dq shape != q shape", dq_shape, FA_ERR_SHAPE, OP_BWD, 0},
    {"dk shape != k shape", dk_shape, FA_ERR_SHAPE, OP_BWD, 0},
    {"dv shape != k shape", dv_shape, FA_ERR_SHAPE, OP_BWD, 0},
    {"lse seqlen wrong", lse_shape, FA_ERR_SHAPE, OP_FB, 0},
    {"lse heads wrong", lse_heads, FA_ERR_SHAPE, OP_FB, 0},
    {"lse shape wrong (varlen)", lse_heads, FA_ERR_SHAPE, OP_FB, 1},
    {"seqlen_q 0", seqlen_q_zero, FA_ERR_SHAPE, OP_ALL, 0},
    {"seqlen_k -3", seqlen_k_negative, FA_ERR_SHAPE, OP_ALL, 0},
    {"batch 0", batch_zero, FA_ERR_SHAPE, OP_ALL, 0},
    {"heads_kv 0", heads_kv_zero, FA_ERR_SHAPE, OP_ALL, 0},
    {"head dim 0", head_dim_zero, FA_ERR_SHAPE, OP_ALL, 0},
    {"head dim 257", head_dim_257, FA_ERR_HEAD_DIM, OP_ALL, 0},
    {"head dim 257 (varlen)", head_dim_257, FA_ERR_HEAD_DIM, OP_ALL, 1},
    {"k f16, q f32", k_is_f16, FA_ERR_DTYPE, OP_ALL, 0},
    {"out bf16, q f32", out_is_bf16, FA_ERR_DTYPE, OP_FB, 0},
    {"dq f16, q f32", dq_is_f16, FA_ERR_DTYPE, OP_BWD, 0},
    {"f64 without FA_ALGO_NAIVE", f64_auto, FA_ERR_DTYPE, OP_ALL, 0},
    {"f64 with FA_ALGO_PLAIN", f64_plain, FA_ERR_DTYPE, OP_ALL, 0},
    /* FP8 inputs are a forward dtype (test_fp8.c): an FP8 out and any FP8 backward are not;
       a forward workspace query takes FP8 inputs (its out is a stand-in) */
    {"f8e4m3 out, f8e4m3 backward", f8, FA_ERR_DTYPE, OP_FB, 0},
    {"unknown dtype", unknown_dtype, FA_ERR_DTYPE, OP_ALL, 0},
    {"lse f16", lse_is_f16, FA_ERR_DTYPE, OP_FB, 0},
    {"lse f64 with f32 inputs", lse_is_f64, FA_ERR_DTYPE, OP_FB, 0},
    {"q last stride 2", q_last_stride, FA_ERR_STRIDE, OP_ALL, 0},
    {"out last stride 0", out_last_stride, FA_ERR_STRIDE, OP_FB, 0},
    {"k stride 0", k_zero_stride, FA_ERR_STRIDE, OP_ALL, 0},
    {"v negative stride", v_negative_stride, FA_ERR_STRIDE, OP_ALL, 0},
    {"dv negative stride", dv_negative_stride, FA_ERR_STRIDE, OP_BWD, 0},
    {"lse stride 0", lse_zero_stride, FA_ERR_STRIDE, OP_FB, 0},
    {"heads 4 over 3", gqa_4_of_3, FA_ERR_GQA, OP_ALL, 0},
    {"heads 4 over 3 (varlen)", gqa_4_of_3, FA_ERR_GQA, OP_ALL, 1},
    {"cu_seqlens_q decreasing", cu_q_decreasing, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens_k[0] != 0", cu_k_not_from_zero, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens_k last != total_k", cu_k_last_not_total, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens_q last != total_q", cu_q_last_not_total, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens_k NULL, _q set", cu_k_null, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens_q NULL, _k set", cu_q_null, FA_ERR_VARLEN, OP_ALL, 1},
    {"max_seqlen_q too small", max_seqlen_q_short, FA_ERR_VARLEN, OP_ALL, 1},
    {"max_seqlen_k too small", max_seqlen_k_short, FA_ERR_VARLEN, OP_ALL, 1},
    {"max_seqlen_k negative", max_seqlen_negative, FA_ERR_VARLEN, OP_ALL, 1},
    {"varlen batch 0", varlen_batch_zero, FA_ERR_VARLEN, OP_ALL, 1},
    {"cu_seqlens with 4-d tensors", cu_with_bshd, FA_ERR_SHAPE, OP_ALL, 0},
    {"size overflow (2^40 x 2^30 tokens)", huge_shape, FA_ERR_OVERFLOW, OP_ALL, 0},
    {"stride overflow", huge_stride, FA_ERR_OVERFLOW, OP_ALL, 0},
    {"span beyond address space", beyond_address_space, FA_ERR_OVERFLOW, OP_ALL, 0},
    {"scale -1", scale_negative, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"scale NaN", scale_nan, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"scale inf", scale_inf, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"softcap -0.5", softcap_negative, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"softcap NaN", softcap_nan, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"softcap inf", softcap_inf, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"window_left -2", window_left_below, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"window_right -7", window_right_below, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi_batch_stride -1", alibi_stride_negative, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi_batch_stride < heads_q", alibi_stride_short, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"cuda tensors on a cpu context", all_on_cuda, FA_ERR_DEVICE, OP_ALL, 0},
    {"k on cuda, q on cpu", k_on_cuda, FA_ERR_DEVICE, OP_ALL, 0},
    {"dq on cuda", dq_on_cuda, FA_ERR_DEVICE, OP_BWD, 0},
    {"unknown device", unknown_device, FA_ERR_DEVICE, OP_ALL, 0},
    {"out overlaps q", out_overlaps_q, FA_ERR_INVALID_ARGUMENT, OP_FWD, 0},
    {"lse (output) overlaps k", lse_overlaps_k, FA_ERR_INVALID_ARGUMENT, OP_FWD, 0},
    {"dk overlaps dout", dk_overlaps_dout, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
    {"scale 3e38", scale_huge, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"scale just past FA_MAX_SOFTMAX_SCALE", scale_past_bound, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi slope NaN", alibi_nan, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi slope +inf in batch row 1", alibi_inf_row1, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi slope +inf in batch row 1 (varlen)", alibi_inf_row1, FA_ERR_INVALID_ARGUMENT, OP_ALL,
     1},
    {"alibi slope -inf", alibi_minus_inf, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"alibi slope 1e20", alibi_huge, FA_ERR_INVALID_ARGUMENT, OP_ALL, 0},
    {"out head stride < head_dim", out_heads_alias, FA_ERR_INVALID_ARGUMENT, OP_FWD, 0},
    {"out head stride < head_dim (varlen)", out_heads_alias, FA_ERR_INVALID_ARGUMENT, OP_FWD, 1},
    {"dq seq stride = head stride", dq_rows_alias, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
    {"lse overlaps out", lse_overlaps_out, FA_ERR_INVALID_ARGUMENT, OP_FWD, 0},
    {"lse aliases itself", lse_self_alias, FA_ERR_INVALID_ARGUMENT, OP_FWD, 0},
    {"lse aliases itself (varlen)", lse_self_alias, FA_ERR_INVALID_ARGUMENT, OP_FWD, 1},
    {"dv is dk", dv_is_dk, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
    {"dv one token row past dk", dv_one_row_on, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
    {"dv half an element past dk", dv_half_element, FA_ERR_INVALID_ARGUMENT, OP_BWD, 0},
};

static const char *op_name(int op) {
    return op == OP_FWD ? "fa_fwd" : op == OP_BWD ? "fa_bwd" : "fa_*_workspace_size";
}

static void expect_failure(args *a, int op, fa_status want, const char *what) {
    memcpy(snapshot, arena, ARENA_BYTES);
    fa_status st = call(a, op);
    sweep_expect_failure(a->ctx, st, want, what, op_name(op), snapshot, arena, ARENA_BYTES, op == OP_WS);
}

static void one_bad(void **state) {
    const bad *b = *state;
    for (int op = OP_FWD; op <= OP_WS; op <<= 1) {
        if (!(b->ops & op)) continue;
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
        args a;
        args_reset(&a, ctx, b->varlen);
        b->m(&a);
        expect_failure(&a, op, b->want, b->name);
        fa_context_destroy(ctx);
    }
}

/* The unbroken calls succeed, so every failure above is due to its one mutation. */
static void valid_calls_pass(void **state) {
    (void)state;
    for (int varlen = 0; varlen < 2; varlen++)
        for (int op = OP_FWD; op <= OP_WS; op <<= 1) {
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            args a;
            args_reset(&a, ctx, varlen);
            a.prm.alibi_slopes = a.slopes; /* also the longest legal ALiBi row stride */
            a.prm.alibi_batch_stride = HQ;
            fa_status st = call(&a, op);
            if (st != FA_OK)
                fail_msg("valid %s call (varlen %d): %s: %s", op_name(op), varlen,
                         fa_status_string(st), fa_last_error(ctx));
            assert_string_equal(fa_last_error(ctx), "");
            fa_context_destroy(ctx);
        }
}

/* Outputs that share a buffer without sharing an element pass: dk and dv as the two halves of
   a packed [B, SK, 2, HKV, D] dkv; and the largest softmax_scale works: with q = 0 every score
   is 0 and out is the mean of v (finite only if scale * log2(e) does not overflow). */
static void legal_layouts_pass(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    args a;
    args_reset(&a, ctx, 0);
    const int64_t pk[4] = {SK * 2 * HKV * D, 2 * HKV * D, D, 1};
    memcpy(a.t[T_DK].stride, pk, sizeof pk);
    memcpy(a.t[T_DV].stride, pk, sizeof pk);
    a.t[T_DV].data = (float *)region(T_DK) + HKV * D;
    fa_status st = call(&a, OP_BWD);
    if (st != FA_OK) fail_msg("packed dk/dv: %s: %s", fa_status_string(st), fa_last_error(ctx));

    args_reset(&a, ctx, 0);
    float *q = calloc((size_t)B * SQ * HQ * D, sizeof *q);
    assert_non_null(q);
    a.t[T_Q].data = q;
    a.prm.softmax_scale = FA_MAX_SOFTMAX_SCALE;
    st = call(&a, OP_FWD);
    if (st != FA_OK) fail_msg("scale 2^126: %s: %s", fa_status_string(st), fa_last_error(ctx));
    const float *v = region(T_V), *o = region(T_O);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < SQ; t++)
            for (int h = 0; h < HQ; h++)
                for (int x = 0; x < D; x++) {
                    double mean = 0;
                    for (int j = 0; j < SK; j++) mean += v[((b * SK + j) * HKV + h / 2) * D + x];
                    mean /= SK;
                    const float got = o[((b * SQ + t) * HQ + h) * D + x];
                    if (!(fabs(got - mean) <= 1e-5 * (1 + fabs(mean))))
                        fail_msg("scale 2^126, q = 0: out(%d, %d, %d, %d) = %g, mean of v %g", b,
                                 t, h, x, (double)got, mean);
                }
    free(q);
    fa_context_destroy(ctx);
}

static void null_context(void **state) {
    (void)state;
    args a;
    args_reset(&a, NULL, 0);
    size_t bytes;
    memcpy(snapshot, arena, ARENA_BYTES);
    assert_int_equal(call(&a, OP_FWD), FA_ERR_NULL_POINTER);
    assert_int_equal(call(&a, OP_BWD), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_fwd_workspace_size(NULL, &a.t[T_Q], &a.t[T_K], &a.t[T_V], NULL, &bytes),
                     FA_ERR_NULL_POINTER);
    assert_int_equal(fa_bwd_workspace_size(NULL, &a.t[T_Q], &a.t[T_K], &a.t[T_V], NULL, &bytes),
                     FA_ERR_NULL_POINTER);
    assert_memory_equal(snapshot, arena, ARENA_BYTES);
    assert_null(fa_last_selection(NULL));
    assert_int_equal(fa_context_set_threads(NULL, 1), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_algo(NULL, FA_ALGO_AUTO), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_strict(NULL, 1), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_stream(NULL, NULL), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_workspace(NULL, NULL, 0), FA_ERR_NULL_POINTER);
    fa_context_destroy(NULL); /* documented no-op */
}

static void workspace_query_null_bytes(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    args a;
    args_reset(&a, ctx, 0);
    assert_int_equal(fa_fwd_workspace_size(ctx, &a.t[T_Q], &a.t[T_K], &a.t[T_V], NULL, NULL),
                     FA_ERR_NULL_POINTER);
    assert_true(fa_last_error(ctx)[0] != 0);
    assert_int_equal(fa_bwd_workspace_size(ctx, &a.t[T_Q], &a.t[T_K], &a.t[T_V], NULL, NULL),
                     FA_ERR_NULL_POINTER);
    assert_true(fa_last_error(ctx)[0] != 0);
    fa_context_destroy(ctx);
}

/* A user workspace one byte short of what the call asks fails with FA_ERR_WORKSPACE before
   writing anything (neither the outputs nor the workspace). */
static void workspace_too_small(void **state) {
    (void)state;
    for (int op = OP_FWD; op <= OP_BWD; op <<= 1) {
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
        args a;
        args_reset(&a, ctx, 0);
        size_t need = 0;
        const fa_tensor *q = &a.t[T_Q], *k = &a.t[T_K], *v = &a.t[T_V];
        fa_status st = op == OP_FWD ? fa_fwd_workspace_size(ctx, q, k, v, NULL, &need)
                                    : fa_bwd_workspace_size(ctx, q, k, v, NULL, &need);
        assert_int_equal(st, FA_OK);
        if (need == 0) {
            print_message("%s needs no workspace for this shape; nothing to undercut\n",
                          op_name(op));
            fa_context_destroy(ctx);
            continue;
        }
        unsigned char *ws = malloc(need);
        assert_non_null(ws);
        memset(ws, 0x5a, need);
        assert_int_equal(fa_context_set_workspace(ctx, ws, need - 1), FA_OK);
        expect_failure(&a, op, FA_ERR_WORKSPACE, "workspace one byte short");
        for (size_t i = 0; i < need; i++)
            if (ws[i] != 0x5a) fail_msg("%s wrote into a workspace it rejected", op_name(op));
        free(ws);
        fa_context_destroy(ctx);
    }
}

static void context_create_errors(void **state) {
    (void)state;
    assert_int_equal(fa_context_create(NULL, FA_BACKEND_CPU), FA_ERR_NULL_POINTER);
    assert_true(fa_last_error(NULL)[0] != 0);
    fa_context *ctx = (fa_context *)&ctx; /* must be reset to NULL on failure */
    assert_int_equal(fa_context_create(&ctx, (fa_backend)42), FA_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_true(fa_last_error(NULL)[0] != 0);
    if (!fa_has_cuda()) {
        ctx = (fa_context *)&ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_ERR_NO_BACKEND);
        assert_null(ctx);
        assert_true(fa_last_error(NULL)[0] != 0);
    }
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_threads(ctx, -1), FA_ERR_INVALID_ARGUMENT);
    assert_true(fa_last_error(ctx)[0] != 0);
    assert_int_equal(fa_context_set_algo(ctx, (fa_algo)9), FA_ERR_INVALID_ARGUMENT);
    assert_true(fa_last_error(ctx)[0] != 0);
    fa_context_destroy(ctx);
}

int main(void) {
    arena = malloc(ARENA_BYTES);
    snapshot = malloc(ARENA_BYTES);
    if (!arena || !snapshot) return 1;
    /* inputs: finite values; outputs are re-poisoned per call by args_reset */
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    for (size_t i = 0; i < ARENA_BYTES / sizeof(float); i++)
        ((float *)arena)[i] = (float)tk_rng_normal(&r);

    enum { NB = sizeof bads / sizeof *bads, NX = 6 };
    struct CMUnitTest tests[NB + NX] = {
        cmocka_unit_test(valid_calls_pass),     cmocka_unit_test(legal_layouts_pass),
        cmocka_unit_test(null_context),
        cmocka_unit_test(workspace_query_null_bytes), cmocka_unit_test(workspace_too_small),
        cmocka_unit_test(context_create_errors),
    };
    for (int i = 0; i < NB; i++)
        tests[NX + i] = (struct CMUnitTest){bads[i].name, one_bad, NULL, NULL, (void *)&bads[i]};
    int failed = _cmocka_run_group_tests("errors", tests, NB + NX, NULL, NULL);
    free(arena);
    free(snapshot);
    return failed != 0;
}
