# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
BUILD      ?= build
ASAN_BUILD ?= build-asan
CLANG_BUILD ?= build-clang
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
# make install PREFIX=/opt/flashattn: the prefix is set when the build is configured, since the
# pkg-config file records it; empty keeps CMake's default (/usr/local) or the build's last one.
PREFIX     ?=

VENV       ?= .venv
PYTHON     ?= python3

.PHONY: all deps build venv demo test check-pip test-asan test-tsan build-clang fuzz plots install clean

all: build

# System packages the build needs (cmocka for the C tests, cJSON for the tool's JSON).
deps:
	@scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_VENV=$(abspath $(VENV)) \
	  $(if $(PREFIX),-DCMAKE_INSTALL_PREFIX=$(abspath $(PREFIX))) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/flashattn demo

# The Python tests' environment: python/requirements-test.txt (numpy, ml_dtypes, pytest, torch and
# transformers for the CPU tests, scikit-build-core to build the package), installed only when
# that file changes; then the package itself, installed as `pip install ./python` does (the tests
# import that copy, not python/), every time, with the library `make build` just made: pip's
# prebuilt mode compiles only the extension flashattn._ext (seconds, not the kernels again).
venv: build $(VENV)/.requirements-stamp
	PYTHON=$(VENV)/bin/python scripts/pip_install_prebuilt.sh $(BUILD)
$(VENV)/.requirements-stamp: python/requirements-test.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -r python/requirements-test.txt
	touch $@

test: build venv
	scripts/run_tests.sh $(BUILD)

# `pip install ./python` on a copy of the tree with nothing built, then auditwheel (CI runs it,
# CPU only: scripts/check_pip_install.sh --cuda builds the CUDA kernels too).
check-pip: deps
	scripts/check_pip_install.sh

# The CPU tests again under AddressSanitizer and UBSan (CI runs this after `make test`), CPU
# only: the CUDA kernels get compute-sanitizer on the GPU (bench/gpu.sh, stage sanitize).
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHATTN_SANITIZE=ON \
	  -DFLASHATTN_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	scripts/run_tests.sh $(ASAN_BUILD) asan

# The threaded CPU paths under ThreadSanitizer (clang, CPU only; CI runs it): the C tests of
# TSAN_TESTS, those that run calls on several threads (a team per call, threads sharing or not
# sharing contexts); under TSan the whole suite takes over half an hour on 2 cores. OpenMP's archer tool (libarcher.so beside clang's libomp)
# tells TSan about the runtime's barriers and locks, which it cannot see otherwise;
# scripts/tsan.supp leaves out what the uninstrumented runtime does inside itself.
TSAN_BUILD ?= build-tsan
TSAN_TESTS ?= ^(test_threads|test_busy|test_fwd|test_kvcache|test_special|test_dropout|test_api)$$
ARCHER ?= $(shell d=$$(clang -print-resource-dir 2>/dev/null)/../..; test -f $$d/libarcher.so && realpath $$d/libarcher.so)
test-tsan: deps
	CC=clang cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHATTN_TSAN=ON \
	  -DFLASHATTN_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	@test -n "$(ARCHER)" || { echo "test-tsan: no libarcher.so beside clang's libomp" >&2; exit 1; }
	OMP_TOOL_LIBRARIES=$(ARCHER) TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/scripts/tsan.supp" \
	  CTEST_ARGS='-R $(TSAN_TESTS)' scripts/run_tests.sh $(TSAN_BUILD) tsan

# The library, tests and tool compiled by clang with warnings as errors, CPU only (CI runs it;
# the tests are not run again here).
build-clang: deps
	CC=clang cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_WITH_CUDA=OFF \
	  -DFLASHATTN_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(CLANG_BUILD) -j $(JOBS)

# The libFuzzer target (fuzz/README.md) for FUZZ_SECONDS seconds; CI runs it for 60.
fuzz: deps
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

# The charts beside the current fwd / fwd-bwd tables (bench/plot.py; matplotlib into the venv).
plots: $(VENV)/.requirements-stamp
	$(VENV)/bin/python -m pip install -q -r bench/requirements.txt
	for t in bench/results/*/fwd.md bench/results/*/fwd-bwd.md; do \
	  [ -f "$$t" ] && $(VENV)/bin/python bench/plot.py "$$t" || exit 1; done

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(CLANG_BUILD) $(FUZZ_BUILD)
