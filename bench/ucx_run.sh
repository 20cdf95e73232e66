#!/usr/bin/env bash
# The UCX benchmarks of docs/performance.md, side by side in one run: two processes pinned to one
# core each. (1) the causal ring per layout, its wall time against its compute-only latency;
# (2) K/V-block-sized transfers through our transport against ucx_perftest's tag_bw at the same
# message size (the anchor). Usage: bench/ucx_run.sh [build dir] [L tokens per rank...]
set -euo pipefail
build=${1:-build}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4096 8192)
bin=$build/bench/stria-ucx-bench
H=2
D=128
export UCX_WARN_UNUSED_ENV_VARS=n
out=$(mktemp -d)

pair() {  # pair NAME args...: ranks 0 and 1 of a 2-process job on cores 0 and 1
  local name=$1
  shift
  local port=$((20000 + RANDOM % 30000))
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 STRIA_ROOT=127.0.0.1:$port taskset -c $r "$bin" "$@" >"$out/$name.$r" &
  done
  wait
}

for L in "${sizes[@]}"; do pair "ring$L" ring "$L" $H $D 3; done
echo "## Ring over UCX, 2 processes x 1 core, causal, H=$H, D=$D, f32 (median of 3)"
python3 - "$out" "${sizes[@]}" <<'PY'
import sys, collections, statistics, glob
out, sizes = sys.argv[1], sys.argv[2:]
print("| tokens per rank | layout | pass | wall ms | compute-only ring ms (wall clock) | wall / compute | same from CPU time | waits ms |")
print("|---|---|---|---|---|---|---|---|")
for L in sizes:
    rows = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in (0, 1):
        for line in open(f"{out}/ring{L}.{r}"):
            f = line.split()
            if f[0] != "STEP": continue
            layout, p, rep, rank, step = f[1], f[2], int(f[3]), int(f[4]), int(f[5])
            compute, cpu, wait, start, end = (float(x) for x in f[6:11])
            rows[(layout, p)][rep][(rank, step)] = (compute, wait, (start, end), cpu)
    for (layout, p), reps in rows.items():
        walls, models, cpus, waits = [], [], [], []
        for rep, d in reps.items():
            steps = sorted({s for (_, s) in d})
            models.append(sum(max(d[(r, s)][0] for r in (0, 1)) for s in steps))
            cpus.append(sum(max(d[(r, s)][3] for r in (0, 1)) for s in steps))
            walls.append(max(d[(r, 0)][2][1] for r in (0, 1)) - max(d[(r, 0)][2][0] for r in (0, 1)))
            waits.append(max(sum(d[(r, s)][1] for s in steps) for r in (0, 1)))
        w, m, c = statistics.median(walls), statistics.median(models), statistics.median(cpus)
        print(f"| {L} | {layout} | {p} | {w*1e3:.1f} | {m*1e3:.1f} | {w/m:.3f} | {w/c:.3f} | {statistics.median(waits)*1e3:.2f} |")
PY

echo
echo "## K/V-block transfers, rank 0 -> rank 1, one message at a time (GB/s, median of 3 runs)"
echo "| message | stria, peer error handling (default) | ucx_perftest -e | ratio | stria, STRIA_UCX_PEER_ERRORS=0 | ucx_perftest | ratio |"
echo "|---|---|---|---|---|---|---|"
for L in "${sizes[@]}"; do
  bytes=$((L * H * D * 4 * 2))  # K and V of one block, f32
  ours=()
  fast=()
  theirs=()
  theirs_e=()
  for i in 1 2 3; do
    pair "xfer$L.$i" transfer $bytes 40
    ours+=("$(awk '/^TRANSFER/ {print $5}' "$out/xfer$L.$i.1")")
    STRIA_UCX_PEER_ERRORS=0 pair "fast$L.$i" transfer $bytes 40
    fast+=("$(awk '/^TRANSFER/ {print $5}' "$out/fast$L.$i.1")")
    for e in "" "-e"; do  # -e: endpoints with error handling, as stria's default
      port=$((20000 + RANDOM % 30000))
      taskset -c 1 ucx_perftest -p $port $e >/dev/null 2>&1 &
      server=$!
      sleep 0.5
      line=$(taskset -c 0 ucx_perftest 127.0.0.1 -p $port -t tag_bw -s $bytes -n 40 -w 3 $e 2>/dev/null | grep -E "Final:" || true)
      wait $server || true
      # Final: iterations, latency typical/avg/overall (us), bandwidth avg/overall (MB/s), rate...
      bw=$(echo "$line" | awk '{printf "%.3f", $7 * 1048576 / 1e9}')
      if [ -z "$e" ]; then theirs+=("$bw"); else theirs_e+=("$bw"); fi
    done
  done
  python3 - "$bytes" "${ours[*]}" "${theirs_e[*]}" "${fast[*]}" "${theirs[*]}" <<'PY'
import sys, statistics
b = int(sys.argv[1])
o, te, f, t = (statistics.median([float(x) for x in a.split() if x] or [float("nan")]) for a in sys.argv[2:6])
print(f"| {b/2**20:.0f} MiB | {o:.2f} | {te:.2f} | **{o/te:.2f}** | {f:.2f} | {t:.2f} | **{f/t:.2f}** |")
PY
done
rm -rf "$out"
