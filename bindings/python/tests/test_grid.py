"""A grid of all-to-all groups within a ring (Context.ulysses, local_group(..., ulysses=U)) through
the Python front ends: the package's calls on numpy arrays and stria.torch's autograd, against the
float64 reference of the whole sequence; positions, shard and unshard on a grid; the bytes the
all-to-all moves; bad grids and heads that do not split."""

from __future__ import annotations

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import LAYOUTS, attention_backward_ref, attention_ref, positions_ref, rel_err

B, L, D = 2, 4, 16


def grid_positions_ref(layout: str, seq_len: int, world_size: int, ulysses: int, rank: int) -> np.ndarray:
    """DESIGN.md's grid: rank g*U + u holds the u-th of U contiguous pieces of the tokens the
    layout gives rank g of a ring of world_size / U."""
    g, u = divmod(rank, ulysses)
    ring = positions_ref(layout, seq_len, world_size // ulysses, g)
    piece = len(ring) // ulysses
    return ring[u * piece : (u + 1) * piece]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ulysses, ring", [(2, 2), (4, 1), (3, 2)], ids=["2x2", "4x1", "3x2"])
def test_positions_shard_and_unshard_on_a_grid(layout, ulysses, ring):
    n = ulysses * ring
    seq = L * n
    full = np.arange(2 * seq * 3, dtype=np.float32).reshape(2, seq, 3)
    back = np.full_like(full, np.nan)
    for rank in range(n):
        pos = stria.positions(layout, seq, n, rank, ulysses=ulysses)
        np.testing.assert_array_equal(pos, grid_positions_ref(layout, seq, n, ulysses, rank))
        local = stria.shard(full, n, rank, layout=layout, ulysses=ulysses)
        np.testing.assert_array_equal(local, full[:, pos])
        stria.unshard(local, n, rank, layout=layout, ulysses=ulysses, out=back)
    np.testing.assert_array_equal(back, full)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    "ulysses, ring, hq, hkv", [(2, 2, 4, 2), (4, 1, 8, 2), (3, 2, 6, 1), (2, 3, 4, 4)], ids=["2x2", "4x1", "3x2", "2x3"]
)
def test_numpy_calls_on_a_grid_match_the_reference(layout, causal, ulysses, ring, hq, hkv):
    n = ulysses * ring
    seq = L * n
    rng = np.random.default_rng(ulysses * 10 + ring)
    q, k, v, dout = (rng.standard_normal((B, seq, h, D)).astype(np.float32) for h in (hq, hkv, hkv, hq))
    cu = np.array([[0, 5, seq], [0, seq - 3, seq]])
    window = (seq // 2, -1 if causal else 3)
    scale = 1 / np.sqrt(D)

    def rank_fn(ctx):
        assert ctx.ulysses == ulysses
        pos = stria.positions(layout, seq, n, ctx.rank, ulysses=ulysses)
        ql, kl, vl, dl = (np.ascontiguousarray(x[:, pos]) for x in (q, k, v, dout))
        kwargs = dict(layout=layout, causal=causal, cu_seqlens=cu, window=window)
        out, lse = ctx.attention_forward(ql, kl, vl, **kwargs)
        dq, dk, dv = ctx.attention_backward(ql, kl, vl, out, lse, dl, **kwargs)
        return pos, out, lse, dq, dk, dv

    with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
        results = group.run(rank_fn)
    out, lse = attention_ref(q, k, v, causal, scale, cu, window)
    grads = attention_backward_ref(q, k, v, dout, causal, scale, cu, window)

    def assemble(i, axis):
        first = results[0][i]
        shape = list(first.shape)
        shape[axis] = seq
        full = np.full(shape, np.nan)
        for r in results:
            index = [slice(None)] * len(shape)
            index[axis] = r[0]
            full[tuple(index)] = r[i]
        return full

    assert rel_err(assemble(1, 1), out) < 1e-5
    assert rel_err(assemble(2, 2), lse) < 1e-5
    for i, g in enumerate(grads):
        assert rel_err(assemble(3 + i, 1), g) < 1e-5, ("dq", "dk", "dv")[i]


def test_traffic_counts_the_all_to_all():
    """Each rank sends each other member of its group its share of q, k, v for their heads and gets
    out and lse back: (U - 1) times one member's share of each."""
    ulysses, n, hq, hkv = 2, 4, 4, 2

    def rank_fn(ctx):
        q, out = (np.ones((1, L, hq, D), np.float32) for _ in range(2))
        k, v = (np.ones((1, L, hkv, D), np.float32) for _ in range(2))
        ctx.attention_forward(q, k, v, out)
        return ctx.traffic()

    with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
        traffic = group.run(rank_fn)
    per_member = L * (hq // ulysses) * D * 4 * 2 + 2 * L * (hkv // ulysses) * D * 4 + (hq // ulysses) * L * 4
    assert all(t.all_to_all_bytes == (ulysses - 1) * per_member for t in traffic), traffic
    assert all(t.kv_bytes > 0 for t in traffic)  # and the ring of two groups


def test_bad_grids_and_heads_that_do_not_split():
    with pytest.raises(stria.InvalidArgumentError, match="divide the world size 4"):
        stria.local_group(4, timeout_s=TIMEOUT_S, ulysses=3)
    with stria.local_group(4, timeout_s=TIMEOUT_S) as group:
        assert group[0].ulysses == 1
        with pytest.raises(stria.InvalidArgumentError, match="divide the world size"):
            group[0].ulysses = 0
        for ctx in group:
            ctx.ulysses = 4

        def rank_fn(ctx):
            q = np.ones((1, L, 6, D), np.float32)
            k = np.ones((1, L, 2, D), np.float32)
            with pytest.raises(stria.InvalidArgumentError, match="U must divide Hq"):
                ctx.attention_forward(q, k, k)
            return ctx.ulysses

        assert group.run(rank_fn) == [4] * 4
    with pytest.raises(stria.InvalidArgumentError, match="ulysses_size"):
        stria.positions("striped", 16, 4, 0, ulysses=3)


def test_torch_autograd_on_a_grid():
    """ring_attention on a grid, bf16 and float32, with softcap and sinks: the gradients of q, k, v
    and the sinks (each rank's part covers its group member's heads; summed over the ranks)."""
    torch = torch_or_skip()
    import stria.torch as stria_torch  # noqa: PLC0415 - needs torch
    from test_softcap_sinks import reference  # noqa: PLC0415 - the torch reference of S tokens

    from test_softcap_sinks import S as seq  # noqa: PLC0415

    ulysses, n, hq, hkv = 2, 4, 4, 2
    layout = "zigzag"
    gen = torch.Generator().manual_seed(5)
    q, dout = (torch.randn(B, seq, hq, D, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, seq, hkv, D, generator=gen) for _ in range(2))
    sinks = torch.rand(hq, generator=gen) - 0.5
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):

        def rank_fn(ctx, dtype=dtype):
            pos = torch.from_numpy(stria.positions(layout, seq, n, ctx.rank, ulysses=ctx.ulysses))
            ql, kl, vl = (x[:, pos].to(dtype).requires_grad_() for x in (q, k, v))
            z = sinks.clone().requires_grad_()
            out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, softcap=5.0, sinks=z)
            out.backward(dout[:, pos].to(dtype))
            return pos.numpy(), *(x.detach().double().numpy() for x in (out, ql.grad, kl.grad, vl.grad, z.grad))

        with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
            results = group.run(rank_fn)
        f64 = [x.to(dtype).double().numpy() for x in (q, k, v, dout)]
        out, _, grads, dz = reference(*f64, causal=True, softcap=5.0, sinks=sinks.double().numpy())
        for i, want in enumerate([out, *grads]):
            got = np.full(want.shape, np.nan)
            for r in results:
                got[:, r[0]] = r[1 + i]
            assert rel_err(got, want) < tol, (dtype, i)
        assert rel_err(sum(r[5] for r in results), dz) < tol


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_plan_on_a_grid(causal):
    """A document plan for the ring of 2 groups on a grid of 2 x 2: each group's slots in two pieces
    (Plan.positions/shard/unshard with ulysses), padding included, against the reference."""
    ulysses, ring, hq, hkv, seq = 2, 2, 4, 2, 29
    cu = np.array([[0, 3, 11, 29], [0, 17, 20, 29]])
    rng = np.random.default_rng(9)
    q, k, v, dout = (rng.standard_normal((B, seq, h, D)).astype(np.float32) for h in (hq, hkv, hkv, hq))
    plan = stria.Plan(cu, ring, seq_len=seq, causal=causal, tile=4)
    if plan.local_len % ulysses:
        plan = stria.Plan(cu, ring, seq_len=seq, causal=causal, tile=4, local_len=plan.local_len + 1)
    n = ulysses * ring
    # The pieces of ring rank 1 are its slots, in order.
    np.testing.assert_array_equal(
        np.concatenate([plan.positions(2 + u, ulysses=ulysses) for u in range(ulysses)], axis=1), plan.positions(1)
    )

    def rank_fn(ctx):
        ql, kl, vl, dl = (plan.shard(x, ctx.rank, ulysses=ulysses) for x in (q, k, v, dout))
        out, lse = ctx.attention_forward(ql, kl, vl, plan=plan, causal=causal)
        grads = ctx.attention_backward(ql, kl, vl, out, lse, dl, plan=plan, causal=causal)
        return out, *grads

    with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
        results = group.run(rank_fn)
    scale = 1 / np.sqrt(D)
    out, _ = attention_ref(q, k, v, causal, scale, cu)
    want = [out, *attention_backward_ref(q, k, v, dout, causal, scale, cu)]
    for i, ref in enumerate(want):
        got = np.zeros_like(ref, dtype=np.float32)
        for r, res in enumerate(results):
            plan.unshard(res[i], r, ulysses=ulysses, out=got)
        assert rel_err(got, ref) < 1e-5, ("out", "dq", "dk", "dv")[i]


def test_balance_of_a_grid():
    """The ring of groups, each member a U-th of the heads (stria_grid_analyze_balance)."""
    ring = stria.analyze_balance("zigzag", 96, 2, tile=4)
    grid = stria.analyze_balance("zigzag", 96, 8, tile=4, ulysses=4)
    assert grid.total_work == ring.total_work
    assert grid.ring_latency == pytest.approx(ring.ring_latency / 4)
    assert grid.imbalance == pytest.approx(ring.imbalance)
    with pytest.raises(stria.InvalidArgumentError, match="ulysses_size"):
        stria.analyze_balance("striped", 96, 8, ulysses=3)
