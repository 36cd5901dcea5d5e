/*
 * bench_run.c — the sweep of `flashattn bench`. Inputs are random normal values (never zeros),
 * drawn once per dtype into pools large enough for the biggest configuration, and every
 * configuration views them with its own shape: refilling gigabytes per configuration would
 * cost more than timing it. Each configuration rotates through several input sets, so that a
 * call never finds its operands in a cache the previous call warmed. Warm-up calls first,
 * then the median of enough timed calls (a count and a time floor, a time cap).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { R_Q, R_K, R_V, R_O, R_LSE, R_DOUT, R_DQ, R_DK, R_DV, R_N };

typedef struct shape {
    int64_t B, H, Hkv, d, sq, sk;
    int varlen; /* THD tensors of sq (= sk) tokens in B packed sequences */
} shape;

/* One pool per tensor role; set s of a configuration starts s * padded(n) elements in. */
typedef struct pool {
    bench_buf buf[R_N];
    size_t cap[R_N]; /* elements */
    fa_dtype dt;
} pool;

/* The tensors of one input set of one configuration. */
typedef struct views {
    fa_tensor t[R_N];
} views;

static int role_is_bwd(int r) { return r >= R_DOUT; }

static size_t role_size(int r, fa_dtype dt) { return r == R_LSE ? sizeof(float) : fa_dtype_size(dt); }

/* Sets start on 256-byte boundaries, well past the 16 bytes the kernels need. */
static size_t padded(size_t n) { return (n + 127) & ~(size_t)127; }

/* The shape of one configuration; on a bad combination the fields that could not be derived
   are 0 and err says why. */
static int shape_of(const bench_cfg *cfg, int64_t d, int64_t sk, shape *s, char *err,
                    size_t len) {
    int bad = 0;
    s->B = cfg->batch;
    s->H = cfg->heads;
    s->Hkv = cfg->heads_kv;
    s->d = d;
    s->sk = sk;
    s->sq = cfg->seqlen_q ? cfg->seqlen_q : sk;
    s->varlen = cfg->nvarlen > 0;
    if (s->varlen) s->B = cfg->nvarlen; /* sk is the lengths' total (cmd_bench.c) */
    if (cfg->model_dim > 0) {
        s->H = s->Hkv = cfg->model_dim % d ? 0 : cfg->model_dim / d;
        if (!s->H) bad = snprintf(err, len, "--model-dim %lld is not a multiple of head dim %lld",
                                  (long long)cfg->model_dim, (long long)d);
    }
    if (cfg->tokens > 0 && !s->varlen) {
        s->B = cfg->tokens % sk ? 0 : cfg->tokens / sk;
        if (!s->B) bad = snprintf(err, len, "--tokens %lld is not a multiple of seqlen %lld",
                                  (long long)cfg->tokens, (long long)sk);
    }
    return bad ? -1 : 0;
}

static void elems(const shape *s, size_t n[R_N]) {
    const int64_t rows_b = s->varlen ? 1 : s->B; /* packed: the tokens are all the rows */
    size_t nq = (size_t)(rows_b * s->sq * s->H * s->d), nk = (size_t)(rows_b * s->sk * s->Hkv * s->d);
    n[R_Q] = n[R_O] = n[R_DOUT] = n[R_DQ] = nq;
    n[R_K] = n[R_V] = n[R_DK] = n[R_DV] = nk;
    n[R_LSE] = (size_t)(rows_b * s->H * s->sq);
}

static int sets_for(const bench_cfg *cfg, const shape *s, fa_dtype dt) {
    size_t n[R_N], bytes = 0;
    elems(s, n);
    for (int r = 0; r < R_N; r++)
        if (cfg->bwd || !role_is_bwd(r)) bytes += n[r] * role_size(r, dt);
    if (cfg->rotate_bytes == 0 || bytes == 0) return 1;
    size_t sets = (cfg->rotate_bytes + bytes - 1) / bytes;
    return sets < 2 ? 2 : sets > 256 ? 256 : (int)sets;
}

static void pool_free(pool *pl) {
    for (int r = 0; r < R_N; r++) bench_buf_free(&pl->buf[r]);
}

/* Sizes the pools for every configuration of the sweep, allocates and fills the inputs. */
static int pool_make(pool *pl, const bench_cfg *cfg, fa_device dev, fa_dtype dt, tool_rng *rng) {
    memset(pl, 0, sizeof *pl);
    pl->dt = dt;
    char err[256];
    for (int hi = 0; hi < cfg->n_head_dims; hi++)
        for (int si = 0; si < cfg->nseq; si++) {
            shape s;
            if (shape_of(cfg, cfg->head_dims[hi], cfg->seqlens[si], &s, err, sizeof err)) continue;
            size_t n[R_N];
            elems(&s, n);
            size_t sets = (size_t)sets_for(cfg, &s, dt);
            for (int r = 0; r < R_N; r++) {
                size_t need = sets * padded(n[r]);
                if ((cfg->bwd || !role_is_bwd(r)) && need > pl->cap[r]) pl->cap[r] = need;
            }
        }
    double total = 0;
    for (int r = 0; r < R_N; r++) {
        if (!pl->cap[r]) continue;
        total += (double)(pl->cap[r] * role_size(r, dt));
        if (bench_buf_alloc(&pl->buf[r], dev, pl->cap[r] * role_size(r, dt)) != 0) {
            pool_free(pl);
            return -1;
        }
    }
    double t0 = tool_now();
    static const int inputs[] = {R_Q, R_K, R_V, R_DOUT};
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        int r = inputs[i];
        if (pl->cap[r] && bench_buf_fill(&pl->buf[r], dt, pl->cap[r], rng) != 0) {
            pool_free(pl);
            return -1;
        }
    }
    char b[32];
    printf("# %s inputs: %s of tensors, normal random values drawn in %.1f s\n",
           fa_dtype_name(dt), tool_fmt_bytes(b, sizeof b, total), tool_now() - t0);
    return 0;
}

static void view_set(views *v, const pool *pl, const shape *s, int set, fa_device dev) {
    size_t n[R_N];
    elems(s, n);
    void *p[R_N];
    for (int r = 0; r < R_N; r++)
        p[r] = pl->buf[r].ptr
                   ? (char *)pl->buf[r].ptr + (size_t)set * padded(n[r]) * role_size(r, pl->dt)
                   : NULL;
    fa_dtype dt = pl->dt;
    if (s->varlen) {
        static const int q_rows[] = {R_Q, R_O, R_DOUT, R_DQ}, k_rows[] = {R_K, R_V, R_DK, R_DV};
        for (int i = 0; i < 4; i++) {
            v->t[q_rows[i]] = fa_tensor_3d(p[q_rows[i]], dt, dev, s->sq, s->H, s->d);
            v->t[k_rows[i]] = fa_tensor_3d(p[k_rows[i]], dt, dev, s->sk, s->Hkv, s->d);
        }
        v->t[R_LSE] = fa_tensor_2d(p[R_LSE], FA_DTYPE_F32, dev, s->H, s->sq);
        return;
    }
    v->t[R_Q] = fa_tensor_bshd(p[R_Q], dt, dev, s->B, s->sq, s->H, s->d);
    v->t[R_K] = fa_tensor_bshd(p[R_K], dt, dev, s->B, s->sk, s->Hkv, s->d);
    v->t[R_V] = fa_tensor_bshd(p[R_V], dt, dev, s->B, s->sk, s->Hkv, s->d);
    v->t[R_O] = fa_tensor_bshd(p[R_O], dt, dev, s->B, s->sq, s->H, s->d);
    v->t[R_LSE] = fa_tensor_3d(p[R_LSE], FA_DTYPE_F32, dev, s->B, s->H, s->sq);
    v->t[R_DOUT] = fa_tensor_bshd(p[R_DOUT], dt, dev, s->B, s->sq, s->H, s->d);
    v->t[R_DQ] = fa_tensor_bshd(p[R_DQ], dt, dev, s->B, s->sq, s->H, s->d);
    v->t[R_DK] = fa_tensor_bshd(p[R_DK], dt, dev, s->B, s->sk, s->Hkv, s->d);
    v->t[R_DV] = fa_tensor_bshd(p[R_DV], dt, dev, s->B, s->sk, s->Hkv, s->d);
}

/* Forward FLOPs of one configuration: per sequence for a packed batch. */
static double config_flops(const bench_cfg *cfg, const shape *s, int causal) {
    if (!s->varlen)
        return bench_fwd_flops(s->B, s->H, s->d, s->sq, s->sk, causal, cfg->window_left,
                               cfg->window_right);
    double f = 0;
    for (int i = 0; i < cfg->nvarlen; i++)
        f += bench_fwd_flops(1, s->H, s->d, cfg->varlen[i], cfg->varlen[i], causal,
                             cfg->window_left, cfg->window_right);
    return f;
}

/* The packed batch's prefix sums where the tensors live, and its params; 0 or -1. */
static int varlen_setup(const bench_cfg *cfg, fa_device dev, bench_buf *cu, fa_params *p) {
    int32_t host[BENCH_MAX_VARLEN + 1];
    int64_t longest = 0;
    host[0] = 0;
    for (int i = 0; i < cfg->nvarlen; i++) {
        host[i + 1] = host[i] + (int32_t)cfg->varlen[i];
        if (cfg->varlen[i] > longest) longest = cfg->varlen[i];
    }
    const size_t bytes = sizeof(int32_t) * (size_t)(cfg->nvarlen + 1);
    if (bench_buf_alloc(cu, dev, bytes) != 0 || bench_buf_upload(cu, 0, host, bytes) != 0)
        return -1;
    p->cu_seqlens_q = p->cu_seqlens_k = cu->ptr;
    p->batch = cfg->nvarlen;
    p->max_seqlen_q = p->max_seqlen_k = longest;
    return 0;
}

static fa_status call(fa_context *ctx, int bwd, views *v, const fa_params *p) {
    fa_tensor *t = v->t;
    if (!bwd) return fa_fwd(ctx, &t[R_Q], &t[R_K], &t[R_V], p, &t[R_O], &t[R_LSE]);
    return fa_bwd(ctx, &t[R_Q], &t[R_K], &t[R_V], &t[R_O], &t[R_DOUT], &t[R_LSE], p, &t[R_DQ],
                  &t[R_DK], &t[R_DV]);
}

static double peak_for(bench_peaks *pc, int threads) {
    for (int i = 0; i < pc->n; i++)
        if (pc->threads[i] == threads) return pc->gflops[i];
    double g = bench_fma_peak(threads, &pc->isa);
    if (pc->n < 64) {
        pc->threads[pc->n] = threads;
        pc->gflops[pc->n++] = g;
    }
    return g;
}

static void print_header(int gpu) {
    printf("%-3s %-4s %3s %7s %4s %7s %7s %-9s %4s %4s %10s %10s %9s %6s  %s\n", "op", "type",
           "B", "H/Hkv", "d", "Nq", "Nk", "mask", gpu ? "reps" : "thr", gpu ? "sets" : "reps",
           "median", "min", gpu ? "TFLOP/s" : "GFLOP/s", "%peak", "kernel");
}

static void print_row(const bench_row *r, int gpu) {
    char hh[24], mask[24], med[24], mn[24], pk[16];
    snprintf(hh, sizeof hh, "%lld/%lld", (long long)r->heads, (long long)r->heads_kv);
    if (r->window_left >= 0 || (r->window_right >= 0 && !r->causal))
        snprintf(mask, sizeof mask, "win%lld,%lld", (long long)r->window_left,
                 (long long)(r->causal ? 0 : r->window_right));
    else
        snprintf(mask, sizeof mask, "%s", r->causal ? "causal" : "none");
    if (r->varlen) snprintf(mask + strlen(mask), sizeof mask - strlen(mask), "+vl");
    printf("%-3s %-4s %3lld %7s %4lld %7lld %7lld %-9s ", r->op, fa_dtype_name(r->dtype),
           (long long)r->batch, hh, (long long)r->head_dim, (long long)r->seqlen_q,
           (long long)r->seqlen_k, mask);
    if (r->status != FA_OK) {
        printf("error: %s\n", r->error);
        return;
    }
    if (r->peak_gflops > 0)
        snprintf(pk, sizeof pk, "%5.1f%%", 100 * r->gflops / r->peak_gflops);
    else
        snprintf(pk, sizeof pk, "-");
    printf("%4d %4d %10s %10s %9.1f %6s  %s", gpu ? r->reps : r->threads, gpu ? r->sets : r->reps,
           tool_fmt_seconds(med, sizeof med, r->median_s),
           tool_fmt_seconds(mn, sizeof mn, r->min_s), gpu ? r->gflops * 1e-3 : r->gflops, pk,
           r->kernel);
    if (r->tile_q) printf(" %dx%d", r->tile_q, r->tile_k);
    if (r->reason[0]) printf(" (%s)", r->reason);
    printf("\n");
}

static void set_error(fa_context *ctx, bench_row *row, fa_status st, const char *what) {
    row->status = st;
    snprintf(row->error, sizeof row->error, "%s%s%s%s", what, fa_status_string(st),
             *fa_last_error(ctx) ? ": " : "", fa_last_error(ctx));
}

int bench_rep_count(const bench_cfg *cfg, double est) {
    double reps = cfg->reps;
    if (est > 0 && cfg->min_time > 0 && ceil(cfg->min_time / est) > reps)
        reps = ceil(cfg->min_time / est);
    if (est > 0 && cfg->max_time > 0 && reps * est > cfg->max_time) {
        reps = floor(cfg->max_time / est);
        if (reps < 3) reps = 3;
    }
    if (reps > BENCH_MAX_REPS) reps = BENCH_MAX_REPS;
    return reps < 1 ? 1 : (int)reps;
}

/* Times one op of one configuration into row; returns 0 when the calls succeeded. */
static int time_op(fa_context *ctx, const bench_cfg *cfg, int bwd, const pool *pl,
                   const shape *s, int nsets, const fa_params *p, fa_device dev, bench_row *row,
                   bench_peaks *pc, bench_timer *tm) {
    static double times[BENCH_MAX_REPS];
    double span = 0;
    views v;
    fa_status st = FA_OK;
    /* the backward of every set needs that set's own forward output and LSE */
    for (int set = 0; bwd && set < nsets && st == FA_OK; set++) {
        view_set(&v, pl, s, set, dev);
        st = call(ctx, 0, &v, p);
    }
    if (st != FA_OK) {
        set_error(ctx, row, st, "forward before backward: ");
        return -1;
    }
    if (cfg->pause > 0) {
        if (bench_device_sync(dev) != 0) {
            row->status = FA_ERR_CUDA;
            snprintf(row->error, sizeof row->error, "device synchronize before the pause failed");
            return -1;
        }
        tool_sleep(cfg->pause);
    }
    int call_no = 0;
    double est = 0;
    for (int i = 0; i < cfg->warmup && st == FA_OK; i++, call_no++) {
        view_set(&v, pl, s, call_no % nsets, dev);
        bench_timer_start(tm, i);
        st = call(ctx, bwd, &v, p);
        bench_timer_stop(tm, i);
    }
    if (st != FA_OK) {
        set_error(ctx, row, st, "");
        return -1;
    }
    if (cfg->warmup > 0) {
        if (bench_timer_read(tm, cfg->warmup, times, &span, row->error,
                             sizeof row->error) != 0) {
            row->status = FA_ERR_CUDA;
            return -1;
        }
        est = times[0];
        for (int i = 1; i < cfg->warmup; i++)
            if (times[i] < est) est = times[i];
    }
    int reps = bench_rep_count(cfg, est), done = 0;
    for (; done < reps && st == FA_OK; done++, call_no++) {
        view_set(&v, pl, s, call_no % nsets, dev);
        bench_timer_start(tm, done);
        st = call(ctx, bwd, &v, p);
        bench_timer_stop(tm, done);
    }
    if (st != FA_OK) {
        set_error(ctx, row, st, "");
        return -1;
    }
    const fa_selection *sel = fa_last_selection(ctx);
    if (sel) {
        snprintf(row->kernel, sizeof row->kernel, "%s", sel->kernel);
        snprintf(row->reason, sizeof row->reason, "%s", sel->reason);
        row->threads = sel->threads;
        row->tile_q = sel->tile_q;
        row->tile_k = sel->tile_k;
        row->num_splits = sel->num_splits;
        row->workspace_bytes = sel->workspace_bytes;
    }
    if (bench_timer_read(tm, reps, times, &span, row->error, sizeof row->error) != 0) {
        row->status = FA_ERR_CUDA;
        return -1;
    }
    row->status = FA_OK;
    row->reps = reps;
    row->sets = nsets;
    row->min_s = row->max_s = times[0];
    for (int i = 1; i < reps; i++) {
        if (times[i] < row->min_s) row->min_s = times[i];
        if (times[i] > row->max_s) row->max_s = times[i];
    }
    /* FLASHATTN_BENCH_TIMES=1: every timed call's time in call order, for a row whose median
       moves between runs (is it bimodal, and does it follow the input set?) */
    if (getenv("FLASHATTN_BENCH_TIMES")) {
        fprintf(stderr, "# times (us, in call order after the warm-up; %d input sets in turn):", nsets);
        for (int i = 0; i < reps; i++) fprintf(stderr, " %.1f", times[i] * 1e6);
        fprintf(stderr, "\n");
    }
    row->median_s = tool_median(times, reps);
    row->span_mean_s = span;
    row->gflops = row->flops / row->median_s * 1e-9;
    if (cfg->measure_peak && dev == FA_DEVICE_CPU) row->peak_gflops = peak_for(pc, row->threads);
    return 0;
}

/* Refuses clearly when the CUDA path cannot run; prints what it will run on otherwise. */
int bench_open_backend(bench_cfg *cfg, fa_context **ctx, char *fatal, size_t len) {
    fa_status st = fa_context_create(ctx, cfg->backend);
    if (st != FA_OK) {
        snprintf(fatal, len, "the %s backend is not available: %s%s%s",
                 cfg->backend == FA_BACKEND_CUDA ? "CUDA" : "CPU", fa_status_string(st),
                 *fa_last_error(NULL) ? ": " : "", fa_last_error(NULL));
        return -1;
    }
    if (cfg->backend != FA_BACKEND_CUDA) return 0;
    bench_gpu g;
    char err[256];
    if (bench_gpu_info(&g, err, sizeof err) != 0) {
        snprintf(fatal, len, "the CUDA backend is not usable from this command: %s", err);
        fa_context_destroy(*ctx);
        *ctx = NULL;
        return -1;
    }
    if (cfg->rotate_bytes == (size_t)-1) /* auto: four times the L2, so no set survives there */
        cfg->rotate_bytes = 4 * (g.l2_bytes ? g.l2_bytes : ((size_t)50 << 20));
    char l2[32], rot[32];
    printf("# device: %s, compute capability %d.%d, %d SMs, L2 %s; timing: CUDA events around "
           "each call, median; inputs rotated over >= 2 sets of >= %s together\n",
           g.name, g.cc_major, g.cc_minor, g.sms, tool_fmt_bytes(l2, sizeof l2, (double)g.l2_bytes),
           tool_fmt_bytes(rot, sizeof rot, (double)cfg->rotate_bytes));
    return 0;
}

int bench_run(bench_cfg *cfg, bench_row **rows_out, int *nrows_out, bench_peaks *pc,
              char *fatal, size_t fatal_len) {
    fa_device dev = cfg->backend == FA_BACKEND_CUDA ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
    int gpu = dev == FA_DEVICE_CUDA;
    fa_context *ctx = NULL;
    if (cfg->rotate_bytes == (size_t)-1 && !gpu) cfg->rotate_bytes = 0;
    if (bench_open_backend(cfg, &ctx, fatal, fatal_len) != 0) return -1;
    int cap = cfg->ndtypes * cfg->n_head_dims * cfg->nmasks * cfg->nthreads * cfg->nseq * 2;
    bench_row *rows = calloc((size_t)cap, sizeof *rows);
    bench_timer *tm = bench_timer_create(dev, BENCH_MAX_REPS);
    if (!rows || !tm) {
        snprintf(fatal, fatal_len, "out of memory (or no CUDA events) for the timing records");
        free(rows);
        bench_timer_destroy(tm);
        fa_context_destroy(ctx);
        return -1;
    }
    int n = 0, failed = 0;
    tool_rng rng = tool_rng_seed(cfg->seed);
    fa_params p = fa_params_default();
    p.window_left = cfg->window_left;
    p.window_right = cfg->window_right;
    bench_buf cu = {0};
    if (cfg->nvarlen && varlen_setup(cfg, dev, &cu, &p) != 0) {
        snprintf(fatal, fatal_len, "cannot place the varlen prefix sums");
        free(rows);
        bench_timer_destroy(tm);
        fa_context_destroy(ctx);
        return -1;
    }
    for (int di = 0; di < cfg->ndtypes; di++) {
        fa_dtype dt = cfg->dtypes[di];
        pool pl;
        if (pool_make(&pl, cfg, dev, dt, &rng) != 0) {
            fprintf(stderr, "flashattn bench: cannot allocate or fill the %s inputs; skipped\n",
                    fa_dtype_name(dt));
            failed++;
            continue;
        }
        print_header(gpu);
        for (int hi = 0; hi < cfg->n_head_dims; hi++)
            for (int mi = 0; mi < cfg->nmasks; mi++)
                for (int ti = 0; ti < cfg->nthreads; ti++)
                    for (int si = 0; si < cfg->nseq; si++) {
                        int64_t d = cfg->head_dims[hi];
                        p.causal = cfg->masks[mi];
                        fa_status st = fa_context_set_threads(ctx, (int)cfg->threads[ti]);
                        if (st != FA_OK) {
                            tool_fail(ctx, st, "bench");
                            failed++;
                            continue;
                        }
                        shape s;
                        char err[256] = "";
                        int bad_shape =
                            shape_of(cfg, d, cfg->seqlens[si], &s, err, sizeof err) != 0;
                        int nsets = bad_shape ? 0 : sets_for(cfg, &s, dt);
                        double fwd_flops = bad_shape ? 0 : config_flops(cfg, &s, p.causal);
                        for (int bwd = 0; bwd < 2; bwd++) {
                            if (bwd ? !cfg->bwd : !cfg->fwd) continue;
                            bench_row *r = &rows[n++];
                            snprintf(r->op, sizeof r->op, "%s", bwd ? "bwd" : "fwd");
                            r->dtype = dt;
                            r->batch = s.B;
                            r->heads = s.H;
                            r->heads_kv = s.Hkv;
                            r->head_dim = d;
                            r->seqlen_k = cfg->seqlens[si];
                            r->seqlen_q = cfg->seqlen_q ? cfg->seqlen_q : r->seqlen_k;
                            r->causal = p.causal;
                            r->varlen = cfg->nvarlen > 0;
                            r->window_left = cfg->window_left;
                            r->window_right = cfg->window_right;
                            r->threads_asked = (int)cfg->threads[ti];
                            r->flops = bwd ? 2.5 * fwd_flops : fwd_flops;
                            if (bad_shape) {
                                r->status = FA_ERR_SHAPE;
                                snprintf(r->error, sizeof r->error, "%s", err);
                                failed++;
                            } else if (time_op(ctx, cfg, bwd, &pl, &s, nsets, &p, dev, r, pc,
                                               tm) != 0) {
                                failed++;
                            }
                            print_row(r, gpu);
                            fflush(stdout);
                            if (cfg->json_path) {
                                double load[2] = {cfg->load_start, tool_loadavg()};
                                bench_write_json(cfg->json_path, cfg, rows, n, pc, load, NULL);
                            }
                        }
                    }
        pool_free(&pl);
    }
    bench_buf_free(&cu);
    bench_timer_destroy(tm);
    fa_context_destroy(ctx);
    *rows_out = rows;
    *nrows_out = n;
    return failed;
}
