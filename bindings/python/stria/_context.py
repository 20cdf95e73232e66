"""Contexts: one rank of a ring, created alone (UCX/NCCL across processes), from a launcher's
environment, or as an in-process local group whose ranks are driven by threads."""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Union

from . import _ops, capi
from ._enums import Layout, LayoutLike, Transport, TransportLike
from .capi import AbortedError, InvalidArgumentError, StriaError

DeviceLike = Union[str, int, tuple[int, int], Any]  # "cpu", "cuda", "cuda:1", 1, (type, id), torch.device


def parse_device(device: DeviceLike) -> tuple[int, int]:
    """A DLPack (device_type, device_id): "cpu", "cuda", "cuda:N", a CUDA ordinal, a tuple, or a
    torch.device."""
    if isinstance(device, tuple) and len(device) == 2:
        return int(device[0]), int(device[1])
    if isinstance(device, int) and not isinstance(device, bool):
        return capi.kDLCUDA, device
    text = str(device)  # also torch.device("cuda:1")
    kind, _, index = text.partition(":")
    if kind == "cpu" and index in ("", "0"):
        return capi.kDLCPU, 0
    if kind == "cuda" and (index == "" or index.isdigit()):
        return capi.kDLCUDA, int(index or 0)
    raise ValueError(f"unknown device {device!r} (expected 'cpu', 'cuda', 'cuda:N', or a (device_type, id) tuple)")


def get_unique_id() -> bytes:
    """Opens rank 0's rendezvous (UCX/NCCL) and returns its 128-byte id, to hand to every rank
    (e.g. by an MPI or torch.distributed broadcast) and pass to Context(unique_id=...)."""
    return capi.stria_get_unique_id()


def _config(
    rank: int,
    world_size: int,
    device: DeviceLike,
    transport: TransportLike,
    unique_id: bytes | None,
    timeout_s: float,
    num_threads: int,
) -> capi.stria_context_config_t:
    config = capi.stria_context_config_t()
    capi.stria_context_config_init(config)
    config.rank = _c_int("rank", rank)
    config.world_size = _c_int("world_size", world_size)
    config.device = parse_device(device)
    config.transport = Transport.of(transport)
    if unique_id is not None:
        if isinstance(unique_id, str):
            raise TypeError("unique_id must be the 128 bytes of get_unique_id() (bytes), not str")
        config.unique_id.internal = bytes(unique_id)  # raises unless exactly 128 bytes
    config.timeout_s = float(timeout_s)
    config.num_threads = _c_int("num_threads", num_threads)
    return config


def _c_int(name: str, value: int) -> int:
    """value as the C int the config holds: the library's own range checks then apply, and a
    value no C int can hold is an InvalidArgumentError naming the field, not SWIG's overflow."""
    v = operator.index(value)
    if not -(2**31) <= v < 2**31:
        raise capi.InvalidArgumentError(f"config {name} {v} does not fit the C int it is passed as")
    return v


# The variables the library itself reads (getenv) while creating a context whose unique id is all
# zero: Context.from_env(environ=...) must show it the mapping's values, not the process's.
_LIBRARY_ENV_VARS = ("STRIA_ROOT", "STRIA_SECRET")


class _LibraryEnviron:
    """Sets the library's variables in the process environment for the duration of a context
    creation and restores them afterwards (absent ones stay absent).

    Creations that want the same values share one setting: the ranks of a job created by threads
    of one process wait for each other inside the create, so they must not be serialised.
    Creations that want other values wait until the current ones are restored.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._values: dict[str, str | None] | None = None  # what is set now, while _holders > 0
        self._saved: dict[str, str | None] = {}
        self._holders = 0

    @staticmethod
    def _put(values: Mapping[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    @contextlib.contextmanager
    def __call__(self, values: dict[str, str | None]) -> Iterator[None]:
        with self._cond:
            while self._holders and self._values != values:
                self._cond.wait()
            if not self._holders:
                self._saved = {name: os.environ.get(name) for name in values}
                self._put(values)
                self._values = values
            self._holders += 1
        try:
            yield
        finally:
            with self._cond:
                self._holders -= 1
                if not self._holders:
                    self._put(self._saved)
                    self._values = None
                    self._cond.notify_all()


_library_environ = _LibraryEnviron()

# Every context's key, for code that can carry only numbers to where the context is used (a
# compiled torch graph's custom op): a key is never reused, so a stale one finds nothing.
_next_key = itertools.count(1)
_by_key: weakref.WeakValueDictionary[int, Context] = weakref.WeakValueDictionary()
_by_key_lock = threading.Lock()


def context_or_none(key: int) -> Context | None:
    """The context of `key` while it is alive (open or not), else None."""
    with _by_key_lock:
        return _by_key.get(key)


def context_of_key(key: int, func: str) -> Context:
    """The open context of `key` (Context._key), or a ValueError naming func."""
    with _by_key_lock:
        ctx = _by_key.get(key)
    if ctx is None or ctx.closed:
        raise ValueError(
            f"{func}(): the stria context this computation was made for (key {key}) is closed: call the "
            "function again with an open context"
        )
    return ctx


def _rank_thread_scope() -> contextlib.AbstractContextManager:
    """What a rank's thread in LocalGroup.run runs under: where torch is loaded, its autograd
    backward on the calling thread. By default torch runs a backward's CUDA work on one worker
    thread per device, shared by every thread that calls backward: ranks on one GPU would queue
    their backward collectives there one behind the other, the first waiting for peers queued
    behind it until its timeout."""
    torch = sys.modules.get("torch")
    setter = getattr(getattr(torch, "autograd", None), "set_multithreading_enabled", None)
    return setter(False) if setter is not None else contextlib.nullcontext()


class Context:
    """One rank of a ring. Close it (or use ``with``) to free it; it is closed when collected.

    A context is driven by one thread at a time; the ranks of a local group each need their own
    thread (LocalGroup.run does that). abort() may be called from any thread.
    """

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        *,
        device: DeviceLike = "cpu",
        transport: TransportLike = Transport.LOCAL,
        unique_id: bytes | None = None,
        timeout_s: float = 0.0,
        num_threads: int = 0,
        nccl_comm: int | None = None,
        ulysses: int = 1,
    ):
        """Creates rank `rank` of `world_size` (stria_context_create).

        transport LOCAL takes world_size 1 (use local_group() for more ranks in one process).
        UCX and NCCL join ranks across processes: every rank passes rank 0's `unique_id`
        (get_unique_id() on rank 0, broadcast by the caller), or none (128 zero bytes) to
        rendezvous through the environment (see from_env). timeout_s 0 is the library's
        default (300 s); num_threads 0 uses every core (at most 1024).

        nccl_comm: with transport NCCL, an ncclComm_t the caller already has, as its address (an
        int), whose rank, size and device match (stria_context_create_with_nccl_comm); stria
        never destroys it.

        ulysses: a grid of all-to-all groups of that many consecutive ranks (see the ``ulysses``
        property); every rank passes the same.
        """
        self._handle = None
        config = _config(rank, world_size, device, transport, unique_id, timeout_s, num_threads)
        if config.transport == capi.STRIA_TRANSPORT_LOCAL and config.world_size > 1:
            # The library's message names its C function; in Python terms:
            raise InvalidArgumentError(
                f"Context(world_size={world_size}) with the local transport: the local transport joins ranks of one "
                f"process, made together by stria.local_group({world_size}); across processes use transport='ucx' "
                "(or 'nccl') with rank 0's unique_id, or Context.from_env() under a launcher"
            )
        if nccl_comm is None:
            handle = capi.stria_context_create(config)
        else:
            handle = capi.stria_context_create_with_nccl_comm(config, operator.index(nccl_comm))
        self._adopt(handle, parse_device(device))
        self._set_grid_or_close(ulysses)

    def _set_grid_or_close(self, ulysses: int) -> None:
        """Applies a grid given at creation; a bad one closes the new context and raises."""
        if ulysses != 1:
            try:
                self.ulysses = ulysses
            except BaseException:
                self.close()
                raise

    @classmethod
    def _from_handle(cls, handle: Any, device: tuple[int, int]) -> Context:
        self = cls.__new__(cls)
        self._handle = None
        self._adopt(handle, device)
        return self

    def _adopt(self, handle: Any, device: tuple[int, int]) -> None:
        self._handle = handle
        self._device = device
        self._lock = threading.Lock()
        self._close_hooks: list[Callable[[], None]] = []
        self._in_local_group = False  # ranks that are threads of this process (LocalGroup sets it)
        self._deterministic = False  # the context's own setting (the deterministic property)
        self._applied_deterministic = False  # what the library has now (_ops.apply_deterministic)
        with _by_key_lock:
            self._key = next(_next_key)
            _by_key[self._key] = self
        self._rank = capi.stria_context_get_rank(handle)
        self._world_size = capi.stria_context_get_world_size(handle)

    @classmethod
    def join(
        cls,
        rank: int,
        world_size: int,
        share: Callable[[Any], Any],
        *,
        device: DeviceLike = "cpu",
        transport: TransportLike = Transport.UCX,
        timeout_s: float = 0.0,
        num_threads: int = 0,
        ulysses: int = 1,
    ) -> Context:
        """Rank `rank` of `world_size` processes that meet through a broadcast the caller has.

        share(payload) is a broadcast from rank 0 that every rank calls: rank 0 passes its
        payload, the others None, and every rank gets rank 0's payload back (a framework's
        object broadcast, an MPI bcast, a key-value store). Rank 0 opens the rendezvous
        (get_unique_id) and shares its id; if that fails, it shares the failure instead, and
        every rank raises it (the same StriaError subclass) rather than wait for an id. A world
        of one needs no rendezvous and does not call share.
        """
        if world_size == 1:
            return cls(
                rank, 1, device=device, transport=transport, timeout_s=timeout_s, num_threads=num_threads,
                ulysses=ulysses,
            )
        payload = None
        failure: StriaError | None = None
        if rank == 0:
            try:
                payload = ("id", get_unique_id())
            except StriaError as e:
                failure = e
                payload = ("error", type(e).__name__, str(e))
        got = share(payload)
        if failure is not None:
            raise failure
        if not (isinstance(got, tuple) and got and got[0] in ("id", "error")):
            raise InvalidArgumentError(f"Context.join: share() returned {type(got).__name__}, not rank 0's payload")
        if got[0] == "error":
            kind = getattr(capi, got[1], StriaError)
            kind = kind if isinstance(kind, type) and issubclass(kind, StriaError) else StriaError
            raise kind(f"Context.join: rank 0 could not open the rendezvous: {got[2]}")
        return cls(
            rank,
            world_size,
            device=device,
            transport=transport,
            unique_id=got[1],
            timeout_s=timeout_s,
            num_threads=num_threads,
            ulysses=ulysses,
        )

    @classmethod
    def from_env(
        cls,
        *,
        device: str = "cpu",
        transport: TransportLike = Transport.UCX,
        timeout_s: float = 0.0,
        num_threads: int = 0,
        environ: Mapping[str, str] | None = None,
        ulysses: int = 1,
    ) -> Context:
        """The context of this process under torchrun or mpirun.

        Rank and world size come from RANK / WORLD_SIZE (torchrun) or OMPI_COMM_WORLD_RANK /
        OMPI_COMM_WORLD_SIZE (mpirun). device "cuda" uses the GPU LOCAL_RANK (or
        OMPI_COMM_WORLD_LOCAL_RANK). The ranks meet at STRIA_ROOT=host:port (rank 0 listens
        there, the others connect), authenticated with STRIA_SECRET (hex) when set: the unique id
        is left all zero, which tells the transport to rendezvous from the environment. A world
        of one needs no STRIA_ROOT (it meets no peer).

        `environ` (default os.environ) is where all of these are read. The library reads
        STRIA_ROOT and STRIA_SECRET itself (getenv) while it creates the context, so with a
        mapping they are briefly set in the process environment (os.environ) to the mapping's
        values, or removed where the mapping has none, and restored afterwards, absence included.
        Meanwhile other threads see those values; from_env calls that need different ones wait
        for each other (calls with the same values, e.g. ranks created by threads, run together).

        ulysses: a grid of all-to-all groups of that many consecutive ranks (the GPUs of a node,
        typically the launcher's LOCAL_WORLD_SIZE); see the ``ulysses`` property.
        """
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            rank_var, size_var, local_var = "RANK", "WORLD_SIZE", "LOCAL_RANK"
        elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
            rank_var, size_var, local_var = (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            )
        else:
            raise InvalidArgumentError(
                "Context.from_env: no launcher environment found: set RANK and WORLD_SIZE (torchrun does) or "
                "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (mpirun does)"
            )
        if not env.get("STRIA_ROOT") and env.get(size_var) != "1":
            raise InvalidArgumentError(
                "Context.from_env: STRIA_ROOT is not set: export STRIA_ROOT=host:port on every rank (rank 0 "
                "listens there and the others connect; under torchrun e.g. STRIA_ROOT=$MASTER_ADDR:29600), and "
                "optionally STRIA_SECRET=<hex> to authenticate the peers"
            )
        try:
            rank, world_size = int(env[rank_var]), int(env[size_var])
            local_rank = int(env.get(local_var, "0"))
        except ValueError as e:
            raise InvalidArgumentError(
                f"Context.from_env: {rank_var}/{size_var}/{local_var} must be integers ({e})"
            ) from None
        dev = parse_device(device)
        if dev[0] == capi.kDLCUDA and ":" not in str(device):
            dev = (capi.kDLCUDA, local_rank)
        if world_size == 1 and not env.get("STRIA_ROOT"):
            # A launcher's world of one (torchrun --nproc-per-node 1): no peer to meet.
            return cls(
                rank, 1, device=dev, transport=Transport.LOCAL, timeout_s=timeout_s, num_threads=num_threads,
                ulysses=ulysses,
            )

        def create() -> Context:
            return cls(
                rank,
                world_size,
                device=dev,
                transport=transport,
                unique_id=None,
                timeout_s=timeout_s,
                num_threads=num_threads,
                ulysses=ulysses,
            )

        if environ is None or environ is os.environ:
            return create()
        with _library_environ({name: env.get(name) for name in _LIBRARY_ENV_VARS}):
            return create()

    # ---- properties --------------------------------------------------------------------
    @property
    def handle(self) -> Any:
        """The stria_context_t for stria.capi calls; InvalidArgumentError once closed."""
        if self._handle is None:
            raise InvalidArgumentError("this stria Context is closed")
        return self._handle

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> tuple[int, int]:
        """The DLPack (device_type, device_id) of this context."""
        return self._device

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def deterministic(self) -> bool:
        """Whether backward calls on this context give the same bits on every run
        (stria_context_set_deterministic; default False). CPU contexts always do; on CUDA the
        Hopper TMA kernels then add dQ in a fixed order in the same pass, and the other
        tensor-core kernels compute dQ in a pass of its own instead of with float atomics
        (slower). A call's ``deterministic`` argument overrides it for that call; stria.torch
        turns it on while ``torch.are_deterministic_algorithms_enabled()``."""
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        _ops.apply_deterministic(self, bool(value))
        self._deterministic = bool(value)

    @property
    def ulysses(self) -> int:
        """The size U of this context's all-to-all groups (stria_context_set_grid; 1, the plain
        ring, by default). On a grid the world_size ranks form world_size / U groups of U
        consecutive ranks: a call swaps sequence shards for head shards within each group (U must
        divide the query heads, and divide the K/V heads or be a multiple of them), runs the ring
        across the groups and swaps back. Tokens are placed by the layout on the ring of groups,
        each group's share cut into U contiguous pieces: shard with ``stria.shard(...,
        ulysses=ctx.ulysses)`` and take positions from ``stria.positions(..., ulysses=...)``.
        Every rank sets the same U, between calls."""
        return int(capi.stria_context_get_grid(self.handle))

    @ulysses.setter
    def ulysses(self, value: int) -> None:
        _ops.set_grid(self, value)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<stria.Context rank {self._rank} of {self._world_size}, device {self._device}, {state}>"

    # ---- operations --------------------------------------------------------------------
    def attention_forward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any = None,
        lse: Any = None,
        *,
        layout: LayoutLike = Layout.STRIPED,
        causal: bool = True,
        softmax_scale: float | None = None,
        cu_seqlens: Any = None,
        window: tuple[int, int] | None = None,
        plan: Any = None,
        softcap: float | None = None,
        sinks: Any = None,
        q_descale: Any = None,
        k_descale: Any = None,
        v_descale: Any = None,
        stream: int | None = None,
        call_tag: int = 0,
    ) -> tuple[Any, Any]:
        """stria.attention_forward on this context."""
        return _ops.attention_forward(
            self,
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
            sinks=sinks,
            q_descale=q_descale,
            k_descale=k_descale,
            v_descale=v_descale,
            stream=stream,
            call_tag=call_tag,
        )

    def attention_decode(self, q: Any, k_cache: Any, v_cache: Any, cache_lens: Any, *args: Any, **kwargs: Any) -> Any:
        """stria.attention_decode on this context."""
        from ._serving import attention_decode  # noqa: PLC0415 - _serving imports _ops, as this module does

        return attention_decode(self, q, k_cache, v_cache, cache_lens, *args, **kwargs)

    def attention_prefill(
        self, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, cache_lens: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """stria.attention_prefill on this context."""
        from ._serving import attention_prefill  # noqa: PLC0415 - as attention_decode

        return attention_prefill(self, q, k, v, k_cache, v_cache, cache_lens, *args, **kwargs)

    def attention_backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        dq: Any = None,
        dk: Any = None,
        dv: Any = None,
        *,
        layout: LayoutLike = Layout.STRIPED,
        causal: bool = True,
        softmax_scale: float | None = None,
        cu_seqlens: Any = None,
        window: tuple[int, int] | None = None,
        plan: Any = None,
        softcap: float | None = None,
        sinks: Any = None,
        dsinks: Any = None,
        stream: int | None = None,
        call_tag: int = 0,
        deterministic: bool | None = None,
    ) -> tuple[Any, ...]:
        """stria.attention_backward on this context."""
        return _ops.attention_backward(
            self,
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
            window=window,
            plan=plan,
            softcap=softcap,
            sinks=sinks,
            dsinks=dsinks,
            stream=stream,
            call_tag=call_tag,
            deterministic=deterministic,
        )

    def step_times(self) -> list[_ops.StepTime]:
        """Per-step timings of this context's last attention call."""
        return _ops.step_times(self)

    def traffic(self) -> _ops.Traffic:
        """The bytes this rank sent in this context's last attention call."""
        return _ops.traffic(self)

    def abort(self) -> None:
        """Makes a call in progress on this context (in another thread) fail with AbortedError,
        and every later call too; peers see the rank leave. Only close() remains useful."""
        capi.stria_context_abort(self.handle)

    def close(self) -> None:
        """Destroys the context (idempotent)."""
        with self._lock:
            handle, self._handle = self._handle, None
            hooks, self._close_hooks = self._close_hooks, []
        if handle is not None:
            # What refers to the handle elsewhere (stria.jax's binding) lets go of it first.
            for hook in hooks:
                hook()
            capi.stria_context_destroy(handle)

    def _on_close(self, hook: Callable[[], None]) -> None:
        """Runs hook() when the context closes, before its handle is destroyed."""
        with self._lock:
            if self._handle is None:
                raise ValueError("the stria context is closed")
            self._close_hooks.append(hook)

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None and capi is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing can be raised from a finalizer
                pass


class LocalGroup(Sequence[Context]):
    """world_size contexts in this process joined by the in-process transport, all on ``device``,
    or rank r on ``devices[r]`` (e.g. ``["cuda:0", "cuda:1"]``: a ring over this process's GPUs,
    blocks copied GPU to GPU; each rank's tensors live on its own device).

    Every collective (attention_forward/backward) must be called by all ranks at once, each
    from its own thread: run() does that. Use it as a context manager, or close() it.
    """

    def __init__(
        self,
        world_size: int,
        *,
        device: DeviceLike = "cpu",
        devices: Sequence[DeviceLike] | None = None,
        timeout_s: float = 0.0,
        num_threads: int = 0,
        ulysses: int = 1,
    ):
        config = _config(0, 1, device, Transport.LOCAL, None, timeout_s, num_threads)
        if devices is None:
            handles = capi.stria_context_create_local_group(config, world_size)
            placed = [parse_device(device)] * len(handles)
        else:
            # Rank r on devices[r] (stria_context_create_local_group_on_devices): e.g. a ring over
            # the GPUs of this process, ["cuda:0", "cuda:1", ...].
            placed = [parse_device(d) for d in devices]
            if len(placed) != world_size:
                raise ValueError(f"LocalGroup: {len(placed)} devices for world_size {world_size}: one per rank")
            handles = capi.stria_context_create_local_group_on_devices(config, placed)
        self._contexts = [Context._from_handle(h, dev) for h, dev in zip(handles, placed)]
        for c in self._contexts:
            c._in_local_group = True
        if ulysses != 1:
            try:
                for c in self._contexts:
                    c.ulysses = ulysses
            except BaseException:
                self.close()
                raise

    def __len__(self) -> int:
        return len(self._contexts)

    def __getitem__(self, index):  # type: ignore[override]
        return self._contexts[index]

    def __iter__(self) -> Iterator[Context]:
        return iter(self._contexts)

    def run(self, fn: Callable[..., Any], *per_rank_args: Sequence[Any], abort_on_error: bool = True) -> list[Any]:
        """Calls fn(ctx, *args) for every rank at once, each in its own thread, and returns the
        results in rank order. ``per_rank_args`` are sequences indexed by rank.

        If a rank raises, the group is aborted (abort_on_error) so that the other ranks, which
        may be waiting for it inside a collective, fail at once instead of at the timeout; the
        first error raised, in time, that is not an AbortedError is re-raised (the ranks that the
        abort ends fail after it, with AbortedError or a TransportError naming a rank that left).
        An aborted group can only be closed. An interrupt of the calling thread while it waits
        (KeyboardInterrupt) aborts the group too, and is re-raised once the ranks have returned.
        """
        n = len(self._contexts)
        for args in per_rank_args:
            if len(args) != n:
                raise ValueError(f"LocalGroup.run: each per-rank argument needs {n} entries, got {len(args)}")
        results: list[Any] = [None] * n
        failures: list[BaseException] = []  # in the order they were raised
        lock = threading.Lock()

        def body(rank: int) -> None:
            try:
                with _rank_thread_scope():
                    results[rank] = fn(self._contexts[rank], *(args[rank] for args in per_rank_args))
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread
                with lock:
                    failures.append(e)
                if abort_on_error:
                    self.abort()

        # Daemon threads, and an interrupt of this thread (Ctrl-C) aborts the group: a rank left
        # waiting in a collective would otherwise hold the interpreter's exit until its timeout.
        threads = [threading.Thread(target=body, args=(r,), name=f"stria-rank-{r}", daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:
            self.abort()
            for t in threads:
                t.join(timeout=5.0)  # the aborted calls return at once; the caller's own code may not
            raise
        if failures:
            primary = [e for e in failures if not isinstance(e, AbortedError)]
            raise (primary or failures)[0]
        return results

    def abort(self) -> None:
        """Aborts every rank (see Context.abort)."""
        for ctx in self._contexts:
            if not ctx.closed:
                try:
                    ctx.abort()
                except InvalidArgumentError:
                    pass  # closed meanwhile

    def close(self) -> None:
        for ctx in self._contexts:
            ctx.close()

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<stria.LocalGroup of {len(self._contexts)} ranks>"


def local_group(
    world_size: int,
    *,
    device: DeviceLike = "cpu",
    devices: Sequence[DeviceLike] | None = None,
    timeout_s: float = 0.0,
    num_threads: int = 0,
    ulysses: int = 1,
) -> LocalGroup:
    """world_size ranks in this process (stria_context_create_local_group), all on ``device``, or
    rank r on ``devices[r]``; ulysses: a grid of all-to-all groups of that many ranks (see
    Context.ulysses). See LocalGroup."""
    return LocalGroup(
        world_size, device=device, devices=devices, timeout_s=timeout_s, num_threads=num_threads, ulysses=ulysses
    )
