"""Features in random combination: each case draws a world size, a grid, a fixed layout or a document
plan (any S then), causal or not, documents, a sliding window, softcap, sinks, GQA, the dtype, the
deterministic backward and the front end (the package's calls on arrays, or stria.torch's autograd),
runs forward and backward on a local group and sets the gathered result against the float64
reference of the whole sequence. Cases of their own go through stria.jax under jit
(jax_combinations.py, in a process of its own). The other suites take each feature through its
own cases; this one is for how they meet. STRIA_COMBINATION_CASES and STRIA_JAX_COMBINATION_CASES
set how many cases run (more for a longer search)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import stria
from combination_cases import describe, draw_case, error, plan_for
from conftest import TIMEOUT_S, torch_or_skip
from reference import TOLERANCE

torch = torch_or_skip()
import stria.torch as stria_torch  # noqa: E402 - needs torch
from test_softcap_sinks import reference  # noqa: E402 - the float64 reference with softcap and sinks

CASES = int(os.environ.get("STRIA_COMBINATION_CASES", "80"))


def run_case(c: dict) -> tuple[list, object]:
    """Each rank's (positions, out, lse or None, [dq, dk, dv(, dsinks)]) in float64, and the plan."""
    n, ulysses, dtype = c["n"], c["ulysses"], c["dtype"]
    tdtype = getattr(torch, dtype)
    full = [torch.from_numpy(x).to(tdtype) for x in c["inputs"]]
    plan = plan_for(c)

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
    check(c, results, [x.to(torch.float64).numpy() for x in full])


JAX_CASES = int(os.environ.get("STRIA_JAX_COMBINATION_CASES", "12"))
JAX_SEEDS = range(10_000, 10_000 + JAX_CASES)  # cases of their own, not the ones above again


@pytest.fixture(scope="module")
def jax_results(tmp_path_factory):
    """jax_combinations.py's results for JAX_SEEDS, in one process (JAX's start-up once)."""
    try:
        import jax  # noqa: F401
        import stria.jax  # noqa: F401 - built only where jaxlib's FFI headers were found
    except ImportError:
        if os.environ.get("STRIA_REQUIRE_JAX") == "1":
            raise
        pytest.skip("jax or stria.jax is not available")
    out_dir = tmp_path_factory.mktemp("jax_combinations")
    here = os.path.dirname(os.path.abspath(__file__))
    # The child imports the stria under test, wherever this process found it.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(stria.__file__)), here]))
    result = subprocess.run([sys.executable, os.path.join(here, "jax_combinations.py"), str(out_dir),
                             *map(str, JAX_SEEDS)], capture_output=True, text=True, timeout=900, cwd=here, env=env,
                            check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
    return out_dir


@pytest.mark.parametrize("seed", JAX_SEEDS)
def test_random_combination_through_jax(seed, jax_results):
    """The case of `seed` through stria.jax: ring attention and its gradients under jax.jit."""
    c = draw_case(seed)
    with np.load(os.path.join(jax_results, f"{seed}.npz")) as f:
        inputs = [f[f"input{i}"].astype(np.float64) for i in range(4)]
        results = [(f[f"pos{r}"], f[f"out{r}"], None, [f[f"grad{r}_{i}"] for i in range(3 + (c["sinks"] is not None))])
                   for r in range(c["n"])]
    check(c, results, inputs)


def check(c: dict, results: list, inputs: list) -> None:
    """Sets the ranks' results (run_case's) against the float64 reference on `inputs`, q, k, v and
    dout of the whole sequence as the ranks had them (rounded to the case's dtype)."""
    q, k, v, dout = inputs
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
    if any(l is not None for _, _, l, _ in results):
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
