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
#       step's kernels are short and the host's gaps between steps show.
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
python3 - "$out" "$gpus" "${sizes[@]}" <<'PY'
import collections, statistics, sys
out, n, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def walls(files):
    """Median wall per (layout, pass): from the last rank's entry to the last rank's exit."""
    calls = collections.defaultdict(lambda: collections.defaultdict(dict))
    for path in files:
        for line in open(path):
            f = line.split()
            if not f or f[0] != "CALL":
                continue
            calls[(f[1], f[2])][int(f[3])][int(f[4])] = (float(f[5]), float(f[6]))
    return {key: statistics.median(max(e for _, e in d.values()) - max(s for s, _ in d.values())
                                   for d in reps.values()) for key, reps in calls.items()}

print("| tokens per rank | layout | pass | NCCL ring ms | in-process ring ms | NCCL / in-process |")
print("|---|---|---|---|---|---|")
for L in sizes:
    nccl = walls([f"{out}/ring{L}.{r}" for r in range(n)])
    local = walls([f"{out}/gpus{L}.0"])
    for key, ms in nccl.items():
        other = local.get(key)
        ratio = f"{ms / other:.3f}" if other else "-"
        other_ms = f"{other * 1e3:.2f}" if other else "-"
        print(f"| {L} | {key[0]} | {key[1]} | {ms * 1e3:.2f} | {other_ms} | {ratio} |")
PY

echo
echo "## Causal ring over NCCL, $gpus GPUs, H=$H, D=$D, bf16 (median of 5 calls, ms): the ring's order kept"
echo "## on the device (default) against the host's (STRIA_RING_ORDER=host)"
order_sizes=(1024 2048 4096 "${sizes[@]}")
for L in "${order_sizes[@]}"; do
  job_env=()
  job "device$L" "$gpus" ring "$L" $H $D 5
  job_env=(STRIA_RING_ORDER=host)
  job "host$L" "$gpus" ring "$L" $H $D 5
done
job_env=()
python3 - "$out" "$gpus" "${order_sizes[@]}" <<'PY'
import collections, statistics, sys
out, n, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def walls(files):
    calls = collections.defaultdict(lambda: collections.defaultdict(dict))
    for path in files:
        for line in open(path):
            f = line.split()
            if not f or f[0] != "CALL":
                continue
            calls[(f[1], f[2])][int(f[3])][int(f[4])] = (float(f[5]), float(f[6]))
    return {key: statistics.median(max(e for _, e in d.values()) - max(s for s, _ in d.values())
                                   for d in reps.values()) for key, reps in calls.items()}

print("| tokens per rank | layout | pass | device order ms | host order ms | device / host |")
print("|---|---|---|---|---|---|")
for L in dict.fromkeys(sizes):
    device = walls([f"{out}/device{L}.{r}" for r in range(n)])
    host = walls([f"{out}/host{L}.{r}" for r in range(n)])
    for key, ms in device.items():
        other = host.get(key)
        ratio = f"{ms / other:.3f}" if other else "-"
        other_ms = f"{other * 1e3:.2f}" if other else "-"
        print(f"| {L} | {key[0]} | {key[1]} | {ms * 1e3:.2f} | {other_ms} | {ratio} |")
PY
rm -rf "$out"
