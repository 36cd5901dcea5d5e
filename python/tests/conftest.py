"""Seeds: every run draws fresh random inputs (docs/architecture.md), from FLASHATTN_TEST_SEED
when set, so that a failure can be replayed: each assertion message quotes the seed.

Which package: the tests exercise the installed flashattn (tests/run.sh, as `make test` runs
them), not the source tree; the report header says which copy, extension and library were
imported, and with FLASHATTN_TEST_INSTALLED=1 a run that picked up python/flashattn stops here."""

import importlib.util
import os
import zlib

import numpy as np
import pytest

import flashattn

_SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "0"), 0) or int.from_bytes(os.urandom(4), "little")

_PKG = os.path.dirname(os.path.realpath(flashattn.__file__))
_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "flashattn")
if os.environ.get("FLASHATTN_TEST_INSTALLED") == "1" and _PKG == _SOURCE:
    raise pytest.UsageError(
        f"flashattn was imported from the source tree ({_PKG}), not from the installed package: "
        "run the tests through python/tests/run.sh (make test), from outside python/")


def pytest_report_header(config):
    ext = importlib.util.find_spec("flashattn._ext")
    try:
        lib = flashattn.library_path()
    except Exception as e:  # the tests that need it fail with the reason; the header says it
        lib = f"({type(e).__name__}: {e})"
    via = " (FLASHATTN_LIBRARY)" if os.environ.get("FLASHATTN_LIBRARY") else ""
    return [f"flashattn: FLASHATTN_TEST_SEED={_SEED}",
            f"flashattn: package {_PKG}",
            f"flashattn: extension {ext.origin if ext else '(none)'}",
            f"flashattn: library {lib}{via}"]


@pytest.fixture
def seed(request):
    """The run's seed mixed with the test's name: stable per test within a run."""
    return (_SEED, zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def rng(seed):
    return np.random.default_rng(list(seed))
