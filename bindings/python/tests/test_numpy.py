"""numpy through DLPack: ring attention forward and backward against the float64 dense reference
over every layout, rank counts 1 to 4, causal and not, GQA/MQA, float32 and float16; zero-copy
outputs; shard/unshard/positions; balance analysis against a count of visible pairs."""

from __future__ import annotations

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S
from reference import LAYOUTS, TOLERANCE, attention_backward_ref, attention_ref, positions_ref, rel_err

B, S, D = 2, 24, 16  # S divisible by 2N for N = 1..4, as zigzag needs


def run_ring(n, layout, causal, q, k, v, dout, scale=None, cu_seqlens=None, window=None):
    """Runs forward and backward on a local group of n ranks (one thread each) with NaN-poisoned
    outputs; returns the full-sequence out, lse, dq, dk, dv assembled by global position."""
    seq = q.shape[1]

    def rank_fn(ctx):
        pos = positions_ref(layout, seq, n, ctx.rank)
        ql, kl, vl, dl = (np.ascontiguousarray(x[:, pos]) for x in (q, k, v, dout))
        out = np.full_like(ql, np.nan)
        lse = np.full((ql.shape[0], ql.shape[2], ql.shape[1]), np.nan, dtype=np.float32)
        got_out, got_lse = ctx.attention_forward(
            ql, kl, vl, out, lse, layout=layout, causal=causal, softmax_scale=scale, cu_seqlens=cu_seqlens,
            window=window,
        )
        assert got_out is out and got_lse is lse
        dq, dk, dv = np.full_like(ql, np.nan), np.full_like(kl, np.nan), np.full_like(vl, np.nan)
        got = ctx.attention_backward(
            ql, kl, vl, out, lse, dl, dq, dk, dv, layout=layout, causal=causal, softmax_scale=scale,
            cu_seqlens=cu_seqlens, window=window,
        )
        assert all(a is b for a, b in zip(got, (dq, dk, dv)))
        return pos, out, lse, dq, dk, dv

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    full = [np.full(x.shape, np.nan, dtype=np.float64) for x in (q, q, k, v)]
    lse_full = np.full((q.shape[0], q.shape[2], seq), np.nan)
    for pos, out, lse, dq, dk, dv in results:
        for dst, src in zip(full, (out, dq, dk, dv)):
            dst[:, pos] = src
        lse_full[:, :, pos] = lse
    return full[0], lse_full, full[1], full[2], full[3]


def check_against_reference(n, layout, causal, hq, hkv, dtype, rng, scale=None, cu_seqlens=None, window=None):
    q, k, v, dout = (rng.standard_normal((B, S, h, D)).astype(dtype) for h in (hq, hkv, hkv, hq))
    ref_scale = 1.0 / np.sqrt(D) if scale is None else scale
    ref_out, ref_lse = attention_ref(q, k, v, causal, ref_scale, cu_seqlens, window)
    ref_grads = attention_backward_ref(q, k, v, dout, causal, ref_scale, cu_seqlens, window)
    out, lse, *grads = run_ring(n, layout, causal, q, k, v, dout, scale, cu_seqlens, window)
    tol = TOLERANCE[np.dtype(dtype).name]
    errors = {"out": rel_err(out, ref_out), "lse": rel_err(lse, ref_lse)}
    errors.update({name: rel_err(g, r) for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
    bad = {name: e for name, e in errors.items() if not e < tol}
    assert not bad, f"relative errors above {tol}: {bad}"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_float32_matches_reference(n, layout, causal, heads, rng):
    check_against_reference(n, layout, causal, *heads, np.float32, rng)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_float16_matches_reference(n, layout, causal, rng):
    check_against_reference(n, layout, causal, 4, 2, np.float16, rng)


# Packed documents: the same boundaries for both batch rows, and a row each (the second with
# fewer documents, padded by repeating S, one of them empty).
DOCUMENTS = {"shared": [0, 5, 13, 24], "per_row": [[0, 7, 7, 20, 24], [0, 11, 24, 24, 24]]}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("docs", list(DOCUMENTS), ids=list(DOCUMENTS))
def test_documents_match_reference(n, layout, causal, docs, rng):
    check_against_reference(n, layout, causal, 4, 2, np.float32, rng, cu_seqlens=DOCUMENTS[docs])


def test_documents_float16_and_numpy_boundaries(rng):
    check_against_reference(3, "striped", True, 2, 1, np.float16, rng, cu_seqlens=np.array([0, 9, 24], np.int32))


@pytest.mark.parametrize(
    ("cu_seqlens", "error", "needle"),
    [
        ([0.0, 24.0], TypeError, "integers"),
        ([[0, 24]], ValueError, "B = 2"),
        ([[[0, 24]]], ValueError, "shape"),
        ([24], ValueError, "n >= 1"),
        ([0, 12], stria.InvalidArgumentError, "sequence length"),
        ([0, 13, 12, 24], stria.InvalidArgumentError, "decreases"),
    ],
)
def test_bad_documents_raise(cu_seqlens, error, needle):
    q = np.zeros((B, S, 2, D), np.float32)
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        ctx = group[0]
        with pytest.raises(error, match=needle):
            ctx.attention_forward(q, q, q, cu_seqlens=cu_seqlens)
        ctx.attention_forward(q, q, q, cu_seqlens=[0, 1, 24])  # still usable


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("causal", "window"), [(True, (5, -1)), (False, (4, 3)), (False, (-1, 0)), (False, (0, 1))])
def test_sliding_window_matches_reference(n, layout, causal, window, rng):
    check_against_reference(n, layout, causal, 4, 2, np.float32, rng, window=window)


def test_a_window_of_zero_sees_only_itself(rng):
    """Each query sees its own key alone: out is v (its KV head's), lse the one score; the
    gradients of q and k vanish (softmax of one score), which a relative error cannot measure."""
    q, k, v, dout = (rng.standard_normal((B, S, h, D)).astype(np.float32) for h in (4, 2, 2, 4))
    out, lse, dq, dk, dv = run_ring(3, "striped", True, q, k, v, dout, window=(0, -1))
    assert rel_err(out, np.repeat(v, 2, axis=2)) < 1e-6
    assert rel_err(lse, np.einsum("bshd,bshd->bhs", q, np.repeat(k, 2, axis=2)) / np.sqrt(D)) < 1e-5
    assert np.abs(dq).max() < 1e-5 and np.abs(dk).max() < 1e-5
    assert rel_err(dv, dout.reshape(B, S, 2, 2, D).sum(axis=3)) < 1e-5


def test_sliding_window_with_documents_and_float16(rng):
    check_against_reference(3, "zigzag", True, 4, 2, np.float16, rng, cu_seqlens=DOCUMENTS["per_row"], window=(6, -1))
    check_against_reference(2, "striped", False, 2, 1, np.float32, rng, cu_seqlens=DOCUMENTS["shared"], window=(3, 2))


@pytest.mark.parametrize(
    ("window", "error", "needle"),
    [((-2, 3), ValueError, "left must be an integer >= 0"), ((3, 1.5), ValueError, "right"), (7, TypeError, "(left, right)"),
     ((True, 3), ValueError, "left")],
)
def test_bad_windows_raise(window, error, needle):
    q = np.zeros((B, S, 2, D), np.float32)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        with pytest.raises(error, match=needle):
            ctx.attention_forward(q, q, q, window=window)
        assert stria.sliding_window((-1, -1)) is None  # no window: the plain call
        ctx.attention_forward(q, q, q, window=(2, -1))


def test_explicit_softmax_scale(rng):
    check_against_reference(3, "zigzag", True, 2, 1, np.float32, rng, scale=0.37)


def test_outputs_are_written_in_place_through_strided_views(rng):
    """Zero-copy: q/k/v are views into one packed QKV buffer and out is a view into a wider
    array; the library writes the very memory of the objects passed, and nothing around it."""
    seq, h = 12, 2
    qkv = rng.standard_normal((1, seq, 3, h, D)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    wide = np.full((1, seq, h, 2 * D), np.nan, dtype=np.float32)
    out = wide[..., :D]
    lse = np.full((1, h, seq), np.nan, dtype=np.float32)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        got_out, got_lse = ctx.attention_forward(q, k, v, out, lse, layout="contiguous", causal=True)
    assert got_out is out and got_lse is lse
    assert np.shares_memory(got_out, wide)
    ref_out, ref_lse = attention_ref(q, k, v, True, 1.0 / np.sqrt(D))
    assert rel_err(wide[..., :D], ref_out) < 1e-5
    assert rel_err(lse, ref_lse) < 1e-5
    assert np.isnan(wide[..., D:]).all(), "the library wrote outside the out view"


def test_outputs_allocated_like_the_inputs(rng):
    q = rng.standard_normal((1, 8, 2, D)).astype(np.float16)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out, lse = ctx.attention_forward(q, q, q, causal=False)
        dq, dk, dv = ctx.attention_backward(q, q, q, out, lse, out, causal=False)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16 and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (1, 2, 8)
    assert all(g.dtype == np.float16 and g.shape == q.shape for g in (dq, dk, dv))
    ref_out, ref_lse = attention_ref(q, q, q, False, 1.0 / np.sqrt(D))
    assert rel_err(out, ref_out) < 2e-2 and rel_err(lse, ref_lse) < 2e-2


def test_read_only_inputs_are_borrowed(rng):
    """numpy's __dlpack__ refuses read-only arrays; const inputs are then borrowed through the
    buffer protocol (still no copy)."""
    q = rng.standard_normal((1, 8, 2, D)).astype(np.float32)
    q.flags.writeable = False
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out, lse = ctx.attention_forward(q, q, q, causal=True)
    ref_out, _ = attention_ref(q, q, q, True, 1.0 / np.sqrt(D))
    assert rel_err(out, ref_out) < 1e-5


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_match_the_design_table(n, layout):
    for r in range(n):
        np.testing.assert_array_equal(stria.positions(layout, 48, n, r), positions_ref(layout, 48, n, r))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seq_dim", [1, -3, 0])
def test_shard_and_unshard(n, layout, seq_dim, rng):
    shape = [2, 24, 3, 5]
    if seq_dim == 0:
        shape = [24, 4, 5]
    full = rng.standard_normal(shape).astype(np.float32)
    rebuilt = np.full_like(full, np.nan)
    for r in range(n):
        pos = positions_ref(layout, 24, n, r)
        local = stria.shard(full, n, r, layout=layout, seq_dim=seq_dim)
        np.testing.assert_array_equal(local, np.take(full, pos, axis=seq_dim))
        assert stria.unshard(local, n, r, layout=layout, seq_dim=seq_dim, out=rebuilt) is rebuilt
        alone = stria.unshard(local, n, r, layout=layout, seq_dim=seq_dim)  # zero but for this rank
        np.testing.assert_array_equal(np.take(alone, pos, axis=seq_dim), local)
        assert np.count_nonzero(alone) == np.count_nonzero(local)
    np.testing.assert_array_equal(rebuilt, full)


def visible_pairs(layout, causal, seq, n, r, s):
    """Work of rank r at ring step s, at tile 1: its queries x the keys of rank (r - s) mod n
    that they see (key position <= query position when causal)."""
    qpos = positions_ref(layout, seq, n, r)
    kpos = positions_ref(layout, seq, n, (r - s) % n)
    return int((kpos[None, :] <= qpos[:, None]).sum()) if causal else qpos.size * kpos.size


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_balance_counts_visible_pairs(n, layout, causal):
    seq = 48
    work = np.array([[visible_pairs(layout, causal, seq, n, r, s) for r in range(n)] for s in range(n)], float)
    np.testing.assert_array_equal(stria.analyze_balance_steps(layout, seq, n, causal=causal), work)
    b = stria.analyze_balance(layout, seq, n, causal=causal)
    total, latency = work.sum(), work.max(axis=1).sum()
    assert b.total_work == total and b.ring_latency == latency
    assert b.speedup == pytest.approx(total / latency)
    assert b.imbalance == pytest.approx(latency / (total / n))


def test_balance_ranks_the_layouts():
    """Striped and zigzag balance causal work; contiguous leaves the last rank all the work."""
    got = {lay: stria.analyze_balance(lay, 4096, 4).imbalance for lay in LAYOUTS}
    assert got["striped"] < 1.01 and got["zigzag"] < 1.01
    assert got["contiguous"] > 1.5


def test_deterministic_setting_and_per_call_override(rng):
    q, k, v, dout = (rng.standard_normal((B, S, 2, D)).astype(np.float32) for _ in range(4))
    ref_grads = attention_backward_ref(q, k, v, dout, True, 1.0 / np.sqrt(D))
    with stria.Context() as ctx:
        assert ctx.deterministic is False
        ctx.deterministic = True
        assert ctx.deterministic is True
        out, lse = ctx.attention_forward(q, k, v)
        first = ctx.attention_backward(q, k, v, out, lse, dout)
        # A call may ask otherwise for itself; the CPU backend gives the same bits either way.
        second = ctx.attention_backward(q, k, v, out, lse, dout, deterministic=False)
        assert ctx.deterministic is True
        for a, b, r in zip(first, second, ref_grads):
            assert np.array_equal(a, b)
            assert rel_err(a, r) < TOLERANCE["float32"]
    with pytest.raises(stria.InvalidArgumentError, match="closed"):
        ctx.deterministic = False
