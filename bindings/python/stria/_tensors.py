"""Framework-neutral tensor helpers: allocate outputs like the inputs, prepare DLPack arguments.

stria takes any object implementing ``__dlpack__``; these helpers only matter when stria
allocates an output for the caller (numpy for numpy inputs, torch for torch inputs, the array-API
namespace otherwise) or when a framework needs a nudge before export (torch refuses to export a
tensor that requires grad: its detached alias shares the memory).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


def _torch_module(x: Any):
    """torch if x is a torch tensor (without importing torch for anyone else)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def for_dlpack(x: Any) -> Any:
    """What to hand to the binding for x: x itself, or its detached alias for a torch tensor
    that requires grad (same storage, so writes through it land in x)."""
    torch = _torch_module(x)
    if torch is not None and x.requires_grad:
        return x.detach()
    return x


def default_stream(*tensors: Any) -> int | None:
    """The stream to pass with these tensors when the caller gave none: torch's current stream
    for CUDA tensors (the one their producing kernels were queued on), else None."""
    for x in tensors:
        torch = _torch_module(x)
        if torch is not None and x.device.type == "cuda":
            return torch.cuda.current_stream(x.device).cuda_stream
    return None


def empty_like(
    x: Any, shape: Sequence[int], dtype: str | None = None, zero: bool = False, name: str | None = None
) -> Any:
    """A new tensor of `shape` in x's framework and on x's device, with x's dtype or `dtype`
    ("float32"). `zero` fills it with zeros. `name`: x's argument name, for the error."""
    shape = tuple(int(s) for s in shape)
    torch = _torch_module(x)
    if torch is not None:
        dt = x.dtype if dtype is None else getattr(torch, dtype)
        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=dt, device=x.device)
    if isinstance(x, np.ndarray):
        dt = x.dtype if dtype is None else np.dtype(dtype)
        return (np.zeros if zero else np.empty)(shape, dtype=dt)
    namespace = getattr(x, "__array_namespace__", None)
    if type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        namespace = None  # immutable arrays: stria must not write into them
    if namespace is not None:  # CuPy and others, through the array API standard
        xp = namespace()
        dt = x.dtype if dtype is None else getattr(xp, dtype)
        kwargs = {"dtype": dt}
        device = getattr(x, "device", None)
        if device is not None:
            kwargs["device"] = device
        return (xp.zeros if zero else xp.empty)(shape, **kwargs)
    what = f"{type(x).__module__}.{type(x).__name__}"
    like = f"argument '{name}' (a {what})" if name else f"a {what}"
    hint = ""
    if type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        hint = "; for attention on JAX arrays, stria.jax runs it inside JAX (jit, grad, shard_map)"
    raise TypeError(
        f"stria cannot allocate an output like {like}: "
        f"pass the outputs explicitly (writable objects implementing __dlpack__, e.g. numpy arrays on CPU){hint}"
    )


def shape_of(x: Any, func: str, name: str) -> tuple:
    """x's shape; a TypeError naming the argument (`name` of `func`) if x has none."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(
            f"{func}(): argument '{name}' must be a tensor (an object with a shape implementing __dlpack__: "
            f"numpy, torch, cupy, jax, ...), not {type(x).__name__}"
        )
    return tuple(int(s) for s in shape)
