"""PyTorch integration: ring attention as an autograd function.

- ``ring_attention(q, k, v, context)``: stria's layout, q ``[B, L, Hq, D]``, k/v ``[B, L, Hkv, D]``.
- ``scaled_dot_product_attention(query, key, value, ..., context=...)``: shaped like
  ``torch.nn.functional.scaled_dot_product_attention``, q ``[B, Hq, L, D]``. The inputs are
  transposed as strided views (no copy: stria takes any strides with a contiguous last dim) and
  so is the output.

Every rank of the context's group calls these with its own shard of the sequence (L = S/N
tokens in the layout: see stria.shard and stria.positions), the ranks of a local group each from
its own thread, in the same order, forward and backward: each call is a collective. Gradients
flow to q, k and v; a loss over a rank's tokens gives that rank's share of the gradients of
weights shared across ranks (sum them: a shared module in threads does that by itself).

CPU tensors on a CPU context; CUDA tensors on a CUDA context (the current stream is used). On
CUDA, torch runs backward on a worker thread per device, shared by all threads, where ranks on
one GPU would wait for each other in turn: LocalGroup.run runs its rank threads' backward on
the calling thread instead (torch.autograd.set_multithreading_enabled(False)); threads of your
own need the same.

``context_from_group(group)`` makes this process's Context from a torch.distributed process
group, the unique id broadcast over the group.

Serving over a KV cache sharded across the ranks takes torch tensors as they are (inference: no
autograd): ``attention_decode``, ``attention_prefill`` and ``KVCache`` here are stria's own,
re-exported so that a torch program finds them beside ring attention.

The two collectives are torch custom operators (``torch.ops.stria.attention_forward`` and
``attention_backward``, with shape-only fake implementations), so ``torch.compile`` puts them in
its graph, ``fullgraph=True`` included, instead of breaking the graph around them. The context
reaches the operator as its key (a number), looked up when the operator runs: a compiled graph
made for a context that has since closed raises instead of touching it.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import numpy as np
import torch

from . import _ops, capi
from ._context import Context, DeviceLike, context_of_key, context_or_none, parse_device
from ._enums import Layout, LayoutLike, Transport, TransportLike
from ._plan import Plan, plan_of_key
from ._serving import KVCache, attention_decode, attention_prefill

__all__ = [
    "KVCache",
    "RingAttentionFunction",
    "attention_decode",
    "attention_prefill",
    "context_from_group",
    "ring_attention",
    "ring_attention_fp8",
    "scaled_dot_product_attention",
]


def _check_tensor(func: str, name: str, x: Any) -> None:
    """A TypeError naming the argument for anything but a torch tensor (which these functions
    would otherwise fail on with an AttributeError)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{func}(): argument '{name}' must be a torch.Tensor, not {type(x).__name__}")


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x itself when stria can take its strides (unit stride in the last dim), else a copy."""
    return x if x.stride(-1) == 1 or x.size(-1) == 1 else x.contiguous()


def _op_args(
    func: str,
    context: Any,
    layout: LayoutLike,
    causal: bool,
    softmax_scale: float | None,
    cu_seqlens: Any = None,
    window: Any = None,
    plan: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> tuple:
    """The operators' arguments after their tensors: the context's key, the parameters, the
    document boundaries (an int64 CPU tensor, or None), the sliding window's two sides (-1:
    unbounded), the plan's key (0: none), the softcap (0: none) and the sinks (float32, or None)."""
    if not isinstance(context, Context):
        raise TypeError(f"{func}(): argument 'context' must be a stria.Context, not {type(context).__name__}")
    if cu_seqlens is not None:
        # As an int64 CPU tensor, which the operators' schema takes; its shape is checked against
        # q's batch when the operator runs (stria.document_boundaries).
        if not isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens = torch.as_tensor(np.asarray(cu_seqlens))
        if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
            raise TypeError(f"{func}(): cu_seqlens must hold integers (int64 positions), not {cu_seqlens.dtype}")
        cu_seqlens = cu_seqlens.detach().to(device="cpu", dtype=torch.int64)
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    left, right = _ops.sliding_window(window, func) or (-1, -1)
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"{func}(): plan must be a stria.Plan or None, not {type(plan).__name__}")
    plan_key = 0 if plan is None else plan._key
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))):
        raise TypeError(f"{func}(): softcap must be None or a number, not {type(softcap).__name__} ({softcap!r})")
    cap = 0.0 if softcap is None else float(softcap)
    if sinks is not None:
        _check_tensor(func, "sinks", sinks)
        # float32, as the library takes them: the cast is autograd's, so the gradient comes back in
        # the sinks' own dtype.
        sinks = _last_dim_contiguous(sinks.to(torch.float32))
    return (context._key, int(Layout.of(layout)), bool(causal), scale, cu_seqlens, left, right, plan_key, cap, sinks)


def _custom_op(name: str) -> Any:
    """torch.library.custom_op("stria::<name>") where torch has it (2.4 and later), else the
    function itself, which eager mode calls all the same.

    Tagged cudagraph_unsafe where torch knows the tag: a collective waits on the host for its
    peers' blocks, which a CUDA graph's replay would not do (torch.compile's "reduce-overhead"
    mode then leaves the operator out of its graphs)."""
    if not hasattr(torch.library, "custom_op"):
        return lambda f: f
    unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
    if unsafe is not None and "tags" in inspect.signature(torch.library.custom_op).parameters:
        return torch.library.custom_op(f"stria::{name}", mutates_args=(), tags=(unsafe,))
    return torch.library.custom_op(f"stria::{name}", mutates_args=())


def _lse_shape(q: torch.Tensor, func: str) -> tuple[int, int, int]:
    if q.dim() != 4:
        raise ValueError(f"{func}(): q must be [B, L, Hq, D], got shape {tuple(q.shape)}")
    return (q.shape[0], q.shape[2], q.shape[1])


@_custom_op("attention_forward")
def _forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: int,
    layout: int,
    causal: bool,
    softmax_scale: float,
    cu_seqlens: Optional[torch.Tensor] = None,  # noqa: UP045 - torch's schema inference reads Optional
    window_left: int = -1,
    window_right: int = -1,
    plan: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,  # noqa: UP045 - as cu_seqlens
) -> tuple[torch.Tensor, torch.Tensor]:
    """stria_attention_forward on the context of key `context`: (out, lse), new and compact.
    softmax_scale 0 is 1/sqrt(D); cu_seqlens: the document boundaries (int64, CPU) or None;
    window_left/right: the sliding window (-1, -1: none); plan: a stria.Plan's key (0: none);
    softcap: logit softcapping (0: none); sinks: float32 [Hq] sink logits, or None."""
    ctx = context_of_key(context, "stria.torch attention_forward")
    the_plan = plan_of_key(plan, "stria.torch attention_forward") if plan else None
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))  # as a compiled graph may lay them out
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, "attention_forward"), dtype=torch.float32, device=q.device)
    _ops.attention_forward(
        ctx,
        q,
        k,
        v,
        out,
        lse,
        layout=layout,
        causal=causal,
        softmax_scale=softmax_scale,
        cu_seqlens=cu_seqlens,
        window=(window_left, window_right),
        plan=the_plan,
        softcap=softcap,
        sinks=sinks,
    )
    return out, lse


@_custom_op("attention_backward")
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    context: int,
    layout: int,
    causal: bool,
    softmax_scale: float,
    cu_seqlens: Optional[torch.Tensor] = None,  # noqa: UP045 - as in _forward_op
    window_left: int = -1,
    window_right: int = -1,
    plan: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,  # noqa: UP045 - as in _forward_op
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """stria_attention_backward on the context of key `context`: (dq, dk, dv, dsinks), new and
    compact; dsinks is this rank's part of the sinks' gradient, or empty without sinks."""
    ctx = context_of_key(context, "stria.torch attention_backward")
    the_plan = plan_of_key(plan, "stria.torch attention_backward") if plan else None
    q, k, v, out, dout = (_last_dim_contiguous(x) for x in (q, k, v, out, dout))
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    dsinks = torch.empty((0,) if sinks is None else sinks.shape, dtype=torch.float32, device=q.device)
    _ops.attention_backward(
        ctx,
        q,
        k,
        v,
        out,
        lse,
        dout,
        dq,
        dk,
        dv,
        layout=layout,
        causal=causal,
        softmax_scale=softmax_scale,
        cu_seqlens=cu_seqlens,
        window=(window_left, window_right),
        plan=the_plan,
        softcap=softcap,
        sinks=sinks,
        dsinks=None if sinks is None else dsinks,
        # torch.use_deterministic_algorithms(True) asks every operator for the same bits each run;
        # otherwise (None) the context's own setting decides, as for any call.
        deterministic=True if torch.are_deterministic_algorithms_enabled() else None,
    )
    return dq, dk, dv, dsinks


if hasattr(_forward_op, "register_fake"):
    # What torch.compile traces with: the results' shapes, dtypes and devices, as the real
    # operators make them (compact).

    @_forward_op.register_fake
    def _forward_fake(q, k, v, context, layout, causal, softmax_scale, cu_seqlens=None, window_left=-1,  # noqa: ANN001, ANN202
                      window_right=-1, plan=0, softcap=0.0, sinks=None):
        lse = q.new_empty(_lse_shape(q, "attention_forward"), dtype=torch.float32)
        return q.new_empty(q.shape), lse

    @_backward_op.register_fake
    def _backward_fake(q, k, v, out, lse, dout, context, layout, causal, softmax_scale, cu_seqlens=None,  # noqa: ANN001, ANN202
                       window_left=-1, window_right=-1, plan=0, softcap=0.0, sinks=None):
        dsinks = q.new_empty((0,) if sinks is None else sinks.shape, dtype=torch.float32)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


class _NoSecondOrder(torch.autograd.Function):
    """Passes first-order gradients through; differentiating them again raises. stria's backward
    is not itself differentiable, so a second-order gradient (create_graph=True, then a gradient
    penalty, say) must fail rather than come out as zero."""

    @staticmethod
    def forward(fctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(fctx: Any, *unused: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise RuntimeError(
            "stria.torch: second-order gradients are not supported (the gradients of "
            "ring attention were differentiated again, e.g. after backward with create_graph=True)"
        )


def _guard_second_order(grads: tuple[torch.Tensor, ...], *sources: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients, made to raise if differentiated, when this backward runs in a graph-building
    mode (create_graph=True) and they depend on something that requires grad: the saved inputs
    (q, k, v) or the incoming gradient. torch's own once_differentiable looks at the incoming
    gradient only, and so lets a penalty on dq pass as zero."""
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in sources):
        return grads
    # At least one input of the guard must require grad for its outputs to get its backward:
    # detached aliases that do (the gradients themselves carry no graph, computed under no_grad).
    aliases = [g.detach().requires_grad_() for g in grads]
    return _NoSecondOrder.apply(*aliases)


class RingAttentionFunction(torch.autograd.Function):
    """Exact attention over the sharded sequence; forward and backward are stria collectives.

    apply(q, k, v, context, layout, causal, softmax_scale, cu_seqlens=None, window=None, plan=None, softcap=None,
    sinks=None) -> out, in stria's [B, L, H, D].
    """

    @staticmethod
    def forward(
        fctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        context: Context,
        layout: LayoutLike,
        causal: bool,
        softmax_scale: float | None,
        cu_seqlens: Any = None,
        window: Any = None,
        plan: Any = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
        args = _op_args(
            "RingAttentionFunction", context, layout, causal, softmax_scale, cu_seqlens, window, plan, softcap, sinks
        )
        out, lse = _forward_op(q, k, v, *args)
        fctx.save_for_backward(q, k, v, out, lse)
        fctx.stria_args = args
        fctx.stria_context = context  # alive until the backward (see _setup_context)
        fctx.stria_plan = plan
        return out

    @staticmethod
    def backward(fctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dq, dk, dv, dsinks = _gradients(*fctx.saved_tensors, dout, fctx.stria_args)
        # The sinks' gradient for their float32 copy (an input of this function's apply only
        # through the args: _op_args made it), handed back through the cast by torch.
        return (dq, dk, dv, None, None, None, None, None, None, None, None, dsinks)


def _gradients(q, k, v, out, lse, dout, args) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
    """dq, dk, dv and dsinks (None without sinks) of the forward that saved (q, k, v, out, lse)
    for the operator arguments args."""
    with torch.no_grad():
        grads = _backward_op(q, k, v, out, lse, _last_dim_contiguous(dout), *args)
    sinks = args[-1]
    if sinks is None:
        return (*_guard_second_order(grads[:3], q, k, v, dout), None)
    return _guard_second_order(grads, q, k, v, dout, sinks)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.stria_args = tuple(args)
    # The graph holds the context as long as it can run its backward: the registry holds contexts
    # weakly, so a caller that dropped its own reference after the forward (a context made per
    # call, say) would otherwise find it collected, and closed, at the backward. A key that is not
    # a plain int (torch.compile tracing with a symbolic one) has no context to hold here.
    if isinstance(args[0], int):
        ctx.stria_context = context_or_none(args[0])
    if len(args) > 7 and isinstance(args[7], int) and args[7]:
        ctx.stria_plan = plan_of_key(args[7], "stria.torch ring_attention")  # likewise, the plan
    ctx.mark_non_differentiable(lse)  # no gradient flows back through the log-sum-exp


def _op_backward(ctx: Any, dout: torch.Tensor, dlse: Any) -> tuple[torch.Tensor | None, ...]:
    dq, dk, dv, dsinks = _gradients(*ctx.saved_tensors, dout, ctx.stria_args)
    return (dq, dk, dv, *(None,) * (len(ctx.stria_args) - 1), dsinks)  # the sinks are the last argument


# torch.compile traces through an operator's registered autograd; it refuses an
# autograd.Function given one tensor twice (self-attention with k is v, say).
_HAS_OP_AUTOGRAD = hasattr(_forward_op, "register_autograd")
if _HAS_OP_AUTOGRAD:
    _forward_op.register_autograd(_op_backward, setup_context=_setup_context)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of the autocast region enabled on `device_type`, or None."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError, RuntimeError):  # a torch without per-device autocast queries
        return None


def _autocast(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """xs cast to the autocast dtype where autocast is on for their device (attention runs in the
    lower precision, as torch's scaled_dot_product_attention does under autocast), else as they
    are. The casts are autograd's: gradients come back in each input's own dtype."""
    dtype = _autocast_dtype(xs[0].device.type)
    if dtype is None:
        return xs
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in xs)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: Context,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of this rank's q ``[B, L, Hq, D]`` over the whole sequence's k, v
    ``[B, L, Hkv, D]`` (each rank holds its L tokens in `layout`); returns ``[B, L, Hq, D]``.
    softmax_scale None (or 0, as in the C ABI) is 1/sqrt(D); causal masks on global positions.
    cu_seqlens: packed documents, ``[0, s1, ..., S]`` in global positions (per batch row, or one
    row for all), the same on every rank; a query sees only its own document (see
    stria.document_boundaries). The library reads them on the host: keep them on the CPU (as a
    data loader makes them), since a CUDA tensor is copied over, which waits for the GPU. window:
    a sliding window ``(left, right)``, the query at global position i seeing the keys at
    i - left .. i + right (when causal, up to i); -1 leaves a side unbounded (see
    stria.sliding_window). plan: a stria.Plan for packed documents, which the ring then runs on
    instead of `layout` (each rank's tensors hold its plan.local_len slots: plan.shard, and
    plan.positions for position ids and labels; its boundaries are the document mask). Under
    torch.autocast, floating-point q, k and v are cast to the autocast dtype first, as torch's
    own attention is. softcap: the scores s become softcap * tanh(s / softcap)
    (Gemma 2's attn_logit_softcapping). sinks: a ``[Hq]`` tensor of attention-sink logits, one
    per query head (gpt-oss's ``sinks``), computed in float32 and differentiable: each rank's
    backward gives its rows' share of their gradient, which sums over the ranks as for any weight
    the ranks share."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor("ring_attention", name, x)
    q, k, v = _autocast(q, k, v)
    if not _HAS_OP_AUTOGRAD:
        return RingAttentionFunction.apply(
            q, k, v, context, Layout.of(layout), bool(causal), softmax_scale, cu_seqlens, window, plan, softcap, sinks
        )
    args = _op_args("ring_attention", context, layout, causal, softmax_scale, cu_seqlens, window, plan, softcap, sinks)
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    return _forward_op(q, k, v, *args)[0]


def ring_attention_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: Context,
    *,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """ring_attention on FP8 inputs, for inference: q, k and v torch.float8_e4m3fn, and the
    attention sees q * q_descale, k * k_descale and v * v_descale, each descale None (1) or a
    ``[1]`` (per tensor) or ``[H]`` (per head: Hq for q, Hkv for k and v) tensor, used as float32 on
    q's device.
    Returns ``[B, L, Hq, D]`` in out_dtype (bfloat16, float16 or float32), which the call computes
    in. The other arguments are ring_attention's. No gradient: FP8 is the forward only."""
    func = "ring_attention_fp8"
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(func, name, x)
        if x.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{func}(): {name} must be torch.float8_e4m3fn, not {x.dtype}")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{func}(): out_dtype must be torch.bfloat16, torch.float16 or torch.float32, not {out_dtype}")
    scales = []
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            _check_tensor(func, name, x)
            x = x.detach().to(device=q.device, dtype=torch.float32).contiguous()  # where the library reads it
        scales.append(x)
    if not isinstance(context, Context):
        raise TypeError(f"{func}(): argument 'context' must be a stria.Context, not {type(context).__name__}")
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, func), dtype=torch.float32, device=q.device)
    _ops.attention_forward(
        context,
        q,
        k,
        v,
        out,
        lse,
        layout=layout,
        causal=causal,
        softmax_scale=softmax_scale,
        cu_seqlens=cu_seqlens,
        window=window,
        plan=plan,
        softcap=softcap,
        sinks=None if sinks is None else sinks.detach().to(device=q.device, dtype=torch.float32).contiguous(),
        q_descale=scales[0],
        k_descale=scales[1],
        v_descale=scales[2],
    )
    return out


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    context: Context,
    layout: LayoutLike = Layout.STRIPED,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention over a sequence sharded across the ranks
    of `context`: query ``[B, Hq, L, D]``, key ``[B, Hkv, L, D]`` and value ``[B, Hkv, L, Dv]``
    hold this rank's L tokens in `layout`; returns ``[B, Hq, L, Dv]`` (a transposed view of stria's
    output). Dv may differ from D, as in torch (multi-head latent attention): the narrower heads
    are padded with zeros to the wider for the library, whose work is then that of the wider.

    is_causal masks on global positions. Grouped-query attention (Hq a multiple of Hkv) is
    always accepted (enable_gqa is taken for compatibility). attn_mask and dropout are not
    supported.

    scale: None is 1/sqrt(D), as in torch; otherwise it must be positive. A zero or negative
    scale, which torch takes literally, raises ValueError rather than computing something else:
    stria's C ABI reserves 0 for its default 1/sqrt(D) and takes only positive scales.

    cu_seqlens: packed documents, window: a sliding window, plan: a document plan, softcap:
    logit softcapping and sinks: attention-sink logits, as in ring_attention.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        _check_tensor("scaled_dot_product_attention", name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must be [B, H, L, D], got shape {tuple(x.shape)}")
    # In the caller's terms: past here the library sees the [B, L, H, D] views, and its messages
    # would name shapes the caller never passed.
    b, hq, lq, d = query.shape
    for name, x in (("key", key), ("value", value)):
        if x.shape[0] != b or x.shape[2] != lq or x.shape[1] != key.shape[1] or (name == "key" and x.shape[3] != d):
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}: key must be [B, Hkv, L, D] with query's B, L and D, and value "
                f"[B, Hkv, L, Dv] (query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)})"
            )
    if key.shape[1] == 0 or hq % key.shape[1] != 0:
        raise ValueError(
            f"query's {hq} heads are not a multiple of key's {key.shape[1]} (grouped-query attention needs Hq % Hkv == 0)"
        )
    if attn_mask is not None:
        raise NotImplementedError("stria's attention takes no attn_mask: use is_causal (on global positions)")
    if dropout_p != 0.0:
        raise NotImplementedError("stria's attention has no dropout: pass dropout_p=0.0")
    if scale is not None and not float(scale) > 0:  # NaN too
        raise ValueError(
            f"stria's scaled_dot_product_attention takes scale=None (1/sqrt(D)) or a positive scale, not {scale!r}: "
            "stria's C ABI reserves 0 for its default 1/sqrt(D) and supports only positive scales, so torch's "
            "literal zero or negative scale cannot be passed through"
        )
    del enable_gqa
    dv = value.shape[3]
    if dv != d:
        # Value heads of another width than the query's and key's (multi-head latent attention:
        # DeepSeek-V3's 192 against 128), which the library's one head dim does not take: the
        # narrower side padded with zeros to the wider, which changes no score and no output column
        # (zero query and key columns add nothing to q.k; zero value columns give zero output
        # columns, sliced off), at the cost of the padded columns' work and memory.
        scale = d**-0.5 if scale is None else scale
        if dv < d:
            value = torch.nn.functional.pad(value, (0, d - dv))
        else:
            query, key = (torch.nn.functional.pad(x, (0, dv - d)) for x in (query, key))
    out = ring_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        context,
        layout=layout,
        causal=is_causal,
        softmax_scale=scale,
        cu_seqlens=cu_seqlens,
        window=window,
        plan=plan,
        softcap=softcap,
        sinks=sinks,
    )
    return out.transpose(1, 2)[..., :dv]


def context_from_group(
    group: Any = None,
    *,
    device: DeviceLike | None = None,
    transport: TransportLike | None = None,
    timeout_s: float = 0.0,
    num_threads: int = 0,
    ulysses: int = 1,
) -> Context:
    """This process's rank of a torch.distributed process group (default: the world) as a stria
    Context, the unique id shared over the group itself: no STRIA_ROOT, no port of its own to
    choose. Every rank of the group calls it (a collective).

    device: None is this process's current GPU where the group's backend is or includes NCCL (a
    group made without naming a backend, where torch sees a GPU), else the CPU;
    "cuda" is the current GPU. transport: None is NCCL on a GPU and UCX on the CPU (the
    in-process transport for a group of one). ulysses: a grid of all-to-all groups of that many
    consecutive ranks of the group (Context.ulysses; e.g. the GPUs of a node).
    """
    import torch.distributed as dist  # noqa: PLC0415 - only this function needs it

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("context_from_group(): torch.distributed is not initialised: call init_process_group first")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("context_from_group(): this process is not a member of the group")
    if device is None:
        # "nccl", or a backend per device ("cpu:gloo,cuda:nccl"), or "undefined": what
        # init_process_group() without a backend reports, with NCCL for CUDA where there is a GPU.
        backend = str(dist.get_backend(group))
        on_gpu = "nccl" in backend or (backend == "undefined" and torch.cuda.is_available())
        device = "cuda" if on_gpu else "cpu"
    if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None):
        device = f"cuda:{torch.cuda.current_device()}"
    dev = parse_device(device)
    if transport is None:
        on_gpu = dev[0] == capi.kDLCUDA
        transport = Transport.LOCAL if world_size == 1 else Transport.NCCL if on_gpu else Transport.UCX
    src = 0 if group is None else dist.get_global_rank(group, 0)

    def share(payload: Any) -> Any:
        box = [payload]
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    return Context.join(
        rank,
        world_size,
        share,
        device=dev,
        transport=transport,
        timeout_s=timeout_s,
        num_threads=num_threads,
        ulysses=ulysses,
    )
