/*
 * cp.h — what the public context-parallel entries (cp.c) hand the CUDA ring (cuda/cp_ring.c).
 */
#ifndef FA_CP_H
#define FA_CP_H

#include "internal.h"

/* The validated shard problem (pr: q, k, v, o, lse and, backward, dout, dq, dk, dv of this
   rank's shard; seqlen_q = seqlen_k = its length; scale and causal resolved) and the ring.
   pr comes first so that the dispatcher's workspace and run entries, which take an
   fa_problem pointer, can be handed one of these (cp_ring.c casts it back). */
typedef struct fa_cp_problem {
    fa_problem pr;
    void *comm;      /* ncclComm_t */
    int64_t seqlen;  /* the whole sequence */
    int layout;
    int world, rank;
    int bwd;
} fa_cp_problem;

#ifdef FLASHATTN_WITH_CUDA
/* The communicator's size and rank (NCCL loaded on first use): FA_ERR_NO_BACKEND without
   NCCL, FA_ERR_CUDA when NCCL refuses the handle. */
fa_status fa_cp_comm_info(fa_context *ctx, const char *fn, void *comm, int *world, int *rank);
/* The dispatcher's entries (fa_call_finish) for a fa_cp_problem: workspace bytes, and the
   ring itself. */
fa_status fa_cp_cuda_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes);
fa_status fa_cp_cuda_run(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes);
#endif

#endif /* FA_CP_H */
