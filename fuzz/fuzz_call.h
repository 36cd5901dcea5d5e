/*
 * fuzz_call.h — one decoded call of the fuzzer: its tensors (views into one arena, each with
 * a role), options and index arrays; how they are laid out (fuzz_tensors.c) and what a
 * successful call must give (fuzz_oracle.c).
 */
#ifndef FA_FUZZ_CALL_H
#define FA_FUZZ_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "fuzz_bytes.h"

enum { FZ_MAX_T = 16, FZ_MAX_PARTS = 4, FZ_MAX_BLOCKS = 8 };

/* What the call does with a tensor: read it, write it (or both: a cache appended to), or an
   LSE read by the backward / merged as a part (these may hold -inf), or written. */
typedef enum { FZ_IN, FZ_OUT, FZ_INOUT, FZ_LSE_IN, FZ_LSE_OUT, FZ_LSE_PART } fz_role;

typedef struct fz_call {
    int op;
    fa_algo algo;
    fa_params prm;
    fa_kvcache cache;
    int num_splits, nparts;
    /* indices into view[] of each argument, -1 when the call passes NULL */
    int q, k, v, o, lse, dout, dq, dk, dv, knew, vnew;
    int part_o[FZ_MAX_PARTS], part_l[FZ_MAX_PARTS];
    fa_tensor view[FZ_MAX_T];
    fz_role role[FZ_MAX_T];
    const char *name[FZ_MAX_T];
    int sane[FZ_MAX_T]; /* fields the library may accept: the view lies inside the arena */
    int nt;
    int64_t sq, sk, group, d; /* bounds of the problem, for the oracle */
    int64_t reference_macs; /* multiply-adds of a naive/plain/f64 call (0: a tiled one) */
    float *slopes;
    int64_t nslopes;
    void *block[FZ_MAX_BLOCKS]; /* heap blocks of exact size: index arrays, slopes */
    size_t block_bytes[FZ_MAX_BLOCKS];
    int nblocks;
    uint8_t *arena, *before;
    size_t arena_bytes;
    uint64_t seed;
    int vmode; /* how tensor contents are drawn (fuzz_tensors.c) */
} fz_call;

void fz_call_init(fz_call *c, uint32_t seed);
void fz_call_free(fz_call *c);
/* A heap block of exactly `bytes` bytes (zeroed), freed with the call. */
void *fz_block(fz_call *c, size_t bytes);
/* A tensor of the call: shape and a layout (strides) drawn from f; placed by fz_layout. */
int fz_add(fz_call *c, fz *f, const char *name, int ndim, const int64_t *shape, fa_dtype dt,
           fz_role role);
/* Breaks at most one field of one tensor, sizes the arena for every sane view, places the
   views (apart or overlapping), may break a data pointer, and fills the contents. Returns 0
   when a sane view is too large for the fuzzer (the input is then skipped). */
int fz_layout(fz_call *c, fz *f);
/* The first arena byte that differs from c->before and belongs to no element the call may
   write, or -1. */
int64_t fz_stray_write(const fz_call *c);
/* NULL, or what is wrong with the outputs of a successful call (fuzz_oracle.c). */
const char *fz_oracle(const fz_call *c);

/* Element access for the oracle: the value at p of a dtype. */
double fz_get(fa_dtype dt, const uint8_t *p);
/* Calls fn on every element of a sane view. */
void fz_each(const fa_tensor *t, void (*fn)(void *user, uint8_t *p), void *user);

#endif /* FA_FUZZ_CALL_H */
