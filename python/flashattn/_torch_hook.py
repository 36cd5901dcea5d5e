"""Binds the package to torch as soon as torch is imported, whatever the import order.

Importing flashattn never imports torch (numpy users need not pay for it). But torch.compile
must find the package bound (the extension told torch's types, the torch.library ops
registered) before it traces a flashattn call: binding during tracing would be a graph break.
So, when torch is not imported yet, install() puts a finder on sys.meta_path that wraps
torch's loader and binds right after torch's own import completes; with torch already
imported it binds at once.
"""

import importlib.abc
import importlib.util
import sys


class _Loader(importlib.abc.Loader):
    def __init__(self, real, on_loaded):
        self._real, self._on_loaded = real, on_loaded

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._real  # torch sees its own loader
        self._real.exec_module(module)
        self._on_loaded()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, on_loaded):
        self._on_loaded = on_loaded

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and let the other finders find the real spec
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self._on_loaded)
        return spec


def install(on_loaded):
    """Calls on_loaded() now if torch is imported, else right after it is."""
    if "torch" in sys.modules:
        on_loaded()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(on_loaded))
