"""numpy arrays and torch tensors as fa_tensor views.

Strides pass through: a view is described to the library as it is, with element strides.
A copy is made only where the library cannot take the layout: a last dimension that is not
contiguous, a zero stride (broadcast / expanded), a negative stride (numpy), a stride that is
not a whole number of elements, a misaligned data pointer, or a non-native byte order.
Dimensions of size 1 are described with stride 1 (any stride is equivalent there).
"""

import contextlib

import numpy as np

from . import _lib, _native

try:  # bfloat16 for numpy
    import ml_dtypes as _ml_dtypes
    _NP_BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only where ml_dtypes is absent
    _ml_dtypes = None
    _NP_BF16 = None

_NP_DTYPES = {np.dtype(np.float32): _lib.DTYPE_F32, np.dtype(np.float16): _lib.DTYPE_F16,
              np.dtype(np.float64): _lib.DTYPE_F64}
if _NP_BF16 is not None:
    _NP_DTYPES[_NP_BF16] = _lib.DTYPE_BF16
    # FP8 inputs of the forward (docs/fp8.md): ml_dtypes' OCP formats
    _NP_DTYPES[np.dtype(_ml_dtypes.float8_e4m3fn)] = _lib.DTYPE_F8_E4M3
    _NP_DTYPES[np.dtype(_ml_dtypes.float8_e5m2)] = _lib.DTYPE_F8_E5M2

_torch = None
_TORCH_DTYPES = None


def _import_torch():
    """torch, if it is importable, else None (imported only when a tensor shows up)."""
    global _torch, _TORCH_DTYPES
    if _torch is None:
        try:
            import torch
        except ImportError:
            return None
        _TORCH_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16,
                         torch.bfloat16: _lib.DTYPE_BF16, torch.float64: _lib.DTYPE_F64}
        for name, code in (("float8_e4m3fn", _lib.DTYPE_F8_E4M3),
                           ("float8_e5m2", _lib.DTYPE_F8_E5M2)):
            if hasattr(torch, name):  # FP8 forward inputs (docs/fp8.md)
                _TORCH_DTYPES[getattr(torch, name)] = code
        if _native.ext is not None:
            _native.ext.bind_torch(torch)
        _torch = torch
        from . import _torch_ops  # noqa: F401  (the torch.library ops, for torch.compile)
    return _torch


def is_torch(x):
    if type(x).__module__.split(".")[0] != "torch":
        return False
    torch = _import_torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _describe(x):
    return f"{type(x).__module__}.{type(x).__name__}"


def _view(data, fa_dtype, device, shape, strides):
    if 0 in shape:  # no element: strides mean nothing; let the library judge the shape
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= max(n, 1)
    t = _lib.Tensor()
    t.data = data
    t.dtype = fa_dtype
    t.device = device
    t.ndim = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.stride[i] = 1 if n == 1 else s
    return t


def _needs_copy(shape, strides, last_unit):
    for i, (n, s) in enumerate(zip(shape, strides)):
        if n <= 1:
            continue
        if s is None or s <= 0:
            return True
        if last_unit and i == len(shape) - 1 and s != 1:
            return True
    return False


class NumpyOps:
    name = "numpy"

    @staticmethod
    def accepts(x):
        return isinstance(x, np.ndarray)

    @staticmethod
    def fa_dtype(x):
        dt = x.dtype
        if not dt.isnative:
            dt = dt.newbyteorder("=")
        code = _NP_DTYPES.get(dt)
        if code is None:
            hint = (" (bfloat16 needs the ml_dtypes package)" if _NP_BF16 is None else "")
            raise TypeError(f"unsupported numpy dtype {x.dtype}: use float32, float16 or "
                            f"ml_dtypes.bfloat16{hint} (ml_dtypes.float8_e4m3fn / float8_e5m2 "
                            f"as forward inputs; float64 only with algo='naive')")
        return code

    @staticmethod
    def _elem_strides(x):
        es = x.dtype.itemsize
        return [s // es if s % es == 0 else None for s in x.strides]

    @classmethod
    def prepare(cls, x, last_unit=True):
        """x itself when the library can read it, else a contiguous native-order copy."""
        cls.fa_dtype(x)
        if (not x.dtype.isnative or x.ctypes.data % x.dtype.itemsize != 0
                or _needs_copy(x.shape, cls._elem_strides(x), last_unit)):
            # a real copy: ascontiguousarray may hand back misaligned memory as it is
            x = np.array(x, dtype=x.dtype.newbyteorder("="), order="C", copy=True)
        return x

    @classmethod
    def view(cls, x):
        """fa_tensor of x as it is (outputs: the library reports a layout it cannot write)."""
        strides = cls._elem_strides(x)
        if any(s is None for s in strides):
            raise ValueError(f"array strides {x.strides} are not whole multiples of its "
                             f"{x.dtype.itemsize}-byte elements")
        if not x.dtype.isnative:
            raise ValueError("output arrays must be in native byte order")
        return _view(x.ctypes.data, cls.fa_dtype(x), _lib.DEVICE_CPU, x.shape, strides)

    @staticmethod
    def place(x):
        """(fa device, device index, stream handle)."""
        return _lib.DEVICE_CPU, 0, 0

    @staticmethod
    def guard(x):
        return contextlib.nullcontext()

    @staticmethod
    def empty(shape, like, dtype=None):
        return np.empty(shape, dtype=like.dtype if dtype is None else _np_dtype(dtype))

    @staticmethod
    def full(shape, like, value, dtype=None):
        return np.full(shape, value, dtype=like.dtype if dtype is None else _np_dtype(dtype))

    @staticmethod
    def small(x, dtype, like, name):
        """An auxiliary array (ALiBi slopes, cu_seqlens) as a C-contiguous array of dtype."""
        if is_torch(x):
            x = x.detach().cpu().numpy()
        a = np.asarray(x)
        if dtype == "int32":
            if a.dtype.kind not in "iu":
                raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
            if a.size and (a.min() < -2**31 or a.max() >= 2**31):
                raise ValueError(f"{name} does not fit in int32")
        return np.ascontiguousarray(a, dtype=_np_dtype(dtype))

    @staticmethod
    def ptr(x):
        return x.ctypes.data

    @staticmethod
    def to_host_list(x):
        return [int(v) for v in x]


def _np_dtype(name):
    if name == "bfloat16":  # an FP8 call's output (ml_dtypes is there: the inputs need it)
        return _NP_BF16
    return {"float32": np.float32, "int32": np.int32, "float64": np.float64}[name]


class TorchOps:
    name = "torch"

    @staticmethod
    def accepts(x):
        return is_torch(x)

    @staticmethod
    def fa_dtype(x):
        code = _TORCH_DTYPES.get(x.dtype)
        if code is None:
            raise TypeError(f"unsupported torch dtype {x.dtype}: use float32, float16 or "
                            f"bfloat16 (float8_e4m3fn / float8_e5m2 as forward inputs; float64 "
                            f"only with algo='naive')")
        return code

    @classmethod
    def prepare(cls, x, last_unit=True):
        cls.fa_dtype(x)
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"tensor on {x.device}: flashattn takes CPU and CUDA tensors")
        if (x.data_ptr() % x.element_size() != 0
                or _needs_copy(x.shape, x.stride(), last_unit)):
            x = x.contiguous()
        return x

    @classmethod
    def view(cls, x):
        dev = _lib.DEVICE_CUDA if x.device.type == "cuda" else _lib.DEVICE_CPU
        return _view(x.data_ptr(), cls.fa_dtype(x), dev, tuple(x.shape), x.stride())

    @staticmethod
    def place(x):
        if x.device.type == "cuda":
            idx = x.device.index if x.device.index is not None else _torch.cuda.current_device()
            stream = _torch.cuda.current_stream(idx).cuda_stream
            return _lib.DEVICE_CUDA, idx, stream
        return _lib.DEVICE_CPU, 0, 0

    @staticmethod
    def guard(x):
        if x.device.type == "cuda":
            return _torch.cuda.device(x.device)
        return contextlib.nullcontext()

    @staticmethod
    def empty(shape, like, dtype=None):
        dt = like.dtype if dtype is None else getattr(_torch, dtype)
        return _torch.empty(shape, dtype=dt, device=like.device)

    @staticmethod
    def full(shape, like, value, dtype=None):
        dt = like.dtype if dtype is None else getattr(_torch, dtype)
        return _torch.full(shape, value, dtype=dt, device=like.device)

    @staticmethod
    def small(x, dtype, like, name):
        dt = getattr(_torch, dtype)
        if not is_torch(x):
            a = np.asarray(x)
            if dtype == "int32" and a.dtype.kind not in "iu":
                raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
            x = _torch.as_tensor(a)
        elif dtype == "int32" and (x.is_floating_point() or x.is_complex()):
            raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
        if (dtype == "int32" and x.dtype != dt and x.numel()
                and not (x.is_cuda and _torch.cuda.is_current_stream_capturing())):
            # .to(int32) keeps the low 32 bits: a wider value must not wrap silently (on a GPU
            # this reads two values back; not possible while a CUDA graph is captured)
            lo, hi = int(x.min()), int(x.max())
            if lo < -2**31 or hi >= 2**31:
                raise OverflowError(f"{name} holds {lo if lo < -2**31 else hi}, which does not "
                                    f"fit in int32")
        return x.detach().to(device=like.device, dtype=dt).contiguous()

    @staticmethod
    def ptr(x):
        return x.data_ptr()

    @staticmethod
    def to_host_list(x):
        return [int(v) for v in x.tolist()]


def ops_for(*tensors):
    """The adapter for a call's tensors (None entries are skipped); they must agree."""
    found = None
    for x in tensors:
        if x is None:
            continue
        if NumpyOps.accepts(x):
            ops = NumpyOps
        elif is_torch(x):
            ops = TorchOps
        else:
            raise TypeError(f"expected numpy arrays or torch tensors, got {_describe(x)}")
        if found is not None and ops is not found:
            raise TypeError("mixed numpy arrays and torch tensors in one call; use one kind")
        found = ops
    return found
