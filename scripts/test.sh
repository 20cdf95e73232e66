#!/usr/bin/env bash
# Every test: the Release build (unit, ring-vs-reference, fault, multi-process UCX, fuzz, example
# and install tests), a build without CUDA (what a machine with no CUDA toolkit builds) and its
# smoke checks, the bindings' suites (Python, Rust, Julia generator) against the first build, then
# the C++ core suites again under AddressSanitizer+UndefinedBehaviorSanitizer, and under
# ThreadSanitizer. Installs what it needs. SANITIZERS=0 skips the sanitizer builds; BINDINGS=0
# skips the bindings.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
jobs=$(nproc)
# Each stage's heading says when it began, so a CI log shows where the time goes.
stage() { echo "== $* (at $SECONDS s)"; }

# The Python suite's packages (torch and jax: mostly a download) install while the C++ builds.
prepare_log=$(mktemp)
prepare_pid=""
if [ "${BINDINGS:-1}" = 1 ] && [ -x scripts/test-python.sh ]; then
  STRIA_PYTHON_PREPARE_ONLY=1 scripts/test-python.sh >"$prepare_log" 2>&1 &
  prepare_pid=$!
fi
trap '[ -z "$prepare_pid" ] || kill "$prepare_pid" 2>/dev/null || true; rm -f "$prepare_log"' EXIT

stage "Release build and tests"
# The CUDA kernels for sm_90a here (the static checks of the Hopper kernels read this build's PTX);
# the Python stage's wheel compiles them for sm_80, with warnings as errors too, so each
# architecture is compiled once. Without that stage, both are compiled here.
archs="80;90a"
[ "${BINDINGS:-1}" = 1 ] && [ -x scripts/test-python.sh ] && archs="90a"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_WERROR=ON "-DSTRIA_CUDA_ARCHS=$archs" >/dev/null
ninja -C build -j"$jobs"
(cd build && ctest -j"$jobs" --output-on-failure --no-tests=error)

stage "Without CUDA: the build of a machine with no CUDA toolkit (compile and smoke)"
cmake -S . -B build-nocuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_WERROR=ON -DSTRIA_WITH_CUDA=OFF \
  -DSTRIA_WITH_NCCL=OFF -DSTRIA_BUILD_PYTHON=OFF >/dev/null
# Everything a user builds (the library, its modules, the examples, the benchmarks) and the test
# programs of the smoke checks below. The other suites are the same sources with the same flags as
# in the Release build (nothing in them depends on STRIA_WITH_CUDA), which ran them all.
ninja -C build-nocuda -j"$jobs" src/all examples/all bench/all test_errors test_ring test_ucx_ring stria-ucx-rank
# The examples and the install consumers; every bad call and configuration, including asking for
# a CUDA backend that was not built; the ring on every layout in one process and over UCX.
(cd build-nocuda && ctest -j"$jobs" --output-on-failure --no-tests=error \
  -R '^(example_|Layouts/(RingVsReference|UcxRing)\.|UcxRing\.)')
build-nocuda/tests/test_errors --gtest_brief=1

stage "Configure with other optional modules off (generate step only)"
for opts in "-DSTRIA_WITH_CUDA=OFF" "-DSTRIA_WITH_CUDA=OFF -DSTRIA_WITH_NCCL=OFF -DSTRIA_WITH_UCX=OFF" \
  "-DSTRIA_WITH_NCCL=OFF" "-DSTRIA_CUDA_ARCHS=86;90a"; do
  dir=$(mktemp -d)
  # shellcheck disable=SC2086
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $opts >"$dir.log" 2>&1 ||
    { cat "$dir.log"; echo "configure failed with $opts"; exit 1; }
  rm -rf "$dir" "$dir.log"
done
# An architecture the kernels are not built for (Hopper's families need 90a, not 90) is refused.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  dir=$(mktemp -d)
  if cmake -S . -B "$dir" -G Ninja -DSTRIA_CUDA_ARCHS=90 >"$dir.log" 2>&1 ||
    ! grep -q "STRIA_CUDA_ARCHS: '90' is not one of" "$dir.log"; then
    cat "$dir.log"
    echo "STRIA_CUDA_ARCHS=90 was not refused"
    exit 1
  fi
  rm -rf "$dir" "$dir.log"
fi

if [ "${BINDINGS:-1}" = 1 ]; then
  if [ -n "$prepare_pid" ]; then
    stage "python environment (installed in the background)"
    status=0
    wait "$prepare_pid" || status=$?
    prepare_pid=""
    cat "$prepare_log"
    [ "$status" = 0 ] || { echo "preparing the Python environment failed ($status)"; exit 1; }
  fi
  for lang in python rust julia; do
    [ -x "scripts/test-$lang.sh" ] || continue
    stage "$lang bindings"
    STRIA_BUILD_DIR=build STRIA_JULIA_BUILD_DIR=build "scripts/test-$lang.sh"
  done
fi

if [ "${SANITIZERS:-1}" = 1 ]; then
  # UCX's memory hooks (libucm patches malloc and mmap when it is loaded) do not mix with the
  # sanitizers' own interceptors; stria needs neither for host memory.
  export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no UCX_WARN_UNUSED_ENV_VARS=n
  # The sanitizers run the C++ core suites: the engine, the ring and its plans, the CPU kernels,
  # the transports (in-process, UCX processes, NCCL on its host model), faults, serving, the ABI's
  # bad calls, and the warp emulator's own suites (with a cross-section of the emulated kernels
  # under ASan). Left out:
  # - the CUDA module on the runtime model and the GPU suites on it (STRIA_BUILD_CUDA_MODEL_SUITES):
  #   every case there is mostly emulated kernel arithmetic, about half of both stages' time;
  #   the Release build runs them all;
  # - the GPU suites that need a real GPU (STRIA_BUILD_GPU_TESTS; here they would only skip), and
  #   the real CUDA module (nvcc, about half of a build's compile time: it could only fail to find
  #   a GPU here);
  # - the source formatting check, which runs no code of ours.
  # Line tables only (-g1): the reports still name files and lines, and the builds compile about
  # a fifth faster than with full debug information.
  sanitized_build() {  # directory, optimisation level, sanitizers
    cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O$2 -g1 -DNDEBUG" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O$2 -g1 -DNDEBUG" -DSTRIA_SANITIZE="$3" -DSTRIA_WERROR=ON \
      -DSTRIA_BUILD_CUDA_MODULE=OFF -DSTRIA_BUILD_EXAMPLES=OFF -DSTRIA_BUILD_BENCHMARKS=OFF \
      -DSTRIA_BUILD_GPU_TESTS=OFF -DSTRIA_BUILD_CUDA_MODEL_SUITES=OFF >/dev/null
    ninja -C "$1" -j"$jobs"
  }
  stage "AddressSanitizer + UndefinedBehaviorSanitizer"
  # At -O1, the level ASan's documentation suggests: the build compiled in about half the time of
  # -O2 (when it built the runtime model's emulated kernels, which dominated it), the suites run about a
  # sixth slower, and scopes stay exact (a stack use after scope that -O2 hid was found so). The
  # emulated kernels' suite takes a cross-section there (tests/cuda_emu/CMakeLists.txt).
  sanitized_build build-asan 1 "address;undefined"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest -j"$jobs" --output-on-failure --no-tests=error -E '^clang_format$')

  stage "ThreadSanitizer (the core suites: the ring's ranks, the transports and the pool are threads)"
  sanitized_build build-tsan 2 thread
  # Not under TSan as well, where what TSan judges (the ring's rank threads, the pool, the
  # transports and their synchronisation) is the same as in cases that run, and only the
  # arithmetic differs; ASan and the Release build run them all:
  # - the CPU ring's window and softcap/sinks sweeps: the ring's threads, its skipped steps and its
  #   transfers run in the Layouts, Shapes and Documents sweeps;
  # - the 16-bit twins of the longest document rings (the float32 ones run), the three longest
  #   ring shapes, and the longest UCX rings of processes (four ranks without a mask, whose causal
  #   twins run, and a plan's ring over 400 tokens, whose shorter plans run).
  local_only='^(Windows/RingVsReference|Ring/SoftcapSinks)\.'
  twins='^Documents/RingVsReference\..*_b?f16_B2L200H4x2D32_docs7( |$)'
  long='^Shapes/RingVsReference\..*/(N2_striped_causal_bf16_B1L300H4x2D128|N2_zigzag_causal_bf16_B1L300H4x2D72|N3_contiguous_full_bf16_B1L260H2x1D64)( |$)'
  ucx='^Layouts/UcxRing\.MatchesReference/(N4_[a-z]+_full_env|N3_striped_causal_env_plan12_L400)( |$)'
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest -j"$jobs" --output-on-failure \
    --no-tests=error -E "^clang_format\$|$local_only|$twins|$long|$ucx")
fi
stage "All passed"
