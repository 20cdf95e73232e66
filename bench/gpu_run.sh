#!/usr/bin/env bash
# The GPU benchmark, in one run on one GPU (the device machine: PyTorch is installed there):
# builds stria with CUDA, runs the GPU tests (their output goes to docs/gpu_test_output.txt),
# compute-sanitizer memcheck and racecheck on a small ring (mma.sync, SIMT, wgmma and TMA), then our
# kernels (mma.sync, and on an H100/H200 the wgmma and TMA families too) beside PyTorch's SDPA
# (flash and cuDNN backends) on the same shapes, the modelled N = 8 ring at 256k tokens, and the
# block length above which a ring step's transfer hides behind its kernels (NVLink, 400 Gb/s IB),
# the NCCL transport at world 1 against the in-process transport (its overhead; issue 5), and the
# Python bindings' GPU tests (torch CUDA tensors, stria.jax's CUDA handlers).
# Prints the tables of docs/performance.md's GPU section to bench/gpu_results.txt.
#
# On the lent GPU machine: run scripts/device-deps.sh here first and carry .device-deps.
#
#   bench/gpu_run.sh             everything
#   QUICK=1 bench/gpu_run.sh     D = 128 at 4k and 16k only, ring at 64k tokens
#   STAGES="build tests" bench/gpu_run.sh, then STAGES="sanitizer kernels" ..., then
#   STAGES="ring hide nccl1 python" ...: the same in parts (stages: build tests sanitizer kernels ring
#   hide nccl1 python),
#   for a device tool whose calls are limited to 10 minutes; the build directory stays between
#   calls on a warm machine, and each stage appends to the results file. The whole run takes
#   about 15 minutes on an H100.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench}
jobs=$(nproc)
stages=" ${STAGES:-build tests sanitizer kernels ring hide nccl1 python} "
stage() { [[ "$stages" == *" $1 "* ]]; }
# The GPU machine's image has neither the DLPack header nor GoogleTest: scripts/device-deps.sh
# gathers them into .device-deps (carried along). NCCL may come as PyTorch's pip wheel there.
deps=()
if [ -d .device-deps ]; then
  deps+=(-DDLPACK_INCLUDE_DIR="$PWD/.device-deps/include" -DSTRIA_GTEST_SOURCE_DIR="$PWD/.device-deps/googletest")
fi
if [ -z "${NCCL_ROOT:-}" ] && nccl=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null); then
  export NCCL_ROOT=$nccl
fi
if stage build; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_WITH_CUDA=ON -DSTRIA_WITH_UCX=OFF \
    -DSTRIA_BUILD_PYTHON=OFF "${deps[@]}" >/dev/null
  ninja -C build-gpu -j"$jobs"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee -a "$out/gpu_results.txt"
wgmma=0
if nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9\.0'; then wgmma=1; fi

# Nothing below may hang past the device tool's 10-minute calls. On a GPU every test case takes
# about a second, so 60 s means a hung kernel; the TMA kernels are the ones that wait on
# mbarriers and named barriers (a misread phase would deadlock them), so their suite runs last
# and stops at its first failure, and their benchmarks run under a time limit.
if stage tests; then
  echo "== GPU tests" | tee -a "$out/gpu_results.txt"
  (cd build-gpu && ctest -L gpu -E '^Tma/' --timeout 60 --output-on-failure -j1 &&
    ctest -L gpu -R '^Tma/' --timeout 60 --stop-on-failure --output-on-failure -j1) 2>&1 |
    tee "$out/gpu_test_output.txt" | grep -E 'tests passed|tests failed|Failed|Timeout|Not Run' | tail -40 ||
    true  # failures are in the output file; the benchmarks below still run
fi

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if stage sanitizer && [ -x "$sanitizer" ]; then
  echo "== compute-sanitizer (memcheck, racecheck) on a small ring" | tee -a "$out/gpu_results.txt"
  filter='TensorCores/CudaRingVsReference.ForwardAndBackward/N3_striped_causal_bf16*:Shapes/*N3_striped_causal_bf16_B2L136*:Shapes/*simt*:Wgmma/*N3_striped_causal_bf16_B2L264*:Tma/*N3_striped_causal_bf16_B2L264*'
  for tool in memcheck racecheck; do
    timeout 240 "$sanitizer" --tool "$tool" --error-exitcode 9 build-gpu/tests/gpu/test_cuda_ring \
      --gtest_filter="$filter" 2>&1 | tail -3 | tee -a "$out/gpu_results.txt"
    # The Hopper primitives one by one (TMA, mbarriers, wgmma): seconds.
    timeout 120 "$sanitizer" --tool "$tool" --error-exitcode 9 build-gpu/tests/gpu/test_hopper_primitives 2>&1 |
      tail -3 | tee -a "$out/gpu_results.txt"
  done
fi

if [ "${QUICK:-0}" = 1 ]; then dims=128 lens=4096,16384 seq=65536; else dims=64,128 lens=1024,2048,4096,8192,16384,32768 seq=262144; fi
if stage kernels; then
  echo "== kernels: stria vs torch SDPA (flash, cuDNN), bf16" | tee -a "$out/gpu_results.txt"
  build-gpu/bench/stria-cuda-bench kernels --dims $dims --lens $lens | tee -a "$out/gpu_results.txt"
  # The Hopper wgmma kernels (opt-in until this run shows them correct): same shapes.
  if [ "$wgmma" = 1 ]; then
    for family in wgmma tma; do
      STRIA_CUDA_KERNELS=$family timeout 300 build-gpu/bench/stria-cuda-bench kernels --dims $dims --lens $lens |
        tee -a "$out/gpu_results.txt" || echo "stria_$family kernels: failed or timed out" | tee -a "$out/gpu_results.txt"
    done
  fi
  python3 bench/torch_sdpa_gpu.py --dims $dims --lens $lens | tee -a "$out/gpu_results.txt"
fi
if stage ring; then
  echo "== ring model, N = 8" | tee -a "$out/gpu_results.txt"
  build-gpu/bench/stria-cuda-bench ring --seq $seq --world 8 --heads 16 --dim 128 | tee -a "$out/gpu_results.txt"
  if [ "$wgmma" = 1 ]; then
    for family in wgmma tma; do
      timeout 240 build-gpu/bench/stria-cuda-bench ring --seq $seq --world 8 --heads 16 --dim 128 --kernels $family |
        tee -a "$out/gpu_results.txt" || echo "ring $family: failed or timed out" | tee -a "$out/gpu_results.txt"
    done
  fi
fi
if stage hide; then
  echo "== transfer hiding: a ring step's kernels against its bytes on NVLink (450 GB/s) and 400 Gb/s IB" |
    tee -a "$out/gpu_results.txt"
  build-gpu/bench/stria-cuda-bench hide --lens $lens --heads 16 --dim 128 | tee -a "$out/gpu_results.txt"
  if [ "$wgmma" = 1 ]; then
    for family in wgmma tma; do
      timeout 180 build-gpu/bench/stria-cuda-bench hide --lens $lens --heads 16 --dim 128 --kernels $family |
        tee -a "$out/gpu_results.txt" || echo "hide $family: failed or timed out" | tee -a "$out/gpu_results.txt"
    done
  fi
fi
bench=build-gpu/bench/stria-nccl-bench
if stage nccl1 && [ -x "$bench" ]; then
  echo "== NCCL transport at world 1 against the in-process transport (causal, H 16, D 128, bf16)" |
    tee -a "$out/gpu_results.txt"
  tmp=$(mktemp -d)
  for L in 4096 16384; do
    for mode in ring-local ring; do
      RANK=0 WORLD_SIZE=1 STRIA_ROOT=127.0.0.1:$((20000 + RANDOM % 30000)) "$bench" "$mode" "$L" 16 128 10 \
        >"$tmp/$mode.$L"
    done
  done
  python3 - "$tmp" 4096 16384 <<'PY' | tee -a "$out/gpu_results.txt"
import collections, statistics, sys
tmp, lens = sys.argv[1], sys.argv[2:]
print("| tokens | layout | pass | in-process ms | NCCL ms | NCCL / in-process |")
print("|---|---|---|---|---|---|")
for L in lens:
    ms = {}
    for mode in ("ring-local", "ring"):
        calls = collections.defaultdict(list)
        for line in open(f"{tmp}/{mode}.{L}"):
            f = line.split()
            if f and f[0] == "CALL":
                calls[(f[1], f[2])].append((float(f[6]) - float(f[5])) * 1e3)
        ms[mode] = {k: statistics.median(v) for k, v in calls.items()}
    for key, local in ms["ring-local"].items():
        nccl = ms["ring"][key]
        print(f"| {L} | {key[0]} | {key[1]} | {local:.3f} | {nccl:.3f} | {nccl / local:.3f} |")
PY
  rm -rf "$tmp"
fi

# The Python bindings on the GPU: torch CUDA tensors and stria.jax's CUDA handlers (XLA's buffers
# and stream) against the float64 reference. The image has PyTorch and JAX but no SWIG: scripts/
# device-deps.sh carries Debian's.
if stage python; then
  echo "== Python on the GPU: stria.torch (CUDA tensors) and stria.jax (XLA FFI, CUDA)" | tee -a "$out/gpu_results.txt"
  swig=()
  if [ -x .device-deps/swig/bin/swig ]; then
    export SWIG_LIB=$PWD/.device-deps/swig/share
    swig=(-DSWIG_EXECUTABLE="$PWD/.device-deps/swig/bin/swig")
  fi
  # An existing build-gpu (the build stage's) keeps its options and gains the bindings.
  [ -f build-gpu/CMakeCache.txt ] || swig+=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_WITH_UCX=OFF "${deps[@]}")
  cmake -S . -B build-gpu -DSTRIA_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$(command -v python3)" "${swig[@]}" >/dev/null
  ninja -C build-gpu -j"$jobs" stria_python
  PYTHONPATH=build-gpu/bindings/python STRIA_REQUIRE_TORCH=1 STRIA_REQUIRE_JAX=1 timeout 300 python3 -m pytest -q \
    -p no:cacheprovider -rs bindings/python/tests/test_torch_cuda.py bindings/python/tests/test_jax.py 2>&1 |
    tee "$out/gpu_python_output.txt" | tail -15 | tee -a "$out/gpu_results.txt" || true
fi
