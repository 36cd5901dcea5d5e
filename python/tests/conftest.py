"""Seeds: every run draws fresh random inputs (DESIGN.md), from FLASHATTN_TEST_SEED when set,
so that a failure can be replayed: each assertion message quotes the seed."""

import os
import zlib

import numpy as np
import pytest

_SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "0"), 0) or int.from_bytes(os.urandom(4), "little")


def pytest_report_header(config):
    lib = os.environ.get("FLASHATTN_LIBRARY", "(not set: package directory / system loader)")
    return [f"flashattn: FLASHATTN_TEST_SEED={_SEED}  FLASHATTN_LIBRARY={lib}"]


@pytest.fixture
def seed(request):
    """The run's seed mixed with the test's name: stable per test within a run."""
    return (_SEED, zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def rng(seed):
    return np.random.default_rng(list(seed))
