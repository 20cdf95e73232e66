"""The random feature combinations of test_combinations.py through stria.jax, for that test: each
seed's case (combination_cases.draw_case: world size, grid, layout or document plan, causal,
documents, window, softcap, sinks, GQA, dtype, deterministic backward) runs on a local group whose
ranks each jit ring attention and its gradients in q, k, v (and the sinks) with
jax.value_and_grad, the boundaries a traced argument. Writes, per seed, the inputs as the ranks
had them and each rank's positions, output and gradients (float64) to OUT_DIR/<seed>.npz for the
test to check against the float64 reference. Run in its own process, so that JAX is set up here
(its CPU dispatch synchronous, as an in-process ring needs).

    python jax_combinations.py OUT_DIR SEED [SEED ...]
"""

from __future__ import annotations

import os
import sys

import numpy as np
from combination_cases import draw_case, plan_for

TIMEOUT_S = 60.0


def run_case(c: dict) -> dict[str, np.ndarray]:
    import jax
    import jax.numpy as jnp
    import stria
    import stria.jax as sj

    n, ulysses, dtype = c["n"], c["ulysses"], getattr(jnp, c["dtype"])
    # The inputs rounded to the dtype once, kept in float32 (exactly) for the shards and the check.
    full = [np.asarray(jnp.asarray(x, dtype=dtype).astype(jnp.float32)) for x in c["inputs"]]
    plan = plan_for(c)
    cu = None if c["cu_seqlens"] is None else jnp.asarray(c["cu_seqlens"], dtype=jnp.int32)
    sinks = None if c["sinks"] is None else jnp.asarray(c["sinks"])
    kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"] or None)
    if plan is not None:
        kw["plan"] = plan
    else:
        kw["layout"] = c["layout"]

    def loss(q, k, v, z, dout, cu, ctx):  # noqa: ANN001, ANN202
        out = sj.ring_attention(q, k, v, ctx, cu_seqlens=cu, sinks=z, **kw)
        return jnp.sum(out.astype(jnp.float32) * dout), out

    argnums = (0, 1, 2) if sinks is None else (0, 1, 2, 3)
    step = jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True), static_argnums=6)

    def rank_fn(ctx):  # noqa: ANN001, ANN202
        ctx.deterministic = c["deterministic"]
        if plan is not None:
            pos = plan.positions(ctx.rank, ulysses=ulysses)
            parts = [plan.shard(x, ctx.rank, ulysses=ulysses) for x in full]
        else:
            pos = np.tile(stria.positions(c["layout"], c["seq"], n, ctx.rank, ulysses=ulysses), (c["batch"], 1))
            parts = [x[:, pos[0]] for x in full]
        q, k, v = (jnp.asarray(x, dtype=dtype) for x in parts[:3])
        (_, out), grads = step(q, k, v, sinks, jnp.asarray(parts[3]), cu, ctx)
        return pos, np.asarray(out.astype(jnp.float32), np.float64), [np.asarray(g, np.float64) for g in grads]

    try:
        with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
            results = group.run(rank_fn)
    finally:
        if plan is not None:
            plan.close()
    arrays = {f"input{i}": x for i, x in enumerate(full)}
    for r, (pos, out, grads) in enumerate(results):
        arrays[f"pos{r}"], arrays[f"out{r}"] = pos, out
        arrays.update({f"grad{r}_{i}": g for i, g in enumerate(grads)})
    return arrays


def main() -> None:
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    out_dir = sys.argv[1]
    for seed in (int(s) for s in sys.argv[2:]):
        np.savez(os.path.join(out_dir, f"{seed}.npz"), **run_case(draw_case(seed)))
    print("ok")


if __name__ == "__main__":
    main()
