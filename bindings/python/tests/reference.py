"""The tests' independent truth: global positions from DESIGN.md's table and dense float64
attention (forward and backward) over the whole sequence, written in numpy without stria."""

from __future__ import annotations

import numpy as np

LAYOUTS = ("contiguous", "striped", "zigzag")


def positions_ref(layout: str, seq_len: int, world_size: int, rank: int) -> np.ndarray:
    """Global position of each local token of `rank` (DESIGN.md, "Layouts")."""
    n = seq_len // world_size
    i = np.arange(n, dtype=np.int64)
    if layout == "contiguous":
        return rank * n + i
    if layout == "striped":
        return i * world_size + rank
    if layout == "zigzag":
        c = n // 2
        return np.where(i < c, rank * c + i, (2 * world_size - 1 - rank) * c + (i - c))
    raise ValueError(layout)


def document_ids(cu_seqlens, batch: int, seq: int) -> np.ndarray:
    """[B, S]: the document of each position, from boundaries [0, s1, ..., S] (one row for every
    batch row, or a row each)."""
    cu = np.broadcast_to(np.asarray(cu_seqlens, dtype=np.int64), (batch, np.shape(cu_seqlens)[-1]))
    pos = np.arange(seq)
    return np.stack([np.searchsorted(row, pos, side="right") - 1 for row in cu])


def _scores(q: np.ndarray, k: np.ndarray, causal: bool, scale: float, cu_seqlens=None, window=None) -> np.ndarray:
    """Masked scaled scores [B, H, S, S] (q: [B, S, Hq, D], k: [B, S, Hkv, D], GQA by repeat);
    with cu_seqlens, a query sees only keys of its own document; with window (left, right), query
    i only keys i - left .. i + right (-1: unbounded)."""
    group = q.shape[2] // k.shape[2]
    kk = np.repeat(k, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    seq = q.shape[1]
    if causal:
        s = np.where(np.tril(np.ones((seq, seq), dtype=bool)), s, -np.inf)
    if cu_seqlens is not None:
        doc = document_ids(cu_seqlens, q.shape[0], seq)
        same = doc[:, None, :, None] == doc[:, None, None, :]
        s = np.where(same, s, -np.inf)
    if window is not None:
        i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
        left, right = window
        inside = ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))
        s = np.where(inside, s, -np.inf)
    return s


def attention_ref(q, k, v, causal: bool, scale: float, cu_seqlens=None, window=None) -> tuple[np.ndarray, np.ndarray]:
    """out [B, S, Hq, D] and lse [B, Hq, S] of softmax(scale * q k^T + mask) v, in float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = _scores(q, k, causal, scale, cu_seqlens, window)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    lse = (np.log(denom) + m)[..., 0]
    p /= denom
    group = q.shape[2] // k.shape[2]
    out = np.einsum("bhij,bjhd->bihd", p, np.repeat(v, group, axis=2))
    return out, lse


def attention_backward_ref(q, k, v, dout, causal: bool, scale: float, cu_seqlens=None, window=None):
    """dq, dk, dv of attention_ref for the output gradient dout, in float64."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    group = q.shape[2] // k.shape[2]
    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = _scores(q, k, causal, scale, cu_seqlens, window)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = np.einsum("bihd,bjhd->bhij", dout, vv)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhij,bjhd->bihd", ds, kk) * scale
    dkk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
    dvv = np.einsum("bhij,bihd->bjhd", p, dout)

    def fold(x):  # sum the query heads of each KV group
        b, seq, _, d = x.shape
        return x.reshape(b, seq, k.shape[2], group, d).sum(axis=3)

    return dq, fold(dkk), fold(dvv)


def rel_err(x, ref) -> float:
    """||x - ref|| / ||ref|| in float64; NaN anywhere in x gives inf (never passes)."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    if not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


TOLERANCE = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 2e-2}


def random_inputs(b: int, s: int, hq: int, hkv: int, d: int, seed: int):
    """q, k, v and output weights w of a whole sequence, float32 [B, S, H, D], from `seed`: what
    the ranks of a test's ring (in processes of their own) and the test itself agree on."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, s, hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, s, hkv, d), dtype=np.float32)
    w = rng.standard_normal((b, s, hq, d), dtype=np.float32)
    return q, k, v, w
