/*
 * cpu/bwd_schedule.c — which schedule the tiled backward (bwd_tiled.c) runs, decided once for
 * all instruction-set levels so that the backend can record it.
 *
 * One-pass: a work item per (batch, kv head) that also sums dQ into a per-thread buffer;
 * 5 matmuls per tile pair. Two-pass: items per run of key tiles, then per run of query tiles,
 * which rebuild P and dS twice (7 matmuls) but split a head over threads. One-pass needs at
 * least two kv heads per thread (else threads idle) and a dQ buffer of at most 64 MiB.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define DQ_MAX_BYTES ((size_t)64 << 20)

int64_t fa_cpu_bwd_dq_rows(const fa_problem *p) {
    /* the longest sequence (varlen too), + the last tile's padding rows (blocks of 4) */
    return p->seqlen_q + 4;
}

size_t fa_cpu_bwd_dq_floats(const fa_problem *p) {
    const size_t dp = ((size_t)p->d + 15) & ~(size_t)15;
    return ((size_t)(p->group * fa_cpu_bwd_dq_rows(p)) * dp + 15) & ~(size_t)15;
}

int fa_cpu_bwd_dq_fits(const fa_problem *p) {
    return fa_cpu_bwd_dq_floats(p) * sizeof(float) <= DQ_MAX_BYTES;
}

int fa_cpu_bwd_one_pass(const fa_problem *p, int threads, char *why, size_t len) {
    /* FLASHATTN_CPU_BWD_SCHEDULE=one-pass or two-pass (the context's) forces a schedule: the
       tests run both whatever the machine's core count */
    const int force = fa_cpu_bwd_schedule_forced();
    int one;
    if (force)
        one = force == 1;
    else
        one = p->batch * p->heads_kv >= 2 * (int64_t)threads &&
              fa_cpu_bwd_dq_floats(p) * sizeof(float) <= DQ_MAX_BYTES;
    if (why && len) {
        why[0] = '\0';
        if (!one && force)
            snprintf(why, len, "two-pass backward (FLASHATTN_CPU_BWD_SCHEDULE=two-pass)");
        else if (!one)
            snprintf(why, len,
                     "two-pass backward (rebuilds P a second time): batch x kv heads = %lld, "
                     "one-pass needs >= 2 per thread (%d threads) and a dQ buffer <= 64 MiB "
                     "(%zu MiB)",
                     (long long)(p->batch * p->heads_kv), threads,
                     (fa_cpu_bwd_dq_floats(p) * sizeof(float)) >> 20);
    }
    return one;
}
