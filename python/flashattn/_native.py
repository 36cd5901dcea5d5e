"""Which binding carries the calls into libflashattn.

The C extension flashattn._ext (built by `pip install`) is the default: it reads tensors and
arrays in C, allocates through torch's caching allocator and calls the library with no
per-argument Python work. ctypes over libflashattn (flashattn._lib) is the fallback, used when
the extension is absent or FLASHATTN_BINDING=ctypes; it finds the library through
FLASHATTN_LIBRARY, a copy next to the package, or the system loader. binding() says which is
in use and why.
"""

import os

ext = None
_why = ""

_choice = os.environ.get("FLASHATTN_BINDING", "auto")
if _choice not in ("auto", "extension", "ctypes"):
    raise ImportError(f"FLASHATTN_BINDING={_choice!r}: expected auto, extension or ctypes")
if _choice == "ctypes":
    _why = "FLASHATTN_BINDING=ctypes"
else:
    try:
        from . import _ext as ext
    except ImportError as e:
        if _choice == "extension":
            raise ImportError(f"FLASHATTN_BINDING=extension, but flashattn._ext cannot be "
                              f"imported: {e}") from e
        _why = f"flashattn._ext could not be imported ({e})"


def binding():
    """"extension" (flashattn._ext) or "ctypes"."""
    return "extension" if ext is not None else "ctypes"


def binding_reason():
    """Why the ctypes fallback is in use ("" with the extension)."""
    return _why
