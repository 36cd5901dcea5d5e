/*
 * ext_args.c — reading torch tensors (through their methods, no libtorch) and numpy arrays
 * (through the buffer protocol) as fa_tensor views; allocating outputs.
 */
#include "ext_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Attribute names, interned once (ext_args_init). */
static PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_is_cuda, *s_is_cpu,
    *s_get_device, *s_contiguous, *s_new_empty, *s_requires_grad, *s_fill_, *s_fill, *s_view,
    *s_device, *s_uint16, *s_uint8, *s_name;

int ext_args_init(void) {
    struct {
        PyObject **slot;
        const char *s;
    } names[] = {{&s_data_ptr, "data_ptr"},     {&s_shape, "shape"},
                 {&s_stride, "stride"},         {&s_dtype, "dtype"},
                 {&s_is_cuda, "is_cuda"},       {&s_is_cpu, "is_cpu"},
                 {&s_get_device, "get_device"}, {&s_contiguous, "contiguous"},
                 {&s_new_empty, "new_empty"},   {&s_requires_grad, "requires_grad"},
                 {&s_fill_, "fill_"},           {&s_fill, "fill"},
                 {&s_view, "view"},             {&s_device, "device"},
                 {&s_uint16, "uint16"},         {&s_uint8, "uint8"},
                 {&s_name, "name"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].s))) return -1;
    return 0;
}

/* Only the counters and scalars: the keep and buffer arrays (12 KB) are filled before they
   are read, and clearing them was a share of the call's host time (perf python_door P3). */
void ext_call_init(ext_call *c) {
    c->kind = 0;
    c->device = -1;
    c->first = NULL;
    c->nkeep = c->nbuf = 0;
    c->out[0] = c->out[1] = c->out[2] = NULL;
    c->index_len[0] = c->index_len[1] = 0;
}

void ext_call_release(ext_call *c) {
    for (int i = 0; i < c->nbuf; i++) PyBuffer_Release(&c->buf[i]);
    for (int i = 0; i < c->nkeep; i++) Py_DECREF(c->keep[i]);
    c->nbuf = c->nkeep = 0;
}

/* Holds a new reference for the rest of the call. */
static int keep(ext_call *c, PyObject *o) {
    if (c->nkeep == EXT_MAX_KEEP) {
        Py_DECREF(o);
        PyErr_SetString(PyExc_RuntimeError, "flashattn._ext: too many arguments in one call");
        return -1;
    }
    c->keep[c->nkeep++] = o;
    return 0;
}

static int is_torch(PyObject *x) {
    return G.tensor_type && PyObject_TypeCheck(x, (PyTypeObject *)G.tensor_type);
}

static int is_numpy(PyObject *x) {
    return G.ndarray_type && PyObject_TypeCheck(x, (PyTypeObject *)G.ndarray_type);
}

/* Contiguous strides for t's shape, dimensions of size 0 or 1 counted as 1: what a tensor
   with no element is given (its strides mean nothing), and what a new contiguous one has. */
static void contiguous_strides(fa_tensor *t) {
    int64_t acc = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = acc;
        acc *= t->shape[i] > 1 ? t->shape[i] : 1;
    }
}

/* ---- torch ---- */

static int torch_dtype(PyObject *x, fa_dtype *dt, int *is_i32) {
    PyObject *d = PyObject_GetAttr(x, s_dtype);
    if (!d) return -1;
    *is_i32 = d == G.dt_i32;
    int ok = 1;
    if (d == G.dt_f32) *dt = FA_DTYPE_F32;
    else if (d == G.dt_f16) *dt = FA_DTYPE_F16;
    else if (d == G.dt_bf16) *dt = FA_DTYPE_BF16;
    else if (d == G.dt_f64) *dt = FA_DTYPE_F64;
    else if (G.dt_f8e4m3 && d == G.dt_f8e4m3) *dt = FA_DTYPE_F8_E4M3;
    else if (G.dt_f8e5m2 && d == G.dt_f8e5m2) *dt = FA_DTYPE_F8_E5M2;
    else ok = 0;
    Py_DECREF(d);
    return ok ? 0 : 1;
}

/* -1: host memory; else the CUDA device index; -2 with an exception for other devices. */
static int torch_device(PyObject *x) {
    PyObject *cu = PyObject_GetAttr(x, s_is_cuda);
    if (!cu) return -2;
    const int cuda = cu == Py_True;
    Py_DECREF(cu);
    if (cuda) {
        PyObject *d = PyObject_CallMethodNoArgs(x, s_get_device);
        if (!d) return -2;
        long dev = PyLong_AsLong(d);
        Py_DECREF(d);
        return dev < 0 && PyErr_Occurred() ? -2 : (int)dev;
    }
    PyObject *cpu = PyObject_GetAttr(x, s_is_cpu);
    if (!cpu) return -2;
    const int host = cpu == Py_True;
    Py_DECREF(cpu);
    if (host) return -1;
    PyObject *dev = PyObject_GetAttr(x, s_device);
    PyErr_Format(PyExc_ValueError, "tensor on %R: flashattn takes CPU and CUDA tensors", dev);
    Py_XDECREF(dev);
    return -2;
}

/* Shape, element strides and data pointer of a torch tensor. */
static int torch_layout(PyObject *x, fa_tensor *t) {
    PyObject *shape = PyObject_GetAttr(x, s_shape);
    if (!shape) return -1;
    PyObject *stride = PyObject_CallMethodNoArgs(x, s_stride);
    PyObject *ptr = stride ? PyObject_CallMethodNoArgs(x, s_data_ptr) : NULL;
    int r = -1;
    if (ptr && PyTuple_Check(shape) && PyTuple_Check(stride)) {
        const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        if (nd > 4 || PyTuple_GET_SIZE(stride) != nd) {
            PyErr_Format(PyExc_ValueError, "tensor of %zd dimensions: expected at most 4", nd);
        } else {
            t->ndim = (int)nd;
            for (Py_ssize_t i = 0; i < nd; i++) {
                t->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
                t->stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
            }
            t->data = PyLong_AsVoidPtr(ptr);
            r = PyErr_Occurred() ? -1 : 0;
        }
    }
    Py_XDECREF(ptr);
    Py_XDECREF(stride);
    Py_DECREF(shape);
    return r;
}

/* ---- numpy (buffer protocol) ---- */

/* fa dtype of a buffer format; 0 when the format is not one the library reads. view is the
   dtype of an ml_dtypes array read through a view of its bits (0: none). */
static int numpy_dtype(const Py_buffer *b, fa_dtype view, fa_dtype *dt) {
    const char *f = b->format ? b->format : "B";
    if (*f == '=' || *f == '@') f++;
    if (view == FA_DTYPE_BF16) return strcmp(f, "H") == 0 ? (*dt = FA_DTYPE_BF16, 1) : 0;
    if (view) return strcmp(f, "B") == 0 ? (*dt = view, 1) : 0; /* FP8: one byte */
    if (strcmp(f, "f") == 0) return *dt = FA_DTYPE_F32, 1;
    if (strcmp(f, "e") == 0) return *dt = FA_DTYPE_F16, 1;
    if (strcmp(f, "d") == 0) return *dt = FA_DTYPE_F64, 1;
    return 0;
}

/* The fa dtype of an ml_dtypes array (bfloat16, float8_e4m3fn, float8_e5m2), which numpy
   cannot export in a buffer; 0 for any other array. */
static fa_dtype numpy_ml_dtype(PyObject *x) {
    PyObject *d = PyObject_GetAttr(x, s_dtype);
    PyObject *n = d ? PyObject_GetAttr(d, s_name) : NULL;
    fa_dtype r = 0;
    if (n && PyUnicode_Check(n)) {
        if (PyUnicode_CompareWithASCIIString(n, "bfloat16") == 0) r = FA_DTYPE_BF16;
        else if (PyUnicode_CompareWithASCIIString(n, "float8_e4m3fn") == 0) r = FA_DTYPE_F8_E4M3;
        else if (PyUnicode_CompareWithASCIIString(n, "float8_e5m2") == 0) r = FA_DTYPE_F8_E5M2;
    }
    Py_XDECREF(n);
    Py_XDECREF(d);
    PyErr_Clear();
    return r;
}

/* The array's buffer, as an fa_tensor; EXT_DECLINE for what the Python layer must convert. */
static int numpy_view(ext_call *c, PyObject *x, int writable, fa_tensor *t) {
    if (c->nbuf == EXT_MAX_BUF) {
        PyErr_SetString(PyExc_RuntimeError, "flashattn._ext: too many arrays in one call");
        return -1;
    }
    const int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
    Py_buffer *b = &c->buf[c->nbuf];
    fa_dtype ml = 0;
    if (PyObject_GetBuffer(x, b, flags) != 0) {
        PyErr_Clear();
        if (!(ml = numpy_ml_dtype(x))) return EXT_DECLINE;
        PyObject *u =
            PyObject_CallMethodOneArg(x, s_view, ml == FA_DTYPE_BF16 ? s_uint16 : s_uint8);
        if (!u) return -1;
        if (keep(c, u)) return -1;
        if (PyObject_GetBuffer(u, b, flags) != 0) {
            PyErr_Clear();
            return EXT_DECLINE;
        }
    }
    c->nbuf++;
    fa_dtype dt;
    if (!numpy_dtype(b, ml, &dt) || b->ndim > 4) return EXT_DECLINE;
    t->data = b->buf;
    t->dtype = dt;
    t->device = FA_DEVICE_CPU;
    t->ndim = b->ndim;
    for (int i = 0; i < b->ndim; i++) {
        if (b->strides[i] % b->itemsize) return EXT_DECLINE;
        t->shape[i] = b->shape[i];
        t->stride[i] = b->strides[i] / b->itemsize;
    }
    return 0;
}

/* ---- common ---- */

int ext_kind_of(ext_call *c, PyObject *const *xs, int n) {
    for (int i = 0; i < n; i++) {
        PyObject *x = xs[i];
        if (x == Py_None) continue;
        const int kind = is_torch(x) ? EXT_TORCH : is_numpy(x) ? EXT_NUMPY : 0;
        if (!kind || (c->kind && kind != c->kind)) return EXT_DECLINE; /* Python says why */
        if (!c->kind) {
            c->kind = kind;
            c->first = x;
            if (kind == EXT_TORCH && (c->device = torch_device(x)) == -2) return -1;
        }
    }
    return c->kind ? 0 : EXT_DECLINE;
}

int ext_needs_grad(PyObject *const *xs, int n) {
    PyObject *on = PyObject_CallNoArgs(G.grad_enabled);
    if (!on) return -1;
    const int enabled = on == Py_True;
    Py_DECREF(on);
    if (!enabled) return 0;
    for (int i = 0; i < n; i++) {
        if (xs[i] == Py_None) continue;
        PyObject *r = PyObject_GetAttr(xs[i], s_requires_grad);
        if (!r) return -1;
        const int req = r == Py_True;
        Py_DECREF(r);
        if (req) return EXT_DECLINE;
    }
    return 0;
}

/* Raises FlashAttnArgumentError(status, message), as the library's own checks would. */
static void *fail_status(fa_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!msg) return NULL;
    PyObject *cls = G.arg_error ? G.arg_error : PyExc_ValueError;
    PyObject *e = PyObject_CallFunction(cls, "iO", (int)st, msg);
    Py_DECREF(msg);
    if (e) {
        PyErr_SetObject(cls, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* Device of a torch operand against the call's; an error naming both when they differ. */
static int same_device(ext_call *c, PyObject *x, const char *name) {
    const int dev = torch_device(x);
    if (dev == -2) return -1;
    if (dev == c->device) return 0;
    char a[16], b[16];
    if (dev < 0) snprintf(a, sizeof a, "cpu");
    else snprintf(a, sizeof a, "cuda:%d", dev);
    if (c->device < 0) snprintf(b, sizeof b, "cpu");
    else snprintf(b, sizeof b, "cuda:%d", c->device);
    fail_status(FA_ERR_DEVICE, "%s is on %s but the call's first tensor is on %s", name, a,
                b);
    return -1;
}

static void check_ndim_msg(const char *name, const fa_tensor *t, int nd) {
    PyObject *shape = PyTuple_New(t->ndim);
    if (!shape) return;
    for (int i = 0; i < t->ndim; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t->shape[i]));
    PyErr_Format(PyExc_ValueError, "%s has shape %R: expected %d dimensions %s", name, shape, nd,
                 nd == 3 ? "(total, heads, head_dim) (varlen)"
                         : "(batch, seqlen, heads, head_dim)");
    Py_DECREF(shape);
}

/* A torch tensor read as it is, or through x.contiguous() when the library could not read
   it (copy_ok), like the ctypes layer's prepare(). */
static int torch_view(ext_call *c, PyObject *x, const char *name, int copy_ok, int last_unit,
                      fa_tensor *t) {
    if (x != c->first && same_device(c, x, name)) return -1; /* the first one set the device */
    int i32;
    fa_dtype dt;
    int r = torch_dtype(x, &dt, &i32);
    if (r < 0) return -1;
    if (r) {
        PyObject *d = PyObject_GetAttr(x, s_dtype);
        PyErr_Format(PyExc_TypeError,
                     "unsupported torch dtype %R for %s: use float32, float16 or bfloat16 "
                     "(float8_e4m3fn / float8_e5m2 as forward inputs; float64 only with "
                     "algo='naive')",
                     d, name);
        Py_XDECREF(d);
        return -1;
    }
    if (torch_layout(x, t)) return -1;
    t->dtype = dt;
    t->device = c->device >= 0 ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
    const size_t es = fa_dtype_size(dt);
    int need_copy = (uintptr_t)t->data % es != 0;
    int empty = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) empty = 1;
        if (t->shape[i] <= 1) continue;
        if (t->stride[i] <= 0 || (last_unit && i == t->ndim - 1 && t->stride[i] != 1))
            need_copy = 1;
    }
    if (empty) { /* no element: strides mean nothing; give the library contiguous ones */
        contiguous_strides(t);
        return 0;
    }
    if (need_copy) {
        if (!copy_ok) return EXT_DECLINE;
        PyObject *y = PyObject_CallMethodNoArgs(x, s_contiguous);
        if (!y || keep(c, y)) return -1;
        return torch_view(c, y, name, 0, last_unit, t);
    }
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 1) t->stride[i] = 1; /* any stride is equivalent there */
    return 0;
}

static int view_of(ext_call *c, PyObject *x, const char *name, int copy_ok, int writable,
                   int last_unit, fa_tensor *t) {
    if (c->kind == EXT_TORCH) {
        if (!is_torch(x)) return EXT_DECLINE;
        return torch_view(c, x, name, copy_ok, last_unit, t);
    }
    if (!is_numpy(x)) return EXT_DECLINE;
    int r = numpy_view(c, x, writable, t);
    if (r) return r;
    /* numpy copies (byte order, negative strides, ...) stay in the Python layer */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) { /* no element: contiguous strides, as for torch */
            contiguous_strides(t);
            return 0;
        }
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 1) {
            t->stride[i] = 1;
            continue;
        }
        if (t->stride[i] <= 0 || (last_unit && i == t->ndim - 1 && t->stride[i] != 1))
            return copy_ok ? EXT_DECLINE : 0;
    }
    if ((uintptr_t)t->data % fa_dtype_size(t->dtype)) return EXT_DECLINE;
    return 0;
}

int ext_input(ext_call *c, PyObject *x, const char *name, int nd, int last_unit, fa_tensor *t) {
    int r = view_of(c, x, name, 1, 0, last_unit, t);
    if (r) return r;
    if (nd && t->ndim != nd) {
        check_ndim_msg(name, t, nd);
        return -1;
    }
    return 0;
}

int ext_inplace(ext_call *c, PyObject *x, const char *name, int nd, fa_tensor *t) {
    int r = view_of(c, x, name, 0, 1, 1, t);
    if (r) return r;
    if (t->ndim != nd) {
        check_ndim_msg(name, t, nd);
        return -1;
    }
    return 0;
}

/* A new array: like_obj.new_empty(shape[, dtype=float32]) or numpy.empty(shape, dtype). */
static PyObject *new_array(ext_call *c, PyObject *like_obj, const int64_t *shape, int nd,
                           int f32) {
    PyObject *tup = PyTuple_New(nd);
    if (!tup) return NULL;
    for (int i = 0; i < nd; i++) {
        PyObject *v = PyLong_FromLongLong(shape[i]);
        if (!v) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, v);
    }
    PyObject *r;
    if (c->kind == EXT_TORCH) {
        if (f32) {
            /* an LSE: fp32, or fp64 beside fp64 inputs (the float64 reference) */
            PyObject *ld = PyObject_GetAttr(like_obj, s_dtype);
            if (!ld) {
                Py_DECREF(tup);
                return NULL;
            }
            PyObject *args[] = {like_obj, tup, ld == G.dt_f64 ? G.dt_f64 : G.dt_f32};
            Py_DECREF(ld); /* torch's dtype objects are immortal singletons */
            PyObject *kw = Py_BuildValue("(s)", "dtype");
            r = kw ? PyObject_VectorcallMethod(s_new_empty, args,
                                               2, kw)
                   : NULL;
            Py_XDECREF(kw);
        } else {
            r = PyObject_CallMethodOneArg(like_obj, s_new_empty, tup);
        }
    } else {
        PyObject *dt = PyObject_GetAttr(like_obj, s_dtype);
        if (dt && f32) {
            PyObject *size = PyObject_GetAttrString(dt, "itemsize");
            const long is = size ? PyLong_AsLong(size) : -1;
            Py_XDECREF(size);
            const int f64 = is == 8 && PyObject_RichCompareBool(dt, G.np_f64, Py_EQ) == 1;
            Py_SETREF(dt, Py_NewRef(f64 ? G.np_f64 : G.np_f32));
        }
        r = dt ? PyObject_CallFunctionObjArgs(G.np_empty, tup, dt, NULL) : NULL;
        Py_XDECREF(dt);
    }
    Py_DECREF(tup);
    return r;
}

/* Strides (read when !contiguous, else computed) and pointer of a torch tensor this call just
   made, whose shape, dtype and device it knows: two attribute reads instead of six. 1 when the
   strides are not what an output needs (last dimension contiguous). */
static int fresh_layout(PyObject *y, int contiguous, fa_tensor *t) {
    int empty = 0;
    for (int i = 0; i < t->ndim; i++) empty |= t->shape[i] == 0;
    if (contiguous || empty) {
        contiguous_strides(t);
    } else {
        PyObject *stride = PyObject_CallMethodNoArgs(y, s_stride);
        if (!stride) return -1;
        int bad = !PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != t->ndim;
        for (int i = 0; !bad && i < t->ndim; i++) {
            t->stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
            if (t->shape[i] > 1 && (t->stride[i] <= 0 || (i == t->ndim - 1 && t->stride[i] != 1)))
                bad = 1;
        }
        Py_DECREF(stride);
        if (PyErr_Occurred()) return -1;
        if (bad) return 1;
    }
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 1) t->stride[i] = 1;
    PyObject *ptr = PyObject_CallMethodNoArgs(y, s_data_ptr);
    if (!ptr) return -1;
    t->data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (PyErr_Occurred()) return -1;
    return (uintptr_t)t->data % fa_dtype_size(t->dtype) ? 1 : 0;
}

/* A new torch output of like's dtype (f32: an LSE, fp32 or fp64 beside fp64) and device: where
   it has like's shape, empty_like(like), strided as like is (flash_attn's choice for out and
   the gradients); else, or when those strides would not do, like.new_empty(shape). */
static int torch_output(ext_call *c, PyObject *like_obj, const fa_tensor *like,
                        const int64_t *shape, int nd, int f32, int slot, fa_tensor *t) {
    t->ndim = nd;
    for (int i = 0; i < nd; i++) t->shape[i] = shape[i];
    t->dtype = !f32 ? like->dtype : like->dtype == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    t->device = like->device;
    int same = !f32 && G.empty_like && like->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = like->shape[i] == shape[i];
    if (same) {
        PyObject *y = PyObject_CallOneArg(G.empty_like, like_obj);
        if (!y || keep(c, y)) return -1;
        const int r = fresh_layout(y, 0, t);
        if (r <= 0) {
            c->out[slot] = y;
            return r;
        }
    }
    PyObject *y = new_array(c, like_obj, shape, nd, f32);
    if (!y || keep(c, y)) return -1;
    c->out[slot] = y;
    const int r = fresh_layout(y, 1, t);
    return r > 0 ? EXT_DECLINE : r;
}

int ext_output(ext_call *c, PyObject *x, const char *name, PyObject *like_obj,
               const fa_tensor *like, const int64_t *shape, int nd, int f32, int slot,
               fa_tensor *t) {
    if (x == Py_None && like && c->kind == EXT_TORCH)
        return torch_output(c, like_obj, like, shape, nd, f32, slot, t);
    if (x == Py_None) {
        PyObject *y = new_array(c, like_obj, shape, nd, f32);
        if (!y || keep(c, y)) return -1;
        x = y;
    } else {
        Py_INCREF(x);
        if (keep(c, x)) return -1;
    }
    c->out[slot] = x;
    return view_of(c, x, name, 0, 1, 1, t);
}

/* An auxiliary array: right kind, dtype and device, contiguous; else EXT_DECLINE. */
static int aux_view(ext_call *c, PyObject *x, int want_i32, fa_tensor *t) {
    if (c->kind == EXT_TORCH) {
        if (!is_torch(x)) return EXT_DECLINE;
        const int dev = torch_device(x);
        if (dev == -2) return -1;
        if (dev != c->device) return EXT_DECLINE;
        int i32;
        fa_dtype dt = FA_DTYPE_F64;
        int r = torch_dtype(x, &dt, &i32);
        if (r < 0) return -1;
        if (want_i32 ? !i32 : (r || dt != FA_DTYPE_F32)) return EXT_DECLINE;
        if (torch_layout(x, t)) return -1;
    } else {
        if (!is_numpy(x) || c->nbuf == EXT_MAX_BUF) return EXT_DECLINE;
        Py_buffer *b = &c->buf[c->nbuf];
        if (PyObject_GetBuffer(x, b, PyBUF_RECORDS_RO) != 0) {
            PyErr_Clear();
            return EXT_DECLINE;
        }
        c->nbuf++;
        const char *f = b->format ? b->format : "B";
        if (*f == '=' || *f == '@') f++;
        const int ok = want_i32 ? b->itemsize == 4 && (!strcmp(f, "i") || !strcmp(f, "l"))
                                : !strcmp(f, "f");
        if (!ok || b->ndim > 4) return EXT_DECLINE;
        t->ndim = b->ndim;
        t->data = b->buf;
        for (int i = 0; i < b->ndim; i++) {
            t->shape[i] = b->shape[i];
            t->stride[i] = b->strides[i] / 4;
            if (b->strides[i] % 4) return EXT_DECLINE;
        }
    }
    /* contiguous rows: the last dimension's stride is 1 */
    if (t->ndim >= 1 && t->shape[t->ndim - 1] > 1 && t->stride[t->ndim - 1] != 1)
        return EXT_DECLINE;
    return 0;
}

int ext_alibi(ext_call *c, PyObject *x, int64_t batch, int64_t heads_q, fa_params *p) {
    fa_tensor t;
    int r = aux_view(c, x, 0, &t);
    if (r) return r;
    if (t.ndim == 1 && t.shape[0] == heads_q) p->alibi_batch_stride = 0;
    else if (t.ndim == 2 && t.shape[0] == batch && t.shape[1] == heads_q &&
             (batch == 1 || t.stride[0] >= heads_q))
        p->alibi_batch_stride = batch == 1 ? heads_q : t.stride[0];
    else return EXT_DECLINE; /* the Python layer names the expected shapes */
    p->alibi_slopes = t.data;
    return 0;
}

int ext_index(ext_call *c, PyObject *x, int nd, int which, const int32_t **ptr,
              int64_t *shape, int64_t *row_stride) {
    fa_tensor t;
    int r = aux_view(c, x, 1, &t);
    if (r) return r;
    if (t.ndim != nd) return EXT_DECLINE;
    if (nd == 1) c->index_len[which] = t.shape[0];
    if (shape)
        for (int i = 0; i < nd; i++) shape[i] = t.shape[i];
    if (row_stride) *row_stride = nd == 2 && t.shape[0] > 1 ? t.stride[0] : t.shape[nd - 1];
    *ptr = t.data;
    return 0;
}

int ext_is_fp8(fa_dtype dt) { return dt == FA_DTYPE_F8_E4M3 || dt == FA_DTYPE_F8_E5M2; }

int ext_descales(ext_call *c, PyObject *d, fa_params *p) {
    if (d == Py_None) return 0;
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 4) {
        PyErr_Format(PyExc_TypeError,
                     "descales = %R, expected None or (q_descale, k_descale, v_descale, "
                     "batch_stride)",
                     d);
        return -1;
    }
    const float **slot[3] = {&p->q_descale, &p->k_descale, &p->v_descale};
    for (int i = 0; i < 3; i++) {
        PyObject *x = PyTuple_GET_ITEM(d, i);
        if (x == Py_None) continue;
        fa_tensor t;
        int r = aux_view(c, x, 0, &t);
        if (r) return r;
        if (t.ndim != 2) return EXT_DECLINE; /* the Python layer names the expected shape */
        *slot[i] = t.data;
    }
    const long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(d, 3));
    if (s == -1 && PyErr_Occurred()) return -1;
    p->descale_batch_stride = s;
    return 0;
}

int ext_rows_empty(const fa_tensor *t, int varlen) {
    const int rows = varlen ? t->shape[0] == 0 : t->shape[0] == 0 || t->shape[1] == 0;
    return rows && t->shape[t->ndim - 1] > 0 && t->shape[t->ndim - 2] > 0;
}

int ext_fill(ext_call *c, PyObject *x, double value) {
    PyObject *v = PyFloat_FromDouble(value);
    if (!v) return -1;
    PyObject *r = PyObject_CallMethodOneArg(x, c->kind == EXT_TORCH ? s_fill_ : s_fill, v);
    Py_DECREF(v);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}
