#!/usr/bin/env bash
# Fails, naming the files, where a tracked C, C++ or CUDA source differs from what clang-format
# (the .clang-format at the root) makes of it. ctest runs it as `clang_format` (label lint);
# `scripts/check-format.sh --fix` rewrites the files instead (third_party/'s .clang-format turns it off there).
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$clang_format" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not clang-formatted (scripts/check-format.sh --fix rewrites them):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "${#files[@]} files clang-formatted"
