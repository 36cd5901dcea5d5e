/*
 * cp_schedule.h — context parallelism's shard layouts and its per-step call schedule, in plain
 * C (no CUDA, no NCCL), so that a CPU build tests them (tests/test_cp_schedule.c). The rules
 * are those of python/flashattn/distributed/_layout.py and _schedule.py, which the Python ring
 * runs: both sides must cut and schedule alike.
 */
#ifndef FA_CP_SCHEDULE_H
#define FA_CP_SCHEDULE_H

#include <stdint.h>

/* One attention call: local query rows [q0, q1) of the rank's shard against local keys
   [k0, k1) of the source's shard, causal (the shard's own square) or not. */
typedef struct fa_cp_block {
    int64_t q0, q1, k0, k1;
    int causal;
} fa_cp_block;

/* A rank's chunks: global chunk index, global start, length, local start, in shard order. */
typedef struct fa_cp_span {
    int64_t chunk, start, len, local;
} fa_cp_span;

/* At most 4 calls per (rank, source): two query groups times two key runs. */
#define FA_CP_MAX_BLOCKS 4

/* 1 when layout is FA_CP_CONTIGUOUS or FA_CP_ZIGZAG. */
int fa_cp_layout_ok(int layout);
/* The rank's spans (1 for contiguous, 2 for zigzag); returns their count, 0 on bad input. */
int fa_cp_spans(int64_t seqlen, int world, int rank, int layout, fa_cp_span *spans);
/* The calls of rank's queries against source's shard; returns their count (empty ones left
   out), -1 on bad input. */
int fa_cp_blocks(int64_t seqlen, int world, int rank, int source, int causal, int layout,
                 fa_cp_block *out);

#endif /* FA_CP_SCHEDULE_H */
