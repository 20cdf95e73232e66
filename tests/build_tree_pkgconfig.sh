#!/bin/sh
# The build tree's stria.pc, as a developer uses it before installing: compile
# examples/c/minimal_forward.c with `pkg-config --cflags --libs stria` from PKG_CONFIG_PATH=<build
# dir> and run it. Usage: build_tree_pkgconfig.sh BUILD_DIR SOURCE_DIR (CC and CFLAGS from the
# environment).
set -eu
build_dir=$1
source_dir=$2
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found (Debian: apt-get install pkg-config)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=$(PKG_CONFIG_PATH=$build_dir pkg-config --cflags --libs stria)
libdir=$(PKG_CONFIG_PATH=$build_dir pkg-config --variable=libdir stria)
echo "pkg-config --cflags --libs stria: $flags"
# shellcheck disable=SC2086
"${CC:-cc}" ${CFLAGS:-} "$source_dir/examples/c/minimal_forward.c" $flags -Wl,-rpath,"$libdir" -o "$out/minimal_forward"
"$out/minimal_forward"
