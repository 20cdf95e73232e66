#!/usr/bin/env bash
# stria-decode-bench on the CUDA runtime model at small shapes, and its lines through
# bench/gpu_report.py: every kind of line the GPU run's decode stage reads must come out, and the
# report must build its decode tables and bars from them.
#
# Usage: test_decode_bench_model.sh BENCH PYTHON GPU_REPORT
set -uo pipefail
bench=$1 python=$2 report=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$bench" --lens 300,1024 --worlds 2,3 --reps 1 --heads 4 --kv-heads 2 --dim 64 --prefill 48 --window 200 \
  >"$out/results.txt" 2>&1; then
  cat "$out/results.txt"
  echo "FAIL: stria-decode-bench failed on the model"
  exit 1
fi
cat "$out/results.txt"
fail=0
expect() {  # expect FILE REGEX WHAT
  if ! grep -q -E "$2" "$1"; then
    echo "FAIL: $3 (no line matching /$2/)"
    fail=1
  fi
}
num='[0-9]+\.[0-9]+'
r=$out/results.txt
expect "$r" "^impl=stria_cuda decode S=1024 Hq=4 Hkv=2 D=64 ms=$num kv_GBs=$num wall_ms=$num work_ms=$num \
host_ms=$num$" "the one-device call, its work on the GPU (the call held behind the gate) and its host time"
expect "$r" "^impl=stria_cuda decode_window S=1024 W=200 Hq=4 Hkv=2 D=64 ms=$num kv_GBs=$num wall_ms=$num \
work_ms=$num$" "the call under a window of 200 keys"
expect "$r" "^impl=stria_cuda decode_fixed N=1 ms=$num wall_ms=$num work_ms=$num host_ms=$num$" "the fixed cost"
expect "$r" "^impl=stria_cuda decode_merge N=3 kernel_ms=$num gather_ms=$num " "the merge kernel over 3 records"
expect "$r" "^impl=stria_cuda prefill S=1024 P=48 Hq=4 Hkv=2 D=64 ms=$num tflops=$num$" "a prefill chunk"
expect "$r" "^impl=stria_cuda decode_sharded S=1024 N=3 rank_ms=$num fixed_ms=$num merge_ms=$num modelled_ms=$num \
ideal_ms=$num of_ideal=$num merge_share=$num work_rank_ms=$num work_merge_ms=$num work_modelled_ms=$num \
work_ideal_ms=$num work_of_ideal=$num work_merge_share=$num$" "the modelled call over 3 ranks, both models"
"$python" "$report" "$r" >"$out/report.md" || { echo "FAIL: gpu_report.py failed on the lines"; fail=1; }
cat "$out/report.md"
expect "$out/report.md" '^\| 1024 \| [0-9.]+ \(' "the report's decode table"
expect "$out/report.md" '^\| 1024 \| 3 \| ([0-9.]+ \| ){6}[0-9.]+ \|$' "the report's modelled call, both models"
expect "$out/report.md" '^\| 3 \| [0-9.]+ \| [0-9.]+ \|$' "the report's merge over 3 ranks"
expect "$out/report.md" 'kernel times\) \|' "the bars judged on the kernels' times"
expect "$out/report.md" '^\| 1024 \| 48 \| [0-9.]+ \(' "the report's prefill table"
expect "$out/report.md" '^\| 1024 \| 200 \| [0-9.]+ \(' "the report's window table"
exit $fail
