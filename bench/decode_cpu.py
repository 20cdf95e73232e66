#!/usr/bin/env python3
"""Decode over a sharded KV cache on the CPU, side by side with one device holding the whole cache.

Part 1, the kernel: T new tokens per sequence (--tokens; 1 by default, a decode step; more, a chunk
of a prefill or speculative decode, each seeing the whole cache) attending a cache of C tokens, on one process with
every thread: stria.attention_decode on a world of one against PyTorch's scaled_dot_product_attention
(the same threads, GQA through enable_gqa), the cache as each keeps it ([B, C, Hkv, D] for stria,
[B, Hkv, C, D] for PyTorch), bf16 and float32.

Part 2, the sharded call: the same cache spread over N ranks (striped) of a local group, each rank
with as many threads as the one device had. The ranks run on this machine's few cores, so the wall
time of the group is the sum of their work; what N such machines would take is modelled from what
each rank measures: the slowest rank's compute (its CPU seconds over its threads: the time on
dedicated cores) plus the call's fixed cost, the validation, the all-gather of the partial results
and their merge, measured by a call whose cache is empty (on this machine the ranks' threads then
contend for its cores, so this is an upper bound). Beside it the ideal, the
time of the whole cache in one process divided by N, and the merge's share of the modelled time.

With --window W (one new token), the query sees the last W cached keys only (a sliding-window
layer: Mistral's, Gemma's, gpt-oss's): stria gets window_left W and reads the window's keys alone,
PyTorch attends the window's slice of its cache (k[:, :, C - W:], what a PyTorch user would pass),
and the rates count the window's keys.

    PYTHONPATH=build/bindings/python python bench/decode_cpu.py [--lens 32768,131072,...] [--ranks 2,4,8] [--tokens 1]
        [--window W]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import numpy as np
import stria
import torch
from timing import median_s


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="32768,131072,524288,1048576", help="cache lengths C")
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=1, help="new tokens per sequence (queries)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--window", type=int, default=-1, help="window_left W: the query sees the last W cached keys")
    args = p.parse_args()
    lens = [int(x) for x in args.lens.split(",")]
    ranks = [int(x) for x in args.ranks.split(",")]
    B, T, Hq, Hkv, D = args.batch, args.tokens, args.heads, args.kv_heads, args.dim
    W = args.window
    if W >= 0 and T != 1:
        raise SystemExit("--window takes one new token (--tokens 1)")
    threads = torch.get_num_threads()
    print(f"# Decode over a sharded KV cache, CPU: {cpu_name()}, {os.cpu_count()} hardware threads")
    print(f"B {B}, {T} new token(s) per sequence, Hq {Hq}, Hkv {Hkv}, D {D}"
          f"{f', window {W}' if W >= 0 else ''}; stria {stria.__version__}, "
          f"torch {torch.__version__}, {threads} threads; median of {args.reps}\n")

    print("## One device, the whole cache\n")
    print("| dtype | cache C | stria (ms) | PyTorch SDPA (ms) | PyTorch / stria | stria GB/s | stria GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    one_device = {}
    for dtype in args.dtypes.split(","):
        dt = getattr(torch, dtype)
        for c in lens:
            gen = torch.Generator().manual_seed(c)
            k = torch.randn(B, c, Hkv, D, generator=gen).to(dt)
            v = torch.randn(B, c, Hkv, D, generator=gen).to(dt)
            q = torch.randn(B, T, Hq, D, generator=gen).to(dt)
            cache_lens = np.full(B, c, dtype=np.int64)
            with stria.local_group(1, num_threads=threads) as group:
                ctx = group[0]
                out = torch.empty_like(q)
                lse = torch.empty(B, Hq, T)
                ours = median_s(
                    lambda: stria.attention_decode(ctx, q, k, v, cache_lens, out=out, lse=lse, window_left=W),
                    args.reps)
            # The keys the query sees (position c against cached positions: c - p <= W).
            seen = c if W < 0 else min(c, W)
            kt, vt, qt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), q.transpose(1, 2)
            kt, vt = kt[:, :, c - seen:], vt[:, :, c - seen:]
            with torch.no_grad():
                # stria against float64 on the first K/V head's query heads (the whole cache in
                # float64 would not fit), the project's bar for each dtype.
                g = Hq // Hkv
                ref = torch.nn.functional.scaled_dot_product_attention(
                    qt[:, :g].double(), kt[:, :1].double(), vt[:, :1].double()
                )
                err = (out[:, :, :g].double() - ref.transpose(1, 2)).norm() / ref.norm()
                assert err < (1e-5 if dt == torch.float32 else 2e-2), f"stria and float64 differ by {err}"
                theirs = median_s(
                    lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), args.reps
                )
            one_device[(dtype, c)] = ours
            gbs = 2 * B * seen * Hkv * D * k.element_size() / ours / 1e9
            gflops = 4 * B * T * Hq * seen * D / ours / 1e9
            print(f"| {dtype} | {c // 1024}k | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {theirs / ours:.2f}x | {gbs:.1f} "
                  f"| {gflops:.1f} |")

    print("\n## Sharded over N ranks (striped), modelled: the slowest rank's compute plus the call's fixed cost\n")
    print("| dtype | cache C | N | slowest rank (ms) | fixed cost (ms) | modelled (ms) | ideal C/N (ms) | "
          "ideal / modelled | fixed-cost share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        dt = getattr(torch, dtype)
        for c in lens:
            gen = torch.Generator().manual_seed(c)
            k = torch.randn(B, c, Hkv, D, generator=gen).to(dt)
            v = torch.randn(B, c, Hkv, D, generator=gen).to(dt)
            q = torch.randn(B, T, Hq, D, generator=gen).to(dt)
            for n in ranks:
                cap = -(-c // n)
                shares = [(k[:, r::n].contiguous(), v[:, r::n].contiguous()) for r in range(n)]
                for kc, _ in shares:
                    assert kc.shape[1] <= cap
                full = np.full(B, c, dtype=np.int64)
                empty = np.zeros(B, dtype=np.int64)

                def rank_fn(ctx, cache_lens):
                    kc, vc = shares[ctx.rank]
                    pad = cap - kc.shape[1]
                    if pad:
                        kc = torch.cat([kc, kc.new_zeros(B, pad, Hkv, D)], dim=1)
                        vc = torch.cat([vc, vc.new_zeros(B, pad, Hkv, D)], dim=1)
                    out = torch.empty_like(q)
                    compute, calls = [], []
                    for _ in range(args.reps + 1):
                        t0 = time.perf_counter()
                        stria.attention_decode(ctx, q, kc, vc, cache_lens, out=out, window_left=W)
                        calls.append(time.perf_counter() - t0)
                        compute.append(ctx.step_times()[0].compute_cpu_s)
                    return statistics.median(compute[1:]), statistics.median(calls[1:])

                with stria.local_group(n, num_threads=threads) as group:
                    per_rank = group.run(rank_fn, [full] * n)
                    fixed = group.run(rank_fn, [empty] * n)
                slowest = max(cpu for cpu, _ in per_rank)
                fixed_s = max(wall for _, wall in fixed)
                modelled = slowest + fixed_s
                ideal = one_device[(dtype, c)] / n if (dtype, c) in one_device else float("nan")
                print(f"| {dtype} | {c // 1024}k | {n} | {slowest * 1e3:.2f} | {fixed_s * 1e3:.3f} | "
                      f"{modelled * 1e3:.2f} | {ideal * 1e3:.2f} | {ideal / modelled:.2f} | "
                      f"{fixed_s / modelled:.1%} |")


if __name__ == "__main__":
    main()
