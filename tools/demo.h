/*
 * demo.h — pieces of `flashattn demo`: one attention forward run in an isolated child
 * (demo_child.c), the naive side it may run (demo_naive.c), the side-by-side table
 * (cmd_demo.c) and the long case (demo_long.c).
 */
#ifndef FA_TOOL_DEMO_H
#define FA_TOOL_DEMO_H

#include <stdint.h>

#include "flashattn.h"
#include "isolate.h"

#define DEMO_MAX_SEQLENS 32

/* A call shorter than this (seconds) is timed again, up to DEMO_MAX_CALLS calls in all, and
   the median reported. */
#define DEMO_REPEAT_BELOW 0.2
#define DEMO_MAX_CALLS 5

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
    int naive;            /* 1: the materialised side (demo_naive.c), 0: fa_fwd, FA_ALGO_AUTO */
    double est_seconds;   /* naive: predicted duration, checked against cfg->naive_budget */
    int out_fd;           /* file the child writes its output tensor to, or -1 */
    const char *label;    /* what the progress line calls the run, e.g. "flash" */
} demo_job;

/* What the child reports. It sends one after preparing its inputs and one when done, so a
   child that dies during the call still leaves its baseline behind. */
enum { DEMO_STAGE_READY = 1, DEMO_STAGE_DONE = 2 };
typedef struct demo_report {
    int stage;
    int status;            /* fa_status of the timed call (FA_OK before it ran) */
    int skipped;           /* naive run skipped: predicted time over the budget */
    int no_inputs;         /* the inputs themselves did not fit under the memory limit */
    double seconds;        /* wall time of the timed call (the median when repeated) */
    int calls;             /* how many calls that median is of */
    long baseline_kib;     /* RSS just before the call: inputs, outputs, runtime */
    uint64_t input_bytes;  /* q, k, v, out, lse */
    uint64_t ws_query;     /* fa_fwd_workspace_size */
    uint64_t ws_used;      /* fa_last_selection()->workspace_bytes */
    uint64_t score_bytes;  /* bytes the naive side allocates (demo_naive_bytes) */
    int sel_threads, tile_q, tile_k; /* naive: the BLAS's threads (0: its own setting) */
    int lib_threads;       /* the library's thread count, which the naive side copies */
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
   outcome for the result). A run past a second shows a progress line on stderr (demo_child.c). */
int demo_run(const demo_job *job, demo_outcome *outcome);
void demo_outcome_free(demo_outcome *outcome);

/* An anonymous file for a child's output tensor. The parent compares two of them in small
   chunks, so it never holds a tensor itself: everything it holds is inherited by the next
   child and would count in that child's peak RSS. Returns -1 on failure. */
int demo_out_file(void);
/* Largest |x - y| over n elements of dtype dt stored in two such files; NaN when an element
   is NaN, -1 when the files cannot be read. */
double demo_max_abs_err(int fx, int fy, fa_dtype dt, size_t n);

/* The naive side: attention as a user writes it on a matrix library, the B*H*N*N fp32 scores
   materialised, the matrix products on a BLAS's cblas_sgemm when the tool was built with one,
   else on plain C loops (demo_naive.c). */
/* The table's name for it: "BLAS (materialised)" or "C loops (materialised)". */
const char *demo_naive_label(void);
/* What computes the products, e.g. "OpenBLAS 0.3.21 cblas_sgemm (Haswell kernels)". */
const char *demo_naive_engine(void);
/* Threads for the products and the softmax; returns the BLAS's count in force (0: a BLAS whose
   thread setting the tool cannot reach, which keeps its own). Call it in the child. */
int demo_naive_set_threads(int threads);
/* Bytes it allocates: the scores, plus fp32 copies of q, k, v and out unless dt is f32. */
uint64_t demo_naive_bytes(int64_t batch, int64_t heads, int64_t n, int64_t d, fa_dtype dt);
/* O = softmax(Q K^T / sqrt(d)) V on BSHD tensors of dtype dt (f32, f16, bf16), sq = sk = n;
   FA_OK, or FA_ERR_OUT_OF_MEMORY when its buffers cannot be allocated. */
fa_status demo_naive_fwd(const void *q, const void *k, const void *v, void *o, fa_dtype dt,
                         int64_t batch, int64_t n, int64_t heads, int64_t d, int causal);

/* Forward FLOPs of the run: 4*B*H*N*N*d, halved for causal. */
double demo_flops(int64_t batch, int64_t heads, int64_t n, int64_t d, int causal);

/* The --long case; returns the exit code. */
int demo_long(const demo_cfg *cfg, int64_t seqlen);

#endif /* FA_TOOL_DEMO_H */
