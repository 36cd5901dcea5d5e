/*
 * cuda/pad_kv.h — fa_fwd_kvcache with a head dim that is not a multiple of 8 (plain C contract
 * between backend.c, pad_kv_host.c and pad_kv.cu). The decode and append kernels read and
 * write rows in 16-byte pieces, and the cache is the caller's, read in place; so, as pad.h
 * does for fa_fwd, the call runs on zero-padded copies of dp = d rounded up to 8 columns:
 *
 *   in:  q, k_new, v_new (whole) and, of the cache, the rows [0, L_b) the call reads of each
 *        sequence b (L_b = cache_seqlens[b] + seqlen_new, clamped into the capacity as the
 *        decode clamps it), into a contiguous padded cache [batch, capacity, heads_kv, dp];
 *        a paged cache is gathered through block_table into that same contiguous layout (so
 *        the workspace is bounded by what the call can address, never the whole page pool);
 *   run: the usual append (with the fused rotary embedding: rotary_dim <= d, so the zero
 *        columns stay zero) and decode on the copies;
 *   out: the appended rows (the first d columns) back into the caller's cache at their
 *        positions, through block_table when paged, and out's first d columns.
 *
 * Cost (FlashAttention-2 pads and copies the whole cache both ways for such head dims and
 * calls it slow but correct; this copies less but is no faster in kind): the workspace holds
 * a padded cache of batch x capacity x heads_kv x dp elements for K and for V (capacity =
 * max_len, or max_pages x page_size), about the size of the cache itself; each call reads
 * and writes every row it attends to once more before the decode reads them (about 3x the
 * decode's memory traffic), plus the small q / k_new / v_new / out copies. Head dims that
 * are multiples of 8 never come here.
 */
#ifndef FA_CUDA_PAD_KV_H
#define FA_CUDA_PAD_KV_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cache copies: the caller's cache (contiguous, or a pool through block_table) and the
   contiguous padded buffers, row (b, t, hk) at buf[((b * capacity + t) * heads_kv + hk) * dp].
   16-bit elements, copied as bits. */
typedef struct fa_cuda_pad_cache {
    void *k, *v;
    int64_t k_sb, k_st, k_sh, v_sb, v_st, v_sh;
    const int32_t *seqlens, *block_table;
    int64_t bt_stride;
    int page_size, num_pages, capacity, seqlen_new;
    int batch, heads_kv, d, dp;
    void *kbuf, *vbuf;
    /* the error word: the gather reports bad lengths and pages of a paged cache (the decode
       on the contiguous copy cannot see block_table), FA_DEVICE_CHECKS_ASYNC */
    fa_bad_index *bad;
} fa_cuda_pad_cache;

/* Queues the gather of rows [0, L_b) of every sequence into the buffers (columns d..dp-1
   zero); a bad page is clamped into the pool as the decode clamps it, and reported. */
fa_status fa_cuda_pad_cache_in(const fa_cuda_pad_cache *c, void *stream, char *msg, size_t len);

/* Queues the copy of the appended rows (positions seqlens[b] .. + seqlen_new - 1) from the
   buffers into the caller's cache, first d columns only; a sequence whose length is bad, or a
   row whose page is bad, is skipped (the append skipped it too). */
fa_status fa_cuda_pad_cache_out(const fa_cuda_pad_cache *c, void *stream, char *msg,
                                size_t len);

/* ---- the host side (pad_kv_host.c) ---- */

/* Bytes of workspace the padded copies take (q, out, k_new, v_new, the K and V cache
   copies, each 256-aligned); 0 when p's head dim is a multiple of 8. */
size_t fa_cuda_pad_kv_bytes(const fa_problem *p);

/* *kp = p with d = dp, every operand moved into its buffer at buf (fa_cuda_pad_kv_bytes
   bytes) and a contiguous cache (block_table NULL); queues the copies in. */
fa_status fa_cuda_pad_kv_in(const fa_problem *p, void *buf, fa_bad_index *bad, fa_problem *kp,
                            void *stream, char *msg, size_t len);

/* Queues the copies back: the appended rows into the caller's cache, and out. */
fa_status fa_cuda_pad_kv_out(const fa_problem *p, const fa_problem *kp, fa_bad_index *bad,
                             void *stream, char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
