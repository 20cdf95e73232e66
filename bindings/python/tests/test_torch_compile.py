"""stria.torch under torch.compile. The collectives are torch custom operators with fake (shape
only) implementations and a registered autograd, so a compiled function keeps ring attention in
its graph (fullgraph=True) and matches eager mode and the float64 reference, in a world of one
and in a ring of threads; torch.library.opcheck holds the registrations (schema, fake against
real, autograd) to torch's rules; and a graph compiled for a context that has since closed
raises instead of touching it."""

from __future__ import annotations

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import attention_backward_ref, attention_ref, rel_err

torch = torch_or_skip()
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch before 2.4 has no torch.library.custom_op", allow_module_level=True)
import stria.torch as stria_torch  # noqa: E402 - needs torch

B, S, HQ, HKV, D = 2, 24, 4, 2, 16


def inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=gen)
    k = torch.randn(B, S, HKV, D, generator=gen)
    v = torch.randn(B, S, HKV, D, generator=gen)
    w = torch.randn(B, S, HQ, D, generator=gen)
    return q, k, v, w


def f64(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(torch.float64).numpy()


def test_opcheck_holds_the_operators_to_torch_s_rules():
    q, k, v, _ = inputs(1)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        args = (ctx._key, int(stria.Layout.STRIPED), True, 0.0)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        torch.library.opcheck(torch.ops.stria.attention_forward.default, (*leaves, *args))
        out, lse = torch.ops.stria.attention_forward(q, k, v, *args)
        dout = torch.randn_like(out)
        torch.library.opcheck(torch.ops.stria.attention_backward.default, (q, k, v, out, lse, dout, *args))


@pytest.mark.parametrize(
    ("causal", "masks"),
    [(True, (torch.tensor([0, 9, 24]),)), (False, (torch.tensor([0, 9, 24]), 4, 2))],
    ids=["documents", "documents_and_window"],
)
def test_opcheck_with_masks(causal, masks):
    """The operators' optional arguments: document boundaries, then a sliding window too."""
    q, k, v, _ = inputs(3)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        args = (ctx._key, int(stria.Layout.STRIPED), causal, 0.0, *masks)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        torch.library.opcheck(torch.ops.stria.attention_forward.default, (*leaves, *args))
        out, lse = torch.ops.stria.attention_forward(q, k, v, *args)
        torch.library.opcheck(torch.ops.stria.attention_backward.default, (q, k, v, out, lse, torch.randn_like(out), *args))


def test_fullgraph_compile_with_a_window_matches_the_reference():
    q, k, v, w = inputs(6)
    q.requires_grad_()
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:

        def loss(q):
            out = stria_torch.ring_attention(q, k, v, ctx, window=(5, -1))
            return (out * w).sum(), out

        value, out = torch.compile(loss, fullgraph=True)(q)
        (dq,) = torch.autograd.grad(value, (q,))
    scale = 1 / np.sqrt(D)
    assert rel_err(f64(out), attention_ref(f64(q), f64(k), f64(v), True, scale, None, (5, -1))[0]) < 1e-5
    ref_dq = attention_backward_ref(f64(q), f64(k), f64(v), f64(w), True, scale, None, (5, -1))[0]
    assert rel_err(f64(dq), ref_dq) < 1e-5


def test_fullgraph_compile_with_documents_matches_the_reference():
    q, k, v, w = inputs(4)
    q.requires_grad_()
    cu_seqlens = torch.tensor([[0, 10, 24], [0, 3, 24]])
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:

        def loss(q):
            out = stria_torch.ring_attention(q, k, v, ctx, causal=False, cu_seqlens=cu_seqlens)
            return (out * w).sum(), out

        value, out = torch.compile(loss, fullgraph=True)(q)
        (dq,) = torch.autograd.grad(value, (q,))
    scale = 1 / np.sqrt(D)
    docs = cu_seqlens.numpy()
    assert rel_err(f64(out), attention_ref(f64(q), f64(k), f64(v), False, scale, docs)[0]) < 1e-5
    assert rel_err(f64(dq), attention_backward_ref(f64(q), f64(k), f64(v), f64(w), False, scale, docs)[0]) < 1e-5


def test_operators_stay_out_of_cuda_graphs():
    """A collective waits on the host for its peers: a CUDA graph's replay would skip that."""
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip("this torch has no cudagraph_unsafe tag")
    for op in (torch.ops.stria.attention_forward.default, torch.ops.stria.attention_backward.default):
        assert torch.Tag.cudagraph_unsafe in op.tags


def test_fullgraph_compile_matches_eager_and_the_reference():
    """k and v one tensor (an autograd.Function would refuse it under compile), causal, GQA."""
    q, k, _, w = inputs(2)
    q.requires_grad_()
    k.requires_grad_()
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:

        def loss(q, kv):
            out = stria_torch.ring_attention(q * 1.5, kv, kv, ctx, causal=True)
            return (out * w).sum(), out

        eager_loss, eager_out = loss(q, k)
        eager_grads = torch.autograd.grad(eager_loss, (q, k))
        compiled_loss, compiled_out = torch.compile(loss, fullgraph=True)(q, k)
        compiled_grads = torch.autograd.grad(compiled_loss, (q, k))
    assert rel_err(f64(compiled_out), f64(eager_out)) < 1e-6
    for got, want in zip(compiled_grads, eager_grads):
        assert rel_err(f64(got), f64(want)) < 1e-6
    scale = 1 / np.sqrt(D)
    qs, kv = f64(q) * 1.5, f64(k)
    assert rel_err(f64(compiled_out), attention_ref(qs, kv, kv, True, scale)[0]) < 1e-5
    dq, dk, dv = attention_backward_ref(qs, kv, kv, f64(w), True, scale)
    assert rel_err(f64(compiled_grads[0]), 1.5 * dq) < 1e-5
    assert rel_err(f64(compiled_grads[1]), dk + dv) < 1e-5


@pytest.mark.parametrize("n, layout", [(3, "zigzag"), (2, "striped")])
def test_compiled_sdpa_in_a_ring_of_threads(n, layout):
    """Each rank compiles the SDPA-shaped function on its own thread (a graph per context) and
    runs it in the ring: out and the gradients of every rank against the full sequence's."""
    q, k, v, w = inputs(3)

    def rank_fn(ctx):
        pos = torch.from_numpy(stria.positions(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].transpose(1, 2).clone().requires_grad_() for x in (q, k, v))

        def loss(q, k, v):
            out = stria_torch.scaled_dot_product_attention(q, k, v, is_causal=True, context=ctx, layout=layout)
            return (out * w[:, pos].transpose(1, 2)).sum(), out

        value, out = torch.compile(loss, fullgraph=True)(ql, kl, vl)
        grads = torch.autograd.grad(value, (ql, kl, vl))
        return pos, out.transpose(1, 2), [g.transpose(1, 2) for g in grads]

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    scale = 1 / np.sqrt(D)
    out_ref, _ = attention_ref(f64(q), f64(k), f64(v), True, scale)
    grads_ref = attention_backward_ref(f64(q), f64(k), f64(v), f64(w), True, scale)
    for rank, (pos, out, grads) in enumerate(results):
        assert rel_err(f64(out), out_ref[:, pos]) < 1e-5, rank
        for name, got, ref in zip("qkv", grads, grads_ref):
            assert rel_err(f64(got), ref[:, pos]) < 1e-5, (rank, name)


def test_a_graph_compiled_for_a_closed_context_raises():
    q, k, v, _ = inputs(4)
    ctx = stria.Context(timeout_s=TIMEOUT_S)
    attend = torch.compile(lambda q, k, v: stria_torch.ring_attention(q, k, v, ctx), fullgraph=True)
    attend(q, k, v)
    ctx.close()
    with pytest.raises(ValueError, match="closed"):
        attend(q, k, v)
