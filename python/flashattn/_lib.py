"""Finding and loading libflashattn, and the ctypes mirror of include/flashattn.h.

The library is looked up in this order, and the first rule that applies is final (a path that
is named but cannot be loaded is an error, never a silent fall-through to another copy):
  1. the FLASHATTN_LIBRARY environment variable (a path to the shared library);
  2. a copy next to this package (placed there by `pip install` when one was found at build time);
  3. the system loader (ctypes.util.find_library("flashattn"): an installed libflashattn.so).
Loading is lazy: importing the package never fails for want of the library; the first call does.
"""

import ctypes
import ctypes.util
import os
import threading

# ---- status codes (fa_status) ----

STATUS_NAMES = {
    0: "FA_OK",
    1: "FA_ERR_NULL_POINTER",
    2: "FA_ERR_INVALID_ARGUMENT",
    3: "FA_ERR_SHAPE",
    4: "FA_ERR_DTYPE",
    5: "FA_ERR_STRIDE",
    6: "FA_ERR_HEAD_DIM",
    7: "FA_ERR_GQA",
    8: "FA_ERR_VARLEN",
    9: "FA_ERR_OVERFLOW",
    10: "FA_ERR_DEVICE",
    11: "FA_ERR_UNSUPPORTED",
    12: "FA_ERR_NO_BACKEND",
    13: "FA_ERR_OUT_OF_MEMORY",
    14: "FA_ERR_WORKSPACE",
    15: "FA_ERR_CUDA",
    16: "FA_ERR_INTERNAL",
    17: "FA_ERR_BUSY",
}
globals().update({name: code for code, name in STATUS_NAMES.items()})

# Statuses that mean "the caller passed something wrong" (raised as FlashAttnArgumentError,
# which is also a ValueError); the rest are conditions of the machine or the build.
ARGUMENT_STATUSES = frozenset(range(1, 11))

# ---- integers crossing into C ----

def c_int(value, name, bits=64):
    """value as a Python int that a signed C integer of `bits` bits holds exactly.

    ctypes (and a C cast) would keep only the low bits of a larger value, so 2**64 - 1 would
    arrive as -1 ("unbounded") and 2**70 as 0: out of range is an OverflowError naming the
    argument instead. Non-integers are a TypeError."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} = {value!r}: expected an integer") from None
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= v <= hi:
        raise OverflowError(f"{name} = {v} is outside the {bits}-bit signed integer range "
                            f"[{lo}, {hi}] that the library takes")
    return v


def c_float(value, name):
    """value as a float that rounds to a nonzero fp32 when it is nonzero: the library reads 0
    as "off" / "the default", so a tiny value must not silently become one."""
    v = float(value)
    # fp32 rounds |v| <= 2^-150 (half its least subnormal, ties to even) to 0; plain arithmetic
    # so that torch.compile traces it
    if v != 0.0 and abs(v) <= 2.0**-150:
        raise ValueError(f"{name} = {v!r} rounds to 0 in float32, which the library reads as "
                         f"the default / off")
    return v


# ---- enums ----

DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F8_E4M3, DTYPE_F64, DTYPE_F8_E5M2 = 0, 1, 2, 3, 4, 5
DEVICE_CPU, DEVICE_CUDA = 0, 1
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
ALGOS = {"auto": 0, "naive": 1, "plain": 2}
PARAMS_VERSION = 3  # FA_PARAMS_VERSION of the header that Params mirrors


class Tensor(ctypes.Structure):
    """fa_tensor: a strided view, strides in elements."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class Params(ctypes.Structure):
    """fa_params, version PARAMS_VERSION of the header (FA_PARAMS_VERSION).

    fa_params_default() is inline in the header, so the library exports no initialiser: the
    defaults are set here. struct_size and version say which fields this mirror has; the
    library refuses (FA_ERR_INVALID_ARGUMENT) a version it does not know or a size that is
    not that version's, so a mirror that drifts from the header fails loudly.
    """
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_batch_stride", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("deterministic", ctypes.c_int),
        # version 2
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("dropout_p", ctypes.c_float),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("descale_batch_stride", ctypes.c_int64),
        # version 3: fa_fwd_kvcache's fused rotary embedding and left padding
        ("rotary_cos", ctypes.c_void_p),  # const fa_tensor *
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_interleaved", ctypes.c_int),
        ("cache_leftpad", ctypes.c_void_p),
    ]

    @classmethod
    def default(cls):
        """What fa_params_default() returns: no mask, no window, scale 1/sqrt(d)."""
        return cls(struct_size=ctypes.sizeof(cls), version=PARAMS_VERSION, window_left=-1,
                   window_right=-1)


class Selection(ctypes.Structure):
    """fa_selection: the dispatcher's record of one call."""
    _fields_ = [
        ("kernel", ctypes.c_char * 64),
        ("backend", ctypes.c_char * 8),
        ("op", ctypes.c_char * 8),
        ("tile_q", ctypes.c_int),
        ("tile_k", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("num_splits", ctypes.c_int),
        ("workspace_bytes", ctypes.c_size_t),
        ("reason", ctypes.c_char * 192),
    ]


class KVCache(ctypes.Structure):
    """fa_kvcache: a contiguous cache, or a page pool addressed through block_table."""
    _fields_ = [
        ("k", Tensor),
        ("v", Tensor),
        ("seqlens", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("max_pages", ctypes.c_int64),
    ]


class LibraryNotFound(OSError):
    """libflashattn could not be found or loaded."""


_P = ctypes.POINTER
_vp = ctypes.c_void_p
_PROTOTYPES = {
    # name: (restype, argtypes)
    "fa_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_version": (ctypes.c_char_p, []),
    "fa_context_create": (ctypes.c_int, [_P(_vp), ctypes.c_int]),
    "fa_context_destroy": (None, [_vp]),
    "fa_context_set_threads": (ctypes.c_int, [_vp, ctypes.c_int]),
    "fa_context_set_stream": (ctypes.c_int, [_vp, _vp]),
    "fa_context_set_algo": (ctypes.c_int, [_vp, ctypes.c_int]),
    "fa_context_set_strict": (ctypes.c_int, [_vp, ctypes.c_int]),
    "fa_last_error": (ctypes.c_char_p, [_vp]),
    "fa_last_selection": (_P(Selection), [_vp]),
    "fa_fwd": (ctypes.c_int, [_vp, _P(Tensor), _P(Tensor), _P(Tensor), _P(Params), _P(Tensor),
                              _P(Tensor)]),
    "fa_bwd": (ctypes.c_int, [_vp, _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor),
                              _P(Tensor), _P(Params), _P(Tensor), _P(Tensor), _P(Tensor)]),
    "fa_fwd_kvcache": (ctypes.c_int, [_vp, _P(Tensor), _P(KVCache), _P(Tensor), _P(Tensor),
                                      _P(Params), ctypes.c_int, _P(Tensor), _P(Tensor)]),
    "fa_fwd_kvcache_workspace_size": (ctypes.c_int, [_vp, _P(Tensor), _P(KVCache), _P(Tensor),
                                                     _P(Tensor), _P(Params), ctypes.c_int,
                                                     _P(ctypes.c_size_t)]),
    "fa_merge_attn": (ctypes.c_int, [_vp, ctypes.c_int, _P(Tensor), _P(Tensor), _P(Tensor),
                                     _P(Tensor)]),
    "fa_context_set_device_checks": (ctypes.c_int, [_vp, ctypes.c_int]),
    "fa_context_check": (ctypes.c_int, [_vp]),
    "fa_cpu_features": (ctypes.c_char_p, []),
    "fa_has_cuda": (ctypes.c_int, []),
    "fa_kernel_count": (ctypes.c_int, []),
    "fa_kernel_name": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_dropout_mask": (ctypes.c_int, [_vp, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_float,
                                       ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64, _vp]),
    "fa_quantize_fp8": (ctypes.c_int, [_vp, _P(Tensor), _P(Tensor), _P(Tensor), ctypes.c_int64,
                                       ctypes.c_int, ctypes.c_uint64]),
}

# Entry points a library built before the KV-cache API lacks: such a library still loads, and
# only the functions that need them fail (require() says which symbol is missing).
_OPTIONAL = frozenset({"fa_dropout_mask", "fa_quantize_fp8", "fa_fwd_kvcache",
                       "fa_fwd_kvcache_workspace_size", "fa_merge_attn",
                       "fa_context_set_device_checks", "fa_context_check"})

_LIB_NAMES = ("libflashattn.so", "libflashattn.dylib", "flashattn.dll")
_lock = threading.Lock()
_lib = None
_lib_path = None


def _locate():
    """(path or loader name, how it was found)."""
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return env, "FLASHATTN_LIBRARY"
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _LIB_NAMES:
        cand = os.path.join(here, name)
        if os.path.exists(cand):
            return cand, "package directory"
    found = ctypes.util.find_library("flashattn")
    if found:
        return found, "system loader"
    raise LibraryNotFound(
        "libflashattn not found: set FLASHATTN_LIBRARY to the path of libflashattn.so "
        "(e.g. build/libflashattn.so after `make build`), install the library "
        "(`make install`), or reinstall this package after building the library so that "
        "`pip install` copies it next to the package")


def lib():
    """The loaded library (loads it on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path, how = _locate()
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise LibraryNotFound(f"cannot load libflashattn from {path!r} ({how}): {e}") from e
            for name, (restype, argtypes) in _PROTOTYPES.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError as e:
                    if name in _OPTIONAL:
                        continue
                    raise LibraryNotFound(
                        f"{path!r} ({how}) lacks {name}: not libflashattn, or too old") from e
                fn.restype = restype
                fn.argtypes = argtypes
            _lib_path = path
            _lib = handle
    return _lib


def library_path():
    """Path (or loader name) of the loaded libflashattn."""
    lib()
    return _lib_path


def has_symbol(name):
    return hasattr(lib(), name)


def require(name, what):
    """Raises NotImplementedError when the loaded library lacks the entry point `name`."""
    if not has_symbol(name):
        raise NotImplementedError(
            f"{what} needs {name}, which the loaded libflashattn ({_lib_path}) lacks: it was "
            f"built before the KV-cache API; rebuild it (make build)")


def status_name(status):
    return STATUS_NAMES.get(status, f"FA_STATUS_{status}")
