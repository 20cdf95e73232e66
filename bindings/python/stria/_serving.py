"""Serving over a KV cache sharded across the ranks (stria.h, stria_attention_decode).

Each rank holds its share of every sequence's cache: with the striped layout cached position t
lives on rank ``t % N`` at slot ``t // N``, so the shares grow evenly as generation goes on;
contiguous (rank ``t // C``, slot ``t % C``, C the per-rank capacity) and zigzag are there too.
A decode call gives every rank the same new queries; each attends them to its share and one
all-gather merges the partial results exactly, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import capi
from ._enums import Layout, LayoutLike
from ._ops import _handle, _set_call_tag, attention_params
from ._tensors import default_stream, empty_like, for_dlpack, shape_of

if TYPE_CHECKING:
    from ._context import Context

Tensor = Any  # any object implementing __dlpack__


def _host_int64(x: Any, name: str, func: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, on any device
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
        raise TypeError(f"{func}(): {name} must hold integers, not {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def cache_placement(
    layout: LayoutLike, world_size: int, capacity: int, positions: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Where a sharded cache keeps each of `positions`: ``(ranks, slots)``, arrays like positions.

    capacity is the per-rank number of slots (a contiguous cache's dimension 1; max_blocks *
    block_size for a paged one); positions must be below ``world_size * capacity``.
    """
    pos = _host_int64(positions, "positions", "cache_placement")
    n, cap = int(world_size), int(capacity)
    if n < 1 or cap < 1:
        raise ValueError(f"cache_placement(): world_size and capacity must be >= 1, not {world_size}, {capacity}")
    if pos.size and (pos.min() < 0 or pos.max() >= n * cap):
        raise ValueError(f"cache_placement(): positions must lie in [0, {n * cap}) ({n} ranks of {cap} slots)")
    lay = Layout.of(layout)
    if lay == Layout.STRIPED:
        return pos % n, pos // n
    if lay == Layout.CONTIGUOUS:
        return pos // cap, pos % cap
    if cap % 2:
        raise ValueError(f"cache_placement(): a zigzag cache needs an even capacity, not {cap}")
    half = cap // 2
    chunk = pos // half
    front = chunk < n
    return np.where(front, chunk, 2 * n - 1 - chunk), np.where(front, 0, half) + pos % half


@dataclass
class _ServingCall:
    """What a serving call passes the library beside its own tensors."""

    handle: Any
    params: Any
    out: Tensor
    lse: Tensor
    stream: int
    lens: np.ndarray
    cache: list
    table: Any
    sinks: Any


def _serving_call(func, ctx, q, out, lse, stream, layout, causal, softmax_scale, window_left, softcap, cache_lens,
                  k_cache, v_cache, block_table, sinks, call_tag) -> _ServingCall:  # noqa: ANN001
    """The checks and conversions attention_decode and attention_prefill share: outputs allocated like
    q where not given, the params, the lengths on the host, the cache's tensors; the call tag set last."""
    shape = shape_of(q, func, "q")
    if out is None:
        out = empty_like(q, shape, name="q")
    if lse is None:
        lse = empty_like(q, (shape[0], shape[2], shape[1]) if len(shape) == 4 else (1,), dtype="float32", name="q")
    if stream is None:
        stream = default_stream(q)
    if isinstance(window_left, bool) or not isinstance(window_left, (int, np.integer)):
        raise TypeError(f"{func}(): window_left must be an integer (-1: no window), not {window_left!r}")
    handle = _handle(ctx, func)
    params = attention_params(layout, causal, softmax_scale, None, None, softcap)
    params.window_left = int(window_left)
    lens = _host_int64(cache_lens, "cache_lens", func)
    if lens.ndim != 1:
        raise ValueError(f"{func}(): cache_lens must be 1-D, one length per sequence, not of shape {lens.shape}")
    call = _ServingCall(
        handle, params, out, lse, stream, lens, [for_dlpack(x) for x in (k_cache, v_cache)],
        None if block_table is None else for_dlpack(block_table), None if sinks is None else for_dlpack(sinks),
    )
    _set_call_tag(handle, call_tag, func)
    return call


def attention_decode(
    ctx: Context,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Any,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    *,
    block_table: Tensor | None = None,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    window_left: int = -1,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    stream: int | None = None,
    call_tag: int = 0,
) -> tuple[Tensor, Tensor]:
    """Attention of new query tokens to a KV cache sharded over ctx's ranks; returns ``(out, lse)``.

    A collective: every rank passes the same q ``[B, T, Hq, D]`` (query t of sequence b at
    position ``cache_lens[b] + t``), the same cache_lens (``[B]`` integers, the tokens cached per
    sequence before the call) and its own share of the cache: k_cache and v_cache
    ``[B, C, Hkv, D]``, or with block_table (int32 ``[B, max_blocks]``) pools
    ``[num_blocks, block_size, Hkv, D]`` as paged serving engines keep them (the library reads
    the table on the host: a CPU tensor spares a GPU context the copy and the wait for the stream
    that a table on the GPU costs each call). k_new and v_new
    (``[B, T, Hkv, D]``, or None) are the new tokens' keys and values: the rank that holds each
    stores it into its share first and the queries see them (causally unless causal is False);
    the caller then advances cache_lens by T. out (like q) and lse (float32 ``[B, Hq, T]``) are
    the same bits on every rank. window_left bounds how far back a query sees (-1: no bound);
    softcap and sinks as in attention_forward.
    """
    a = _serving_call("attention_decode", ctx, q, out, lse, stream, layout, causal, softmax_scale, window_left,
                      softcap, cache_lens, k_cache, v_cache, block_table, sinks, call_tag)
    new = [None if x is None else for_dlpack(x) for x in (k_new, v_new)]
    capi.stria_py_attention_decode(
        a.handle, a.params, *a.cache, a.table, a.lens, for_dlpack(q), *new, for_dlpack(a.out), for_dlpack(a.lse),
        a.sinks, a.stream
    )
    return a.out, a.lse


PREFILL_MODES = {"auto": 0, "pass_kv": 1, "pass_q": 2}


def attention_prefill(
    ctx: Context,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Any,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    *,
    mode: str = "auto",
    block_table: Tensor | None = None,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    window_left: int = -1,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    stream: int | None = None,
    call_tag: int = 0,
) -> tuple[Tensor, Tensor]:
    """Prefill with a KV cache sharded over ctx's ranks (chunked prefill, a new turn); returns
    ``(out, lse)`` for this rank's new tokens.

    P new tokens per sequence are sharded by `layout` as for attention_forward: q ``[B, L, Hq, D]``
    and k, v ``[B, L, Hkv, D]`` hold this rank's L = P / N of them, local token i at chunk position
    ``stria.positions(layout, P, N, rank)[i]``, which is position ``cache_lens[b] + that`` of
    sequence b. Each attends to the whole cache (every rank's share, as attention_decode takes it)
    and causally to the new tokens; their keys and values are stored where `layout` puts their
    positions (advance cache_lens by P afterwards). mode: "pass_kv" sends each rank's keys and values
    around the ring, "pass_q" the queries (the partial results go home), "auto" whichever moves fewer
    bytes; the results agree to rounding.
    """
    if mode not in PREFILL_MODES:
        raise ValueError(f"attention_prefill(): mode must be one of {sorted(PREFILL_MODES)}, not {mode!r}")
    a = _serving_call("attention_prefill", ctx, q, out, lse, stream, layout, causal, softmax_scale, window_left,
                      softcap, cache_lens, k_cache, v_cache, block_table, sinks, call_tag)
    capi.stria_py_attention_prefill(
        a.handle, a.params, *a.cache, a.table, a.lens, for_dlpack(q), PREFILL_MODES[mode], for_dlpack(k),
        for_dlpack(v), for_dlpack(a.out), for_dlpack(a.lse), a.sinks, a.stream
    )
    return a.out, a.lse


class KVCache:
    """This rank's share of a contiguous KV cache spread over ctx's ranks by a layout.

    ``k`` and ``v`` are ``[batch, capacity, kv_heads, head_dim]`` tensors of `like`'s framework,
    device and dtype (capacity: slots per rank, so the whole cache holds world_size * capacity
    positions per sequence); ``lens`` is the number of tokens cached per sequence, the same on
    every rank. decode() attends new tokens every rank has and appends them; prefill() does the same
    for new tokens sharded over the ranks; fill() loads a prefix computed elsewhere.
    """

    def __init__(
        self,
        ctx: Context,
        like: Tensor,
        batch: int,
        capacity: int,
        kv_heads: int,
        head_dim: int,
        *,
        layout: LayoutLike = Layout.STRIPED,
        dtype: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.layout = Layout.of(layout)
        self.capacity = int(capacity)
        shape = (batch, capacity, kv_heads, head_dim)
        self.k = empty_like(like, shape, dtype=dtype, zero=True, name="like")
        self.v = empty_like(like, shape, dtype=dtype, zero=True, name="like")
        self.lens = np.zeros(batch, dtype=np.int64)

    def fill(self, k: Tensor, v: Tensor, lens: Any) -> None:
        """Loads this rank's slots of whole-sequence keys and values ``[batch, S, kv_heads,
        head_dim]`` (the same on every rank; sequence b's first lens[b] positions) and sets lens."""
        lens = _host_int64(lens, "lens", "KVCache.fill")
        rank, n = self.ctx.rank, self.ctx.world_size
        for b, length in enumerate(lens.tolist()):
            pos = np.arange(length, dtype=np.int64)
            ranks, slots = cache_placement(self.layout, n, self.capacity, pos)
            mine = ranks == rank
            if mine.any():
                p, s = pos[mine].tolist(), slots[mine].tolist()
                self.k[b, s] = k[b, p]
                self.v[b, s] = v[b, p]
        self.lens = lens.copy()

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        """attention_prefill against this cache (keyword arguments as there; the new tokens sharded by
        the cache's layout): stores them and advances lens by their number, L * world_size. Returns
        out."""
        out, _ = attention_prefill(
            self.ctx, q, k, v, self.k, self.v, self.lens, layout=self.layout, **kwargs
        )
        self.lens = self.lens + shape_of(q, "KVCache.prefill", "q")[1] * self.ctx.world_size
        return out

    def decode(self, q: Tensor, k_new: Tensor | None = None, v_new: Tensor | None = None, **kwargs: Any) -> Tensor:
        """attention_decode against this cache (keyword arguments as there); with k_new and v_new,
        the new tokens are appended and lens advances by their number. Returns out."""
        out, _ = attention_decode(
            self.ctx, q, self.k, self.v, self.lens, k_new, v_new, layout=self.layout, **kwargs
        )
        if k_new is not None:
            self.lens = self.lens + shape_of(q, "KVCache.decode", "q")[1]
        return out
