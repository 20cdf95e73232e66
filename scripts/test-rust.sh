#!/usr/bin/env bash
# The Rust bindings' tests: builds libstria if needed, then `cargo test` over bindings/rust
# (stria-sys layout tests, the safe crate's integration tests and every doctest), rustdoc, and
# the Rust ring demo at small sizes. Warnings are errors. Installs what it needs on Debian 12
# (apt-get, only what is missing); crates come offline from Debian's vendored registry
# (bindings/rust/.cargo/config.toml).
#
#   STRIA_BUILD_DIR   CMake build directory holding libstria (default build-rust; e.g. build)
#   CARGO_BUILD_JOBS  parallel rustc jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/dlpack/dlpack.h ] || need+=(libdlpack-dev)
command -v cargo >/dev/null || need+=(cargo) # Debian 12: cargo 0.66, rustc 1.63
# bindgen (and its dependencies), half and pkg-config as source crates, and libclang for bindgen.
for pkg in librust-bindgen-dev librust-half-dev librust-pkg-config-dev libclang-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

build=${STRIA_BUILD_DIR:-build-rust}
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "== configuring libstria in $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_BUILD_TESTS=OFF \
    -DSTRIA_BUILD_EXAMPLES=OFF -DSTRIA_BUILD_BENCHMARKS=OFF >/dev/null
fi
echo "== building libstria ($build)"
cmake --build "$build" --target stria -j "${CARGO_BUILD_JOBS:-2}" >/dev/null

# stria-sys links this build (see its build.rs); the tests load it from there.
export STRIA_LIB_DIR="$build/src" STRIA_INCLUDE_DIR="$PWD/capi/include"
export LD_LIBRARY_PATH="$STRIA_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" RUSTFLAGS="${RUSTFLAGS:--D warnings}"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:--D warnings}"

cd bindings/rust
echo "== cargo test ($(cargo --version)): stria-sys layout tests, integration tests, doctests"
cargo test --workspace
echo "== rustdoc (broken links are errors)"
cargo doc --workspace --no-deps --quiet
# The dev profile (optimised, see Cargo.toml) reuses what cargo test built.
echo "== Rust ring demo"
cargo run --quiet --example ring_demo -- --world 3 --seq 384 --dtype f32
cargo run --quiet --example ring_demo -- --world 4 --seq 1024 --dtype bf16 --samples 8
