/*
 * cuda/pad.h — head dims that are not multiples of 8 on the GPU (plain C contract between
 * backend.c and pad.cu). The attention kernels load and store rows in 16-byte pieces, so they
 * take multiples of 8 only; for any other d the backend copies each operand into a contiguous
 * buffer of the workspace with dp = d rounded up to 8 columns, the extra columns zero (so they
 * add exactly 0 to every dot product and the kernels' speed for multiples of 8 is untouched),
 * runs the kernels on those buffers and copies the first d columns of the outputs back.
 */
#ifndef FA_CUDA_PAD_H
#define FA_CUDA_PAD_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One operand's rows (b, t, h) of nb x nt x nh: the caller's strided tensor of d columns and
   the buffer of dp columns, row (b, t, h) at buf[((b * nt + t) * nh + h) * dp]. Elements are
   16-bit (f16 or bf16: copied as bits, and zero bits are +0 in both). */
typedef struct fa_cuda_pad_rows {
    void *user;
    int64_t sb, st, sh;
    void *buf;
    int64_t nb, nt, nh;
    int d, dp;
    /* Varlen outputs: device pointer to the tokens the sequences cover (cu_seqlens[batch] of
       the arrays the kernels read); rows at or past it are not copied back, so that arrays
       the sanitiser emptied (FA_DEVICE_CHECKS_ASYNC) leave the outputs untouched, as the
       kernels do. NULL: every row. */
    const int32_t *tokens;
} fa_cuda_pad_rows;

/* The copy of a caller's operand u (d columns) and its buffer b (dp columns), nb x nt x nh
   rows, every row (tokens NULL). */
static inline fa_cuda_pad_rows fa_cuda_pad_rows_of(const fa_operand *u, const fa_operand *b,
                                                   int64_t nb, int64_t nt, int64_t nh, int d,
                                                   int dp) {
    fa_cuda_pad_rows r;
    r.user = u->data, r.sb = u->sb, r.st = u->st, r.sh = u->sh;
    r.buf = b->data;
    r.nb = nb, r.nt = nt, r.nh = nh;
    r.d = d, r.dp = dp;
    r.tokens = NULL;
    return r;
}

/* Queues the copy on stream: to_buf 1 fills the whole buffer (columns d..dp-1 zero), 0 writes
   the buffer's first d columns into the caller's tensor. FA_ERR_CUDA with msg on a launch
   error. */
fa_status fa_cuda_pad_copy(const fa_cuda_pad_rows *r, int to_buf, void *stream, char *msg,
                           size_t len);

/* ---- the host side (pad_host.c) ---- */

/* Whether p's head dim takes the padded path. */
static inline int fa_cuda_padded(const fa_problem *p) { return p->d % 8 != 0; }

/* Bytes of workspace the buffers take: q, k, v, out for the forward (bwd 0), and dout, dq, dk,
   dv with them for the backward (bwd 1); 0 when p is not padded. */
size_t fa_cuda_pad_bytes(const fa_problem *p, int bwd);

/* *pp = p with d = dp and every operand moved into its buffer at buf (fa_cuda_pad_bytes
   bytes); queues the copies of the inputs (q, k, v; o and dout for the backward). p's
   cu_seqlens and maxima are the launch's (after the varlen check). */
fa_status fa_cuda_pad_in(const fa_problem *p, int bwd, void *buf, fa_problem *pp, void *stream,
                         char *msg, size_t len);

/* Queues the copies of the outputs back into p's tensors: out (bwd 0) or dq, dk, dv; varlen:
   only the rows p's cu_seqlens cover (fa_cuda_pad_rows.tokens). */
fa_status fa_cuda_pad_out(const fa_problem *p, const fa_problem *pp, int bwd, void *stream,
                          char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
