"""Turns bench/run.sh's key=value lines into the markdown tables of docs/performance.md."""
import shlex
import sys


def parse(line):
    kind, *rest = shlex.split(line)
    return kind, dict(kv.split("=", 1) for kv in rest if "=" in kv)


def main() -> None:
    rows = [parse(l) for l in sys.stdin if "=" in l]
    peak = next((float(r["gflops"]) for k, r in rows if k == "fma_peak"), float("nan"))
    machine = next((r for k, r in rows if k == "machine"), {})
    print(f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; measured fp32 FMA peak "
          f"{peak:.0f} GFLOP/s.\n")
    kern = {}
    for k, r in rows:
        if k == "kernel":
            kern[(r["dtype"], r["D"], r["L"], r["impl"])] = r
    print("| dtype | D | L | stria fwd GFLOP/s | % of peak | torch fwd | stria/torch | stria bwd | torch bwd | stria/torch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (dt, d, l, impl), r in sorted(kern.items(), key=lambda x: (x[0][0], int(x[0][1]), int(x[0][2]))):
        if impl != "stria":
            continue
        t = kern.get((dt, d, l, "torch"))
        sf, sb = float(r["fwd_gflops"]), float(r["bwd_gflops"])
        tf = float(t["fwd_gflops"]) if t else float("nan")
        tb = float(t["bwd_gflops"]) if t else float("nan")
        print(f"| {dt} | {d} | {l} | {sf:.0f} | {100 * sf / peak:.0f}% | {tf:.0f} | {sf / tf:.2f}x | {sb:.0f} | "
              f"{tb:.0f} | {sb / tb:.2f}x |")
    print()
    ring = [r for k, r in rows if k == "ring"]
    print("| N | L/rank | H×D | layout | wall s | slowest rank compute s | overhead | modelled ring latency s | "
          "contig/layout (measured) | contig/layout (analytic, tile 64) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    groups = {}
    for r in ring:
        groups.setdefault((r["N"], r["L"], r["H"], r["D"]), {})[r["layout"]] = r
    for (n, l, h, d), g in groups.items():
        c = g.get("contiguous")
        for lay in ("contiguous", "zigzag", "striped"):
            r = g.get(lay)
            if not r:
                continue
            meas = float(c["model_latency_s"]) / float(r["model_latency_s"]) if c else float("nan")
            ana = float(c["analytic_latency_pairs"]) / float(r["analytic_latency_pairs"]) if c else float("nan")
            print(f"| {n} | {l} | {h}×{d} | {lay} | {float(r['wall_s']):.3f} | {float(r['slowest_compute_s']):.3f} | "
                  f"{100 * float(r['overhead']):+.1f}% | {float(r['model_latency_s']):.3f} | {meas:.2f}x | {ana:.2f}x |")


if __name__ == "__main__":
    main()
