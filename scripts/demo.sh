#!/usr/bin/env bash
# The main job: a ring of CPU ranks in one process (default 8) runs a causal forward and backward
# in each layout, checked against float64. Arguments go to the demo (see --help there), e.g.
#   scripts/demo.sh --world 4 --seq 8192 --dtype bf16
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j"$(nproc)" stria-ring-demo
exec build/examples/ring_demo/stria-ring-demo "$@"
