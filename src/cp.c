/*
 * cp.c — fa_cp_fwd and fa_cp_bwd: the public doors of context parallelism (flashattn.h). They
 * check the arguments with the dispatcher's helpers (validate.h: same words, nothing written
 * on error), refuse what the ring does not do, and hand the shard problem to the CUDA ring
 * (cuda/cp_ring.c) through fa_call_finish, which takes the workspace as for any call.
 */
#include <stddef.h>
#include <stdio.h>

#include "cp.h"
#include "cp_schedule.h"
#include "validate.h"

/* fa_cp_args version 1 ends with dv. */
#define FA_CP_ARGS_V1_SIZE (offsetof(fa_cp_args, dv) + sizeof(fa_tensor *))

static fa_status check_args_struct(fa_context *ctx, const char *fn, const fa_cp_args *a) {
    if (!a) return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: args is NULL", fn);
    if (a->version == 0 || a->version > FA_CP_ARGS_VERSION)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: args->version = %u, but this library (%s) knows fa_cp_args version "
                       "1..%d: start from fa_cp_args_default()",
                       fn, a->version, fa_version(), FA_CP_ARGS_VERSION);
    if (a->struct_size != FA_CP_ARGS_V1_SIZE)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: args->struct_size = %u, but fa_cp_args version %u is %zu bytes: "
                       "start from fa_cp_args_default()",
                       fn, a->struct_size, a->version, (size_t)FA_CP_ARGS_V1_SIZE);
    return FA_OK;
}

/* The options the ring implements are causal and softmax_scale; the others would need the
   per-shard calls to shift their masks, biases or dropout counters by the shard's global
   position, which they do not (yet): refused rather than computed wrong. */
static fa_status check_supported(fa_context *ctx, const char *fn, const fa_params *p) {
    const char *what = NULL;
    if (p->window_left != -1 || (p->window_right != -1 && !(p->causal && p->window_right == 0)))
        what = "sliding windows (window_left/window_right)";
    else if (p->alibi_slopes) what = "ALiBi";
    else if (p->softcap != 0.0f) what = "softcap";
    else if (p->dropout_p != 0.0f) what = "dropout";
    else if (p->cu_seqlens_q || p->cu_seqlens_k) what = "varlen (cu_seqlens)";
    else if (p->q_descale || p->k_descale || p->v_descale) what = "FP8 descales";
    else if (p->rotary_cos || p->rotary_sin || p->cache_leftpad)
        what = "rotary / cache_leftpad (fa_fwd_kvcache options)";
    if (!what) return FA_OK;
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "%s: %s: context parallelism takes causal and softmax_scale only", fn, what);
}

static fa_status validate(fa_call *c, const fa_cp_args *args, fa_cp_problem *cp) {
    fa_context *ctx = c->ctx;
    fa_problem *pr = &cp->pr;
    FA_TRY(check_supported(ctx, c->fn, c->p));
    if (!fa_cp_layout_ok(args->layout))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: layout = %d, expected FA_CP_CONTIGUOUS (0) or FA_CP_ZIGZAG (1)",
                       c->fn, args->layout);
    if (args->seqlen < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: seqlen = %lld < 0", c->fn,
                       (long long)args->seqlen);
    /* tensors of zero tokens are refused by every call (shape >= 1): with seqlen >= world
       every rank holds one (zigzag and contiguous alike: chunk r < world <= seqlen is
       non-empty) */
    if (args->seqlen < cp->world)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "%s: seqlen = %lld over %d ranks: every rank's shard must hold a token "
                       "(seqlen >= the world size)",
                       c->fn, (long long)args->seqlen, cp->world);
    if (!c->lse) return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: lse is NULL (required)", c->fn);
    fa_arg a[9];
    const int n = fa_attn_args(c, a);
    FA_TRY(fa_check_tensors(c, a, n, 4));
    FA_TRY(fa_check_dtypes(c, a, n));
    FA_TRY(fa_check_devices(c, a, n));
    const fa_tensor *q = c->q, *k = c->k;
    if (q->dtype != FA_DTYPE_F16 && q->dtype != FA_DTYPE_BF16)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: q is %s; context parallelism takes f16 or bf16",
                       c->fn, fa_dtype_name(q->dtype));
    FA_TRY(fa_check_same_shape(c, "k", k, "v", c->v));
    FA_TRY(fa_check_same_shape(c, "q", q, "out", c->out));
    if (c->bwd) {
        FA_TRY(fa_check_same_shape(c, "q", q, "dout", c->dout));
        FA_TRY(fa_check_same_shape(c, "q", q, "dq", c->dq));
        FA_TRY(fa_check_same_shape(c, "k", k, "dk", c->dk));
        FA_TRY(fa_check_same_shape(c, "k", k, "dv", c->dv));
    }
    if (q->shape[3] != k->shape[3] || q->shape[0] != k->shape[0] || q->shape[1] != k->shape[1])
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "%s: q [%lld, %lld, *, %lld] and k [%lld, %lld, *, %lld]: the shards of "
                       "one self-attention share batch, shard length and head_dim",
                       c->fn, (long long)q->shape[0], (long long)q->shape[1],
                       (long long)q->shape[3], (long long)k->shape[0], (long long)k->shape[1],
                       (long long)k->shape[3]);
    const int64_t d = q->shape[3], hq = q->shape[2], hk = k->shape[2];
    if (d > FA_MAX_HEAD_DIM)
        return fa_fail(ctx, FA_ERR_HEAD_DIM, "%s: head_dim = %lld, at most %d", c->fn,
                       (long long)d, FA_MAX_HEAD_DIM);
    if (hq % hk)
        return fa_fail(ctx, FA_ERR_GQA, "%s: heads_q = %lld is not a multiple of heads_kv = %lld",
                       c->fn, (long long)hq, (long long)hk);
    const int64_t want = fa_cp_shard_len(args->seqlen, cp->world, cp->rank, args->layout);
    if (q->shape[1] != want)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "%s: rank %d holds %lld tokens, but its %s shard of %lld over %d ranks "
                       "has %lld",
                       c->fn, cp->rank, (long long)q->shape[1],
                       args->layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous",
                       (long long)args->seqlen, cp->world, (long long)want);
    const fa_tensor *l = c->lse;
    if (l->shape[0] != q->shape[0] || l->shape[1] != hq || l->shape[2] != q->shape[1])
        return fa_fail(ctx, FA_ERR_SHAPE, "%s: lse must be [batch, heads_q, shard_len] = "
                       "[%lld, %lld, %lld]", c->fn, (long long)q->shape[0], (long long)hq,
                       (long long)q->shape[1]);
    pr->dtype = pr->odtype = q->dtype;
    pr->batch = q->shape[0];
    pr->seqlen_q = pr->seqlen_k = q->shape[1];
    pr->heads_q = hq;
    pr->heads_kv = hk;
    pr->group = hq / hk;
    pr->d = d;
    pr->lse = l->data;
    pr->lse_sb = fa_stride_of(l, 0);
    pr->lse_sh = fa_stride_of(l, 1);
    pr->lse_st = fa_stride_of(l, 2);
    FA_TRY(fa_check_options(c, pr));
    if (!c->query_only) FA_TRY(fa_check_overlaps(c, a, n));
    pr->q = fa_operand_of(q, 0);
    pr->k = fa_operand_of(k, 0);
    pr->v = fa_operand_of(c->v, 0);
    pr->o = fa_operand_of(c->out, 0);
    if (c->bwd) {
        pr->dout = fa_operand_of(c->dout, 0);
        pr->dq = fa_operand_of(c->dq, 0);
        pr->dk = fa_operand_of(c->dk, 0);
        pr->dv = fa_operand_of(c->dv, 0);
    }
    cp->seqlen = args->seqlen;
    cp->layout = args->layout;
    cp->bwd = c->bwd;
    return FA_OK;
}

/* A call, or (query) a workspace query: fa_call_finish stores the need in *query_bytes and
   runs nothing. */
static fa_status run(const char *fn, fa_context *ctx, void *comm, const fa_cp_args *a, int bwd,
                     int query, size_t *query_bytes) {
    if (!ctx) return fa_fail(NULL, FA_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    /* the struct is checked before the context is marked: its fields name the tensors */
    fa_status st0 = fa_ctx_enter(ctx, fn);
    if (st0 != FA_OK) return st0;
    st0 = check_args_struct(ctx, fn, a);
    fa_ctx_leave(ctx);
    if (st0 != FA_OK) return st0;
    fa_call c = {ctx, fn, a->q, a->k, a->v, a->out, a->lse, a->dout,
                 a->dq, a->dk, a->dv, a->p, bwd, query};
    if (query) { /* outputs the query lacks: stand-ins of their shape */
        if (!c.out) c.out = a->q;
        if (bwd && !c.dout) c.dout = a->q;
        if (bwd && !c.dq) c.dq = a->q;
        if (bwd && !c.dk) c.dk = a->k;
        if (bwd && !c.dv) c.dv = a->k;
    }
    fa_params params;
    FA_TRY(fa_call_begin(&c, &params));
    fa_status st = query && !query_bytes
                       ? fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: bytes is NULL", fn)
                       : FA_OK;
    fa_cp_problem cp;
    memset(&cp, 0, sizeof cp);
    cp.comm = comm;
#ifdef FLASHATTN_WITH_CUDA
    if (st == FA_OK && ctx->backend != FA_BACKEND_CUDA)
        st = fa_fail(ctx, FA_ERR_UNSUPPORTED,
                     "%s: context parallelism runs on the CUDA backend; this context's is %s",
                     fn, ctx->ops->name);
    if (st == FA_OK && !comm)
        st = fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: nccl_comm is NULL", fn);
    if (st == FA_OK) st = fa_cp_comm_info(ctx, fn, comm, &cp.world, &cp.rank);
    if (st == FA_OK) st = validate(&c, a, &cp);
    if (st == FA_OK)
        st = fa_call_finish(&c, &cp.pr, fa_cp_cuda_workspace, fa_cp_cuda_run, query_bytes);
#else
    (void)validate;
    if (st == FA_OK)
        st = fa_fail(ctx, FA_ERR_NO_BACKEND,
                     "%s: this build has no CUDA backend, and context parallelism runs over "
                     "NCCL on CUDA devices",
                     fn);
#endif
    return fa_call_end(&c, st);
}

fa_status fa_cp_fwd(fa_context *ctx, void *nccl_comm, const fa_cp_args *a) {
    return run("fa_cp_fwd", ctx, nccl_comm, a, 0, 0, NULL);
}

fa_status fa_cp_bwd(fa_context *ctx, void *nccl_comm, const fa_cp_args *a) {
    return run("fa_cp_bwd", ctx, nccl_comm, a, 1, 0, NULL);
}

fa_status fa_cp_fwd_workspace_size(fa_context *ctx, void *nccl_comm, const fa_cp_args *a,
                                   size_t *bytes) {
    return run("fa_cp_fwd_workspace_size", ctx, nccl_comm, a, 0, 1, bytes);
}

fa_status fa_cp_bwd_workspace_size(fa_context *ctx, void *nccl_comm, const fa_cp_args *a,
                                   size_t *bytes) {
    return run("fa_cp_bwd_workspace_size", ctx, nccl_comm, a, 1, 1, bytes);
}
