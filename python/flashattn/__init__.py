"""flashattn: exact attention through libflashattn, for numpy and PyTorch.

Drop-in functions of the flash_attn package (flash_attn_func, flash_attn_varlen_func, ...),
flash_attn_with_kvcache (paged KV cache) with merge_attn for partial results, the lower-level
attention_forward / attention_backward, quantize_fp8 (FP8 inputs with their descales, forward
only, CPU backend), and a view of which kernel ran (last_selection).
Calls go through the C extension flashattn._ext, or through ctypes where it is absent
(binding() says which); torch.compile and torch.export see them as the torch.library ops
flashattn_c::fwd, ::bwd and ::fwd_kvcache.
"""

import numpy as _np

from ._context import (FlashAttnArgumentError, FlashAttnError, Selection, check, get_options,
                       last_selection, set_options)
from ._core import attention_backward, attention_forward
from ._dropout import dropout_mask
from ._kvcache import merge_attn
from ._lib import LibraryNotFound, library_path
from ._native import binding, binding_reason
from ._quantize import quantize_fp8
from .flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func,
                                   flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                   flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache,
                                   flash_attn_combine)
from . import _native, _tensors, _torch_hook

if _native.ext is not None:
    _native.ext.bind(FlashAttnError, FlashAttnArgumentError, _np)
_torch_hook.install(_tensors._import_torch)

__version__ = "0.2.5"

__all__ = [
    "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
    "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "flash_attn_combine",
    "attention_forward", "attention_backward", "merge_attn", "dropout_mask", "quantize_fp8",
    "FlashAttnError", "FlashAttnArgumentError", "LibraryNotFound",
    "Selection", "last_selection", "set_options", "get_options",
    "library_path", "library_version", "has_cuda", "cpu_features", "kernel_names",
    "binding", "binding_reason", "check",
]


def library_version():
    """"MAJOR.MINOR.PATCH" of the loaded libflashattn."""
    if _native.ext is not None:
        return _native.ext.version()
    from ._lib import lib
    return lib().fa_version().decode()


def has_cuda():
    """True when the loaded library was built with the CUDA backend."""
    if _native.ext is not None:
        return _native.ext.has_cuda()
    from ._lib import lib
    return bool(lib().fa_has_cuda())


def cpu_features():
    if _native.ext is not None:
        return _native.ext.cpu_features()
    from ._lib import lib
    return lib().fa_cpu_features().decode()


def kernel_names():
    """Names of every kernel the loaded library contains."""
    if _native.ext is not None:
        return _native.ext.kernel_names()
    from ._lib import lib
    L = lib()
    return [L.fa_kernel_name(i).decode() for i in range(L.fa_kernel_count())]
