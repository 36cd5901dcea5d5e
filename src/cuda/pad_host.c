/*
 * cuda/pad_host.c — the padded path's bookkeeping (pad.h): where each operand's buffer lies in
 * the workspace, the problem the kernels see, and which copies run before and after them.
 */
#include "pad.h"

/* Operands in fa_problem order: q, k, v, o, dout, dq, dk, dv. The forward has the first 4.
   k-like ones (k, v, dk, dv) have heads_kv and the keys' tokens; outputs are o (forward) and
   dq, dk, dv (backward: o is then an input). */
#define N_OPS 8
static const int k_klike[N_OPS] = {0, 1, 1, 0, 0, 0, 1, 1};

static int n_ops(int bwd) { return bwd ? 8 : 4; }
static int is_output(int i, int bwd) { return bwd ? i >= 5 : i == 3; }

static fa_operand *op_of(fa_problem *p, int i) {
    fa_operand *ops[N_OPS] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    return ops[i];
}

static int64_t round8(int64_t d) { return (d + 7) & ~(int64_t)7; }
static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Rows (b, t, h) of operand i: varlen tensors are one batch of all the tokens (sb is 0). */
static void rows_of(const fa_problem *p, int i, int64_t *nb, int64_t *nt, int64_t *nh) {
    const int k = k_klike[i];
    *nb = p->cu_q ? 1 : p->batch;
    *nt = p->cu_q ? (k ? p->total_k : p->total_q) : (k ? p->seqlen_k : p->seqlen_q);
    *nh = k ? p->heads_kv : p->heads_q;
}

/* One buffer's bytes, 256-aligned so the kernels' 16-byte loads see aligned rows. */
static size_t buf_bytes(const fa_problem *p, int i) {
    int64_t nb, nt, nh;
    rows_of(p, i, &nb, &nt, &nh);
    return round256((size_t)(nb * nt * nh * round8(p->d)) * 2);
}

size_t fa_cuda_pad_bytes(const fa_problem *p, int bwd) {
    if (!fa_cuda_padded(p)) return 0;
    size_t n = 0;
    for (int i = 0; i < n_ops(bwd); i++) n += buf_bytes(p, i);
    return n;
}

/* The copy description of operand i: p's tensor and pp's buffer. */
static fa_cuda_pad_rows rows(const fa_problem *p, const fa_problem *pp, int i) {
    int64_t nb, nt, nh;
    rows_of(p, i, &nb, &nt, &nh);
    return fa_cuda_pad_rows_of(op_of((fa_problem *)p, i), op_of((fa_problem *)pp, i), nb, nt,
                               nh, (int)p->d, (int)pp->d);
}

fa_status fa_cuda_pad_in(const fa_problem *p, int bwd, void *buf, fa_problem *pp, void *stream,
                         char *msg, size_t len) {
    *pp = *p;
    pp->d = round8(p->d);
    char *at = (char *)buf;
    for (int i = 0; i < n_ops(bwd); i++) {
        int64_t nb, nt, nh;
        rows_of(p, i, &nb, &nt, &nh);
        fa_operand *o = op_of(pp, i);
        o->data = at;
        o->sh = pp->d;
        o->st = nh * pp->d;
        o->sb = p->cu_q ? 0 : nt * nh * pp->d;
        at += buf_bytes(p, i);
    }
    for (int i = 0; i < n_ops(bwd); i++) {
        if (is_output(i, bwd)) continue;
        const fa_cuda_pad_rows r = rows(p, pp, i);
        const fa_status st = fa_cuda_pad_copy(&r, 1, stream, msg, len);
        if (st != FA_OK) return st;
    }
    return FA_OK;
}

fa_status fa_cuda_pad_out(const fa_problem *p, const fa_problem *pp, int bwd, void *stream,
                          char *msg, size_t len) {
    for (int i = 0; i < n_ops(bwd); i++) {
        if (!is_output(i, bwd)) continue;
        fa_cuda_pad_rows r = rows(p, pp, i);
        if (p->cu_q) r.tokens = (k_klike[i] ? p->cu_k : p->cu_q) + p->batch;
        const fa_status st = fa_cuda_pad_copy(&r, 0, stream, msg, len);
        if (st != FA_OK) return st;
    }
    return FA_OK;
}
