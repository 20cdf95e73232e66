#!/usr/bin/env bash
# Every check that needs a GPU (the GPU suite, the sanitizers, the benchmarks), in one run on a GPU
# machine within a time limit (BUDGET_S): the run is ordered by what a failure would cost most not
# to know, and each stage starts only if its usual time still fits in what is left of the limit.
# What did not fit is named at the end with the STAGES= line that runs it next.
#
#   stage        what                                                      measured on an H200,
#                                                                              2026-11-27
#   build        the GPU targets only (no emulator, no host models)          35-45 s on 16 cores
#   primitives   test_hopper_primitives: TMA, mbarriers, wgmma forms          1 s
#   tests        test_cuda_ring's cases without a family of their own (the    40 s (the float64
#                default's, and again on mma.sync on sm_90) and SIMT's in      reference on the
#                SHARDS parallel processes, then test_cuda_api and             CPU)
#                test_nccl_gpu alone (they fill the device or measure its
#                free memory)
#   wgmma, tma   test_cuda_ring's Hopper cases, a family at a time, after the  15 s, 3 s
#                others: their kernels wait on mbarriers, so a misread phase
#                hangs rather than fails
#   kernels      each family whose tests passed (mma; wgmma and tma on sm_90)  60 s for three
#                beside torch SDPA's flash and cuDNN backends, same shapes;
#                at D 128, causal, softcap 30 and sinks beside the plain call;
#                the TMA backward's atomic dQ, the TMA persistent kernels,
#                the TMA forward's 192-row tiles (D 64) and the last family
#                with its heads all at once (no head groups) too;
#                heads of 256, and of 512 beside torch's efficient and math
#   ring         the modelled N = 8 ring at 256k tokens, per family            12 s a family
#   docs         packed documents: the modelled ring of a document plan and    3 s a family
#                of each layout, lognormal lengths, 32k and 128k tokens, N 8;
#                the plan also with a CTA for every query tile, and per step;
#                again on the TMA family's persistent kernels
#   nccl1        the NCCL transport at world 1 against the in-process one      6 s
#   hide         the block length above which a step's transfer hides         3 s a family
#   decode       decode over a sharded KV cache: one GPU's call at 32k-1M      8-10 s (+3 s)
#                cached tokens beside torch SDPA's decode (flash, cuDNN,
#                memory-efficient), the call under a window of 4096 keys beside
#                SDPA on the window's slice, the modelled call over 2, 4, 8
#                ranks, and prefill chunks of 512 and 4096 tokens beside SDPA's
#   sanitizer    compute-sanitizer memcheck and racecheck, small rings         20 s
#                (and the FP8 forward's cases)
#   python       torch CUDA tensors and stria.jax's CUDA handlers              75 s
#   profile      ncu speed of light, occupancy, launch, warp states, causal D 128 4k   4 s a family
#                (and the TMA persistent kernels)
#
# On a GPU machine whose image lacks the DLPack header or GoogleTest: run scripts/device-deps.sh
# where they are installed, copy .device-deps with the checkout, and run
#   bench/gpu_run.sh                       (docs/gpu-runbook.md: the whole procedure)
# Options (environment): STAGES="kernels ring" (a subset; build is added when build-gpu lacks the
# binaries), BUDGET_S (default 570: a ten-minute limit less a margin), QUICK=1 (D 128 at 4k and 16k,
# ring at 64k), SHARDS (default: cores / 2, at most 8), FAMILIES="mma wgmma tma" (the kernel
# families to time, for a run that does not run their tests).
# Output: $OUT (or bench/) gets gpu_results.txt (the summaries and the benchmarks' lines),
# gpu_report.md (those as docs/performance.md's tables, with the kernel targets judged: bench/
# gpu_report.py; written once the benchmarks have run, and again at the end), gpu_test_output.txt
# (every test's log), gpu_sanitizer_output.txt (compute-sanitizer's reports, 4 MB a run at most),
# gpu_profile.txt (ncu), gpu_python_output.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# Python's output into a pipe unbuffered: a script that a time limit stops keeps what it printed.
export PYTHONUNBUFFERED=1
out=${OUT:-bench}
mkdir -p "$out"
results=$out/gpu_results.txt
budget=${BUDGET_S:-570}
jobs=$(nproc)
shards=${SHARDS:-$((jobs / 2 > 8 ? 8 : (jobs / 2 < 1 ? 1 : jobs / 2)))}
all="build primitives tests wgmma tma kernels ring docs nccl1 hide decode sanitizer python profile"
stages=" ${STAGES:-$all} "
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
skipped=()
failed=()

say() { echo "$*" | tee -a "$results"; }
left() { echo $((budget - SECONDS)); }
# stage NAME SECONDS: whether to run stage NAME, which usually takes SECONDS: it was asked for and
# that much of the budget is left. A stage asked for that does not fit is named for the next run.
stage() {
  [[ "$stages" == *" $1 "* ]] || return 1
  if [ "$(left)" -lt "$2" ]; then
    say "== $1: skipped, $(left) s of the budget left and it usually takes $2 s"
    skipped+=("$1")
    return 1
  fi
  say "== $1 (at ${SECONDS} s of ${budget} s)"
  return 0
}
# cap SECONDS: a time limit for one command, never past the end of the budget.
cap() {
  local l
  l=$(left)
  echo $(($1 < l ? $1 : (l > 5 ? l : 5)))
}
# note_failure STAGE: remembered for the closing line; the run goes on.
note_failure() { [[ " ${failed[*]} " == *" $1 "* ]] || failed+=("$1"); }
# report: docs/performance.md's tables and the kernel targets from what this run measured so far.
report() {
  if grep -q -E '^(impl=|ring kernels=|docs kernels=|hide_threshold |\| tokens \| layout )' "$results"; then
    python3 bench/gpu_report.py "$results" >"$out/gpu_report.md"
  fi
}

# The GPU machine's image has neither the DLPack header nor GoogleTest: scripts/device-deps.sh
# gathers them into .device-deps (carried along). NCCL comes as PyTorch's pip wheel there.
deps=()
if [ -d .device-deps ]; then
  deps+=(-DDLPACK_INCLUDE_DIR="$PWD/.device-deps/include" -DSTRIA_GTEST_SOURCE_DIR="$PWD/.device-deps/googletest")
fi
if [ -z "${NCCL_ROOT:-}" ] && nccl=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null); then
  export NCCL_ROOT=$nccl
  export LD_LIBRARY_PATH=$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

# What the machine has, in one line each, before anything is built: a stage that fails later for
# want of one of these is then explained by the first lines of the results.
say "tools: $(cmake --version 2>/dev/null | head -1); $(nvcc --version 2>/dev/null | tail -1); $(c++ --version |
  head -1); $(python3 --version 2>&1)"
say "python: $(python3 - <<'PY' 2>&1 | tail -1
import importlib.metadata as m, os, sysconfig
def v(p):
    try:
        return m.version(p)
    except m.PackageNotFoundError:
        return "none"
h = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print(f"torch {v('torch')}, jax {v('jax')}, jaxlib {v('jaxlib')}, pytest {v('pytest')}; Python.h {'yes' if h else 'no'}")
PY
)"
say "NCCL: ${NCCL_ROOT:-not found as a pip wheel}; compute-sanitizer: $(command -v compute-sanitizer ||
  ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo no)"

bin=${STRIA_GPU_BUILD_DIR:-build-gpu}  # another build with the GPU targets: CI's dry run of this script
targets=(stria stria-cuda test_cuda_ring test_cuda_api test_cuda_serving test_hopper_primitives stria-cuda-bench
  stria-decode-bench)
nccl_targets=(stria-nccl test_nccl_gpu stria-nccl-rank stria-nccl-bench)
# A later call on a machine that is no longer warm starts bare: rebuild whatever stages it runs.
[ -x "$bin"/tests/gpu/test_cuda_ring ] || stages+="build "
if stage build 60; then
  if ! cmake -S . -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_WITH_CUDA=ON -DSTRIA_WITH_UCX=OFF \
    -DSTRIA_BUILD_PYTHON=OFF -DSTRIA_BUILD_EXAMPLES=OFF "${deps[@]}" >"$tmp/configure.log" 2>&1 ||
    ! ninja -C "$bin" -j"$jobs" "${targets[@]}" >"$tmp/build.log" 2>&1; then
    cat "$tmp/configure.log" "$tmp/build.log" 2>/dev/null | tail -40 | tee -a "$results"
    say "build failed: nothing else can run"
    exit 1
  fi
  # NCCL apart: without it (or with a build failure there) the CUDA checks still run.
  # Not `ninja ... | grep -q`: grep stops at the first match, ninja dies of SIGPIPE on a long list,
  # and pipefail reads that as "not found" (it did, on the first GPU run).
  if ! grep -q '^stria-nccl:' <(ninja -C "$bin" -t targets all 2>/dev/null); then
    grep -i nccl "$tmp/configure.log" | tee -a "$results"
    say "NCCL not found by CMake (NCCL_ROOT=${NCCL_ROOT:-unset}): the NCCL checks are left out"
    note_failure build
  elif ! ninja -C "$bin" -j"$jobs" "${nccl_targets[@]}" >"$tmp/build-nccl.log" 2>&1; then
    tail -30 "$tmp/build-nccl.log" | tee -a "$results"
    say "the NCCL targets failed to build: the NCCL checks are left out"
    note_failure build
  fi
  say "built in ${SECONDS} s"
fi

gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.sm,memory.total --format=csv,noheader \
  2>/dev/null | head -1)
[ -n "$gpu" ] || gpu="none found by nvidia-smi"
say "GPU: $gpu; $jobs cores"
hopper=0
[[ "$gpu" == *", 9.0,"* ]] && hopper=1
families=(mma)  # the Hopper families join once their tests pass (below)
tma_atomic=0    # and the TMA backward's atomic dQ beside its default
tma_persistent=0  # and the TMA family's persistent kernels beside its default
tma_rows192=0     # and the TMA forward's three consumer warpgroups at head dim 64 beside its default
tma_ordered=1     # the TMA family's deterministic backward in one pass, unless its cases fail

# Test logs: one per process, all appended to gpu_test_output.txt; gtest_summary.py says per suite
# what passed, failed, or started and never ended (the case a time limit or a crash stopped).
testlog=$out/gpu_test_output.txt
summarize() {  # summarize LABEL LOG...
  cat "${@:2}" >>"$testlog"
  python3 bench/gtest_summary.py "$@" | tee -a "$results"
  return "${PIPESTATUS[0]}"
}
# sharded NAME LIMIT BINARY FILTER: the binary's cases in $shards processes at once.
sharded() {
  local name=$1 limit=$2 binary=$3 filter=$4 i logs=()
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout -k 10 "$limit" "$binary" --gtest_filter="$filter" \
      >"$tmp/$name.$i.log" 2>&1 &
    logs+=("$tmp/$name.$i.log")
  done
  wait
  summarize "$name" "${logs[@]}"
}
# alone NAME LIMIT BINARY [ARGS...]: one process.
alone() {
  local name=$1 limit=$2
  timeout -k 10 "$limit" "${@:3}" >"$tmp/$name.log" 2>&1
  summarize "$name" "$tmp/$name.log"
}

if stage primitives 10; then
  alone hopper_primitives "$(cap 60)" "$bin"/tests/gpu/test_hopper_primitives || note_failure primitives
fi
# The families apart, so that a kernel that hangs (every case of its family would, in every shard)
# costs its own family's time limit and hides no other family's results; the Hopper families, whose
# kernels wait on mbarriers, after the others. A Hopper family whose tests fail is not timed below;
# mma, the default, always is (with a failed case its figures say how fast, not that it is right).
if stage tests 90; then
  # The cases without a family of their own (the deterministic ones included; the Hopper families'
  # come in their own stages) twice: on the library's default (TMA on compute capability 9.0,
  # mma.sync elsewhere) and on mma.sync (STRIA_TEST_KERNELS).
  default_cases='TensorCores/*:Shapes/*:Devices/*:Documents/*:Windows/*:Deterministic/*:Grid/*:Softcap/*:Sinks/*'
  default_cases+='-*_wgmma*:*_tma*'
  sharded cuda_ring "$(cap 200)" "$bin"/tests/gpu/test_cuda_ring "$default_cases" || note_failure tests
  if [ $hopper = 1 ]; then
    STRIA_TEST_KERNELS=mma sharded cuda_ring_mma "$(cap 200)" "$bin"/tests/gpu/test_cuda_ring "$default_cases" ||
      note_failure tests
  fi
  alone cuda_api "$(cap 150)" "$bin"/tests/gpu/test_cuda_api || note_failure tests
  alone cuda_serving "$(cap 60)" "$bin"/tests/gpu/test_cuda_serving || note_failure tests
  if [ -x "$bin"/tests/nccl/test_nccl_gpu ]; then
    alone nccl_gpu "$(cap 120)" "$bin"/tests/nccl/test_nccl_gpu || note_failure tests
  else
    say "nccl_gpu: not built"
  fi
fi
for family in wgmma tma; do
  if stage "$family" 20; then
    suite=$([ $family = wgmma ] && echo Wgmma || echo Tma)
    # The TMA family's deterministic cases apart: they run its one-pass ordered dQ, whose failure
    # leaves the family's own figures to be timed (its deterministic backward then on the dQ pass).
    own="$suite/*:*_$family*"
    [ $family = tma ] && own+="-Deterministic/*"
    if sharded "cuda_ring_$family" "$(cap 120)" "$bin"/tests/gpu/test_cuda_ring "$own"; then
      [ $hopper = 1 ] && families+=("$family")
    else
      note_failure "$family"
    fi
    if [ $family = tma ]; then
      if ! sharded cuda_ring_tma_ordered "$(cap 60)" "$bin"/tests/gpu/test_cuda_ring "Deterministic/*_tma*"; then
        tma_ordered=0
        note_failure tma
      fi
    fi
    # The TMA backward's other dQ path (the consumers' atomics; the default is the dQ warp's bulk
    # reductions), timed below beside the default once its cases pass.
    if [ $family = tma ]; then
      if STRIA_CUDA_TMA_DQ=atomic sharded cuda_ring_tma_atomicdq "$(cap 120)" "$bin"/tests/gpu/test_cuda_ring \
        "Tma/*"; then
        [ $hopper = 1 ] && [[ " ${families[*]} " == *" tma "* ]] && tma_atomic=1
      else
        note_failure tma
      fi
      # The TMA family's persistent kernels (a CTA per SM; the default is a CTA per tile), timed
      # below beside the default once their cases pass.
      if STRIA_CUDA_TMA_SCHEDULE=persistent sharded cuda_ring_tma_persistent "$(cap 120)" "$bin"/tests/gpu/test_cuda_ring \
        "Tma/*:Documents/*_tma*:Softcap/*_tma*:Sinks/*_tma*:Windows/*_tma*:Deterministic/*_tma*"; then
        [ $hopper = 1 ] && [[ " ${families[*]} " == *" tma "* ]] && tma_persistent=1
      else
        note_failure tma
      fi
      # Heads in small groups (kernels/cuda/head_groups.cuh; at these cases' sizes the default's
      # groups hold every head): the order of CTAs, of persistent items and of ordered-dQ tickets.
      if ! STRIA_CUDA_HEAD_GROUP_BYTES=30000 sharded cuda_ring_head_groups "$(cap 60)" "$bin"/tests/gpu/test_cuda_ring \
        "Tma/*:Wgmma/*:Deterministic/*_tma*:Documents/*_tma_docs*"; then
        note_failure tma
      fi
      # The TMA forward's 192-row tiles (three consumer warpgroups at head dim 64; the default is
      # two), timed below beside the default once their cases pass.
      if STRIA_CUDA_TMA_FORWARD_ROWS=192 sharded cuda_ring_tma_rows192 "$(cap 60)" "$bin"/tests/gpu/test_cuda_ring \
        "Tma/*D64_tma*:Documents/*D64_tma*:Softcap/*D64_tma*:Sinks/*D64_tma*:Windows/*D64_tma*"; then
        [ $hopper = 1 ] && [[ " ${families[*]} " == *" tma "* ]] && tma_rows192=1
      else
        note_failure tma
      fi
    fi
  fi
done
# FAMILIES: a later call's choice, from the tests of an earlier one.
[ -n "${FAMILIES:-}" ] && read -r -a families <<<"$FAMILIES"
say "kernel families to time: ${families[*]} (wgmma and tma on sm_90 once their tests pass, or FAMILIES=)"

if [ "${QUICK:-0}" = 1 ]; then
  dims=128 lens=4096,16384 seq=65536
else
  dims=64,128 lens=1024,2048,4096,8192,16384,32768 seq=262144
fi
nf=${#families[@]}  # the timed stages' usual times grow with the families timed
if stage kernels $((45 + 25 * nf)); then
  say "-- stria's kernels beside torch SDPA (flash, cuDNN), bf16, the same shapes"
  for family in "${families[@]}"; do
    # The TMA family's deterministic backward on its dQ pass where its ordered dQ failed its cases.
    dq_way=$([ $family = tma ] && [ $tma_ordered = 0 ] && echo passes || echo)
    STRIA_CUDA_DETERMINISTIC_DQ=$dq_way STRIA_CUDA_KERNELS=$family timeout -k 10 "$(cap 240)" \
      "$bin"/bench/stria-cuda-bench kernels --dims $dims --lens $lens 2>&1 | tee -a "$results" ||
      { say "stria_$family kernels: failed or timed out"; note_failure kernels; }
  done
  if [ $tma_atomic = 1 ]; then  # the backward is what differs; the forward comes along
    STRIA_CUDA_KERNELS=tma STRIA_CUDA_TMA_DQ=atomic timeout -k 10 "$(cap 240)" \
      "$bin"/bench/stria-cuda-bench kernels --dims $dims --lens $lens --deterministic 0 2>&1 | tee -a "$results" ||
      { say "stria_tma_atomicdq kernels: failed or timed out"; note_failure kernels; }
  fi
  if [ $tma_persistent = 1 ]; then
    STRIA_CUDA_KERNELS=tma STRIA_CUDA_TMA_SCHEDULE=persistent timeout -k 10 "$(cap 240)" \
      "$bin"/bench/stria-cuda-bench kernels --dims $dims --lens $lens --deterministic 0 2>&1 | tee -a "$results" ||
      { say "stria_tma_persistent kernels: failed or timed out"; note_failure kernels; }
  fi
  # The order of CTAs before head groups (every head at once), beside the default (groups that fit
  # half the L2: kernels/cuda/head_groups.cuh), on the default family.
  STRIA_CUDA_KERNELS=${families[-1]} STRIA_CUDA_HEAD_GROUP_BYTES=0 timeout -k 10 "$(cap 240)" \
    "$bin"/bench/stria-cuda-bench kernels --dims $dims --lens $lens --deterministic 0 2>&1 | tee -a "$results" ||
    { say "stria_${families[-1]}_headgroup0 kernels: failed or timed out"; note_failure kernels; }
  if [ $tma_rows192 = 1 ] && [[ ",$dims," == *",64,"* ]]; then  # the forward is what differs
    STRIA_CUDA_KERNELS=tma STRIA_CUDA_TMA_FORWARD_ROWS=192 timeout -k 10 "$(cap 120)" \
      "$bin"/bench/stria-cuda-bench kernels --dims 64 --lens $lens --deterministic 0 2>&1 | tee -a "$results" ||
      { say "stria_tma_rows192 kernels: failed or timed out"; note_failure kernels; }
  fi
  timeout -k 10 "$(cap 240)" python3 bench/torch_sdpa_gpu.py --dims $dims --lens $lens 2>&1 | tee -a "$results" ||
    { say "torch SDPA: failed or timed out"; note_failure kernels; }
  # Head dim 256 (Gemma's), on the Hopper families (forward, backward and the deterministic
  # backward), at two lengths beside the same anchors. mma.sync has every pass at 256 too, for
  # Ampere and Ada; on this GPU the Hopper families are what runs.
  if [ "${QUICK:-0}" != 1 ]; then
    for family in "${families[@]}"; do
      [ "$family" = mma ] && continue
      STRIA_CUDA_KERNELS=$family timeout -k 10 "$(cap 120)" \
        "$bin"/bench/stria-cuda-bench kernels --dims 256 --lens 4096,16384 2>&1 | tee -a "$results" ||
        { say "stria_$family kernels, D 256: failed or timed out"; note_failure kernels; }
    done
    timeout -k 10 "$(cap 120)" python3 bench/torch_sdpa_gpu.py --dims 256 --lens 4096,16384 2>&1 | tee -a "$results" ||
      { say "torch SDPA, D 256: failed or timed out"; note_failure kernels; }
    # Heads of 512 (Gemma 4's full-attention layers): the SIMT kernels' wide build, beside the
    # torch backends that take them (flash and cuDNN stop at 256).
    timeout -k 10 "$(cap 120)" "$bin"/bench/stria-cuda-bench kernels --dims 512 --lens 4096 --reps 3 2>&1 |
      tee -a "$results" || { say "stria kernels, D 512: failed or timed out"; note_failure kernels; }
    timeout -k 10 "$(cap 120)" python3 bench/torch_sdpa_gpu.py --dims 512 --lens 4096 --reps 3 \
      --backends efficient,math 2>&1 | tee -a "$results" || { say "torch SDPA, D 512: failed or timed out"; note_failure kernels; }
  fi
fi
if stage ring $((25 * nf)); then
  for family in "${families[@]}"; do
    timeout -k 10 "$(cap 200)" "$bin"/bench/stria-cuda-bench ring --seq $seq --world 8 --heads 16 --dim 128 \
      --kernels "$family" 2>&1 | tee -a "$results" || { say "ring $family: failed or timed out"; note_failure ring; }
  done
fi
if stage docs $((20 * nf)); then
  for family in "${families[@]}"; do
    for dseq in 32768 131072; do
      timeout -k 10 "$(cap 120)" "$bin"/bench/stria-cuda-bench docs --seq $dseq --world 8 --heads 16 --dim 128 \
        --reps 5 --kernels "$family" 2>&1 | tee -a "$results" || { say "docs $family: failed or timed out"; note_failure docs; }
    done
  done
  # The document plan's steps are short blocks of few tiles per CTA: the persistent kernels' case
  # (kernels=tma_persistent).
  if [ $tma_persistent = 1 ]; then
    for dseq in 32768 131072; do
      STRIA_CUDA_TMA_SCHEDULE=persistent timeout -k 10 "$(cap 120)" "$bin"/bench/stria-cuda-bench docs --seq $dseq \
        --world 8 --heads 16 --dim 128 --reps 5 --kernels tma 2>&1 | tee -a "$results" ||
        { say "docs tma_persistent: failed or timed out"; note_failure docs; }
    done
  fi
fi
if stage nccl1 20 && { [ -x "$bin"/bench/stria-nccl-bench ] || { say "stria-nccl-bench: not built"; false; }; }; then
  say "-- NCCL transport at world 1 against the in-process transport (causal, H 16, D 128, bf16)"
  nccl_ok=1
  for L in 4096 16384; do
    for mode in ring-local ring; do
      [ $nccl_ok = 1 ] || break 2  # one failure (a hang, say) is enough to know: the time goes on
      RANK=0 WORLD_SIZE=1 STRIA_ROOT=127.0.0.1:$((20000 + RANDOM % 30000)) timeout -k 10 "$(cap 60)" \
        "$bin"/bench/stria-nccl-bench "$mode" "$L" 16 128 10 >"$tmp/$mode.$L" 2>&1 ||
        { tail -5 "$tmp/$mode.$L" | tee -a "$results"; nccl_ok=0; }
    done
  done
  if [ $nccl_ok = 1 ]; then
    python3 - "$tmp" 4096 16384 <<'PY' 2>&1 | tee -a "$results"
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
  else
    note_failure nccl1
  fi
fi
if stage hide $((10 * nf)); then
  say "-- transfer hiding: a ring step's kernels against its bytes on NVLink (450 GB/s) and 400 Gb/s IB"
  for family in "${families[@]}"; do
    timeout -k 10 "$(cap 120)" "$bin"/bench/stria-cuda-bench hide --lens $lens --heads 16 --dim 128 --kernels "$family" 2>&1 |
      tee -a "$results" || { say "hide $family: failed or timed out"; note_failure hide; }
  done
fi
if stage decode 60; then
  say "-- decode over a sharded KV cache (bf16, Hq 32, Hkv 8, D 128) beside torch SDPA's decode, also under a window;" \
    "prefill chunks"
  dlens=$([ "${QUICK:-0}" = 1 ] && echo 32768,131072 || echo 32768,131072,524288,1048576)
  timeout -k 10 "$(cap 120)" "$bin"/bench/stria-decode-bench --lens $dlens --prefill 512,4096 --window 4096 2>&1 | tee -a "$results" ||
    { say "stria decode: failed or timed out"; note_failure decode; }
  timeout -k 10 "$(cap 60)" python3 bench/torch_sdpa_gpu.py --decode $dlens --prefill 512,4096 --window 4096 2>&1 |
    tee -a "$results" || { say "torch SDPA decode: failed or timed out"; note_failure decode; }
fi
report  # every benchmark has run: the tables survive a later stage that the call's limit stops

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if stage sanitizer 60; then
  # memcheck: a small ring (three rank threads) of each family whose tests passed. racecheck: a
  # world of one per kernel family, one process each: its hazards are within a CTA's shared memory,
  # which one rank's kernels show as well as three, and on the first GPU run racecheck lost track of
  # the three threads' launches ("failed to track a kernel launch") and then hung in the next ring.
  # The Hopper primitives one by one under both. Each run under its own limit. The cases without a
  # family of their own on mma.sync (STRIA_TEST_KERNELS): the Hopper families have cases of theirs.
  filter='TensorCores/*N3_striped_causal_bf16*:Shapes/*N3_striped_causal_bf16_B2L136*:Shapes/*simt*'
  races=('TensorCores/*N1_striped_causal_bf16_B1L80H4x2D64' 'Shapes/*N1_striped_causal_bf16_B2L136H4x1D128'
    'Deterministic/*N1_striped_causal_bf16_B1L80H4x2D64_deterministic')
  for family in wgmma tma; do
    [[ " ${families[*]} " == *" $family "* ]] || continue
    suite=$([ $family = wgmma ] && echo Wgmma || echo Tma)
    filter+=":$suite/*N3_striped_causal_bf16_B2L264*:Deterministic/*N3_*_${family}_deterministic"
    races+=("$suite/*N1_striped_causal_bf16_B2L264H4x1D128_$family")
  done
  if [ ! -x "$sanitizer" ]; then
    say "compute-sanitizer not found"
    note_failure sanitizer
  else
    # Decode: the tensor-core kernel (16-bit at D 64 and 128) under both tools, the SIMT one under
    # memcheck (float32 and the other head dims).
    runs=("memcheck ring $filter" "memcheck primitives" "memcheck serving Cases/CudaDecode.*")
    for r in "${races[@]}"; do runs+=("racecheck ring $r"); done
    # The TMA persistent kernels: their buffers and stages are reused across work items.
    if [ $tma_persistent = 1 ]; then
      runs+=("memcheck ring_persistent Tma/*N3_striped_causal_bf16_B2L264*:Documents/*_tma_docs9")
      runs+=("racecheck ring_persistent Tma/*N1_striped_causal_bf16_B2L264H4x1D128_tma")
    fi
    # The TMA forward's three consumer warpgroups (head dim 64).
    if [ $tma_rows192 = 1 ]; then
      runs+=("memcheck ring_rows192 Tma/*N3_striped_causal_bf16_B1L80H4x2D64_tma:Documents/*_tma_docs8_plan128_home")
      runs+=("racecheck ring_rows192 Tma/*N1_striped_causal_bf16_B1L80H4x2D64_tma")
    fi
    # The e4m3 forward and its message's transposing pass (FP8 inputs at head dim 128 on Hopper).
    if [[ " ${families[*]} " == *" tma "* ]]; then
      runs+=("memcheck api CudaFp8.*" "racecheck api CudaFp8.E4m3KernelAtHeadDim128")
      # A plan's kept documents on their own stream beside the ring's (the home part).
      runs+=("memcheck ring Documents/*_tma_docs8_plan128_home")
      # The deterministic backward's ordered dQ (its CTAs wait on counts in global memory).
      runs+=("racecheck ring Deterministic/*N1_striped_causal_bf16_B2L264H4x1D128_tma_deterministic")
    fi
    runs+=("racecheck primitives" "racecheck serving Cases/CudaDecode.*N3_striped_paged_f16_B3_T3_H8x2_D128*")
    for run in "${runs[@]}"; do
      read -r tool what cases <<<"$run"
      schedule=tiles rows=128
      if [ "${what#ring}" != "$what" ]; then
        args=("$bin"/tests/gpu/test_cuda_ring --gtest_filter="$cases") limit=$([ $tool = memcheck ] && echo 150 || echo 60)
        [ "$what" = ring_persistent ] && schedule=persistent
        [ "$what" = ring_rows192 ] && rows=192
      elif [ "$what" = serving ]; then
        args=("$bin"/tests/gpu/test_cuda_serving --gtest_filter="$cases") limit=90
      elif [ "$what" = api ]; then
        args=("$bin"/tests/gpu/test_cuda_api --gtest_filter="$cases") limit=60
      else
        args=("$bin"/tests/gpu/test_hopper_primitives) limit=60
      fi
      STRIA_CUDA_TMA_SCHEDULE=$schedule STRIA_CUDA_TMA_FORWARD_ROWS=$rows STRIA_TEST_KERNELS=mma timeout -k 10 "$(cap $limit)" "$sanitizer" --tool "$tool" --error-exitcode 9 "${args[@]}" \
        >"$tmp/san.log" 2>&1
      rc=$?
      # Apart from the test logs and capped: a flood of race reports must not make the files too
      # large to come back.
      { echo "=== $tool $what ${cases:-} (exit $rc)"; head -c 1000000 "$tmp/san.log"; } >>"$out/gpu_sanitizer_output.txt"
      say "$tool $what ${cases:-}: exit $rc ($([ $rc = 124 ] && echo 'time limit' || echo '0 is clean')); $(grep -E \
        'ERROR SUMMARY|RACECHECK SUMMARY' "$tmp/san.log" | tail -1)"
      [ $rc = 0 ] || note_failure sanitizer
      [ "$(left)" -gt 20 ] || break
    done
  fi
fi

# The Python bindings on the GPU: torch CUDA tensors and stria.jax's CUDA handlers (XLA's buffers
# and stream) against the float64 reference. The image has PyTorch and JAX but no SWIG: scripts/
# device-deps.sh carries Debian's.
if stage python 90; then
  swig=()
  if [ -x .device-deps/swig/bin/swig ]; then
    export SWIG_LIB=$PWD/.device-deps/swig/share
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PWD/.device-deps/swig/lib  # after the image's own
    swig=(-DSWIG_EXECUTABLE="$PWD/.device-deps/swig/bin/swig")
  fi
  if ! { cmake -S . -B "$bin" -DSTRIA_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$(command -v python3)" "${swig[@]}" \
    >"$tmp/py-configure.log" 2>&1 && ninja -C "$bin" -j"$jobs" stria_python >"$tmp/py-build.log" 2>&1; }; then
    cat "$tmp/py-configure.log" "$tmp/py-build.log" | tail -30 | tee -a "$results"
    note_failure python
  else
    PYTHONPATH=$bin/bindings/python STRIA_REQUIRE_TORCH=1 STRIA_REQUIRE_JAX=1 timeout -k 10 "$(cap 300)" python3 -m pytest \
      -q -p no:cacheprovider -rs bindings/python/tests/test_torch_cuda.py bindings/python/tests/test_jax.py \
      >"$out/gpu_python_output.txt" 2>&1 || note_failure python
    tail -15 "$out/gpu_python_output.txt" | tee -a "$results"
  fi
fi

# Where a family's time goes, for the next step if a bar is missed: Nsight Compute's speed-of-light,
# occupancy, launch and warp-state sections (with each stall reason's share) of the causal forward and backward kernels at D 128,
# 4k tokens (the benchmark's shape where the bars were missed; the first four launches are the
# non-causal ones, with the deterministic backward left untimed so that the count holds, and the
# split timings come after the counted ones). Clocks as found: ncu's default clock control has not
# been tried on these machines.
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if stage profile $((30 * nf)); then
  if [ -z "$ncu" ]; then
    say "ncu not found"
  else
    runs=("${families[@]}")
    [ $tma_persistent = 1 ] && runs+=(tma_persistent)  # the TMA family's persistent kernels too
    for run in "${runs[@]}"; do
      family=${run%_persistent} schedule=$([ "$run" = tma_persistent ] && echo persistent || echo tiles)
      STRIA_CUDA_KERNELS=$family STRIA_CUDA_TMA_SCHEDULE=$schedule timeout -k 10 "$(cap 120)" "$ncu" --clock-control none \
        --kernel-name regex:'(Forward|Backward)Kernel' --launch-skip 4 --launch-count 4 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        "$bin"/bench/stria-cuda-bench kernels --dims 128 --lens 4096 --reps 1 --deterministic 0 \
        >>"$out/gpu_profile.txt" 2>&1 || { say "profile $run: failed or timed out"; note_failure profile; }
    done
    say "profile: $(grep -c ', Context [0-9]*, Stream ' "$out/gpu_profile.txt" 2>/dev/null) kernel reports in gpu_profile.txt"
  fi
fi

# The tables of docs/performance.md and the kernel targets, from what this run measured.
report
[ -f "$out/gpu_report.md" ] && cat "$out/gpu_report.md"
say "== done in ${SECONDS} s of ${budget} s; stages with a failure: ${failed[*]:-none}"
if [ ${#skipped[@]} -gt 0 ]; then
  say "not run (the budget): next run STAGES=\"${skipped[*]}\" FAMILIES=\"${families[*]}\" bench/gpu_run.sh"
fi
[ ${#failed[@]} -eq 0 ]
