#!/usr/bin/env bash
# The grid's benchmarks of docs/performance.md, side by side in one run on one host over UCX:
# (1) the all-to-all of 2, 3 and 4 processes (every rank sends every other rank one message at
#     once, as a grid's exchange does) against a plain transfer of the same bytes from one process
#     to another (the anchor), as the bytes each rank sends per second;
# (2) one causal attention call (forward, backward) of 2 processes as a ring (U = 1) and as one
#     all-to-all group (U = 2; its heads in two chunks, the engine's default, whose exchanges
#     overlap the other chunk's compute, and in one), with the time the model
#     (bench/hybrid_model.py) predicts for each from this run's own kernel rate and transfer
#     bandwidth.
# Processes are pinned round-robin to the host's cores.
# Usage: bench/grid_run.sh [build dir] [bytes per message] [tokens per rank]
set -euo pipefail
build=${1:-build}
bytes=${2:-4194304}
L=${3:-4096}
H=4
D=128
bin=$build/bench/stria-ucx-bench
cores=$(nproc)
export UCX_WARN_UNUSED_ENV_VARS=n
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

job() {  # job NAME N args...: ranks 0..N-1 of an N-process job
  local name=$1 n=$2
  shift 2
  local port=$((20000 + RANDOM % 30000))
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n STRIA_ROOT=127.0.0.1:$port taskset -c $((r % cores)) "$bin" "$@" >"$out/$name.$r" &
  done
  wait
}
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }

echo "## All-to-all against a plain transfer of the same bytes, UCX on one host ($cores cores; median of 3)"
echo
echo "Each rank sends each other rank $bytes bytes at once. Per rank: the bytes one rank sends per second"
echo "(the slowest rank's); all ranks: their sum, the bytes the host moves per second, to set beside one"
echo "plain transfer (rank 0 to rank 1) of as many bytes as each rank sends. Default: UCX with peer error"
echo "handling (its TCP transport on loopback); fast: STRIA_UCX_PEER_ERRORS=0 (shared memory)."
echo
echo "| transports | processes | bytes each rank sends | all-to-all GB/s per rank | all ranks GB/s | plain transfer GB/s | per rank / transfer | all ranks / transfer |"
echo "|---|---|---|---|---|---|---|---|"
for transports in default fast; do
  for n in 2 3 4; do
    a2a=() xfer=()
    for i in 1 2 3; do
      if [ "$transports" = fast ]; then export STRIA_UCX_PEER_ERRORS=0; else unset STRIA_UCX_PEER_ERRORS; fi
      job "a2a$n.$i" "$n" alltoall "$bytes" 20
      # The slowest rank's rate: the exchange ends when its last message lands.
      a2a+=("$(cat "$out"/a2a$n.$i.* | awk '/^ALLTOALL/ {print $7}' | sort -g | head -1)")
      job "xfer$n.$i" 2 transfer $((bytes * (n - 1))) 20
      xfer+=("$(awk '/^TRANSFER/ {print $5}' "$out/xfer$n.$i.1")")
    done
    a=$(echo "${a2a[@]}" | median)
    x=$(echo "${xfer[@]}" | median)
    awk -v t="$transports" -v n="$n" -v b=$((bytes * (n - 1))) -v a="$a" -v x="$x" \
      'BEGIN {printf "| %s | %d | %d | %.3f | %.3f | %.3f | %.2f | %.2f |\n", t, n, b, a, n * a, x, a / x, n * a / x}'
  done
done
unset STRIA_UCX_PEER_ERRORS

echo
echo "## One causal call of 2 processes, ring (U = 1) against one all-to-all group (U = 2): L = $L tokens per rank, H = $H, D = $D, f32 (median of 3)"
echo
for u in 1 2; do job "ring$u" 2 ring "$L" $H $D 3 "$u"; done
(export STRIA_GRID_CHUNKS=1 && job "ring2one" 2 ring "$L" $H $D 3 2)
job "bw" 2 transfer $((L * H * D * 4 * 2)) 20
python3 - "$out" "$L" "$H" "$D" "$(dirname "$0")/hybrid_model.py" <<'PY'
import json, statistics, subprocess, sys, collections
out, L, H, D, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
bw = float(next(l.split()[4] for l in open(f"{out}/bw.1") if l.startswith("TRANSFER")))

def calls(u):
    """Per (layout, pass): the median wall time of the call (last rank in to last rank out) and of
    the slowest rank's compute summed over its ring steps."""
    rows = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in (0, 1):
        for line in open(f"{out}/ring{u}.{r}"):
            f = line.split()
            if f[0] != "STEP":
                continue
            layout, p, rep, rank, step = f[1], f[2], int(f[3]), int(f[4]), int(f[5])
            rows[(layout, p)][rep][(rank, step)] = (float(f[6]), float(f[9]), float(f[10]))
    result = {}
    for key, reps in rows.items():
        walls, computes = [], []
        for d in reps.values():
            walls.append(max(v[2] for v in d.values()) - max(v[1] for (r, s), v in d.items() if s == 0))
            steps = sorted({s for (_, s) in d})
            computes.append(sum(max(d[(r, s)][0] for r in (0, 1)) for s in steps))
        result[key] = (statistics.median(walls), statistics.median(computes))
    return result

ring, grid, one_chunk = calls(1), calls(2), calls("2one")
model_path = model
# The kernels' rate on this machine: the ring's compute of the striped layout, whose steps carry
# equal work (causal: half of the L x L block pairs... counted as the model counts them).
flops = {"fwd": 4.0 * L * L * H * D * 2 / 2, "bwd": 2.5 * 4.0 * L * L * H * D * 2 / 2}
rate = {p: flops[p] / ring[("striped", p)][1] / 1e9 for p in ("fwd", "bwd")}
print(f"kernel rate from the ring's compute (striped): forward {rate['fwd']:.1f}, backward {rate['bwd']:.1f} GFLOP/s; "
      f"transfer {bw:.2f} GB/s")
print()
print("| layout | pass | U = 1 (ring) ms | U = 2 (all-to-all) ms | U = 2 / U = 1 | U = 2, one chunk ms | two chunks / one | model U = 1 ms | model U = 2 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for (layout, p), (wall1, _) in sorted(ring.items()):
    wall2, wall_one = grid[(layout, p)][0], one_chunk[(layout, p)][0]
    predicted = {}
    for u in (1, 2):
        args = [sys.executable, model_path, "--nodes", "1", "--ranks-per-node", "2", "--u", str(u), "--tokens-per-rank",
                str(L), "--hq", str(H), "--hkv", str(H), "--dim", str(D), "--dtype-bytes", "4", "--rate-unit",
                "gflops", "--fwd-rates", f"{rate['fwd']:.3f}", "--bwd-rates", f"{rate['bwd']:.3f}", "--intra-gbs",
                f"{bw:.3f}", "--direction", "forward" if p == "fwd" else "backward", "--overlap", "2", "--json"]
        answer = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        row = next(c for c in answer["rows"] if c["u"] == u)
        predicted[u] = row.get("total_overlap_s", row["total_s"])
    modelled = f"{predicted[1]*1e3:.1f} | {predicted[2]*1e3:.1f}" if layout == "striped" else "- | -"
    print(f"| {layout} | {p} | {wall1*1e3:.1f} | {wall2*1e3:.1f} | {wall2/wall1:.2f} | {wall_one*1e3:.1f} | "
          f"{wall2/wall_one:.2f} | {modelled} |")
PY
