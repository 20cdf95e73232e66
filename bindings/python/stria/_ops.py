"""Attention, sharding and balance analysis over stria.capi, with outputs allocated on demand.

Tensors are any objects implementing ``__dlpack__`` (numpy arrays, torch tensors, ...), passed
without a copy. Shapes (DESIGN.md, "Tensors"): q ``[B, L, Hq, D]``, k and v ``[B, L, Hkv, D]``
(Hq a multiple of Hkv), out like q, lse ``[B, Hq, L]`` float32; float32, float16 or bfloat16; any
strides with a contiguous last dimension. An output that is passed in is the object written and
returned; one that is not is allocated like the inputs (same framework, device and dtype).
"""

from __future__ import annotations

import operator

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import capi
from ._enums import Layout, LayoutLike
from ._plan import Plan
from ._tensors import default_stream, empty_like, for_dlpack, shape_of

if TYPE_CHECKING:
    from ._context import Context

Tensor = Any  # any object implementing __dlpack__


def attention_params(
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    plan: Plan | None = None,
    window: tuple[int, int] | None = None,
    softcap: float | None = None,
) -> capi.stria_attention_params_t:
    """A stria_attention_params_t; softmax_scale None (or 0) means 1/sqrt(D); plan: a stria.Plan
    the ring runs on instead of the layout; window: ``(left, right)`` as sliding_window gives it
    (None: no window); softcap: logit softcapping (None or 0: none). The fields that point at
    memory (the documents, the sinks) go to the call beside it."""
    if not isinstance(causal, (bool, int, np.bool_, np.integer)):
        # A string or None would pass by its truth value ("no" is causal); say so instead.
        raise TypeError(f"causal must be a bool, not {type(causal).__name__} ({causal!r})")
    params = capi.stria_attention_params_t()
    capi.stria_attention_params_init(params)
    params.layout = Layout.of(layout)
    params.causal = 1 if causal else 0
    params.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
    if plan is not None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a stria.Plan or None, not {type(plan).__name__}")
        params.plan = plan.handle
    if window is not None:
        params.window_left, params.window_right = window
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.integer, np.floating)):
            raise TypeError(f"softcap must be None or a number, not {type(softcap).__name__} ({softcap!r})")
        params.softcap = float(softcap)
    return params


def check_boundaries(shape: tuple, integer: bool, dtype: str, batch: int, func: str) -> None:
    """What every front end of the package (numpy and torch here, stria.jax on traced arrays)
    requires of cu_seqlens before the library reads it: integers, as ``[n + 1]`` (every batch
    row's) or ``[B, n + 1]`` with n >= 1. The values are the library's to check."""
    if not integer:
        raise TypeError(f"{func}(): cu_seqlens must hold integers (int64 positions), not {dtype}")
    if len(shape) not in (1, 2) or shape[-1] < 2 or (len(shape) == 2 and shape[0] != batch):
        raise ValueError(
            f"{func}(): cu_seqlens must be [n + 1] or [B, n + 1] document boundaries with n >= 1 and B = {batch} "
            f"(q's batch), not of shape {tuple(shape)}"
        )


def document_boundaries(cu_seqlens: Any, batch: int, func: str = "attention_forward") -> np.ndarray:
    """cu_seqlens as the library reads it: a C-contiguous int64 array of ``batch`` rows.

    cu_seqlens holds the global positions where documents start, and the sequence length last:
    ``[0, s1, s2, ..., S]`` for every batch row (a 1-D sequence), or one such row per batch row
    (2-D, ``[B, n + 1]``; rows with fewer documents repeat S). Anything ``np.asarray`` reads,
    or a torch tensor (copied to the host). Integer values only.
    """
    if hasattr(cu_seqlens, "detach") and hasattr(cu_seqlens, "cpu"):  # a torch tensor, on any device
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    arr = np.asarray(cu_seqlens)
    check_boundaries(arr.shape, arr.dtype.kind in "iu" and arr.dtype != np.uint64, str(arr.dtype), batch, func)
    return np.ascontiguousarray(np.broadcast_to(arr, (batch, arr.shape[-1])), dtype=np.int64)


def _documents_for(cu_seqlens: Any, q: Tensor, func: str) -> np.ndarray | None:
    """cu_seqlens as document_boundaries gives it for q's batch; None without documents, or for a
    q the library will reject anyway (it names the problem)."""
    if cu_seqlens is None:
        return None
    shape = shape_of(q, func, "q")
    if len(shape) != 4:
        return np.ascontiguousarray(np.atleast_2d(np.asarray(cu_seqlens)), dtype=np.int64)
    return document_boundaries(cu_seqlens, shape[0], func)


def sliding_window(window: Any, func: str = "attention_forward") -> tuple[int, int] | None:
    """window as the library takes it: None (no window), or ``(left, right)``, the keys a query at
    position i sees being i - left .. i + right (when causal, up to i), each >= 0 or -1 for
    unbounded on that side. ``(-1, -1)`` is no window."""
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError(f"{func}(): window must be None or (left, right), not {window!r}") from None
    for name, x in (("left", left), ("right", right)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < -1:
            raise ValueError(f"{func}(): window {name} must be an integer >= 0, or -1 (unbounded), not {x!r}")
    return None if (left, right) == (-1, -1) else (int(left), int(right))


def apply_deterministic(ctx: Context, on: bool) -> None:
    """Sets stria_context_set_deterministic on ctx where the library does not have `on` yet
    (InvalidArgumentError on a closed context either way)."""
    handle = _handle(ctx, "deterministic")
    if ctx._applied_deterministic != on:
        capi.stria_context_set_deterministic(handle, int(on))
        ctx._applied_deterministic = on


def _set_call_tag(handle: Any, call_tag: int, func: str) -> None:
    """Tags the next call on the context (stria_context_set_call_tag); 0 leaves it untagged.

    Set on every call, 0 included: the wrapper of the call itself can still raise before the
    library takes the tag (a stream of the wrong type, an interrupt), and a tag left behind would
    otherwise name the context's next call, tagged or not.
    """
    if isinstance(call_tag, bool) or not isinstance(call_tag, (int, np.integer)) or not 0 <= call_tag < 2**64:
        raise ValueError(f"{func}(): call_tag must be an integer in [0, 2**64), not {call_tag!r}")
    capi.stria_context_set_call_tag(handle, int(call_tag))


def _lse_shape(q: Tensor) -> tuple[int, ...]:
    shape = shape_of(q, "attention_forward", "q")
    # A q of another rank is the library's to reject (with its message): give it any lse.
    return (shape[0], shape[2], shape[1]) if len(shape) == 4 else (1,)


def _handle(ctx: Context, func: str) -> Any:
    """ctx's library handle; a TypeError naming the argument for anything but a Context."""
    from ._context import Context  # noqa: PLC0415 - _context imports this module

    if not isinstance(ctx, Context):
        raise TypeError(f"{func}(): argument 'ctx' must be a stria.Context, not {type(ctx).__name__}")
    return ctx.handle


def attention_forward(
    ctx: Context,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    stream: int | None = None,
    call_tag: int = 0,
) -> tuple[Tensor, Tensor]:
    """Exact attention of this rank's queries over the whole (sharded) sequence.

    A collective: every rank of ctx's group calls it with the same shapes and parameters (the
    ranks of a local group each from its own thread). Returns ``(out, lse)``: the objects passed
    in, or new ones like q (lse: float32 ``[B, Hq, L]``). Raises a StriaError subclass with the
    library's message on failure. A rank that cannot start the call (bad arguments, no memory for
    its workspace) makes every rank raise at once, the same subclass on every rank but for bad
    arguments (InvalidArgumentError on the others); the context stays usable. After a failure in
    the middle of the ring the context can only be closed.

    call_tag (nonzero) names the call for the ranks' pairing (stria_context_set_call_tag): ranks
    whose calls pair up with different tags all raise InvalidArgumentError instead of exchanging
    blocks of different calls. For callers that may make independent calls in different orders
    on different ranks.

    cu_seqlens (optional) packs several documents into the sequence: a query then sees only the
    keys of its own document. Global positions ``[0, s1, ..., S]`` (S = L * world size), the same
    on every rank, for every batch row or one row per batch row (see document_boundaries); host
    memory (a CUDA tensor is copied to the host), on CPU and CUDA contexts alike.

    window (optional) is a sliding window ``(left, right)``: the query at global position i sees
    the keys at i - left .. i + right (when causal, up to i), within its document if cu_seqlens is
    given; -1 leaves a side unbounded (see sliding_window).

    plan (optional) is a stria.Plan: the ring runs on it instead of `layout` (tensors of its
    local_len slots, its batch size), and its boundaries are the document mask (cu_seqlens, if
    given, must be the same).

    softcap (optional, > 0) caps the scores: s = softmax_scale * q.k becomes softcap * tanh(s / softcap)
    before the mask (Gemma 2).

    sinks (optional) is a float32 ``[Hq]`` tensor of attention-sink logits, one per query head, on
    the context's device: each joins its head's softmax denominators once and carries no value
    (gpt-oss); lse includes it, and a row that sees no key gets out 0 and lse z. The same values on
    every rank.

    FP8 inputs: q, k and v may all be float8_e4m3fn (torch.float8_e4m3fn, say). out is then
    float32, float16 or bfloat16 (a new out is bfloat16), and the attention sees q * q_descale,
    k * k_descale and v * v_descale: each descale None (1) or a float32 tensor ``[1]`` (the
    tensor's) or ``[H]`` (one per head: Hq for q, Hkv for k and v) on the context's device. The
    forward only: the backward takes float32, float16 or bfloat16.
    """
    if out is None:
        fp8 = "float8_e4m3fn" in str(getattr(q, "dtype", ""))
        out = empty_like(q, shape_of(q, "attention_forward", "q"), dtype="bfloat16" if fp8 else None, name="q")
    if lse is None:
        lse = empty_like(q, _lse_shape(q), dtype="float32", name="q")
    if stream is None:
        stream = default_stream(q)
    handle = _handle(ctx, "attention_forward")
    win = sliding_window(window, "attention_forward")
    params = attention_params(layout, causal, softmax_scale, plan, win, softcap)
    docs = _documents_for(cu_seqlens, q, "attention_forward")
    tensors = [for_dlpack(x) for x in (q, k, v, out, lse)]
    z = None if sinks is None else for_dlpack(sinks)
    descales = [None if x is None else for_dlpack(x) for x in (q_descale, k_descale, v_descale)]
    _set_call_tag(handle, call_tag, "attention_forward")  # last, so that little can fail in between
    capi.stria_py_attention_forward(handle, params, docs, *tensors, z, *descales, stream)
    return out, lse


def attention_backward(
    ctx: Context,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    dq: Tensor | None = None,
    dk: Tensor | None = None,
    dv: Tensor | None = None,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    dsinks: Tensor | None = None,
    stream: int | None = None,
    call_tag: int = 0,
    deterministic: bool | None = None,
) -> tuple[Tensor, ...]:
    """Gradients of attention_forward: returns ``(dq, dk, dv)`` for this rank's q, k, v, and with
    sinks ``(dq, dk, dv, dsinks)``.

    out and lse are the forward's; dout is the gradient of out. A collective like the forward,
    with the same parameters (call_tag, cu_seqlens, window, plan, softcap and sinks as there).
    dsinks (float32 ``[Hq]``, allocated like sinks when not given) gets this rank's part of the
    sinks' gradient, summed over its rows and batch: the sum over the ranks is the whole gradient
    (reduce it as any weight every rank holds). deterministic: the same bits on every run for this
    call (None: the context's ``deterministic`` setting).
    """
    if dq is None:
        dq = empty_like(q, shape_of(q, "attention_backward", "q"), name="q")
    if dk is None:
        dk = empty_like(k, shape_of(k, "attention_backward", "k"), name="k")
    if dv is None:
        dv = empty_like(v, shape_of(v, "attention_backward", "v"), name="v")
    if stream is None:
        stream = default_stream(q)
    if sinks is not None and dsinks is None:
        dsinks = empty_like(sinks, shape_of(sinks, "attention_backward", "sinks"), dtype="float32", name="sinks")
    handle = _handle(ctx, "attention_backward")
    win = sliding_window(window, "attention_backward")
    params = attention_params(layout, causal, softmax_scale, plan, win, softcap)
    docs = _documents_for(cu_seqlens, q, "attention_backward")
    tensors = [for_dlpack(x) for x in (q, k, v, out, lse, dout, dq, dk, dv)]
    z = None if sinks is None else for_dlpack(sinks)
    dz = None if dsinks is None else for_dlpack(dsinks)
    apply_deterministic(ctx, ctx.deterministic if deterministic is None else bool(deterministic))
    _set_call_tag(handle, call_tag, "attention_backward")  # last, as in attention_forward
    capi.stria_py_attention_backward(handle, params, docs, *tensors, z, dz, stream)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def positions(layout: LayoutLike, seq_len: int, world_size: int, rank: int, *, ulysses: int = 1) -> np.ndarray:
    """The global position of each of this rank's seq_len / world_size tokens (int64), e.g. for
    rotary position ids and for picking this rank's labels. ulysses > 1: rank of a grid of
    all-to-all groups of that many ranks (Context.ulysses; stria_grid_positions)."""
    if ulysses == 1:
        raw = capi.stria_layout_positions(Layout.of(layout), seq_len, world_size, rank)
    else:
        raw = capi.stria_grid_positions(Layout.of(layout), seq_len, world_size, operator.index(ulysses), rank)
    return np.frombuffer(raw, dtype=np.int64)


def _resized(shape: tuple[int, ...], seq_dim: int, factor_num: int, factor_den: int) -> tuple[int, ...] | None:
    """shape with shape[seq_dim] scaled by num/den, or None when seq_dim or the factor is invalid
    (then the caller allocates any tensor and the library reports the problem)."""
    if factor_num <= 0 or factor_den <= 0 or not -len(shape) <= seq_dim < len(shape):
        return None
    dims = list(shape)
    dims[seq_dim] = dims[seq_dim] * factor_num // factor_den
    return tuple(dims)


def shard(
    full: Tensor,
    world_size: int,
    rank: int,
    *,
    layout: LayoutLike = Layout.STRIPED,
    seq_dim: int = 1,
    out: Tensor | None = None,
    stream: int | None = None,
    ulysses: int = 1,
) -> Tensor:
    """This rank's tokens of a full-sequence tensor (along seq_dim; negative counts from the end),
    copied into out (or a new tensor like full) in the order of the layout (on a grid of
    all-to-all groups of `ulysses` ranks: stria_grid_shard)."""
    if out is None:
        full_shape = shape_of(full, "shard", "full")
        out = empty_like(full, _resized(full_shape, seq_dim, 1, world_size) or full_shape, name="full")
    if stream is None:
        stream = default_stream(full)
    if ulysses == 1:
        capi.stria_shard(Layout.of(layout), world_size, rank, seq_dim, for_dlpack(full), for_dlpack(out), stream)
    else:
        capi.stria_grid_shard(
            Layout.of(layout), world_size, operator.index(ulysses), rank, seq_dim, for_dlpack(full), for_dlpack(out),
            stream,
        )
    return out


def unshard(
    local: Tensor,
    world_size: int,
    rank: int,
    *,
    layout: LayoutLike = Layout.STRIPED,
    seq_dim: int = 1,
    out: Tensor | None = None,
    stream: int | None = None,
    ulysses: int = 1,
) -> Tensor:
    """Writes this rank's tokens back into their places in a full-sequence tensor and returns it
    (on a grid of all-to-all groups of `ulysses` ranks: stria_grid_unshard).

    Pass the same `out` from every rank to assemble the whole sequence; a new `out` is zero
    everywhere but this rank's positions.
    """
    if out is None:
        local_shape = shape_of(local, "unshard", "local")
        shape = _resized(local_shape, seq_dim, world_size, 1) or local_shape
        out = empty_like(local, shape, zero=True, name="local")
    if stream is None:
        stream = default_stream(local)
    if ulysses == 1:
        capi.stria_unshard(Layout.of(layout), world_size, rank, seq_dim, for_dlpack(local), for_dlpack(out), stream)
    else:
        capi.stria_grid_unshard(
            Layout.of(layout), world_size, operator.index(ulysses), rank, seq_dim, for_dlpack(local), for_dlpack(out),
            stream,
        )
    return out


@dataclass(frozen=True)
class Balance:
    """The work of one attention call under a layout, in visible (query, key) pairs counted at
    tile granularity (stria_balance_t)."""

    total_work: float  #: pairs computed, all ranks, all steps
    ring_latency: float  #: sum over ring steps of the busiest rank's work
    speedup: float  #: total_work / ring_latency (N is perfect)
    imbalance: float  #: ring_latency / (total_work / N) (1 is perfect)
    #: one device's work at the same tile size over N, each document starting its own tiles: the
    #: latency a ring cannot beat (ideal_latency / ring_latency is the ring's fraction of ideal)
    ideal_latency: float = 0.0
    #: K/V token rows one forward call sends over all ranks and steps (a plan's trimmed blocks)
    kv_rows_sent: float = 0.0


def analyze_balance(
    layout: LayoutLike, seq_len: int, world_size: int, *, causal: bool = True, tile: int = 1, ulysses: int = 1
) -> Balance:
    """How evenly a layout spreads causal (or full) attention over the ring's ranks and steps; on a
    grid of all-to-all groups of `ulysses` ranks, over the ring of groups, each member computing
    its share of the heads (stria_grid_analyze_balance)."""
    if ulysses == 1:
        b = capi.stria_analyze_balance(Layout.of(layout), 1 if causal else 0, seq_len, world_size, tile)
    else:
        b = capi.stria_grid_analyze_balance(
            Layout.of(layout), 1 if causal else 0, seq_len, world_size, operator.index(ulysses), tile
        )
    return Balance(b.total_work, b.ring_latency, b.speedup, b.imbalance, b.ideal_latency, b.kv_rows_sent)


def analyze_balance_steps(
    layout: LayoutLike, seq_len: int, world_size: int, *, causal: bool = True, tile: int = 1
) -> np.ndarray:
    """The work behind analyze_balance: a float64 array [step, rank] of world_size x world_size."""
    layout, flag = Layout.of(layout), 1 if causal else 0
    # The same checks without the world_size^2 array: bad arguments get the library's message
    # rather than a MemoryError for an absurd world_size.
    capi.stria_analyze_balance(layout, flag, seq_len, world_size, tile)
    raw = capi.stria_analyze_balance_steps(layout, flag, seq_len, world_size, tile)
    return np.frombuffer(raw, dtype=np.float64).reshape(world_size, world_size)


@dataclass(frozen=True)
class StepTime:
    """Where one ring step of a context's last attention call went (stria_step_time_t)."""

    compute_s: float  #: wall time of this rank's compute in the step
    compute_cpu_s: float  #: CPU time of its compute threads divided by their number
    wait_s: float  #: time blocked on the ring's transfers after the compute


@dataclass(frozen=True)
class Traffic:
    """What a rank sent in its context's last attention call (stria_traffic_t). A call on a
    document plan sends only the K/V rows that ranks further along the ring see."""

    kv_bytes: int  #: K/V blocks
    dkv_bytes: int  #: dK/dV partials (backward calls)
    messages: int  #: ring messages (and a grid's all-to-all messages)
    all_to_all_bytes: int = 0  #: a grid's all-to-all, sent to the other members of the group


def traffic(ctx: Context) -> Traffic:
    """What ctx sent in its last attention call (zeros before the first)."""
    t = capi.stria_context_get_traffic(ctx.handle)
    return Traffic(int(t.kv_bytes), int(t.dkv_bytes), int(t.messages), int(t.all_to_all_bytes))


def set_grid(ctx: Context, ulysses: int) -> None:
    """stria_context_set_grid: all-to-all groups of `ulysses` consecutive ranks (1: the ring)."""
    capi.stria_context_set_grid(_handle(ctx, "ulysses"), operator.index(ulysses))


def step_times(ctx: Context) -> list[StepTime]:
    """Per-step timings of ctx's last attention call (empty before the first)."""
    capacity = max(ctx.world_size, 1)
    while True:
        steps, count = capi.stria_context_get_step_times(ctx.handle, capacity)
        if count <= capacity:
            return [StepTime(s.compute_s, s.compute_cpu_s, s.wait_s) for s in steps]
        capacity = count
