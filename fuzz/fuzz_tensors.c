/*
 * fuzz_tensors.c — the tensors of a fuzzed call: layouts (strides), one broken field, the
 * arena they live in, their contents, and the check that a call wrote only its outputs.
 * Rule: a view whose fields the library may accept always lies inside the arena, so that an
 * out-of-bounds access ASan reports is the library's, never the fuzzer's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_call.h"
#include "testkit.h"

/* Largest arena and view the fuzzer lays out: keeps one input to milliseconds. */
#define FZ_ARENA_MAX ((size_t)8 << 20)
#define FZ_NUMEL_MAX ((int64_t)1 << 21)

void fz_call_init(fz_call *c, uint32_t seed) {
    memset(c, 0, sizeof *c);
    c->q = c->k = c->v = c->o = c->lse = c->dout = c->dq = c->dk = c->dv = c->knew = c->vnew = -1;
    c->seed = seed;
    c->prm = fa_params_default();
}

void fz_call_free(fz_call *c) {
    for (int i = 0; i < c->nblocks; i++) free(c->block[i]);
    free(c->arena);
    free(c->before);
}

void *fz_block(fz_call *c, size_t bytes) {
    if (c->nblocks == FZ_MAX_BLOCKS) abort();
    void *b = calloc(1, bytes ? bytes : 1);
    if (!b) abort();
    c->block_bytes[c->nblocks] = bytes;
    c->block[c->nblocks++] = b;
    return b;
}

int fz_add(fz_call *c, fz *f, const char *name, int ndim, const int64_t *shape, fa_dtype dt,
           fz_role role) {
    if (c->nt == FZ_MAX_T) abort();
    const int i = c->nt++;
    fa_tensor *t = &c->view[i];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->device = FA_DEVICE_CPU;
    t->ndim = ndim;
    for (int j = 0; j < ndim; j++) t->shape[j] = shape[j];
    c->role[i] = role;
    c->name[i] = name;
    /* dims in the order of increasing stride: the last first, unless permuted */
    int order[4] = {3, 2, 1, 0};
    for (int j = 0; j < ndim; j++) order[j] = ndim - 1 - j;
    const int layout = fz_pick(f, 8);
    if (layout == 2 && ndim > 2) /* outer dims permuted: BHSD-like and others */
        for (int j = ndim - 1; j > 1; j--) {
            const int r = 1 + fz_pick(f, j), tmp = order[j];
            order[j] = order[r], order[r] = tmp;
        }
    int64_t s = 1;
    for (int j = 0; j < ndim; j++) {
        const int dim = order[j];
        t->stride[dim] = s;
        const int64_t pad = layout == 1 && j > 0 ? fz_range(f, 0, 3) : 0; /* odd gaps */
        if (layout == 1 && j > 0) t->stride[dim] += pad;
        s = t->stride[dim] * t->shape[dim];
    }
    if (layout == 3) /* inputs may overlap themselves; an output must be refused */
        for (int j = 1; j < ndim; j++) t->stride[order[j]] = fz_range(f, 1, 3);
    if (layout == 4) /* a huge stride on a dimension of size 1 moves nothing */
        for (int j = 0; j < ndim; j++)
            if (t->shape[j] == 1) t->stride[j] = fz_one_in(f, 2) ? INT64_MAX : (int64_t)1 << 62;
    return i;
}

/* One hostile field of one tensor, before the arena is sized: the library must refuse it,
   or (shape + 1, another dtype) the arena holds the view it then describes. */
static void break_field(fz_call *c, fz *f) {
    if (!c->nt || !fz_one_in(f, 3)) return;
    fa_tensor *t = &c->view[fz_pick(f, c->nt)];
    const int j = t->ndim > 0 ? fz_pick(f, t->ndim) : 0;
    static const int64_t bad_stride[] = {0, -1, -7, INT64_MIN, INT64_MAX, INT64_MAX / 3};
    static const int64_t bad_shape[] = {0, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 62};
    static const int bad_ndim[] = {0, -1, 5, 2, 3, 4};
    static const int bad_dtype[] = {FA_DTYPE_F8_E4M3, 99, -1, FA_DTYPE_F32, FA_DTYPE_F16,
                                    FA_DTYPE_BF16, FA_DTYPE_F64};
    switch (fz_pick(f, 6)) {
    case 0: t->stride[j] = bad_stride[fz_pick(f, 6)]; break;
    case 1: t->shape[j] = bad_shape[fz_pick(f, 5)]; break;
    case 2: t->shape[j] += 1; break;
    case 3: t->ndim = bad_ndim[fz_pick(f, 6)]; break;
    case 4: t->dtype = (fa_dtype)bad_dtype[fz_pick(f, 7)]; break;
    default: t->device = fz_one_in(f, 2) ? FA_DEVICE_CUDA : (fa_device)7; break;
    }
}

/* Bytes a view spans, or 0 when the library must refuse its fields (a bad rank, dtype,
   size or stride, or a span past 2^63 elements or the address space). */
static size_t span_bytes(const fa_tensor *t, int64_t *numel) {
    const size_t es = fa_dtype_size(t->dtype);
    if (t->ndim < 1 || t->ndim > 4 || !es) return 0;
    int64_t extent = 0, n = 1;
    for (int j = 0; j < t->ndim; j++) {
        int64_t step;
        if (t->shape[j] < 1 || t->stride[j] < 1) return 0;
        if (__builtin_mul_overflow(t->shape[j] - 1, t->stride[j], &step) ||
            __builtin_add_overflow(extent, step, &extent) ||
            __builtin_mul_overflow(n, t->shape[j], &n))
            return 0;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)extent + 1, (uint64_t)es, &bytes) ||
        bytes > (uint64_t)INT64_MAX) /* the library's bound: PTRDIFF_MAX */
        return 0;
    *numel = n;
    return (size_t)bytes;
}

void fz_each(const fa_tensor *t, void (*fn)(void *user, uint8_t *p), void *user) {
    int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
    for (int j = 0; j < t->ndim; j++) sh[4 - t->ndim + j] = t->shape[j], st[4 - t->ndim + j] = t->stride[j];
    const size_t es = fa_dtype_size(t->dtype);
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t b = 0; b < sh[1]; b++)
            for (int64_t c = 0; c < sh[2]; c++)
                for (int64_t d = 0; d < sh[3]; d++) {
                    /* dims of size 1 contribute 0 whatever their stride */
                    const int64_t off = a * st[0] + b * st[1] + c * st[2] + d * st[3];
                    fn(user, (uint8_t *)t->data + (size_t)off * es);
                }
}

double fz_get(fa_dtype dt, const uint8_t *p) {
    uint16_t h;
    float x;
    double y;
    switch (dt) {
    case FA_DTYPE_F16: memcpy(&h, p, 2); return tk_f16_value(h);
    case FA_DTYPE_BF16: memcpy(&h, p, 2); return tk_bf16_value(h);
    case FA_DTYPE_F64: memcpy(&y, p, 8); return y;
    default: memcpy(&x, p, 4); return x;
    }
}

static void put(fa_dtype dt, uint8_t *p, double x) {
    uint16_t h;
    float y;
    switch (dt) {
    case FA_DTYPE_F16: h = tk_f16_bits(x); memcpy(p, &h, 2); break;
    case FA_DTYPE_BF16: h = tk_bf16_bits(x); memcpy(p, &h, 2); break;
    case FA_DTYPE_F64: memcpy(p, &x, 8); break;
    default: y = (float)x; memcpy(p, &y, 4); break;
    }
}

/* A value of the call's mode: plain, any magnitude, with NaN / Inf, tiny, or huge. */
static double draw(fz_call *c, fz_role role) {
    const uint64_t r = fz_mix(&c->seed);
    const double u = (double)(r >> 11) * 0x1p-53, sign = r & 1 ? -1.0 : 1.0;
    if (role == FZ_LSE_PART || role == FZ_LSE_IN) {
        const unsigned k = (unsigned)(r >> 3) % 64;
        if (k == 0) return -INFINITY; /* a part or row that saw no key */
        if (k == 1 && c->vmode == 2) return (r >> 9) & 1 ? INFINITY : NAN;
    }
    switch (c->vmode) {
    case 1: return sign * ldexp(1.0 + u, (int)((r >> 1) % 268) - 140);
    case 2: {
        const unsigned k = (unsigned)(r >> 2) % 32;
        if (k == 0) return NAN;
        if (k == 1) return sign * INFINITY;
        return 4.0 * u - 2.0;
    }
    case 3: {
        static const double tiny[] = {0.0, -0.0, 1e-40, -1e-45, 1e-8, 1.0, 6e-8, 1e-300};
        return sign * tiny[(r >> 1) % 8];
    }
    case 4: return sign * ldexp(1.0 + u, 100 + (int)((r >> 1) % 28));
    default: return 4.0 * u - 2.0;
    }
}

typedef struct filler {
    fz_call *c;
    fa_dtype dt;
    fz_role role;
} filler;

static void fill_one(void *user, uint8_t *p) {
    filler *fl = user;
    if (fl->role == FZ_OUT || fl->role == FZ_LSE_OUT) /* poison: NaN in every dtype */
        memset(p, 0xff, fa_dtype_size(fl->dt));
    else
        put(fl->dt, p, draw(fl->c, fl->role));
}

int fz_layout(fz_call *c, fz *f) {
    break_field(c, f);
    size_t bytes[FZ_MAX_T], total = 64;
    for (int i = 0; i < c->nt; i++) {
        int64_t numel = 0;
        bytes[i] = span_bytes(&c->view[i], &numel);
        c->sane[i] = bytes[i] > 0;
        if (bytes[i] > FZ_ARENA_MAX || numel > FZ_NUMEL_MAX) return 0;
        total += (bytes[i] + 23) & ~(size_t)15; /* 8 bytes of room for a misaligned view */
    }
    if (total > FZ_ARENA_MAX) return 0;
    c->arena_bytes = total;
    c->arena = malloc(total);
    c->before = malloc(total);
    if (!c->arena || !c->before) abort();
    for (size_t i = 0; i < total; i++) c->arena[i] = (uint8_t)fz_mix(&c->seed);
    const int scatter = fz_one_in(f, 6); /* tensors at random offsets: overlaps */
    size_t at = 0;
    for (int i = 0; i < c->nt; i++) {
        const size_t es = fa_dtype_size(c->view[i].dtype) ? fa_dtype_size(c->view[i].dtype) : 1;
        size_t off = at;
        if (scatter) off = (fz_u32(f) % (total - bytes[i] - 8 + 1)) / es * es;
        c->view[i].data = c->arena + off;
        at += (bytes[i] + 23) & ~(size_t)15;
    }
    if (c->nt && fz_one_in(f, 12)) { /* a NULL or misaligned pointer */
        fa_tensor *t = &c->view[fz_pick(f, c->nt)];
        t->data = fz_one_in(f, 2) ? NULL : (uint8_t *)t->data + 1 + fz_pick(f, 3);
    }
    c->vmode = fz_pick(f, 5);
    /* inputs first, outputs last: where views overlap, the poison wins */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < c->nt; i++) {
            const int out = c->role[i] == FZ_OUT || c->role[i] == FZ_LSE_OUT;
            if (!c->sane[i] || !c->view[i].data || out != pass) continue;
            filler fl = {c, c->view[i].dtype, c->role[i]};
            fz_each(&c->view[i], fill_one, &fl);
        }
    return 1;
}

typedef struct marker {
    uint8_t *mask;
    const uint8_t *arena;
    size_t es, n;
} marker;

static void mark_one(void *user, uint8_t *p) {
    marker *m = user;
    const size_t off = (size_t)(p - m->arena);
    for (size_t b = 0; b < m->es && off + b < m->n; b++) m->mask[off + b] = 1;
}

int64_t fz_stray_write(const fz_call *c) {
    uint8_t *mask = calloc(1, c->arena_bytes);
    if (!mask) abort();
    for (int i = 0; i < c->nt; i++) {
        const fz_role r = c->role[i];
        if (r != FZ_OUT && r != FZ_LSE_OUT && r != FZ_INOUT) continue;
        marker m = {mask, c->arena, fa_dtype_size(c->view[i].dtype), c->arena_bytes};
        fz_each(&c->view[i], mark_one, &m);
    }
    int64_t at = -1;
    for (size_t i = 0; i < c->arena_bytes && at < 0; i++)
        if (!mask[i] && c->arena[i] != c->before[i]) at = (int64_t)i;
    free(mask);
    return at;
}
