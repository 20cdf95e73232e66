"""Document plans: which tokens of a packed batch each rank holds, balanced for the ring.

Packed training data holds documents of very different lengths. A plan, made from the document
boundaries and the world size (stria_plan_create), keeps short documents whole on one rank and
cuts long ones into whole kernel tiles spread over the ranks, so that every rank does about the
same work at every ring step. Every rank makes the same plan from the same boundaries.

    plan = stria.Plan(cu_seqlens, world_size=8)        # [0, s1, ..., S] per batch row
    q_local = plan.shard(q_full, rank)                 # [B, plan.local_len, H, D]
    pos = plan.positions(rank)                         # RoPE ids and labels; -1 for padding
    out, lse = ctx.attention_forward(q_local, k_local, v_local, plan=plan)

A rank's slots without a token are padding (position -1): they attend to nothing and nothing
attends to them, so any S works with any N.
"""

from __future__ import annotations

import itertools
import operator
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import capi
from ._enums import Layout, LayoutLike
from ._tensors import default_stream, empty_like, for_dlpack, shape_of

Tensor = Any

_next_key = itertools.count(1)
_by_key: weakref.WeakValueDictionary[int, Plan] = weakref.WeakValueDictionary()
_by_key_lock = threading.Lock()


def plan_of_key(key: int, func: str) -> Plan:
    """The open plan of `key` (Plan._key), or a ValueError naming func (stria.torch's ops take
    plans by key, as they take contexts)."""
    with _by_key_lock:
        plan = _by_key.get(key)
    if plan is None or plan.closed:
        raise ValueError(f"{func}(): plan key {key} names no open stria.Plan")
    return plan


def _boundaries(cu_seqlens: Any) -> np.ndarray:
    """cu_seqlens as a C-contiguous 2-D int64 array of the plan's own: ``[n + 1]`` (one batch row)
    or ``[B, n + 1]``. Always a copy: the plan marks it read-only, which must not reach the caller's
    array, and a caller's tensor refilled in place (a loader's buffer) must not change the plan's."""
    if hasattr(cu_seqlens, "detach") and hasattr(cu_seqlens, "cpu"):  # a torch tensor, on any device
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    arr = np.asarray(cu_seqlens)
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
        raise TypeError(f"Plan(): cu_seqlens must hold integers (int64 positions), not {arr.dtype}")
    if arr.ndim not in (1, 2) or arr.shape[-1] < 2:
        raise ValueError(f"Plan(): cu_seqlens must be [n + 1] or [B, n + 1] boundaries with n >= 1, not {arr.shape}")
    return np.array(np.atleast_2d(arr), dtype=np.int64, order="C", copy=True)


def _is_host(x: Any) -> bool:
    """Whether x lives in host memory (numpy, a CPU torch tensor): the library's copies take those."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return True
    return int(dev()[0]) in (1, 3)  # kDLCPU, kDLCUDAHost


@dataclass(frozen=True)
class PlanConfig:
    """What a balanced plan is made with besides its boundaries: the same config and boundaries
    make the same plan on every rank. Hashable by value, so that a jitted JAX program taking one as
    a static argument is traced once for all the batches it plans (stria.jax makes each batch's
    plan from the traced boundaries)."""

    world_size: int
    tile: int = 128
    causal: bool = True
    window: tuple[int, int] | None = None
    local_len: int = 0


class Plan:
    """A document plan for packed sequences (see the module's docstring).

    cu_seqlens: the document boundaries, ``[0, s1, ..., S]`` for one batch row or ``[B, n + 1]``
    (rows with fewer documents repeat S). seq_len: S (default: the boundaries' last value).
    causal and window: the mask whose work to balance (the calls compute their own mask, whatever
    the plan was made for). tile: the tile size of the kernels that will run it (128, the GPU
    kernels'; the CPU kernels' 64 divides it). layout: instead of the balancing solver, that fixed
    layout's positions (for comparison). local_len: a fixed number of slots per rank (0: what the
    plan needs), so that compiled programs keep their shapes from batch to batch.
    """

    def __init__(
        self,
        cu_seqlens: Any,
        world_size: int,
        *,
        seq_len: int | None = None,
        causal: bool = True,
        window: tuple[int, int] | None = None,
        tile: int = 128,
        layout: LayoutLike | None = None,
        local_len: int = 0,
    ) -> None:
        self._handle = None
        cu = _boundaries(cu_seqlens)
        if seq_len is None:
            seq_len = int(cu[:, -1].max())
        config = capi.stria_plan_config_t()
        capi.stria_plan_config_init(config)
        config.world_size = int(world_size)
        config.causal = 1 if causal else 0
        left, right = window if window is not None else (-1, -1)
        config.window_left, config.window_right = int(left), int(right)
        config.tile = int(tile)
        self.tile = int(tile) if tile else 128
        config.local_len = int(local_len)
        if layout is not None:
            config.strategy = capi.STRIA_PLAN_LAYOUT
            config.layout = Layout.of(layout)
        self._layout = None if layout is None else Layout.of(layout)
        self._config = PlanConfig(int(world_size), int(tile) if tile else 128, bool(causal),
                                  None if window is None else (int(left), int(right)), int(local_len))
        self._handle = capi.stria_plan_create(config, cu, int(seq_len))
        info = capi.stria_plan_get_info(self._handle)
        self.world_size: int = info.world_size
        self.batch: int = info.batch
        self.num_seqs: int = info.num_seqs
        self.seq_len: int = info.seq_len
        #: Slots per rank: the L of every rank's ``[B, L, H, D]`` tensors.
        self.local_len: int = info.local_len
        cu.setflags(write=False)
        #: The boundaries the plan was made from, ``[B, n + 1]`` int64 (read-only).
        self.cu_seqlens: np.ndarray = cu
        with _by_key_lock:
            self._key = next(_next_key)
            _by_key[self._key] = self

    @property
    def config(self) -> PlanConfig:
        """The config this plan was made with (a balanced plan's: ValueError for a layout's)."""
        if self._layout is not None:
            raise ValueError(f"this plan follows the {self._layout.name.lower()} layout; it has no balanced config")
        return self._config

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def handle(self) -> Any:
        """The library's stria_plan_t (ValueError once closed)."""
        if self._handle is None:
            raise ValueError("the stria.Plan is closed")
        return self._handle

    def close(self) -> None:
        """Frees the plan; calls already made with it are unaffected. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            capi.stria_plan_destroy(handle)

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to tell
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"local_len={self.local_len}"
        return f"stria.Plan(world_size={self.world_size}, batch={self.batch}, seq_len={self.seq_len}, {state})"

    def positions(self, rank: int, *, ulysses: int = 1) -> np.ndarray:
        """The global position of each of `rank`'s slots, ``[batch, local_len]`` int64, -1 for
        padding: rotary position ids, and which labels the rank's tokens predict. ulysses > 1:
        rank of a grid of all-to-all groups of that many ranks on the plan's ring (Context.ulysses;
        ``[batch, local_len / ulysses]``, stria_plan_grid_positions)."""
        if ulysses == 1:
            raw = capi.stria_plan_positions(self.handle, int(rank))
            return np.frombuffer(raw, dtype=np.int64).reshape(self.batch, self.local_len)
        raw = capi.stria_plan_grid_positions(self.handle, operator.index(ulysses), int(rank))
        return np.frombuffer(raw, dtype=np.int64).reshape(self.batch, self.local_len // ulysses)

    def shard(
        self, full: Tensor, rank: int, *, seq_dim: int = 1, out: Tensor | None = None, ulysses: int = 1
    ) -> Tensor:
        """`rank`'s tokens of a full-sequence tensor along seq_dim (padding slots zero), into out or
        a new tensor like full. With several batch rows, dimension 0 is the batch. Host tensors go
        through the library; others (a CUDA torch tensor) are gathered by positions in torch.
        ulysses: as in positions."""
        shape = shape_of(full, "Plan.shard", "full")
        dim = seq_dim % len(shape) if shape else seq_dim
        if not _is_host(full):
            return self._gather_torch(full, rank, dim, out, ulysses)
        if out is None:
            local_shape = list(shape)
            if 0 <= dim < len(local_shape):
                local_shape[dim] = self.local_len // max(ulysses, 1)
            out = empty_like(full, tuple(local_shape), name="full")
        if ulysses == 1:
            capi.stria_plan_shard(
                self.handle, int(rank), seq_dim, for_dlpack(full), for_dlpack(out), default_stream(full)
            )
        else:
            capi.stria_plan_grid_shard(
                self.handle, operator.index(ulysses), int(rank), seq_dim, for_dlpack(full), for_dlpack(out),
                default_stream(full),
            )
        return out

    def unshard(
        self, local: Tensor, rank: int, *, seq_dim: int = 1, out: Tensor | None = None, ulysses: int = 1
    ) -> Tensor:
        """Writes `rank`'s tokens back into their places in a full-sequence tensor and returns it;
        pass the same out from every rank to assemble the whole sequence (a new one is zero
        elsewhere). ulysses: as in positions."""
        shape = shape_of(local, "Plan.unshard", "local")
        dim = seq_dim % len(shape) if shape else seq_dim
        if not _is_host(local):
            return self._scatter_torch(local, rank, dim, out, ulysses)
        if out is None:
            full_shape = list(shape)
            if 0 <= dim < len(full_shape):
                full_shape[dim] = self.seq_len
            out = empty_like(local, tuple(full_shape), zero=True, name="local")
        if ulysses == 1:
            capi.stria_plan_unshard(
                self.handle, int(rank), seq_dim, for_dlpack(local), for_dlpack(out), default_stream(local)
            )
        else:
            capi.stria_plan_grid_unshard(
                self.handle, operator.index(ulysses), int(rank), seq_dim, for_dlpack(local), for_dlpack(out),
                default_stream(local),
            )
        return out

    def _index(self, x: Tensor, rank: int, ulysses: int = 1) -> tuple[Any, Any]:
        """The positions of `rank` as a torch index on x's device (padding at 0) and the padding mask."""
        import torch  # noqa: PLC0415 - only for tensors that are not on the host

        pos = torch.as_tensor(self.positions(rank, ulysses=ulysses), device=x.device)
        return pos.clamp(min=0), pos < 0

    def _gather_torch(self, full: Tensor, rank: int, dim: int, out: Tensor | None, ulysses: int = 1) -> Tensor:
        import torch  # noqa: PLC0415 - only for tensors that are not on the host

        index, pad = self._index(full, rank, ulysses)
        rows = []
        for b in range(self.batch):
            row = full[b] if self.batch > 1 else full
            d = dim - 1 if self.batch > 1 else dim
            picked = row.index_select(d, index[b])
            shape = [1] * picked.dim()
            shape[d] = -1
            rows.append(picked.masked_fill(pad[b].view(shape), 0))
        result = torch.stack(rows) if self.batch > 1 else rows[0]
        if out is None:
            return result
        out.copy_(result)
        return out

    def _scatter_torch(self, local: Tensor, rank: int, dim: int, out: Tensor | None, ulysses: int = 1) -> Tensor:
        import torch  # noqa: PLC0415

        index, pad = self._index(local, rank, ulysses)
        if out is None:
            shape = list(local.shape)
            shape[dim] = self.seq_len
            out = torch.zeros(shape, dtype=local.dtype, device=local.device)
        for b in range(self.batch):
            row_out = out[b] if self.batch > 1 else out
            row_in = local[b] if self.batch > 1 else local
            d = dim - 1 if self.batch > 1 else dim
            keep = (~pad[b]).nonzero().flatten()
            row_out.index_copy_(d, index[b][keep], row_in.index_select(d, keep))
        return out

    def analyze_balance(self, tile: int | None = None) -> tuple[Any, np.ndarray]:
        """The ring's balance on this plan at `tile` (default: the plan's; 1 counts exact pairs), under
        the mask it was made for: ``(Balance, work)`` with work[step, rank] as analyze_balance_steps."""
        from ._ops import Balance  # noqa: PLC0415 - _ops imports this module

        b, raw = capi.stria_plan_analyze_balance(self.handle, int(tile if tile is not None else self.tile))
        work = np.frombuffer(raw, dtype=np.float64).reshape(self.world_size, self.world_size)
        return Balance(b.total_work, b.ring_latency, b.speedup, b.imbalance, b.ideal_latency, b.kv_rows_sent), work
