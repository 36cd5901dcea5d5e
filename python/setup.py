"""Build hook of the flashattn package (metadata lives in pyproject.toml).

The package is pure Python (ctypes), but it may carry libflashattn: when a library is found at
build time it is copied next to the package, and the wheel is then tagged for this platform.
Where it looks: FLASHATTN_LIBRARY (a path; an error if it names no file), else the repository's
build tree (../build/libflashattn.so, what `make build` produces). With neither, the package
installs without a library and finds one at run time (FLASHATTN_LIBRARY or the system loader).
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))


def library_to_bundle():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        if not os.path.isfile(env):
            sys.exit(f"FLASHATTN_LIBRARY={env!r} is not a file")
        return os.path.realpath(env)
    cand = os.path.join(HERE, os.pardir, "build", "libflashattn.so")
    return os.path.realpath(cand) if os.path.isfile(cand) else None


LIBRARY = library_to_bundle()


class BuildPy(build_py):
    def run(self):
        super().run()
        if LIBRARY:
            dst = os.path.join(self.build_lib, "flashattn", "libflashattn.so")
            shutil.copyfile(LIBRARY, dst)
            print(f"flashattn: bundling {LIBRARY}")
        else:
            print("flashattn: no libflashattn found at build time; the package will look for "
                  "FLASHATTN_LIBRARY or an installed library at run time")


cmdclass = {"build_py": BuildPy}

if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """A wheel that carries the shared library is platform-specific, not Python-specific."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = LIBRARY is None

        def get_tag(self):
            python, abi, plat = super().get_tag()
            return ("py3", "none", plat) if LIBRARY else (python, abi, plat)

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass)
