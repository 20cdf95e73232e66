"""PyTorch: tensors through DLPack (float32, float16, bfloat16), the autograd function against the
float64 reference, the SDPA-shaped function against torch's own SDPA in float64 on the full
sequence, strided views passed without a copy, and a training step of a small model whose
gradients, summed over the ranks' threads, match the full-sequence model's."""

from __future__ import annotations

import copy
import gc
import math

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import LAYOUTS, TOLERANCE, attention_backward_ref, attention_ref, positions_ref, rel_err

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

B, S, D = 2, 24, 16
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def as_f64(x):
    return x.detach().to(torch.float64).numpy()


def assemble(parts, seq, axis):
    """Full-sequence float64 array from (positions, tensor) pairs along `axis`."""
    pos0, t0 = parts[0]
    shape = list(t0.shape)
    shape[axis] = seq
    full = np.full(shape, np.nan)
    for pos, t in parts:
        index = [slice(None)] * len(shape)
        index[axis] = pos
        full[tuple(index)] = as_f64(t)
    return full


def check_autograd(n, layout, dtype, seed, causal=True, cu_seqlens=None, window=None):
    """ring_attention's output and gradients on n ranks against the float64 reference of the whole
    sequence; returns the ranks' results (positions, out, dq, dk, dv)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(B, S, h, D, generator=gen).to(DTYPES[dtype]) for h in (4, 2, 2, 4))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].clone().requires_grad_() for x in (q, k, v))
        out = stria_torch.ring_attention(
            ql, kl, vl, ctx, layout=layout, causal=causal, cu_seqlens=cu_seqlens, window=window
        )
        out.backward(dout[:, pos])
        return pos.numpy(), out, ql.grad, kl.grad, vl.grad

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got = [assemble([(r[0], r[i]) for r in results], S, 1) for i in range(1, 5)]
    scale = 1.0 / math.sqrt(D)
    docs = None if cu_seqlens is None else np.asarray(cu_seqlens)
    ref = [
        attention_ref(as_f64(q), as_f64(k), as_f64(v), causal, scale, docs, window)[0],
        *attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), causal, scale, docs, window),
    ]
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors
    return results


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_autograd_matches_reference(n, layout, causal, dtype):
    results = check_autograd(n, layout, dtype, n * 100 + len(layout), causal=causal)
    assert all(r[1].dtype == DTYPES[dtype] and r[2].dtype == DTYPES[dtype] for r in results)


def test_deterministic_algorithms_reach_the_library():
    """torch.use_deterministic_algorithms(True) asks the backward for reproducible bits: stria.torch
    passes that to the library for the call (on the CPU the bits are the same either way), and the
    context's own setting is left as it was."""
    seen = []

    def rank_fn(ctx):
        q = torch.randn(1, 8, 2, D, requires_grad=True)
        stria_torch.ring_attention(q, q, q, ctx).sum().backward()
        seen.append((ctx.deterministic, ctx._applied_deterministic))
        ctx.attention_backward(*(np.ones((1, 8, 2, D), np.float32) for _ in range(4)), np.zeros((1, 2, 8), np.float32),
                               np.ones((1, 8, 2, D), np.float32))
        seen.append((ctx.deterministic, ctx._applied_deterministic))

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        check_autograd(2, "striped", "float32", 7)
        with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
            group.run(rank_fn)
    finally:
        torch.use_deterministic_algorithms(previous)
    # On for torch's call; off again for a plain call, as the context's own setting says.
    assert seen == [(False, True), (False, False)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_documents_autograd_matches_reference(n, layout, dtype):
    """Packed documents, a row each (a torch tensor), the second row padded with an empty one."""
    check_autograd(n, layout, dtype, n * 10 + len(layout), cu_seqlens=torch.tensor([[0, 7, 16, 24], [0, 11, 24, 24]]))


@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("causal", "window"), [(True, (6, -1)), (False, (3, 5))])
def test_sliding_window_autograd_matches_reference(n, layout, causal, window):
    check_autograd(n, layout, "float32", n * 7 + len(layout), causal=causal, window=window)


def test_sliding_window_with_documents_and_sdpa():
    check_autograd(3, "zigzag", "bfloat16", 5, cu_seqlens=[0, 9, 24], window=(4, -1))
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(B, 2, S, D, generator=gen)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out = stria_torch.scaled_dot_product_attention(q, q, q, is_causal=True, context=ctx, window=(3, -1))
        with pytest.raises(ValueError, match="window left"):
            stria_torch.ring_attention(q, q, q, ctx, window=(-3, 0))
    ref = attention_ref(as_f64(q.transpose(1, 2)), as_f64(q.transpose(1, 2)), as_f64(q.transpose(1, 2)), True,
                        1 / math.sqrt(D), None, (3, -1))[0]
    assert rel_err(as_f64(out.transpose(1, 2)), ref) < 1e-5


def test_documents_are_integers_of_q_s_batch():
    q = torch.zeros(B, S, 2, D)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        with pytest.raises(TypeError, match="integers"):
            stria_torch.ring_attention(q, q, q, ctx, cu_seqlens=torch.tensor([0.0, 24.0]))
        with pytest.raises(ValueError, match="B = 2"):
            stria_torch.ring_attention(q, q, q, ctx, cu_seqlens=[[0, 24]] * 3)
        with pytest.raises(stria.InvalidArgumentError, match="sequence length"):
            stria_torch.ring_attention(q, q, q, ctx, cu_seqlens=[0, 12])
        out = stria_torch.scaled_dot_product_attention(
            q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), is_causal=True, context=ctx, cu_seqlens=[0, 5, 24]
        )
        assert out.shape == (B, 2, S, D)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_preallocated_outputs_are_written_in_place(dtype):
    """The torch tensors passed as outputs (NaN-poisoned) are the ones written and returned."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, 16, 2, D, generator=gen).to(DTYPES[dtype]) for _ in range(4))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 16), float("nan"))
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    pointers = [t.data_ptr() for t in (out, lse, dq, dk, dv)]
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        got = ctx.attention_forward(q, k, v, out, lse, causal=True)
        assert got[0] is out and got[1] is lse
        got = ctx.attention_backward(q, k, v, out, lse, dout, dq, dk, dv, causal=True)
        assert all(a is b for a, b in zip(got, (dq, dk, dv)))
    assert [t.data_ptr() for t in (out, lse, dq, dk, dv)] == pointers
    scale = 1.0 / math.sqrt(D)
    ref_out, ref_lse = attention_ref(as_f64(q), as_f64(k), as_f64(v), True, scale)
    ref_grads = attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), True, scale)
    assert rel_err(as_f64(out), ref_out) < TOLERANCE[dtype]
    assert rel_err(as_f64(lse), ref_lse) < TOLERANCE[dtype]
    for g, r in zip((dq, dk, dv), ref_grads):
        assert rel_err(as_f64(g), r) < TOLERANCE[dtype]


def test_outputs_allocated_as_torch_tensors():
    q = torch.randn(1, 8, 2, D, dtype=torch.bfloat16, requires_grad=True)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out, lse = ctx.attention_forward(q, q, q)
        local = stria.shard(q.detach(), 2, 1)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (1, 2, 8)
    assert isinstance(local, torch.Tensor) and torch.equal(local, q.detach()[:, 1::2])


def full_sdpa_reference(q, k, v, dout, causal):
    """torch's own SDPA in float64 on the whole sequence: output and input gradients."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=True)
    out.backward(dout.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def sharded_sdpa(q, k, v, dout, n, layout="striped", **kwargs):
    """stria.torch's SDPA on a local group of n, each rank on its shard of the whole [B, H, S, D]
    tensors by `layout`: the output and the gradients of q, k and v, reassembled whole."""

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, :, pos].clone().requires_grad_() for x in (q, k, v))
        out = stria_torch.scaled_dot_product_attention(ql, kl, vl, context=ctx, layout=layout, **kwargs)
        out.backward(dout[:, :, pos])
        return pos.numpy(), out, ql.grad, kl.grad, vl.grad

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    return [assemble([(r[0], r[i]) for r in results], S, 2) for i in range(1, 5)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_sdpa_shaped_function_matches_torch_sdpa(n, layout, causal):
    gen = torch.Generator().manual_seed(11 + n)
    hq, hkv = 6, 2
    q, k, v, dout = (torch.randn(B, h, S, D, generator=gen) for h in (hq, hkv, hkv, hq))
    ref = [x.numpy() for x in full_sdpa_reference(q, k, v, dout, causal)]
    got = sharded_sdpa(q, k, v, dout, n, layout=layout, is_causal=causal, enable_gqa=True)
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    assert all(e < 1e-5 for e in errors.values()), errors


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dv", [D // 2, D + 8], ids=["narrower", "wider"])
@pytest.mark.parametrize("scale", [None, 0.3], ids=["default_scale", "scale"])
def test_sdpa_value_heads_of_another_width_match_torch_sdpa(n, dv, scale):
    """Value heads narrower than the query's and key's (multi-head latent attention) or wider, as
    torch's SDPA takes them: the output has the value's width, the gradients every input's, the
    default scale is the query's 1/sqrt(D)."""
    gen = torch.Generator().manual_seed(7 + n)
    q, k, dout = (torch.randn(B, h, S, d, generator=gen) for h, d in ((4, D), (2, D), (4, dv)))
    v = torch.randn(B, 2, S, dv, generator=gen)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, scale=scale, enable_gqa=True)
    want.backward(dout.double())
    ref = [x.detach().numpy() for x in (want, q64.grad, k64.grad, v64.grad)]
    got = sharded_sdpa(q, k, v, dout, n, is_causal=True, scale=scale)
    assert got[0].shape == (B, 4, S, dv)
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    assert all(e < 1e-5 for e in errors.values()), errors


def test_sdpa_views_reach_the_library_without_a_copy(monkeypatch):
    """SDPA's [B, H, L, D] tensors are handed to stria as transposed views of the same memory."""
    seen = []
    forward = stria.capi.stria_py_attention_forward

    def spy(ctx, params, cu_seqlens, q, k, v, out, lse, sinks, *descales_and_stream):
        seen.extend((t.data_ptr(), t.stride()) for t in (q, k, v))
        return forward(ctx, params, cu_seqlens, q, k, v, out, lse, sinks, *descales_and_stream)

    monkeypatch.setattr(stria.capi, "stria_py_attention_forward", spy)
    qkv = torch.randn(1, 3, 16, 3 * D)  # [B, H, L, 3D]: q, k, v are slices of one projection
    q, k, v = qkv.split(D, dim=-1)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out = stria_torch.scaled_dot_product_attention(q, k, v, is_causal=True, context=ctx)
    assert seen == [(t.data_ptr(), t.transpose(1, 2).stride()) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert rel_err(out.numpy(), ref.numpy()) < 1e-5


def test_sdpa_refuses_what_it_cannot_do():
    q = torch.randn(1, 2, 8, D)
    with stria.Context() as ctx:
        with pytest.raises(NotImplementedError, match="attn_mask"):
            stria_torch.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool), context=ctx)
        with pytest.raises(NotImplementedError, match="dropout"):
            stria_torch.scaled_dot_product_attention(q, q, q, dropout_p=0.1, context=ctx)
        with pytest.raises(ValueError, match=r"\[B, H, L, D\]"):
            stria_torch.scaled_dot_product_attention(q[0], q[0], q[0], context=ctx)
        with pytest.raises(stria.InvalidArgumentError):
            stria_torch.ring_attention(q, q[:, :1], q, ctx)


def test_sdpa_names_the_shapes_the_caller_passed():
    """Shape errors of the SDPA-shaped function describe its [B, H, L, D] arguments, not the
    [B, L, H, D] views it hands the library."""
    q, k = torch.randn(1, 2, 8, D), torch.randn(1, 2, 4, D)
    with stria.Context() as ctx:
        with pytest.raises(ValueError, match=r"key has shape \(1, 2, 4, 16\).*query \(1, 2, 8, 16\)"):
            stria_torch.scaled_dot_product_attention(q, k, k, context=ctx)
        with pytest.raises(ValueError, match=r"key has shape \(1, 2, 8, 8\)"):  # only the value may be narrower
            stria_torch.scaled_dot_product_attention(q, q[..., :8], q, context=ctx)
        with pytest.raises(ValueError, match="query's 3 heads are not a multiple of key's 2"):
            stria_torch.scaled_dot_product_attention(torch.randn(1, 3, 8, D), q, q, context=ctx)


def test_backward_keeps_its_context_alive():
    """A context the caller drops after the forward (one made per call) stays open for as long
    as the graph can run its backward, through the operator and RingAttentionFunction alike."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 8, 2, D, generator=gen, requires_grad=True) for _ in range(3))
    for attend in (
        lambda: stria_torch.ring_attention(q, k, v, stria.Context(timeout_s=TIMEOUT_S)),
        lambda: stria_torch.RingAttentionFunction.apply(q, k, v, stria.Context(timeout_s=TIMEOUT_S), "striped", True, None),
    ):
        out = attend()
        gc.collect()
        out.sum().backward()
        qd, kd, vd = (x.detach().double().numpy() for x in (q, k, v))
        ref = attention_backward_ref(qd, kd, vd, np.ones(out.shape), True, 1 / math.sqrt(D))
        assert rel_err(q.grad.numpy(), ref[0]) < 1e-5 and rel_err(v.grad.numpy(), ref[2]) < 1e-5
        for x in (q, k, v):
            x.grad = None


@pytest.mark.parametrize("device_dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_attention_in_the_lower_precision_like_torch(device_dtype):
    """Under torch.autocast, inputs of mixed dtypes (a float32 rotary embedding beside bf16
    projections) are cast to the autocast dtype, as torch's SDPA does; the output has that dtype,
    and gradients come back in each input's own dtype."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 8, D, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 8, D, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, 8, D, generator=gen).to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=device_dtype), stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out = stria_torch.scaled_dot_product_attention(q, k, v, is_causal=True, context=ctx)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert out.dtype == want.dtype == device_dtype
        out.float().sum().backward()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert rel_err(out.detach().double().numpy(), ref.detach().numpy()) < 2e-2
    assert (q.grad.dtype, k.grad.dtype, v.grad.dtype) == (torch.float32, torch.float32, torch.bfloat16)


def test_sdpa_scale_none_or_positive_like_torch():
    """scale=None is torch's 1/sqrt(D); a positive scale is taken as given."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 8, D, generator=gen) for _ in range(3))
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        for scale in (None, 0.3, 2.0):
            out = stria_torch.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, context=ctx)
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, scale=scale)
            assert rel_err(out.numpy(), ref.numpy()) < 1e-5, scale


@pytest.mark.parametrize("scale", [0.0, -0.5, math.nan])
def test_sdpa_refuses_a_scale_it_cannot_honour(scale):
    """torch takes a zero or negative scale literally; stria's ABI reads 0 as 1/sqrt(D) and takes
    only positive scales, so such a scale raises instead of computing something else."""
    q = torch.randn(1, 2, 8, D)
    with stria.Context() as ctx, pytest.raises(ValueError, match=r"positive scale.*reserves 0 for its default"):
        stria_torch.scaled_dot_product_attention(q, q, q, scale=scale, context=ctx)


def test_second_order_gradients_raise_instead_of_vanishing():
    """A gradient penalty differentiates dq again; stria's backward is not differentiable, so
    that must raise, not contribute zero. First-order gradients with create_graph=True still
    match the plain ones."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 8, 2, D, generator=gen).requires_grad_() for _ in range(3))
    with stria.Context() as ctx:
        out = stria_torch.ring_attention(q, k, v, ctx)
        (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        out_plain = stria_torch.ring_attention(q, k, v, ctx)
        (gq_plain,) = torch.autograd.grad(out_plain.sum(), q)
        assert torch.equal(gq.detach(), gq_plain)
        assert gq.requires_grad
        with pytest.raises(RuntimeError, match="second-order gradients are not supported"):
            gq.pow(2).sum().backward()
        # Without create_graph nothing is guarded: the gradient is a plain tensor.
        out = stria_torch.ring_attention(q, k, v, ctx)
        (gq,) = torch.autograd.grad(out.sum(), q)
        assert not gq.requires_grad


def test_non_tensor_arguments_are_named():
    q = torch.randn(1, 2, 8, D)
    with stria.Context() as ctx:
        with pytest.raises(TypeError, match=r"attention\(\): argument 'key' must be a torch\.Tensor, not NoneType"):
            stria_torch.scaled_dot_product_attention(q, None, q, context=ctx)
        with pytest.raises(TypeError, match=r"ring_attention\(\): argument 'q' must be a torch\.Tensor, not list"):
            stria_torch.ring_attention([[1.0]], q, q, ctx)


def test_bool_dtype_is_named():
    """torch's bool (DLPack's kDLBool, newer than the DLPack header the library is built with)."""
    flags = torch.zeros(1, 8, 2, D, dtype=torch.bool)
    with stria.Context() as ctx, pytest.raises(stria.UnsupportedError, match="q has dtype bool8;"):
        ctx.attention_forward(flags, flags, flags)
    with pytest.raises(stria.InvalidArgumentError, match="full is bool8 but local is int8"):
        stria.shard(flags, 2, 0, out=torch.zeros(1, 4, 2, D, dtype=torch.int8))


def test_torch_errors_carry_the_library_message():
    q = torch.randn(1, 8, 2, D)
    with stria.Context() as ctx:
        with pytest.raises(stria.UnsupportedError) as info:
            ctx.attention_forward(q.double(), q.double(), q.double())
        assert str(info.value) == stria.capi.stria_get_last_error()  # before close() clears it
    assert "float64" in str(info.value)


def test_consumed_torch_capsule_is_refused():
    from torch.utils import dlpack

    q = torch.randn(1, 8, 2, D)
    capsule = dlpack.to_dlpack(q)
    dlpack.from_dlpack(capsule)  # consumes it
    with stria.Context() as ctx, pytest.raises(TypeError, match="already consumed"):
        ctx.attention_forward(capsule, q, q, out=torch.empty_like(q), lse=torch.empty(1, 2, 8))


class TinyModel(nn.Module):
    """Embeddings with learned global positions, one GQA attention block and an MLP, a vocabulary
    head. `attention(q, k, v)` takes and returns SDPA's [B, H, L, D]."""

    def __init__(self, vocab=23, d_model=24, heads=4, kv_heads=2, max_len=64):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = nn.Linear(heads * self.head_dim, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens, positions, attention):
        b, length = tokens.shape
        x = self.tok(tokens) + self.pos(positions)[None]
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q, k, v = (t.view(b, length, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        a = attention(q, k, v).transpose(1, 2).reshape(b, length, -1)
        x = x + self.proj(a)
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


@pytest.mark.parametrize("n, layout", [(2, "striped"), (3, "zigzag"), (4, "contiguous")])
def test_training_step_gradients_match_full_sequence_sdpa(n, layout):
    torch.manual_seed(5)
    seq, batch = 24, 2
    model = TinyModel()
    tokens = torch.randint(0, 23, (batch, seq + 1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    reference = copy.deepcopy(model).double()
    logits = reference(
        inputs,
        torch.arange(seq),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    )
    ref_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    ref_loss.backward()

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, seq, n, ctx.rank))
        logits = model(
            inputs[:, pos],
            pos,
            lambda q, k, v: stria_torch.scaled_dot_product_attention(
                q, k, v, is_causal=True, context=ctx, layout=layout
            ),
        )
        # This rank's share of the mean over all batch * seq tokens.
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, pos].reshape(-1), reduction="sum") / (
            batch * seq
        )
        loss.backward()  # accumulates into the shared parameters' .grad: the sum over ranks
        return loss.item()

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        losses = group.run(rank_fn)
    assert sum(losses) == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert rel_err(p.grad.numpy(), p_ref.grad.numpy()) < 1e-5, name


# ---- contexts from torch.distributed ----------------------------------------------------------


def test_context_from_a_gloo_group_of_three_processes(tmp_path, ucx):
    """Three processes in a torch.distributed group get their contexts from it (the unique id
    over the group, K/V blocks over UCX) and train: out and gradients against the reference."""
    import os
    import socket
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import torch_ring

    n, layout = 3, "zigzag"
    path = str(tmp_path / "ring.npz")
    with socket.socket() as s:  # a free port for the process group's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = os.path.join(here, "torch_ring.py")
    procs = [subprocess.Popen([sys.executable, script, str(n), layout, path, str(r), str(port)]) for r in range(n)]
    try:
        codes = [p.wait(timeout=2 * TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0] * n
    q, k, v, w = (x.astype(np.float64) for x in torch_ring.full_inputs())
    scale = 1 / math.sqrt(q.shape[-1])
    out_ref, _ = attention_ref(q, k, v, True, scale)
    grads_ref = attention_backward_ref(q, k, v, w, True, scale)
    for r in range(n):
        pos = positions_ref(layout, q.shape[1], n, r)
        with np.load(path.replace(".npz", f".rank{r}.npz")) as got:
            assert rel_err(got[f"out{r}"], out_ref[:, pos]) < 1e-5, r
            for name, ref in zip(("dq", "dk", "dv"), grads_ref):
                assert rel_err(got[f"{name}{r}"], ref[:, pos]) < 1e-5, (name, r)


def test_context_from_a_group_of_one_and_without_a_group():
    import torch.distributed as dist

    with pytest.raises(RuntimeError, match="init_process_group"):
        stria_torch.context_from_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with stria_torch.context_from_group(timeout_s=TIMEOUT_S) as ctx:
            assert (ctx.rank, ctx.world_size, ctx.device) == (0, 1, (stria.capi.kDLCPU, 0))
            q = torch.randn(1, 8, 2, D)
            out = stria_torch.ring_attention(q, q, q, ctx)
            ref = F.scaled_dot_product_attention(*(q.transpose(1, 2).double(),) * 3, is_causal=True)
            assert rel_err(out.numpy(), ref.transpose(1, 2).numpy()) < 1e-5
    finally:
        dist.destroy_process_group()


def test_join_makes_every_rank_raise_rank_zero_s_failure(monkeypatch):
    """Rank 0 could not open the rendezvous: it raises its own error, and the others, which got
    the failure through share() instead of an id, raise the same kind of error."""
    from stria import _context

    def no_listener():
        raise stria.TransportError("no interface to listen on")

    monkeypatch.setattr(_context, "get_unique_id", no_listener)
    shared = []
    with pytest.raises(stria.TransportError, match="no interface"):
        stria.Context.join(0, 2, lambda payload: shared.append(payload) or payload)
    with pytest.raises(stria.TransportError, match="rank 0 could not open the rendezvous: no interface"):
        stria.Context.join(1, 2, lambda payload: shared[0])
    with pytest.raises(stria.InvalidArgumentError, match="share"):
        stria.Context.join(1, 2, lambda payload: "not a payload")


def test_rank_threads_run_backward_on_themselves():
    """LocalGroup.run turns off autograd's per-device worker threads in its rank threads, where
    ranks sharing a GPU would otherwise queue their backward collectives on one thread (the GPU
    suite's rings on one GPU rely on it); the caller's thread keeps its setting."""
    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        flags = group.run(lambda ctx: torch._C._is_multithreading_enabled())
    assert flags == [False, False]
    assert torch._C._is_multithreading_enabled()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_under_activation_checkpointing(use_reentrant):
    """torch.utils.checkpoint runs the forward collective again during backward, on every rank
    alike: the gradients still match the full sequence's."""
    from torch.utils.checkpoint import checkpoint

    n, layout = 2, "striped"
    gen = torch.Generator().manual_seed(13)
    q, k, v, w = (torch.randn(1, 16, 2, D, generator=gen) for _ in range(4))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, 16, n, ctx.rank))
        ql, kl, vl = (x[:, pos].clone().requires_grad_() for x in (q, k, v))

        def attend(ql, kl, vl):
            return stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout) * w[:, pos]

        checkpoint(attend, ql, kl, vl, use_reentrant=use_reentrant).sum().backward()
        return pos, ql.grad, kl.grad, vl.grad

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    refs = attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(w), True, 1 / math.sqrt(D))
    for pos, *grads in results:
        for got, ref in zip(grads, refs):
            assert rel_err(as_f64(got), ref[:, pos]) < 1e-5
