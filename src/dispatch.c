/*
 * dispatch.c — the one door to every backend. It validates the public arguments (so that no
 * kernel ever sees a bad one and nothing is written on error), flattens them into an
 * fa_problem, finds the workspace, and calls the context's backend, which chooses the kernel
 * and records it. FLASHATTN_LOG=1 prints each record.
 */
#include <stdio.h>
#include <stdlib.h>

#include "validate.h"

#ifndef FLASHATTN_WITH_CUDA
int fa_has_cuda(void) { return 0; }
const fa_backend_ops *fa_cuda_backend_get(void) { return NULL; }
const char *fa_cuda_unavailable(void) { return "this build has no CUDA backend"; }
int fa_cuda_kernel_count(void) { return 0; }
const char *fa_cuda_kernel_name(int i) { return NULL; }
#endif

int fa_kernel_count(void) { return fa_cpu_kernel_count() + fa_cuda_kernel_count(); }

const char *fa_kernel_name(int i) {
    int ncpu = fa_cpu_kernel_count();
    if (i < 0 || i >= fa_kernel_count()) return NULL;
    return i < ncpu ? fa_cpu_kernel_name(i) : fa_cuda_kernel_name(i - ncpu);
}

/* ---- the checks of validate.h ---- */

/* One tensor's pointer, rank, sizes and strides, and that its byte span fits the address
   space. `last_unit` requires stride 1 on the last dimension. */
static fa_status check_tensor(fa_call *c, const char *name, const fa_tensor *t, int ndim,
                              int last_unit, fa_span *sp) {
    if (!t) return fa_fail(c->ctx, FA_ERR_NULL_POINTER, "%s: %s is NULL", c->fn, name);
    if (t->ndim != ndim)
        return fa_fail(c->ctx, FA_ERR_SHAPE, "%s: %s has ndim %d, expected %d", c->fn, name,
                       t->ndim, ndim);
    if (!t->data) return fa_fail(c->ctx, FA_ERR_NULL_POINTER, "%s: %s->data is NULL", c->fn, name);
    size_t es = fa_dtype_size(t->dtype);
    if (es == 0)
        return fa_fail(c->ctx, FA_ERR_DTYPE, "%s: %s has unknown dtype %d", c->fn, name,
                       (int)t->dtype);
    int64_t extent = 0; /* offset of the last element, in elements */
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 1)
            return fa_fail(c->ctx, FA_ERR_SHAPE, "%s: %s->shape[%d] = %lld, must be >= 1", c->fn,
                           name, i, (long long)t->shape[i]);
        if (last_unit && i == ndim - 1 && t->stride[i] != 1)
            return fa_fail(c->ctx, FA_ERR_STRIDE,
                           "%s: %s->stride[%d] = %lld, the last dimension must be contiguous "
                           "(stride 1)",
                           c->fn, name, i, (long long)t->stride[i]);
        if (t->stride[i] < 1)
            return fa_fail(c->ctx, FA_ERR_STRIDE, "%s: %s->stride[%d] = %lld, must be >= 1",
                           c->fn, name, i, (long long)t->stride[i]);
        int64_t step;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &step) ||
            __builtin_add_overflow(extent, step, &extent))
            return fa_fail(c->ctx, FA_ERR_OVERFLOW,
                           "%s: %s spans more than 2^63 elements (shape[%d] = %lld, stride %lld)",
                           c->fn, name, i, (long long)t->shape[i], (long long)t->stride[i]);
    }
    /* byte offsets are ptrdiff_t in the kernels: a span past PTRDIFF_MAX would wrap them
       (a write far outside the tensor; fuzz/ found it), so it is refused as overflow */
    uint64_t bytes;
    uintptr_t end;
    if (__builtin_mul_overflow((uint64_t)extent + 1, (uint64_t)es, &bytes) ||
        bytes > (uint64_t)PTRDIFF_MAX || __builtin_add_overflow((uintptr_t)t->data, bytes, &end))
        return fa_fail(c->ctx, FA_ERR_OVERFLOW,
                       "%s: %s spans %llu elements of %zu bytes, beyond the address space", c->fn,
                       name, (unsigned long long)extent + 1, es); /* extent may be INT64_MAX */
    /* every element count the kernels form (batch * seqlen * heads ...) must fit too */
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, t->shape[i], &numel))
            return fa_fail(c->ctx, FA_ERR_OVERFLOW, "%s: %s has more than 2^63 elements", c->fn,
                           name);
    /* the kernels load elements as their C type: a misaligned one is undefined behaviour
       (a fault on some targets), so it is refused here rather than read */
    if ((uintptr_t)t->data % es)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: %s->data = %p is not aligned to its %zu-byte %s elements", c->fn,
                       name, t->data, es, fa_dtype_name(t->dtype));
    sp->lo = (uintptr_t)t->data;
    sp->hi = end;
    return FA_OK;
}

fa_status fa_check_tensors(fa_call *c, fa_arg *a, int n, int nd) {
    for (int i = 0; i < n; i++)
        FA_TRY(check_tensor(c, a[i].name, a[i].t, a[i].is_lse ? nd - 1 : nd, !a[i].is_lse,
                            &a[i].sp));
    return FA_OK;
}

fa_status fa_check_dtypes(fa_call *c, const fa_arg *a, int n) {
    fa_context *ctx = c->ctx;
    fa_dtype dt = a[0].t->dtype;
    const int fp8 = fa_dtype_is_fp8(dt);
    if (fp8 && c->bwd)
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: dtype %s: there is no FP8 backward (FlashAttention-3 has none either); "
                       "differentiate a bf16/f16/f32 forward", c->fn, fa_dtype_name(dt));
    for (int i = 1; i < n; i++) {
        if (a[i].is_lse) continue;
        /* FP8 inputs write a wider output: FP8 holds too few digits for a result (FA3 writes
           bf16). A workspace query's out is a stand-in (q itself), never written. */
        if (fp8 && a[i].t == c->out) {
            const fa_dtype od = a[i].t->dtype;
            if (c->query_only || od == FA_DTYPE_F32 || od == FA_DTYPE_F16 || od == FA_DTYPE_BF16)
                continue;
            return fa_fail(ctx, FA_ERR_DTYPE, "%s: out is %s; with %s inputs it must be f32, f16 "
                           "or bf16", c->fn, fa_dtype_name(od), fa_dtype_name(dt));
        }
        if (a[i].t->dtype != dt)
            return fa_fail(ctx, FA_ERR_DTYPE, "%s: %s is %s but %s is %s; they must match", c->fn,
                           a[i].name, fa_dtype_name(a[i].t->dtype), a[0].name, fa_dtype_name(dt));
    }
    /* the CUDA backend takes FP8 in its sm90 kernel only and says why where it does not
       (cuda/backend.c: check_fp8) */
    if (fp8 && strcmp(ctx->ops->name, "cpu") != 0 && strcmp(ctx->ops->name, "cuda") != 0)
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: dtype %s on the %s backend: FP8 runs on the CPU backend and on the "
                       "CUDA one (sm90)", c->fn, fa_dtype_name(dt), ctx->ops->name);
    if (fp8 && ctx->algo != FA_ALGO_AUTO)
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: dtype %s runs on the default algorithm only; the naive and plain "
                       "references take f64/f32/f16/bf16 (dequantise to compare)", c->fn,
                       fa_dtype_name(dt));
    if (dt == FA_DTYPE_F64 && ctx->algo != FA_ALGO_NAIVE)
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: dtype f64 is accepted only by the FA_ALGO_NAIVE reference", c->fn);
    fa_dtype want = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    for (int i = 0; i < n; i++)
        if (a[i].is_lse && a[i].t->dtype != want)
            return fa_fail(ctx, FA_ERR_DTYPE, "%s: %s is %s, must be %s", c->fn, a[i].name,
                           fa_dtype_name(a[i].t->dtype), fa_dtype_name(want));
    return FA_OK;
}

fa_status fa_check_devices(fa_call *c, const fa_arg *a, int n) {
    fa_context *ctx = c->ctx;
    fa_device dev = a[0].t->device;
    if (dev != FA_DEVICE_CPU && dev != FA_DEVICE_CUDA)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s has unknown device %d", c->fn, a[0].name,
                       (int)dev);
    for (int i = 1; i < n; i++)
        if (a[i].t->device != dev)
            return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s is on %s but %s is on %s", c->fn,
                           a[i].name, fa_device_name(a[i].t->device), a[0].name,
                           fa_device_name(dev));
    fa_device want_dev = ctx->ops == &fa_cpu_backend ? FA_DEVICE_CPU : FA_DEVICE_CUDA;
    if (dev != want_dev)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: tensors are on %s but the context's backend is %s",
                       c->fn, fa_device_name(dev), ctx->ops->name);
    return FA_OK;
}

/* The dimensions of t of size > 1 in increasing order of stride; returns how many. */
static int dims_by_stride(const fa_tensor *t, int *dim) {
    int m = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 2) continue;
        int j = m++;
        for (; j > 0 && t->stride[dim[j - 1]] > t->stride[i]; j--) dim[j] = dim[j - 1];
        dim[j] = i;
    }
    return m;
}

/* Whether two elements of t share an address: taken in increasing order of stride, each
   dimension must step past the last element of the ones before it. A sufficient rule (a few
   interleaved layouts without shared addresses fail it too), exact for every layout that
   views one dense buffer, and linear in the rank. Returns the offending dimension or -1. */
static int self_alias_dim(const fa_tensor *t) {
    int dim[4];
    const int m = dims_by_stride(t, dim);
    int64_t span = 0; /* offset of the last element of the dimensions so far (fits: checked) */
    for (int k = 0; k < m; k++) {
        if (t->stride[dim[k]] <= span) return dim[k];
        span += (t->shape[dim[k]] - 1) * t->stride[dim[k]];
    }
    return -1;
}

__extension__ typedef __int128 fa_i128;

static fa_i128 floor_div(fa_i128 a, fa_i128 b) { /* b > 0 */
    fa_i128 q = a / b;
    return q * b > a ? q - 1 : q;
}

/* Whether r = sum_k x_k * s[k] has a solution with lo[k] <= x_k <= hi[k], dimensions k..m-1
   (decreasing stride) left; lower[k] and upper[k] bound what dimensions k.. can still add. An
   exact search: the bounds leave at most a few digits per dimension for non-aliasing
   layouts. */
static int reachable(fa_i128 r, int k, int m, const int64_t *s, const int64_t *lo,
                     const int64_t *hi, const fa_i128 *lower, const fa_i128 *upper) {
    if (k >= m || k >= 4) return r == 0; /* m <= 4: the rank */
    fa_i128 from = -floor_div(-(r - upper[k + 1]), s[k]), to = floor_div(r - lower[k + 1], s[k]);
    if (from < lo[k]) from = lo[k];
    if (to > hi[k]) to = hi[k];
    for (fa_i128 x = from; x <= to; x++)
        if (reachable(r - x * s[k], k + 1, m, s, lo, hi, lower, upper)) return 1;
    return 0;
}

/* Whether outputs a and b (each free of self-aliasing, byte spans overlapping) share an
   element. Decided exactly when their strides agree on every dimension that either of them
   has of size > 1 (views of one packed buffer: dq, dk, dv of a dqkv, K and V rows of an
   interleaved cache); otherwise their overlap is allowed as it stands (returns 0). */
static int share_element(const fa_tensor *a, const fa_tensor *b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype) return 0;
    const int64_t es = (int64_t)fa_dtype_size(a->dtype);
    const fa_i128 bytes = (fa_i128)(uintptr_t)b->data - (fa_i128)(uintptr_t)a->data;
    if (bytes % es) return 1; /* overlapping spans, elements not aligned to each other */
    /* element (ia) of a meets element (ib) of b iff sum_k (ia_k - ib_k) s_k = r */
    int64_t s[4], lo[4], hi[4];
    int m = 0;
    for (int i = 0; i < a->ndim; i++) {
        const int64_t na = a->shape[i], nb = b->shape[i];
        if (na < 2 && nb < 2) continue;
        if (na > 1 && nb > 1 && a->stride[i] != b->stride[i]) return 0;
        s[m] = na > 1 ? a->stride[i] : b->stride[i];
        lo[m] = -(nb - 1);
        hi[m] = na - 1;
        for (int j = m++; j > 0 && s[j - 1] < s[j]; j--) { /* decreasing stride */
            int64_t t;
            t = s[j], s[j] = s[j - 1], s[j - 1] = t;
            t = lo[j], lo[j] = lo[j - 1], lo[j - 1] = t;
            t = hi[j], hi[j] = hi[j - 1], hi[j - 1] = t;
        }
    }
    fa_i128 lower[5] = {0}, upper[5] = {0};
    for (int k = m - 1; k >= 0; k--) {
        lower[k] = lower[k + 1] + (fa_i128)lo[k] * s[k];
        upper[k] = upper[k + 1] + (fa_i128)hi[k] * s[k];
    }
    return reachable(bytes / es, 0, m, s, lo, hi, lower, upper);
}

fa_status fa_check_overlaps(fa_call *c, const fa_arg *a, int n) {
    for (int i = 0; i < n; i++) {
        if (!a[i].out || !a[i].t) continue;
        const int d = self_alias_dim(a[i].t);
        if (d >= 0)
            return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                           "%s: output %s has elements that share an address: dimension %d "
                           "(stride %lld) steps inside the span of its smaller-stride dimensions "
                           "(each stride, in increasing order, must exceed the offset of the last "
                           "element of the dimensions below it)",
                           c->fn, a[i].name, d, (long long)a[i].t->stride[d]);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n && a[i].out; j++) {
            if (j == i || !fa_spans_overlap(a[i].sp, a[j].sp)) continue;
            if (a[j].out != a[i].out)
                return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT, "%s: output %s overlaps %s %s",
                               c->fn, a[i].name, a[j].out ? "output" : "input", a[j].name);
            /* one write group: outputs may share a buffer, not an element; lse shares nothing */
            if (j > i && (a[i].is_lse || a[j].is_lse))
                return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                               "%s: output %s overlaps output %s (an lse shares no memory with "
                               "another output)",
                               c->fn, a[i].name, a[j].name);
            if (j > i && a[i].t && a[j].t && share_element(a[i].t, a[j].t))
                return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                               "%s: outputs %s and %s share elements (outputs may share a buffer, "
                               "as packed dq/dk/dv do, but each element has one writer)",
                               c->fn, a[i].name, a[j].name);
        }
    return FA_OK;
}

fa_status fa_check_same_shape(fa_call *c, const char *an, const fa_tensor *a, const char *bn,
                              const fa_tensor *b) {
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return fa_fail(c->ctx, FA_ERR_SHAPE, "%s: %s->shape[%d] = %lld but %s->shape[%d] = %lld",
                           c->fn, bn, i, (long long)b->shape[i], an, i, (long long)a->shape[i]);
    return FA_OK;
}

/* Varlen prefix sums on the host: start at 0, never decrease, end at the token count. */
static fa_status check_cu(fa_call *c, const char *name, const int32_t *cu, int64_t batch,
                          int64_t total, int64_t *max_len) {
    if (cu[0] != 0)
        return fa_fail(c->ctx, FA_ERR_VARLEN, "%s: %s[0] = %d, must be 0", c->fn, name, cu[0]);
    int64_t mx = 0;
    for (int64_t b = 0; b < batch; b++) {
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fa_fail(c->ctx, FA_ERR_VARLEN, "%s: %s decreases at %lld (%d -> %d)", c->fn,
                           name, (long long)b, cu[b], cu[b + 1]);
        if (len > mx) mx = len;
    }
    if (cu[batch] != total)
        return fa_fail(c->ctx, FA_ERR_VARLEN,
                       "%s: %s[batch=%lld] = %d but the tensors hold %lld tokens", c->fn, name,
                       (long long)batch, cu[batch], (long long)total);
    *max_len = mx;
    return FA_OK;
}

fa_operand fa_operand_of(const fa_tensor *t, int varlen) {
    fa_operand o;
    o.data = t->data;
    if (varlen) {
        o.sb = 0;
        o.st = fa_stride_of(t, 0);
        o.sh = fa_stride_of(t, 1);
    } else {
        o.sb = fa_stride_of(t, 0);
        o.st = fa_stride_of(t, 1);
        o.sh = fa_stride_of(t, 2);
    }
    return o;
}

/* FP8 descales (fa_params): one fp32 per (batch, kv head) read, each finite and > 0, checked
   on the CPU (where the data is readable) so that a bad factor is named, not a NaN output. */
static fa_status check_descales(fa_call *c, fa_problem *pr) {
    const fa_params *p = c->p;
    const int any = p->q_descale || p->k_descale || p->v_descale;
    if (!fa_dtype_is_fp8(pr->dtype)) {
        if (any || p->descale_batch_stride)
            return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                           "%s: q/k/v_descale apply to FP8 inputs only (these are %s)", c->fn,
                           fa_dtype_name(pr->dtype));
        return FA_OK;
    }
    const int64_t sb = p->descale_batch_stride;
    if (sb != 0 && sb < pr->heads_kv)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: descale_batch_stride = %lld, must be 0 or >= heads_kv = %lld", c->fn,
                       (long long)sb, (long long)pr->heads_kv);
    if (sb != 0 && pr->batch > 1 && (sb > INT64_MAX / (pr->batch - 1)))
        return fa_fail(c->ctx, FA_ERR_OVERFLOW, "%s: descale_batch_stride = %lld overflows",
                       c->fn, (long long)sb);
    pr->q_descale = p->q_descale;
    pr->k_descale = p->k_descale;
    pr->v_descale = p->v_descale;
    pr->descale_sb = sb;
    if (!any || c->q->device != FA_DEVICE_CPU) return FA_OK;
    const float *arr[3] = {p->q_descale, p->k_descale, p->v_descale};
    static const char *const names[3] = {"q_descale", "k_descale", "v_descale"};
    const int64_t rows = sb ? pr->batch : 1;
    for (int w = 0; w < 3; w++) {
        if (!arr[w]) continue;
        for (int64_t b = 0; b < rows; b++)
            for (int64_t h = 0; h < pr->heads_kv; h++) {
                const float v = arr[w][b * sb + h];
                if (!(v > 0) || isinf(v))
                    return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                                   "%s: %s[%lld] = %g (batch %lld, kv head %lld), must be finite "
                                   "and > 0",
                                   c->fn, names[w], (long long)(b * sb + h), (double)v,
                                   (long long)b, (long long)h);
            }
    }
    return FA_OK;
}

fa_status fa_check_options(fa_call *c, fa_problem *pr) {
    const fa_params *p = c->p;
    if (!(p->softmax_scale >= 0 && p->softmax_scale <= FA_MAX_SOFTMAX_SCALE))
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: softmax_scale = %g, must be finite, >= 0 and <= FA_MAX_SOFTMAX_SCALE "
                       "= 2^126 (0: 1/sqrt(head_dim))",
                       c->fn, (double)p->softmax_scale);
    if (!(p->softcap >= 0) || isinf(p->softcap))
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: softcap = %g, must be finite and >= 0 (0: off)", c->fn,
                       (double)p->softcap);
    if (p->window_left < -1 || p->window_right < -1)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: window (%lld, %lld): each side must be >= 0, or -1 for unbounded",
                       c->fn, (long long)p->window_left, (long long)p->window_right);
    if (p->alibi_batch_stride < 0)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT, "%s: alibi_batch_stride = %lld < 0",
                       c->fn, (long long)p->alibi_batch_stride);
    if (p->alibi_slopes && p->alibi_batch_stride > 0 && p->alibi_batch_stride < pr->heads_q)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: alibi_batch_stride = %lld is shorter than a row of %lld slopes", c->fn,
                       (long long)p->alibi_batch_stride, (long long)pr->heads_q);
    /* host slopes (the CPU backend's): every one the call reads; device slopes are not read */
    if (p->alibi_slopes && c->ctx->ops == &fa_cpu_backend) {
        const int64_t rows = p->alibi_batch_stride ? pr->batch : 1;
        for (int64_t b = 0; b < rows; b++)
            for (int64_t h = 0; h < pr->heads_q; h++) {
                const int64_t i = b * p->alibi_batch_stride + h;
                const float s = p->alibi_slopes[i];
                if (!(fabsf(s) <= FA_MAX_ALIBI_SLOPE))
                    return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                                   "%s: alibi_slopes[%lld] = %g (batch %lld, head %lld): a slope "
                                   "must be finite with |slope| <= FA_MAX_ALIBI_SLOPE = 2^64",
                                   c->fn, (long long)i, (double)s, (long long)b, (long long)h);
            }
    }
    pr->scale = p->softmax_scale > 0 ? p->softmax_scale : (float)(1.0 / sqrt((double)pr->d));
    pr->softcap = p->softcap;
    /* The windows' one normalisation (rows.h): causal is a right window of 0, and a side no
       row can reach is unbounded (-1), bounded by what every sequence's length is known to be
       at most (a varlen call on the GPU may leave its maxima 0: then the token counts). Every
       kernel takes the result as it is. */
    const int64_t len_q = pr->seqlen_q > 0 ? pr->seqlen_q : pr->total_q;
    const int64_t len_k = pr->seqlen_k > 0 ? pr->seqlen_k : pr->total_k;
    pr->win_left = fa_window_norm(p->window_left, len_k);
    pr->win_right = fa_window_norm(p->causal ? 0 : p->window_right, len_q);
    /* a causal call with window_right > 0 asks for two different things */
    if (p->causal && p->window_right > 0)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: causal = 1 with window_right = %lld; causal means window_right 0",
                       c->fn, (long long)p->window_right);
    pr->causal = p->causal != 0;
    pr->alibi = p->alibi_slopes;
    pr->alibi_sb = p->alibi_batch_stride;
    pr->deterministic = p->deterministic != 0;
    if (!(p->dropout_p >= 0 && p->dropout_p < 1))
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: dropout_p = %g, must be in [0, 1) (0: off)", c->fn,
                       (double)p->dropout_p);
    /* dropout.h's counter holds b * heads_q + h, a query row and a key column / 4 in 32 bits */
    if (p->dropout_p > 0 && (pr->batch * pr->heads_q > UINT32_MAX ||
                             (pr->seqlen_q > 0 ? pr->seqlen_q : pr->total_q) > UINT32_MAX ||
                             (pr->seqlen_k > 0 ? pr->seqlen_k : pr->total_k) >> 34))
        return fa_fail(c->ctx, FA_ERR_UNSUPPORTED,
                       "%s: dropout needs batch * heads_q and seqlen_q below 2^32, seqlen_k "
                       "below 2^34",
                       c->fn);
    pr->drop_p = p->dropout_p;
    pr->drop_seed = p->dropout_seed;
    pr->drop_offset = p->dropout_offset;
    FA_TRY(check_descales(c, pr));
    return FA_OK;
}

/* Everything fa_fwd and fa_bwd check, in one place; fills *pr on success. */
/* The tensors of an attention call (fa_fwd, fa_bwd, fa_cp_*) in one list: name, view, role.
   LSE (when given) is an output of the forward and an input of the backward; it is the only
   one with rank 2/3 and free strides. Returns the count (at most 9). */
int fa_attn_args(const fa_call *c, fa_arg a[9]) {
    int n = 0;
#define ARG(nm, tensor, is_out, lse_)                                                         \
    do {                                                                                      \
        a[n].name = nm;                                                                       \
        a[n].t = tensor;                                                                      \
        a[n].out = is_out;                                                                    \
        a[n].is_lse = lse_;                                                                   \
        n++;                                                                                  \
    } while (0)
    ARG("q", c->q, 0, 0);
    ARG("k", c->k, 0, 0);
    ARG("v", c->v, 0, 0);
    ARG("out", c->out, !c->bwd, 0);
    if (c->bwd) {
        ARG("dout", c->dout, 0, 0);
        ARG("dq", c->dq, 1, 0);
        ARG("dk", c->dk, 1, 0);
        ARG("dv", c->dv, 1, 0);
    }
    if (c->lse) ARG("lse", c->lse, !c->bwd, 1);
#undef ARG
    return n;
}

static fa_status validate(fa_call *c, fa_problem *pr) {
    fa_context *ctx = c->ctx;
    const fa_params *p = c->p;
    memset(pr, 0, sizeof *pr);
    if (c->bwd && !c->query_only && !c->lse)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: lse is NULL (required)", c->fn);
    int varlen = p->cu_seqlens_q || p->cu_seqlens_k;
    int nd = varlen ? 3 : 4;
    if (varlen && !(p->cu_seqlens_q && p->cu_seqlens_k))
        return fa_fail(ctx, FA_ERR_VARLEN, "%s: %s is NULL; varlen needs both cu_seqlens_q and _k",
                       c->fn, p->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q");

    fa_arg a[9];
    const int n = fa_attn_args(c, a);
    FA_TRY(fa_check_tensors(c, a, n, nd));
    /* one dtype for all attention tensors; LSE is f32 (f64 for the f64 reference) */
    FA_TRY(fa_check_dtypes(c, a, n));
    FA_TRY(fa_check_devices(c, a, n));
    fa_dtype dt = c->q->dtype;
    fa_device dev = c->q->device;

    /* shapes: q-like and k-like groups, head dim, GQA */
    const fa_tensor *q = c->q, *k = c->k;
    int hd = nd - 2, hdim = nd - 1; /* index of the heads and head_dim dimensions */
    FA_TRY(fa_check_same_shape(c, "k", k, "v", c->v));
    FA_TRY(fa_check_same_shape(c, "q", q, "out", c->out));
    if (c->bwd) {
        FA_TRY(fa_check_same_shape(c, "q", q, "dout", c->dout));
        FA_TRY(fa_check_same_shape(c, "q", q, "dq", c->dq));
        FA_TRY(fa_check_same_shape(c, "k", k, "dk", c->dk));
        FA_TRY(fa_check_same_shape(c, "k", k, "dv", c->dv));
    }
    if (q->shape[hdim] != k->shape[hdim])
        return fa_fail(ctx, FA_ERR_SHAPE, "%s: head_dim of q (%lld) and k (%lld) differ", c->fn,
                       (long long)q->shape[hdim], (long long)k->shape[hdim]);
    if (!varlen && q->shape[0] != k->shape[0])
        return fa_fail(ctx, FA_ERR_SHAPE, "%s: batch of q (%lld) and k (%lld) differ", c->fn,
                       (long long)q->shape[0], (long long)k->shape[0]);
    int64_t d = q->shape[hdim];
    if (d > FA_MAX_HEAD_DIM)
        return fa_fail(ctx, FA_ERR_HEAD_DIM, "%s: head_dim = %lld, the %s backend takes 1..%d",
                       c->fn, (long long)d, ctx->ops->name, FA_MAX_HEAD_DIM);
    int64_t hq = q->shape[hd], hk = k->shape[hd];
    if (hq % hk != 0)
        return fa_fail(ctx, FA_ERR_GQA,
                       "%s: heads_q = %lld is not a multiple of heads_kv = %lld", c->fn,
                       (long long)hq, (long long)hk);

    pr->dtype = dt;
    pr->odtype = c->out->dtype;
    pr->d = d;
    pr->heads_q = hq;
    pr->heads_kv = hk;
    pr->group = hq / hk;
    if (varlen) {
        if (p->batch < 1)
            return fa_fail(ctx, FA_ERR_VARLEN, "%s: varlen call with batch = %lld, must be >= 1",
                           c->fn, (long long)p->batch);
        if (p->max_seqlen_q < 0 || p->max_seqlen_k < 0)
            return fa_fail(ctx, FA_ERR_VARLEN, "%s: max_seqlen_q/k must be >= 0", c->fn);
        pr->batch = p->batch;
        pr->cu_q = p->cu_seqlens_q;
        pr->cu_k = p->cu_seqlens_k;
        pr->total_q = q->shape[0];
        pr->total_k = k->shape[0];
        if (dev == FA_DEVICE_CPU) {
            int64_t mq, mk;
            FA_TRY(check_cu(c, "cu_seqlens_q", p->cu_seqlens_q, p->batch, q->shape[0], &mq));
            FA_TRY(check_cu(c, "cu_seqlens_k", p->cu_seqlens_k, p->batch, k->shape[0], &mk));
            if ((p->max_seqlen_q && p->max_seqlen_q < mq) || (p->max_seqlen_k && p->max_seqlen_k < mk))
                return fa_fail(ctx, FA_ERR_VARLEN,
                               "%s: max_seqlen_q/k = %lld/%lld but the longest sequences are "
                               "%lld/%lld",
                               c->fn, (long long)p->max_seqlen_q, (long long)p->max_seqlen_k,
                               (long long)mq, (long long)mk);
            pr->seqlen_q = mq;
            pr->seqlen_k = mk;
        } else {
            /* device arrays: the CUDA backend checks their contents itself */
            pr->seqlen_q = p->max_seqlen_q;
            pr->seqlen_k = p->max_seqlen_k;
        }
    } else {
        pr->batch = q->shape[0];
        pr->seqlen_q = q->shape[1];
        pr->seqlen_k = k->shape[1];
    }
    if (c->lse) {
        const fa_tensor *l = c->lse;
        int ok = varlen ? (l->shape[0] == hq && l->shape[1] == q->shape[0])
                        : (l->shape[0] == pr->batch && l->shape[1] == hq && l->shape[2] == pr->seqlen_q);
        if (!ok)
            return fa_fail(ctx, FA_ERR_SHAPE, "%s: lse must be [%s] = [%lld, %lld%s%lld]", c->fn,
                           varlen ? "heads_q, total_q" : "batch, heads_q, seqlen_q",
                           (long long)(varlen ? hq : pr->batch),
                           (long long)(varlen ? q->shape[0] : hq), varlen ? "" : ", ",
                           varlen ? 0LL : (long long)pr->seqlen_q);
        pr->lse = l->data;
        pr->lse_sb = varlen ? 0 : fa_stride_of(l, 0);
        pr->lse_sh = fa_stride_of(l, varlen ? 0 : 1);
        pr->lse_st = fa_stride_of(l, varlen ? 1 : 2);
    }
    FA_TRY(fa_check_options(c, pr));
    /* the version-3 fields describe a KV cache call; set here they would be silently ignored */
    if (c->p->rotary_cos || c->p->rotary_sin || c->p->cache_leftpad)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: fa_params.%s is set; rotary_cos/rotary_sin and cache_leftpad are "
                       "options of fa_fwd_kvcache only",
                       c->fn, c->p->cache_leftpad ? "cache_leftpad" : "rotary_cos/rotary_sin");

    /* outputs must not overlap inputs (they may overlap each other, as packed dqkv does) */
    if (!c->query_only) FA_TRY(fa_check_overlaps(c, a, n));

    pr->q = fa_operand_of(q, varlen);
    pr->k = fa_operand_of(k, varlen);
    pr->v = fa_operand_of(c->v, varlen);
    pr->o = fa_operand_of(c->out, varlen);
    if (c->bwd) {
        pr->dout = fa_operand_of(c->dout, varlen);
        pr->dq = fa_operand_of(c->dq, varlen);
        pr->dk = fa_operand_of(c->dk, varlen);
        pr->dv = fa_operand_of(c->dv, varlen);
    }
    return FA_OK;
}

/* A call's workspace: where it came from decides who frees it and whether the context's
   knowledge of zero bytes (ws_zero_*) applies. */
typedef enum { WS_NONE, WS_USER, WS_LENT, WS_OWN } ws_source;

/* The context's own buffer, grown (or moved to the call's device) when too small. Growing
   frees and allocates device memory, which a stream being captured into a CUDA graph forbids:
   then the call fails and says how to avoid it. */
static fa_status own_workspace(fa_context *ctx, const char *fn, size_t need, int capturing) {
    if (need <= ctx->own_ws_bytes && ctx->own_ws_device == ctx->call_device) return FA_OK;
    if (capturing) {
        const int moved = ctx->own_ws && ctx->own_ws_device != ctx->call_device;
        return fa_fail(ctx, FA_ERR_WORKSPACE,
                       "%s: needs %zu bytes of workspace and the context's own buffer (%zu "
                       "bytes%s) cannot be replaced while its stream is being captured into a "
                       "CUDA graph: make the same call once before the capture, or give the "
                       "context an allocator (fa_context_set_allocator) or a workspace",
                       fn, need, ctx->own_ws_bytes, moved ? ", on another device" : "");
    }
    ctx->ws_zero_bytes = 0;
    /* freeing device memory waits for the work that uses it: the fence has no more to say */
    if (ctx->ops->fence_free) ctx->ops->fence_free(ctx);
    if (ctx->own_ws) ctx->ops->ws_free(ctx->own_ws, ctx->own_ws_device);
    ctx->own_ws = NULL;
    ctx->own_ws_bytes = 0;
    size_t rounded = (need + 255) & ~(size_t)255;
    void *m = rounded < need ? NULL : ctx->ops->ws_alloc(rounded);
    if (!m)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of workspace", fn,
                       need);
    ctx->own_ws = m;
    ctx->own_ws_bytes = rounded;
    ctx->own_ws_device = ctx->call_device;
    ctx->own_ws_graphed = 0;
    return FA_OK;
}

/* The workspace for a call: the user's if set (and large enough), else the allocator's
   (outside capture only past its own_max_bytes), else the context's own. */
static fa_status workspace(fa_context *ctx, const char *fn, size_t need, int capturing,
                           void **ws, size_t *bytes, ws_source *src) {
    if (ctx->user_ws) {
        if (need > ctx->user_ws_bytes)
            return fa_fail(ctx, FA_ERR_WORKSPACE, "%s: needs %zu bytes of workspace, got %zu", fn,
                           need, ctx->user_ws_bytes);
        *ws = ctx->user_ws;
        *bytes = ctx->user_ws_bytes;
        *src = WS_USER;
        return FA_OK;
    }
    if (ctx->alloc.alloc && (capturing || need > ctx->alloc.own_max_bytes)) {
        *ws = ctx->alloc.alloc(ctx->alloc.user, need, ctx->stream);
        if (!*ws)
            return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                           "%s: the context's allocator returned NULL for %zu bytes of workspace",
                           fn, need);
        *bytes = need;
        *src = WS_LENT;
        return FA_OK;
    }
    FA_TRY(own_workspace(ctx, fn, need, capturing));
    /* outside capture the buffer is ordered after its last use on another stream */
    if (!capturing && ctx->ops->fence_wait) FA_TRY(ctx->ops->fence_wait(ctx, fn));
    *ws = ctx->own_ws;
    *bytes = ctx->own_ws_bytes;
    *src = WS_OWN;
    return FA_OK;
}

static void log_selection(const fa_context *ctx) {
    if (!ctx->log) return;
    const fa_selection *s = &ctx->sel;
    fprintf(stderr,
            "flashattn: %s %s kernel=%s tile=%dx%d threads=%d splits=%d workspace=%zu%s%s\n",
            s->op, s->backend, s->kernel, s->tile_q, s->tile_k, s->threads, s->num_splits,
            s->workspace_bytes, s->reason[0] ? " refused: " : "", s->reason);
}

/* sizeof(fa_params) at each version this library reads, index version - 1. A new version
   appends fields and its entry here; the older entries keep the sizes they had. */
static const size_t params_size[] = {
    offsetof(fa_params, dropout_seed), /* version 1 ended with deterministic; dropout_seed is
                                          8-aligned, so its offset is version 1's padded size */
    offsetof(fa_params, rotary_cos),   /* version 2 ended with descale_batch_stride (8 bytes,
                                          so no padding before rotary_cos) */
    sizeof(fa_params)};
_Static_assert(sizeof params_size / sizeof *params_size == FA_PARAMS_VERSION,
               "one size per fa_params version");

/* The caller's options as a whole struct of this library's version: its first struct_size
   bytes, the rest at their defaults. struct_size and version lead every version, so reading
   them is in bounds whatever the caller's header; nothing past struct_size is read. */
static fa_status take_params(fa_call *c, fa_params *own) {
    *own = fa_params_default();
    const fa_params *p = c->p;
    c->p = own;
    if (!p) return FA_OK;
    if (p->version == 0)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: p->version = 0 (struct_size %u): fa_params must come from "
                       "fa_params_default(), which sets its version and size",
                       c->fn, p->struct_size);
    if (p->version > FA_PARAMS_VERSION)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: p->version = %u, but this library (%s) knows fa_params versions "
                       "1..%d: the caller was built with a newer flashattn.h than the library "
                       "it runs with (or p did not come from fa_params_default())",
                       c->fn, p->version, fa_version(), FA_PARAMS_VERSION);
    const size_t size = params_size[p->version - 1];
    if (p->struct_size != size)
        return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: p->struct_size = %u, but fa_params version %u is %zu bytes: "
                       "start from fa_params_default()",
                       c->fn, p->struct_size, p->version, size);
    memcpy(own, p, size);
    own->struct_size = (uint32_t)sizeof *own;
    own->version = FA_PARAMS_VERSION;
    return FA_OK;
}

fa_status fa_call_begin(fa_call *c, fa_params *own) {
    fa_context *ctx = c->ctx;
    if (!ctx) return fa_fail(NULL, FA_ERR_NULL_POINTER, "%s: ctx is NULL", c->fn);
    FA_TRY(fa_ctx_enter(ctx, c->fn));
    ctx->err[0] = 0;
    ctx->has_selection = 0;
    fa_status st = take_params(c, own);
    /* a bad index that kernels of an earlier call met fails the next call that would run */
    if (st == FA_OK && !c->query_only) st = fa_take_device_error(ctx, c->fn);
    if (st != FA_OK) fa_ctx_leave(ctx);
    return st;
}

fa_status fa_call_end(fa_call *c, fa_status st) {
    fa_ctx_leave(c->ctx);
    return st;
}

/* fa_call_finish on the call's device. */
static fa_status finish(fa_call *c, const fa_problem *pr, fa_ws_entry ws_entry,
                        fa_run_entry run_entry, size_t *query_bytes) {
    fa_context *ctx = c->ctx;
    size_t need;
    FA_TRY(ws_entry(ctx, pr, &need));
    if (c->query_only) {
        *query_bytes = need;
        return FA_OK;
    }
    void *ws = NULL;
    size_t ws_bytes = 0;
    ws_source src = WS_NONE;
    const int capturing = need && ctx->ops->capturing && ctx->ops->capturing(ctx);
    if (need) FA_TRY(workspace(ctx, c->fn, need, capturing, &ws, &ws_bytes, &src));
    /* the user's and the allocator's memory may change between calls, and replays of a graph
       that captured a call on the own buffer write it behind the context's back; any call may
       write anywhere in its workspace unless it renews the range */
    if (src == WS_OWN && capturing) ctx->own_ws_graphed = 1;
    const int know_zero = src == WS_OWN && !ctx->own_ws_graphed;
    if (!know_zero) ctx->ws_zero_bytes = 0;
    ctx->ws_zero_set = 0;
    fa_status st = run_entry(ctx, pr, ws, ws_bytes);
    if (!ctx->ws_zero_set || !know_zero) ctx->ws_zero_bytes = 0;
    /* stream-ordered: work queued on ctx->stream may still use it (fa_allocator) */
    if (src == WS_LENT) ctx->alloc.release(ctx->alloc.user, ws, need, ctx->stream);
    if (src == WS_OWN && !capturing && ctx->ops->fence_record) {
        const fa_status fs = ctx->ops->fence_record(ctx, c->fn);
        if (st == FA_OK) st = fs;
    }
    FA_TRY(st);
    fa_call_done(ctx);
    return FA_OK;
}

fa_status fa_call_finish(fa_call *c, const fa_problem *pr, fa_ws_entry ws_entry,
                         fa_run_entry run_entry, size_t *query_bytes) {
    fa_context *ctx = c->ctx;
    int saved = -1;
    if (ctx->ops->enter) FA_TRY(ctx->ops->enter(ctx, c->fn, &saved));
    const fa_status st = finish(c, pr, ws_entry, run_entry, query_bytes);
    if (ctx->ops->leave) ctx->ops->leave(saved);
    return st;
}

void fa_call_done(fa_context *ctx) {
    ctx->has_selection = 1;
    log_selection(ctx);
}

static fa_status run(fa_call *c, size_t *query_bytes) {
    fa_params params;
    FA_TRY(fa_call_begin(c, &params));
    fa_problem pr;
    fa_status st = c->query_only && !query_bytes
                       ? fa_fail(c->ctx, FA_ERR_NULL_POINTER, "%s: bytes is NULL", c->fn)
                       : validate(c, &pr);
    const fa_backend_ops *ops = c->ctx->ops;
    if (st == FA_OK)
        st = fa_call_finish(c, &pr, c->bwd ? ops->bwd_workspace : ops->fwd_workspace,
                            c->bwd ? ops->bwd : ops->fwd, query_bytes);
    return fa_call_end(c, st);
}

fa_status fa_fwd(fa_context *ctx, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                 const fa_params *p, fa_tensor *out, fa_tensor *lse) {
    fa_call c = {ctx, "fa_fwd", q, k, v, out, lse, NULL, NULL, NULL, NULL, p, 0, 0};
    return run(&c, NULL);
}

fa_status fa_bwd(fa_context *ctx, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                 const fa_tensor *out, const fa_tensor *dout, const fa_tensor *lse,
                 const fa_params *p, fa_tensor *dq, fa_tensor *dk, fa_tensor *dv) {
    fa_call c = {ctx, "fa_bwd", q, k, v, out, lse, dout, dq, dk, dv, p, 1, 0};
    return run(&c, NULL);
}

/* Workspace queries validate what they are given; the outputs they lack are stood in for by
   the inputs of the same shape (only shapes are read). */
fa_status fa_fwd_workspace_size(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                                const fa_tensor *v, const fa_params *p, size_t *bytes) {
    fa_call c = {ctx, "fa_fwd_workspace_size", q, k, v, q, NULL, NULL, NULL, NULL, NULL, p, 0, 1};
    return run(&c, bytes);
}

fa_status fa_bwd_workspace_size(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                                const fa_tensor *v, const fa_params *p, size_t *bytes) {
    fa_call c = {ctx, "fa_bwd_workspace_size", q, k, v, q, NULL, q, q, k, v, p, 1, 1};
    return run(&c, bytes);
}
