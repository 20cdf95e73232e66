#!/usr/bin/env bash
# Gathers, into .device-deps/ (git-ignored), what a build on a bare GPU machine needs and its
# image lacks: the DLPack header, GoogleTest's sources (built there in-tree), and SWIG (its
# binary and library, for the Python bindings' GPU tests). Run it where they are installed, then
# copy .device-deps with the checkout; bench/gpu_run.sh picks it up.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests --swig  # skips what is there
rm -rf .device-deps
mkdir -p .device-deps/include
cp -r /usr/include/dlpack .device-deps/include/
cp -r /usr/src/googletest .device-deps/googletest
if command -v swig >/dev/null; then
  mkdir -p .device-deps/swig/bin
  cp "$(readlink -f "$(command -v swig)")" .device-deps/swig/bin/swig
  cp -r "$(swig -swiglib)" .device-deps/swig/share
  # Its one library beyond the C and C++ runtimes, in case the image lacks it.
  mkdir -p .device-deps/swig/lib
  cp -L "$(ldd "$(command -v swig)" | awk '/libpcre2-8/ {print $3}')" .device-deps/swig/lib/
fi
du -sh .device-deps
