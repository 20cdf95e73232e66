#!/usr/bin/env bash
# Installs what building and testing stria needs on a fresh Debian machine (idempotent: skips
# what is there). The CPU core needs only a C++17 compiler, CMake, threads and DLPack's header.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/dlpack/dlpack.h ] || need+=(libdlpack-dev)
# The UCX transport module is built where UCX is found; the tests and benchmarks want it.
[ -f /usr/include/ucp/api/ucp.h ] || need+=(libucx-dev)
# --tests: what the test run needs too; --swig: SWIG (scripts/device-deps.sh carries it to the GPU
# machine for the Python bindings there).
tests=0 swig=0
for arg in "$@"; do
  case $arg in
    --tests) tests=1 ;;
    --swig) swig=1 ;;
    *) echo "install-deps.sh: unknown option $arg (use --tests, --swig)" >&2; exit 2 ;;
  esac
done
[ $swig = 0 ] || command -v swig >/dev/null || need+=(swig)
if [ $tests = 1 ]; then
  [ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
  command -v nm >/dev/null || need+=(binutils)
  command -v ucx_perftest >/dev/null || need+=(ucx-utils)     # the UCX benchmark's anchor
  command -v mpirun >/dev/null || need+=(openmpi-bin)          # the mpirun launch example
  command -v clang++-14 >/dev/null || need+=(clang-14)         # the libFuzzer target
  ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
