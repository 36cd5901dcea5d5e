/*
 * validate.h — the dispatcher's argument checks, shared by the entry points of dispatch.c
 * (fa_fwd, fa_bwd) and kvcache.c (fa_fwd_kvcache, fa_merge_attn), so that every public call
 * is checked by the same code, reports in the same words and writes nothing on error.
 */
#ifndef FA_VALIDATE_H
#define FA_VALIDATE_H

#include "internal.h"

#define FA_TRY(x)                                                                             \
    do {                                                                                      \
        fa_status st_ = (x);                                                                  \
        if (st_ != FA_OK) return st_;                                                         \
    } while (0)

/* The arguments of one call, named for messages. The checks below read ctx, fn and p; the
   tensor fields belong to fa_fwd / fa_bwd. */
typedef struct fa_call {
    fa_context *ctx;
    const char *fn;
    const fa_tensor *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const fa_params *p;
    int bwd;
    int query_only; /* workspace query: outputs are stand-ins, nothing runs */
} fa_call;

/* Byte span [lo, hi) covered by a validated tensor; used for overflow and overlap checks. */
typedef struct fa_span {
    uintptr_t lo, hi;
} fa_span;

/* One tensor of a call. `out` is 0 for an input, else the write group it belongs to: tensors
   of one group may overlap each other (packed dq/dk/dv, an interleaved K/V cache), nothing
   written may overlap anything outside its group. LSE tensors have rank nd - 1 and free
   strides. t may be NULL for a raw span (an index array) placed in sp by the caller. */
typedef struct fa_arg {
    const char *name;
    const fa_tensor *t;
    int out, is_lse;
    fa_span sp;
} fa_arg;

static inline const char *fa_device_name(fa_device d) {
    return d == FA_DEVICE_CUDA ? "cuda" : "cpu";
}

static inline int fa_spans_overlap(fa_span a, fa_span b) { return a.lo < b.hi && b.lo < a.hi; }

/* q, k, v, out (bwd: dout, dq, dk, dv) and lse when given, with their roles; the count. */
int fa_attn_args(const fa_call *c, fa_arg a[9]);
/* Each tensor of a[0..n): pointer, rank (nd, LSE nd - 1), sizes, strides (the last one 1,
   but for LSE), and that its byte span fits the address space; fills a[i].sp. */
fa_status fa_check_tensors(fa_call *c, fa_arg *a, int n, int nd);
/* One dtype for every non-LSE tensor (a[0]'s; f64 only under FA_ALGO_NAIVE) and f32 LSE (f64
   for f64 inputs). FP8 inputs: out f32/f16/bf16, forward only, CPU backend's default algorithm
   only (FA_ERR_DTYPE otherwise). */
fa_status fa_check_dtypes(fa_call *c, const fa_arg *a, int n);
/* All on a[0]'s device, and that is the device the context's backend serves. */
fa_status fa_check_devices(fa_call *c, const fa_arg *a, int n);
/* Nothing written overlaps what is read (see fa_arg.out). */
fa_status fa_check_overlaps(fa_call *c, const fa_arg *a, int n);
fa_status fa_check_same_shape(fa_call *c, const char *an, const fa_tensor *a, const char *bn,
                              const fa_tensor *b);
/* Scalar options of c->p (pr->d, the lengths and token counts must be set): scale, softcap,
   window, ALiBi stride against heads_q; resolves them into pr, the windows normalised. */
fa_status fa_check_options(fa_call *c, fa_problem *pr);
/* Stride i of a validated tensor as kernels take it: 0 for a dimension of size 1, whose
   stride addresses nothing and may be anything >= 1 (INT64_MAX included), so that no kernel
   forms index * stride * element size from it (signed overflow: fuzz/ found it). */
static inline int64_t fa_stride_of(const fa_tensor *t, int i) {
    return t->shape[i] == 1 ? 0 : t->stride[i];
}
/* A validated BSHD (varlen 0) or THD (varlen 1) tensor as a kernel operand. */
fa_operand fa_operand_of(const fa_tensor *t, int varlen);

/* ---- the steps of every entry point around its own validation ---- */

/* Needs c->ctx (FA_ERR_NULL_POINTER) and marks it in use (FA_ERR_BUSY: another call holds
   it), clears its message and selection record, checks the caller's fa_params version and size
   (FA_ERR_INVALID_ARGUMENT) and points c->p at *own: the caller's options (the defaults for
   NULL) as a struct of this library's version. A call that runs (not a workspace query) then
   fails with the bad index kernels of an earlier call recorded in the context's error word
   (FA_ERR_VARLEN). When it returns FA_OK the context is held until fa_call_end. */
fa_status fa_call_begin(fa_call *c, fa_params *own);
/* Releases the context fa_call_begin marked; returns st. */
fa_status fa_call_end(fa_call *c, fa_status st);

typedef fa_status (*fa_ws_entry)(fa_context *ctx, const fa_problem *p, size_t *bytes);
typedef fa_status (*fa_run_entry)(fa_context *ctx, const fa_problem *p, void *ws,
                                  size_t ws_bytes);
/* On the context's device (the backend's enter/leave): asks the backend entry ws_entry for
   the workspace; for a query (c->query_only) stores it in *query_bytes, else gets the
   workspace (the user's, the allocator's or the context's), runs run_entry, returns lent
   workspace to the allocator and publishes the selection record run_entry filled. */
fa_status fa_call_finish(fa_call *c, const fa_problem *pr, fa_ws_entry ws_entry,
                         fa_run_entry run_entry, size_t *query_bytes);
/* Publishes the selection record after a successful run (FLASHATTN_LOG=1 prints it). */
void fa_call_done(fa_context *ctx);

#endif /* FA_VALIDATE_H */
