"""The random feature combinations of test_combinations.py, drawn from a seed alone: shared by the
test and by jax_combinations.py, the same cases through stria.jax in a process of its own (JAX
is set up there), so this module needs numpy and the package only."""

from __future__ import annotations

import math

import numpy as np
import stria


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
    shown = ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("inputs", "sinks"))
    return f"{shown}, sinks={c['sinks'] is not None}"


def error(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||, with ||ref|| floored at 0.1 per element (the inputs are of order 1): a
    gradient that is zero in exact arithmetic (every row sees one key) is met by rounding alone,
    which this measures against the gradients' usual size. NaN never passes."""
    got = np.asarray(got, np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 0.1 * math.sqrt(ref.size)))


def plan_for(c: dict):  # noqa: ANN201 - a stria.Plan or None
    """The case's document plan (None on a fixed layout), its slots a multiple of the grid's U."""
    if not c["plan"]:
        return None
    n, ulysses = c["n"], c["ulysses"]
    plan = stria.Plan(c["cu_seqlens"], n // ulysses, causal=c["causal"], window=c["window"], tile=4)
    if plan.local_len % ulysses:  # slots the group splits evenly
        local_len = -(-plan.local_len // ulysses) * ulysses
        plan.close()
        plan = stria.Plan(c["cu_seqlens"], n // ulysses, causal=c["causal"], window=c["window"], tile=4,
                          local_len=local_len)
    return plan
