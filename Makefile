# pqloader: two commands for a fresh machine.
#   make demo   install what is missing, build, generate a sample dataset, stream it
#   make test   install what is missing, build, run every C++ and Python test
# Both are idempotent: each step is skipped when its result is up to date.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= 2
APT_PACKAGES := g++ make libgtest-dev libbenchmark-dev librandom123-dev libturbojpeg0-dev libpng-dev zlib1g-dev libxxhash-dev openjdk-17-jre-headless
BUILD_DIR := build/py
SOURCES := $(shell find cpp python/src python/pqloader cmake -type f \( -name '*.cc' -o -name '*.h' -o -name '*.py' -o -name '*.txt' -o -name '*.cmake' \) 2>/dev/null) CMakeLists.txt pyproject.toml

.PHONY: all deps build test test-cpp test-python demo sanitize bench bench-quick clean
BENCH_SCALE ?= small

all: build

# --- installation --------------------------------------------------------------------
$(VENV)/.apt-stamp:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(VENV)/.deps-stamp: requirements-dev.txt $(VENV)/.apt-stamp
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $@

deps: $(VENV)/.deps-stamp

# --- build ---------------------------------------------------------------------------
# One CMake build (build/py) makes the extension, libpqloader and the C++ tests; pip
# installs the package into the virtualenv.
$(VENV)/.build-stamp: $(VENV)/.deps-stamp $(SOURCES)
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install -q --no-build-isolation --no-deps \
	  -C cmake.define.PQLOADER_BUILD_TESTS=ON .
	@touch $@

build: $(VENV)/.build-stamp

# --- tests ---------------------------------------------------------------------------
test-cpp: build
	cd $(BUILD_DIR) && $(CURDIR)/$(VENV)/bin/ctest -j$(JOBS) --output-on-failure

test-python: build
	$(PY) -m pytest -q -p no:cacheprovider python/tests

test: test-cpp test-python

# ASan+UBSan and TSan builds of the C++ tests (slow; not part of `make test`).
sanitize: deps
	for s in address thread; do \
	  $(VENV)/bin/cmake -S . -B build/sanitize-$$s -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DPython_EXECUTABLE=$(CURDIR)/$(PY) -DPQLOADER_SANITIZE=$$s -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja && \
	  $(VENV)/bin/cmake --build build/sanitize-$$s -j$(JOBS) && \
	  (cd build/sanitize-$$s && TSAN_OPTIONS="suppressions=$(CURDIR)/cpp/tsan.supp halt_on_error=1" \
	    ASAN_OPTIONS=detect_leaks=0 $(CURDIR)/$(VENV)/bin/ctest -j$(JOBS) --output-on-failure) || exit 1; \
	done

# --- demo ----------------------------------------------------------------------------
demo: build
	$(PY) examples/demo.py

# --- benchmarks (not part of `make test`) --------------------------------------------
# Side-by-side suite against Petastorm, torch DataLoader, HF datasets and Ray Data; writes
# docs/benchmarks.md. BENCH_SCALE=small|medium|large, BENCH_ARGS="--tune --systems ...".
bench: build
	bash bench/run.sh --scale $(BENCH_SCALE) $(BENCH_ARGS)

# pqloader against its ceilings, every ratio measured in one run (< 3 minutes): shuffled
# and unshuffled tabular, cache hits, tokens, images. Use before and after every change
# on the hot path. BENCH_QUICK_ARGS="--only tabular,cache --repeats 3".
bench-quick: build
	$(PY) bench/quick.py $(BENCH_QUICK_ARGS)

clean:
	rm -rf build
	rm -f $(VENV)/.build-stamp
