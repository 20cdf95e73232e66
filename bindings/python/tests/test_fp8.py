"""FP8 (float8_e4m3fn) inputs through the Python front ends: stria.attention_forward on torch CPU
tensors with per-head and per-tensor descales, and stria.torch.ring_attention_fp8, on local groups
of CPU ranks, against a float64 reference on the values the codes stand for; and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import attention_ref, positions_ref, rel_err

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch

B, S, HQ, HKV, D = 2, 24, 4, 2, 16


def fp8_inputs(seed: int):
    """q, k, v as float8_e4m3fn codes of normal values under per-head (q), per-tensor (k) and no
    (v) descales, the descales, and the float64 values the attention sees."""
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, S, h, D, generator=gen, dtype=torch.float64) for h in (HQ, HKV, HKV)]
    q_scale = (x[0].abs().amax(dim=(0, 1, 3)) / 448).float()
    k_scale = (x[1].abs().max() / 448).float().reshape(1)
    codes = [
        (x[0] / q_scale[None, None, :, None]).to(torch.float8_e4m3fn),
        (x[1] / k_scale).to(torch.float8_e4m3fn),
        x[2].to(torch.float8_e4m3fn),
    ]
    seen = [
        (codes[0].float() * q_scale[None, None, :, None]).double(),
        (codes[1].float() * k_scale).double(),
        codes[2].double(),
    ]
    return codes, (q_scale, k_scale, None), [t.numpy() for t in seen]


@pytest.mark.parametrize("n,layout,causal", [(1, "striped", True), (3, "zigzag", False), (4, "contiguous", True)])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_fp8_forward_matches_reference(n, layout, causal, out_dtype):
    codes, scales, seen = fp8_inputs(7 + n)
    want_out, want_lse = attention_ref(*seen, causal, 1 / math.sqrt(D))
    dt = getattr(torch, out_dtype)

    def rank_fn(ctx):
        pos = torch.as_tensor(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (c[:, pos].contiguous() for c in codes)
        out = torch.full((B, len(pos), HQ, D), float("nan"), dtype=dt)
        out, lse = ctx.attention_forward(
            ql, kl, vl, out, layout=layout, causal=causal, q_descale=scales[0], k_descale=scales[1]
        )
        # The same through stria.torch (a new bfloat16 out unless told).
        out2 = stria_torch.ring_attention_fp8(
            ql, kl, vl, ctx, q_descale=scales[0], k_descale=scales[1], out_dtype=dt, layout=layout, causal=causal
        )
        assert out2.dtype == dt
        return pos.numpy(), out.double().numpy(), lse.numpy(), out2.double().numpy()

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got_out = np.full(want_out.shape, np.nan)
    got_lse = np.full(want_lse.shape, np.nan)
    got_out2 = np.full(want_out.shape, np.nan)
    for pos, out, lse, out2 in results:
        got_out[:, pos] = out
        got_lse[:, :, pos] = lse
        got_out2[:, pos] = out2
    tol = 1e-5 if out_dtype == "float32" else 2e-2
    assert rel_err(got_out, want_out) < tol
    assert rel_err(got_out2, want_out) < tol
    assert rel_err(got_lse, want_lse) < (1e-5 if out_dtype == "float32" else 1e-2)


def test_fp8_refusals():
    codes, scales, _ = fp8_inputs(3)
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        out, _ = ctx.attention_forward(*codes)  # a new out: bfloat16
        assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
        with pytest.raises(stria.InvalidArgumentError, match="q_descale has shape"):
            ctx.attention_forward(*codes, q_descale=torch.ones(3))
        with pytest.raises(stria.InvalidArgumentError, match="k has dtype bfloat16 but q is float8_e4m3fn"):
            ctx.attention_forward(codes[0], codes[1].bfloat16(), codes[2])
        with pytest.raises(stria.InvalidArgumentError, match="descales are for float8_e4m3fn inputs"):
            ctx.attention_forward(*(c.float() for c in codes), q_descale=scales[0])
        with pytest.raises(stria.UnsupportedError, match="only stria_attention_forward takes"):
            ctx.attention_backward(*codes, out, torch.zeros(B, HQ, S), torch.zeros(B, S, HQ, D, dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="must be torch.float8_e4m3fn"):
            stria_torch.ring_attention_fp8(codes[0].float(), codes[1], codes[2], ctx)
        ctx.attention_forward(*codes, q_descale=scales[0])  # still usable
