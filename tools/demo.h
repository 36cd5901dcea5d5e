/*
 * demo.h — pieces of `flashattn demo`: one attention forward run in an isolated child
 * (demo_child.c), the side-by-side table (cmd_demo.c) and the long case (demo_long.c).
 */
#ifndef FA_TOOL_DEMO_H
#define FA_TOOL_DEMO_H

#include <stdint.h>

#include "flashattn.h"
#include "isolate.h"

#define DEMO_MAX_SEQLENS 32

/* The kernel batches RSS accounting per thread (tens of pages), so differences between two
   RSS readings below this are noise. */
#define DEMO_RSS_NOISE (512.0 * 1024)

typedef struct demo_cfg {
    int64_t batch, heads, head_dim;
    int64_t seqlens[DEMO_MAX_SEQLENS];
    int nseq;
    fa_dtype dtype;
    int causal;
    int threads;          /* 0: the library's default (all cores) */
    size_t mem_limit;     /* address space each child may add once warm, bytes */
    double naive_budget;  /* seconds; skip a naive run predicted to take longer (0: never) */
    int run_naive;
    uint64_t seed;
} demo_cfg;

/* One forward run: what the child is asked to do. */
typedef struct demo_job {
    const demo_cfg *cfg;
    int64_t seqlen, heads;
    int causal;
    fa_algo algo;
    double est_seconds;   /* naive: predicted duration, checked against cfg->naive_budget */
    int out_fd;           /* file the child writes its output tensor to, or -1 */
} demo_job;

/* What the child reports. It sends one after preparing its inputs and one when done, so a
   child that dies during the call still leaves its baseline behind. */
enum { DEMO_STAGE_READY = 1, DEMO_STAGE_DONE = 2 };
typedef struct demo_report {
    int stage;
    int status;            /* fa_status of the timed call (FA_OK before it ran) */
    int skipped;           /* naive run skipped: predicted time over the budget */
    int no_inputs;         /* the inputs themselves did not fit under the memory limit */
    double seconds;        /* wall time of the timed call */
    long baseline_kib;     /* RSS just before the call: inputs, outputs, runtime */
    uint64_t input_bytes;  /* q, k, v, out, lse */
    uint64_t ws_query;     /* fa_fwd_workspace_size */
    uint64_t ws_used;      /* fa_last_selection()->workspace_bytes */
    uint64_t score_bytes;  /* bytes of a materialised score matrix (see demo_score_bytes) */
    int sel_threads, tile_q, tile_k;
    char kernel[64];
    char reason[192];
    char error[512];
    uint64_t nonfinite;    /* output elements left NaN/inf (the output is poisoned first) */
    uint64_t out_bytes;    /* bytes of the output tensor written to the job's out_fd */
} demo_report;

typedef struct demo_outcome {
    iso_result iso;
    int have_report;       /* at least one report arrived */
    demo_report rep;       /* the latest one */
} demo_outcome;

/* Runs the job in a child (memory limited by cfg->mem_limit once warm); 0 on success (see
   outcome for the result). */
int demo_run(const demo_job *job, demo_outcome *outcome);
void demo_outcome_free(demo_outcome *outcome);

/* An anonymous file for a child's output tensor. The parent compares two of them in small
   chunks, so it never holds a tensor itself: everything it holds is inherited by the next
   child and would count in that child's peak RSS. Returns -1 on failure. */
int demo_out_file(void);
/* Largest |x - y| over n elements of dtype dt stored in two such files; NaN when an element
   is NaN, -1 when the files cannot be read. */
double demo_max_abs_err(int fx, int fy, fa_dtype dt, size_t n);

/* Bytes FA_ALGO_PLAIN allocates for its score matrix: B*H*Nq*Nk doubles plus one double per
   row. The library's workspace query reports 0 for the naive algorithms, so the tool states
   the need itself when the run fails. */
uint64_t demo_score_bytes(int64_t batch, int64_t heads, int64_t sq, int64_t sk);

/* Forward FLOPs of the run: 4*B*H*N*N*d, halved for causal. */
double demo_flops(int64_t batch, int64_t heads, int64_t n, int64_t d, int causal);

/* The --long case; returns the exit code. */
int demo_long(const demo_cfg *cfg, int64_t seqlen);

#endif /* FA_TOOL_DEMO_H */
