#!/usr/bin/env bash
# The Python bindings' tests: builds libstria and the SWIG extension, runs the pytest suite
# (bindings/python/tests: numpy, torch and JAX against float64 references, errors, threads, a training
# step) and the examples, then builds a wheel, installs it and runs the suites of its compiled
# parts again against the installed package. Installs what it needs: Debian packages only when missing, and
# numpy, pytest, torch, jax and transformers (from PyPI) into a virtual environment in the repository.
#
# Environment:
#   STRIA_PYTHON_BUILD_DIR  build directory (default: STRIA_BUILD_DIR, else build-python); an
#                           existing one (e.g. build/) keeps its options and gains the bindings
#   STRIA_PYTHON_VENV       virtual environment (default .venv-python)
#   PYTHON                  interpreter for a new virtual environment (default python3)
#   STRIA_PYTHON_WHEEL=0    skips the wheel build, install and second run
#   STRIA_PYTHON_PREPARE_ONLY=1  only installs (packages, virtual environment), then exits
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${STRIA_PYTHON_BUILD_DIR:-${STRIA_BUILD_DIR:-build-python}}
venv=${STRIA_PYTHON_VENV:-.venv-python}
python=${PYTHON:-python3}
started=$SECONDS
# Each section says when it began (seconds into this script), so a CI log shows where the time goes.
section() { echo "== $* (at $((SECONDS - started)) s)"; }

section "system packages"
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v swig >/dev/null || missing+=(swig)
command -v c++ >/dev/null || missing+=(build-essential)
[ -f /usr/include/dlpack/dlpack.h ] || missing+=(libdlpack-dev)
if [ ! -x "$venv/bin/python" ]; then
  # Debian's own python3 needs its headers and venv module as packages; pyenv's have them.
  "$python" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
fi
"$python" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
  2>/dev/null || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

section "virtual environment $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py=$(cd "$venv/bin" && pwd)/python
"$py" -c 'import numpy, pytest' 2>/dev/null || "$py" -m pip install -q numpy pytest
if ! "$py" -c 'import torch' 2>/dev/null; then
  # PyPI's Linux torch wheel brings the CUDA libraries (gigabytes); the tests use its CPU side.
  t0=$SECONDS
  "$py" -m pip install -q torch
  echo "torch installed in $((SECONDS - t0)) s"
fi

if ! "$py" -c 'import jax' 2>/dev/null; then
  # JAX's CPU wheels (jax, jaxlib): stria.jax's tests, and the FFI headers its handlers build against.
  t0=$SECONDS
  "$py" -m pip install -q jax
  echo "jax installed in $((SECONDS - t0)) s"
fi
if ! "$py" -c 'import transformers' 2>/dev/null; then
  # HuggingFace transformers: stria.transformers' tests and example (tiny random models, no downloads).
  t0=$SECONDS
  "$py" -m pip install -q transformers
  echo "transformers installed in $((SECONDS - t0)) s"
fi
jax_include=$("$py" -c 'import jax.ffi; print(jax.ffi.include_dir())')
if [ "${STRIA_PYTHON_PREPARE_ONLY:-0}" = 1 ]; then
  echo "== Python environment ready in $((SECONDS - started)) s"
  exit 0
fi

section "build ($build_dir)"
configure=(-DSTRIA_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$py" -DSTRIA_JAX_INCLUDE_DIR="$jax_include")
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  # A new build directory builds only the library and the bindings; an existing one keeps its options.
  configure+=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_BUILD_TESTS=OFF -DSTRIA_BUILD_EXAMPLES=OFF
    -DSTRIA_BUILD_BENCHMARKS=OFF)
fi
cmake -S . -B "$build_dir" "${configure[@]}" >/dev/null
cmake --build "$build_dir" --target stria_python -j "$(nproc)"
package_dir=$(cd "$build_dir/bindings/python" && pwd)

export STRIA_REQUIRE_TORCH=1 STRIA_REQUIRE_JAX=1 STRIA_REQUIRE_TRANSFORMERS=1
section "pytest against the build tree"
PYTHONPATH=$package_dir STRIA_EXPECT_PACKAGE_DIR=$package_dir/stria \
  timeout 900 "$py" -m pytest -q -p no:cacheprovider bindings/python/tests

section "examples/python/train_tiny.py"
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny.py --ranks 4 --steps 12 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny.py --ranks 3 --layout zigzag --seq 48 \
  --steps 12 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny.py --ranks 2 --steps 8 --check --compile
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny.py --ranks 4 --packed 4 --steps 12 --check
section "examples/python/train_transformers.py"
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_transformers.py --family gpt_oss --ranks 4 --steps 4 \
  --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_transformers.py --family mistral --ranks 3 --seq 48 \
  --packed 3 --layout zigzag --steps 4 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_transformers.py --family llama4 --ranks 3 --seq 48 \
  --packed 3 --layout zigzag --steps 4 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_transformers.py --family deepseek_v3 --ranks 2 --steps 4 \
  --check
section "scripts/transformers-families.py (a few families: the sweep still runs, none of them wrong)"
PYTHONPATH=$package_dir timeout 600 "$py" scripts/transformers-families.py qwen3 gemma3_text stablelm bloom jamba \
  >/dev/null
section "bench/torch_model_shapes_cpu.py (a short run: the benchmark still runs)"
PYTHONPATH=$package_dir timeout 300 "$py" bench/torch_model_shapes_cpu.py --len 256 --chunk 64 --reps 1 >/dev/null
section "examples/python/generate_sharded_cache.py"
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/generate_sharded_cache.py --ranks 4 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/generate_sharded_cache.py --family gpt_oss --ranks 3 \
  --layout zigzag --new-tokens 40 --check
section "examples/python/train_packed.py"
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_packed.py --ranks 3 --steps 12 --check
section "examples/python/train_tiny_jax.py"
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny_jax.py --devices 4 --steps 12 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny_jax.py --devices 3 --layout zigzag --seq 48 \
  --steps 12 --check
PYTHONPATH=$package_dir timeout 300 "$py" examples/python/train_tiny_jax.py --devices 3 --packed 4 --seq 48 \
  --steps 12 --check

if [ "${STRIA_PYTHON_WHEEL:-1}" = 1 ]; then
  section "wheel: build, install, pytest against the installed package"
  wheel_dir=$(mktemp -d)
  trap 'rm -rf "$wheel_dir"' EXIT
  # The build runs in pip's isolated environment, without jax: it is told where jaxlib's headers are.
  # As on a machine with only a compiler: SWIG from PyPI (the build requirement, first on the
  # isolated environment's PATH, checked below) and DLPack's bundled header.
  # Its CUDA module for sm_80 alone (STRIA_CUDA_ARCHS), with warnings as errors: the suite runs no
  # GPU code, and the test command's Release build compiles the kernels for sm_90a, so each
  # architecture is compiled once.
  timeout 900 "$py" -m pip wheel -q --no-deps -w "$wheel_dir" -C cmake.define.STRIA_JAX_INCLUDE_DIR="$jax_include" \
    -C cmake.define.STRIA_BUNDLED_DLPACK=ON -C cmake.define.STRIA_CUDA_ARCHS=80 -C cmake.define.STRIA_WERROR=ON \
    -C build-dir="$wheel_dir/build" .
  if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
    grep -q "STRIA_CUDA_ARCHS:STRING=80$" "$wheel_dir/build/CMakeCache.txt" ||
      { echo "the wheel's CUDA module was not built for the architectures asked"; exit 1; }
  fi
  grep -q "SWIG_EXECUTABLE:FILEPATH=.*pip-build-env" "$wheel_dir/build/CMakeCache.txt" ||
    { echo "the wheel was not built with PyPI's SWIG: $(grep SWIG_EXECUTABLE "$wheel_dir/build/CMakeCache.txt")"; exit 1; }
  grep -q "DLPACK_INCLUDE_DIR:PATH=.*third_party/dlpack/include" "$wheel_dir/build/CMakeCache.txt" ||
    { echo "the wheel was not built with the bundled DLPack header"; exit 1; }
  "$py" -m pip install -q --no-deps --force-reinstall "$wheel_dir"/stria-*.whl
  installed=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/stria
  tests=$(pwd)/bindings/python/tests
  # From elsewhere, without PYTHONPATH: only the installed package can be imported. What the
  # wheel adds to the build tree's run above is its own build of the compiled parts (the library
  # and its modules, the SWIG extension, the JAX handlers) and the installed layout they are found
  # in, so: the suites of the numpy layer, its errors (UCX's module included), threads, serving,
  # plans, grids, softcap and sinks whole, and of stria.torch and stria.jax their cases on one
  # rank and on local groups. The rest (rings of processes, shard_map, documents and grids through
  # torch and JAX, torch.compile, transformers) reaches the same compiled parts through Python
  # layers that are the same files as in the build tree.
  (cd "$wheel_dir" && STRIA_EXPECT_PACKAGE_DIR=$installed timeout 900 "$py" -m pytest -q -p no:cacheprovider \
    --rootdir "$tests" "$tests"/test_{numpy,errors,threads,serving,softcap_sinks,plan,grid,torch,jax}.py \
    -k "not (test_torch or test_jax) or world_of_one or local_group")
fi
echo "== Python bindings: all passed in $((SECONDS - started)) s"
