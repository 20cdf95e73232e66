#!/usr/bin/env bash
# The Julia binding's checks. No Julia toolchain is needed (none is installed on CI); they run in
# Python and C:
#   (a) LibStria.jl and layout_table.json are what generate.py makes from stria.h today;
#   (b) every exported stria_* symbol of libstria has a wrapper, and every wrapper a symbol;
#   (c) every struct size, alignment and field offset, alias, constant and ccall signature that
#       LibStria.jl assumes matches the C compiler's (a C program compiled against stria.h);
#   (d) unit tests of the generator and checkers (a synthetic header; wrong entries caught) and
#       the column-major convention of Stria.jl exercised on libstria through ctypes;
#   (e) a static check of the hand-written Julia (it parses; LibStria names and arities exist).
# Where a `julia` is on PATH, the Julia test suite and the example run too.
#
# Installs what it needs (apt only if missing; Python packages into .venv-julia), builds
# libstria into STRIA_JULIA_BUILD_DIR (default build-julia; point it at an existing build/).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${STRIA_JULIA_BUILD_DIR:-build-julia}
venv=.venv-julia
python=/usr/bin/python3 # Debian's: python3-clang-14 installs clang.cindex for it

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v nm >/dev/null || need+=(binutils)
[ -f /usr/include/dlpack/dlpack.h ] || need+=(libdlpack-dev)
[ -x "$python" ] || need+=(python3)
"$python" -c 'import clang.cindex' 2>/dev/null || need+=(python3-clang-14)
"$python" -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The venv sees the system packages (clang.cindex) and adds a Julia parser and numpy.
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python" -c 'import tree_sitter, tree_sitter_julia, numpy' 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check tree-sitter==0.23.2 tree-sitter-julia==0.23.1 numpy==2.1.3
fi
py="$venv/bin/python"

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRIA_BUILD_TESTS=OFF \
    -DSTRIA_BUILD_EXAMPLES=OFF -DSTRIA_BUILD_BENCHMARKS=OFF >/dev/null
fi
ninja -C "$build_dir" -j"$(nproc)" stria >/dev/null
lib=$(find "$build_dir" -name 'libstria.so.0' | head -n 1)
[ -n "$lib" ] || { echo "test-julia: no libstria.so.0 under $build_dir" >&2; exit 1; }
lib=$(realpath "$lib")

passed=0
failed=0
step() { # step NAME COMMAND...: runs one check, counts it, goes on after a failure
  local name=$1
  shift
  echo "== julia: $name"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "test-julia: FAILED: $name" >&2
  fi
}

up_to_date() {
  local tmp status=0
  tmp=$(mktemp -d)
  "$py" bindings/julia/generate.py --out "$tmp/LibStria.jl" --table "$tmp/layout_table.json"
  diff -u bindings/julia/Stria.jl/src/LibStria.jl "$tmp/LibStria.jl" || status=1
  diff -u bindings/julia/layout_table.json "$tmp/layout_table.json" || status=1
  rm -rf "$tmp"
  if [ $status != 0 ]; then
    echo "LibStria.jl is out of date with stria.h: run /usr/bin/python3 bindings/julia/generate.py" >&2
    return 1
  fi
  echo "LibStria.jl and layout_table.json are up to date"
}

step "(a) generated files up to date with the header" up_to_date
step "(b) exported symbols <-> wrappers" "$py" bindings/julia/check_symbols.py "$lib"
step "(c) layouts, constants and signatures against the C compiler" "$py" bindings/julia/check_layout.py
step "(d) generator, checker and convention tests" env STRIA_LIB_PATH="$lib" \
  timeout 300 "$py" -m unittest discover -s bindings/julia/tests -v
step "(e) static check of the hand-written Julia" "$py" bindings/julia/check_julia.py

if command -v julia >/dev/null; then
  export STRIA_LIB="$lib"
  step "Julia test suite" timeout 900 julia -t 4 --project=bindings/julia/Stria.jl \
    bindings/julia/Stria.jl/test/runtests.jl
  step "Julia example ring_demo.jl" timeout 300 julia -t 4 --project=bindings/julia/Stria.jl \
    bindings/julia/Stria.jl/examples/ring_demo.jl
else
  echo "== julia: no julia on PATH: Stria.jl/test/runtests.jl and examples/ring_demo.jl not run"
fi

echo "julia: $passed passed, $failed failed"
[ "$failed" = 0 ]
