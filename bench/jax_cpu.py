#!/usr/bin/env python3
"""stria.jax on CPU, side by side: the same causal attention (world of one, float32 and bfloat16)
through stria's Python API on the same memory as torch tensors (the C call and nothing else
around it), through
stria.jax under jax.jit (the XLA custom call: what the FFI path adds), and through JAX's own
jax.nn.dot_product_attention under jax.jit (the peer anchor: XLA's CPU attention). Forward, and
forward + backward of a sum. Median of REPS after a warm-up, one shape after another.

    PYTHONPATH=build/bindings/python python bench/jax_cpu.py [--lens 1024,4096] [--reps 5]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import stria  # noqa: E402
import stria.jax as sj  # noqa: E402
import torch  # noqa: E402
import timing  # noqa: E402


def median_s(fn, reps: int) -> float:
    """timing.median_s of fn's result, ready (JAX dispatches asynchronously)."""
    return timing.median_s(lambda: jax.block_until_ready(fn()), reps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lens", default="1024,4096")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    print(
        "| dtype | L | pass | stria C API ms | stria.jax ms | stria.jax / C API "
        "| jax.nn.dot_product_attention ms | stria.jax / jax |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with stria.Context(0, 1) as ctx:
        for dtype in a.dtypes.split(","):
            for length in (int(x) for x in a.lens.split(",")):
                shape = (1, length, a.heads, a.dim)
                q, k, v = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype) for _ in range(3))
                # The C API's operands: the same memory as torch tensors (zero-copy through DLPack;
                # numpy has no bfloat16 DLPack can carry), its outputs allocated like them.
                qn, kn, vn = (torch.from_dlpack(x) for x in (q, k, v))
                out, lse = stria.attention_forward(ctx, qn, kn, vn, causal=True)
                dout = torch.ones_like(qn)
                dq, dk, dv = torch.empty_like(qn), torch.empty_like(kn), torch.empty_like(vn)

                def ours(q, k, v):
                    return sj.ring_attention(q, k, v, ctx, causal=True)

                def theirs(q, k, v):
                    return jax.nn.dot_product_attention(q, k, v, is_causal=True)

                fwd = {
                    "capi": lambda: stria.attention_forward(ctx, qn, kn, vn, out, lse, causal=True),
                    "jax": lambda f=jax.jit(ours): f(q, k, v),
                    "xla": lambda f=jax.jit(theirs): f(q, k, v),
                }

                def capi_both():
                    stria.attention_forward(ctx, qn, kn, vn, out, lse, causal=True)
                    return stria.attention_backward(ctx, qn, kn, vn, out, lse, dout, dq, dk, dv, causal=True)

                def grads(f):
                    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))

                both = {
                    "capi": capi_both,
                    "jax": lambda g=grads(ours): g(q, k, v),
                    "xla": lambda g=grads(theirs): g(q, k, v),
                }
                for name, fns in (("fwd", fwd), ("fwd+bwd", both)):
                    ms = {key: 1e3 * median_s(fn, a.reps) for key, fn in fns.items()}
                    print(
                        f"| {dtype} | {length} | {name} | {ms['capi']:.1f} | {ms['jax']:.1f} | "
                        f"{ms['jax'] / ms['capi']:.3f} | {ms['xla']:.1f} | {ms['jax'] / ms['xla']:.3f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
