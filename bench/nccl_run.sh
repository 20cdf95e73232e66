#!/usr/bin/env bash
# The NCCL benchmarks, for a machine with two or more GPUs (not run yet: no GPU machine has been
# available to this project's NCCL work; docs/performance.md gets their numbers once it is).
#   (1) K/V-block-sized transfers GPU 0 -> GPU 1 through stria's NCCL transport (post, wait: as
#       the ring sends them) against plain NCCL ncclSend/ncclRecv at the same size (the anchor);
#   (2) the causal ring per layout on N GPUs, one process each, bf16: wall time per call, beside
#       the same ring in one process without NCCL (a local group on the N GPUs, peer-to-peer
#       copies: stria-nccl-bench ring-gpus), the anchor;
#   (3) the same NCCL ring with its order kept on the device (the default: events between the
#       compute and the transfers, the host a step ahead) against the host's order
#       (STRIA_RING_ORDER=host: the host waits for the compute before every transfer and for
#       every transfer before the kernels that read it), at 1k-4k tokens per rank too, where a
#       step's kernels are short and the host's gaps between steps show;
#   (4) the same comparison on a grid (stria_context_set_grid: the GPUs as one all-to-all group of
#       U = N, heads exchanged within it, which the grid's exchanges order on the device too),
#       where N divides the 16 heads.
# Usage: bench/nccl_run.sh [build dir] [N GPUs (default: all visible)] [L tokens per rank...]
set -euo pipefail
build=${1:-build}
gpus=${2:-$(nvidia-smi -L | wc -l)}
shift 2 || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4096 16384)
bin=$build/bench/stria-nccl-bench
H=16
D=128
out=$(mktemp -d)

job_env=()
job() {  # job NAME WORLD args...: ranks 0..WORLD-1, rank r on GPU r, with the environment job_env adds
  local name=$1 world=$2
  shift 2
  local port=$((20000 + RANDOM % 30000))
  for ((r = 0; r < world; ++r)); do
    env "${job_env[@]}" RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world STRIA_ROOT=127.0.0.1:$port \
      NCCL_ID_FILE=$out/$name.id "$bin" "$@" >"$out/$name.$r" 2>&1 &
  done
  wait
}

echo "## K/V-block transfers, GPU 0 -> GPU 1, one message at a time (GB/s, median of 3 runs)"
echo "| message | stria NCCL transport | plain ncclSend/ncclRecv | ratio |"
echo "|---|---|---|---|"
for L in "${sizes[@]}"; do
  bytes=$((L * H * D * 2 * 2))  # K and V of one block, bf16
  ours=()
  plain=()
  for i in 1 2 3; do
    job "xfer$L.$i" 2 transfer $bytes 50
    ours+=("$(awk '/^TRANSFER/ {print $3}' "$out/xfer$L.$i.1")")
    plain+=("$(awk '/^TRANSFER/ {print $4}' "$out/xfer$L.$i.1")")
  done
  python3 - "$bytes" "${ours[@]}" "${plain[@]}" <<'PY'
import statistics, sys
b = int(sys.argv[1]); v = [float(x) for x in sys.argv[2:]]
o, p = statistics.median(v[:3]), statistics.median(v[3:])
print(f"| {b / 2**20:.1f} MiB | {o:.2f} | {p:.2f} | {o / p:.3f} |")
PY
done

echo
echo "## Causal ring over NCCL, $gpus GPUs, H=$H, D=$D, bf16 (median of 5 calls, ms), and the same ring in"
echo "## one process over the same GPUs without NCCL (local group on devices, peer copies)"
for L in "${sizes[@]}"; do
  job "ring$L" "$gpus" ring "$L" $H $D 5
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=$gpus "$bin" ring-gpus "$L" $H $D 5 >"$out/gpus$L.0" 2>&1
done
python3 "$(dirname "$0")/ring_walls.py" "$out" "NCCL ring ms" "ring{L}.{r}" "$gpus" "in-process ring ms" "gpus{L}.{r}" 1 \
  "${sizes[@]}"

echo
echo "## Causal ring over NCCL, $gpus GPUs, H=$H, D=$D, bf16 (median of 5 calls, ms): the ring's order kept"
echo "## on the device (default) against the host's (STRIA_RING_ORDER=host)"
mapfile -t order_sizes < <(printf '%s\n' 1024 2048 4096 "${sizes[@]}" | awk '!seen[$0]++')
for L in "${order_sizes[@]}"; do
  job_env=()
  job "device$L" "$gpus" ring "$L" $H $D 5
  job_env=(STRIA_RING_ORDER=host)
  job "host$L" "$gpus" ring "$L" $H $D 5
done
job_env=()
python3 "$(dirname "$0")/ring_walls.py" "$out" "device order ms" "device{L}.{r}" "$gpus" "host order ms" "host{L}.{r}" \
  "$gpus" "${order_sizes[@]}"

if ((H % gpus == 0)); then
  echo
  echo "## Causal calls on a grid of one all-to-all group of $gpus GPUs (heads exchanged, no ring), H=$H, D=$D,"
  echo "## bf16 (median of 5 calls, ms): the exchanges' order kept on the device (default) against the host's"
  for L in "${order_sizes[@]}"; do
    job_env=(STRIA_BENCH_GRID=$gpus)
    job "gdevice$L" "$gpus" ring "$L" $H $D 5
    job_env=(STRIA_BENCH_GRID=$gpus STRIA_RING_ORDER=host)
    job "ghost$L" "$gpus" ring "$L" $H $D 5
  done
  job_env=()
  python3 "$(dirname "$0")/ring_walls.py" "$out" "device order ms" "gdevice{L}.{r}" "$gpus" "host order ms" \
    "ghost{L}.{r}" "$gpus" "${order_sizes[@]}"
fi
rm -rf "$out"
