"""Logit softcapping and attention sinks through the Python front ends: numpy arrays on the package's
own calls, and stria.torch's autograd (the sinks a differentiable weight), against a float64
reference of the whole sequence written with torch's autograd, on local groups of CPU ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import LAYOUTS, TOLERANCE, positions_ref, rel_err

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch

B, S, HQ, HKV, D = 2, 24, 4, 2, 16
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def reference(q, k, v, dout, *, causal, softcap=None, sinks=None, cu_seqlens=None, window=None, stored_as=None):
    """out, lse and the gradients of q, k, v (and of sinks) in float64, by torch's autograd over the
    whole sequence (of any length: q's second dimension): softcap * tanh(s / softcap) on the scores,
    the sinks as one more column of each row's softmax that carries no value. A row that sees
    nothing has output 0 and lse -inf.

    stored_as (a 16-bit torch dtype): the gradients a backward gets from the output as the caller
    stored it, rounded to that dtype, as every flash backward does: each row's rowsum(dO * O) then
    comes from the rounded O. (Where dP - rowsum(dO * O) cancels, that rounding alone moves the
    gradients by percents.) The term added below has gradient (rowsum(dO * O) - that) * P on the
    scores, which turns the exact rowsum into the stored one's."""
    q, k, v = (torch.as_tensor(np.asarray(x, np.float64)).requires_grad_() for x in (q, k, v))
    S = q.shape[1]  # noqa: N806 - the sequence's length, as the module's S
    z = None if sinks is None else torch.as_tensor(np.asarray(sinks, np.float64)).requires_grad_()
    group = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    visible = torch.ones(S, S, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
    visible = visible.expand(q.shape[0], S, S).clone()
    if cu_seqlens is not None:
        cu = np.broadcast_to(np.asarray(cu_seqlens), (q.shape[0], np.asarray(cu_seqlens).shape[-1]))
        for b in range(q.shape[0]):
            doc = torch.as_tensor(np.searchsorted(cu[b], np.arange(S), side="right"))
            visible[b] &= doc[:, None] == doc[None, :]
    s = s.masked_fill(~visible[:, None], -math.inf)
    if z is not None:
        s = torch.cat([s, z[None, :, None, None].expand(q.shape[0], -1, S, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])[..., :S].nan_to_num(nan=0.0)  # a row with no key: -inf - -inf
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    d = torch.as_tensor(np.asarray(dout, np.float64))
    loss = (out * d).sum()
    if stored_as is not None:
        exact = (out * d).sum(-1).detach()
        stored = (out.detach().to(stored_as).to(torch.float64) * d).sum(-1)
        seen = torch.isfinite(lse)
        loss = loss + ((exact - stored).transpose(1, 2) * torch.where(seen, lse, 0.0)).sum()
    loss.backward()
    grads = [x.grad.numpy() for x in (q, k, v)]
    return out.detach().numpy(), lse.detach().numpy(), grads, None if z is None else z.grad.numpy()


def inputs(seed, dtype=torch.float32, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (spread * torch.randn(B, S, h, D, generator=gen) for h in (HQ, HKV))
    v, dout = (torch.randn(B, S, h, D, generator=gen) for h in (HKV, HQ))
    sinks = torch.rand(HQ, generator=gen) * 4 - 0.5
    return [x.to(dtype) for x in (q, k, v, dout)] + [sinks]


def f64(x):
    return x.detach().to(torch.float64).numpy()


def assemble(parts, axis):
    """The full sequence from (positions, array) pairs along `axis`."""
    shape = list(parts[0][1].shape)
    shape[axis] = S
    full = np.full(shape, np.nan)
    for pos, a in parts:
        index = [slice(None)] * len(shape)
        index[axis] = pos
        full[tuple(index)] = a
    return full


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_torch_autograd_with_softcap_and_sinks(n, layout, causal, dtype):
    """ring_attention with both, the sinks a bf16-or-float32 weight that requires grad: out, dq, dk,
    dv, and the sinks' gradient summed over the ranks."""
    q, k, v, dout, sinks = inputs(n * 31 + len(layout), DTYPES[dtype], spread=2.0)
    softcap = 6.0

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].clone().requires_grad_() for x in (q, k, v))
        z = sinks.clone().to(DTYPES[dtype]).requires_grad_()
        out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, causal=causal, softcap=softcap, sinks=z)
        out.backward(dout[:, pos])
        assert z.grad.dtype == z.dtype
        return pos.numpy(), f64(out), f64(ql.grad), f64(kl.grad), f64(vl.grad), f64(z.grad)

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got = [assemble([(r[0], r[i]) for r in results], 1) for i in range(1, 5)]
    z_used = f64(sinks.to(DTYPES[dtype]))  # the values the ranks were given
    out, _, grads, dz = reference(f64(q), f64(k), f64(v), f64(dout), causal=causal, softcap=softcap, sinks=z_used)
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, [out, *grads])}
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors
    dz_got = sum(r[5] for r in results)
    if dtype == "float32":
        assert rel_err(dz_got, dz) < TOLERANCE[dtype], (dz_got, dz)
    else:  # stored in the sinks' own 16-bit dtype: its rounding, and the rounded outputs' terms
        assert np.allclose(dz_got, dz, rtol=5e-2, atol=5e-2 * np.abs(dz).max()), (dz_got, dz)


def test_numpy_calls_with_softcap_sinks_documents_and_window():
    """The package's own calls on numpy arrays, everything through params: documents, a window, the
    softcap and the sinks; lse includes the sinks, dsinks comes back as the fourth result."""
    q, k, v, dout, sinks = (f64(x).astype(np.float32) for x in inputs(3, spread=2.0))
    cu = np.array([[0, 5, 17, 24], [0, 12, 24, 24]])
    n, layout, window, softcap = 3, "zigzag", (7, 2), 4.0

    def rank_fn(ctx):
        pos = positions_ref(layout, S, n, ctx.rank)
        ql, kl, vl, dl = (np.ascontiguousarray(x[:, pos]) for x in (q, k, v, dout))
        kwargs = dict(layout=layout, causal=False, cu_seqlens=cu, window=window, softcap=softcap, sinks=sinks)
        out, lse = ctx.attention_forward(ql, kl, vl, **kwargs)
        grads = ctx.attention_backward(ql, kl, vl, out, lse, dl, **kwargs)
        assert len(grads) == 4 and grads[3].dtype == np.float32 and grads[3].shape == (HQ,)
        return pos, out, lse, *grads

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    out, lse, grads, dz = reference(q, k, v, dout, causal=False, softcap=softcap, sinks=sinks, cu_seqlens=cu,
                                    window=window)
    assert rel_err(assemble([(r[0], r[1]) for r in results], 1), out) < 1e-5
    assert rel_err(assemble([(r[0], r[2]) for r in results], 2), lse) < 1e-5
    for i, g in enumerate(grads):
        assert rel_err(assemble([(r[0], r[3 + i]) for r in results], 1), g) < 1e-5
    assert rel_err(sum(r[6] for r in results), dz) < 1e-5


def test_sdpa_takes_softcap_and_sinks_and_checks_them():
    """The torch-shaped function passes both on; a softcap that is not a number and sinks that are
    not a tensor of Hq values are refused with the argument named."""
    q, k, v, _, sinks = inputs(8)
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        ctx = group[0]
        out = stria_torch.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, context=ctx, softcap=5.0,
            sinks=sinks,
        )
        ref, *_ = reference(f64(q), f64(k), f64(v), np.zeros((B, S, HQ, D)), causal=True, softcap=5.0,
                            sinks=f64(sinks))
        assert rel_err(f64(out.transpose(1, 2)), ref) < 1e-5
        with pytest.raises(TypeError, match="softcap"):
            stria_torch.ring_attention(q, k, v, ctx, softcap="5")
        with pytest.raises(TypeError, match="sinks"):
            stria_torch.ring_attention(q, k, v, ctx, sinks=[1.0] * HQ)
        with pytest.raises(stria.InvalidArgumentError, match="sinks"):
            stria_torch.ring_attention(q, k, v, ctx, sinks=torch.zeros(HQ + 1))
        with pytest.raises(stria.InvalidArgumentError, match="softcap"):
            ctx.attention_forward(f64(q).astype(np.float32), *(f64(x).astype(np.float32) for x in (k, v)),
                                  softcap=-1.0)
