/*
 * cuda/pad_kv_host.c — the padded KV-cache call's bookkeeping (pad_kv.h): where each copy lies
 * in the workspace, the problem the append and decode kernels see, and which copies run
 * before and after them.
 */
#include "pad.h"
#include "pad_kv.h"

static int64_t round8(int64_t d) { return (d + 7) & ~(int64_t)7; }
static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Buffers in workspace order: q, out, k_new, v_new, the K cache, the V cache. */
enum { B_Q, B_O, B_KN, B_VN, B_KC, B_VC, N_BUF };

/* Rows (b, t, h) of buffer i. */
static void rows_of(const fa_problem *p, int i, int64_t *nb, int64_t *nt, int64_t *nh) {
    *nb = p->batch;
    *nt = i <= B_O ? p->seqlen_q : i <= B_VN ? p->seqlen_new : p->seqlen_k;
    *nh = i <= B_O ? p->heads_q : p->heads_kv;
}

static size_t buf_bytes(const fa_problem *p, int i) {
    int64_t nb, nt, nh;
    rows_of(p, i, &nb, &nt, &nh);
    if (i == B_KN || i == B_VN) nt = p->k_new.data ? nt : 0;
    return round256((size_t)(nb * nt * nh * round8(p->d)) * 2);
}

size_t fa_cuda_pad_kv_bytes(const fa_problem *p) {
    if (p->d % 8 == 0) return 0;
    size_t n = 0;
    for (int i = 0; i < N_BUF; i++) n += buf_bytes(p, i);
    return n;
}

static fa_operand *op_of(fa_problem *p, int i) {
    fa_operand *ops[N_BUF] = {&p->q, &p->o, &p->k_new, &p->v_new, &p->k, &p->v};
    return ops[i];
}

/* The cache copy description of p (the caller's cache) and kp (the buffers). */
static fa_cuda_pad_cache cache_of(const fa_problem *p, const fa_problem *kp, fa_bad_index *bad) {
    fa_cuda_pad_cache c;
    c.k = p->k.data, c.k_sb = p->k.sb, c.k_st = p->k.st, c.k_sh = p->k.sh;
    c.v = p->v.data, c.v_sb = p->v.sb, c.v_st = p->v.st, c.v_sh = p->v.sh;
    c.seqlens = p->kv_seqlens;
    c.block_table = p->block_table;
    c.bt_stride = p->bt_stride;
    c.page_size = (int)p->page_size;
    c.num_pages = (int)p->num_pages;
    c.capacity = (int)p->seqlen_k;
    c.seqlen_new = (int)p->seqlen_new;
    c.batch = (int)p->batch;
    c.heads_kv = (int)p->heads_kv;
    c.d = (int)p->d;
    c.dp = (int)kp->d;
    c.kbuf = kp->k.data;
    c.vbuf = kp->v.data;
    c.bad = bad;
    return c;
}

/* The q-like copy of buffer i (pad.h's row copy). */
static fa_cuda_pad_rows rows(const fa_problem *p, const fa_problem *kp, int i) {
    int64_t nb, nt, nh;
    rows_of(p, i, &nb, &nt, &nh);
    return fa_cuda_pad_rows_of(op_of((fa_problem *)p, i), op_of((fa_problem *)kp, i), nb, nt,
                               nh, (int)p->d, (int)kp->d);
}

fa_status fa_cuda_pad_kv_in(const fa_problem *p, void *buf, fa_bad_index *bad, fa_problem *kp,
                            void *stream, char *msg, size_t len) {
    *kp = *p;
    kp->d = round8(p->d);
    char *at = (char *)buf;
    for (int i = 0; i < N_BUF; i++) {
        int64_t nb, nt, nh;
        rows_of(p, i, &nb, &nt, &nh);
        fa_operand *o = op_of(kp, i);
        if (o->data) { /* k_new / v_new stay NULL without an append */
            o->data = at;
            o->sh = kp->d;
            o->st = nh * kp->d;
            o->sb = nt * nh * kp->d;
        }
        at += buf_bytes(p, i);
    }
    /* the copy is contiguous [batch, capacity, heads_kv, dp], whatever the caller's layout */
    kp->block_table = NULL;
    kp->bt_stride = 0;
    kp->max_pages = 0;
    kp->page_size = 0;
    kp->num_pages = 0;
    const int ins[] = {B_Q, B_KN, B_VN};
    for (int j = 0; j < 3; j++) {
        if (!op_of((fa_problem *)p, ins[j])->data) continue;
        const fa_cuda_pad_rows r = rows(p, kp, ins[j]);
        const fa_status st = fa_cuda_pad_copy(&r, 1, stream, msg, len);
        if (st != FA_OK) return st;
    }
    const fa_cuda_pad_cache c = cache_of(p, kp, bad);
    return fa_cuda_pad_cache_in(&c, stream, msg, len);
}

fa_status fa_cuda_pad_kv_out(const fa_problem *p, const fa_problem *kp, fa_bad_index *bad,
                             void *stream, char *msg, size_t len) {
    if (p->k_new.data && p->seqlen_new > 0) {
        const fa_cuda_pad_cache c = cache_of(p, kp, bad);
        const fa_status st = fa_cuda_pad_cache_out(&c, stream, msg, len);
        if (st != FA_OK) return st;
    }
    const fa_cuda_pad_rows r = rows(p, kp, B_O);
    return fa_cuda_pad_copy(&r, 0, stream, msg, len);
}
