#!/usr/bin/env bash
# Gathers, into .device-deps/ (git-ignored), what a build on the lent GPU machine needs and its
# image lacks: the DLPack header and GoogleTest's sources (built there in-tree). Run it here, then
# name .device-deps in the device call's `carry`; bench/gpu_run.sh picks it up.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f /usr/include/dlpack/dlpack.h ] && [ -f /usr/src/googletest/CMakeLists.txt ] || scripts/install-deps.sh --tests
rm -rf .device-deps
mkdir -p .device-deps/include
cp -r /usr/include/dlpack .device-deps/include/
cp -r /usr/src/googletest .device-deps/googletest
du -sh .device-deps
