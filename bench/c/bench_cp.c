/*
 * bench_cp.c — times the C API's ring attention (fa_cp_fwd / fa_cp_bwd over NCCL) on every
 * visible GPU of one process against fa_fwd / fa_bwd of the whole sequence on GPU 0, the
 * scaling efficiency of issue 40 (bench/cp_bench.py measures the Python ring and PyTorch's).
 *
 *   FLASHATTN_NCCL_LIBRARY=.../libnccl.so.2 build-gpu/bench/c/bench_cp [--tokens 131072]
 *       [--heads 32] [--heads-kv 8] [--head-dim 128] [--full] [--contiguous] [--world N]
 *       [--reps 10] [--warmup 3] [--no-baseline]
 *
 * Method: bf16 inputs of standard-normal-like values (never zeros), one thread per GPU
 * (ncclCommInitAll), each timed call between CUDA events on the context's stream after a
 * barrier of all ranks; per call the slowest rank's time (a ring step waits for its slowest
 * member), the median over calls. Forward + backward is fa_cp_fwd then fa_cp_bwd (fa_fwd then
 * fa_bwd on one GPU). Efficiency = T(1 GPU) / (n * T(n)); --no-baseline skips the one-GPU
 * run (a sequence one GPU takes too long for) and prints TFLOP/s per GPU only. Exits 77
 * without GPUs or NCCL.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashattn.h"
#include "testkit.h"

#define SKIP 77
#define MAX_REPS 64
#define MAX_WORLD 8

typedef struct cfg {
    int64_t tokens, hq, hk, d;
    int causal, layout, world, reps, warmup, baseline;
} cfg;

/* Timings of one rank (or of the one-GPU run): [0] forward, [1] forward + backward. */
typedef struct rank_job {
    const cfg *c;
    int rank, n;        /* n = 1: the whole sequence on GPU 0 with fa_fwd / fa_bwd */
    void *comm;
    pthread_barrier_t *bar;
    float ms[2][MAX_REPS];
    fa_status st;
    char msg[300], kernel[2][96]; /* the selection record after each op's calls */
} rank_job;

/* A device buffer of `elems` bf16 values, filled from a tiled block of random ones. */
static void *dev_random(size_t elems, uint64_t seed) {
    enum { BLOCK = 1 << 20 };
    uint16_t *host = malloc(BLOCK * sizeof *host); /* per call: the ranks fill at once */
    void *p = NULL;
    if (!host || cudaMalloc(&p, elems * 2) != cudaSuccess) {
        free(host);
        return NULL;
    }
    tk_rng r;
    tk_rng_init(&r, seed);
    for (int i = 0; i < BLOCK; i++) host[i] = tk_bf16_bits(tk_rng_normal(&r));
    for (size_t off = 0; off < elems; off += BLOCK) {
        size_t n = elems - off < BLOCK ? elems - off : BLOCK;
        cudaMemcpy((uint16_t *)p + off, host, n * 2, cudaMemcpyHostToDevice);
    }
    free(host);
    return p;
}

static void *dev_empty(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    const cfg *c = j->c;
    const int64_t s = j->n == 1 ? c->tokens : fa_cp_shard_len(c->tokens, j->n, j->rank, c->layout);
    cudaSetDevice(j->rank);
    fa_context *ctx = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    void *buf[10] = {0};
    j->st = fa_context_create(&ctx, FA_BACKEND_CUDA);
    if (j->st == FA_OK) {
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaEventCreate(&ev[0]);
        cudaEventCreate(&ev[1]);
        j->st = fa_context_set_stream(ctx, stream);
    }
    const size_t qe = (size_t)(s * c->hq * c->d), ke = (size_t)(s * c->hk * c->d);
    const uint64_t seed = 0x5eed + 101 * (uint64_t)j->rank;
    buf[0] = dev_random(qe, seed);      /* q */
    buf[1] = dev_random(ke, seed + 1);  /* k */
    buf[2] = dev_random(ke, seed + 2);  /* v */
    buf[3] = dev_random(qe, seed + 3);  /* dout */
    buf[4] = dev_empty(qe * 2);         /* out */
    buf[5] = dev_empty((size_t)(c->hq * s) * 4); /* lse */
    buf[6] = dev_empty(qe * 2);         /* dq */
    buf[7] = dev_empty(ke * 2);         /* dk */
    buf[8] = dev_empty(ke * 2);         /* dv */
    for (int i = 0; i < 9 && j->st == FA_OK; i++)
        if (!buf[i]) {
            j->st = FA_ERR_OUT_OF_MEMORY;
            snprintf(j->msg, sizeof j->msg, "cudaMalloc failed (%lld tokens a rank)", (long long)s);
        }
    const fa_dtype bf = FA_DTYPE_BF16;
    fa_tensor q = fa_tensor_bshd(buf[0], bf, FA_DEVICE_CUDA, 1, s, c->hq, c->d);
    fa_tensor k = fa_tensor_bshd(buf[1], bf, FA_DEVICE_CUDA, 1, s, c->hk, c->d);
    fa_tensor v = fa_tensor_bshd(buf[2], bf, FA_DEVICE_CUDA, 1, s, c->hk, c->d);
    fa_tensor dO = fa_tensor_bshd(buf[3], bf, FA_DEVICE_CUDA, 1, s, c->hq, c->d);
    fa_tensor o = fa_tensor_bshd(buf[4], bf, FA_DEVICE_CUDA, 1, s, c->hq, c->d);
    fa_tensor lse = fa_tensor_3d(buf[5], FA_DTYPE_F32, FA_DEVICE_CUDA, 1, c->hq, s);
    fa_tensor dq = fa_tensor_bshd(buf[6], bf, FA_DEVICE_CUDA, 1, s, c->hq, c->d);
    fa_tensor dk = fa_tensor_bshd(buf[7], bf, FA_DEVICE_CUDA, 1, s, c->hk, c->d);
    fa_tensor dv = fa_tensor_bshd(buf[8], bf, FA_DEVICE_CUDA, 1, s, c->hk, c->d);
    fa_params p = fa_params_default();
    p.causal = c->causal;
    fa_cp_args a = fa_cp_args_default();
    a.q = &q, a.k = &k, a.v = &v, a.seqlen = c->tokens, a.layout = c->layout, a.p = &p;
    a.out = &o, a.lse = &lse, a.dout = &dO, a.dq = &dq, a.dk = &dk, a.dv = &dv;
    /* the ring's workspace allocated before the first barrier: an allocation while a peer's
       ring is in flight can deadlock one process (flashattn.h, context parallelism) */
    if (j->n > 1 && j->st == FA_OK) {
        size_t wf = 0, wb = 0;
        j->st = fa_cp_fwd_workspace_size(ctx, j->comm, &a, &wf);
        if (j->st == FA_OK) j->st = fa_cp_bwd_workspace_size(ctx, j->comm, &a, &wb);
        if (j->st == FA_OK) {
            buf[9] = dev_empty(wf > wb ? wf : wb);
            j->st = buf[9] ? fa_context_set_workspace(ctx, buf[9], wf > wb ? wf : wb)
                           : FA_ERR_OUT_OF_MEMORY;
        }
        if (j->st != FA_OK) snprintf(j->msg, sizeof j->msg, "workspace: %s", fa_last_error(ctx));
    }
    cudaDeviceSynchronize();
    for (int op = 0; op < 2; op++)
        for (int i = -c->warmup; i < c->reps; i++) {
            /* every rank takes part in every barrier, failed or not, so none waits forever */
            if (j->bar) pthread_barrier_wait(j->bar);
            if (j->st != FA_OK) continue;
            cudaEventRecord(ev[0], stream);
            if (j->n == 1) {
                j->st = fa_fwd(ctx, &q, &k, &v, &p, &o, &lse);
                if (op == 1 && j->st == FA_OK)
                    j->st = fa_bwd(ctx, &q, &k, &v, &o, &dO, &lse, &p, &dq, &dk, &dv);
            } else {
                j->st = fa_cp_fwd(ctx, j->comm, &a);
                if (op == 1 && j->st == FA_OK) j->st = fa_cp_bwd(ctx, j->comm, &a);
            }
            cudaEventRecord(ev[1], stream);
            if (cudaEventSynchronize(ev[1]) != cudaSuccess && j->st == FA_OK) {
                j->st = FA_ERR_CUDA;
                snprintf(j->msg, sizeof j->msg, "%s", cudaGetErrorString(cudaGetLastError()));
            }
            if (j->st != FA_OK && !j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", fa_last_error(ctx));
            if (i >= 0) cudaEventElapsedTime(&j->ms[op][i], ev[0], ev[1]);
            /* op 1's record is the backward's: the forward's kernel is op 0's */
            const fa_selection *sel = j->st == FA_OK ? fa_last_selection(ctx) : NULL;
            snprintf(j->kernel[op], sizeof j->kernel[op], "%s", sel ? sel->kernel : "?");
        }
    if (j->bar) pthread_barrier_wait(j->bar); /* every ring finished before any free */
    for (int i = 0; i < 10; i++) cudaFree(buf[i]);
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    if (stream) cudaStreamDestroy(stream);
    fa_context_destroy(ctx);
    return NULL;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median over calls of the slowest rank's time, op 0 (fwd) or 1 (fwd+bwd). */
static double step_ms(const rank_job *jobs, int n, int op, int reps) {
    float worst[MAX_REPS];
    for (int i = 0; i < reps; i++) {
        worst[i] = 0;
        for (int r = 0; r < n; r++)
            if (jobs[r].ms[op][i] > worst[i]) worst[i] = jobs[r].ms[op][i];
    }
    qsort(worst, (size_t)reps, sizeof *worst, cmp_float);
    return reps % 2 ? worst[reps / 2] : 0.5 * (worst[reps / 2 - 1] + worst[reps / 2]);
}

static int parse(int argc, char **argv, cfg *c) {
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *num = !strcmp(o, "--tokens") ? &c->tokens : !strcmp(o, "--heads") ? &c->hq
                     : !strcmp(o, "--heads-kv") ? &c->hk : !strcmp(o, "--head-dim") ? &c->d : NULL;
        int *inum = !strcmp(o, "--world") ? &c->world : !strcmp(o, "--reps") ? &c->reps
                  : !strcmp(o, "--warmup") ? &c->warmup : NULL;
        if (!strcmp(o, "--full")) c->causal = 0;
        else if (!strcmp(o, "--no-baseline")) c->baseline = 0;
        else if (!strcmp(o, "--contiguous")) c->layout = FA_CP_CONTIGUOUS;
        else if ((num || inum) && val) {
            char *end;
            long long x = strtoll(val, &end, 10);
            if (*end || x < 0) return 0;
            if (num) *num = x;
            else *inum = (int)x;
            i++;
        } else return 0;
    }
    return c->tokens > 0 && c->hq > 0 && c->hk > 0 && c->hq % c->hk == 0 && c->d > 0 &&
           c->reps >= 1 && c->reps <= MAX_REPS && c->world >= 0 && c->world <= MAX_WORLD;
}

int main(int argc, char **argv) {
    tk_nccl_one_process();
    cfg c = {131072, 32, 8, 128, 1, FA_CP_ZIGZAG, 0, 10, 3, 1};
    if (!parse(argc, argv, &c)) {
        fprintf(stderr, "usage: bench_cp [--tokens N] [--heads H] [--heads-kv H] [--head-dim D] "
                        "[--full] [--contiguous] [--world N (2..8)] [--reps N (1..%d)] "
                        "[--warmup N] [--no-baseline]\n", MAX_REPS);
        return 2;
    }
    int ndev = 0;
    char why[512];
    if (!fa_has_cuda() || cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        printf("SKIP: needs the CUDA backend and two or more GPUs (%d visible)\n", ndev);
        return SKIP;
    }
    if (!tk_nccl_load(why, sizeof why)) {
        printf("SKIP: no NCCL (%s); set FLASHATTN_NCCL_LIBRARY to libnccl.so.2\n", why);
        return SKIP;
    }
    const int n = c.world >= 2 && c.world < ndev ? c.world : (ndev > MAX_WORLD ? MAX_WORLD : ndev);
    printf("bench_cp %s: %lld tokens, heads %lld/%lld, d %lld, bf16, %s, %s; %d GPUs; median of "
           "%d calls after %d warm-up, slowest rank per call\n", fa_version(),
           (long long)c.tokens, (long long)c.hq, (long long)c.hk, (long long)c.d,
           c.causal ? "causal" : "full", c.layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", n,
           c.reps, c.warmup);

    rank_job one = {.c = &c, .rank = 0, .n = 1};
    if (c.baseline) run_rank(&one);
    if (c.baseline && one.st != FA_OK) {
        printf("1 GPU: %s: %s\n", fa_status_string(one.st), one.msg);
        return 1;
    }
    void *comms[MAX_WORLD] = {0};
    int devs[MAX_WORLD];
    for (int i = 0; i < n; i++) devs[i] = i;
    const int r = tk_nccl_init_all(comms, n, devs);
    if (r != 0) {
        printf("ncclCommInitAll failed: %s\n", tk_nccl_error(r));
        return 1;
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    rank_job jobs[MAX_WORLD];
    pthread_t th[MAX_WORLD];
    for (int i = 0; i < n; i++) {
        jobs[i] = (rank_job){.c = &c, .rank = i, .n = n, .comm = comms[i], .bar = &bar};
        pthread_create(&th[i], NULL, run_rank, &jobs[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    tk_nccl_destroy_all(comms, n);
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (jobs[i].st != FA_OK) {
            printf("rank %d: %s: %s\n", i, fa_status_string(jobs[i].st), jobs[i].msg);
            failed = 1;
        }
    if (failed) return 1;
    /* FLOPs as bench/cp_bench.py counts them: 4 S^2 H d, half causal; fwd+bwd 3.5x */
    const double fl = 4.0 * (double)c.tokens * (double)c.tokens * (double)(c.hq * c.d) *
                      (c.causal ? 0.5 : 1.0);
    printf("| op | GPUs | ms | TFLOP/s per GPU | 1-GPU ms | efficiency | kernel |\n"
           "|---|---:|---:|---:|---:|---:|---|\n");
    for (int op = 0; op < 2; op++) {
        const double tn = step_ms(jobs, n, op, c.reps), f = fl * (op ? 3.5 : 1.0);
        const char *name = op ? "fwd+bwd" : "fwd";
        if (!c.baseline) { /* per-GPU throughput only (compare it with a 1-GPU rate) */
            printf("| %s | %d | %.2f | %.1f | - | - | %s |\n", name, n, tn, f / n / tn * 1e-9,
                   jobs[0].kernel[op]);
            continue;
        }
        const double t1 = step_ms(&one, 1, op, c.reps);
        printf("| %s | 1 | %.2f | %.1f | %.2f | 1.000 | %s |\n", name, t1, f / t1 * 1e-9, t1,
               one.kernel[op]);
        printf("| %s | %d | %.2f | %.1f | %.2f | %.3f | %s |\n", name, n, tn, f / n / tn * 1e-9,
               t1, t1 / (n * tn), jobs[0].kernel[op]);
    }
    return 0;
}
