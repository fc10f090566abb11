# pqloader: two commands for a fresh machine.
#   make demo   install what is missing, build, generate a sample dataset, stream it
#   make test   install what is missing, build, run every C++ and Python test
# Both are idempotent: each step is skipped when its result is up to date.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= 2
# strace: kills a process at an exact system call (python/tests/test_cache_kill_points.py)
# locales: the sources localedef builds a decimal-comma locale from (python/tests/test_locale.py)
APT_PACKAGES := g++ make libgtest-dev libbenchmark-dev librandom123-dev libturbojpeg0-dev libpng-dev zlib1g-dev libxxhash-dev openjdk-17-jre-headless locales strace
BUILD_DIR := build/py
SOURCES := $(shell find cpp python/src python/pqloader cmake examples/cpp -type f \( -name '*.cc' -o -name '*.h' -o -name '*.py' -o -name '*.txt' -o -name '*.cmake' \) 2>/dev/null) CMakeLists.txt pyproject.toml

.PHONY: all deps build wheel sdist test test-cpp test-python test-wheel wheel-venvs demo sanitize sanitize-cpp sanitize-python fuzz fuzz-regress fuzz-build lint bench bench-quick mutants mutants-cpp mutants-py crossbuild-check clean
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

# uv installs the packages (pip, bootstrapped in the virtualenv, installs uv only): it
# resolves to the same versions as pip (same pip freeze, 111 packages) and unpacks from
# its cache in parallel: 31 s instead of pip's 70-128 s on 2 cores. uv reads no pip
# configuration, so the machine's pip find-links (pip.conf or PIP_FIND_LINKS: where a
# local wheel, e.g. a CPU build of torch, lies) are handed to it (UV_FIND_LINKS).
# compileall byte-compiles in JOBS processes (31 s). Its status is ignored, as pip
# ignores them: a few packages ship files of an older Python's syntax. (Left to be
# compiled when first imported, they cost more: make test's processes import the same
# modules at once, and each compiled them; pytest took 659 s instead of ~450.)
UV_VERSION := 0.13.10
UV := $(VENV)/bin/uv
pip_find_links = $(shell $(PY) -m pip config get global.find-links 2>/dev/null) $(PIP_FIND_LINKS)
uv_install = UV_FIND_LINKS="$(subst $(space),$(comma),$(sort $(pip_find_links)))" $(UV) pip install -q --python
space := $(subst ,, )
comma := ,
$(UV): | $(VENV)/.apt-stamp
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.deps-stamp: requirements-dev.txt $(VENV)/.apt-stamp | $(UV)
	$(uv_install) $(PY) -r requirements-dev.txt
	-@$(PY) -m compileall -q -j $(JOBS) $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null
	@touch $@

deps: $(VENV)/.deps-stamp

# clang and its libFuzzer/sanitizer runtimes, for `make fuzz` only.
FUZZ_APT_PACKAGES := clang-14 libclang-rt-14-dev
$(VENV)/.apt-fuzz-stamp: $(VENV)/.apt-stamp
	@missing=""; for p in $(FUZZ_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@touch $@

# --- build ---------------------------------------------------------------------------
# One CMake build (build/py) makes the extension, libpqloader and the C++ tests. pip packs
# the extension into a wheel, auditwheel repairs it (copies Arrow/Parquet C++ in under
# mangled sonames; fails unless the wheel meets WHEEL_PLAT) and that wheel, the one
# `make wheel` ships, is what the virtualenv gets: every Python test runs the artifact.
WHEEL_DIR := build/wheel
WHEEL_PLAT := manylinux_2_35_x86_64
$(VENV)/.build-stamp: $(VENV)/.deps-stamp $(SOURCES) python/src/exports.map packaging/graft_libs.py
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/raw $(WHEEL_DIR)/repaired
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip wheel -q --no-build-isolation --no-deps \
	  -C cmake.define.PQLOADER_BUILD_TESTS=ON -C cmake.define.PQLOADER_BUNDLE_ARROW=OFF \
	  -w $(WHEEL_DIR)/raw .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
	  LD_LIBRARY_PATH="$$($(PY) -c 'import pyarrow; print(pyarrow.get_library_dirs()[0])')" \
	  $(VENV)/bin/auditwheel repair --plat $(WHEEL_PLAT) -w $(WHEEL_DIR)/repaired $(WHEEL_DIR)/raw/pqloader-*.whl
	w=$$(cd $(WHEEL_DIR)/repaired && ls pqloader-*.whl) && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
	  $(PY) packaging/graft_libs.py $(WHEEL_DIR)/repaired/$$w $(WHEEL_DIR)/$$w
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/pqloader-*.whl
	@touch $@

build: $(VENV)/.build-stamp

# The manylinux wheel (dist/) and the sdist; `pip install dist/pqloader-*.whl` needs no
# Debian package and no pyarrow.
wheel: build
	@mkdir -p dist && rm -f dist/pqloader-*.whl && cp $(WHEEL_DIR)/pqloader-*.whl dist/
	@ls -l dist/pqloader-*.whl

sdist: deps
	@mkdir -p dist && rm -f dist/pqloader-*.tar.gz
	$(PY) -m build --sdist --no-isolation -o dist . >/dev/null
	@ls -l dist/pqloader-*.tar.gz

# --- tests ---------------------------------------------------------------------------
test-cpp: build
	cd $(BUILD_DIR) && $(CURDIR)/$(VENV)/bin/ctest -j$(JOBS) --output-on-failure

# JOBS pytest processes (pytest-xdist), each taking whole files: a file's session
# fixtures (servers, generated corpora, Spark) are made by one process, once.
test-python: build
	$(PY) -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadfile --durations=15 python/tests

# The wheel as users get it: installed into three fresh virtualenvs (created once per
# requirements file, stamped), smoke suite with LD_LIBRARY_PATH empty, ldd, import time,
# manylinux policy, sdist (python/tests_wheel).
# Environment "petastorm" is Petastorm's own (bench/requirements-petastorm.txt: pyarrow
# 14.0.2, NumPy 1.26.4, Petastorm 0.13.1, pyspark, OpenCV).
WHEEL_VENVS := build/wheel-venvs
WHEEL_ENVS := petastorm arrow-newest no-arrow
define wheel_venv
	rm -rf $(WHEEL_VENVS)/$(1) && $(PYTHON) -m venv $(WHEEL_VENVS)/$(1)
	$(uv_install) $(WHEEL_VENVS)/$(1)/bin/python --no-deps -r $(2)
	@touch $(WHEEL_VENVS)/$(1)/.stamp
endef
$(WHEEL_VENVS)/petastorm/.stamp: bench/requirements-petastorm.txt | $(UV)
	$(call wheel_venv,petastorm,$<)
$(WHEEL_VENVS)/%/.stamp: python/tests_wheel/requirements-%.txt | $(UV)
	$(call wheel_venv,$*,$<)

# The three environments are made $(JOBS) at a time (by uv, not byte-compiled: the few
# modules the tests import are compiled when first imported; 14 s for the three).
wheel-venvs:
	@$(MAKE) --no-print-directory -j$(JOBS) $(foreach e,$(WHEEL_ENVS),$(WHEEL_VENVS)/$(e)/.stamp)

# Two processes: the sdist's build from source in one, the smoke runs in the other
# (python/tests_wheel/test_wheel.py's xdist groups).
test-wheel: build wheel-venvs
	$(PY) -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup python/tests_wheel

# Every C++ and Python test, the installed wheel's tests, the thread-safety analysis
# (lint: the fuzz build's clang compile, ~2 min), then the fuzz drivers over their seeds, the inputs of every crash found
# so far (cpp/fuzz/regressions/) and a fixed-seed run (under 2 min).
# The fuzz build compiles beside the Python tests at the lowest priority (nice 19): it
# takes the CPU they leave idle while their subprocesses start, servers answer and
# trainers wait (a quarter of 2 cores over the suite). Its output is shown once both end.
test: test-cpp
	@mkdir -p build; \
	  nice -n 19 $(MAKE) --no-print-directory fuzz-build > build/fuzz-build.log 2>&1 & fuzz=$$!; \
	  $(MAKE) --no-print-directory test-python; tests=$$?; \
	  wait $$fuzz; built=$$?; echo "fuzz build (beside the Python tests):"; tail -5 build/fuzz-build.log; \
	  [ $$tests = 0 ] || exit $$tests; \
	  [ $$built = 0 ] || { cat build/fuzz-build.log; echo "the fuzz build failed"; exit $$built; }
	$(MAKE) --no-print-directory test-wheel
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory fuzz-regress

# ASan+UBSan and TSan builds of the C++ tests, then the Python tests of the transform and
# cache paths against an ASan+UBSan build of the extension (slow; not part of `make test`).
sanitize: deps sanitize-cpp sanitize-python

sanitize-cpp: deps
	for s in address thread; do \
	  $(VENV)/bin/cmake -S . -B build/sanitize-$$s -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DPython_EXECUTABLE=$(CURDIR)/$(PY) -DPQLOADER_SANITIZE=$$s -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja && \
	  $(VENV)/bin/cmake --build build/sanitize-$$s -j$(JOBS) && \
	  (cd build/sanitize-$$s && TSAN_OPTIONS="suppressions=$(CURDIR)/cpp/tsan.supp halt_on_error=1" \
	    ASAN_OPTIONS=detect_leaks=0 $(CURDIR)/$(VENV)/bin/ctest -j$(JOBS) --output-on-failure) || exit 1; \
	done

# The extension built with -fsanitize=address,undefined into build/sanitize-py, staged
# beside the package's Python files, and run by the main virtualenv's interpreter with
# libasan preloaded (CPython itself is not instrumented), and libstdc++ with it so that
# ASan finds the C++ runtime's __cxa_throw (python does not link it). Leak checks are off: the
# interpreter's own allocations would drown ours. Subprocesses inherit the setup.
SANITIZE_PY_DIR := build/sanitize-py
SANITIZE_PY_TESTS ?= python/tests/test_transforms.py python/tests/test_cache.py \
  python/tests/test_cache_safety.py python/tests/test_cache_stale.py python/tests/test_cache_plan.py \
  python/tests/test_cache_node_fetch.py python/tests/test_hostile_bytes.py python/tests/test_faults.py
sanitize-python: deps
	$(VENV)/bin/cmake -S . -B $(SANITIZE_PY_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPython_EXECUTABLE=$(CURDIR)/$(PY) -DPQLOADER_SANITIZE=address -DPQLOADER_BUILD_PYTHON=ON \
	  -DPQLOADER_BUILD_TESTS=OFF -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja
	$(VENV)/bin/cmake --build $(SANITIZE_PY_DIR) -j$(JOBS) --target _core
	rm -rf $(SANITIZE_PY_DIR)/stage && mkdir -p $(SANITIZE_PY_DIR)/stage/pqloader
	cp python/pqloader/*.py $(SANITIZE_PY_DIR)/stage/pqloader/
	cp $(SANITIZE_PY_DIR)/python/src/_core*.so $(SANITIZE_PY_DIR)/stage/pqloader/
	PYTHONPATH=$(CURDIR)/$(SANITIZE_PY_DIR)/stage \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  PQLOADER_EXPECT_SANITIZED=1 $(PY) -m pytest -q -p no:cacheprovider $(SANITIZE_PY_TESTS)

# --- mutation testing (docs/testing.md; not part of `make test`) -----------------------
# mutants-cpp: hand-made C++ mutants of the plan, pipeline, cache, Philox and batch code
# (tools/mutants/cpp_mutants.py), each built in a scratch copy of the sources
# (build/mutants) and run against every C++ test; fails below a 90 % kill rate.
# mutants-py: a seeded sample of AST mutants of the Python layer, each run against the
# tests mapped to its module, on a staged copy of python/pqloader with the extension built
# from this checkout into build/mutants/py (tools/mutants/py_mutants.py).
# Reports: build/mutants/cpp-report.md, build/mutants/py-report.md.
MUTANTS_CPP_ARGS ?=
MUTANTS_PY_ARGS ?=
mutants: mutants-cpp mutants-py

mutants-cpp: deps
	JOBS=$(JOBS) $(PY) tools/mutants/cpp_mutants.py $(MUTANTS_CPP_ARGS)

mutants-py: deps
	JOBS=$(JOBS) $(PY) tools/mutants/py_mutants.py $(MUTANTS_PY_ARGS)

# --- cross-build check (docs/testing.md; not part of `make test`: CI has no old build) ---
# An old build's caches and state_dict()s read by this one, and the reverse, on data the
# tool generates (build/crossbuild): a DIFF is a cache key part or state version that
# should have changed. OLD (and NEW, default: the installed build) name directories
# holding a staged `pqloader` package; CASES=a,b picks cases.
crossbuild-check: build
	@[ -n "$(OLD)" ] || { echo "usage: make crossbuild-check OLD=<dir holding an old build's pqloader> [NEW=<dir>] [CASES=a,b]"; exit 2; }
	$(PY) tools/crossbuild/check.py --old $(OLD) $(if $(NEW),--new $(NEW)) $(if $(CASES),--cases $(CASES))

# --- fuzzing (libFuzzer + ASan + UBSan; see docs/reliability.md) -----------------------
# `make fuzz` builds the drivers of cpp/fuzz with clang, writes seed corpora from the test
# environment (cpp/fuzz/make_corpus.py) and runs each driver for FUZZ_SECONDS, keeping
# what it learns in build/fuzz/corpus/. A crash stops the run, with its input in
# build/fuzz/artifacts/. Long run: make fuzz FUZZ_SECONDS=3600. Warnings are not errors
# here (clang warns where the gcc build, which has -Werror, does not).
FUZZ_DIR := build/fuzz
FUZZ_TARGETS := fuzz_parquet fuzz_cache_entry fuzz_ndarray fuzz_image fuzz_summary
FUZZ_SECONDS ?= 300
# fuzz-regress (make test): each driver runs a fixed number of inputs from a fixed seed,
# starting from a fresh corpus (seeds + regressions), so that its outcome is the same on
# every run of the same code; the time cap only cuts the same sequence shorter on a slow
# machine. Runs are sized to end well within the cap here (2026-12-07, two at a time:
# 8-9 s each but image's 2 s, 20 s in all; parquet runs 40-80 inputs/s, the first 116
# its corpus's replay), the longest first; capped at 15 s (make test stays under 20
# minutes on a slow day). They were two to three times as many, and all five ran into the
# cap (48 s). `make fuzz` is the deep search.
FUZZ_REGRESS_SEED ?= 1
FUZZ_REGRESS_CAP_SECONDS ?= 15
FUZZ_REGRESS_RUNS ?= fuzz_parquet:600 fuzz_summary:4000 fuzz_cache_entry:300000 fuzz_ndarray:300000 fuzz_image:20000
# Images and .npy arrays may legitimately allocate up to 2 GiB (the decoders' bound).
FUZZ_FLAGS ?= -timeout=30 -rss_limit_mb=6144 -malloc_limit_mb=2400 -max_len=65536 -print_final_stats=1
FUZZ_SOURCES := $(SOURCES) $(wildcard cpp/fuzz/*.cc cpp/fuzz/CMakeLists.txt)

# The same compile is `make lint`'s thread-safety analysis (-DPQLOADER_THREAD_SAFETY=ON).
# -O1 with line tables (what OSS-Fuzz builds with): ASan's reports name files and lines.
# The library as a unity build (its files compiled eight to a unit: 286 -> 211 CPU-s,
# 148 -> 117 s on 2 cores).
$(FUZZ_DIR)/.build-stamp: $(VENV)/.apt-fuzz-stamp $(VENV)/.deps-stamp $(FUZZ_SOURCES)
	$(VENV)/bin/cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -gline-tables-only -DNDEBUG" -DPQLOADER_UNITY_BUILD=ON \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DPython_EXECUTABLE=$(CURDIR)/$(PY) -DPQLOADER_FUZZ=ON \
	  -DPQLOADER_THREAD_SAFETY=ON \
	  -DPQLOADER_BUILD_TESTS=OFF -DPQLOADER_WERROR=OFF -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja
	$(VENV)/bin/cmake --build $(FUZZ_DIR) -j$(JOBS)
	@touch $@

$(FUZZ_DIR)/seeds/.stamp: cpp/fuzz/make_corpus.py $(VENV)/.build-stamp
	$(PY) cpp/fuzz/make_corpus.py $(FUZZ_DIR)/seeds
	@touch $@

fuzz-build: $(FUZZ_DIR)/.build-stamp

fuzz: $(FUZZ_DIR)/.build-stamp $(FUZZ_DIR)/seeds/.stamp
	@mkdir -p $(FUZZ_DIR)/artifacts
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_DIR)/cpp/fuzz/$$t $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t- $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/seeds/$$t \
	    > $(FUZZ_DIR)/$$t.log 2>&1 \
	    || { tail -40 $(FUZZ_DIR)/$$t.log; echo "fuzz: $$t failed; input in $(FUZZ_DIR)/artifacts/"; exit 1; }; \
	  grep -E "^Done|stat::(number_of_executed_units|new_units_added)" $(FUZZ_DIR)/$$t.log | tr '\n' ' '; echo; \
	done

# The drivers run $(JOBS) at a time (each is one thread); each prints one line when done.
fuzz-regress: $(FUZZ_DIR)/.build-stamp $(FUZZ_DIR)/seeds/.stamp
	@mkdir -p $(FUZZ_DIR)/artifacts
	@printf '%s\n' $(FUZZ_REGRESS_RUNS) | xargs -P $(JOBS) -I{} bash -c 'tr={}; t=$${tr%%:*}; n=$${tr##*:}; \
	  rm -rf $(FUZZ_DIR)/regress-corpus/$$t; mkdir -p $(FUZZ_DIR)/regress-corpus/$$t; \
	  $(FUZZ_DIR)/cpp/fuzz/$$t $(FUZZ_FLAGS) -seed=$(FUZZ_REGRESS_SEED) -runs=$$n \
	    -max_total_time=$(FUZZ_REGRESS_CAP_SECONDS) \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t- $(FUZZ_DIR)/regress-corpus/$$t \
	    $(FUZZ_DIR)/seeds/$$t cpp/fuzz/regressions/$$t \
	    > $(FUZZ_DIR)/$$t-regress.log 2>&1 \
	    || { tail -40 $(FUZZ_DIR)/$$t-regress.log; echo "fuzz-regress: $$t failed; input in $(FUZZ_DIR)/artifacts/"; exit 1; }; \
	  echo "fuzz-regress: $$t, $$n runs from seed $(FUZZ_REGRESS_SEED):" \
	    $$(grep -E "^Done|stat::(number_of_executed_units|new_units_added)" $(FUZZ_DIR)/$$t-regress.log | tr "\n" " ")'

# --- lint ----------------------------------------------------------------------------
# tools/check_layers.py: the library's folders include each other only downwards (the
# table in it is the layering of docs/design.md). Then:
# clang's thread-safety analysis over the library: every member marked PQ_GUARDED_BY(mu)
# is touched only with mu held, every PQ_REQUIRES function is called only so
# (cpp/src/pqloader/util/thread_annotations.h). It runs in the fuzz build's compile
# (clang-14, -Werror=thread-safety), so that `make test` compiles the library with clang
# once; the extension's bindings hold no annotations. Warnings other than thread-safety
# ones are not errors there (the gcc build, which has -Werror, is the judge of those).
lint: $(FUZZ_DIR)/.build-stamp
	$(PY) tools/check_layers.py
	@echo "lint: thread-safety analysis clean (in $(FUZZ_DIR)'s compile)"

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
