/*
 * cuda/cp_ring.c — the context-parallel ring on one rank (flashattn.h, docs/cp.md): the same
 * algorithm as python/flashattn/distributed/_attn.py, in C over the CUDA runtime and NCCL.
 *
 * Streams: the per-shard attention and the merges run on the context's stream ("main"); the
 * transfers on a stream of the call's own ("comm"), each hop one ncclGroupStart/End holding the
 * send to the next rank and the receive from the previous. Events order them: a hop waits for
 * what main queued before it (the buffer it sends was written, the one it fills was last read),
 * and main waits for a hop only just before it reads what the hop received, so the transfer of
 * shard t+1 overlaps the attention of shard t.
 *
 * Workspace (one block, 256-byte aligned regions): the per-shard calls' own workspace first (at
 * offset 0, so the context's knowledge of zero bytes there stays valid for them: internal.h,
 * ws_zero_off), then two K/V shard buffers (K then V, each [B, n_s, Hk, D] contiguous), then
 * forward: the fp32 accumulators out [B, n, H, D], lse [B, H, n] and one call's partial out and
 * lse; backward: the fp32 dQ sum, one call's dQ, dK and dV, and two pairs each of the shard's
 * dK/dV partial sum and of the sums travelling the ring (fp32, laid out as the K/V buffers).
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../cp.h"
#include "../cp_schedule.h"
#include "cp_kernels.h"
#include "cp_nccl.h"
#include "kernels.h"

#define TRY(x)                                                                                \
    do {                                                                                      \
        fa_status st_ = (x);                                                                  \
        if (st_ != FA_OK) return st_;                                                         \
    } while (0)

static size_t r256(size_t n) { return (n + 255) & ~(size_t)255; }

fa_status fa_cp_comm_info(fa_context *ctx, const char *fn, void *comm, int *world, int *rank) {
    const char *why = NULL;
    const fa_nccl *n = fa_nccl_get(&why);
    if (!n) return fa_fail(ctx, FA_ERR_NO_BACKEND, "%s: %s", fn, why);
    int r = n->comm_count(comm, world);
    if (r != FA_NCCL_SUCCESS) return fa_nccl_fail(ctx, n, fn, "ncclCommCount", r);
    r = n->comm_user_rank(comm, rank);
    if (r != FA_NCCL_SUCCESS) return fa_nccl_fail(ctx, n, fn, "ncclCommUserRank", r);
    if (*world < 1 || *rank < 0 || *rank >= *world)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: the communicator says rank %d of %d",
                       fn, *rank, *world);
    return FA_OK;
}

/* The sizes of one call: shard lengths, and the workspace regions' offsets. */
typedef struct plan {
    int64_t B, n, H, Hk, D, maxn;
    size_t E;
    size_t inner, kv[2];
    size_t acc_o, acc_lse, part_o, part_lse;           /* forward */
    size_t dq_acc, tmp_dq, tmp_dkv, part[2], sums[2];  /* backward */
    size_t total;
} plan;

static int64_t shard_len(const fa_cp_problem *cp, int r) {
    return fa_cp_shard_len(cp->seqlen, cp->world, r, cp->layout);
}

/* Elements of K (or of V) of shard r. */
static int64_t kv_elems(const plan *pl, int64_t len) { return pl->B * len * pl->Hk * pl->D; }

/* An operand as kernels take it: strides of size-1 dimensions 0 (validate.h, fa_stride_of). */
static fa_operand operand(void *data, int64_t B, int64_t T, int64_t H, int64_t sb, int64_t st,
                          int64_t sh) {
    fa_operand o = {data, B == 1 ? 0 : sb, T == 1 ? 0 : st, H == 1 ? 0 : sh};
    return o;
}

static void *at(void *base, size_t off) { return base ? (char *)base + off : NULL; }
static void *elem(void *p, int64_t i, size_t E) { return p ? (char *)p + (size_t)i * E : NULL; }

/* The call for block bl against source shard s whose K/V buffer is kv (NULL while planning:
   the backend then checks shapes and the user's tensors only). */
static fa_problem block_problem(const fa_cp_problem *cp, const plan *pl, const fa_cp_block *bl,
                                int64_t ns, void *kv, void *ws) {
    fa_problem p = cp->pr;
    const size_t E = pl->E;
    const int64_t sq = bl->q1 - bl->q0, sk = bl->k1 - bl->k0, kstep = pl->Hk * pl->D;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.causal = bl->causal;
    p.win_left = -1;
    p.win_right = bl->causal ? 0 : -1;
    p.q.data = elem(cp->pr.q.data, bl->q0 * cp->pr.q.st, E);
    void *k = elem(kv, bl->k0 * kstep, E), *v = elem(kv, kv_elems(pl, ns) + bl->k0 * kstep, E);
    p.k = operand(k, pl->B, sk, pl->Hk, ns * kstep, kstep, pl->D);
    p.v = operand(v, pl->B, sk, pl->Hk, ns * kstep, kstep, pl->D);
    const int64_t qstep = pl->H * pl->D;
    if (!cp->bwd) {
        /* out and lse of the block go to the partial buffers, rows q0.. */
        void *o = elem(at(ws, pl->part_o), bl->q0 * qstep, E);
        p.o = operand(ws ? o : NULL, pl->B, sq, pl->H, pl->n * qstep, qstep, pl->D);
        p.lse = ws ? (float *)at(ws, pl->part_lse) + bl->q0 : NULL;
        p.lse_sb = pl->B == 1 ? 0 : pl->H * pl->n;
        p.lse_sh = pl->H == 1 ? 0 : pl->n;
        p.lse_st = sq == 1 ? 0 : 1;
        return p;
    }
    /* backward: the forward's out and lse, dout (rows q0..) are the user's; the gradients go
       to the call's buffers */
    p.o.data = elem(cp->pr.o.data, bl->q0 * cp->pr.o.st, E);
    p.dout.data = elem(cp->pr.dout.data, bl->q0 * cp->pr.dout.st, E);
    p.lse = (float *)cp->pr.lse + bl->q0 * cp->pr.lse_st;
    void *dq = elem(at(ws, pl->tmp_dq), bl->q0 * qstep, E);
    p.dq = operand(ws ? dq : NULL, pl->B, sq, pl->H, pl->n * qstep, qstep, pl->D);
    void *dk = elem(at(ws, pl->tmp_dkv), bl->k0 * kstep, E);
    void *dv = elem(at(ws, pl->tmp_dkv), kv_elems(pl, ns) + bl->k0 * kstep, E);
    p.dk = operand(ws ? dk : NULL, pl->B, sk, pl->Hk, ns * kstep, kstep, pl->D);
    p.dv = operand(ws ? dv : NULL, pl->B, sk, pl->Hk, ns * kstep, kstep, pl->D);
    return p;
}

/* The calls' workspace need (the largest) and, first, the backend's checks of the shard
   problem itself (alignment, device memory of every user tensor). */
static fa_status make_plan(fa_context *ctx, const fa_cp_problem *cp, plan *pl) {
    memset(pl, 0, sizeof *pl);
    const fa_problem *pr = &cp->pr;
    pl->B = pr->batch;
    pl->n = pr->seqlen_q;
    pl->H = pr->heads_q;
    pl->Hk = pr->heads_kv;
    pl->D = pr->d;
    pl->E = fa_dtype_size(pr->dtype);
    for (int r = 0; r < cp->world; r++)
        if (shard_len(cp, r) > pl->maxn) pl->maxn = shard_len(cp, r);
    size_t need = 0;
    TRY((cp->bwd ? ctx->ops->bwd_workspace : ctx->ops->fwd_workspace)(ctx, pr, &need));
    size_t inner = 0;
    for (int t = 0; t < cp->world; t++) {
        const int s = ((cp->rank - t) % cp->world + cp->world) % cp->world;
        fa_cp_block bl[FA_CP_MAX_BLOCKS];
        const int nb = fa_cp_blocks(cp->seqlen, cp->world, cp->rank, s, pr->causal, cp->layout,
                                    bl);
        for (int i = 0; i < nb; i++) {
            fa_problem p = block_problem(cp, pl, &bl[i], shard_len(cp, s), NULL, NULL);
            TRY((cp->bwd ? ctx->ops->bwd_workspace : ctx->ops->fwd_workspace)(ctx, &p, &need));
            if (need > inner) inner = need;
        }
    }
    /* the Hopper forward's tile counter may be wanted by a call whose pointers decide it */
    if (!cp->bwd && inner < 256 + FA_SM90_FWD_WORKSPACE) inner = 256 + FA_SM90_FWD_WORKSPACE;
    size_t off = r256(inner);
    pl->inner = inner;
    const size_t kvb = r256(2 * (size_t)kv_elems(pl, pl->maxn) * pl->E);
    const size_t qf = r256((size_t)(pl->B * pl->n * pl->H * pl->D) * 4);
    const size_t qe = r256((size_t)(pl->B * pl->n * pl->H * pl->D) * pl->E);
    const size_t lf = r256((size_t)(pl->B * pl->H * pl->n) * 4);
    const size_t kvf = r256(2 * (size_t)kv_elems(pl, pl->maxn) * 4);
    for (int i = 0; i < 2; i++) pl->kv[i] = off, off += kvb;
    if (!cp->bwd) {
        pl->acc_o = off, off += qf;
        pl->acc_lse = off, off += lf;
        pl->part_o = off, off += qe;
        pl->part_lse = off, off += lf;
    } else {
        pl->dq_acc = off, off += qf;
        pl->tmp_dq = off, off += qe;
        pl->tmp_dkv = off, off += kvb;
        for (int i = 0; i < 2; i++) pl->part[i] = off, off += kvf;
        for (int i = 0; i < 2; i++) pl->sums[i] = off, off += kvf;
    }
    pl->total = off;
    return FA_OK;
}

/* The device of the communicator must be the call's: NCCL queues on streams of its device. */
static fa_status check_comm_device(fa_context *ctx, const char *fn, const fa_cp_problem *cp) {
    const fa_nccl *n = fa_nccl_get(NULL);
    int dev = -1;
    const int r = n->comm_cu_device(cp->comm, &dev);
    if (r != FA_NCCL_SUCCESS) return fa_nccl_fail(ctx, n, fn, "ncclCommCuDevice", r);
    if (dev != ctx->call_device)
        return fa_fail(ctx, FA_ERR_DEVICE,
                       "%s: the NCCL communicator is on GPU %d but the call runs on GPU %d "
                       "(fa_context_set_device)",
                       fn, dev, ctx->call_device);
    return FA_OK;
}

fa_status fa_cp_cuda_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    const fa_cp_problem *cp = (const fa_cp_problem *)p;
    const char *fn = cp->bwd ? "fa_cp_bwd" : "fa_cp_fwd";
    TRY(check_comm_device(ctx, fn, cp));
    if (ctx->ops->capturing && ctx->ops->capturing(ctx))
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: the context's stream is being captured into a CUDA graph; the ring "
                       "creates a stream and events per call, which capture forbids",
                       fn);
    plan pl;
    TRY(make_plan(ctx, cp, &pl));
    *bytes = pl.total;
    return FA_OK;
}

/* ---- the ring ---- */

typedef struct ring {
    fa_context *ctx;
    const char *fn;
    const fa_nccl *nccl;
    cudaStream_t main, comm_stream;
    cudaEvent_t ready, kv_done, dkv_done;
    void *comm;
    int next, prev;
} ring;

static fa_status cuda_fail(ring *g, const char *what, cudaError_t e) {
    cudaGetLastError();
    return fa_fail(g->ctx, FA_ERR_CUDA, "%s: %s: %s", g->fn, what, cudaGetErrorString(e));
}

/* Queues on comm, after what main has queued so far: send `send` (bytes) to the next rank and
   receive `recv` (bytes) from the previous one, then records done. Both sides of a hop know
   both counts (the receiver's incoming shard is the sender's outgoing one), so an empty shard
   is skipped by both. */
static fa_status shift(ring *g, const void *send, size_t sbytes, void *recv, size_t rbytes,
                       cudaEvent_t done) {
    cudaError_t e = cudaEventRecord(g->ready, g->main);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->comm_stream, g->ready, 0);
    if (e != cudaSuccess) return cuda_fail(g, "ordering the transfer after the compute", e);
    const fa_nccl *n = g->nccl;
    int r = n->group_start();
    if (r != FA_NCCL_SUCCESS) return fa_nccl_fail(g->ctx, n, g->fn, "ncclGroupStart", r);
    if (sbytes) r = n->send(send, sbytes, FA_NCCL_UINT8, g->next, g->comm, g->comm_stream);
    const int r2 = r == FA_NCCL_SUCCESS && rbytes
                       ? n->recv(recv, rbytes, FA_NCCL_UINT8, g->prev, g->comm, g->comm_stream)
                       : FA_NCCL_SUCCESS;
    const int r3 = n->group_end();
    if (r != FA_NCCL_SUCCESS) return fa_nccl_fail(g->ctx, n, g->fn, "ncclSend", r);
    if (r2 != FA_NCCL_SUCCESS) return fa_nccl_fail(g->ctx, n, g->fn, "ncclRecv", r2);
    if (r3 != FA_NCCL_SUCCESS) return fa_nccl_fail(g->ctx, n, g->fn, "ncclGroupEnd", r3);
    e = cudaEventRecord(done, g->comm_stream);
    return e == cudaSuccess ? FA_OK : cuda_fail(g, "recording the transfer's end", e);
}

static fa_status wait_for(ring *g, cudaEvent_t done) {
    const cudaError_t e = cudaStreamWaitEvent(g->main, done, 0);
    return e == cudaSuccess ? FA_OK : cuda_fail(g, "waiting for a transfer", e);
}

/* A kernel launcher's status as the call's message. */
static fa_status kernel(ring *g, fa_status st, const char *msg) {
    return st == FA_OK ? FA_OK : fa_fail(g->ctx, st, "%s: %s", g->fn, msg);
}

/* K and V of a shard as one contiguous [B, n, Hk, D] pair (from the user's strided views). */
static fa_status pack(ring *g, const fa_cp_problem *cp, const plan *pl, void *buf) {
    char msg[256];
    const int64_t kstep = pl->Hk * pl->D;
    const fa_operand *src[2] = {&cp->pr.k, &cp->pr.v};
    for (int i = 0; i < 2; i++) {
        fa_cp_view d = {elem(buf, i * kv_elems(pl, pl->n), pl->E), cp->pr.dtype, pl->n * kstep,
                        kstep, pl->D};
        fa_cp_view s = {src[i]->data, cp->pr.dtype, src[i]->sb, src[i]->st, src[i]->sh};
        TRY(kernel(g, fa_cp_copy(&d, &s, pl->B, pl->n, pl->Hk, pl->D, 0, g->main, msg,
                                 sizeof msg),
                   msg));
    }
    return FA_OK;
}

/* The backend's call for one block, on the workspace's first region. Its need is asked again
   with the real pointers (the backend checks them) and must fit what the plan set aside. */
static fa_status attend(ring *g, const fa_problem *p, void *ws, const plan *pl, int bwd) {
    fa_context *ctx = g->ctx;
    size_t need = 0;
    TRY((bwd ? ctx->ops->bwd_workspace : ctx->ops->fwd_workspace)(ctx, p, &need));
    if (need > pl->inner)
        return fa_fail(ctx, FA_ERR_INTERNAL, "%s: a shard's call needs %zu bytes of workspace, "
                       "the plan set aside %zu", g->fn, need, pl->inner);
    return (bwd ? ctx->ops->bwd : ctx->ops->fwd)(ctx, p, need ? ws : NULL, need ? pl->inner : 0);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

static fa_status forward(ring *g, const fa_cp_problem *cp, const plan *pl, void *ws) {
    const int n = cp->world, r = cp->rank;
    char msg[256];
    void *kv[2] = {at(ws, pl->kv[0]), at(ws, pl->kv[1])};
    float *acc_o = at(ws, pl->acc_o), *acc_lse = at(ws, pl->acc_lse);
    TRY(pack(g, cp, pl, kv[0]));
    for (int t = 0; t < n; t++) {
        const int s = mod(r - t, n), nxt = mod(r - t - 1, n);
        void *cur = kv[t % 2], *spare = kv[(t + 1) % 2];
        const int64_t ns = shard_len(cp, s);
        /* posted before this step's attention, waited on only before the next step reads it */
        if (t + 1 < n)
            TRY(shift(g, cur, 2 * (size_t)kv_elems(pl, ns) * pl->E, spare,
                      2 * (size_t)kv_elems(pl, shard_len(cp, nxt)) * pl->E, g->kv_done));
        fa_cp_block bl[FA_CP_MAX_BLOCKS];
        const int nb = fa_cp_blocks(cp->seqlen, n, r, s, cp->pr.causal, cp->layout, bl);
        for (int i = 0; i < nb; i++) {
            const fa_problem p = block_problem(cp, pl, &bl[i], ns, cur, ws);
            TRY(attend(g, &p, ws, pl, 0));
            /* step 0 is the own shard: one call over every row, which sets the accumulators */
            TRY(kernel(g, fa_cp_merge(acc_o, acc_lse, at(ws, pl->part_o), cp->pr.dtype,
                                      at(ws, pl->part_lse), pl->B, pl->n, pl->H, pl->D,
                                      bl[i].q0, bl[i].q1, t == 0, g->main, msg, sizeof msg),
                       msg));
        }
        if (t + 1 < n) TRY(wait_for(g, g->kv_done));
    }
    /* the fp32 accumulators into the user's out and lse (any strides) */
    const int64_t qstep = pl->H * pl->D;
    fa_cp_view so = {acc_o, FA_DTYPE_F32, pl->n * qstep, qstep, pl->D};
    fa_cp_view d_o = {cp->pr.o.data, cp->pr.dtype, cp->pr.o.sb, cp->pr.o.st, cp->pr.o.sh};
    TRY(kernel(g, fa_cp_copy(&d_o, &so, pl->B, pl->n, pl->H, pl->D, 0, g->main, msg,
                             sizeof msg), msg));
    /* lse [B, H, n] as a 4-d view [B, H, n, 1] */
    fa_cp_view sl = {acc_lse, FA_DTYPE_F32, pl->H * pl->n, pl->n, 1};
    fa_cp_view dl = {cp->pr.lse, FA_DTYPE_F32, cp->pr.lse_sb, cp->pr.lse_sh, cp->pr.lse_st};
    return kernel(g, fa_cp_copy(&dl, &sl, pl->B, pl->H, pl->n, 1, 0, g->main, msg, sizeof msg),
                  msg);
}

/* dst (f32 [B, len, Hk, D] pair at rows k0..k1 of a shard of ns tokens) := or += the call's
   dK and dV of those rows. */
static fa_status add_dkv(ring *g, const fa_cp_problem *cp, const plan *pl, float *dst,
                         const fa_cp_block *bl, int64_t ns, void *ws, int add) {
    char msg[256];
    const int64_t kstep = pl->Hk * pl->D, rows = bl->k1 - bl->k0;
    for (int i = 0; i < 2; i++) {
        const int64_t off = i * kv_elems(pl, ns) + bl->k0 * kstep;
        fa_cp_view d = {dst + off, FA_DTYPE_F32, ns * kstep, kstep, pl->D};
        fa_cp_view s = {elem(at(ws, pl->tmp_dkv), off, pl->E), cp->pr.dtype, ns * kstep, kstep,
                        pl->D};
        TRY(kernel(g, fa_cp_copy(&d, &s, pl->B, rows, pl->Hk, pl->D, add, g->main, msg,
                                 sizeof msg), msg));
    }
    return FA_OK;
}

static fa_status backward(ring *g, const fa_cp_problem *cp, const plan *pl, void *ws) {
    const int n = cp->world, r = cp->rank;
    char msg[256];
    void *kv[2] = {at(ws, pl->kv[0]), at(ws, pl->kv[1])};
    float *dq_acc = at(ws, pl->dq_acc);
    float *part[2] = {at(ws, pl->part[0]), at(ws, pl->part[1])};
    float *sums[2] = {at(ws, pl->sums[0]), at(ws, pl->sums[1])};
    const int64_t qstep = pl->H * pl->D;
    float *acc = NULL;
    TRY(pack(g, cp, pl, kv[0]));
    for (int t = 0; t < n; t++) {
        const int s = mod(r - t, n), nxt = mod(r - t - 1, n);
        void *cur = kv[t % 2], *spare = kv[(t + 1) % 2];
        const int64_t ns = shard_len(cp, s), nn = shard_len(cp, nxt);
        if (t + 1 < n)
            TRY(shift(g, cur, 2 * (size_t)kv_elems(pl, ns) * pl->E, spare,
                      2 * (size_t)kv_elems(pl, nn) * pl->E, g->kv_done));
        fa_cp_block bl[FA_CP_MAX_BLOCKS];
        const int nb = fa_cp_blocks(cp->seqlen, n, r, s, cp->pr.causal, cp->layout, bl);
        /* one call over the whole square writes every element: no zero pass before it */
        const int whole = nb == 1 && bl[0].q0 == 0 && bl[0].q1 == pl->n && bl[0].k0 == 0 &&
                          bl[0].k1 == ns;
        float *pt = part[t % 2];
        if (!whole && ns && nb) {
            const cudaError_t e = cudaMemsetAsync(pt, 0, 2 * (size_t)kv_elems(pl, ns) * 4,
                                                  g->main);
            if (e != cudaSuccess) return cuda_fail(g, "clearing the dK/dV sum", e);
        }
        for (int i = 0; i < nb; i++) {
            const fa_problem p = block_problem(cp, pl, &bl[i], ns, cur, ws);
            TRY(attend(g, &p, ws, pl, 1));
            /* dQ: step 0 (the own shard, one call over every row) sets the fp32 sum */
            fa_cp_view d = {dq_acc + bl[i].q0 * qstep, FA_DTYPE_F32, pl->n * qstep, qstep, pl->D};
            fa_cp_view sq = {elem(at(ws, pl->tmp_dq), bl[i].q0 * qstep, pl->E), cp->pr.dtype,
                             pl->n * qstep, qstep, pl->D};
            TRY(kernel(g, fa_cp_copy(&d, &sq, pl->B, bl[i].q1 - bl[i].q0, pl->H, pl->D, t > 0,
                                     g->main, msg, sizeof msg), msg));
            TRY(add_dkv(g, cp, pl, pt, &bl[i], ns, ws, !whole));
        }
        if (t == 0) {
            acc = pt;
        } else { /* shard s's sum so far arrived from the previous rank during the compute */
            TRY(wait_for(g, g->dkv_done));
            acc = sums[(t - 1) % 2];
            if (nb) {
                fa_cp_view d = {acc, FA_DTYPE_F32, 0, 0, 0}, sp = {pt, FA_DTYPE_F32, 0, 0, 0};
                TRY(kernel(g, fa_cp_copy(&d, &sp, 1, 1, 1, 2 * kv_elems(pl, ns), 1, g->main,
                                         msg, sizeof msg), msg));
            }
        }
        /* on to the next rank; at the last step the next rank is the shard's owner */
        if (n > 1)
            TRY(shift(g, acc, 2 * (size_t)kv_elems(pl, ns) * 4, sums[t % 2],
                      2 * (size_t)kv_elems(pl, nn) * 4, g->dkv_done));
        if (t + 1 < n) TRY(wait_for(g, g->kv_done));
    }
    if (n > 1) {
        TRY(wait_for(g, g->dkv_done));
        acc = sums[(n - 1) % 2];
    }
    /* an empty own shard has no rows: nothing to write (and step 0 set nothing) */
    if (pl->n == 0) return FA_OK;
    fa_cp_view sq = {dq_acc, FA_DTYPE_F32, pl->n * qstep, qstep, pl->D};
    fa_cp_view dq = {cp->pr.dq.data, cp->pr.dtype, cp->pr.dq.sb, cp->pr.dq.st, cp->pr.dq.sh};
    TRY(kernel(g, fa_cp_copy(&dq, &sq, pl->B, pl->n, pl->H, pl->D, 0, g->main, msg, sizeof msg),
               msg));
    const int64_t kstep = pl->Hk * pl->D;
    const fa_operand *dst[2] = {&cp->pr.dk, &cp->pr.dv};
    for (int i = 0; i < 2; i++) {
        fa_cp_view s = {acc + i * kv_elems(pl, pl->n), FA_DTYPE_F32, pl->n * kstep, kstep, pl->D};
        fa_cp_view d = {dst[i]->data, cp->pr.dtype, dst[i]->sb, dst[i]->st, dst[i]->sh};
        TRY(kernel(g, fa_cp_copy(&d, &s, pl->B, pl->n, pl->Hk, pl->D, 0, g->main, msg,
                                 sizeof msg), msg));
    }
    return FA_OK;
}

fa_status fa_cp_cuda_run(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes) {
    const fa_cp_problem *cp = (const fa_cp_problem *)p;
    const char *fn = cp->bwd ? "fa_cp_bwd" : "fa_cp_fwd";
    plan pl;
    TRY(make_plan(ctx, cp, &pl));
    if (ws_bytes < pl.total)
        return fa_fail(ctx, FA_ERR_INTERNAL, "%s: workspace of %zu bytes, the ring needs %zu", fn,
                       ws_bytes, pl.total);
    ring g;
    memset(&g, 0, sizeof g);
    g.ctx = ctx;
    g.fn = fn;
    g.nccl = fa_nccl_get(NULL);
    g.main = (cudaStream_t)ctx->stream;
    g.comm = cp->comm;
    g.next = (cp->rank + 1) % cp->world;
    g.prev = (cp->rank + cp->world - 1) % cp->world;
    /* a stream and events of the call's own: created here, released at the end (destroying
       them with work queued is allowed: CUDA frees them once that work is done) */
    cudaError_t e = cudaStreamCreateWithFlags(&g.comm_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g.ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g.kv_done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g.dkv_done, cudaEventDisableTiming);
    fa_status st = e == cudaSuccess ? FA_OK : cuda_fail(&g, "creating the ring's stream", e);
    if (st == FA_OK) st = cp->bwd ? backward(&g, cp, &pl, ws) : forward(&g, cp, &pl, ws);
    /* the workspace is released to main's order: main must wait for the last transfer too
       (a failed step may leave one queued) */
    if (g.comm_stream && g.ready) {
        cudaEventRecord(g.ready, g.comm_stream);
        cudaStreamWaitEvent(g.main, g.ready, 0);
    }
    if (g.dkv_done) cudaEventDestroy(g.dkv_done);
    if (g.kv_done) cudaEventDestroy(g.kv_done);
    if (g.ready) cudaEventDestroy(g.ready);
    if (g.comm_stream) cudaStreamDestroy(g.comm_stream);
    cudaGetLastError();
    if (st != FA_OK) return st;
    /* the record: the ring, and the per-shard kernel the last call chose */
    char inner[sizeof ctx->sel.kernel];
    snprintf(inner, sizeof inner, "%s", ctx->sel.kernel);
    fa_select(ctx, "cuda", cp->bwd ? "cp_bwd" : "cp_fwd", "");
    snprintf(ctx->sel.kernel, sizeof ctx->sel.kernel, "cp_ring%d_%.52s", cp->world, inner);
    ctx->sel.workspace_bytes = pl.total;
    return FA_OK;
}
