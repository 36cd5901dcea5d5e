/*
 * ext_args.h — torch tensors and numpy arrays as fa_tensor views, for flashattn._ext.
 *
 * A call collects what it reads in an ext_call: the kind of its arrays (torch or numpy), their
 * device, the references and buffers to release afterwards, and its outputs. Every reader
 * returns 0 when it took the argument, -1 with a Python exception set, or EXT_DECLINE when the
 * fast path does not take it (the Python layer then normalises the arguments: host index
 * arrays, other integer dtypes, non-native byte orders, layouts that need a copy of a numpy
 * array, ...) and calls again.
 */
#ifndef FLASHATTN_EXT_ARGS_H
#define FLASHATTN_EXT_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <flashattn.h>

#define EXT_DECLINE 1
enum { EXT_TORCH = 1, EXT_NUMPY = 2 };

/* What bind() hands the module: torch's and numpy's objects, the package's error classes. */
typedef struct ext_globals {
    PyObject *tensor_type, *ndarray_type;                 /* NULL while unbound */
    PyObject *dt_f32, *dt_f16, *dt_bf16, *dt_f64, *dt_i32; /* torch dtypes */
    PyObject *dt_f8e4m3, *dt_f8e5m2; /* torch.float8_e4m3fn / _e5m2 (NULL in an older torch) */
    PyObject *raw_stream, *raw_alloc, *raw_delete;         /* torch._C CUDA entry points */
    PyObject *grad_enabled, *empty_like;                   /* torch.is_grad_enabled, ... */
    PyObject *np_empty, *np_f32, *np_f64;                  /* numpy.empty and dtypes */
    PyObject *error, *arg_error;                           /* FlashAttnError, ...ArgumentError */
} ext_globals;
extern ext_globals G;

#define EXT_MAX_KEEP 160
#define EXT_MAX_BUF 140

typedef struct ext_call {
    int kind;   /* EXT_TORCH or EXT_NUMPY */
    int device; /* -1: host memory; else the CUDA device index */
    PyObject *first; /* the argument kind and device were read from (borrowed) */
    PyObject *keep[EXT_MAX_KEEP];
    int nkeep;
    Py_buffer buf[EXT_MAX_BUF];
    int nbuf;
    PyObject *out[3];      /* the outputs the call returns (references held in keep) */
    int64_t index_len[2];  /* length of the 1-d index arrays read (cu_seqlens_q/k, seqlens) */
} ext_call;

/* Interns the attribute names the readers use; once, at module import. */
int ext_args_init(void);

void ext_call_init(ext_call *c);
void ext_call_release(ext_call *c);

/* The kind and device of a call from its first n arguments (None skipped). */
int ext_kind_of(ext_call *c, PyObject *const *xs, int n);
/* EXT_DECLINE when torch's grad mode is on and one of xs requires grad (autograd records). */
int ext_needs_grad(PyObject *const *xs, int n);

/* An attention input of nd dimensions; a torch tensor the library cannot read as it is (last
   dimension not contiguous, broadcast, misaligned) is read through a contiguous copy.
   nd 0 takes any rank. */
int ext_input(ext_call *c, PyObject *x, const char *name, int nd, int last_unit, fa_tensor *t);
/* An input written in place (a KV cache being appended to): never copied. */
int ext_inplace(ext_call *c, PyObject *x, const char *name, int nd, fa_tensor *t);
/* An output: x itself (written as it is), or with x None a new array of `shape` like
   `like_obj` (with f32, an LSE: fp32, or fp64 when like_obj is fp64), kept in c->out[slot].
   With `like` (like_obj's view, torch only) an output of like's shape is strided as like_obj
   (torch.empty_like, as flash_attn does), and the new tensor's known facts are not read back;
   else it is contiguous. */
int ext_output(ext_call *c, PyObject *x, const char *name, PyObject *like_obj,
               const fa_tensor *like, const int64_t *shape, int nd, int f32, int slot,
               fa_tensor *t);
/* ALiBi slopes: fp32, contiguous, (heads_q,) or (batch, heads_q), on the call's device. */
int ext_alibi(ext_call *c, PyObject *x, int64_t batch, int64_t heads_q, fa_params *p);
/* An int32 index array of nd dimensions, contiguous rows, on the call's device; its length
   (1-d) lands in c->index_len[which], its row stride (2-d) in *row_stride. */
int ext_index(ext_call *c, PyObject *x, int nd, int which, const int32_t **ptr,
              int64_t *shape, int64_t *row_stride);

/* The FP8 descales: d None (off, NULL pointers) or (q_descale, k_descale, v_descale,
   batch_stride), each descale None or an fp32 array on the call's device with contiguous rows,
   as the Python layer normalised them (it checks the shapes; EXT_DECLINE otherwise). */
int ext_descales(ext_call *c, PyObject *d, fa_params *p);
/* True for FA_DTYPE_F8_E4M3 / FA_DTYPE_F8_E5M2. */
int ext_is_fp8(fa_dtype dt);

/* No token rows at all (batch, seqlen or total is 0) while heads and head_dim are not. */
int ext_rows_empty(const fa_tensor *t, int varlen);
/* x.fill_(value) (torch) or x.fill(value) (numpy). */
int ext_fill(ext_call *c, PyObject *x, double value);

#endif
