#!/usr/bin/env bash
# The same ring under Open MPI's mpirun: the ranks read OMPI_COMM_WORLD_RANK/SIZE, and mpirun
# forwards STRIA_ROOT (-x) to every rank. Across hosts, add --host a,b and make STRIA_ROOT the
# first host's address. Usage: run_mpirun.sh BINARY [N] [args...]
set -euo pipefail
bin=$1
n=${2:-2}
shift $(($# < 2 ? $# : 2))
port=$((20000 + RANDOM % 30000))
as_root=()
[ "$(id -u)" != 0 ] || as_root=(--allow-run-as-root)
STRIA_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
exec mpirun "${as_root[@]}" --oversubscribe -n "$n" -x STRIA_ROOT=127.0.0.1:$port -x STRIA_SECRET="$STRIA_SECRET" \
  "$bin" "$@"
