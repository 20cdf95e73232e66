#!/bin/sh
# The CUDA compiler launcher of the kernels' sm_90a units (kernels/cuda/CMakeLists.txt): runs the
# nvcc command it is given and keeps what the static checks of those kernels read
# (tests/ptx/check_sm90_kernels.sh), so that they judge the PTX and ptxas report of the build
# itself instead of compiling every unit a second time.
#
# A command with --keep-dir=DIR (the units' compile options add it with --keep and -Xptxas=-v)
# leaves in DIR its sm_90a PTX (sm_90a.ptx: nvcc names it after the unit, with the virtual
# architecture when it builds several) and ptxas's report (ptxas.log); nvcc's other intermediate
# files are removed. ptxas's report stays out of the build's output: every other line
# nvcc prints (warnings, errors) passes through. Any other command runs unchanged.
# Usage: ptxas_report.sh NVCC ARGS...
keep=""
for arg in "$@"; do
  case $arg in --keep-dir=*) keep=${arg#--keep-dir=} ;; esac
done
[ -n "$keep" ] || exec "$@"
rm -rf "$keep"
mkdir -p "$keep" || exit 1
status=0
"$@" 2>"$keep/stderr.log" || status=$?
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$keep/stderr.log" >&2
mv "$keep/stderr.log" "$keep/ptxas.log"
for file in "$keep"/*; do
  case $file in
    */ptxas.log) ;;
    *.ptx) if grep -q '^\.target sm_90a' "$file"; then mv "$file" "$keep/sm_90a.ptx"; else rm -f "$file"; fi ;;
    *) rm -f "$file" ;;
  esac
done
exit $status
