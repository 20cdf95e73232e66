"""JAX integration: ring attention as a differentiable, jit-compatible JAX function.

- ``ring_attention(q, k, v, context)``: stria's layout, q ``[B, L, Hq, D]``, k/v ``[B, L, Hkv, D]``;
  differentiable (``jax.grad``, ``jax.vjp``) and usable under ``jax.jit`` and ``jax.vmap`` (the
  mapped axes fold into B: one call for every mapped element).
- ``attention_forward`` / ``attention_backward``: the two collectives themselves, returning
  ``(out, lse)`` and ``(dq, dk, dv)``, for a framework's own autograd.

They run as XLA custom calls (XLA's FFI): XLA hands stria its own buffers, and on a GPU its
stream, so nothing is copied and nothing leaves the device. On CPU the context is a CPU one; on a
GPU a CUDA context on the device that holds the arrays.

``context_from_distributed()`` makes a multi-process JAX job's contexts, one rank per process.

Reproducible gradients: ``ctx.deterministic = True`` on the context (on each of a LocalGroup's)
before the backward runs makes its dQ the same bits on every run on a GPU, as
stria_context_set_deterministic says (the CPU's always are).

Packed documents: ``cu_seqlens=`` (a JAX array, traced, or anything numpy reads) masks each query
to its own document, as stria_attention_forward_documents does. The boundaries are an operand of
the custom call: on a GPU they stay in device memory, where stria reads them on XLA's stream.

``context`` is a Context (one rank per process: UCX, NCCL), or a whole LocalGroup called inside
``jax.shard_map`` over a mesh axis of its size: rank r computes the shard of the JAX device of
local ordinal r (on CPU, JAX's r-th CPU device; on GPUs, the ordinal of rank r's GPU, as in
``local_group(n, devices=["cuda:0", ...])``), so device r's chunk of the sequence axis must hold
rank r's tokens in the layout's order.

Every rank of the context's group calls these with its own shard of the sequence, in the same
order: each call is a collective, and the ranks' calls pair up in the order they run. XLA orders
calls by their data only: two stria calls of one jitted function with no dependency between them
may run in either order, differently on different ranks. So make each call depend on the one
before, as a stack of layers does by itself. Where that is not so, the ranks fail instead of
computing garbage: every traced call carries its call site's tag (``tag=None``; see
``_call_site``), and calls of different sites that meet fail on every rank, before any block
moves. Calls on one context from concurrent XLA threads wait for each other; a Context of a ring
serves one JAX device (a second device's calls fail: they would pair in any order). A failure raises
JAX's runtime error (from some of XLA's execution paths a ValueError) with stria's status and
message and the call site (``INVALID_ARGUMENT: stria attention_forward: ... [called at
model.py:42 (attend)]``); a call on a context that has since been closed fails likewise instead
of touching it.

The handlers are the module ``stria/_xla_ffi.so``, built with the package where jaxlib's FFI
headers are found (``pip install jax`` before building stria's Python bindings).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import sys
import sysconfig
import threading
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from . import _ops, capi
from ._context import Context, DeviceLike, LocalGroup, parse_device
from ._enums import Layout, LayoutLike, Transport, TransportLike
from ._plan import Plan, PlanConfig

__all__ = ["attention_backward", "attention_forward", "attention_forward_fp8", "context_from_distributed",
           "ring_attention"]

_FFI_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_xla_ffi.so")
if not os.path.exists(_FFI_PATH):
    raise ImportError(
        f"stria.jax needs stria's XLA FFI handlers ({_FFI_PATH}), which are built only where jaxlib's FFI "
        "headers are found: pip install jax, then rebuild stria's Python bindings (or set STRIA_JAX_INCLUDE_DIR)"
    )
_lib = ctypes.CDLL(_FFI_PATH)
_int32s = ctypes.POINTER(ctypes.c_int32)
_lib.stria_jax_bind.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), _int32s, _int32s, _int32s]
_lib.stria_jax_bind.restype = ctypes.c_int64
_lib.stria_jax_unbind.argtypes = [ctypes.c_int64]
_lib.stria_jax_unbind.restype = None

# One target per direction: the optional operands (boundaries, sinks) follow the attention tensors
# as the call's attributes announce them, and the whole call reaches the library in its params.
_FORWARD, _BACKWARD = "stria_attention_forward", "stria_attention_backward"
for _name, _symbol in ((_FORWARD, "stria_jax_forward"), (_BACKWARD, "stria_jax_backward")):
    jax.ffi.register_ffi_target(_name, jax.ffi.pycapsule(getattr(_lib, _symbol + "_cpu")), platform="cpu")
    jax.ffi.register_ffi_target(_name, jax.ffi.pycapsule(getattr(_lib, _symbol + "_cuda")), platform="CUDA")

# Whose frames a call site's stack leaves out: stria's, and the standard library's (which may
# differ between the Python versions of different hosts); and where it ends: at JAX's own, the
# transformation (jit, grad, shard_map, scan...) that traced the caller's function.
_STRIA_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_JAX_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (jax, jaxlib))
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[p]) + os.sep for p in ("purelib", "platlib")})
_NO_TAG = (0, "")
_TAG_LIMIT = 2**63  # XLA's attributes take an unsigned 64-bit integer only below 2**63


def _current_trace() -> Any:
    """The trace being built (jit's, grad's...), or None where this JAX does not say."""
    try:
        from jax._src import core  # noqa: PLC0415 - JAX's internals, looked up only when needed

        return core.trace_ctx.trace
    except (ImportError, AttributeError):
        return None


# How many calls each site has made in each trace under way, so that the k-th call of a site in
# a trace (a Python loop calling one line) gets a tag of its own. Keyed weakly: a finished trace
# takes its counts with it, and the next trace of the same function counts from 0 again.
_site_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_site_counts_lock = threading.Lock()


def _outermost_trace(trace: Any) -> Any:
    """The staging trace that `trace` is nested in (jit's, under a grad or vmap inside it), or
    `trace` itself where this JAX does not link them."""
    from jax._src import core  # noqa: PLC0415 - as in _current_trace

    for _ in range(64):
        parent = getattr(trace, "parent_trace", None)
        if parent is None or isinstance(parent, core.EvalTrace):
            break
        trace = parent
    return trace


def _occurrence(site_digest: bytes) -> int:
    """The number of calls of this site before this one in the outermost trace under way: the
    program being built. Counted there and not in the innermost trace, since every jax.grad or
    jax.vmap inside it traces its function afresh (a grad in a Python loop would count 0 each
    time)."""
    trace = _current_trace()
    if trace is None:
        return 0
    trace = _outermost_trace(trace)
    with _site_counts_lock:
        try:
            counts = _site_counts.setdefault(trace, {})
        except TypeError:  # a trace that takes no weak reference
            return 0
        k = counts.get(site_digest, 0)
        counts[site_digest] = k + 1
    return k


def _call_site() -> tuple[int, str]:
    """The tag of the call site that called into stria.jax, and where it is ("model.py:12 (attend)").

    The ranks' calls pair up in the order each rank runs them, and a compiled program orders
    independent calls as it likes; so every traced call carries its site's tag, and calls of
    different sites that meet fail instead of exchanging blocks (stria_context_set_call_tag).
    Every process that runs the same program must get the same tag, so it hashes what is the same
    there: the caller's frames inside the outermost JAX transformation under way (the jit that
    builds the program; JAX's own frames, the standard library's and stria's left out, and the
    eager code above it too, which may differ between processes), innermost first, each as file
    name without its directory, line and function, and how many calls that stack made before in
    the program. So the two branches of a model that calls one attention function from two
    places get two tags, and so do the calls of a Python loop over one line, a loop over
    jax.grad included. A function that JAX traces once and then reuses (an inner jax.jit called
    at two places, a scan body) has one tag per site inside it, whatever calls it."""
    digest = hashlib.blake2b(digest_size=8)
    frames: list[str | None] = []  # the caller's, innermost first; None marks a frame of JAX's
    frame = sys._getframe(1)
    for _ in range(512):
        if frame is None:
            break
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_JAX_DIRS):
            frames.append(None)
        elif not (path.startswith(_STRIA_DIR) or (path.startswith(_STDLIB_DIR) and not path.startswith(_PACKAGE_DIRS))):
            frames.append(f"{os.path.basename(path)}:{frame.f_lineno} ({frame.f_code.co_name})")
        frame = frame.f_back
    outermost_jax = max((i for i, f in enumerate(frames) if f is None), default=len(frames))
    site = next((f for f in frames if f is not None), "")
    for where in frames[:outermost_jax]:
        if where is not None:
            digest.update(where.encode() + b"\0")
    digest.update(b"#%d" % _occurrence(digest.digest()))
    return int.from_bytes(digest.digest(), "little") % _TAG_LIMIT or 1, site


def _tag_of(func: str, tag: int | None, arrays: tuple) -> tuple[int, str]:
    """The (tag, site) of a call: `tag` as given (0: untagged), or, for None, its call site's
    under a trace (jit, grad, shard_map...), and none outside one, where JAX runs the calls one
    by one in the order the program makes them."""
    if tag is not None:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) < _TAG_LIMIT:
            raise ValueError(f"{func}(): tag must be None (the call site's) or an integer in [0, 2**63), not {tag!r}")
        return int(tag), ""
    trace = _current_trace()
    if trace is not None:
        # Staged whenever the trace is not JAX's eager one, constants closed over included.
        from jax._src import core  # noqa: PLC0415 - JAX's internals, as in _current_trace

        if isinstance(trace, core.EvalTrace):
            return _NO_TAG
    elif not any(isinstance(x, jax.core.Tracer) for x in arrays):
        return _NO_TAG
    return _call_site()


_keys_lock = threading.Lock()
# Context or group -> its key in the handlers' registry, while open. Weakly keyed, not by id(): a
# group collected while its contexts stay open would leave its id to a new object, which would
# then be served by the old group's contexts.
_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _members(context: Any, func: str) -> list[tuple[Context, int]]:
    """The contexts to bind and the XLA device each serves (-1: every device): a Context serves
    the device its program runs on; rank r of a LocalGroup the XLA device of local ordinal r on
    CPU (JAX's CPU devices), and its own GPU's ordinal on CUDA."""
    if isinstance(context, Context):
        return [(context, -1)]
    if isinstance(context, LocalGroup):
        return [(c, c.device[1] if c.device[0] == capi.kDLCUDA else r) for r, c in enumerate(context)]
    raise TypeError(
        f"{func}(): argument 'context' must be a stria.Context or stria.LocalGroup, not {type(context).__name__}"
    )


def _key(context: Any, func: str) -> int:
    """The handlers' key of an open context or group (bound on first use, unbound when one of its
    contexts closes)."""
    members = _members(context, func)
    handles = [c.handle for c, _ in members]  # raises for a closed context
    with _keys_lock:
        key = _keys.get(context)
        if key is not None:
            return key
        n = len(members)
        key = _lib.stria_jax_bind(
            n,
            (ctypes.c_void_p * n)(*(int(h) for h in handles)),
            (ctypes.c_int32 * n)(*(d for _, d in members)),
            (ctypes.c_int32 * n)(*(c.device[0] for c, _ in members)),
            (ctypes.c_int32 * n)(*(c.device[1] for c, _ in members)),
        )
        if key == 0:
            raise ValueError(f"{func}(): could not bind the stria context")
        owner = weakref.ref(context)

        def unbind() -> None:
            with _keys_lock:
                obj = owner()
                if obj is not None:
                    _keys.pop(obj, None)
            _lib.stria_jax_unbind(key)  # idempotent: the group's first close unbinds it

        for c, _ in members:
            c._on_close(unbind)
        _keys[context] = key
    return key


def _manual_shards() -> int | None:
    """How many shards the enclosing shard_map runs (the product of its manual mesh axes' sizes;
    1 outside one), or None where this JAX does not say."""
    try:
        mesh = jax.sharding.get_abstract_mesh()
        return int(np.prod([mesh.shape[a] for a in mesh.manual_axes], dtype=np.int64))
    except (AttributeError, KeyError, TypeError):
        return None


def _check_group_shards(context: Any, func: str) -> None:
    """A LocalGroup of n ranks serves a shard_map of n shards, rank r the r-th device's: with any
    other number some rank is never called, and the called ones would wait for it until their
    timeout."""
    if not isinstance(context, LocalGroup) or len(context) == 1:
        return
    shards = _manual_shards()
    if shards is not None and shards != len(context):
        where = f"a shard_map of {shards} shards" if shards > 1 else "no shard_map"
        raise ValueError(
            f"{func}(): a LocalGroup of {len(context)} ranks is called under {where}: call it inside shard_map over "
            f"a mesh of {len(context)} devices (rank r computes device r's shard), or use one Context per process"
        )


def _cpu_dispatch_is_async() -> bool:
    try:
        return bool(jax.config.read("jax_cpu_enable_async_dispatch"))
    except (AttributeError, KeyError):  # a JAX without the option
        return False


def _attrs(
    context: Context | LocalGroup,
    func: str,
    layout: LayoutLike,
    causal: bool,
    softmax_scale: float | None,
    call: tuple[int, str],
    window: tuple[int, int] | None = None,
    plan: PlanConfig | None = None,
    softcap: float | None = None,
    has_documents: bool = False,
    has_sinks: bool = False,
    descales: int = 0,
) -> dict:
    """The custom call's attributes: the key of the context (or group), the parameters, the
    call's tag and site, the sliding window (-1, -1: none), the plan's config (tile 0: none), the
    softcap (0: none), and which optional operands follow the attention tensors (descales: a
    forward's FP8 descales, bit 0 q's, 1 k's, 2 v's)."""
    # Checked as the float32 the call carries: a positive value below float32's range would round
    # to 0, which stria reads as 1/sqrt(D).
    with np.errstate(over="ignore"):  # a value beyond float32's range is refused below, as inf
        scale32 = None if softmax_scale is None else np.float32(softmax_scale)
    if scale32 is not None and not 0 < scale32 < np.inf:  # NaN too
        raise ValueError(
            f"{func}(): softmax_scale must be None (1/sqrt(D)) or positive and finite in float32, not {softmax_scale!r}"
        )
    with np.errstate(over="ignore"):
        cap32 = np.float32(0.0 if softcap is None else softcap)
    if not 0 <= cap32 < np.inf:  # NaN too
        raise ValueError(f"{func}(): softcap must be None (none) or >= 0 and finite in float32, not {softcap!r}")
    _check_group_shards(context, func)
    if (
        isinstance(context, Context)
        and context.device[0] == capi.kDLCPU
        and context._in_local_group
        and context.world_size > 1
        and _cpu_dispatch_is_async()
    ):
        raise ValueError(
            f"{func}(): the ranks of a local group are threads of this process, and JAX dispatches CPU "
            "programs asynchronously to a pool of its own, where ranks beyond the pool's size would wait for a "
            "thread until their timeout: set jax.config.update('jax_cpu_enable_async_dispatch', False) before "
            "JAX's first computation, pass the whole LocalGroup under shard_map, or run one rank per process"
        )
    return {
        "context": np.int64(_key(context, func)),
        "layout": np.int32(Layout.of(layout)),
        "causal": bool(causal),
        "softmax_scale": np.float32(0.0) if scale32 is None else scale32,
        "tag": np.uint64(call[0]),
        "site": call[1],
        "window_left": np.int64(-1 if window is None else window[0]),
        "window_right": np.int64(-1 if window is None else window[1]),
        "plan_tile": np.int64(0 if plan is None else plan.tile),
        "plan_local_len": np.int64(0 if plan is None else plan.local_len),
        "plan_causal": bool(plan is None or plan.causal),
        "plan_window_left": np.int64(-1 if plan is None or plan.window is None else plan.window[0]),
        "plan_window_right": np.int64(-1 if plan is None or plan.window is None else plan.window[1]),
        "has_documents": bool(has_documents),
        "has_sinks": bool(has_sinks),
        "softcap": cap32,
        "descales": np.int32(descales),
    }


def _plan_config(plan: Any, cu_seqlens: Any, func: str) -> tuple[PlanConfig | None, Any]:
    """plan (a stria.Plan or a PlanConfig) as its config, and the boundaries the call passes: the
    given ones, else a Plan's own. A PlanConfig needs cu_seqlens (the plan is made from them)."""
    if plan is None:
        return None, cu_seqlens
    if isinstance(plan, Plan):
        return plan.config, plan.cu_seqlens if cu_seqlens is None else cu_seqlens
    if isinstance(plan, PlanConfig):
        if cu_seqlens is None:
            raise ValueError(f"{func}(): a PlanConfig needs cu_seqlens: the boundaries its plan is made from")
        return plan, cu_seqlens
    raise TypeError(f"{func}(): plan must be a stria.Plan, a stria.PlanConfig or None, not {type(plan).__name__}")


_DTYPES = ("float32", "float16", "bfloat16")


def _check_4d(func: str, **arrays: Any) -> None:
    for name, x in arrays.items():
        if np.ndim(x) != 4:
            raise ValueError(f"{func}(): {name} must be [B, L, H, D], got shape {tuple(np.shape(x))}")
        # Named here, in JAX's terms: the handler sees only XLA's element type.
        dtype = jnp.result_type(x)
        if dtype.name not in _DTYPES:
            raise ValueError(f"{func}(): {name} has dtype {dtype.name}; stria takes {', '.join(_DTYPES)}")


def _like(x: Any, shape: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
    """The type of a result shaped `shape` (default x's) of `dtype` (default x's)."""
    shape = tuple(np.shape(x)) if shape is None else shape
    dtype = jnp.dtype(jnp.result_type(x) if dtype is None else dtype)  # (a dtype object is falsy)
    if hasattr(jax, "typeof"):
        # x's own type, reshaped: inside shard_map it names the mesh axes x varies over, and the
        # results vary alike (custom_vjp requires dq to have q's type); update() fits its sharding
        # spec to the new rank.
        return jax.typeof(x).update(shape=shape, dtype=dtype, weak_type=False)
    return jax.ShapeDtypeStruct(shape, dtype)


# Under jax.vmap: one call for all the mapped elements, the mapped axes in front of every operand
# (broadcast where an operand is not mapped), which the handlers fold into B. One collective per
# call, as without vmap, rather than one per element.
_VMAP = "broadcast_all"


def _boundaries(cu_seqlens: Any, batch: int, func: str) -> Any:
    """cu_seqlens as the handlers pass it to params->cu_seqlens: one row per batch
    row, each the int64 global positions ``[0, s1, ..., S]``. Where JAX runs without 64-bit
    integers (its default), int32 ``[B, n + 1, 2]``: each position's two little-endian words, which
    in memory are the int64 array stria reads, made by XLA where the array lives (on a GPU, in
    device memory, which a CUDA context reads on XLA's stream). None stays None (no mask).

    Its shape is checked here, at trace time; its values (start 0, nondecreasing, end S) by stria
    when the call runs, on every rank."""
    if cu_seqlens is None:
        return None
    cu = cu_seqlens if isinstance(cu_seqlens, jax.Array) else jnp.asarray(np.asarray(cu_seqlens))
    dtype = jnp.result_type(cu)
    shape = tuple(np.shape(cu))
    _ops.check_boundaries(shape, bool(jnp.issubdtype(dtype, jnp.integer)), dtype.name, batch, func)
    cu = jnp.broadcast_to(cu, (batch, shape[-1]))
    if dtype == jnp.int64:
        return cu
    # Values beyond int32 would not fit a sequence JAX can index without 64-bit integers anyway.
    words = cu.astype(jnp.int32)
    return jnp.stack([words, jnp.right_shift(words, 31)], axis=-1)  # low word, then the sign's


def _sinks(sinks: Any, q: Any, func: str) -> Any:
    """sinks as the handlers take them: float32 ``[Hq]`` (a JAX array, traced or not), or None."""
    if sinks is None:
        return None
    z = sinks if isinstance(sinks, jax.Array) else jnp.asarray(np.asarray(sinks))
    hq = np.shape(q)[2]
    if tuple(np.shape(z)) != (hq,) or not jnp.issubdtype(jnp.result_type(z), jnp.floating):
        raise ValueError(
            f"{func}(): sinks must be [Hq] = [{hq}] floating-point logits, one per query head, not "
            f"{jnp.result_type(z).name} of shape {tuple(np.shape(z))}"
        )
    return z.astype(jnp.float32)


def _forward(context, q, k, v, cu, layout, causal, softmax_scale, call, window=None, plan=None, softcap=None,  # noqa: ANN001, ANN202
             sinks=None, descales=(None, None, None), out_dtype=None):
    b, l, hq, _ = np.shape(q)
    results = (_like(q, dtype=out_dtype), _like(q, (b, hq, l), jnp.float32))
    mask = sum(1 << i for i, x in enumerate(descales) if x is not None)
    attrs = _attrs(context, "attention_forward", layout, causal, softmax_scale, call, window, plan, softcap,
                   cu is not None, sinks is not None, mask)
    extras = tuple(x for x in (cu, sinks, *descales) if x is not None)
    return jax.ffi.ffi_call(_FORWARD, results, vmap_method=_VMAP)(q, k, v, *extras, **attrs)


def _backward(context, q, k, v, out, lse, dout, cu, layout, causal, softmax_scale, call, window=None, plan=None,  # noqa: ANN001, ANN202
              softcap=None, sinks=None):
    """(dq, dk, dv), and the sinks' gradient (this rank's part) after them when there are sinks."""
    results = (_like(q), _like(k), _like(v))
    if sinks is not None:
        results += (_like(sinks, dtype=jnp.float32),)
    attrs = _attrs(context, "attention_backward", layout, causal, softmax_scale, call, window, plan, softcap,
                   cu is not None, sinks is not None)
    extras = tuple(x for x in (cu, sinks) if x is not None)
    return jax.ffi.ffi_call(_BACKWARD, results, vmap_method=_VMAP)(q, k, v, out, lse, dout, *extras, **attrs)


def attention_forward(
    context: Context | LocalGroup,
    q: Any,
    k: Any,
    v: Any,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    tag: int | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | PlanConfig | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """This rank's attention output ``[B, L, Hq, D]`` (q's dtype) and its log-sum-exp
    ``[B, Hq, L]`` (float32) over the whole sharded sequence: stria_attention_forward.

    tag names the call for the ranks' pairing (stria_context_set_call_tag): None, its call site's
    under a trace (jit, grad, shard_map...); 0, none; or a tag of the caller's choosing, the same
    on every rank.

    cu_seqlens (optional) packs several documents into the sequence, and a query sees only the
    keys of its own document: integer global positions ``[0, s1, ..., S]`` (S = L * world size),
    one row for every batch row or ``[B, n + 1]``, the same on every rank
    (stria_attention_forward_documents). A JAX array (traced, on the computation's device) or
    anything numpy reads.

    window (optional, static) is a sliding window ``(left, right)``: the query at global position
    i sees the keys at i - left .. i + right (when causal, up to i); -1 leaves a side unbounded
    (stria_attention_forward_window).

    plan (optional, static): a stria.Plan, or a stria.PlanConfig with cu_seqlens, for packed
    documents: the ring runs on the plan made from the boundaries with that config, the one the
    caller sharded its data by (stria.Plan(cu_seqlens, **config)). Under jit pass the boundaries
    traced and a PlanConfig (or Plans of one config): the program is traced once, and each call
    makes its batch's plan (CPU contexts).

    softcap (optional, static, > 0): the scores s become softcap * tanh(s / softcap) (Gemma 2).
    sinks (optional): ``[Hq]`` attention-sink logits (gpt-oss), one per query head,
    each joining its head's softmax denominators once; lse includes them. Computed in float32."""
    _check_4d("attention_forward", q=q, k=k, v=v)
    config, cu_seqlens = _plan_config(plan, cu_seqlens, "attention_forward")
    cu = _boundaries(cu_seqlens, np.shape(q)[0], "attention_forward")
    win = _ops.sliding_window(window, "attention_forward")
    z = _sinks(sinks, q, "attention_forward")
    call = _tag_of("attention_forward", tag, (q, k, v))
    return _forward(context, q, k, v, cu, layout, causal, softmax_scale, call, win, config, softcap, z)


def attention_forward_fp8(
    context: Context | LocalGroup,
    q: Any,
    k: Any,
    v: Any,
    *,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    out_dtype: Any = jnp.bfloat16,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    tag: int | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | PlanConfig | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """attention_forward on FP8 inputs, for inference: q, k and v float8_e4m3fn, and the attention
    sees q * q_descale, k * k_descale and v * v_descale, each descale None (1) or a ``[1]`` (per
    tensor) or ``[H]`` (per head: Hq for q, Hkv for k and v) array, used as float32. Returns this
    rank's output ``[B, L, Hq, D]`` in out_dtype (bfloat16, float16 or float32, which the call
    computes in) and its log-sum-exp. The other arguments are attention_forward's. No gradient, and
    not under jax.vmap."""
    func = "attention_forward_fp8"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if np.ndim(x) != 4:
            raise ValueError(f"{func}(): {name} must be [B, L, H, D], got shape {tuple(np.shape(x))}")
        if jnp.result_type(x).name != "float8_e4m3fn":
            raise ValueError(f"{func}(): {name} has dtype {jnp.result_type(x).name}; it must be float8_e4m3fn")
    if jnp.dtype(out_dtype).name not in _DTYPES:
        raise ValueError(f"{func}(): out_dtype must be one of {', '.join(_DTYPES)}, not {jnp.dtype(out_dtype).name}")
    descales = tuple(None if x is None else jnp.asarray(x, jnp.float32) for x in (q_descale, k_descale, v_descale))
    config, cu_seqlens = _plan_config(plan, cu_seqlens, func)
    cu = _boundaries(cu_seqlens, np.shape(q)[0], func)
    win = _ops.sliding_window(window, func)
    z = _sinks(sinks, q, func)
    call = _tag_of(func, tag, (q, k, v))
    return _forward(context, q, k, v, cu, layout, causal, softmax_scale, call, win, config, softcap, z, descales,
                    jnp.dtype(out_dtype))


def attention_backward(
    context: Context | LocalGroup,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    tag: int | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | PlanConfig | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> tuple[jax.Array, ...]:
    """The gradients ``(dq, dk, dv)`` of attention_forward's output for this rank's q, k, v, given
    the forward's out and lse and the gradient dout of out: stria_attention_backward. tag,
    cu_seqlens, window, plan, softcap and sinks (the forward's) as in attention_forward. With
    sinks, ``(dq, dk, dv, dsinks)``: dsinks (float32 ``[Hq]``) is this rank's part of the sinks'
    gradient, which sums over the ranks to the whole one."""
    _check_4d("attention_backward", q=q, k=k, v=v, out=out, dout=dout)
    config, cu_seqlens = _plan_config(plan, cu_seqlens, "attention_backward")
    cu = _boundaries(cu_seqlens, np.shape(q)[0], "attention_backward")
    win = _ops.sliding_window(window, "attention_backward")
    z = _sinks(sinks, q, "attention_backward")
    call = _tag_of("attention_backward", tag, (q, k, v, out, lse, dout))
    return _backward(context, q, k, v, out, lse, dout, cu, layout, causal, softmax_scale, call, win, config, softcap, z)


# The parameters after q, k, v, the boundaries cu (None, or _boundaries' integer array: an input
# with no gradient) and the sinks (None, or float32 [Hq]: differentiable) are static
# (nondiff_argnums): a context is hashed by identity. The call's (tag, site) is ring_attention's
# caller's: the rules run under JAX's frames, where no site of the caller's is to be found.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 10, 11, 12))
def _ring(q: Any, k: Any, v: Any, cu: Any, sinks: Any, context: Context | LocalGroup, layout: int, causal: bool,
          scale: float | None, call: tuple[int, str], window: tuple[int, int] | None,
          plan: PlanConfig | None, softcap: float | None) -> jax.Array:
    return _forward(context, q, k, v, cu, layout, causal, scale, call, window, plan, softcap, sinks)[0]


def _ring_fwd(q, k, v, cu, sinks, context, layout, causal, scale, call, window, plan, softcap):  # noqa: ANN001, ANN202 - custom_vjp's rule
    out, lse = _forward(context, q, k, v, cu, layout, causal, scale, call, window, plan, softcap, sinks)
    return out, (q, k, v, cu, sinks, out, lse)


def _ring_bwd(context, layout, causal, scale, call, window, plan, softcap, residuals, dout):  # noqa: ANN001, ANN202 - custom_vjp's rule
    q, k, v, cu, sinks, out, lse = residuals
    grads = _backward(context, q, k, v, out, lse, dout.astype(out.dtype), cu, layout, causal, scale, call, window,
                      plan, softcap, sinks)
    # The boundaries have no gradient; the sinks' is this rank's part (JAX sums it like any
    # weight's wherever the ranks share it).
    return (*grads[:3], None, grads[3] if sinks is not None else None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(
    q: Any,
    k: Any,
    v: Any,
    context: Context | LocalGroup,
    *,
    layout: LayoutLike = Layout.STRIPED,
    causal: bool = True,
    softmax_scale: float | None = None,
    tag: int | None = None,
    cu_seqlens: Any = None,
    window: tuple[int, int] | None = None,
    plan: Plan | PlanConfig | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> jax.Array:
    """Attention of this rank's q ``[B, L, Hq, D]`` over the whole sequence's k, v
    ``[B, L, Hkv, D]`` (each rank holds its L tokens in `layout`); returns ``[B, L, Hq, D]``.
    Differentiable in q, k and v (first order); softmax_scale None is 1/sqrt(D); causal masks on
    global positions; tag as in attention_forward (forward and backward share it); cu_seqlens,
    packed documents, window, a sliding window, plan, a document plan, softcap and sinks as in
    attention_forward (the backward takes the same). Differentiable in the sinks too, whatever
    their dtype (computed in float32; not under jax.vmap)."""
    _members(context, "ring_attention")  # a TypeError for anything else
    _check_4d("ring_attention", q=q, k=k, v=v)
    config, cu_seqlens = _plan_config(plan, cu_seqlens, "ring_attention")
    cu = _boundaries(cu_seqlens, np.shape(q)[0], "ring_attention")
    win = _ops.sliding_window(window, "ring_attention")
    scale = None if softmax_scale is None else float(softmax_scale)
    cap = None if softcap is None else float(softcap)
    z = _sinks(sinks, q, "ring_attention")
    call = _tag_of("ring_attention", tag, (q, k, v))
    return _ring(q, k, v, cu, z, context, int(Layout.of(layout)), bool(causal), scale, call, win, config, cap)


_joins = itertools.count()  # context_from_distributed calls so far: every process makes the same ones


def context_from_distributed(
    *,
    device: DeviceLike | None = None,
    transport: TransportLike | None = None,
    timeout_s: float = 0.0,
    num_threads: int = 0,
) -> Context:
    """This process's rank of a multi-process JAX job (``jax.distributed.initialize``) as a stria
    Context: rank ``jax.process_index()`` of ``jax.process_count()``, the unique id shared through
    the job's own coordination service (no STRIA_ROOT, no port of its own). Every process calls
    it, the same number of times.

    device: None is this process's first local device (its GPU, or the CPU). transport: None is
    NCCL on a GPU and UCX on the CPU (the in-process transport for a job of one process).
    """
    from jax._src import distributed  # noqa: PLC0415 - the coordination service's client

    client = getattr(distributed.global_state, "client", None)
    if client is None:
        raise RuntimeError("context_from_distributed(): call jax.distributed.initialize() first")
    rank, world_size = jax.process_index(), jax.process_count()
    if device is None:
        local = jax.local_devices()[0]
        device = f"cuda:{local.local_hardware_id}" if local.platform == "gpu" else "cpu"
    device = parse_device(device)
    if transport is None:
        on_gpu = device[0] == capi.kDLCUDA
        transport = Transport.LOCAL if world_size == 1 else Transport.NCCL if on_gpu else Transport.UCX
    key = f"stria/unique_id/{next(_joins)}"
    wait_ms = int(1000 * (timeout_s or 300.0))

    def share(payload: Any) -> Any:
        # Rank 0's id (or failure) as bytes under a key of this call; the others wait for it.
        if payload is not None:
            value = b"id:" + payload[1] if payload[0] == "id" else f"error:{payload[1]}:{payload[2]}".encode()
            client.key_value_set_bytes(key, value)
        value = bytes(client.blocking_key_value_get_bytes(key, wait_ms))
        if value.startswith(b"id:"):
            return ("id", value[3:])
        _, kind, message = value.decode(errors="replace").split(":", 2)
        return ("error", kind, message)

    return Context.join(
        rank, world_size, share, device=device, transport=transport, timeout_s=timeout_s, num_threads=num_threads
    )
