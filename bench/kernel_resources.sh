#!/usr/bin/env bash
# Registers and spills of every attention kernel as ptxas allocates them (nvcc -Xptxas -v), as a
# markdown table: what limits occupancy, and whether a kernel spills, before any GPU is at hand.
# Needs only the CUDA toolkit (no GPU). Compiles each kernel source once for the architecture
# given (default sm_90a; sm_80 for the mma.sync and SIMT kernels of Ampere): a few minutes on 2 cores.
#
#   bench/kernel_resources.sh [sm_90a|sm_80] > table.md
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-sm_90a}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
sources=(kernels/cuda/mma_fwd_bf16.cu kernels/cuda/mma_bwd_bf16.cu kernels/cuda/mma_bwd_det_bf16.cu)
[ "$arch" = sm_90a ] && sources+=(kernels/cuda/wgmma_fwd_bf16.cu kernels/cuda/wgmma_bwd_bf16.cu
  kernels/cuda/tma_fwd_bf16.cu kernels/cuda/tma_bwd_bf16.cu)
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
    if (pretty !~ /^(Flash|Wgmma|Simt)/ || pretty ~ /Half/ || pretty in seen) next
    seen[pretty] = 1
    printf "| %s | %s | %s | %s |\n", pretty, regs, st, ld
  }' "$tmp/log"
