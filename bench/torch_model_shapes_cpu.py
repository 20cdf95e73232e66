#!/usr/bin/env python3
"""Attention shapes of recent model families on the CPU, side by side with PyTorch's own SDPA on the
same inputs: stria.torch.scaled_dot_product_attention on a world of one against
torch.nn.functional.scaled_dot_product_attention (the path transformers' "sdpa" implementation
takes), forward, and forward + backward of a sum. Median of REPS after a warm-up.

- latent: DeepSeek-V3's multi-head latent attention, query and key heads of 192 and value heads of
  128 (stria pads the values to 192; torch takes the two widths), and the same call with values
  of 192, the work the padding costs stria;
- chunked: a Llama 4 chunked-attention layer, chunks of CHUNK positions (stria: the chunks as
  documents; torch: the boolean mask transformers builds for it), and plain causal attention
  beside it;
- wide: Gemma 4's full-attention layers, heads of 512.

    PYTHONPATH=build/bindings/python python bench/torch_model_shapes_cpu.py [--len 4096] [--reps 3]
"""

from __future__ import annotations

import argparse

import stria
import stria.torch as st
import torch
import torch.nn.functional as F
from timing import median_s


def median_ms(fn, reps: int) -> float:
    return 1e3 * median_s(fn, reps)


def timed(call, leaves, backward: bool, reps: int) -> float:
    def run():
        if backward:
            for x in leaves:
                x.grad = None
            call().float().sum().backward()
        else:
            with torch.no_grad():
                call()

    return median_ms(run, reps)


def chunked_mask(length: int, chunk: int) -> torch.Tensor:
    """What transformers' chunked causal mask allows: keys of the query's own chunk, up to it."""
    pos = torch.arange(length)
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] // chunk == pos[:, None] // chunk)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    n, h = a.len, a.heads

    def leaves(dqk: int, dv: int):
        return [torch.randn(1, h, n, d, dtype=dtype).requires_grad_() for d in (dqk, dqk, dv)]

    print(f"L {n}, {h} heads, {a.dtype}, {torch.get_num_threads()} threads; median of {a.reps}")
    print("| shape | pass | stria ms | torch SDPA ms | torch / stria | stria beside ms | what beside is |")
    print("|---|---|---|---|---|---|---|")
    with stria.Context(0, 1) as ctx:
        latent, latent_wide = leaves(192, 128), leaves(192, 192)
        chunk_docs = list(range(0, n, a.chunk)) + [n]
        causal, wide = leaves(128, 128), leaves(512, 512)
        mask = chunked_mask(n, a.chunk)
        cases = [
            ("latent, q/k 192, v 128", latent,
             lambda: st.scaled_dot_product_attention(*latent, is_causal=True, context=ctx),
             lambda: F.scaled_dot_product_attention(*latent, is_causal=True),
             latent_wide, lambda: st.scaled_dot_product_attention(*latent_wide, is_causal=True, context=ctx),
             "stria, v 192"),
            (f"chunked, chunks of {a.chunk}, D 128", causal,
             lambda: st.scaled_dot_product_attention(*causal, is_causal=True, cu_seqlens=chunk_docs, context=ctx),
             lambda: F.scaled_dot_product_attention(*causal, attn_mask=mask),
             causal, lambda: st.scaled_dot_product_attention(*causal, is_causal=True, context=ctx),
             "stria, causal"),
            ("wide, D 512", wide,
             lambda: st.scaled_dot_product_attention(*wide, is_causal=True, context=ctx),
             lambda: F.scaled_dot_product_attention(*wide, is_causal=True),
             None, None, ""),
        ]
        for name, xs, ours, theirs, beside_xs, beside, what in cases:
            for pass_name, backward in (("forward", False), ("forward + backward", True)):
                t_ours = timed(ours, xs, backward, a.reps)
                t_theirs = timed(theirs, xs, backward, a.reps)
                t_beside = f"{timed(beside, beside_xs, backward, a.reps):.1f}" if beside else "–"
                print(f"| {name} | {pass_name} | {t_ours:.1f} | {t_theirs:.1f} | {t_theirs / t_ours:.2f} | "
                      f"{t_beside} | {what or '–'} |", flush=True)


if __name__ == "__main__":
    main()
