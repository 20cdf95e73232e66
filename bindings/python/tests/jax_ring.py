"""Ranks of a ring under JAX, for test_jax.py: each rank takes its shard of one random sequence,
computes ring attention and the gradients of sum(out * w) with jax.jit(jax.value_and_grad), and
writes what it got (out, lse, dq, dk, dv as float32) to an .npz file for the test to check
against the float64 reference. Run in its own process, so that JAX is set up as given here.

    python jax_ring.py local N LAYOUT CAUSAL DTYPE OUT.npz
        N ranks as threads of this process (a local group); JAX runs each program on the
        calling thread (jax_cpu_enable_async_dispatch off), which an in-process ring needs.
    python jax_ring.py ucx N LAYOUT CAUSAL DTYPE OUT.npz RANK PORT
        rank RANK of N processes joined by the UCX transport at 127.0.0.1:PORT; writes
        OUT.npz with the rank in its name (OUT.rank<R>.npz).
"""

from __future__ import annotations

import sys

import numpy as np

SHAPE = {"batch": 2, "seq": 48, "hq": 4, "hkv": 2, "dim": 32}  # GQA: two query heads per K/V head
SEED = 7
TIMEOUT_S = 60.0


def full_inputs():
    """q, k, v and the output weights w of the whole sequence, float32 [B, S, H, D]."""
    b, s, hq, hkv, d = (SHAPE[x] for x in ("batch", "seq", "hq", "hkv", "dim"))
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((b, s, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, s, hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, s, hkv, d), dtype=np.float32)
    w = rng.standard_normal((b, s, hq, d), dtype=np.float32)
    return q, k, v, w


def run_rank(ctx, layout: str, causal: bool, dtype: str) -> dict[str, np.ndarray]:
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj

    n, r = ctx.world_size, ctx.rank
    q, k, v, w = (jnp.asarray(stria.shard(x, n, r, layout=layout), dtype=dtype) for x in full_inputs())

    def loss(q, k, v):
        out = sj.ring_attention(q, k, v, ctx, layout=layout, causal=causal)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

    _, (dq, dk, dv) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    out, lse = jax.jit(lambda q, k, v: sj.attention_forward(ctx, q, k, v, layout=layout, causal=causal))(q, k, v)
    return {name: np.asarray(x.astype(jnp.float32)) for name, x in
            (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))}


def main(argv: list[str]) -> None:
    mode, n, layout, causal, dtype, path = argv[:6]
    n, causal = int(n), causal == "1"
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)  # before JAX's first computation
    import stria

    if mode == "local":
        with stria.local_group(n, timeout_s=TIMEOUT_S, num_threads=1) as group:
            results = group.run(lambda ctx: run_rank(ctx, layout, causal, dtype))
        np.savez(path, **{f"{name}{r}": x for r, res in enumerate(results) for name, x in res.items()})
    elif mode == "ucx":
        rank, port = int(argv[6]), int(argv[7])
        env = {"RANK": str(rank), "WORLD_SIZE": str(n), "STRIA_ROOT": f"127.0.0.1:{port}"}
        with stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S, num_threads=1) as ctx:
            res = run_rank(ctx, layout, causal, dtype)
        np.savez(path.replace(".npz", f".rank{rank}.npz"), **{f"{name}{rank}": x for name, x in res.items()})
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
