#!/usr/bin/env python3
"""stria.torch on CPU, side by side: the same causal attention (world of one) through stria's
Python API on the same tensors (the C call and nothing else around it), through
stria.torch.ring_attention in eager mode (the torch custom operator and autograd: what they
add), the same under torch.compile(fullgraph=True), and torch's own
scaled_dot_product_attention (the peer anchor: PyTorch's CPU flash attention). Forward, and
forward + backward of a sum. Median of REPS after a warm-up, one shape after another.

    PYTHONPATH=build/bindings/python python bench/torch_cpu.py [--lens 256,1024,4096] [--reps 5]
"""

from __future__ import annotations

import argparse

import stria
import stria.torch as st
import torch
from torch.nn import functional as F
from timing import median_s


def median_ms(fn, reps: int) -> float:
    return 1e3 * median_s(fn, reps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="256,1024,4096")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    print(
        "| dtype | L | pass | C API ms | stria.torch ms | / C API | compiled ms | / C API "
        "| torch SDPA ms | stria.torch / SDPA |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with stria.Context(0, 1) as ctx:
        for dtype in a.dtypes.split(","):
            for length in (int(x) for x in a.lens.split(",")):
                shape = (1, length, a.heads, a.dim)
                q, k, v = (torch.randn(shape, dtype=getattr(torch, dtype)) for _ in range(3))
                out, lse = stria.attention_forward(ctx, q, k, v, causal=True)
                dout = torch.ones_like(q)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                # SDPA's [B, H, L, D] views of the same tensors.
                sdpa_leaves = [x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v)]

                def ours(q, k, v):
                    return st.ring_attention(q, k, v, ctx, causal=True)

                compiled = torch.compile(ours, fullgraph=True)

                def sdpa(q, k, v):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def capi_both():
                    stria.attention_forward(ctx, q, k, v, out, lse, causal=True)
                    stria.attention_backward(ctx, q, k, v, out, lse, dout, dq, dk, dv, causal=True)

                def backward_of(f, args):
                    def run():
                        for x in args:
                            x.grad = None
                        f(*args).sum().backward()

                    return run

                with torch.no_grad():
                    forward = {
                        "capi": median_ms(lambda: stria.attention_forward(ctx, q, k, v, out, lse, causal=True), a.reps),
                        "torch": median_ms(lambda: ours(q, k, v), a.reps),
                        "compiled": median_ms(lambda: compiled(q, k, v), a.reps),
                        "sdpa": median_ms(lambda: sdpa(*(x.transpose(1, 2) for x in (q, k, v))), a.reps),
                    }
                both = {
                    "capi": median_ms(capi_both, a.reps),
                    "torch": median_ms(backward_of(ours, leaves), a.reps),
                    "compiled": median_ms(backward_of(compiled, leaves), a.reps),
                    "sdpa": median_ms(backward_of(sdpa, sdpa_leaves), a.reps),
                }
                for name, t in (("fwd", forward), ("fwd+bwd", both)):
                    print(
                        f"| {dtype} | {length} | {name} | {t['capi']:.2f} | {t['torch']:.2f} | "
                        f"{t['torch'] / t['capi']:.2f} | {t['compiled']:.2f} | {t['compiled'] / t['capi']:.2f} | "
                        f"{t['sdpa']:.2f} | {t['torch'] / t['sdpa']:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
