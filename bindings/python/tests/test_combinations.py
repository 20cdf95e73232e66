"""Features in random combination: each case draws a world size, a grid, a fixed layout or a document
plan (any S then), causal or not, documents, a sliding window, softcap, sinks, GQA, the dtype, the
deterministic backward and the front end (the package's calls on arrays, or stria.torch's autograd),
runs forward and backward on a local group and sets the gathered result against the float64
reference of the whole sequence. The other suites take each feature through its own cases; this one
is for how they meet. STRIA_COMBINATION_CASES sets how many cases run (more for a longer search)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import TOLERANCE

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch
from test_softcap_sinks import reference  # noqa: E402 - the float64 reference with softcap and sinks

CASES = int(os.environ.get("STRIA_COMBINATION_CASES", "80"))


def draw_case(seed: int) -> dict:
    """A case's parameters, from its seed alone."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    ulysses = int(rng.choice([u for u in range(1, n + 1) if n % u == 0])) if rng.random() < 0.4 else 1
    ring = n // ulysses
    c = dict(seed=seed, n=n, ulysses=ulysses, plan=bool(rng.random() < 0.4),
             layout=str(rng.choice(["contiguous", "striped", "zigzag"])), causal=bool(rng.random() < 0.6),
             batch=int(rng.integers(1, 3)), dim=int(rng.choice([8, 16, 24, 40])),
             dtype=str(rng.choice(["float32", "float32", "float16", "bfloat16"])),
             deterministic=bool(rng.random() < 0.2), front=str(rng.choice(["arrays", "torch"])))
    # K/V heads the group can split (U divides them) or share (they divide U).
    hkv = int(rng.choice([h for h in (1, 2, 3, 4, 6) if ulysses % h == 0 or h % ulysses == 0]))
    hq = hkv * int(rng.integers(1, 4))
    c["hkv"], c["hq"] = hkv, hq * ulysses // math.gcd(hq, ulysses)
    long_ = rng.random() < 0.15  # past the CPU kernels' 64-token tiles
    if c["plan"]:
        seq = int(rng.integers(100, 400)) if long_ else int(rng.integers(1, 90))
    else:
        per_rank = (2 if c["layout"] == "zigzag" else 1) * ulysses
        seq = ring * per_rank * int(rng.integers(1, 12)) * (int(rng.integers(4, 12)) if long_ else 1)
    c["seq"] = seq
    c["cu_seqlens"] = None
    if c["plan"] or rng.random() < 0.5:
        rows = []
        for _ in range(c["batch"]):
            cuts = np.sort(rng.integers(0, seq + 1, size=int(rng.integers(0, min(seq, 8)))))
            rows.append(np.concatenate([[0], cuts, [seq]]))
        width = max(len(r) for r in rows)
        c["cu_seqlens"] = np.array([np.concatenate([r, np.full(width - len(r), seq)]) for r in rows], dtype=np.int64)
    c["window"] = None
    if rng.random() < 0.4:
        left = int(rng.integers(-1, seq + 1))
        right = -1 if c["causal"] else int(rng.integers(-1, seq + 1))
        c["window"] = None if left < 0 and right < 0 else (left, right)
    c["softcap"] = float(rng.choice([0.0, 0.0, 2.0, 30.0]))
    c["sinks"] = (rng.random(c["hq"]) * 4 - 1).astype(np.float32) if rng.random() < 0.3 else None
    spread = 2.0 if c["softcap"] else 1.0  # scores that reach the cap's bend
    shapes = [(c["hq"], spread), (hkv, spread), (hkv, 1.0), (c["hq"], 1.0)]
    c["inputs"] = [(s * rng.standard_normal((c["batch"], seq, h, c["dim"]))).astype(np.float32) for h, s in shapes]
    return c


def describe(c: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("inputs", "sinks")) + f", sinks={c['sinks'] is not None}"


def error(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||, with ||ref|| floored at 0.1 per element (the inputs are of order 1): a
    gradient that is zero in exact arithmetic (every row sees one key) is met by rounding alone,
    which this measures against the gradients' usual size. NaN never passes."""
    got = np.asarray(got, np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 0.1 * math.sqrt(ref.size)))


def run_case(c: dict) -> tuple[list, object]:
    """Each rank's (positions, out, lse or None, [dq, dk, dv(, dsinks)]) in float64, and the plan."""
    n, ulysses, dtype = c["n"], c["ulysses"], c["dtype"]
    tdtype = getattr(torch, dtype)
    full = [torch.from_numpy(x).to(tdtype) for x in c["inputs"]]
    plan = None
    if c["plan"]:
        plan = stria.Plan(c["cu_seqlens"], n // ulysses, causal=c["causal"], window=c["window"], tile=4)
        if plan.local_len % ulysses:  # slots the group splits evenly
            local_len = -(-plan.local_len // ulysses) * ulysses
            plan.close()
            plan = stria.Plan(c["cu_seqlens"], n // ulysses, causal=c["causal"], window=c["window"], tile=4,
                              local_len=local_len)

    def rank_fn(ctx):
        if plan is not None:
            pos = plan.positions(ctx.rank, ulysses=ulysses)
            q, k, v, dout = (plan.shard(x, ctx.rank, ulysses=ulysses) for x in full)
        else:
            pos = np.tile(stria.positions(c["layout"], c["seq"], n, ctx.rank, ulysses=ulysses), (c["batch"], 1))
            q, k, v, dout = (x[:, pos[0]].contiguous() for x in full)
        kw = dict(causal=c["causal"], cu_seqlens=c["cu_seqlens"], window=c["window"], softcap=c["softcap"] or None)
        if plan is not None:
            kw["plan"] = plan
        else:
            kw["layout"] = c["layout"]
        f64 = lambda x: x.detach().to(torch.float64).numpy()  # noqa: E731
        if c["front"] == "torch":
            ctx.deterministic = c["deterministic"]
            q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
            sinks = None if c["sinks"] is None else torch.from_numpy(c["sinks"].copy()).requires_grad_()
            out = stria_torch.ring_attention(q, k, v, ctx, sinks=sinks, **kw)
            out.backward(dout)
            grads = [q.grad, k.grad, v.grad] + ([] if sinks is None else [sinks.grad])
            return pos, f64(out), None, [f64(g) for g in grads]
        out, lse = ctx.attention_forward(q, k, v, sinks=c["sinks"], **kw)
        grads = ctx.attention_backward(q, k, v, out, lse, dout, sinks=c["sinks"], deterministic=c["deterministic"],
                                       **kw)
        return pos, f64(out), f64(lse), [g.astype(np.float64) if isinstance(g, np.ndarray) else f64(g) for g in grads]

    try:
        with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
            return group.run(rank_fn), full
    finally:
        if plan is not None:
            plan.close()


@pytest.mark.parametrize("seed", range(CASES))
def test_random_combination_matches_reference(seed):
    c = draw_case(seed)
    results, full = run_case(c)
    q, k, v, dout = (x.to(torch.float64).numpy() for x in full)  # the inputs as the ranks had them
    stored_as = None if c["dtype"] == "float32" else getattr(torch, c["dtype"])
    out, lse, grads, dsinks = reference(q, k, v, dout, causal=c["causal"], softcap=c["softcap"] or None,
                                        sinks=c["sinks"], cu_seqlens=c["cu_seqlens"], window=c["window"],
                                        stored_as=stored_as)
    got = {name: np.full(x.shape, np.nan) for name, x in (("out", out), ("dq", q), ("dk", k), ("dv", v))}
    got["lse"] = np.full(lse.shape, np.nan)
    for pos, o, l, g in results:
        for b in range(c["batch"]):
            real = pos[b] >= 0  # a plan's padding slots hold no token
            p = pos[b][real]
            got["out"][b, p] = o[b][real]
            for name, x in zip(("dq", "dk", "dv"), g):
                got[name][b, p] = x[b][real]
            if l is not None:
                got["lse"][b][:, p] = l[b][:, real]
    tol = TOLERANCE[c["dtype"]]
    errors = {name: error(got[name], ref) for name, ref in zip(("out", "dq", "dk", "dv"), (out, *grads))}
    if c["front"] == "arrays":
        seen = np.isfinite(lse)  # a row that sees nothing: lse -inf on both sides
        errors["lse"] = error(np.where(seen, got["lse"], 0.0), np.where(seen, lse, 0.0))
        assert np.all(got["lse"][~seen] == -np.inf), describe(c)
    if c["sinks"] is not None:
        # dsinks sums p_sink * (dO . O) over the rows, terms of either sign: measured against the
        # sum of their magnitudes, as its rounding is (in 16 bits O's rounding alone is 2^-9 of it).
        terms = np.exp(c["sinks"][None, :, None] - lse) * np.einsum("bshd,bshd->bhs", dout, out)
        scale = max(float(np.abs(terms).sum(axis=(0, 2)).max()), 1e-12)
        summed = sum(g[3] for _, _, _, g in results)
        errors["dsinks"] = float(np.abs(summed - dsinks).max() / scale) if np.all(np.isfinite(summed)) else math.inf
    bad = {name: e for name, e in errors.items() if not e < tol}
    assert not bad, f"{bad} in {describe(c)}"
