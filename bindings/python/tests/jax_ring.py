"""Ranks of a ring under JAX, for test_jax.py: each rank takes its shard of one random sequence,
computes ring attention and the gradients of sum(out * w) with jax.jit(jax.value_and_grad), and
writes what it got (out, lse, dq, dk, dv as float32) to an .npz file for the test to check
against the float64 reference. Run in its own process, so that JAX is set up as given here.

    A mode may end in "+docs" (local+docs, shard_map+docs, ucx+docs): ring attention then masks
    to the documents of DOCUMENTS (a traced array of boundaries, one row per batch row).

    python jax_ring.py local N LAYOUT CAUSAL DTYPE OUT.npz
        N ranks as threads of this process (a local group); JAX runs each program on the
        calling thread (jax_cpu_enable_async_dispatch off), which an in-process ring needs.
    python jax_ring.py shard_map N LAYOUT CAUSAL DTYPE OUT.npz
        a local group of N ranks passed whole to shard_map over N JAX CPU devices (XLA's forced
        host device count): JAX's own SPMD, rank r computing on device r.
    python jax_ring.py mispaired N LAYOUT CAUSAL DTYPE OUT.json
        N ranks as threads, where rank 0 calls ring attention from one place of its program and
        the others from another: the calls of different sites meet, and must fail on every rank
        (stria.jax tags each call with its site); then all call from one site, which must work.
        Writes each rank's two outcomes (an error message, or "ok") to OUT.json.
    python jax_ring.py ucx N LAYOUT CAUSAL DTYPE OUT.npz RANK PORT
        rank RANK of N processes joined by the UCX transport at 127.0.0.1:PORT; writes
        OUT.npz with the rank in its name (OUT.rank<R>.npz).
    python jax_ring.py two_devices N LAYOUT CAUSAL DTYPE OUT.json RANK PORT
        rank RANK of N UCX processes as in ucx, each with two JAX CPU devices, calling its one
        Context from both under a data-parallel shard_map: which must fail (a Context of a ring
        serves one device), not pair the two devices' calls with the peers' in any order. Writes
        the outcomes of three tries to OUT.rank<R>.json.
    python jax_ring.py distributed N LAYOUT CAUSAL DTYPE OUT.npz RANK PORT
        the same, the processes being a JAX multi-process job (jax.distributed, its coordinator
        at 127.0.0.1:PORT) whose contexts come from stria.jax.context_from_distributed.
"""

from __future__ import annotations

import sys

import numpy as np
from reference import random_inputs

SHAPE = {"batch": 2, "seq": 48, "hq": 4, "hkv": 2, "dim": 32}  # GQA: two query heads per K/V head
SEED = 7
TIMEOUT_S = 60.0
# Per batch row, in global positions of the 48-token sequence (the second has an empty document).
DOCUMENTS = [[0, 5, 17, 30, 48], [0, 24, 24, 41, 48]]


def full_inputs():
    """q, k, v and the output weights w of the whole sequence, float32 [B, S, H, D]."""
    return random_inputs(*(SHAPE[x] for x in ("batch", "seq", "hq", "hkv", "dim")), SEED)


def run_rank(ctx, layout: str, causal: bool, dtype: str, docs: bool = False) -> dict[str, np.ndarray]:
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj

    n, r = ctx.world_size, ctx.rank
    q, k, v, w = (
        jnp.asarray(stria.shard(x, n, r, layout=layout, ulysses=ctx.ulysses), dtype=dtype) for x in full_inputs()
    )
    cu = jnp.asarray(DOCUMENTS) if docs else None

    def loss(q, k, v, cu):
        out = sj.ring_attention(q, k, v, ctx, layout=layout, causal=causal, cu_seqlens=cu)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

    _, (dq, dk, dv) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v, cu)
    forward = jax.jit(lambda q, k, v, cu: sj.attention_forward(ctx, q, k, v, layout=layout, causal=causal, cu_seqlens=cu))
    out, lse = forward(q, k, v, cu)
    return {name: np.asarray(x.astype(jnp.float32)) for name, x in
            (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))}


def run_mispaired(ctx, layout: str, causal: bool, dtype: str) -> list[str]:
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj

    n, r = ctx.world_size, ctx.rank
    q, k, v, _ = (jnp.asarray(stria.shard(x, n, r, layout=layout), dtype=dtype) for x in full_inputs())

    def site_a(q, k, v):
        return sj.ring_attention(q, k, v, ctx, layout=layout, causal=causal)

    def site_b(q, k, v):
        return sj.ring_attention(q, k, v, ctx, layout=layout, causal=causal)

    outcomes = []
    for f in (site_a if r == 0 else site_b, site_a):
        try:
            jax.block_until_ready(jax.jit(f)(q, k, v))
            outcomes.append("ok")
        except Exception as e:  # noqa: BLE001 - the test reads the message
            outcomes.append(f"{type(e).__name__}: {e}")
    return outcomes


def run_shard_map(group, layout: str, causal: bool, dtype: str, docs: bool = False) -> list[dict[str, np.ndarray]]:
    """The whole sequence through shard_map: device r holds rank r's tokens (in layout order) as
    the r-th chunk of the sequence axis."""
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # JAX before 0.7
        from jax.experimental.shard_map import shard_map

    n = len(group)
    mesh = Mesh(np.array(jax.devices()[:n]), ("ring",))
    seq_spec, lse_spec = P(None, "ring"), P(None, None, "ring")
    q, k, v, w = full_inputs()
    order = np.concatenate([stria.positions(layout, q.shape[1], n, r, ulysses=group[0].ulysses) for r in range(n)])
    q, k, v = (jnp.asarray(x[:, order], dtype=dtype) for x in (q, k, v))
    w = jnp.asarray(w[:, order])
    # The boundaries, global positions, replicated: every shard gets all of them.
    cu = jnp.asarray(DOCUMENTS if docs else [[0, q.shape[1]]] * q.shape[0])
    specs = (seq_spec,) * 3 + (P(),)

    def attention(q, k, v, cu):
        return sj.ring_attention(q, k, v, group, layout=layout, causal=causal, cu_seqlens=cu if docs else None)

    def loss(q, k, v, cu):
        out = shard_map(attention, mesh=mesh, in_specs=specs, out_specs=seq_spec)(q, k, v, cu)
        return jnp.sum(out.astype(jnp.float32) * w)

    def forward(q, k, v, cu):
        return sj.attention_forward(group, q, k, v, layout=layout, causal=causal, cu_seqlens=cu if docs else None)

    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, cu)
    out, lse = jax.jit(shard_map(forward, mesh=mesh, in_specs=specs, out_specs=(seq_spec, lse_spec)))(q, k, v, cu)
    local = q.shape[1] // n
    results = []
    for r in range(n):
        chunk = slice(r * local, (r + 1) * local)
        got = {"out": out[:, chunk], "lse": lse[:, :, chunk]}
        got.update({name: x[:, chunk] for name, x in (("dq", dq), ("dk", dk), ("dv", dv))})
        results.append({name: np.asarray(x.astype(jnp.float32)) for name, x in got.items()})
    return results


def run_two_devices(ctx, layout: str, causal: bool, dtype: str) -> list[str]:
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    n, r = ctx.world_size, ctx.rank
    q = jnp.asarray(stria.shard(full_inputs()[0], n, r, layout=layout), dtype=dtype)  # B = 2: one per device
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    attend = jax.shard_map(
        lambda q: sj.ring_attention(q, q, q, ctx, layout=layout, causal=causal),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P("data"),
    )
    outcomes = []
    for _ in range(3):
        try:
            jax.block_until_ready(jax.jit(attend)(q))
            outcomes.append("ok")
        except Exception as e:  # noqa: BLE001 - the test reads the message
            outcomes.append(f"{type(e).__name__}: {e}")
    return outcomes


def main(argv: list[str]) -> None:
    mode, n, layout, causal, dtype, path = argv[:6]
    n, causal = int(n), causal == "1"
    mode, _, suffix = mode.partition("+")
    docs = suffix == "docs"
    # "+gridU": the local group as a grid of all-to-all groups of U ranks (Context.ulysses).
    ulysses = int(suffix[4:]) if suffix.startswith("grid") else 1
    if mode in ("shard_map", "two_devices"):
        import os

        devices = n if mode == "shard_map" else 2
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"  # before JAX starts
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)  # before JAX's first computation
    import stria

    if mode == "local":
        with stria.local_group(n, timeout_s=TIMEOUT_S, num_threads=1, ulysses=ulysses) as group:
            results = group.run(lambda ctx: run_rank(ctx, layout, causal, dtype, docs))
        np.savez(path, **{f"{name}{r}": x for r, res in enumerate(results) for name, x in res.items()})
    elif mode == "mispaired":
        import json

        with stria.local_group(n, timeout_s=TIMEOUT_S, num_threads=1) as group:
            results = group.run(lambda ctx: run_mispaired(ctx, layout, causal, dtype))
        with open(path, "w") as f:
            json.dump(results, f)
    elif mode == "shard_map":
        with stria.local_group(n, timeout_s=TIMEOUT_S, num_threads=1, ulysses=ulysses) as group:
            results = run_shard_map(group, layout, causal, dtype, docs)
        np.savez(path, **{f"{name}{r}": x for r, res in enumerate(results) for name, x in res.items()})
    elif mode == "ucx":
        rank, port = int(argv[6]), int(argv[7])
        env = {"RANK": str(rank), "WORLD_SIZE": str(n), "STRIA_ROOT": f"127.0.0.1:{port}"}
        with stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S, num_threads=1) as ctx:
            res = run_rank(ctx, layout, causal, dtype, docs)
        np.savez(path.replace(".npz", f".rank{rank}.npz"), **{f"{name}{rank}": x for name, x in res.items()})
    elif mode == "two_devices":
        import json

        rank, port = int(argv[6]), int(argv[7])
        env = {"RANK": str(rank), "WORLD_SIZE": str(n), "STRIA_ROOT": f"127.0.0.1:{port}"}
        with stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S, num_threads=1) as ctx:
            outcomes = run_two_devices(ctx, layout, causal, dtype)
        with open(path.replace(".json", f".rank{rank}.json"), "w") as f:
            json.dump(outcomes, f)
    elif mode == "distributed":
        import stria.jax as sj

        rank, port = int(argv[6]), int(argv[7])
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank, initialization_timeout=60
        )
        with sj.context_from_distributed(timeout_s=TIMEOUT_S, num_threads=1) as ctx:
            assert (ctx.rank, ctx.world_size) == (rank, n)
            res = run_rank(ctx, layout, causal, dtype)
        np.savez(path.replace(".npz", f".rank{rank}.npz"), **{f"{name}{rank}": x for name, x in res.items()})
        jax.distributed.shutdown()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
