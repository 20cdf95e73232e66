#!/usr/bin/env bash
# A ring of WORLD_SIZE processes on this host, started by a plain shell loop with torchrun's
# variable names. Usage: run_shell_loop.sh BINARY [WORLD_SIZE] [PORT (0: pick one)] [args...]
set -euo pipefail
bin=$1
world=${2:-4}
port=${3:-29500}
shift $(($# < 3 ? $# : 3))
[ "$port" != 0 ] || port=$((20000 + RANDOM % 30000))
export WORLD_SIZE=$world STRIA_ROOT=127.0.0.1:$port
STRIA_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export STRIA_SECRET
pids=()
for ((r = 0; r < world; r++)); do
  RANK=$r "$bin" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
