#!/usr/bin/env python3
"""Prefill with a sharded KV cache on the CPU: pass-KV against pass-Q across the ratio of new to
cached tokens.

A cache of C tokens per sequence spread over N ranks (striped), and P new tokens sharded by the same
layout (a new turn of a conversation: few new tokens and a long cache; a first prefill: many new
tokens). Each mode runs on a local group; each rank measures what it sends (stria's traffic
counters: the keys and values of pass-KV, the queries and the partial results going home of pass-Q)
and its compute per ring step (CPU seconds over its threads). The modelled time of a call on N
machines sums over the ring steps the larger of the slowest rank's compute and the step's transfer
at --link-gbs; the automatic mode's choice is printed beside.

    PYTHONPATH=build/bindings/python python bench/prefill_cpu.py [--cache 8192] [--new 64,512,4096] [--ranks 4]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import stria


def run(n, mode, q, k, v, kc, vc, lens, reps):
    """(per-step compute of the slowest rank summed, bytes per step of the busiest rank, auto's pick)."""

    def rank_fn(ctx):
        mine = stria.positions("striped", q.shape[1], n, ctx.rank)
        kcr, vcr = kc[ctx.rank].copy(), vc[ctx.rank].copy()
        steps, sent = [], []
        for _ in range(reps):
            stria.attention_prefill(ctx, q[:, mine], k[:, mine], v[:, mine], kcr, vcr, lens, mode=mode)
            steps.append([t.compute_cpu_s for t in ctx.step_times()])
            sent.append(ctx.traffic().kv_bytes)
        per_step = [statistics.median(s[i] for s in steps) for i in range(len(steps[0]))]
        return per_step, statistics.median(sent)

    with stria.local_group(n, num_threads=1) as group:
        results = group.run(rank_fn)
    steps = len(results[0][0])
    compute = [max(r[0][i] for r in results) for i in range(steps)]
    sent = max(r[1] for r in results)
    return compute, sent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cache", type=int, default=8192, help="cached tokens per sequence")
    p.add_argument("--new", default="64,256,1024,4096,8192", help="new tokens per sequence")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--link-gbs", type=float, default=12.5, help="per-rank link bandwidth for the model, GB/s")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    n, B, Hq, Hkv, D, C = args.ranks, 1, args.heads, args.kv_heads, args.dim, args.cache
    rng = np.random.default_rng(0)
    print(f"# Prefill with a sharded cache, CPU: N {n} ranks (striped), cache {C} tokens, Hq {Hq}, Hkv {Hkv}, "
          f"D {D}, float32, one thread per rank; modelled at {args.link_gbs} GB/s per rank\n")
    print("| new P | P / (P + C) | mode | sent per rank (MB) | slowest compute (ms) | modelled (ms) | auto picks |")
    print("|---|---|---|---|---|---|---|")
    for new in [int(x) for x in args.new.split(",")]:
        cap = -(-(C + new) // n)
        k = rng.standard_normal((B, C + new, Hkv, D), dtype=np.float32)
        v = rng.standard_normal((B, C + new, Hkv, D), dtype=np.float32)
        q = rng.standard_normal((B, new, Hq, D), dtype=np.float32)
        kc, vc = [], []
        for r in range(n):
            a = np.zeros((B, cap, Hkv, D), np.float32)
            b = np.zeros_like(a)
            a[:, : len(range(r, C, n))] = k[:, r:C:n]
            b[:, : len(range(r, C, n))] = v[:, r:C:n]
            kc.append(a)
            vc.append(b)
        lens = np.full(B, C, dtype=np.int64)
        knew, vnew = k[:, C:], v[:, C:]
        timings = {}
        for mode in ("pass_kv", "pass_q"):
            compute, sent = run(n, mode, q, knew, vnew, kc, vc, lens, args.reps)
            per_step = sent / max(len(compute) - 1, 1)
            modelled = sum(max(c, per_step / (args.link_gbs * 1e9)) for c in compute)
            timings[mode] = modelled
            pick = ""
            print(f"| {new} | {new / (new + C):.3f} | {mode} | {sent / 1e6:.2f} | {sum(compute) * 1e3:.1f} | "
                  f"{modelled * 1e3:.1f} | {pick} |")
        # What the automatic mode takes: the one moving fewer bytes per step.
        kv_bytes = 2 * B * (-(-C // n) + new // n) * Hkv * D * 4
        q_bytes = B * (new // n) * Hq * (D * 4 + (D + 1) * 4)
        auto = "pass_q" if q_bytes < kv_bytes else "pass_kv"
        faster = min(timings, key=timings.get)
        print(f"| {new} | | auto | | | | {auto} (faster here: {faster}) |")


if __name__ == "__main__":
    main()
