"""Contexts, settings, errors and the selection record.

A C context may be used by one thread at a time and owns its workspace, so each Python thread
keeps its own contexts, one per (backend, CUDA device, CUDA stream). They are created on first
use and destroyed with the thread's state.
"""

import ctypes
import dataclasses
import os
import threading

from . import _lib, _native


class FlashAttnError(RuntimeError):
    """A call into libflashattn failed.

    status       the fa_status code (int)
    status_name  its name, e.g. "FA_ERR_SHAPE"
    message      fa_last_error()'s detailed message
    """

    def __init__(self, status, message):
        self.status = status
        self.status_name = _lib.status_name(status)
        self.message = message
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)


class FlashAttnArgumentError(FlashAttnError, ValueError):
    """The library rejected an argument (shape, dtype, stride, head dim, GQA, varlen, device...)."""


def _raise(status, message):
    cls = FlashAttnArgumentError if status in _lib.ARGUMENT_STATUSES else FlashAttnError
    raise cls(status, message)


# ---- settings shared by every context of the process ----

_settings_lock = threading.Lock()
# device_checks None: each context keeps the library's default (on, unless the environment
# has FLASHATTN_DEVICE_CHECKS=0).
_settings = {"threads": 0, "strict": False, "algo": "auto", "device_checks": None}
_generation = 0


def set_options(threads=None, strict=None, algo=None, device_checks=None):
    """Process-wide settings, applied to every context before its next call.

    threads        CPU worker threads (0: all cores; FLASHATTN_NUM_THREADS is the library's
                   default)
    strict         True: a fallback away from the preferred kernel raises FA_ERR_UNSUPPORTED
    algo           "auto" (the tiled kernels), "naive" (float64 reference, also accepts float64
                   arrays) or "plain" (textbook attention in the input precision)
    device_checks  index arrays in GPU memory (cu_seqlens, cache_seqlens, block_table,
                   cache_leftpad):
                   False (the library's default) has the kernels check them as they read
                   them, with no host synchronisation (CUDA-graph friendly): a bad element
                   is clamped (nothing outside the tensors is touched) and reported by the
                   next call, or by flashattn.check(); True checks them before the call and
                   waits for the answer (one stream synchronisation per call), so a bad
                   array raises at once with nothing written; "default" returns to the
                   library's default (FLASHATTN_DEVICE_CHECKS=1 makes it True)
    Arguments left None keep their value. Returns the previous settings as a dict.
    """
    global _generation
    if device_checks is not None and _native.ext is None:
        _lib.require("fa_context_set_device_checks", "set_options(device_checks=...)")
    with _settings_lock:
        old = dict(_settings)
        if threads is not None:
            threads = _lib.c_int(threads, "threads", 32)  # an int in C: no silent wrap
            if threads < 0:
                raise ValueError(f"threads = {threads}, must be >= 0")
            _settings["threads"] = threads
        if strict is not None:
            _settings["strict"] = bool(strict)
        if algo is not None:
            if algo not in _lib.ALGOS:
                raise ValueError(f"algo = {algo!r}, must be one of {sorted(_lib.ALGOS)}")
            _settings["algo"] = algo
        if device_checks is not None:
            _settings["device_checks"] = (None if device_checks == "default"
                                          else bool(device_checks))
        _generation += 1
        if _native.ext is not None:
            _native.ext.set_options(_settings["threads"], int(_settings["strict"]),
                                    _lib.ALGOS[_settings["algo"]], _device_checks_mode())
        return old


def _device_checks_mode():
    """The library's mode for the device_checks setting (None: what a new context has)."""
    dc = _settings["device_checks"]
    if dc is None:
        return int(os.environ.get("FLASHATTN_DEVICE_CHECKS", "0") == "1")
    return int(dc)


def get_options():
    with _settings_lock:
        return dict(_settings)


class _Context:
    def __init__(self, backend, stream):
        L = _lib.lib()
        h = ctypes.c_void_p()
        st = L.fa_context_create(ctypes.byref(h), backend)
        if st != 0:
            _raise(st, (L.fa_last_error(None) or b"").decode())
        self._lib = L
        self.handle = h
        self.generation = -1
        if stream:
            self._check(L.fa_context_set_stream(h, ctypes.c_void_p(stream)))

    def _check(self, status):
        if status != 0:
            _raise(status, self.last_error())

    def last_error(self):
        return (self._lib.fa_last_error(self.handle) or b"").decode()

    def apply_settings(self):
        """Brings the context up to date with set_options() (cheap when nothing changed)."""
        if self.generation == _generation:
            return
        with _settings_lock:
            gen, s = _generation, dict(_settings)
        L, h = self._lib, self.handle
        self._check(L.fa_context_set_threads(h, s["threads"]))
        self._check(L.fa_context_set_strict(h, int(s["strict"])))
        self._check(L.fa_context_set_algo(h, _lib.ALGOS[s["algo"]]))
        if _lib.has_symbol("fa_context_set_device_checks"):
            self._check(L.fa_context_set_device_checks(h, _device_checks_mode()))
        self.generation = gen

    def __del__(self):
        h = getattr(self, "handle", None)
        L = getattr(self, "_lib", None)
        if h and L is not None:
            try:
                L.fa_context_destroy(h)
            except Exception:  # interpreter shutdown: the library may be gone already
                pass
            self.handle = None


_tls = threading.local()


def context(backend, device_index=0, stream=0):
    """This thread's context for (backend, device, stream), created on first use."""
    cache = getattr(_tls, "contexts", None)
    if cache is None:
        cache = _tls.contexts = {}
    key = (backend, device_index, stream)
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = _Context(backend, stream)
    ctx.apply_settings()
    return ctx


# ---- the selection record ----

@dataclasses.dataclass(frozen=True)
class Selection:
    """What the dispatcher chose for a call (fa_selection)."""
    kernel: str
    backend: str
    op: str
    tile_q: int
    tile_k: int
    threads: int
    num_splits: int
    workspace_bytes: int
    reason: str  # why a faster path was refused; "" when the preferred kernel ran


def _record(ctx):
    p = ctx._lib.fa_last_selection(ctx.handle)
    if not p:
        _tls.last = None
        return
    s = p.contents
    _tls.last = Selection(s.kernel.decode(), s.backend.decode(), s.op.decode(), s.tile_q,
                          s.tile_k, s.threads, s.num_splits, s.workspace_bytes, s.reason.decode())


def call(ctx, fn, *args):
    """Runs fn(ctx.handle, *args); raises on error; records the selection either way."""
    _tls.last = None
    status = fn(ctx.handle, *args)
    if status != 0:
        _raise(status, ctx.last_error())
    _record(ctx)


def last_selection():
    """The kernel record of this thread's last successful flashattn call, or None (no call yet,
    the last call failed, or it ran no kernel because its inputs were empty)."""
    if _native.ext is not None:
        t = _native.ext.last_selection()
        return None if t is None else Selection(*t)
    return getattr(_tls, "last", None)


def clear_selection():
    if _native.ext is not None:
        _native.ext.clear_selection()
    _tls.last = None


def check(device=None):
    """Raises the error that GPU kernels of this thread's earlier calls on a CUDA device found
    in their index arrays (see set_options(device_checks=...)), and clears it. It does not wait
    for the GPU: synchronise first (torch.cuda.synchronize()) to include all queued work.
    device: a CUDA device index; None: torch's current device."""
    if device is None:
        import torch
        device = torch.cuda.current_device()
    device = int(device)
    if _native.ext is not None:
        _native.ext.check(device)
        return
    for (backend, index, _), ctx in (getattr(_tls, "contexts", None) or {}).items():
        if backend == _lib.BACKEND_CUDA and index == device and _lib.has_symbol("fa_context_check"):
            ctx._check(ctx._lib.fa_context_check(ctx.handle))
