/*
 * cpu/kvcache.h — the CPU kernels of fa_fwd_kvcache and fa_merge_attn (cpu/kvcache.c,
 * cpu/merge.c), chosen by cpu/backend.c. Problems arrive validated, with host pointers.
 */
#ifndef FA_CPU_KVCACHE_H
#define FA_CPU_KVCACHE_H

#include "kernels.h"

/* How a KV-cache call runs: the split count (caller's, or the heuristic's from the shape and
   the threads) and the workspace it needs for that many threads. */
typedef struct fa_cpu_kv_plan {
    int splits;        /* chunks of each work item's key range, merged by LSE when > 1 */
    int threads;
    int64_t items;     /* parallel work items: batch * heads_kv * row tiles * splits */
    size_t ws_bytes;   /* tiles of every thread, plus the fp32 partials when splits > 1 */
    int overflow;      /* 1: the partials of that many splits do not fit size_t */
} fa_cpu_kv_plan;

#ifdef FA_ISA /* one copy per instruction-set level (isa.h) */
fa_cpu_kv_plan FA_ISA_FN(fa_cpu_kv_plan_of)(const fa_problem *p, int threads);
fa_cpu_tiles FA_ISA_FN(fa_cpu_kv_tiles)(void);
/* Appends k_new/v_new into the cache, then attends (ws: plan->ws_bytes, any alignment). */
void FA_ISA_FN(fa_cpu_fwd_kvcache)(const fa_problem *p, const fa_cpu_kv_plan *plan, void *ws);
#endif

/* out = sum_s exp(lse_s - lse) out_s, lse = log sum_s exp(lse_s), row by row; parts with
   lse -inf carry no weight (their out is not read); a row no part saw gets 0 and -inf. Runs
   on exactly `threads` threads (1: no team; the caller decides, cpu/team.h). */
void fa_cpu_merge(const fa_merge_problem *m, int threads);
/* Its work for fa_cpu_team: a multiply-add per element of every part. */
double fa_cpu_merge_flops(const fa_merge_problem *m);

#endif /* FA_CPU_KVCACHE_H */
