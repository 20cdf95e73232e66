#!/usr/bin/env bash
# bench/gpu_run.sh without a GPU, on this build's GPU programs: every GPU case skips and every
# benchmark fails with "no GPU here", and the script must still go through its stages in order,
# summarise each suite, keep to its time limit and name what the limit left out. A GPU machine's
# time is scarce: a broken script found there costs the whole run.
#
# Usage: test_gpu_run_dry.sh SOURCE_DIR BUILD_DIR. Skips (exit 77) where a GPU is present: there
# the same stages would run the whole GPU suite.
set -uo pipefail
src=$1 build=$2
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "a GPU is present: bench/gpu_run.sh would run the real suite"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
expect() {  # expect FILE REGEX WHAT
  if ! grep -q -E "$2" "$1"; then
    echo "FAIL: $3 (no line matching /$2/ in $(basename "$1"))"
    fail=1
  fi
}

# Everything but the build (this build is the one to use), the sanitizer, profile and python stages.
OUT=$out/a STRIA_GPU_BUILD_DIR=$build STAGES="primitives tests wgmma tma kernels ring docs nccl1 hide decode" BUDGET_S=300 \
  "$src/bench/gpu_run.sh" >"$out/a.log" 2>&1
rc=$?
cat "$out/a.log"
r=$out/a/gpu_results.txt
[ "$rc" -ne 0 ] || { echo "FAIL: the benchmarks failed (no GPU), and the script said nothing"; fail=1; }
expect "$r" '^GPU: none found by nvidia-smi' "the GPU line"
expect "$r" '^hopper_primitives: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the primitives' summary"
expect "$r" '^cuda_ring: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the ring suite's summary"
expect "$r" '^cuda_api: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the API suite's summary"
expect "$r" '^cuda_serving: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the serving suite's summary"
expect "$r" '^cuda_ring_wgmma: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the wgmma cases' summary"
expect "$r" '^cuda_ring_tma: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the TMA cases' summary"
expect "$r" '^cuda_ring_tma_persistent: 0 passed, 0 failed, [1-9][0-9]* skipped$' "the persistent forward's summary"
expect "$r" '^kernel families to time: mma ' "only mma is timed without sm_90"
expect "$r" '^stria_mma kernels: failed or timed out$' "a failed benchmark is reported"
expect "$r" '^stria decode: failed or timed out$' "a failed decode benchmark is reported"
expect "$r" '^== decode \(at [0-9]+ s of 300 s\)$' "the stages run in order to the last one asked for"
expect "$r" '^== done in [0-9]+ s of 300 s; stages with a failure: kernels ring docs( nccl1)? hide decode$' "the closing line"
if grep -q -E '^not run \(the budget\)' "$r"; then
  echo "FAIL: a stage was left out of a 300 s budget"
  fail=1
fi
[ -s "$out/a/gpu_test_output.txt" ] || { echo "FAIL: no test output kept"; fail=1; }
[ ! -e "$out/a/gpu_report.md" ] || { echo "FAIL: a report of a run that measured nothing"; fail=1; }

# A budget too short for the test stages: they are named for the next run, and nothing runs.
OUT=$out/b STRIA_GPU_BUILD_DIR=$build STAGES="tests wgmma kernels" BUDGET_S=15 "$src/bench/gpu_run.sh" \
  >"$out/b.log" 2>&1
cat "$out/b.log"
r=$out/b/gpu_results.txt
expect "$r" '^== tests: skipped, [0-9]+ s of the budget left and it usually takes 90 s$' "a stage that does not fit"
expect "$r" '^not run \(the budget\): next run STAGES="tests wgmma kernels" FAMILIES="mma" bench/gpu_run.sh$' "the next run"
if grep -q -E '^cuda_ring' "$r"; then
  echo "FAIL: a suite ran past the budget"
  fail=1
fi
echo "gpu_run dry run: $([ $fail = 0 ] && echo ok || echo failed)"
exit $fail
