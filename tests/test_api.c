/*
 * test_api.c — the small public pieces: status strings, version, dtype helpers, tensor and
 * params constructors, context setters, user workspace, the kernel selection record, the
 * kernel list, and FLASHATTN_LOG / FLASHATTN_NUM_THREADS from the environment.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <unistd.h>
#endif

#include "sweep.h"

static void status_strings(void **state) {
    (void)state;
    const char *seen[FA_ERR_BUSY + 1];
    for (int s = FA_OK; s <= FA_ERR_BUSY; s++) {
        const char *str = fa_status_string((fa_status)s);
        assert_non_null(str);
        assert_true(strlen(str) > 0);
        for (int t = 0; t < s; t++)
            if (strcmp(seen[t], str) == 0) fail_msg("statuses %d and %d share \"%s\"", t, s, str);
        seen[s] = str;
    }
    assert_non_null(fa_status_string((fa_status)999));
    assert_non_null(fa_status_string((fa_status)-1));
}

static void version_and_dtypes(void **state) {
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    assert_string_equal(fa_version(), want);
    struct {
        fa_dtype dt;
        const char *name;
        size_t size;
    } d[] = {{FA_DTYPE_F32, "f32", 4}, {FA_DTYPE_F16, "f16", 2}, {FA_DTYPE_BF16, "bf16", 2},
             {FA_DTYPE_F8_E4M3, "f8e4m3", 1}, {FA_DTYPE_F64, "f64", 8},
             {FA_DTYPE_F8_E5M2, "f8e5m2", 1}};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) {
        assert_string_equal(fa_dtype_name(d[i].dt), d[i].name);
        assert_int_equal(fa_dtype_size(d[i].dt), d[i].size);
    }
    assert_string_equal(fa_dtype_name((fa_dtype)42), "?");
    assert_int_equal(fa_dtype_size((fa_dtype)42), 0);
}

static void tensor_constructors(void **state) {
    (void)state;
    float buf[1];
    fa_tensor t = fa_tensor_bshd(buf, FA_DTYPE_BF16, FA_DEVICE_CUDA, 2, 3, 5, 7);
    assert_ptr_equal(t.data, buf);
    assert_int_equal(t.dtype, FA_DTYPE_BF16);
    assert_int_equal(t.device, FA_DEVICE_CUDA);
    assert_int_equal(t.ndim, 4);
    int64_t shape[4] = {2, 3, 5, 7}, stride[4] = {105, 35, 7, 1};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(t.shape[i], shape[i]);
        assert_int_equal(t.stride[i], stride[i]);
    }
    t = fa_tensor_3d(buf, FA_DTYPE_F32, FA_DEVICE_CPU, 11, 4, 9);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.shape[0], 11);
    assert_int_equal(t.shape[2], 9);
    assert_int_equal(t.stride[0], 36);
    assert_int_equal(t.stride[1], 9);
    assert_int_equal(t.stride[2], 1);
    t = fa_tensor_2d(buf, FA_DTYPE_F32, FA_DEVICE_CPU, 6, 13);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[1], 13);
    assert_int_equal(t.stride[0], 13);
    assert_int_equal(t.stride[1], 1);
}

static void params_default(void **state) {
    (void)state;
    fa_params p = fa_params_default();
    assert_true(p.softmax_scale == 0.0f);
    assert_int_equal(p.causal, 0);
    assert_int_equal(p.window_left, -1);
    assert_int_equal(p.window_right, -1);
    assert_true(p.softcap == 0.0f);
    assert_null(p.alibi_slopes);
    assert_int_equal(p.alibi_batch_stride, 0);
    assert_null(p.cu_seqlens_q);
    assert_null(p.cu_seqlens_k);
    assert_int_equal(p.batch, 0);
    assert_int_equal(p.max_seqlen_q, 0);
    assert_int_equal(p.max_seqlen_k, 0);
    assert_int_equal(p.deterministic, 0);
}

/* A small valid problem (f32, GQA 4/2) with its tensors. */
typedef struct prob {
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
} prob;

static void prob_init(prob *p, fa_dtype dt) {
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t qs[4] = {2, 33, 4, 40}, ks[4] = {2, 50, 2, 40}, ls[3] = {2, 4, 33};
    tk_buf *q[] = {&p->q, &p->o, &p->dout, &p->dq}, *k[] = {&p->k, &p->v, &p->dk, &p->dv};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tk_buf_alloc(q[i], dt, 4, qs, 0, &r), 0);
        assert_int_equal(tk_buf_alloc(k[i], dt, 4, ks, 0, &r), 0);
    }
    assert_int_equal(tk_buf_alloc(&p->lse, dt == FA_DTYPE_F64 ? dt : FA_DTYPE_F32, 3, ls, 0, &r),
                     0);
    tk_fill_normal(&p->q, &r, 1);
    tk_fill_normal(&p->k, &r, 1);
    tk_fill_normal(&p->v, &r, 1);
    tk_fill_normal(&p->dout, &r, 1);
}

static void prob_free(prob *p) {
    tk_buf *all[] = {&p->q, &p->k, &p->v, &p->o, &p->lse, &p->dout, &p->dq, &p->dk, &p->dv};
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
}

static fa_status fwd(fa_context *c, prob *p, const fa_params *prm) {
    return fa_fwd(c, &p->q.t, &p->k.t, &p->v.t, prm, &p->o.t, &p->lse.t);
}

static fa_status bwd(fa_context *c, prob *p, const fa_params *prm) {
    return fa_bwd(c, &p->q.t, &p->k.t, &p->v.t, &p->o.t, &p->dout.t, &p->lse.t, prm, &p->dq.t,
                  &p->dk.t, &p->dv.t);
}

static int kernel_listed(const char *name) {
    for (int i = 0; i < fa_kernel_count(); i++)
        if (strcmp(fa_kernel_name(i), name) == 0) return 1;
    return 0;
}

static void context_setters(void **state) {
    (void)state;
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_AUTO), FA_OK);
    fa_context_destroy(c);
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_null(fa_last_selection(c));
    assert_string_equal(fa_last_error(c), "");
    assert_int_equal(fa_context_set_threads(c, 1), FA_OK);
    assert_int_equal(fa_context_set_threads(c, 0), FA_OK);
    assert_int_equal(fa_context_set_stream(c, NULL), FA_OK);
    assert_int_equal(fa_context_set_strict(c, 1), FA_OK);
    assert_int_equal(fa_context_set_strict(c, 0), FA_OK);
    assert_int_equal(fa_context_set_algo(c, FA_ALGO_NAIVE), FA_OK);
    assert_int_equal(fa_context_set_algo(c, FA_ALGO_PLAIN), FA_OK);
    assert_int_equal(fa_context_set_algo(c, FA_ALGO_AUTO), FA_OK);
    /* one thread asked for, one thread recorded */
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    assert_int_equal(fa_context_set_threads(c, 1), FA_OK);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    /* an error leaves a message; the next success clears it */
    fa_params bad = fa_params_default();
    bad.softmax_scale = -1;
    assert_int_equal(fwd(c, &p, &bad), FA_ERR_INVALID_ARGUMENT);
    assert_true(strlen(fa_last_error(c)) > 0);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    assert_string_equal(fa_last_error(c), "");
    prob_free(&p);
    fa_context_destroy(c);
}

static void selection_record(void **state) {
    (void)state;
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        fa_context *c;
        assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
        assert_int_equal(fa_context_set_strict(c, 1), FA_OK); /* plain CPU calls: no fallback */
        /* one thread: the backward's one-pass schedule (which every level's backward serves)
           whatever the machine's core count */
        assert_int_equal(fa_context_set_threads(c, 1), FA_OK);
        prob p;
        prob_init(&p, dts[i]);
        char want[64];
        size_t ws;
        assert_int_equal(fa_fwd_workspace_size(c, &p.q.t, &p.k.t, &p.v.t, NULL, &ws), FA_OK);
        assert_int_equal(fwd(c, &p, NULL), FA_OK);
        const fa_selection *s = fa_last_selection(c);
        assert_non_null(s);
        /* cpu_fwd_<isa level>_<dtype>_<tile_q>x<tile_k> */
        snprintf(want, sizeof want, "_%s_%dx%d", fa_dtype_name(dts[i]), s->tile_q, s->tile_k);
        assert_true(strncmp(s->kernel, "cpu_fwd_", 8) == 0);
        assert_true(strlen(s->kernel) > strlen(want) &&
                    strcmp(s->kernel + strlen(s->kernel) - strlen(want), want) == 0);
        assert_true(kernel_listed(s->kernel));
        assert_string_equal(s->backend, "cpu");
        assert_string_equal(s->op, "fwd");
        assert_true(s->tile_q > 0 && s->tile_k > 0);
        assert_true(s->threads >= 1);
        assert_true(s->num_splits >= 1);
        assert_true(s->workspace_bytes <= ws);
        assert_string_equal(s->reason, "");
        assert_int_equal(fa_bwd_workspace_size(c, &p.q.t, &p.k.t, &p.v.t, NULL, &ws), FA_OK);
        assert_int_equal(bwd(c, &p, NULL), FA_OK);
        s = fa_last_selection(c);
        /* cpu_bwd_<isa level>_<dtype>_<tile_q>x<tile_k> */
        snprintf(want, sizeof want, "_%s_%dx%d", fa_dtype_name(dts[i]), s->tile_q, s->tile_k);
        assert_true(strncmp(s->kernel, "cpu_bwd_", 8) == 0);
        assert_true(strlen(s->kernel) > strlen(want) &&
                    strcmp(s->kernel + strlen(s->kernel) - strlen(want), want) == 0);
        assert_true(kernel_listed(s->kernel));
        assert_string_equal(s->op, "bwd");
        assert_true(s->workspace_bytes <= ws);
        /* the plain baseline names itself and its precision */
        assert_int_equal(fa_context_set_algo(c, FA_ALGO_PLAIN), FA_OK);
        assert_int_equal(fwd(c, &p, NULL), FA_OK);
        s = fa_last_selection(c);
        assert_non_null(strstr(s->kernel, "plain"));
        assert_non_null(strstr(s->kernel, fa_dtype_name(dts[i])));
        assert_true(kernel_listed(s->kernel));
        assert_int_equal(s->tile_q, 0);
        prob_free(&p);
        fa_context_destroy(c);
    }
    /* the f64 reference */
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_algo(c, FA_ALGO_NAIVE), FA_OK);
    prob p;
    prob_init(&p, FA_DTYPE_F64);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    const fa_selection *s = fa_last_selection(c);
    assert_non_null(strstr(s->kernel, "naive"));
    assert_non_null(strstr(s->kernel, "f64"));
    assert_string_equal(s->op, "fwd");
    assert_true(kernel_listed(s->kernel));
    assert_int_equal(bwd(c, &p, NULL), FA_OK);
    s = fa_last_selection(c);
    assert_string_equal(s->op, "bwd");
    assert_non_null(strstr(s->kernel, "naive"));
    prob_free(&p);
    fa_context_destroy(c);
    /* introspection */
    assert_non_null(fa_cpu_features());
    assert_true(fa_has_cuda() == 0 || fa_has_cuda() == 1);
    assert_true(fa_kernel_count() > 0);
    for (int i = 0; i < fa_kernel_count(); i++) assert_non_null(fa_kernel_name(i));
    assert_null(fa_kernel_name(fa_kernel_count()));
    assert_null(fa_kernel_name(-1));
}

/* Calls under 2^20 FLOPs run on the calling thread without a team (src/cpu/team.h), and the
   record says so; a larger one gets the context's threads. The context asks for 2 threads so
   that the difference shows on any machine. */
static void small_calls_one_thread(void **state) {
    (void)state;
    enum { S = 128, H = 2, D = 64 }; /* the large call: 4 * 2 * 128 * 128 * 64 = 8.4 MFLOP */
    float *buf = calloc(10 * S * H * D, sizeof(float));
    assert_non_null(buf);
    for (int i = 0; i < 10 * S * H * D; i++) buf[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
    float *q = buf, *k = buf + S * H * D, *v = buf + 2 * S * H * D, *o = buf + 3 * S * H * D;
    float *dq = buf + 4 * S * H * D, *dk = buf + 5 * S * H * D, *dv = buf + 6 * S * H * D;
    float *kn = buf + 7 * S * H * D, *vn = buf + 8 * S * H * D, *lse = buf + 9 * S * H * D;
    const fa_device cpu = FA_DEVICE_CPU;
    const fa_dtype f32 = FA_DTYPE_F32;
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_threads(c, 2), FA_OK);
    /* 1x1x1x8: forward, backward */
    fa_tensor tq = fa_tensor_bshd(q, f32, cpu, 1, 1, 1, 8);
    fa_tensor tk = fa_tensor_bshd(k, f32, cpu, 1, 1, 1, 8);
    fa_tensor tv = fa_tensor_bshd(v, f32, cpu, 1, 1, 1, 8);
    fa_tensor to = fa_tensor_bshd(o, f32, cpu, 1, 1, 1, 8);
    fa_tensor tl = fa_tensor_3d(lse, f32, cpu, 1, 1, 1);
    assert_int_equal(fa_fwd(c, &tq, &tk, &tv, NULL, &to, &tl), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    fa_tensor tdq = fa_tensor_bshd(dq, f32, cpu, 1, 1, 1, 8);
    fa_tensor tdk = fa_tensor_bshd(dk, f32, cpu, 1, 1, 1, 8);
    fa_tensor tdv = fa_tensor_bshd(dv, f32, cpu, 1, 1, 1, 8);
    assert_int_equal(fa_bwd(c, &tq, &tk, &tv, &to, &to, &tl, NULL, &tdq, &tdk, &tdv), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    /* a decode step of a small model: H query heads over 1 kv head, d 64, 100 cached tokens
       and one appended (4 * 2 * 101 * 64 = 52 kFLOP) */
    int32_t seqlens[1] = {100};
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = fa_tensor_bshd(k, f32, cpu, 1, S, 1, D);
    cache.v = fa_tensor_bshd(v, f32, cpu, 1, S, 1, D);
    cache.seqlens = seqlens;
    fa_tensor dq1 = fa_tensor_bshd(q, f32, cpu, 1, 1, H, D);
    fa_tensor do1 = fa_tensor_bshd(o, f32, cpu, 1, 1, H, D);
    fa_tensor tkn = fa_tensor_bshd(kn, f32, cpu, 1, 1, 1, D);
    fa_tensor tvn = fa_tensor_bshd(vn, f32, cpu, 1, 1, 1, D);
    fa_tensor dl1 = fa_tensor_3d(lse, f32, cpu, 1, H, 1);
    assert_int_equal(fa_fwd_kvcache(c, &dq1, &cache, &tkn, &tvn, NULL, 0, &do1, &dl1), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    /* the merge of two such rows */
    fa_tensor parts[2] = {do1, dq1};
    fa_tensor plse[2] = {dl1, dl1};
    fa_tensor mo = fa_tensor_bshd(dq, f32, cpu, 1, 1, H, D);
    assert_int_equal(fa_merge_attn(c, 2, parts, plse, &mo, NULL), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    /* above the threshold: the context's 2 threads */
    fa_tensor bq = fa_tensor_bshd(q, f32, cpu, 1, S, H, D);
    fa_tensor bk = fa_tensor_bshd(k, f32, cpu, 1, S, H, D);
    fa_tensor bv = fa_tensor_bshd(v, f32, cpu, 1, S, H, D);
    fa_tensor bo = fa_tensor_bshd(o, f32, cpu, 1, S, H, D);
    fa_tensor bl = fa_tensor_3d(lse, f32, cpu, 1, H, S);
    assert_int_equal(fa_fwd(c, &bq, &bk, &bv, NULL, &bo, &bl), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 2);
    fa_context_destroy(c);
    free(buf);
}

/* A user workspace of exactly the reported size serves the call (and gives the same result
   as the context's own); a smaller one is refused; clearing it goes back to the context's. */
/* The CPU backward's two schedules (src/cpu/bwd_schedule.c): the record says when the slower
   two-pass one ran and why, and both give the same gradients up to rounding.
   FLASHATTN_CPU_BWD_SCHEDULE is read when a context is created: a context keeps the schedule
   of its creation after the variable goes. */
static void bwd_schedule_record(void **state) {
    (void)state;
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    const char *names[2] = {"one-pass", "two-pass"};
    tk_buf grads[2][3];
    for (int s = 0; s < 2; s++) {
        assert_int_equal(setenv("FLASHATTN_CPU_BWD_SCHEDULE", names[s], 1), 0);
        fa_context *cs;
        assert_int_equal(fa_context_create(&cs, FA_BACKEND_CPU), FA_OK);
        assert_int_equal(unsetenv("FLASHATTN_CPU_BWD_SCHEDULE"), 0);
        tk_poison(&p.dq);
        tk_poison(&p.dk);
        tk_poison(&p.dv);
        assert_int_equal(bwd(cs, &p, NULL), FA_OK);
        const fa_selection *sel = fa_last_selection(cs);
        assert_non_null(sel);
        if (s == 0)
            assert_string_equal(sel->reason, "");
        else
            assert_non_null(strstr(sel->reason, "two-pass"));
        const tk_buf *src[3] = {&p.dq, &p.dk, &p.dv};
        for (int g = 0; g < 3; g++) {
            tk_rng r;
            tk_rng_init(&r, 1);
            int64_t shape[4];
            for (int x = 0; x < 4; x++) shape[x] = src[g]->t.shape[x];
            assert_int_equal(tk_buf_alloc(&grads[s][g], FA_DTYPE_F32, 4, shape, 0, &r), 0);
            tk_copy(&grads[s][g], src[g]);
        }
        fa_context_destroy(cs);
    }
    for (int g = 0; g < 3; g++) {
        const tk_err e = tk_compare(&grads[0][g].t, &grads[1][g].t);
        assert_int_equal(e.nonfinite, 0);
        assert_true(e.max_abs <= 1e-5 * (e.ref_max > 1 ? e.ref_max : 1));
        tk_buf_free(&grads[0][g]);
        tk_buf_free(&grads[1][g]);
    }
    prob_free(&p);
    fa_context_destroy(c);
}

/* Strict mode refuses a fallback before writing anything: where the CPU has the amx level,
   its backward serves one-pass only, so a bf16 backward forced to two passes would fall back
   to the avx512 one. Without strict mode it runs and the record says why. */
static void strict_refuses_fallback(void **state) {
    (void)state;
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    prob p;
    prob_init(&p, FA_DTYPE_BF16);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    const int amx = strstr(fa_last_selection(c)->kernel, "_amx_") != NULL;
    fa_context_destroy(c);
    assert_int_equal(setenv("FLASHATTN_CPU_BWD_SCHEDULE", "two-pass", 1), 0);
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(unsetenv("FLASHATTN_CPU_BWD_SCHEDULE"), 0);
    assert_int_equal(fa_context_set_strict(c, 1), FA_OK);
    tk_poison(&p.dq);
    tk_poison(&p.dk);
    tk_poison(&p.dv);
    const fa_status st = bwd(c, &p, NULL);
    if (amx) {
        assert_int_equal(st, FA_ERR_UNSUPPORTED);
        assert_non_null(strstr(fa_last_error(c), "strict"));
        const tk_buf *grads[3] = {&p.dq, &p.dk, &p.dv};
        for (int g = 0; g < 3; g++) /* nothing written */
            for (size_t i = 0; i < grads[g]->bytes; i++)
                assert_int_equal(((const unsigned char *)grads[g]->base)[i], 0xff);
    } else {
        assert_int_equal(st, FA_OK); /* no level with a narrower backward: nothing to refuse */
    }
    assert_int_equal(fa_context_set_strict(c, 0), FA_OK);
    assert_int_equal(bwd(c, &p, NULL), FA_OK);
    if (amx) assert_non_null(strstr(fa_last_selection(c)->reason, "one-pass only"));
    prob_free(&p);
    fa_context_destroy(c);
}

/* FLASHATTN_CPU_F32_AMX=0 sends the amx level's fp32 forward and backward to the avx512 FMA
   kernels of contexts created while it is set, and the record says why (not a fallback: strict mode runs it);
   the gradients agree with the amx pair's up to rounding. Where the CPU has no amx level the
   switch changes nothing. */
static void f32_amx_switch(void **state) {
    (void)state;
    fa_context *c, *first;
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    char kernels[2][2][64];
    tk_buf dv[2];
    for (int off = 0; off < 2; off++) {
        if (off) assert_int_equal(setenv("FLASHATTN_CPU_F32_AMX", "0", 1), 0);
        assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
        assert_int_equal(fa_context_set_strict(c, 1), FA_OK);
        if (off) assert_int_equal(unsetenv("FLASHATTN_CPU_F32_AMX"), 0);
        else first = c;
        assert_int_equal(fwd(c, &p, NULL), FA_OK);
        snprintf(kernels[off][0], 64, "%s", fa_last_selection(c)->kernel);
        if (off && strstr(kernels[0][0], "_amx_"))
            assert_non_null(strstr(fa_last_selection(c)->reason, "FLASHATTN_CPU_F32_AMX=0"));
        assert_int_equal(bwd(c, &p, NULL), FA_OK);
        snprintf(kernels[off][1], 64, "%s", fa_last_selection(c)->kernel);
        if (off && strstr(kernels[0][1], "_amx_"))
            assert_non_null(strstr(fa_last_selection(c)->reason, "FLASHATTN_CPU_F32_AMX=0"));
        tk_rng r;
        tk_rng_init(&r, 1);
        int64_t shape[4];
        for (int x = 0; x < 4; x++) shape[x] = p.dv.t.shape[x];
        assert_int_equal(tk_buf_alloc(&dv[off], FA_DTYPE_F32, 4, shape, 0, &r), 0);
        tk_copy(&dv[off], &p.dv);
        if (off) fa_context_destroy(c);
    }
    c = first;
    for (int op = 0; op < 2; op++) {
        assert_null(strstr(kernels[1][op], "_amx_"));
        if (strstr(kernels[0][op], "_amx_"))
            assert_non_null(strstr(kernels[1][op], "_avx512_"));
        else
            assert_string_equal(kernels[0][op], kernels[1][op]);
    }
    const tk_err e = tk_compare(&dv[1].t, &dv[0].t);
    assert_int_equal(e.nonfinite, 0);
    assert_true(e.max_abs <= 1e-5 * (e.ref_max > 1 ? e.ref_max : 1));
    assert_int_equal(fwd(c, &p, NULL), FA_OK); /* the first context keeps its switch */
    assert_string_equal(fa_last_selection(c)->kernel, kernels[0][0]);
    tk_buf_free(&dv[0]);
    tk_buf_free(&dv[1]);
    prob_free(&p);
    fa_context_destroy(c);
}

static void user_workspace(void **state) {
    (void)state;
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    unsigned char *own = malloc(p.o.bytes);
    assert_non_null(own);
    memcpy(own, p.o.base, p.o.bytes);

    size_t need;
    assert_int_equal(fa_fwd_workspace_size(c, &p.q.t, &p.k.t, &p.v.t, NULL, &need), FA_OK);
    void *ws = malloc(need ? need : 1);
    assert_non_null(ws);
    assert_int_equal(fa_context_set_workspace(c, ws, need), FA_OK);
    tk_poison(&p.o);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    assert_memory_equal(own, p.o.base, p.o.bytes);
    if (need > 0) {
        assert_int_equal(fa_context_set_workspace(c, ws, need / 2), FA_OK);
        assert_int_equal(fwd(c, &p, NULL), FA_ERR_WORKSPACE);
        assert_true(strlen(fa_last_error(c)) > 0);
    }
    assert_int_equal(fa_context_set_workspace(c, NULL, 0), FA_OK);
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    /* the backward too */
    assert_int_equal(fa_bwd_workspace_size(c, &p.q.t, &p.k.t, &p.v.t, NULL, &need), FA_OK);
    void *wsb = malloc(need ? need : 1);
    assert_non_null(wsb);
    assert_int_equal(fa_context_set_workspace(c, wsb, need), FA_OK);
    assert_int_equal(bwd(c, &p, NULL), FA_OK);
    if (need > 0) {
        assert_int_equal(fa_context_set_workspace(c, wsb, need - 1), FA_OK);
        assert_int_equal(bwd(c, &p, NULL), FA_ERR_WORKSPACE);
    }
    fa_context_destroy(c); /* never frees a user workspace: freeing it ourselves must work */
    free(ws);
    free(wsb);
    free(own);
    prob_free(&p);
}

#ifndef _WIN32
/* Runs one forward with stderr redirected into a temporary file; returns what was printed. */
static char *captured_fwd(prob *p, char *kernel, size_t klen) {
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    fa_context *c;
    fa_status st = fa_context_create(&c, FA_BACKEND_CPU);
    if (st == FA_OK) st = fwd(c, p, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(st, FA_OK);
    snprintf(kernel, klen, "%s", fa_last_selection(c)->kernel);
    fa_context_destroy(c);
    long n = ftell(tmp);
    char *text = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    assert_non_null(text);
    rewind(tmp);
    size_t got = fread(text, 1, (size_t)(n > 0 ? n : 0), tmp);
    text[got] = 0;
    fclose(tmp);
    return text;
}

static void env_log(void **state) {
    (void)state;
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    char kernel[64];
    setenv("FLASHATTN_LOG", "1", 1);
    char *text = captured_fwd(&p, kernel, sizeof kernel);
    unsetenv("FLASHATTN_LOG");
    if (!strstr(text, kernel))
        fail_msg("FLASHATTN_LOG=1 did not print the kernel %s; stderr was: \"%s\"", kernel, text);
    free(text);
    text = captured_fwd(&p, kernel, sizeof kernel);
    if (strstr(text, kernel)) fail_msg("without FLASHATTN_LOG the kernel was printed: %s", text);
    free(text);
    prob_free(&p);
}

static void env_threads(void **state) {
    (void)state;
    prob p;
    prob_init(&p, FA_DTYPE_F32);
    setenv("FLASHATTN_NUM_THREADS", "1", 1);
    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    unsetenv("FLASHATTN_NUM_THREADS");
    assert_int_equal(fwd(c, &p, NULL), FA_OK);
    assert_int_equal(fa_last_selection(c)->threads, 1);
    fa_context_destroy(c);
    prob_free(&p);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_strings),   cmocka_unit_test(version_and_dtypes),
        cmocka_unit_test(tensor_constructors), cmocka_unit_test(params_default),
        cmocka_unit_test(context_setters),  cmocka_unit_test(selection_record),
        cmocka_unit_test(user_workspace), cmocka_unit_test(bwd_schedule_record),
        cmocka_unit_test(strict_refuses_fallback), cmocka_unit_test(f32_amx_switch),
        cmocka_unit_test(small_calls_one_thread),
#ifndef _WIN32
        cmocka_unit_test(env_log),          cmocka_unit_test(env_threads),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL) != 0;
}
