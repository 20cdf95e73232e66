#!/bin/sh
# Static checks of the sm_90a kernels that need the compiler, not a GPU:
#  - no register of an in-flight wgmma is touched before its wait (check_wgmma_operands.py, on
#    the PTX that nvcc emits for each kernel translation unit);
#  - ptxas neither serialises the wgmma pipeline (its C7510-C7520 "Potential Performance Loss"
#    notes) nor drops a setmaxnreg (C7508): the first silently costs the overlap the kernels are
#    built around, the second the TMA kernels' register split (24/240, or 24/160 with three
#    consumer warpgroups);
#  - every TMA kernel starts with exactly the registers per thread its CTA size leaves: 168 for
#    384 threads (the producer warpgroup gives 168 - 24 back and two consumer warpgroups take
#    240 - 168 each), 128 for the 512 of the forwards with three consumers (template argument 3:
#    104 back, 3 x 32 taken). The split holds only at that count (ptxas drops the setmaxnreg pair
#    silently in some cases where it does not).
# Usage: check_sm90_kernels.sh NVCC KERNELS_DIR PYTHON UNITS_DIR [REPORTS_DIR]
# UNITS_DIR: the translation units the build generated from kernels/cuda/kernel_matrix.def; the
# sm_90a ones are the wgmma and tma units.
# REPORTS_DIR: where the build kept each sm_90a unit's PTX and ptxas report
# (kernels/cuda/ptxas_report.sh): REPORTS_DIR/<unit>/sm_90a.ptx and ptxas.log; a unit without them
# there fails (the build did not keep what it should have). A unit changed since its report, or
# every unit without REPORTS_DIR, is compiled here with the module's flags.
set -eu
nvcc=$1 kernels=$2 python=$3 units=$4 reports=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
ptxas=$(dirname "$nvcc")/ptxas
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" "$here/check_wgmma_operands.py" --self-test
status=0
checked=0
for src in "$units"/wgmma_*.cu "$units"/tma_*.cu; do
  [ -f "$src" ] || continue
  checked=$((checked + 1))
  unit=$(basename "$src" .cu)
  kept=$reports/$unit
  if [ -n "$reports" ] && { [ ! -f "$kept/sm_90a.ptx" ] || [ ! -f "$kept/ptxas.log" ]; }; then
    echo "$src: the build kept no sm_90a PTX or ptxas report in $kept (kernels/cuda/ptxas_report.sh)"
    status=1
    continue
  fi
  if [ -n "$reports" ] && [ ! "$src" -nt "$kept/ptxas.log" ]; then
    echo "$src (as the build compiled it):"
    ptx=$kept/sm_90a.ptx
    log=$kept/ptxas.log
  else
    # The flags of the module's sm_90a pass (kernels/cuda/CMakeLists.txt), less the host ones.
    flags="-I$kernels -O3 -DNDEBUG -std=c++17 -lineinfo"
    echo "$src:"
    ptx=$work/k.ptx
    log=$work/ptxas.log
    "$nvcc" $flags -arch=sm_90a -ptx "$src" -o "$ptx"
    # ptxas on that same PTX (what nvcc would run next), not a second compile of the source.
    "$ptxas" -arch=sm_90a -O3 -v "$ptx" -o "$work/k.cubin" 2>"$log"
  fi
  "$python" "$here/check_wgmma_operands.py" "$ptx" || status=1
  if grep -E "C75(0[89]|1[0-9]|20)|setmaxnreg|serializ" "$log"; then
    echo "$src: ptxas reports the lines above"
    status=1
  fi
  # The build's report also holds the other architectures' passes (where the Hopper kernels are
  # empty): only the sm_90a entries are read.
  awk '/Compiling entry function .*Tma.*for .sm_90a./ {
         tma = 1; name = $0
         want = name ~ /Tma(Persistent)?ForwardKernel.*Li3EEEv/ ? 128 : 168
         next
       }
       /Compiling entry function/ { tma = 0 }
       tma && /Used [0-9]+ registers/ {
         match($0, /Used [0-9]+ registers/); n = substr($0, RSTART + 5, RLENGTH - 15) + 0
         if (n != want) { print name ": " n " registers at entry, not " want; bad = 1 }
         tma = 0
       }
       END { exit bad }' "$log" || status=1
  entries=$(grep -c "Compiling entry function .*for .sm_90a." "$log" || true)
  [ "$entries" -gt 0 ] || { echo "$src: no sm_90a entry function in ptxas's report"; status=1; }
done
[ "$checked" -gt 0 ] || { echo "no sm_90a units in $units"; exit 1; }
exit $status
