"""Decode over a KV cache sharded across the ranks, from Python: stria.attention_decode on numpy
and torch tensors (contiguous and paged caches, every layout, GQA, windows, softcap, sinks) and the
KVCache helper through a generation loop, against a float64 reference over the whole cache on one
device; and the errors a caller can make."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S
from reference import LAYOUTS, TOLERANCE, rel_err

B, T, HQ, HKV, D = 3, 2, 4, 2, 16


def decode_ref(q, k, v, lens, added, *, causal=True, window_left=-1, softcap=None, sinks=None):
    """float64 out [B, T, Hq, D] and lse [B, Hq, T]: query t of sequence b at position lens[b] + t
    against keys 0 .. lens[b] + added of k, v [B, S, Hkv, D]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b_, t_, hq, d = q.shape
    group = hq // k.shape[2]
    out = np.zeros(q.shape)
    lse = np.zeros((b_, hq, t_))
    for b in range(b_):
        n = lens[b] + added
        for t in range(t_):
            p = lens[b] + t
            j = np.arange(n)
            visible = np.ones(n, bool)
            if causal:
                visible &= j <= p
            if window_left >= 0:
                visible &= p - j <= window_left
            for h in range(hq):
                s = k[b, :n, h // group] @ q[b, t, h] / math.sqrt(d)
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                s = np.where(visible, s, -np.inf)
                z = -np.inf if sinks is None else float(sinks[h])
                m = max(s.max(initial=-np.inf), z)
                if m == -np.inf:
                    lse[b, h, t] = -np.inf
                    continue
                w = np.exp(s - m)
                total = w.sum() + (0.0 if z == -np.inf else math.exp(z - m))
                lse[b, h, t] = m + math.log(total)
                out[b, t, h] = (w / total) @ v[b, :n, h // group]
    return out, lse


def shares(k, v, lens, layout, n, capacity, paged_block=None, rng=None):
    """Each rank's cache of the whole-sequence k, v (positions < lens[b]): [B, C, Hkv, D] arrays, or
    with paged_block a shuffled pool and its block table."""
    out = []
    batch = k.shape[0]
    for r in range(n):
        kc = np.full((batch, capacity) + k.shape[2:], np.nan, k.dtype)
        vc = np.full_like(kc, np.nan)
        for b in range(batch):
            pos = np.arange(lens[b])
            ranks, slots = stria.cache_placement(layout, n, capacity, pos)
            kc[b, slots[ranks == r]] = k[b, pos[ranks == r]]
            vc[b, slots[ranks == r]] = v[b, pos[ranks == r]]
        if paged_block is None:
            out.append((kc, vc, None))
            continue
        blocks = capacity // paged_block
        order = rng.permutation(batch * blocks + 2).astype(np.int32)
        table = order[: batch * blocks].reshape(batch, blocks)
        pool_k = np.full((batch * blocks + 2, paged_block) + k.shape[2:], np.nan, k.dtype)
        pool_v = np.full_like(pool_k, np.nan)
        for b in range(batch):
            for i in range(blocks):
                pool_k[table[b, i]] = kc[b, i * paged_block : (i + 1) * paged_block]
                pool_v[table[b, i]] = vc[b, i * paged_block : (i + 1) * paged_block]
        out.append((pool_k, pool_v, np.ascontiguousarray(table)))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_numpy(layout, n, paged, rng):
    capacity = 24
    lens = np.array([0, 17, n * capacity - T])
    k = rng.standard_normal((B, n * capacity, HKV, D)).astype(np.float32)
    v = rng.standard_normal((B, n * capacity, HKV, D)).astype(np.float32)
    q = rng.standard_normal((B, T, HQ, D)).astype(np.float32)
    k_new = np.stack([k[b, lens[b] : lens[b] + T] for b in range(B)])
    v_new = np.stack([v[b, lens[b] : lens[b] + T] for b in range(B)])
    caches = shares(k, v, lens, layout, n, capacity, 8 if paged else None, rng)
    ref_out, ref_lse = decode_ref(q, k, v, lens, T)

    def rank_fn(ctx):
        kc, vc, table = caches[ctx.rank]
        return ctx.attention_decode(q, kc, vc, lens, k_new, v_new, block_table=table, layout=layout)

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for out, lse in results:
        assert rel_err(out, ref_out) < TOLERANCE["float32"]
        assert rel_err(lse, ref_lse) < TOLERANCE["float32"]
        np.testing.assert_array_equal(out, results[0][0])  # the same bits on every rank


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_decode_torch_mods(dtype, rng):
    """torch tensors through stria.torch, GQA 4:1, a window, softcap and sinks, no new tokens."""
    torch = pytest.importorskip("torch")
    import stria.torch as stria_torch  # noqa: PLC0415 - needs torch
    n, capacity, hq, hkv = 3, 40, 8, 2
    lens = np.array([100, 0, 63])
    k = rng.standard_normal((B, n * capacity, hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, n * capacity, hkv, D)).astype(np.float32)
    q = rng.standard_normal((B, 1, hq, D)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32)
    tdt = getattr(torch, dtype)
    k16, v16, q16 = (torch.from_numpy(x).to(tdt) for x in (k, v, q))
    caches = shares(k16.float().numpy(), v16.float().numpy(), lens, "striped", n, capacity)
    ref_out, ref_lse = decode_ref(
        q16.float().numpy(), k16.float().numpy(), v16.float().numpy(), lens, 0, window_left=37, softcap=4.0,
        sinks=sinks,
    )

    def rank_fn(ctx):
        kc, vc, _ = caches[ctx.rank]
        kc, vc = (torch.from_numpy(np.nan_to_num(x)).to(tdt) for x in (kc, vc))
        return stria_torch.attention_decode(
            ctx, q16, kc, vc, torch.as_tensor(lens), window_left=37, softcap=4.0, sinks=torch.from_numpy(sinks)
        )

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for out, lse in results:
        assert out.dtype == tdt
        assert rel_err(out.float().numpy(), ref_out) < TOLERANCE[dtype]
        assert rel_err(lse.numpy(), ref_lse) < 1e-3
        assert torch.equal(out, results[0][0])


def test_kv_cache_generation_loop(rng):
    """KVCache through a loop that appends one token per step from a filled prefix, across rank
    boundaries of the contiguous layout."""
    n, capacity, steps = 2, 11, 9
    prefix = np.array([7, 12, 3])
    total = prefix.max() + steps
    k = rng.standard_normal((B, total, HKV, D)).astype(np.float32)
    v = rng.standard_normal((B, total, HKV, D)).astype(np.float32)
    q = rng.standard_normal((steps, B, 1, HQ, D)).astype(np.float32)

    def rank_fn(ctx):
        cache = stria.KVCache(ctx, q, B, capacity, HKV, D, layout="contiguous")
        cache.fill(k, v, prefix)
        outs = []
        for s in range(steps):
            k_new = np.stack([k[b, prefix[b] + s : prefix[b] + s + 1] for b in range(B)])
            v_new = np.stack([v[b, prefix[b] + s : prefix[b] + s + 1] for b in range(B)])
            outs.append(cache.decode(q[s], k_new, v_new))
        return outs, cache.lens

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for outs, lens in results:
        np.testing.assert_array_equal(lens, prefix + steps)
        for s in range(steps):
            ref, _ = decode_ref(q[s], k, v, prefix + s, 1)
            assert rel_err(outs[s], ref) < TOLERANCE["float32"]


def test_decode_errors(rng):
    k = np.zeros((B, 8, HKV, D), np.float32)
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        ctx = group[0]
        with pytest.raises(ValueError, match="cache_lens has 2 entries but q has 3"):
            ctx.attention_decode(q, k, k, [1, 2])
        with pytest.raises(stria.InvalidArgumentError, match=r"cache->lens\[1\] is 9"):
            ctx.attention_decode(q, k, k, [1, 9, 0])
        with pytest.raises(TypeError, match="cache_lens must hold integers"):
            ctx.attention_decode(q, k, k, [1.5, 2, 0])
        with pytest.raises(stria.InvalidArgumentError, match="window_left"):
            ctx.attention_decode(q, k, k, [1, 2, 0], window_left=-3)
        out, _ = ctx.attention_decode(q, k, k, [1, 2, 0])  # still usable
        assert np.isfinite(out).all()
    with pytest.raises(ValueError, match="even capacity"):
        stria.cache_placement("zigzag", 2, 5, [0, 1])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("mode", ["pass_kv", "pass_q", "auto"])
def test_prefill_numpy(layout, n, mode, rng):
    """New tokens sharded by the layout attend to the cache and to each other, then decode on."""
    capacity, per_rank = 32, 4
    p = per_rank * n
    lens = np.array([0, 9, n * capacity - p - 1])
    k = rng.standard_normal((B, n * capacity, HKV, D)).astype(np.float32)
    v = rng.standard_normal((B, n * capacity, HKV, D)).astype(np.float32)
    qf = rng.standard_normal((B, p, HQ, D)).astype(np.float32)
    q_next = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    caches = shares(k, v, lens, layout, n, capacity)
    new = [np.stack([x[b, lens[b] : lens[b] + p] for b in range(B)]) for x in (k, v)]
    ref, _ = decode_ref(qf, k, v, lens, p)
    ref_next, _ = decode_ref(q_next, k, v, lens + p, 1)

    def rank_fn(ctx):
        kc, vc, _ = caches[ctx.rank]
        mine = stria.positions(layout, p, n, ctx.rank)
        out, _ = ctx.attention_prefill(  # the method, as attention_decode below
            qf[:, mine], new[0][:, mine], new[1][:, mine], kc, vc, lens, layout=layout, mode=mode
        )
        k_next = np.stack([k[b, lens[b] + p : lens[b] + p + 1] for b in range(B)])
        v_next = np.stack([v[b, lens[b] + p : lens[b] + p + 1] for b in range(B)])
        after, _ = ctx.attention_decode(q_next, kc, vc, lens + p, k_next, v_next, layout=layout)
        return mine, out, after

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for mine, out, after in results:
        assert rel_err(out, ref[:, mine]) < TOLERANCE["float32"]
        assert rel_err(after, ref_next) < TOLERANCE["float32"]


@pytest.mark.parametrize("mode", ["pass_kv", "pass_q"])
def test_serving_on_a_grid_spreads_the_cache_over_every_rank(mode, rng):
    """On contexts with a grid (set for training), decode and prefill still take the cache as spread
    over all N ranks by the layout: the grid is for the training calls."""
    n, capacity, p = 4, 32, 8
    lens = np.array([0, 9, n * capacity - p - 1])
    k, v = (rng.standard_normal((B, n * capacity, HKV, D)).astype(np.float32) for _ in range(2))
    qf = rng.standard_normal((B, p, HQ, D)).astype(np.float32)
    q_next = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    caches = shares(k, v, lens, "striped", n, capacity)
    new = [np.stack([x[b, lens[b] : lens[b] + p] for b in range(B)]) for x in (k, v)]
    ref, _ = decode_ref(qf, k, v, lens, p)
    ref_next, _ = decode_ref(q_next, k, v, lens + p, 1)

    def rank_fn(ctx):
        assert ctx.ulysses == 2
        kc, vc, _ = caches[ctx.rank]
        mine = stria.positions("striped", p, n, ctx.rank)
        out, _ = ctx.attention_prefill(qf[:, mine], new[0][:, mine], new[1][:, mine], kc, vc, lens, mode=mode)
        nxt = [np.stack([x[b, lens[b] + p : lens[b] + p + 1] for b in range(B)]) for x in (k, v)]
        after, _ = ctx.attention_decode(q_next, kc, vc, lens + p, *nxt)
        return mine, out, after

    with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=2) as group:
        results = group.run(rank_fn)
    for mine, out, after in results:
        assert rel_err(out, ref[:, mine]) < TOLERANCE["float32"]
        assert rel_err(after, ref_next) < TOLERANCE["float32"]


RANDOM_CASES = int(os.environ.get("STRIA_SERVING_RANDOM_CASES", "24"))


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_serving_calls(seed):
    """Decode or prefill through stria.torch with features drawn at random from the seed: ranks,
    layout, dtype, GQA, head dim, a contiguous or paged cache (its unused slots NaN), per-sequence
    lengths from empty to full, new tokens, causal or not, a window, softcap, sinks, the prefill's
    mode, and cache_lens as a list, an array or a tensor. STRIA_SERVING_RANDOM_CASES sets how many."""
    torch = pytest.importorskip("torch")
    import stria.torch as stria_torch  # noqa: PLC0415 - needs torch

    rng = np.random.default_rng(seed)
    n, layout = int(rng.integers(1, 6)), str(rng.choice(LAYOUTS))
    dtype = str(rng.choice(["float32", "bfloat16", "float16"]))
    tdt = getattr(torch, dtype)
    batch, hkv, d = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.choice([8, 16, 32, 64]))
    hq = hkv * int(rng.integers(1, 4))
    block = int(rng.choice([4, 8])) if rng.random() < 0.5 else None
    capacity, prefill, causal = 8 * int(rng.integers(1, 5)), bool(rng.random() < 0.5), bool(rng.random() < 0.8)
    # Prefill: new tokens a whole number per rank (two halves for zigzag).
    t = n * int(rng.integers(1, 3)) * (2 if layout == "zigzag" else 1) if prefill else int(rng.integers(1, 5))
    lens = rng.integers(0, n * capacity - t + 1, size=batch)
    window = int(rng.integers(0, 20)) if rng.random() < 0.3 else -1
    softcap = float(rng.choice([2.0, 30.0])) if rng.random() < 0.4 else None
    sinks = (rng.random(hq) * 3 - 1).astype(np.float32) if rng.random() < 0.3 else None
    mode, lens_kind = str(rng.choice(["pass_kv", "pass_q", "auto"])), int(rng.integers(0, 3))

    def draw(*shape):  # values the dtype holds exactly
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(tdt).float().numpy()

    k, v, q = draw(batch, n * capacity, hkv, d), draw(batch, n * capacity, hkv, d), draw(batch, t, hq, d)
    caches = shares(k, v, lens, layout, n, capacity, block, rng)
    new = [np.stack([x[b, lens[b] : lens[b] + t] for b in range(batch)]) for x in (k, v)]
    ref, ref_lse = decode_ref(q, k, v, lens, t, causal=causal, window_left=window, softcap=softcap, sinks=sinks)

    def rank_fn(ctx):
        kc, vc, table = caches[ctx.rank]
        kw = dict(block_table=None if table is None else torch.from_numpy(table), layout=layout, causal=causal,
                  window_left=window, softcap=softcap, sinks=None if sinks is None else torch.from_numpy(sinks))
        cache = [torch.from_numpy(x.copy()).to(tdt) for x in (kc, vc)]
        cache_lens = [[int(x) for x in lens], lens.copy(), torch.from_numpy(lens.copy())][lens_kind]
        mine = stria.positions(layout, t, n, ctx.rank) if prefill else np.arange(t)
        mine_q, mine_k, mine_v = (torch.from_numpy(x[:, mine]).to(tdt) for x in (q, *new))
        if prefill:
            out, lse = stria_torch.attention_prefill(ctx, mine_q, mine_k, mine_v, *cache, cache_lens, mode=mode, **kw)
        else:
            out, lse = stria_torch.attention_decode(ctx, mine_q, *cache, cache_lens, mine_k, mine_v, **kw)
        return mine, out.float().numpy(), lse.numpy()

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for mine, out, lse in results:
        want, want_lse = ref[:, mine], ref_lse[:, :, mine]
        seen = np.isfinite(want_lse)  # a row that sees nothing: lse -inf and output 0
        assert np.all(lse[~seen] == -np.inf)
        assert rel_err(out, want) < TOLERANCE[dtype] if np.any(want) else np.all(out == 0)
        assert rel_err(np.where(seen, lse, 0), np.where(seen, want_lse, 0)) < TOLERANCE[dtype]


def test_kv_cache_prefill_then_decode(rng):
    """KVCache: a prompt prefilled over the ranks, then decode steps; torch tensors in bfloat16."""
    torch = pytest.importorskip("torch")
    n, capacity, p, steps = 2, 16, 8, 5
    total = p + steps
    k = torch.from_numpy(rng.standard_normal((B, total, HKV, D)).astype(np.float32)).bfloat16()
    v = torch.from_numpy(rng.standard_normal((B, total, HKV, D)).astype(np.float32)).bfloat16()
    q = torch.from_numpy(rng.standard_normal((B, total, HQ, D)).astype(np.float32)).bfloat16()
    full_q = np.asarray(q.float())
    ref, _ = decode_ref(full_q[:, :p], k.float().numpy(), v.float().numpy(), np.zeros(B, np.int64), p)

    def rank_fn(ctx):
        cache = stria.KVCache(ctx, q, B, capacity, HKV, D)
        mine = torch.as_tensor(stria.positions("striped", p, n, ctx.rank))
        first = cache.prefill(q[:, mine], k[:, mine], v[:, mine])
        outs = [cache.decode(q[:, p + s : p + s + 1], k[:, p + s : p + s + 1], v[:, p + s : p + s + 1])
                for s in range(steps)]
        return mine, first, outs, cache.lens

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for mine, first, outs, lens in results:
        np.testing.assert_array_equal(lens, np.full(B, total))
        assert rel_err(first.float().numpy(), ref[:, mine.numpy()]) < TOLERANCE["bfloat16"]
        for s, out in enumerate(outs):
            want, _ = decode_ref(full_q[:, p + s : p + s + 1], k.float().numpy(), v.float().numpy(),
                                 np.full(B, p + s), 1)
            assert rel_err(out.float().numpy(), want) < TOLERANCE["bfloat16"]


def test_prefill_errors(rng):
    k = np.zeros((B, 8, HKV, D), np.float32)
    q = rng.standard_normal((B, 2, HQ, D)).astype(np.float32)
    kn = np.zeros((B, 2, HKV, D), np.float32)
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        ctx = group[0]
        with pytest.raises(ValueError, match="mode must be one of"):
            stria.attention_prefill(ctx, q, kn, kn, k, k, [0, 0, 0], mode="pass_x")
        with pytest.raises(stria.InvalidArgumentError, match=r"cache->lens\[0\] is 7"):
            stria.attention_prefill(ctx, q, kn, kn, k, k, [7, 0, 0])
        out, _ = stria.attention_prefill(ctx, q, kn, kn, k, k, [0, 1, 6])
        assert np.isfinite(out).all()
