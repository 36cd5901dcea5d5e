/*
 * cpu/kernels.h — the CPU kernels the CPU backend (cpu/backend.c) chooses between.
 *
 * Every kernel takes a validated fa_problem with host pointers. Tiled kernels get their
 * workspace from the caller (sized by the matching *_ws function for the same thread count)
 * and never allocate; the naive references allocate their score matrices themselves, since
 * materialising them is what they demonstrate.
 */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include "../internal.h"

/* Query rows and key rows of every tiled kernel's tile, at every instruction-set level: 64
   keeps every tile of one work item (d <= 256: at most ~430 KiB, backward) in L2, and one
   fp32 score row is a whole number of vectors of each level. */
#define FA_CPU_TILE 64

/* Tile shape of the tiled kernels for a problem: query rows and key rows per tile. */
typedef struct fa_cpu_tiles {
    int tile_q;
    int tile_k;
} fa_cpu_tiles;

/* ref_naive.c — textbook attention with the full score matrix [batch, heads_q, sq, sk].
   plain = 0: fp64 accumulation (FA_ALGO_NAIVE); plain = 1: matmuls accumulate in fp32 and
   round to the input dtype, softmax in fp32 (FA_ALGO_PLAIN). Returns FA_ERR_OUT_OF_MEMORY
   (before writing anything) when the scores do not fit. */
fa_status fa_cpu_fwd_naive(const fa_problem *p, int plain, int threads, size_t *bytes_used);
fa_status fa_cpu_bwd_naive(const fa_problem *p, int plain, int threads, size_t *bytes_used);

/* bwd_schedule.c — the tiled backward's schedule: 1 for one-pass, 0 for two-pass, with the
   reason for two-pass in why (may be NULL); and the one-pass dQ buffer of each thread (rows
   per query head of the group, floats in all). */
int fa_cpu_bwd_one_pass(const fa_problem *p, int threads, char *why, size_t len);
/* The schedule the calling context forces (FLASHATTN_CPU_BWD_SCHEDULE, read when it was
   created; set per call by the backend, isa.h): 0 none, 1 one-pass, 2 two-pass. */
int fa_cpu_bwd_schedule_forced(void);
int64_t fa_cpu_bwd_dq_rows(const fa_problem *p);
size_t fa_cpu_bwd_dq_floats(const fa_problem *p);
/* Whether the one-pass dQ buffer is within the schedule's bound (64 MiB). */
int fa_cpu_bwd_dq_fits(const fa_problem *p);

/* The tiled kernels exist once per instruction-set level (isa.h): in their files, FA_ISA is
   the level and FA_ISA_FN(f) names f's copy for it (f_avx512, ...). */
#ifdef FA_ISA
#define FA_ISA_CAT2(a, b) a##_##b
#define FA_ISA_CAT(a, b) FA_ISA_CAT2(a, b)
#define FA_ISA_FN(name) FA_ISA_CAT(name, FA_ISA)
#define FA_ISA_STR2(x) #x
#define FA_ISA_STR(x) FA_ISA_STR2(x)
#define FA_ISA_NAME FA_ISA_STR(FA_ISA)

/* fwd_tiled.c — online-softmax forward, threads over (batch, head, query tile). */
fa_cpu_tiles FA_ISA_FN(fa_cpu_fwd_tiled_tiles)(const fa_problem *p);
size_t FA_ISA_FN(fa_cpu_fwd_tiled_ws)(const fa_problem *p, int threads);
void FA_ISA_FN(fa_cpu_fwd_tiled)(const fa_problem *p, void *ws, int threads);

/* bwd_tiled.c — backward by recomputation from LSE. */
fa_cpu_tiles FA_ISA_FN(fa_cpu_bwd_tiled_tiles)(const fa_problem *p);
size_t FA_ISA_FN(fa_cpu_bwd_tiled_ws)(const fa_problem *p, int threads);
void FA_ISA_FN(fa_cpu_bwd_tiled)(const fa_problem *p, void *ws, int threads);

#endif /* FA_ISA */

#endif /* FA_CPU_KERNELS_H */
