#!/usr/bin/env bash
# Runs every CPU benchmark with its anchors side by side, in one run, and prints the tables of
# docs/performance.md. Installs what it needs: the build tools (Debian) and, in its own virtual
# environment (.venv-bench), PyTorch as the peer anchor — an anchor, not a dependency of stria.
#
#   bench/run.sh            full matrix (several minutes on 2 cores)
#   QUICK=1 bench/run.sh    one shape per table
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-5}

if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || [ ! -f /usr/include/dlpack/dlpack.h ]; then
  apt-get update -qq && apt-get install -y -qq cmake ninja-build g++ libdlpack-dev >/dev/null
fi
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_BUILD_TESTS=OFF >/dev/null
ninja -C build-bench -j"$THREADS" stria-bench stria-fma-peak stria-fma-peak-avx512 >/dev/null

if [ ! -x .venv-bench/bin/python ] || ! .venv-bench/bin/python -c "import torch" 2>/dev/null; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q torch numpy
fi
py=.venv-bench/bin/python

out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  echo "machine cpu=\"$(lscpu | sed -n 's/^Model name: *//p')\" cores=$(nproc) flags=$(grep -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ',')"
  if grep -q -w avx512f /proc/cpuinfo; then build-bench/bench/stria-fma-peak-avx512 "$THREADS"; else build-bench/bench/stria-fma-peak "$THREADS"; fi
  if [ "${QUICK:-0}" = 1 ]; then dims="128"; lens="4096"; dtypes="f32"; else dims="64 128"; lens="1024 2048 4096 8192"; dtypes="f32 bf16"; fi
  for dtype in $dtypes; do
    for d in $dims; do
      for l in $lens; do
        # Side by side: the same shape, one right after the other.
        build-bench/bench/stria-bench kernel --dim "$d" --len "$l" --heads 8 --causal 1 --dtype "$dtype" --threads "$THREADS" --reps "$REPS"
        $py bench/torch_sdpa.py --dim "$d" --len "$l" --heads 8 --causal 1 --dtype "$dtype" --threads "$THREADS" --reps "$REPS"
      done
    done
  done
  # The ring per layout: modelled latency (N dedicated machines) for N = 2..8 at 16k tokens.
  for n in 2 4 8; do
    build-bench/bench/stria-bench ring --world "$n" --len $((16384 / n)) --heads 8 --dim 128 --threads 1 --reps 3
  done
  # Overlap: 2 ranks on 2 cores, 1 thread each — wall time against the slowest rank's compute.
  for l in 4096 8192; do
    build-bench/bench/stria-bench ring --world 2 --len "$l" --heads 8 --dim 128 --threads 1 --reps 3
  done
} | tee "$out"
echo
python3 bench/report.py <"$out"
