"""A ring on document plans under JAX, for test_plan.py: N ranks as threads of this process (a local
group, JAX's CPU dispatch synchronous as an in-process ring needs), each jitting ring attention and
its gradients with a PlanConfig and traced boundaries, over two batches with different documents
(the program must not be traced again for the second). Checks every result against the float64
reference and prints "ok"; raises otherwise. Run in its own process, so that JAX is set up here.
With U, the N ranks form a grid of all-to-all groups of U ranks, whose plan is made for the ring
of N / U groups.

    python jax_plan.py N [U]
"""

from __future__ import annotations

import sys

import numpy as np
from reference import attention_backward_ref, attention_ref, rel_err

BATCH, SEQ, HQ, HKV, D = 2, 45, 4, 2, 16
BOUNDARIES = ([[0, 5, 17, 30, 45], [0, 22, 22, 41, 45]], [[0, 40, 41, 44, 45], [0, 1, 2, 3, 45]])


def main() -> None:
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    import jax.numpy as jnp
    import stria
    import stria.jax as sj

    n = int(sys.argv[1])
    ulysses = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    ring = n // ulysses
    # One L for both batches' plans, a multiple of U: room for either batch's documents.
    local_len = {1: -(-SEQ // ulysses) * ulysses, 2: 28}.get(ring, 24)
    config = stria.PlanConfig(world_size=ring, tile=4, local_len=local_len)
    rng = np.random.default_rng(3)
    traces = []

    def loss(q, k, v, w, cu, ctx):
        traces.append(1)  # counted while tracing only
        out = sj.ring_attention(q, k, v, ctx, plan=config, cu_seqlens=cu)
        return jnp.sum(out * w)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=5)
    group = stria.local_group(n, timeout_s=60.0, ulysses=ulysses)
    for cu in BOUNDARIES:
        cu = np.array(cu)
        q = rng.standard_normal((BATCH, SEQ, HQ, D)).astype(np.float32)
        k, v = (rng.standard_normal((BATCH, SEQ, HKV, D)).astype(np.float32) for _ in range(2))
        w = rng.standard_normal(q.shape).astype(np.float32)
        plan = stria.Plan(cu, ring, tile=4, local_len=local_len)  # what the data loader shards by
        assert plan.config == config

        def rank_fn(ctx, plan=plan, cu=cu, q=q, k=k, v=v, w=w):
            parts = [plan.shard(x, ctx.rank, ulysses=ulysses) for x in (q, k, v, w)]
            _, grads = grad(*parts, jnp.asarray(cu), ctx)
            out, _ = sj.attention_forward(ctx, *parts[:3], plan=plan)  # a Plan itself, eagerly
            return ctx.rank, np.asarray(out), *(np.asarray(g) for g in grads)

        results = group.run(rank_fn)
        full = [np.full(x.shape, np.nan, dtype=np.float32) for x in (q, q, k, v)]
        for rank, *parts in results:
            for dst, src in zip(full, parts):
                plan.unshard(src, rank, out=dst, ulysses=ulysses)
        scale = 1 / np.sqrt(D)
        ref_out, _ = attention_ref(q, k, v, True, scale, cu)
        ref_grads = attention_backward_ref(q, k, v, w, True, scale, cu)
        errors = [rel_err(full[0], ref_out)] + [rel_err(g, r) for g, r in zip(full[1:], ref_grads)]
        if max(errors) > 1e-5:
            raise AssertionError(f"relative errors {errors}")
        plan.close()
    group.close()
    if len(traces) != n:  # one trace per rank's context (a static argument), not per batch
        raise AssertionError(f"traced {len(traces)} times for {n} ranks and two batches")
    print("ok")


if __name__ == "__main__":
    main()
