"""PyTorch on the GPU: the autograd function with CUDA tensors on N ranks of one GPU, against the
float64 reference of the whole sequence (every layout, causal and not, float16/bfloat16 on the
tensor cores at D = 64, float32 on the SIMT kernels), the kernels queued on torch's current
stream, and the same under torch.compile; a KV cache sharded over the ranks through prefill and
decode. Skipped where torch sees no GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import LAYOUTS, TOLERANCE, attention_backward_ref, attention_ref, positions_ref, rel_err

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")

B, S, D = 1, 96, 64
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def as_f64(x):
    return x.detach().to("cpu", torch.float64).numpy()


def gather(results):
    """out, dq, dk, dv over the whole sequence (float64) from the ranks' (positions, out, dq, dk, dv)."""
    got = []
    for i in range(1, 5):
        shape = list(results[0][i].shape)
        shape[1] = S
        full = np.full(shape, np.nan)
        for r in results:
            full[:, r[0]] = as_f64(r[i])
        got.append(full)
    return got


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cuda_autograd_matches_reference(n, layout, causal, dtype):
    gen = torch.Generator().manual_seed(n * 10 + len(layout))
    hq, hkv = 4, 2
    q, k, v, dout = (torch.randn(B, S, h, D, generator=gen).to(DTYPES[dtype]) for h in (hq, hkv, hkv, hq))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):  # the library must queue on torch's current stream
            ql, kl, vl = (x[:, pos].cuda().requires_grad_() for x in (q, k, v))
            out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, causal=causal)
            out.backward(dout[:, pos].cuda())
        stream.synchronize()
        assert out.is_cuda and ql.grad.is_cuda
        return pos.numpy(), out, ql.grad, kl.grad, vl.grad

    with stria.local_group(n, device="cuda", timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got = gather(results)
    scale = 1.0 / math.sqrt(D)
    ref = [
        attention_ref(as_f64(q), as_f64(k), as_f64(v), causal, scale)[0],
        *attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), causal, scale),
    ]
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_documents_match_reference(n, layout):
    """Packed documents on the GPU (the boundaries as a CUDA tensor: copied to the host)."""
    cu_seqlens = torch.tensor([0, 10, 40, 41, 96], device="cuda")
    gen = torch.Generator().manual_seed(n + len(layout))
    q, k, v, dout = (torch.randn(2, S, h, D, generator=gen).to(torch.bfloat16) for h in (4, 2, 2, 4))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].cuda().requires_grad_() for x in (q, k, v))
        out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, cu_seqlens=cu_seqlens)
        out.backward(dout[:, pos].cuda())
        torch.cuda.synchronize()
        return pos.numpy(), out, ql.grad, kl.grad, vl.grad

    with stria.local_group(n, device="cuda", timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got = gather(results)
    docs = cu_seqlens.cpu().numpy()
    scale = 1.0 / math.sqrt(D)
    ref = [
        attention_ref(as_f64(q), as_f64(k), as_f64(v), True, scale, docs)[0],
        *attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), True, scale, docs),
    ]
    errors = {name: rel_err(g, r) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    assert all(e < TOLERANCE["bfloat16"] for e in errors.values()), errors


def test_cpu_tensors_on_a_cuda_context_are_refused():
    with stria.local_group(1, device="cuda", timeout_s=TIMEOUT_S) as group:
        q = torch.randn(1, 8, 2, D)
        with pytest.raises(stria.StriaError):
            group.run(lambda ctx: stria_torch.ring_attention(q, q[:, :, :1], q[:, :, :1], ctx))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_ring_over_two_gpus_matches_reference():
    """local_group(devices=...): rank r on GPU r % 2, its tensors there; the autograd result
    against the float64 reference."""
    n, layout, causal = 4, "striped", True
    gen = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(B, S, h, D, generator=gen).to(torch.bfloat16) for h in (4, 2, 2, 4))

    def rank_fn(ctx):
        gpu = f"cuda:{ctx.rank % 2}"
        torch.cuda.set_device(gpu)
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].to(gpu).requires_grad_() for x in (q, k, v))
        out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, causal=causal)
        out.backward(dout[:, pos].to(gpu))
        torch.cuda.synchronize(gpu)
        return pos.numpy(), out, ql.grad

    devices = [f"cuda:{r % 2}" for r in range(n)]
    with stria.local_group(n, devices=devices, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    got = []
    for i in (1, 2):
        full = np.full((B, S, 4, D), np.nan)
        for r in results:
            full[:, r[0]] = as_f64(r[i])
        got.append(full)
    scale = 1.0 / math.sqrt(D)
    want_out = attention_ref(as_f64(q), as_f64(k), as_f64(v), causal, scale)[0]
    want_dq = attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), causal, scale)[0]
    assert rel_err(got[0], want_out) < TOLERANCE["bfloat16"]
    assert rel_err(got[1], want_dq) < TOLERANCE["bfloat16"]


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch before 2.4 has no custom operators")
def test_compiled_on_the_gpu_matches_reference():
    """torch.compile(fullgraph=True) with CUDA tensors, two ranks on one GPU: the operators stay
    in the graph and run on torch's stream; out and dq against the float64 reference."""
    n, layout = 2, "zigzag"
    gen = torch.Generator().manual_seed(9)
    q, k, v, dout = (torch.randn(B, S, h, D, generator=gen).to(torch.bfloat16) for h in (4, 2, 2, 4))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, S, n, ctx.rank))
        ql, kl, vl = (x[:, pos].cuda().requires_grad_() for x in (q, k, v))
        attend = torch.compile(lambda q, k, v: stria_torch.ring_attention(q, k, v, ctx, layout=layout), fullgraph=True)
        out = attend(ql, kl, vl)
        out.backward(dout[:, pos].cuda())
        torch.cuda.synchronize()
        return pos.numpy(), out, ql.grad

    with stria.local_group(n, device="cuda", timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    scale = 1.0 / math.sqrt(D)
    want_out = attention_ref(as_f64(q), as_f64(k), as_f64(v), True, scale)[0]
    want_dq = attention_backward_ref(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), True, scale)[0]
    for pos, out, dq in results:
        assert rel_err(as_f64(out), want_out[:, pos]) < TOLERANCE["bfloat16"]
        assert rel_err(as_f64(dq), want_dq[:, pos]) < TOLERANCE["bfloat16"]


def test_deterministic_algorithms_give_the_same_bits_twice():
    """Under torch.use_deterministic_algorithms(True), two backward runs repeat their bits (dQ then
    takes its own pass instead of float atomics); the gradients still match the reference."""
    n, layout = 3, "striped"
    seq = 3 * 264  # several key tiles per block, so that atomics would add in varying orders
    gen = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(2, seq, h, 128, generator=gen).to(torch.bfloat16) for h in (4, 1, 1, 4))

    def rank_fn(ctx):
        pos = torch.from_numpy(positions_ref(layout, seq, n, ctx.rank))
        grads = []
        for _ in range(2):
            ql, kl, vl = (x[:, pos].cuda().requires_grad_() for x in (q, k, v))
            out = stria_torch.ring_attention(ql, kl, vl, ctx, layout=layout, causal=True)
            out.backward(dout[:, pos].cuda())
            grads.append([x.grad.cpu() for x in (ql, kl, vl)])
        torch.cuda.synchronize()
        return grads

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with stria.local_group(n, device="cuda", timeout_s=TIMEOUT_S) as group:
            results = group.run(rank_fn)
    finally:
        torch.use_deterministic_algorithms(previous)
    for rank, (first, second) in enumerate(results):
        for name, a, b in zip(("dq", "dk", "dv"), first, second):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"rank {rank}: {name} differs"



def test_kv_cache_on_the_gpu_matches_reference():
    """stria.KVCache with CUDA tensors on 3 ranks of one GPU: a prompt prefilled over the ranks (both
    modes), then decode steps appending one token each, on torch's current stream; against the
    float64 reference of the whole cache."""
    from test_serving import decode_ref

    n, capacity, p, steps, b, hq, hkv, d = 3, 16, 12, 4, 2, 8, 2, 64
    total = p + steps
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(b, total, h, d, generator=gen).bfloat16() for h in (hq, hkv, hkv))
    qf, kf, vf = (x.float().numpy() for x in (q, k, v))
    first_ref, _ = decode_ref(qf[:, :p], kf, vf, np.zeros(b, np.int64), p)
    for mode in ("pass_kv", "pass_q"):

        def rank_fn(ctx):
            cache = stria.KVCache(ctx, q.cuda(), b, capacity, hkv, d)
            mine = torch.as_tensor(stria.positions("striped", p, n, ctx.rank))
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):  # the library must queue on torch's current stream
                first = cache.prefill(q[:, mine].cuda(), k[:, mine].cuda(), v[:, mine].cuda(), mode=mode)
                outs = [cache.decode(*(x[:, p + s : p + s + 1].cuda() for x in (q, k, v))) for s in range(steps)]
            stream.synchronize()
            assert first.is_cuda and all(o.is_cuda for o in outs)
            return mine, first.float().cpu(), [o.float().cpu() for o in outs], cache.lens

        with stria.local_group(n, device="cuda", timeout_s=TIMEOUT_S) as group:
            results = group.run(rank_fn)
        for mine, first, outs, lens in results:
            np.testing.assert_array_equal(lens, np.full(b, total))
            assert rel_err(first.numpy(), first_ref[:, mine.numpy()]) < TOLERANCE["bfloat16"], mode
            for s, out in enumerate(outs):
                want, _ = decode_ref(qf[:, p + s : p + s + 1], kf, vf, np.full(b, p + s), 1)
                assert rel_err(out.numpy(), want) < TOLERANCE["bfloat16"], (mode, s)
