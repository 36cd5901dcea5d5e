/*
 * test_cp.c — fa_cp_fwd / fa_cp_bwd (context parallelism over NCCL) on GPUs, against the
 * library's rule: the ring's O, LSE, dQ, dK and dV of the whole sequence (the ranks' shards put
 * back together by the layout) must err at most 2x as much as fa_fwd / fa_bwd on the whole
 * sequence on one GPU (the baseline), plus the rule's slack, both measured against the float64
 * reference (FA_ALGO_NAIVE on the CPU). Outputs are poisoned with NaN first, so an element the
 * ring fails to write fails the test.
 *
 * Worlds: 1 (one communicator on GPU 0, ncclCommInitAll) always, and n = every visible GPU
 * (up to 8) when there are two or more: one process, ncclCommInitAll over the n devices and
 * one thread per device (each thread's calls are the only ones on its communicator, so no
 * ncclGroupStart/End is needed around them). Each rank allocates everything, its workspace
 * included (fa_cp_*_workspace_size, fa_context_set_workspace), before a barrier of all ranks,
 * and frees after a second one that follows its synchronisation: an allocation while a peer's
 * ring is in flight can deadlock one process (flashattn.h, context parallelism). Cases: causal or not, GQA, sequence lengths not
 * divisible by 2n, both layouts, f16 and bf16.
 *
 * Skips (77, with the reason) without the CUDA backend, a GPU, or libnccl.so.2 (set
 * FLASHATTN_NCCL_LIBRARY to its path: torch's wheel has one in site-packages/nvidia/nccl/lib).
 * Kernels are loaded eagerly (tk_nccl_one_process): at fc9db4d, lazily loaded, world 4 stopped
 * in fa_cp_bwd at the first d 96 case, the first use of that kernel on GPUs 1..3.
 * CP_WORLD=n limits the multi-GPU world to n devices; CP_STREAM=nonblocking runs each rank on a
 * non-blocking stream of its own; CP_TIMEOUT=s is the watchdog's limit.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "flashattn.h"
#include "testkit.h"

#define SKIP 77

/* ---- the watchdog: a rank stuck in NCCL waits forever; the test fails instead, naming the
   phase it was in (CP_TIMEOUT seconds without a new phase, default 180) ---- */

static char g_phase[160] = "start";
static pthread_mutex_t g_phase_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_phase_no;

static void set_phase(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_phase_mu);
    vsnprintf(g_phase, sizeof g_phase, fmt, ap);
    g_phase_no++;
    pthread_mutex_unlock(&g_phase_mu);
    va_end(ap);
}

static void *watchdog(void *arg) {
    const int limit = *(const int *)arg;
    long seen = -1;
    int still = 0;
    for (;;) {
        sleep(1);
        pthread_mutex_lock(&g_phase_mu);
        const long now = g_phase_no;
        char phase[sizeof g_phase];
        memcpy(phase, g_phase, sizeof phase);
        pthread_mutex_unlock(&g_phase_mu);
        still = now == seen ? still + 1 : 0;
        seen = now;
        if (still >= limit) {
            printf("test_cp: FAILED: no progress for %d s in: %s\n", limit, phase);
            fflush(stdout);
            _exit(1);
        }
    }
    return NULL;
}

/* ---- cases and layouts ---- */

typedef struct cp_case {
    int b;
    int64_t s;
    int hq, hk, d;
    fa_dtype dt;
    int causal, layout;
} cp_case;

static const cp_case k_cases[] = {
    {1, 257, 4, 4, 64, FA_DTYPE_BF16, 1, FA_CP_ZIGZAG},
    {2, 130, 8, 2, 128, FA_DTYPE_F16, 0, FA_CP_CONTIGUOUS},
    {1, 301, 6, 2, 128, FA_DTYPE_BF16, 1, FA_CP_CONTIGUOUS},
    {2, 97, 4, 1, 64, FA_DTYPE_F16, 1, FA_CP_ZIGZAG},
    {1, 203, 4, 2, 96, FA_DTYPE_BF16, 0, FA_CP_ZIGZAG},
    {1, 9, 2, 1, 64, FA_DTYPE_BF16, 1, FA_CP_ZIGZAG}, /* empty chunks, shards of 1..2 tokens */
};

/* The layout, computed here independently of the library: [start, len) spans of rank r. */
static int spans(int64_t s, int world, int r, int layout, int64_t *start, int64_t *len) {
    const int64_t c = layout == FA_CP_ZIGZAG ? 2 * (int64_t)world : world;
    const int64_t q = s / c, m = s % c;
    const int64_t idx[2] = {r, 2 * (int64_t)world - 1 - r};
    const int n = layout == FA_CP_ZIGZAG ? 2 : 1;
    for (int i = 0; i < n; i++) {
        start[i] = idx[i] * q + (idx[i] < m ? idx[i] : m);
        len[i] = q + (idx[i] < m);
    }
    return n;
}

/* Copies rank r's rows between a whole-sequence tensor ([B, S, H, D] or, lse, [B, H, S]) and
   its shard; to_shard picks the direction. row_elems: H * D, or 1 for lse (then rows_outer H). */
static void move_rows(char *whole, char *shard, int64_t B, int64_t outer, int64_t S, int64_t n,
                      int64_t row_bytes, int world, int r, int layout, int to_shard) {
    int64_t st[2], ln[2];
    const int k = spans(S, world, r, layout, st, ln);
    for (int64_t b = 0; b < B * outer; b++) {
        int64_t local = 0;
        for (int i = 0; i < k; i++) {
            char *w = whole + (size_t)((b * S + st[i]) * row_bytes);
            char *h = shard + (size_t)((b * n + local) * row_bytes);
            if (to_shard) memcpy(h, w, (size_t)(ln[i] * row_bytes));
            else memcpy(w, h, (size_t)(ln[i] * row_bytes));
            local += ln[i];
        }
    }
}

/* ---- one rank ---- */

typedef struct job {
    const cp_case *c;
    int dev, world, rank;
    void *comm;
    pthread_barrier_t *bar; /* every rank waits at both, failed or not */
    int64_t n;
    /* host shards, dtype (lse f32) */
    void *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
    fa_status st;
    char msg[700];
    char kernel[64];
} job;

static void *dev_alloc(size_t bytes, const void *host, int poison) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) return NULL;
    if (host) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
    else if (poison) cudaMemset(p, 0xff, bytes ? bytes : 16); /* NaN in every dtype */
    return p;
}

static void *run_rank(void *arg) {
    job *j = arg;
    const cp_case *c = j->c;
    const size_t E = fa_dtype_size(c->dt);
    const size_t qb = (size_t)(c->b * j->n * c->hq * c->d) * E;
    const size_t kb = (size_t)(c->b * j->n * c->hk * c->d) * E;
    const size_t lb = (size_t)(c->b * c->hq * j->n) * 4;
    cudaSetDevice(j->dev);
    fa_context *ctx = NULL;
    j->st = fa_context_create(&ctx, FA_BACKEND_CUDA);
    if (j->st != FA_OK) {
        snprintf(j->msg, sizeof j->msg, "context: %s", fa_last_error(NULL));
        return NULL;
    }
    /* CP_STREAM=nonblocking: the ranks' calls on a non-blocking stream of their own instead of
       the legacy default stream (which waits for every blocking stream of its device) */
    cudaStream_t own = NULL;
    void *ws = NULL;
    const char *sm = getenv("CP_STREAM");
    if (sm && !strcmp(sm, "nonblocking") &&
        cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) == cudaSuccess)
        fa_context_set_stream(ctx, own);
    void *dq_ = dev_alloc(qb, j->q, 0), *dk_ = dev_alloc(kb, j->k, 0), *dv_ = dev_alloc(kb, j->v, 0);
    void *ddo = dev_alloc(qb, j->dout, 0), *dout = dev_alloc(qb, NULL, 1);
    void *dlse = dev_alloc(lb, NULL, 1), *gq = dev_alloc(qb, NULL, 1);
    void *gk = dev_alloc(kb, NULL, 1), *gv = dev_alloc(kb, NULL, 1);
    fa_tensor q = fa_tensor_bshd(dq_, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hq, c->d);
    fa_tensor k = fa_tensor_bshd(dk_, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hk, c->d);
    fa_tensor v = fa_tensor_bshd(dv_, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hk, c->d);
    fa_tensor o = fa_tensor_bshd(dout, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hq, c->d);
    fa_tensor dO = fa_tensor_bshd(ddo, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hq, c->d);
    fa_tensor lse = fa_tensor_3d(dlse, FA_DTYPE_F32, FA_DEVICE_CUDA, c->b, c->hq, j->n);
    fa_tensor tq = fa_tensor_bshd(gq, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hq, c->d);
    fa_tensor tk = fa_tensor_bshd(gk, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hk, c->d);
    fa_tensor tv = fa_tensor_bshd(gv, c->dt, FA_DEVICE_CUDA, c->b, j->n, c->hk, c->d);
    fa_params p = fa_params_default();
    p.causal = c->causal;
    fa_cp_args a = fa_cp_args_default();
    a.q = &q;
    a.k = &k;
    a.v = &v;
    a.seqlen = c->s;
    a.layout = c->layout;
    a.p = &p;
    a.out = &o;
    a.lse = &lse;
    a.dout = &dO;
    a.dq = &tq;
    a.dk = &tk;
    a.dv = &tv;
    /* the workspace of both calls, allocated now (see the file's comment) */
    size_t wf = 0, wb = 0;
    j->st = fa_cp_fwd_workspace_size(ctx, j->comm, &a, &wf);
    if (j->st == FA_OK) j->st = fa_cp_bwd_workspace_size(ctx, j->comm, &a, &wb);
    if (j->st == FA_OK) {
        ws = dev_alloc(wf > wb ? wf : wb, NULL, 1);
        j->st = ws ? fa_context_set_workspace(ctx, ws, wf > wb ? wf : wb) : FA_ERR_OUT_OF_MEMORY;
    }
    if (j->st != FA_OK) snprintf(j->msg, sizeof j->msg, "workspace: %s", fa_last_error(ctx));
    cudaDeviceSynchronize();
    set_phase("world %d rank %d: barrier before the calls", j->world, j->rank);
    pthread_barrier_wait(j->bar);
    if (j->st == FA_OK) {
        set_phase("world %d rank %d: fa_cp_fwd", j->world, j->rank);
        j->st = fa_cp_fwd(ctx, j->comm, &a);
    }
    if (j->st == FA_OK) {
        set_phase("world %d rank %d: fa_cp_bwd", j->world, j->rank);
        j->st = fa_cp_bwd(ctx, j->comm, &a);
        if (j->st != FA_OK) snprintf(j->msg, sizeof j->msg, "%s", fa_last_error(ctx));
    } else if (!j->msg[0]) {
        snprintf(j->msg, sizeof j->msg, "%s", fa_last_error(ctx));
    }
    if (j->st == FA_OK) {
        const fa_selection *s = fa_last_selection(ctx);
        snprintf(j->kernel, sizeof j->kernel, "%s", s ? s->kernel : "?");
    }
    set_phase("world %d rank %d: synchronizing after the calls", j->world, j->rank);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess && j->st == FA_OK) {
        j->st = FA_ERR_CUDA;
        snprintf(j->msg, sizeof j->msg, "after the calls: %s", cudaGetErrorString(e));
    }
    set_phase("world %d rank %d: barrier after the calls", j->world, j->rank);
    pthread_barrier_wait(j->bar);
    if (j->st == FA_OK) {
        cudaMemcpy(j->out, dout, qb, cudaMemcpyDeviceToHost);
        cudaMemcpy(j->lse, dlse, lb, cudaMemcpyDeviceToHost);
        cudaMemcpy(j->dq, gq, qb, cudaMemcpyDeviceToHost);
        cudaMemcpy(j->dk, gk, kb, cudaMemcpyDeviceToHost);
        cudaMemcpy(j->dv, gv, kb, cudaMemcpyDeviceToHost);
    }
    void *all[] = {dq_, dk_, dv_, ddo, dout, dlse, gq, gk, gv, ws};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cudaFree(all[i]);
    fa_context_destroy(ctx);
    if (own) cudaStreamDestroy(own);
    return NULL;
}

/* ---- one case on one world ---- */

typedef struct whole {
    tk_buf q, k, v, dout, o, lse, dq, dk, dv;
} whole;

static int alloc_whole(whole *w, const cp_case *c, fa_dtype dt, tk_rng *r) {
    const int64_t qs[4] = {c->b, c->s, c->hq, c->d}, ks[4] = {c->b, c->s, c->hk, c->d};
    const int64_t ls[3] = {c->b, c->hq, c->s};
    const fa_dtype lt = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    int bad = 0;
    bad |= tk_buf_alloc(&w->q, dt, 4, qs, 0, r) | tk_buf_alloc(&w->k, dt, 4, ks, 0, r);
    bad |= tk_buf_alloc(&w->v, dt, 4, ks, 0, r) | tk_buf_alloc(&w->dout, dt, 4, qs, 0, r);
    bad |= tk_buf_alloc(&w->o, dt, 4, qs, 0, r) | tk_buf_alloc(&w->lse, lt, 3, ls, 0, r);
    bad |= tk_buf_alloc(&w->dq, dt, 4, qs, 0, r) | tk_buf_alloc(&w->dk, dt, 4, ks, 0, r);
    bad |= tk_buf_alloc(&w->dv, dt, 4, ks, 0, r);
    return bad;
}

static void free_whole(whole *w) {
    tk_buf *b[] = {&w->q, &w->k, &w->v, &w->dout, &w->o, &w->lse, &w->dq, &w->dk, &w->dv};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) {
        tk_device_free(b[i]);
        tk_buf_free(b[i]);
    }
}

/* fa_fwd + fa_bwd of the whole sequence on ctx (tensors on its device when dev). */
static fa_status attend_whole(fa_context *ctx, whole *w, int causal, int dev) {
    if (dev) {
        tk_buf *b[] = {&w->q, &w->k, &w->v, &w->dout, &w->o, &w->lse, &w->dq, &w->dk, &w->dv};
        for (size_t i = 0; i < sizeof b / sizeof *b; i++)
            if (tk_device_upload(b[i])) return FA_ERR_CUDA;
    }
#define V(x) (dev ? tk_device_view(&w->x) : w->x.t)
    fa_tensor q = V(q), k = V(k), v = V(v), dout = V(dout), o = V(o), lse = V(lse), dq = V(dq),
              dk = V(dk), dv = V(dv);
#undef V
    fa_params p = fa_params_default();
    p.causal = causal;
    fa_status st = fa_fwd(ctx, &q, &k, &v, &p, &o, &lse);
    if (st == FA_OK) st = fa_bwd(ctx, &q, &k, &v, &o, &dout, &lse, &p, &dq, &dk, &dv);
    if (st == FA_OK && dev) {
        tk_buf *b[] = {&w->o, &w->lse, &w->dq, &w->dk, &w->dv};
        for (size_t i = 0; i < sizeof b / sizeof *b; i++)
            if (tk_device_download(b[i])) return FA_ERR_CUDA;
    }
    return st;
}

static int judge(const char *what, const tk_buf *ring, const tk_buf *base, const tk_buf *ref,
                 fa_dtype dt, double extra) {
    tk_err e[2] = {tk_compare(&ring->t, &ref->t), tk_compare(&base->t, &ref->t)};
    double slack = 0;
    const int ok = tk_rule(&e[0], &e[1], dt, extra, &slack) && e[0].nonfinite == 0;
    printf("    %-3s ring max %.3g mean %.3g | one GPU max %.3g mean %.3g | slack %.3g%s%s\n",
           what, e[0].max_abs, e[0].mean_abs, e[1].max_abs, e[1].mean_abs, slack,
           e[0].nonfinite ? " NONFINITE" : "", ok ? "" : "  FAIL");
    return ok;
}

static int run_case(const cp_case *c, int world, const int *devs, void **comms, uint64_t seed) {
    tk_rng r;
    tk_rng_init(&r, seed);
    whole w, ref, ring;
    memset(&w, 0, sizeof w);
    memset(&ref, 0, sizeof ref);
    memset(&ring, 0, sizeof ring);
    int ok = 1;
    if (alloc_whole(&w, c, c->dt, &r) || alloc_whole(&ref, c, FA_DTYPE_F64, &r) ||
        alloc_whole(&ring, c, c->dt, &r)) {
        printf("  out of host memory\n");
        return 0;
    }
    tk_fill_normal(&w.q, &r, 1.0);
    tk_fill_normal(&w.k, &r, 1.0);
    tk_fill_normal(&w.v, &r, 1.0);
    tk_fill_normal(&w.dout, &r, 1.0);
    tk_copy(&ref.q, &w.q);
    tk_copy(&ref.k, &w.k);
    tk_copy(&ref.v, &w.v);
    tk_copy(&ref.dout, &w.dout);
    tk_copy(&ring.q, &w.q);
    tk_copy(&ring.k, &w.k);
    tk_copy(&ring.v, &w.v);
    tk_copy(&ring.dout, &w.dout);

    /* the float64 reference and the one-GPU baseline */
    fa_context *cpu = NULL, *gpu = NULL;
    fa_status st = fa_context_create(&cpu, FA_BACKEND_CPU);
    if (st == FA_OK) st = fa_context_set_algo(cpu, FA_ALGO_NAIVE);
    if (st == FA_OK) st = attend_whole(cpu, &ref, c->causal, 0);
    if (st != FA_OK) printf("  reference: %s\n", fa_last_error(cpu));
    cudaSetDevice(devs[0]);
    if (st == FA_OK) st = fa_context_create(&gpu, FA_BACKEND_CUDA);
    if (st == FA_OK) {
        st = attend_whole(gpu, &w, c->causal, 1);
        if (st != FA_OK) printf("  one-GPU baseline: %s\n", fa_last_error(gpu));
    }
    fa_context_destroy(cpu);
    fa_context_destroy(gpu);
    if (st != FA_OK) ok = 0;

    /* the ring: shards out, one thread per rank, shards back */
    const size_t E = fa_dtype_size(c->dt);
    job jobs[8];
    pthread_t th[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)world);
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; ok && i < world; i++) {
        job *j = &jobs[i];
        j->c = c;
        j->dev = devs[i];
        j->world = world;
        j->rank = i;
        j->comm = comms[i];
        j->bar = &bar;
        j->n = fa_cp_shard_len(c->s, world, i, c->layout);
        const size_t qb = (size_t)(c->b * j->n * c->hq * c->d) * E + 16;
        const size_t kb = (size_t)(c->b * j->n * c->hk * c->d) * E + 16;
        const size_t lb = (size_t)(c->b * c->hq * j->n) * 4 + 16;
        j->q = malloc(qb), j->k = malloc(kb), j->v = malloc(kb), j->dout = malloc(qb);
        j->out = malloc(qb), j->lse = malloc(lb), j->dq = malloc(qb), j->dk = malloc(kb);
        j->dv = malloc(kb);
        const int64_t qr = c->hq * c->d * (int64_t)E, kr = c->hk * c->d * (int64_t)E;
        move_rows(w.q.t.data, j->q, c->b, 1, c->s, j->n, qr, world, i, c->layout, 1);
        move_rows(w.k.t.data, j->k, c->b, 1, c->s, j->n, kr, world, i, c->layout, 1);
        move_rows(w.v.t.data, j->v, c->b, 1, c->s, j->n, kr, world, i, c->layout, 1);
        move_rows(w.dout.t.data, j->dout, c->b, 1, c->s, j->n, qr, world, i, c->layout, 1);
    }
    for (int i = 0; ok && i < world; i++) pthread_create(&th[i], NULL, run_rank, &jobs[i]);
    for (int i = 0; ok && i < world; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; ok && i < world; i++) {
        job *j = &jobs[i];
        if (j->st != FA_OK) {
            printf("  rank %d: %s: %s\n", i, fa_status_string(j->st), j->msg);
            ok = 0;
            continue;
        }
        if (i == 0) printf("  kernel %s\n", j->kernel);
        const int64_t qr = c->hq * c->d * (int64_t)E, kr = c->hk * c->d * (int64_t)E;
        move_rows(ring.o.t.data, j->out, c->b, 1, c->s, j->n, qr, world, i, c->layout, 0);
        move_rows(ring.lse.t.data, j->lse, c->b, c->hq, c->s, j->n, 4, world, i, c->layout, 0);
        move_rows(ring.dq.t.data, j->dq, c->b, 1, c->s, j->n, qr, world, i, c->layout, 0);
        move_rows(ring.dk.t.data, j->dk, c->b, 1, c->s, j->n, kr, world, i, c->layout, 0);
        move_rows(ring.dv.t.data, j->dv, c->b, 1, c->s, j->n, kr, world, i, c->layout, 0);
    }
    if (ok) {
        const double scale = 1.0 / sqrt((double)c->d);
        const tk_grad_ref gr = {&ref.q.t,    &ref.k.t,  &ref.o.t,  &ref.lse.t,
                                &ref.dout.t, &ref.dq.t, &ref.dk.t, &ref.dv.t};
        const tk_grad_slack x = tk_grad_extra(&gr, c->d, scale, c->s * (int64_t)(c->hq / c->hk));
        ok &= judge("O", &ring.o, &w.o, &ref.o, c->dt, 0);
        ok &= judge("LSE", &ring.lse, &w.lse, &ref.lse, c->dt, 0);
        ok &= judge("dQ", &ring.dq, &w.dq, &ref.dq, c->dt, x.dq);
        ok &= judge("dK", &ring.dk, &w.dk, &ref.dk, c->dt, x.dk);
        ok &= judge("dV", &ring.dv, &w.dv, &ref.dv, c->dt, x.dv);
    }
    for (int i = 0; i < world; i++) {
        job *j = &jobs[i];
        void *b[] = {j->q, j->k, j->v, j->dout, j->out, j->lse, j->dq, j->dk, j->dv};
        for (size_t k = 0; k < sizeof b / sizeof *b; k++) free(b[k]);
    }
    free_whole(&w);
    free_whole(&ref);
    free_whole(&ring);
    return ok;
}

/* What the calls refuse on a real communicator (world 1 on GPU 0): each status and that the
   message names the reason. */
static int refusals(void *comm) {
    int ok = 1;
    cudaSetDevice(0);
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CUDA) != FA_OK) return 0;
    const int64_t S = 16, H = 2, D = 64;
    void *buf = dev_alloc((size_t)(S * H * D * 2) * 5 + (size_t)(H * S) * 4, NULL, 1);
    char *b = buf;
    const size_t t = (size_t)(S * H * D * 2);
    fa_tensor q = fa_tensor_bshd(b, FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, S, H, D);
    fa_tensor k = fa_tensor_bshd(b + t, FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, S, H, D);
    fa_tensor v = fa_tensor_bshd(b + 2 * t, FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, S, H, D);
    fa_tensor o = fa_tensor_bshd(b + 3 * t, FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, S, H, D);
    fa_tensor l = fa_tensor_3d(b + 5 * t, FA_DTYPE_F32, FA_DEVICE_CUDA, 1, H, S);
    fa_tensor short_q = fa_tensor_bshd(b, FA_DTYPE_BF16, FA_DEVICE_CUDA, 1, S - 1, H, D);
    struct {
        const char *what, *word;
        fa_status want;
        int64_t seqlen;
        int window, softcap, shortq;
    } cases[] = {
        {"a window", "window", FA_ERR_UNSUPPORTED, S, 1, 0, 0},
        {"softcap", "softcap", FA_ERR_UNSUPPORTED, S, 0, 1, 0},
        {"seqlen past the shard", "holds", FA_ERR_SHAPE, S + 1, 0, 0, 0},
        {"q shorter than k", "q", FA_ERR_SHAPE, S, 0, 0, 1},
        {"the call itself", "", FA_OK, S, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fa_params p = fa_params_default();
        p.causal = 1;
        if (cases[i].window) p.window_left = 4;
        if (cases[i].softcap) p.softcap = 30.0f;
        fa_cp_args a = fa_cp_args_default();
        a.q = cases[i].shortq ? &short_q : &q;
        a.k = &k;
        a.v = &v;
        a.seqlen = cases[i].seqlen;
        a.p = &p;
        a.out = &o;
        a.lse = &l;
        const fa_status st = fa_cp_fwd(ctx, comm, &a);
        const int good = st == cases[i].want && strstr(fa_last_error(ctx), cases[i].word);
        printf("  refusal, %s: %s: %s%s\n", cases[i].what, fa_status_string(st),
               fa_last_error(ctx), good ? "" : "  FAIL");
        ok &= good;
        if (st == FA_OK) {
            const fa_selection *sel = fa_last_selection(ctx);
            const int named = sel && !strncmp(sel->kernel, "cp_ring1_", 9);
            printf("  selection: %s%s\n", sel ? sel->kernel : "(none)", named ? "" : "  FAIL");
            ok &= named;
        }
    }
    ok &= cudaDeviceSynchronize() == cudaSuccess;
    cudaFree(buf);
    fa_context_destroy(ctx);
    return ok;
}

static int run_world(int world, uint64_t seed) {
    int devs[8];
    void *comms[8] = {0};
    for (int i = 0; i < world; i++) devs[i] = i;
    const int r = tk_nccl_init_all(comms, world, devs);
    if (r != 0) {
        printf("world %d: ncclCommInitAll failed: %s\n", world, tk_nccl_error(r));
        return 0;
    }
    int fails = 0;
    if (world == 1 && !refusals(comms[0])) fails++;
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        const cp_case *c = &k_cases[i];
        printf("world %d: b%d S%lld h%d/%d d%d %s %s %s\n", world, c->b, (long long)c->s, c->hq,
               c->hk, c->d, fa_dtype_name(c->dt), c->causal ? "causal" : "full",
               c->layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous");
        set_phase("world %d case %zu", world, i);
        if (!run_case(c, world, devs, comms, seed + i)) fails++;
    }
    set_phase("world %d: destroying the communicators", world);
    tk_nccl_destroy_all(comms, world);
    return fails == 0;
}

int main(void) {
    tk_nccl_one_process();
    if (!fa_has_cuda()) {
        printf("SKIP: this build has no CUDA backend\n");
        return SKIP;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return SKIP;
    }
    char why[512];
    if (!tk_nccl_load(why, sizeof why)) {
        printf("SKIP: no NCCL (%s); set FLASHATTN_NCCL_LIBRARY to libnccl.so.2\n", why);
        return SKIP;
    }
    const char *cap = getenv("CP_WORLD");
    int world = ndev > 8 ? 8 : ndev;
    if (cap && atoi(cap) >= 1 && atoi(cap) < world) world = atoi(cap);
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line out before a watchdog exit */
    static int limit = 180;
    const char *lim = getenv("CP_TIMEOUT");
    if (lim && atoi(lim) > 0) limit = atoi(lim);
    pthread_t dog;
    pthread_create(&dog, NULL, watchdog, &limit);
    pthread_detach(dog);
    const uint64_t seed = tk_seed();
    printf("seed 0x%llx, %d GPU(s) visible\n", (unsigned long long)seed, ndev);
    int ok = run_world(1, seed);
    if (world >= 2) ok &= run_world(world, seed);
    else printf("one GPU: the world of n > 1 needs two or more GPUs (not run)\n");
    printf(ok ? "test_cp: all passed\n" : "test_cp: FAILED\n");
    return ok ? 0 : 1;
}
