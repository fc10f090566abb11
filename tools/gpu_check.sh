#!/bin/bash
# The CUDA checks, in one run on a machine with an NVIDIA GPU and a CUDA build of PyTorch
# but possibly no network, no pqloader build environment and another Python than ours.
#
#   bash tools/gpu_check.sh BUNDLE OUTDIR
#
# BUNDLE holds what the machine may lack, made on a machine with pip and apt:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d BUNDLE pyarrow==25.0.1 nanobind==3.1.0
#   (cd BUNDLE && apt-get download librandom123-dev libturbojpeg0-dev libturbojpeg0 \
#     libpng-dev libpng16-16 libxxhash-dev libxxhash0 zlib1g-dev)
# (--python-version: the GPU machine's python3). The script builds the extension there
# against them (python3, its numpy and torch, cmake, ninja and g++ from the machine),
# then runs, each under a time limit, every CUDA test of python/tests/test_torch.py, the
# same race test against a copy of pqloader without the consumer's event wait (it must
# fail), the examples with --device cuda, and the whole of test_torch.py. It writes
# OUTDIR/log.txt and OUTDIR/*.xml (JUnit). Exit status: 0 when everything passed.
set -u
BUNDLE=$(realpath "$1")
OUTDIR=$(realpath "$2")
WORK=${TMPDIR:-/tmp}/pqloader-gpu
rm -rf "$WORK" && mkdir -p "$WORK"
exec > >(tee "$OUTDIR/log.txt") 2>&1
failed=()
step() { echo; echo "=== $(date +%T) $*"; }
check() {  # check NAME SECONDS CMD...: run, record a failure
  local name=$1 secs=$2; shift 2
  step "$name"
  timeout -k 10 "$secs" "$@" || { echo "--- $name FAILED (rc $?)"; failed+=("$name"); }
}

step "machine"
nvidia-smi -L; nproc; head -2 /etc/os-release; g++ --version | head -1; cmake --version | head -1
python3 -c 'import sys, torch, numpy
print(sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("numpy", numpy.__version__)'

step "install the bundle"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$BUNDLE"/*.whl || exit 2
for deb in "$BUNDLE"/*.deb; do dpkg -x "$deb" "$WORK/sys"; done
LIBDIR="$WORK/sys/usr/lib/x86_64-linux-gnu"
ln -sf "$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')" "$LIBDIR/libz.so"
export PYTHONPATH="$WORK/site"

step "build the extension"
cmake -S . -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPQLOADER_BUILD_PYTHON=ON \
  -DPQLOADER_BUILD_TESTS=OFF -DPQLOADER_WERROR=OFF -DPQLOADER_FORCE_PYARROW=ON \
  -DCMAKE_PREFIX_PATH="$WORK/sys/usr" -DPython_EXECUTABLE="$(command -v python3)" >"$WORK/cmake.log" 2>&1 \
  || { cat "$WORK/cmake.log"; exit 3; }
grep "pqloader:" "$WORK/cmake.log"
cmake --build "$WORK/build" --target _core -j "$(nproc)" 2>&1 | tail -5
mkdir -p "$WORK/pkg" && cp -r python/pqloader "$WORK/pkg/" && cp "$WORK"/build/python/src/_core*.so "$WORK/pkg/pqloader/" || exit 4
export PYTHONPATH="$WORK/pkg:$WORK/site" LD_LIBRARY_PATH="$LIBDIR"
python3 -c 'import pqloader, pyarrow; print("pqloader from", pqloader.__file__, "pyarrow", pyarrow.__version__)' || exit 5

PYTEST=(python3 -m pytest -q -p no:cacheprovider -rs)
check "CUDA tests" 150 "${PYTEST[@]}" --junitxml="$OUTDIR/cuda.xml" python/tests/test_torch.py -k cuda

# The race test must fail against a pqloader whose consumer does not wait for the copy.
step "CUDA race test against a mutant without the event wait (must fail)"
cp -r "$WORK/pkg" "$WORK/mutant"
sed -i 's/current.wait_event(event)/pass/' "$WORK/mutant/pqloader/_torch.py"
if grep -q "wait_event" "$WORK/mutant/pqloader/_torch.py"; then
  echo "--- the mutation did not apply"; failed+=("mutant")
elif PYTHONPATH="$WORK/mutant:$WORK/site" timeout 120 "${PYTEST[@]}" python/tests/test_torch.py \
    -k "cuda_consumer_never_reads" >"$WORK/mutant.log" 2>&1; then
  cat "$WORK/mutant.log"; echo "--- the race test PASSED against the mutant"; failed+=("mutant")
else
  tail -3 "$WORK/mutant.log"; echo "--- killed: the race test fails without the event wait"
fi

# The examples write their sample datasets under build/.
check "image example" 180 python3 examples/train_image_classifier.py --device cuda --epochs 3
check "tabular example" 90 python3 examples/train_tabular.py --device cuda
check "language-model example" 120 python3 examples/train_lm.py --device cuda
check "DDP example, one NCCL rank" 90 python3 -m torch.distributed.run --standalone --nproc_per_node=1 \
  examples/train_ddp.py
check "all of test_torch.py" 150 "${PYTEST[@]}" --junitxml="$OUTDIR/torch.xml" python/tests/test_torch.py

step "done"
if [ ${#failed[@]} -eq 0 ]; then echo "all passed"; else echo "failed: ${failed[*]}"; exit 1; fi
