#!/usr/bin/env python3
"""Logit softcapping and attention sinks on the CPU, side by side: stria.torch.ring_attention on a
world of one, plain and with each modification, against the attention a model without stria runs
for them: transformers' eager attention (PyTorch's SDPA takes neither), written out here as it
computes them: scores by a matmul, the softcap's tanh, the causal mask, the sinks as one more
softmax column, softmax, and a matmul by V. Forward, and forward + backward of a sum (the sinks a
weight that requires grad). Median of REPS after a warm-up, one shape after another.

    PYTHONPATH=build/bindings/python python bench/torch_score_mods_cpu.py [--lens 1024,4096] [--reps 5]
"""

from __future__ import annotations

import argparse

import stria
import stria.torch as st
import torch
from timing import median_s


def median_ms(fn, reps: int) -> float:
    return 1e3 * median_s(fn, reps)


def eager(q, k, v, softcap, sinks):
    """q, k, v [B, L, H, D]: attention as transformers' eager path computes it for Gemma 2 and gpt-oss."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    s = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, n, 1).to(s.dtype)], dim=-1)
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    if sinks is not None:
        p = p[..., :n]
    return torch.matmul(p, v).transpose(1, 2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="1024,4096")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--softcap", type=float, default=30.0)
    a = p.parse_args()
    torch.manual_seed(0)
    print("| dtype | L | modification | pass | stria ms | stria plain ms | / plain | eager ms | eager / stria |")
    print("|---|---|---|---|---|---|---|---|---|")
    with stria.Context(0, 1) as ctx:
        for dtype in a.dtypes.split(","):
            for length in (int(x) for x in a.lens.split(",")):
                shape = (1, length, a.heads, a.dim)
                leaves = [torch.randn(shape, dtype=getattr(torch, dtype)).requires_grad_() for _ in range(3)]
                sinks = torch.randn(a.heads, requires_grad=True)
                cases = {"softcap": (a.softcap, None), "sinks": (None, sinks), "both": (a.softcap, sinks)}

                def ours(cap, z):
                    return st.ring_attention(*leaves, ctx, softcap=cap, sinks=z)

                for name, (cap, z) in cases.items():
                    for pass_name, backward in (("forward", False), ("forward + backward", True)):

                        def run(f, backward=backward):
                            if backward:
                                f().float().sum().backward()
                            else:
                                with torch.no_grad():
                                    f()

                        t_mod = median_ms(lambda cap=cap, z=z, run=run: run(lambda: ours(cap, z)), a.reps)
                        t_plain = median_ms(lambda run=run: run(lambda: ours(None, None)), a.reps)
                        t_eager = median_ms(lambda cap=cap, z=z, run=run: run(lambda: eager(*leaves, cap, z)), a.reps)
                        print(
                            f"| {dtype} | {length} | {name} | {pass_name} | {t_mod:.1f} | {t_plain:.1f} | "
                            f"{t_mod / t_plain:.2f} | {t_eager:.1f} | {t_eager / t_mod:.2f} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
