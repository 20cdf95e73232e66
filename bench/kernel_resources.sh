#!/usr/bin/env bash
# Registers and spills of every attention kernel as ptxas allocates them (nvcc -Xptxas -v), as a
# markdown table: what limits occupancy, and whether a kernel spills, before any GPU is at hand.
# Needs only the CUDA toolkit (no GPU). Compiles each kernel source once for the architecture
# given (default sm_90a; sm_80 for the mma.sync and SIMT kernels of Ampere): a few minutes on 2 cores.
#
#   bench/kernel_resources.sh [sm_90a|sm_80] [BUILD_DIR] > table.md
#
# The tensor-core kernels' translation units are those the build generated from
# kernels/cuda/kernel_matrix.def (BUILD_DIR/kernels/cuda/units; BUILD_DIR defaults to build, any
# configured CUDA build): their bf16 units.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-sm_90a}
units=${2:-build}/kernels/cuda/units
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -d "$units" ] || { echo "no $units: configure a CUDA build first (cmake -S . -B ${2:-build})" >&2; exit 1; }
sources=("$units"/mma_*bf16.cu)
[ "$arch" = sm_90a ] && sources+=("$units"/wgmma_*bf16.cu "$units"/tma_*bf16.cu)
sources+=(kernels/cuda/launch.cu)  # the SIMT kernels and the elementwise ones
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for src in "${sources[@]}"; do
  "$nvcc" -Ikernels -O3 -DNDEBUG -std=c++17 -gencode="arch=compute_${arch#sm_},code=$arch" -Xptxas -v \
    -x cu -c "$src" -o "$tmp/k.o" 2>>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
done
echo "| kernel ($arch; the last argument: with a document mask) | registers | spill stores (B) | spill loads (B) |"
echo "| --- | --- | --- | --- |"
# ptxas prints, per entry: "Compiling entry function 'NAME'", then the spills, then "Used N registers".
# One row per attention kernel (bf16 and float32; float16 is bf16's twin), the first time it appears.
awk '
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
  /spill stores/ { st = $5; ld = $9 }
  /Used [0-9]+ registers/ {
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
    cmd = "c++filt " name; cmd | getline pretty; close(cmd)
    sub(/^void /, "", pretty); sub(/\(.*$/, "", pretty); gsub(/stria::cuda::/, "", pretty)
    if (pretty !~ /^(Mma|Wgmma|Simt)/ || pretty ~ /Half/ || pretty in seen) next
    seen[pretty] = 1
    printf "| %s | %s | %s | %s |\n", pretty, regs, st, ld
  }' "$tmp/log"
