# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

VENV       ?= .venv
PYTHON     ?= python3

.PHONY: all deps build venv demo test test-asan install clean

all: build

# System packages the build needs (cmocka for the C tests, cJSON for the tool's JSON).
deps:
	@scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/flashattn demo

# The Python tests' environment (numpy, ml_dtypes, pytest; torch is left out: too big for CI).
# Reinstalls only when python/requirements-test.txt changes.
venv: $(VENV)/.requirements-stamp
$(VENV)/.requirements-stamp: python/requirements-test.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -r python/requirements-test.txt
	touch $@

test: build venv
	scripts/run_tests.sh $(BUILD)

# The CPU tests again under AddressSanitizer and UBSan (CI runs this after `make test`).
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHATTN_SANITIZE=ON $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	scripts/run_tests.sh $(ASAN_BUILD) asan

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
