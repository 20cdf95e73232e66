#!/bin/sh
# install_consumer.sh: proves that an installed stria works the way users consume it.
#
#   install_consumer.sh --build-dir DIR --libdir LIBDIR --source-dir SRC [--config CFG] [--soname NAME]
#
# It installs the (already built) build tree into a temporary prefix, then
#   1. compiles examples/c/pkgconfig_forward.c with `cc $(pkg-config --cflags --libs stria)` and
#      runs it with LD_LIBRARY_PATH pointing at the installed lib dir;
#   2. configures and builds tests/cmake_consumer (find_package(Stria), Stria::stria) against
#      CMAKE_PREFIX_PATH=<prefix> and runs the result;
#   3. checks that the installed library exports only stria_* symbols, carries the expected
#      SONAME, needs none of the optional GPU/network libraries, and has no RPATH into the build.
# LIBDIR is CMake's CMAKE_INSTALL_LIBDIR (relative to the prefix: lib, lib64 or lib/<multiarch>).
#
# Environment: CC (default cc), CFLAGS (extra flags for both consumers, e.g. sanitizers), CMAKE
# (default cmake), STRIA_CONSUMER_GENERATOR and STRIA_CONSUMER_MAKE_PROGRAM (the CMake generator
# for the consumer project; default: CMake's own default).
#
# `cmake --install` copies what the build tree holds; it does not build. Run this after a full
# build. Needs pkg-config, binutils (nm, readelf or objdump) and a C compiler. Exits non-zero on
# any failure and always removes its temporary directory.
set -eu

me=install_consumer
fail() {
  echo "$me: FAILED: $*" >&2
  exit 1
}
usage() {
  echo "usage: $me --build-dir DIR --libdir LIBDIR --source-dir SRC [--config CFG] [--soname NAME]" >&2
  exit 2
}

build_dir='' libdir_rel='' source_dir='' config='' soname=libstria.so.0
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --build-dir) build_dir=$2 ;;
    --libdir) libdir_rel=$2 ;;
    --source-dir) source_dir=$2 ;;
    --config) config=$2 ;;
    --soname) soname=$2 ;;
    *) usage ;;
  esac
  shift 2
done
if [ -z "$build_dir" ] || [ -z "$libdir_rel" ] || [ -z "$source_dir" ]; then usage; fi
case "$libdir_rel" in
  # An absolute CMAKE_INSTALL_LIBDIR ignores --prefix, so the install would not land in our
  # temporary prefix (and could overwrite a system copy).
  /*) fail "CMAKE_INSTALL_LIBDIR is absolute ($libdir_rel): configure with a relative one to run this test" ;;
esac

CC=${CC:-cc}
CFLAGS=${CFLAGS:-}
CMAKE=${CMAKE:-cmake}
example=$source_dir/examples/c/pkgconfig_forward.c
consumer_src=$source_dir/tests/cmake_consumer
[ -f "$example" ] || fail "$example not found"
[ -f "$consumer_src/CMakeLists.txt" ] || fail "$consumer_src/CMakeLists.txt not found"

# Missing tools are named up front: a fresh Debian machine may lack pkg-config (apt-get install
# pkg-config), and a failure deep inside a compile line would not say so.
command -v pkg-config >/dev/null 2>&1 ||
  fail "pkg-config not found: this test consumes the installed stria.pc; install it (Debian: apt-get install pkg-config)"
command -v "$CC" >/dev/null 2>&1 || fail "C compiler '$CC' not found"
command -v "$CMAKE" >/dev/null 2>&1 || fail "cmake '$CMAKE' not found"
command -v nm >/dev/null 2>&1 || fail "nm not found (Debian: apt-get install binutils)"
if command -v readelf >/dev/null 2>&1; then
  dynamic() { readelf -d "$1"; }
elif command -v objdump >/dev/null 2>&1; then
  dynamic() { objdump -p "$1"; }
else
  fail "neither readelf nor objdump found (Debian: apt-get install binutils)"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/stria-install.XXXXXX") || fail "mktemp failed"
# EXIT covers set -e and fail(); the signal traps turn an interruption into an exit so that the
# EXIT trap still cleans up.
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

prefix=$tmp/prefix
libdir=$prefix/$libdir_rel

echo "$me: installing $build_dir into $prefix"
if [ -n "$config" ]; then
  "$CMAKE" --install "$build_dir" --prefix "$prefix" --config "$config" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install failed (is the build complete?)"; }
else
  "$CMAKE" --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install failed (is the build complete?)"; }
fi
lib=$libdir/$soname
[ -f "$lib" ] || fail "$lib was not installed (is CMAKE_INSTALL_LIBDIR $libdir_rel right?)"
[ -e "$libdir/libstria.so" ] || fail "the development link $libdir/libstria.so was not installed"
[ -f "$libdir/pkgconfig/stria.pc" ] || fail "$libdir/pkgconfig/stria.pc was not installed"

# --- 1. pkg-config + cc -------------------------------------------------------------------------
echo "$me: [pkg-config] compiling $example"
pc_flags=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs stria) || fail "pkg-config --cflags --libs stria failed"
echo "$me: [pkg-config] flags: $pc_flags"
# stria.pc must describe where it was installed, not where the build was configured to go: paths
# pointing elsewhere would build against another copy (or none) and prove nothing. Compared after
# resolving, so that a relocatable .pc (prefix=${pcfiledir}/../..) passes too.
resolve() { (cd "$1" 2>/dev/null && pwd -P) || echo "$1 (missing)"; }
pc_libdir=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --variable=libdir stria)
pc_includedir=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --variable=includedir stria)
hint="stria.pc hard-codes the configure-time CMAKE_INSTALL_PREFIX instead of following 'cmake --install --prefix'"
[ "$(resolve "$pc_libdir")" = "$(resolve "$libdir")" ] ||
  fail "stria.pc's libdir is '$pc_libdir', not the installed $libdir ($hint)"
case "$(resolve "$pc_includedir")" in
  "$(resolve "$prefix")"/*) ;;
  *) fail "stria.pc's includedir '$pc_includedir' is outside the install prefix $prefix ($hint)" ;;
esac
[ -f "$pc_includedir/stria/stria.h" ] || fail "stria.pc's includedir '$pc_includedir' has no stria/stria.h"
# -std=c99 -pedantic: the installed header promises plain C99. $CFLAGS and $pc_flags are split into
# words on purpose (that is how a shell user writes $(pkg-config ...)).
# shellcheck disable=SC2086
"$CC" $CFLAGS -std=c99 -pedantic -Wall -Wextra -Werror -o "$tmp/pkgconfig_forward" "$example" $pc_flags -lpthread -lm ||
  fail "compiling $example against the installed stria with pkg-config's flags"
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
ldd "$tmp/pkgconfig_forward" | grep -F "$libdir/$soname" >/dev/null ||
  fail "the pkg-config build does not resolve $soname from $libdir: $(ldd "$tmp/pkgconfig_forward" | grep stria)"
"$tmp/pkgconfig_forward" || fail "the pkg-config build of pkgconfig_forward failed (exit $?)"

# --- 2. find_package(Stria) ---------------------------------------------------------------------
echo "$me: [cmake] configuring $consumer_src against $prefix"
set -- -S "$consumer_src" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_C_FLAGS="$CFLAGS" -DSTRIA_EXAMPLE_SOURCE="$example"
if [ -n "${STRIA_CONSUMER_GENERATOR:-}" ]; then
  set -- "$@" -G "$STRIA_CONSUMER_GENERATOR"
  if [ -n "${STRIA_CONSUMER_MAKE_PROGRAM:-}" ]; then set -- "$@" -DCMAKE_MAKE_PROGRAM="$STRIA_CONSUMER_MAKE_PROGRAM"; fi
fi
"$CMAKE" "$@" >"$tmp/consumer-configure.log" 2>&1 ||
  { cat "$tmp/consumer-configure.log" >&2; fail "configuring the find_package(Stria) consumer"; }
stria_dir=$(sed -n 's/^Stria_DIR:PATH=//p' "$tmp/consumer-build/CMakeCache.txt")
case "$stria_dir" in
  "$prefix"/*) ;;
  *) fail "find_package(Stria) found '$stria_dir', not the copy installed in $prefix" ;;
esac
"$CMAKE" --build "$tmp/consumer-build" >"$tmp/consumer-build.log" 2>&1 ||
  { cat "$tmp/consumer-build.log" >&2; fail "building the find_package(Stria) consumer"; }
# Run it without our LD_LIBRARY_PATH: a CMake consumer finds the library through the RPATH CMake
# gives it from the imported target's location.
consumer=$tmp/consumer-build/consumer
unset LD_LIBRARY_PATH
ldd "$consumer" | grep -F "$libdir/$soname" >/dev/null ||
  fail "the CMake consumer does not resolve $soname from $libdir: $(ldd "$consumer" | grep stria)"
"$consumer" || fail "the find_package(Stria) build of pkgconfig_forward failed (exit $?)"

# --- 3. the installed binary --------------------------------------------------------------------
echo "$me: [abi] checking $lib"
# Everything else must stay internal: a framework loads us next to its own copies of libstdc++
# helpers, and an exported engine symbol would interpose on (or be interposed by) theirs.
# Type A entries are the version script's version nodes (e.g. STRIA_0), not symbols.
symbols=$(nm -D --defined-only "$lib" | awk 'NF >= 3 && $2 != "A" { sub(/@.*/, "", $3); print $3 }')
[ -n "$symbols" ] || fail "nm found no exported symbols in $lib"
echo "$symbols" | grep -qx 'stria_attention_forward' || fail "$lib does not export stria_attention_forward"
extra=$(echo "$symbols" | grep -v '^stria_' || true)
[ -z "$extra" ] || fail "$lib exports symbols outside stria_*: $(echo "$extra" | head -20 | tr '\n' ' ')"
echo "$me: [abi] $(echo "$symbols" | wc -l | tr -d ' ') exported symbols, all stria_*"

got_soname=$(dynamic "$lib" | sed -n -e 's/.*Library soname: \[\(.*\)\].*/\1/p' -e 's/^ *SONAME  *//p')
[ "$got_soname" = "$soname" ] || fail "$lib has SONAME '$got_soname', expected '$soname'"
echo "$me: [abi] SONAME $got_soname"

# The core must load on a machine without CUDA, NCCL or UCX (they are dlopened modules), and an
# installed library must not look for its dependencies in the build tree.
needed=$(dynamic "$lib" | sed -n -e 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' -e 's/^ *NEEDED  *//p')
bad=$(echo "$needed" | grep -E '^lib(cuda|cudart|nccl|ucp|ucs|uct)' || true)
[ -z "$bad" ] || fail "$lib links optional libraries directly: $bad"
if dynamic "$lib" | grep -E 'RPATH|RUNPATH' | grep -F "$build_dir" >/dev/null; then
  fail "$lib keeps an RPATH into the build tree $build_dir"
fi
echo "$me: [abi] needs: $(echo "$needed" | tr '\n' ' ')"

echo "$me: OK"
