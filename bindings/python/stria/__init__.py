"""stria: exact ring attention over a sequence sharded across ranks.

Each of N ranks holds L = S/N tokens of a sequence of length S in a layout (striped, zigzag,
contiguous); attention_forward/backward compute exact softmax attention of the rank's queries
over the whole sequence by passing K/V blocks around a ring. Tensors are any objects implementing
``__dlpack__`` (numpy, PyTorch, CuPy, JAX), passed without a copy.

    import numpy as np, stria
    with stria.local_group(2) as group:            # 2 ranks in this process, one thread each
        def rank_fn(ctx, q, k, v):
            return ctx.attention_forward(q, k, v, layout="striped", causal=True)
        results = group.run(rank_fn, qs, ks, vs)   # qs[r]: rank r's [B, L, H, D] shard

stria.attention_decode, stria.attention_prefill and stria.KVCache serve over a KV cache sharded
across the ranks: queries attend every rank's share and the partial results merge exactly.

stria.Plan balances packed documents (varied lengths in one sequence) across the ring; pass it as
``plan=`` instead of a layout.

stria.torch has an autograd function and a drop-in for torch's scaled_dot_product_attention.
stria.jax has ring attention for JAX: differentiable and usable under jax.jit (XLA custom calls).
The low-level SWIG module, generated from stria.h, is stria.capi.
"""

from . import capi
from ._context import Context, LocalGroup, get_unique_id, local_group, parse_device
from ._enums import Layout, Transport
from ._plan import Plan, PlanConfig
from ._ops import (
    Balance,
    StepTime,
    Traffic,
    analyze_balance,
    analyze_balance_steps,
    attention_backward,
    attention_forward,
    attention_params,
    document_boundaries,
    positions,
    shard,
    sliding_window,
    unshard,
)
from ._serving import KVCache, attention_decode, attention_prefill, cache_placement
from .capi import (
    AbortedError,
    CudaError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    StriaError,
    TimeoutError,
    TransportError,
    UnsupportedError,
)

#: The version of the header these bindings were generated from.
__version__ = f"{capi.STRIA_VERSION_MAJOR}.{capi.STRIA_VERSION_MINOR}.{capi.STRIA_VERSION_PATCH}"


def library_version() -> int:
    """STRIA_VERSION of the loaded libstria (MAJOR*10000 + MINOR*100 + PATCH)."""
    return capi.stria_get_version()


__all__ = [
    "AbortedError",
    "Balance",
    "Context",
    "CudaError",
    "InternalError",
    "InvalidArgumentError",
    "KVCache",
    "Layout",
    "LocalGroup",
    "OutOfMemoryError",
    "Plan",
    "PlanConfig",
    "StepTime",
    "Traffic",
    "StriaError",
    "TimeoutError",
    "Transport",
    "TransportError",
    "UnsupportedError",
    "analyze_balance",
    "analyze_balance_steps",
    "attention_backward",
    "attention_decode",
    "attention_prefill",
    "attention_forward",
    "attention_params",
    "document_boundaries",
    "sliding_window",
    "cache_placement",
    "capi",
    "get_unique_id",
    "library_version",
    "local_group",
    "parse_device",
    "positions",
    "shard",
    "unshard",
]
