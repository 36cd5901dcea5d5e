/*
 * flashattn._ext — the package's hot path, in C over the CPython API (no C++, no libtorch).
 *
 * A call reads its torch tensors through the tensors' own methods (data_ptr, shape, stride,
 * dtype, device), numpy arrays through the buffer protocol, takes the current CUDA stream,
 * allocates its outputs and workspace through torch (the caching allocator, so that CUDA-graph
 * capture sees them), and calls libflashattn on a context kept per thread and device.
 * Anything the fast path does not take (host index arrays, other dtypes, mixed kinds) returns
 * NotImplemented, and the Python layer normalises the arguments and calls again.
 *
 * Files: ext.c (module, contexts, calls), ext_args.h/ext_args.c (tensors and arrays as
 * fa_tensor views).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include <flashattn.h>

#include "ext_args.h"

/* ---- what bind() hands us ---- */

ext_globals G;

/* ---- settings shared by every context of the process (set_options) ---- */

static struct {
    int threads, strict, algo, device_checks; /* device_checks -1: the library's default */
    long generation;
} S = {0, 0, 0, -1, 1};

/* ---- contexts: one per thread and device (0: CPU, 1 + i: CUDA device i) ---- */

#define MAX_SLOTS 65
/* fa_allocator.own_max_bytes of the contexts: what a thread keeps per device at most */
#define EXT_OWN_MAX_BYTES ((size_t)8 << 20)

typedef struct thread_state {
    fa_context *ctx[MAX_SLOTS];
    long generation[MAX_SLOTS];
    fa_context *last; /* context of this thread's last successful call, for last_selection */
    struct thread_state *next_orphan;
} thread_state;

static pthread_key_t g_key;
static _Thread_local thread_state *tl_state;

/* Contexts of exited threads wait here and are destroyed by the next call of a live thread
   (or at interpreter exit): a thread-exit destructor must not call the CUDA runtime, whose own
   per-thread state is torn down before pthread key destructors run (C++ thread_local
   destructors come first). Destroying them there crashed every NCCL rank at exit, in torch's
   autograd thread (bench/probes/cp_exit.sh, docs/perf/python_door.md P5). */
static pthread_mutex_t g_orphans_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_state *g_orphans;

static void thread_state_orphan(void *p) {
    thread_state *t = p;
    pthread_mutex_lock(&g_orphans_lock);
    t->next_orphan = g_orphans;
    g_orphans = t;
    pthread_mutex_unlock(&g_orphans_lock);
}

static void reap_orphans(void) {
    if (!__atomic_load_n(&g_orphans, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&g_orphans_lock);
    thread_state *t = g_orphans;
    g_orphans = NULL;
    pthread_mutex_unlock(&g_orphans_lock);
    while (t) {
        thread_state *next = t->next_orphan;
        for (int i = 0; i < MAX_SLOTS; i++) fa_context_destroy(t->ctx[i]);
        free(t);
        t = next;
    }
}

static thread_state *state(void) {
    if (!tl_state) {
        reap_orphans();
        tl_state = calloc(1, sizeof *tl_state);
        if (!tl_state) return (thread_state *)PyErr_NoMemory();
        pthread_setspecific(g_key, tl_state);
    }
    return tl_state;
}

/* Raises FlashAttnArgumentError / FlashAttnError(status, message). */
static void *raise_status(fa_status st, const char *msg) {
    PyObject *cls = st >= 1 && st <= 10 ? G.arg_error : G.error;
    if (!cls) cls = PyExc_RuntimeError;
    PyObject *e = PyObject_CallFunction(cls, "is", (int)st, msg ? msg : "");
    if (e) {
        PyErr_SetObject(cls, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* Workspace from torch's caching allocator, on the call's stream (capture-safe). */
static void *torch_alloc(void *user, size_t bytes, void *stream) {
    (void)user;
    PyObject *r = PyObject_CallFunction(G.raw_alloc, "nK", (Py_ssize_t)bytes,
                                        (unsigned long long)(uintptr_t)stream);
    if (!r) {
        PyErr_Clear(); /* the library reports FA_ERR_OUT_OF_MEMORY */
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) PyErr_Clear();
    return p;
}

static void torch_release(void *user, void *ptr, size_t bytes, void *stream) {
    (void)user, (void)bytes, (void)stream;
    PyObject *p = PyLong_FromVoidPtr(ptr);
    PyObject *r = p ? PyObject_CallOneArg(G.raw_delete, p) : NULL;
    Py_XDECREF(p);
    if (!r) PyErr_Clear();
    Py_XDECREF(r);
}

static fa_status apply_settings(fa_context *c) {
    fa_status st = fa_context_set_threads(c, S.threads);
    if (st == FA_OK) st = fa_context_set_strict(c, S.strict);
    if (st == FA_OK) st = fa_context_set_algo(c, (fa_algo)S.algo);
    if (st == FA_OK && S.device_checks >= 0)
        st = fa_context_set_device_checks(c, S.device_checks);
    return st;
}

/* This thread's context for a device (-1: the CPU), created on first use, with the settings
   and, on CUDA, the stream and torch's allocator. NULL with an exception set on failure. */
static fa_context *context_for(int device, void *stream) {
    if (device < -1 || device >= MAX_SLOTS - 1) {
        PyErr_Format(PyExc_ValueError, "CUDA device %d is past the %d this package tracks",
                     device, MAX_SLOTS - 1);
        return NULL;
    }
    thread_state *t = state();
    if (!t) return NULL;
    const int slot = device + 1;
    fa_context *c = t->ctx[slot];
    fa_status st;
    if (!c) {
        st = fa_context_create(&c, device < 0 ? FA_BACKEND_CPU : FA_BACKEND_CUDA);
        if (st != FA_OK) return raise_status(st, fa_last_error(NULL));
        if (device >= 0) {
            st = fa_context_set_device(c, device);
            if (st == FA_OK && G.raw_alloc) {
                /* small workspaces (the decode's split partials and counters) outside
                   capture stay in the context's own buffer: no Python round trip to torch's
                   allocator and no clearing launch per call (docs/perf/python_door.md, P4) */
                const fa_allocator a = {sizeof a, torch_alloc, torch_release, NULL,
                                        EXT_OWN_MAX_BYTES};
                st = fa_context_set_allocator(c, &a);
            }
            if (st != FA_OK) {
                raise_status(st, fa_last_error(c));
                fa_context_destroy(c);
                return NULL;
            }
        }
        t->ctx[slot] = c;
        t->generation[slot] = 0;
    }
    if (t->generation[slot] != S.generation) {
        st = apply_settings(c);
        if (st != FA_OK) return raise_status(st, fa_last_error(c));
        t->generation[slot] = S.generation;
    }
    if (device >= 0) fa_context_set_stream(c, stream);
    return c;
}

/* The current torch stream of a CUDA device. */
static int current_stream(int device, void **stream) {
    PyObject *d = PyLong_FromLong(device);
    PyObject *r = d ? PyObject_CallOneArg(G.raw_stream, d) : NULL;
    Py_XDECREF(d);
    if (!r) return -1;
    *stream = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* Runs a library call's status through: records the context on success, raises on failure. */
static int finish(fa_context *c, fa_status st) {
    thread_state *t = state();
    if (t) t->last = st == FA_OK ? c : NULL;
    if (st != FA_OK) {
        raise_status(st, fa_last_error(c));
        return -1;
    }
    return 0;
}

/* ---- scalar arguments ---- */

typedef struct opts {
    fa_params p;
    int want_lse;
} opts;

/* An integer argument into a C integer of `bits` bits: out of range is an OverflowError naming
   it (a cast would keep the low bits: 2^64 - 1 would become -1, "unbounded"), a non-integer a
   TypeError. */
static int as_int_bits(PyObject *o, int64_t *v, const char *name, int bits) {
    PyObject *n = PyNumber_Index(o); /* ints and numpy integers */
    if (!n) {
        PyErr_Format(PyExc_TypeError, "%s = %R: expected an integer", name, o);
        return -1;
    }
    int overflow;
    const long long x = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(n);
        return -1;
    }
    const long long hi = bits == 64 ? LLONG_MAX : (1LL << (bits - 1)) - 1, lo = -hi - 1;
    if (overflow || x < lo || x > hi) {
        PyErr_Format(PyExc_OverflowError,
                     "%s = %R is outside the %d-bit signed integer range [%lld, %lld] that the "
                     "library takes",
                     name, n, bits, lo, hi);
        Py_DECREF(n);
        return -1;
    }
    Py_DECREF(n);
    *v = x;
    return 0;
}

static int as_int64(PyObject *o, int64_t *v, const char *name) {
    return as_int_bits(o, v, name, 64);
}

/* softmax_scale (None or > 0), causal, window_size (left, right), softcap. */
static int read_options(PyObject *const *a, fa_params *p) {
    *p = fa_params_default();
    if (a[0] != Py_None) {
        double s = PyFloat_AsDouble(a[0]);
        if (s == -1.0 && PyErr_Occurred()) return -1;
        if (s == 0.0) {
            PyErr_SetString(PyExc_ValueError,
                            "softmax_scale = 0 is not supported (the library reads 0 as 'use the "
                            "default 1/sqrt(head_dim)'); pass None for the default");
            return -1;
        }
        p->softmax_scale = (float)s;
        if (p->softmax_scale == 0.0f) { /* 0 would read as the default */
            PyErr_Format(PyExc_ValueError,
                         "softmax_scale = %R rounds to 0 in float32, which the library reads as "
                         "the default / off",
                         a[0]);
            return -1;
        }
    }
    int causal = PyObject_IsTrue(a[1]);
    if (causal < 0) return -1;
    p->causal = causal;
    PyObject *w = a[2];
    if (!PySequence_Check(w) || PySequence_Size(w) != 2) {
        PyErr_Format(PyExc_ValueError,
                     "window_size = %R, expected (left, right) integers, -1 for unbounded", w);
        return -1;
    }
    PyObject *l = PySequence_GetItem(w, 0), *r = PySequence_GetItem(w, 1);
    int bad = !l || !r || as_int64(l, &p->window_left, "window_size[0]") ||
              as_int64(r, &p->window_right, "window_size[1]");
    Py_XDECREF(l);
    Py_XDECREF(r);
    if (bad) return -1;
    if (causal && p->window_right > 0) p->window_right = 0; /* flash_attn: causal wins */
    double cap = PyFloat_AsDouble(a[3]);
    if (cap == -1.0 && PyErr_Occurred()) return -1;
    p->softcap = (float)cap;
    if (cap != 0.0 && p->softcap == 0.0f) { /* 0 would read as "off" */
        PyErr_Format(PyExc_ValueError,
                     "softcap = %R rounds to 0 in float32, which the library reads as the "
                     "default / off",
                     a[3]);
        return -1;
    }
    return 0;
}

/* ---- the calls ---- */

/* Runs `expr`, a library call on the context `c` of the call's device, and sets r from its
   status: on the CPU with the GIL released (the kernels compute there); on CUDA with it held
   (they only queue work, and torch's allocator, which the library may call for workspace,
   needs it). */
#define EXT_RUN(call, r, c, expr)                                                             \
    do {                                                                                      \
        fa_context *c = call_context(&(call));                                                \
        if (!c) {                                                                             \
            r = -1;                                                                           \
            break;                                                                            \
        }                                                                                     \
        fa_status st_;                                                                        \
        if ((call).device < 0) {                                                              \
            Py_BEGIN_ALLOW_THREADS st_ = (expr);                                              \
            Py_END_ALLOW_THREADS                                                              \
        } else {                                                                              \
            st_ = (expr);                                                                     \
        }                                                                                     \
        r = finish(c, st_);                                                                   \
    } while (0)

/* The context for a call's device, with the current stream on CUDA. */
static fa_context *call_context(const ext_call *call) {
    void *stream = NULL;
    if (call->device >= 0 && current_stream(call->device, &stream)) return NULL;
    return context_for(call->device, stream);
}

static void forget_last(void) {
    thread_state *t = state();
    if (t) t->last = NULL;
}

/* cu_seqlens_q/k (a[0], a[1]) and max_seqlen_q/k (a[2], a[3]) into p. */
static int read_varlen(ext_call *call, PyObject *const *a, fa_params *p) {
    int r;
    if ((r = ext_index(call, a[0], 1, 0, &p->cu_seqlens_q, NULL, NULL)) ||
        (r = ext_index(call, a[1], 1, 1, &p->cu_seqlens_k, NULL, NULL)))
        return r;
    const int64_t nq = call->index_len[0], nk = call->index_len[1];
    if (nq < 2 || nk != nq) return EXT_DECLINE; /* the Python layer names the shapes */
    p->batch = nq - 1;
    if (a[2] != Py_None && as_int64(a[2], &p->max_seqlen_q, "max_seqlen_q")) return -1;
    if (a[3] != Py_None && as_int64(a[3], &p->max_seqlen_k, "max_seqlen_k")) return -1;
    return 0;
}

static void lse_shape_of(const fa_tensor *q, int varlen, int64_t *shape, int *nd) {
    if (varlen) shape[0] = q->shape[1], shape[1] = q->shape[0], *nd = 2;
    else shape[0] = q->shape[0], shape[1] = q->shape[2], shape[2] = q->shape[1], *nd = 3;
}

static PyObject *result(int r, ext_call *call, int n) {
    PyObject *res = NULL;
    if (r == 0) {
        res = PyTuple_New(n);
        for (int i = 0; res && i < n; i++)
            PyTuple_SET_ITEM(res, i, Py_NewRef(call->out[i] ? call->out[i] : Py_None));
    } else if (r == EXT_DECLINE) {
        res = Py_NewRef(Py_NotImplemented);
    }
    ext_call_release(call);
    return res;
}

#define NARGS(fn, want)                                                                       \
    if (n != (want)) {                                                                        \
        PyErr_Format(PyExc_TypeError, fn " takes %d arguments, got %zd", (want), n);          \
        return NULL;                                                                          \
    }

/* dropout: None (off) or (dropout_p, seed, offset), the Python layer having drawn seed and
   offset; fa_params' three fields (the library checks p). */
static int read_dropout(PyObject *d, fa_params *p) {
    if (d == Py_None) return 0;
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 3) {
        PyErr_Format(PyExc_TypeError, "dropout = %R, expected None or (p, seed, offset)", d);
        return -1;
    }
    const double dp = PyFloat_AsDouble(PyTuple_GET_ITEM(d, 0));
    if (dp == -1.0 && PyErr_Occurred()) return -1;
    const unsigned long long seed = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(d, 1));
    if (seed == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    const unsigned long long off = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(d, 2));
    if (off == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    p->dropout_p = (float)dp;
    p->dropout_seed = seed;
    p->dropout_offset = off;
    return 0;
}

/* fwd(q, k, v, out, lse, want_lse, softmax_scale, causal, window_size, softcap,
       alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, grad_check,
       dropout, descales)
   -> (out, lse or None), or NotImplemented. With grad_check, NotImplemented also when torch
   would record the call for autograd (grad mode on, an input requiring grad). descales: see
   ext_descales. FP8 inputs without a given out are NotImplemented: the Python layer picks the
   output's dtype (bf16), which is not q's. */
static PyObject *ext_fwd(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    PyObject *a18[18];
    if (n == 17) { /* descales left out: None (callers of the 17-argument form) */
        memcpy(a18, a, 17 * sizeof *a);
        a18[17] = Py_None;
        a = a18, n = 18;
    }
    NARGS("fwd", 18);
    ext_call call;
    ext_call_init(&call);
    fa_params p;
    fa_tensor q, k, v, o, l;
    const int varlen = a[11] != Py_None || a[12] != Py_None;
    const int nd = varlen ? 3 : 4;
    int want_lse, r;
    if ((r = ext_kind_of(&call, a, 3))) goto done;
    if (call.kind == EXT_TORCH && PyObject_IsTrue(a[15]) && (r = ext_needs_grad(a, 3))) goto done;
    if (read_options(a + 6, &p) || read_dropout(a[16], &p)) goto fail;
    if ((r = ext_input(&call, a[0], "q", nd, 1, &q)) ||
        (r = ext_input(&call, a[1], "k", nd, 1, &k)) ||
        (r = ext_input(&call, a[2], "v", nd, 1, &v)))
        goto done;
    if ((ext_is_fp8(q.dtype) || ext_is_fp8(k.dtype) || ext_is_fp8(v.dtype)) && a[3] == Py_None) {
        r = EXT_DECLINE; /* the Python layer picks out's dtype and names a mixed one */
        goto done;
    }
    if ((r = ext_descales(&call, a[17], &p))) goto done;
    want_lse = a[4] != Py_None || PyObject_IsTrue(a[5]);
    int64_t lshape[3];
    int lnd;
    lse_shape_of(&q, varlen, lshape, &lnd);
    if ((r = ext_output(&call, a[3], "out", a[0], &q, q.shape, nd, 0, 0, &o))) goto done;
    if (want_lse && (r = ext_output(&call, a[4], "softmax_lse", a[0], &q, lshape, lnd, 1, 1, &l)))
        goto done;
    if (varlen && (r = read_varlen(&call, a + 11, &p))) goto done;
    if (a[10] != Py_None &&
        (r = ext_alibi(&call, a[10], varlen ? p.batch : q.shape[0], q.shape[nd - 2], &p)))
        goto done;
    if (ext_rows_empty(&q, varlen) || ext_rows_empty(&k, varlen)) {
        /* every query row (if any) sees no key: out 0, lse -inf */
        forget_last();
        r = ext_fill(&call, call.out[0], 0.0);
        if (!r && want_lse) r = ext_fill(&call, call.out[1], -INFINITY);
        goto done;
    }
    EXT_RUN(call, r, c, fa_fwd(c, &q, &k, &v, &p, &o, want_lse ? &l : NULL));
    goto done;
fail:
    r = -1;
done:
    return result(r, &call, 2);
}

/* bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, window_size, softcap,
       alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
       dropout)
   -> (dq, dk, dv), or NotImplemented. */
static PyObject *ext_bwd(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    NARGS("bwd", 20);
    ext_call call;
    ext_call_init(&call);
    fa_params p;
    fa_tensor dout, q, k, v, o, lse, dq, dk, dv;
    const int varlen = a[14] != Py_None || a[15] != Py_None;
    const int nd = varlen ? 3 : 4;
    int r, det;
    if ((r = ext_kind_of(&call, a, 6))) goto done;
    if (read_options(a + 9, &p) || read_dropout(a[19], &p)) goto fail;
    if ((det = PyObject_IsTrue(a[18])) < 0) goto fail;
    p.deterministic = det;
    if ((r = ext_input(&call, a[0], "dout", nd, 1, &dout)) ||
        (r = ext_input(&call, a[1], "q", nd, 1, &q)) ||
        (r = ext_input(&call, a[2], "k", nd, 1, &k)) ||
        (r = ext_input(&call, a[3], "v", nd, 1, &v)) ||
        (r = ext_input(&call, a[4], "out", nd, 1, &o)) ||
        (r = ext_input(&call, a[5], "softmax_lse", varlen ? 2 : 3, 0, &lse)))
        goto done;
    if ((r = ext_output(&call, a[6], "dq", a[1], &q, q.shape, nd, 0, 0, &dq)) ||
        (r = ext_output(&call, a[7], "dk", a[2], &k, k.shape, nd, 0, 1, &dk)) ||
        (r = ext_output(&call, a[8], "dv", a[3], &v, v.shape, nd, 0, 2, &dv)))
        goto done;
    if (varlen && (r = read_varlen(&call, a + 14, &p))) goto done;
    if (a[13] != Py_None &&
        (r = ext_alibi(&call, a[13], varlen ? p.batch : q.shape[0], q.shape[nd - 2], &p)))
        goto done;
    if (ext_rows_empty(&q, varlen) || ext_rows_empty(&k, varlen)) {
        forget_last();
        for (int i = 0; i < 3 && !r; i++) r = ext_fill(&call, call.out[i], 0.0);
        goto done;
    }
    EXT_RUN(call, r, c, fa_bwd(c, &q, &k, &v, &o, &dout, &lse, &p, &dq, &dk, &dv));
    goto done;
fail:
    r = -1;
done:
    return result(r, &call, 3);
}

/* fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, want_lse,
               softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits,
               descales, rotary_cos, rotary_sin, rotary_interleaved, cache_leftpad)
   -> (out, lse or None), or NotImplemented (FP8 q without out too, as for fwd). The rotary
   tables are 2-d inputs (the library checks their dtype, shape and device); cache_leftpad an
   int32 array of batch values. The fast path takes cache_seqlens as an int32 array of batch
   values and block_table as int32 (batch, max_pages) rows, both on the tensors' device; k and
   v are appended into the caches in place. Shorter calls (16 arguments: no descales; 17: no
   rotary or leftpad) mean None for the rest, so older callers keep working. */
static PyObject *ext_fwd_kvcache(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    PyObject *full[21];
    if (n == 16 || n == 17) {
        memcpy(full, a, (size_t)n * sizeof *a);
        for (Py_ssize_t i = n; i < 21; i++) full[i] = i == 19 ? Py_False : Py_None;
        a = full, n = 21;
    }
    NARGS("fwd_kvcache", 21);
    ext_call call;
    ext_call_init(&call);
    fa_params p;
    fa_tensor q, o, l, kn, vn;
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    const int append = a[3] != Py_None;
    int r, want_lse;
    int64_t splits;
    if (append != (a[4] != Py_None) || a[5] == Py_None) return Py_NewRef(Py_NotImplemented);
    if ((r = ext_kind_of(&call, a, 5))) goto done;
    if (read_options(a + 10, &p)) goto fail;
    if (as_int_bits(a[15], &splits, "num_splits", 32)) goto fail; /* an int in C */
    if ((r = ext_input(&call, a[0], "q", 4, 1, &q))) goto done;
    if (ext_is_fp8(q.dtype) && a[7] == Py_None) { r = EXT_DECLINE; goto done; }
    if ((r = ext_descales(&call, a[16], &p))) goto done;
    if (append) {
        if ((r = ext_inplace(&call, a[1], "k_cache", 4, &cache.k)) ||
            (r = ext_inplace(&call, a[2], "v_cache", 4, &cache.v)) ||
            (r = ext_input(&call, a[3], "k", 4, 1, &kn)) ||
            (r = ext_input(&call, a[4], "v", 4, 1, &vn)))
            goto done;
        if (kn.shape[1] == 0) { r = EXT_DECLINE; goto done; }
    } else if ((r = ext_input(&call, a[1], "k_cache", 4, 1, &cache.k)) ||
               (r = ext_input(&call, a[2], "v_cache", 4, 1, &cache.v))) {
        goto done;
    }
    const int64_t batch = q.shape[0];
    if (batch == 0 || q.shape[1] == 0) { r = EXT_DECLINE; goto done; }
    if ((r = ext_index(&call, a[5], 1, 0, &cache.seqlens, NULL, NULL))) goto done;
    if (call.index_len[0] != batch) { r = EXT_DECLINE; goto done; }
    if (a[6] != Py_None) {
        int64_t shape[2];
        if ((r = ext_index(&call, a[6], 2, 1, &cache.block_table, shape,
                           &cache.block_table_stride)))
            goto done;
        if (shape[0] != batch || shape[1] < 1) { r = EXT_DECLINE; goto done; }
        cache.max_pages = shape[1];
    } else if (cache.k.shape[0] > batch) {
        /* flash_attn reads batch entry b of a larger cache at row b: the leading rows */
        cache.k.shape[0] = cache.v.shape[0] = batch;
    }
    want_lse = a[8] != Py_None || PyObject_IsTrue(a[9]);
    const int64_t lshape[3] = {batch, q.shape[2], q.shape[1]};
    if ((r = ext_output(&call, a[7], "out", a[0], &q, q.shape, 4, 0, 0, &o))) goto done;
    if (want_lse && (r = ext_output(&call, a[8], "softmax_lse", a[0], &q, lshape, 3, 1, 1, &l)))
        goto done;
    if (a[14] != Py_None && (r = ext_alibi(&call, a[14], batch, q.shape[2], &p))) goto done;
    fa_tensor rcos, rsin;
    if ((a[17] != Py_None) != (a[18] != Py_None)) { r = EXT_DECLINE; goto done; }
    if (a[17] != Py_None) {
        if ((r = ext_input(&call, a[17], "rotary_cos", 2, 1, &rcos)) ||
            (r = ext_input(&call, a[18], "rotary_sin", 2, 1, &rsin)))
            goto done;
        p.rotary_cos = &rcos;
        p.rotary_sin = &rsin;
        p.rotary_interleaved = PyObject_IsTrue(a[19]);
        if (p.rotary_interleaved < 0) goto fail;
    }
    if (a[20] != Py_None) {
        if ((r = ext_index(&call, a[20], 1, 1, &p.cache_leftpad, NULL, NULL))) goto done;
        if (call.index_len[1] != batch) { r = EXT_DECLINE; goto done; }
    }
    EXT_RUN(call, r, c,
            fa_fwd_kvcache(c, &q, &cache, append ? &kn : NULL, append ? &vn : NULL, &p,
                           (int)splits, &o, want_lse ? &l : NULL));
    goto done;
fail:
    r = -1;
done:
    return result(r, &call, 2);
}

/* merge(out_parts, lse_parts, out, lse): lists of parts, and the outputs to write (given:
   the Python layer allocates them) -> (out, lse), or NotImplemented. */
static PyObject *ext_merge(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    NARGS("merge", 4);
    if (!PyList_Check(a[0]) || !PyList_Check(a[1])) return Py_NewRef(Py_NotImplemented);
    const Py_ssize_t np = PyList_GET_SIZE(a[0]);
    if (np < 1 || np != PyList_GET_SIZE(a[1]) || np > 64) return Py_NewRef(Py_NotImplemented);
    ext_call call;
    ext_call_init(&call);
    fa_tensor parts[64], lses[64], o, l;
    PyObject *first[3] = {a[2], a[3], PyList_GET_ITEM(a[0], 0)};
    int r;
    if ((r = ext_kind_of(&call, first, 3))) goto done;
    for (Py_ssize_t i = 0; i < np; i++) {
        /* the first part sets the rank (BSHD or varlen THD) */
        PyObject *op = PyList_GET_ITEM(a[0], i), *lp = PyList_GET_ITEM(a[1], i);
        if ((r = ext_input(&call, op, "out_parts[s]", i ? parts[0].ndim : 0, 1, &parts[i])))
            goto done;
        if (parts[0].ndim < 3) { r = EXT_DECLINE; goto done; }
        if ((r = ext_input(&call, lp, "lse_parts[s]", parts[0].ndim - 1, 0, &lses[i]))) goto done;
    }
    if ((r = ext_output(&call, a[2], "out", a[2], NULL, parts[0].shape, parts[0].ndim, 0, 0, &o)) ||
        (r = ext_output(&call, a[3], "softmax_lse", a[3], NULL, lses[0].shape, lses[0].ndim, 1, 1, &l)))
        goto done;
    EXT_RUN(call, r, c, fa_merge_attn(c, (int)np, parts, lses, &o, &l));
done:
    return result(r, &call, 2);
}

/* ---- settings, records, checks ---- */

/* set_options(threads, strict, algo, device_checks): ints; device_checks -1 keeps the
   library's default. Applied to every context before its next call. */
static PyObject *ext_set_options(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    NARGS("set_options", 4);
    static const char *const names[4] = {"threads", "strict", "algo", "device_checks"};
    int64_t v[4];
    for (int i = 0; i < 4; i++)
        if (as_int_bits(a[i], &v[i], names[i], 32)) return NULL; /* ints in C */
    S.threads = (int)v[0], S.strict = (int)v[1], S.algo = (int)v[2], S.device_checks = (int)v[3];
    S.generation++;
    Py_RETURN_NONE;
}

/* The record of this thread's last successful call, as a tuple (kernel, backend, op, tile_q,
   tile_k, threads, num_splits, workspace_bytes, reason), or None. */
static PyObject *ext_last_selection(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    thread_state *t = state();
    if (!t) return NULL;
    const fa_selection *s = t->last ? fa_last_selection(t->last) : NULL;
    if (!s) Py_RETURN_NONE;
    return Py_BuildValue("(sssiiiins)", s->kernel, s->backend, s->op, s->tile_q, s->tile_k,
                         s->threads, s->num_splits, (Py_ssize_t)s->workspace_bytes, s->reason);
}

static PyObject *ext_clear_selection(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    forget_last();
    Py_RETURN_NONE;
}

/* check(device): fa_context_check on this thread's context of a CUDA device (-1: the CPU's);
   raises the recorded error. */
static PyObject *ext_check(PyObject *self, PyObject *arg) {
    (void)self;
    long dev = PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    if (dev < -1 || dev >= MAX_SLOTS - 1) return PyErr_Format(PyExc_ValueError, "device %ld", dev);
    thread_state *t = state();
    if (!t) return NULL;
    fa_context *c = t->ctx[dev + 1];
    if (c) {
        fa_status st = fa_context_check(c);
        if (st != FA_OK) return raise_status(st, fa_last_error(c));
    }
    Py_RETURN_NONE;
}

static PyObject *ext_version(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(fa_version());
}

static PyObject *ext_has_cuda(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(fa_has_cuda());
}

static PyObject *ext_cpu_features(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(fa_cpu_features());
}

static PyObject *ext_kernel_names(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    const int n = fa_kernel_count();
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *s = PyUnicode_FromString(fa_kernel_name(i));
        if (!s) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, s);
    }
    return l;
}

/* ---- bind: torch's and numpy's objects and the package's error classes ---- */

static int get_attr(PyObject *o, const char *name, PyObject **slot) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) return -1;
    Py_XSETREF(*slot, v);
    return 0;
}

/* bind(error, arg_error, numpy): once, at import. */
static PyObject *ext_bind(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    (void)self;
    NARGS("bind", 3);
    Py_XSETREF(G.error, Py_NewRef(a[0]));
    Py_XSETREF(G.arg_error, Py_NewRef(a[1]));
    if (get_attr(a[2], "ndarray", &G.ndarray_type) || get_attr(a[2], "empty", &G.np_empty) ||
        get_attr(a[2], "float32", &G.np_f32) || get_attr(a[2], "float64", &G.np_f64))
        return NULL;
    Py_RETURN_NONE;
}

/* bind_torch(torch): when the first torch tensor shows up (importing flashattn never imports
   torch). The CUDA entry points are torch._C's: the current raw stream and the caching
   allocator's raw alloc/delete, which honour CUDA-graph capture. */
static PyObject *ext_bind_torch(PyObject *self, PyObject *torch) {
    (void)self;
    PyObject *C = PyObject_GetAttrString(torch, "_C");
    if (!C) return NULL;
    int bad = get_attr(torch, "Tensor", &G.tensor_type) || get_attr(torch, "float32", &G.dt_f32) ||
              get_attr(torch, "float16", &G.dt_f16) || get_attr(torch, "bfloat16", &G.dt_bf16) ||
              get_attr(torch, "float64", &G.dt_f64) || get_attr(torch, "int32", &G.dt_i32) ||
              get_attr(torch, "is_grad_enabled", &G.grad_enabled) ||
              get_attr(torch, "empty_like", &G.empty_like);
    /* FP8 dtypes: optional (a torch without them has no such tensors to pass) */
    if (!bad && PyObject_HasAttrString(torch, "float8_e4m3fn"))
        bad = get_attr(torch, "float8_e4m3fn", &G.dt_f8e4m3);
    if (!bad && PyObject_HasAttrString(torch, "float8_e5m2"))
        bad = get_attr(torch, "float8_e5m2", &G.dt_f8e5m2);
    if (!bad && PyObject_HasAttrString(C, "_cuda_getCurrentRawStream"))
        bad = get_attr(C, "_cuda_getCurrentRawStream", &G.raw_stream) ||
              get_attr(C, "_cuda_cudaCachingAllocator_raw_alloc", &G.raw_alloc) ||
              get_attr(C, "_cuda_cudaCachingAllocator_raw_delete", &G.raw_delete);
    Py_DECREF(C);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef ext_methods[] = {
    {"fwd", (PyCFunction)(void (*)(void))ext_fwd, METH_FASTCALL, "fa_fwd (see ext.c)"},
    {"bwd", (PyCFunction)(void (*)(void))ext_bwd, METH_FASTCALL, "fa_bwd (see ext.c)"},
    {"fwd_kvcache", (PyCFunction)(void (*)(void))ext_fwd_kvcache, METH_FASTCALL,
     "fa_fwd_kvcache (see ext.c)"},
    {"merge", (PyCFunction)(void (*)(void))ext_merge, METH_FASTCALL, "fa_merge_attn"},
    {"set_options", (PyCFunction)(void (*)(void))ext_set_options, METH_FASTCALL,
     "threads, strict, algo, device_checks"},
    {"last_selection", ext_last_selection, METH_NOARGS, "this thread's last kernel record"},
    {"clear_selection", ext_clear_selection, METH_NOARGS, "forgets the last record"},
    {"check", ext_check, METH_O, "fa_context_check on this thread's context of a device"},
    {"version", ext_version, METH_NOARGS, "fa_version() of the linked library"},
    {"has_cuda", ext_has_cuda, METH_NOARGS, "fa_has_cuda()"},
    {"cpu_features", ext_cpu_features, METH_NOARGS, "fa_cpu_features()"},
    {"kernel_names", ext_kernel_names, METH_NOARGS, "every kernel the library contains"},
    {"bind", (PyCFunction)(void (*)(void))ext_bind, METH_FASTCALL, "error classes, numpy"},
    {"bind_torch", ext_bind_torch, METH_O, "torch's tensor type, dtypes, stream, allocator"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ext_module = {PyModuleDef_HEAD_INIT, "flashattn._ext",
                                        "libflashattn's calls for numpy arrays and torch tensors",
                                        -1, ext_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ext(void) {
    if (pthread_key_create(&g_key, thread_state_orphan) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "flashattn._ext: pthread_key_create failed");
        return NULL;
    }
    if (ext_args_init()) return NULL;
    Py_AtExit(reap_orphans); /* runs before the C runtime's exit handlers tear CUDA down */
    return PyModule_Create(&ext_module);
}
