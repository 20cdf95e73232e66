"""HuggingFace transformers integration: stria as an attention implementation of any model that
takes transformers' attention interface (Llama, Qwen2, Mistral, Gemma 2, gpt-oss, Llama 4,
DeepSeek-V3, ...).

    import stria.transformers as st

    model = AutoModelForCausalLM.from_config(config, attn_implementation="stria")
    batch = st.shard_batch(ctx, input_ids, labels, layout="striped")  # this rank's tokens
    out = model(**batch.model_inputs())                                 # out.loss: this rank's share
    out.loss.backward()                                                 # sum the gradients over ranks

Importing the module registers ``"stria"`` with transformers' ``AttentionInterface`` and its mask
interface (``register()`` does it again, under another name if wanted). Every rank of a stria
context runs the model on its own shard of the sequence (``shard_batch``: input ids, position ids
for the rotary embeddings, and the next-token labels shifted before sharding, since a rank's tokens
are not consecutive); the attention layers then run stria's ring over the ranks. The loss of each
rank is its share of the mean over every rank's tokens, so the sum of the ranks' losses is the loss
of the whole batch, and the sum of their gradients its gradient: threads of a local group sharing
one model sum them by themselves, processes (torchrun, ``stria.torch.context_from_group``) reduce
them as data-parallel training does.

What the attention layers pass is honoured: the scaling, grouped-query heads, the causal flag, a
sliding window (per layer), logit softcapping (Gemma 2) and attention sinks (gpt-oss,
differentiable); and what the model's config says of its layers: chunked attention (Llama 4: each
document cut into chunks as the documents), query temperatures computed from positions (Llama 4's
layers without rotary embeddings, rescaled to each token's own position), value heads of another
width than the query's (DeepSeek-V3). What stria cannot honour is refused with a ValueError: an
attention mask tensor (a padding mask or a custom 4D mask: pack the documents and pass
``cu_seqlens`` instead), a mask with blocks of tokens that see each other both ways, dropout in
training, a key/value cache, position biases, chunked attention on a document plan. And before a
model first runs on shards it is checked as a whole (``check_model``): families that mix tokens
otherwise than by attention (Mamba, gated delta rule and other recurrent or convolutional layers,
attention over compressed keys), that compute attention outside transformers' attention interface,
or that number positions themselves, are refused with the reason instead of running wrong.

Generation runs on a KV cache sharded over the ranks (``ShardedCache``): every rank runs the model on
the same tokens, each keeps its share of every layer's cache (striped by position, so the shares
grow evenly), and each attention layer is one stria_attention_decode call, whose merged result is
the same on every rank:

    cache = st.ShardedCache(ctx, model.config, batch=1, capacity=4096)   # per rank
    tokens = model.generate(input_ids, cache=cache, do_sample=False)

The sharding reaches the attention layers in the model's keyword arguments (``model_inputs()``
passes it as ``stria=``), which works under ``torch.compile``; or for the calls inside
``with st.sharded(batch.sharding):`` on this thread, for models that do not pass their keyword
arguments down to the attention layers.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from . import torch as stria_torch
from ._context import Context
from ._enums import Layout, LayoutLike
from ._ops import positions as layout_positions
from ._plan import Plan

from ._serving import KVCache

try:
    from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("stria.transformers needs HuggingFace transformers: pip install transformers") from e

__all__ = [
    "ShardedBatch",
    "ShardedCache",
    "Sharding",
    "attention_forward",
    "check_model",
    "register",
    "shard_batch",
    "sharded",
]

NAME = "stria"


@dataclass(frozen=True)
class Sharding:
    """How a batch is spread over the ranks of `context`: by `layout`, or by a document `plan`;
    `cu_seqlens` (int64 ``[B, n + 1]`` global boundaries, or None) masks each query to its own
    document. Hashed by identity, so that torch.compile guards on the object rather than its
    fields."""

    context: Context
    layout: LayoutLike = Layout.STRIPED
    plan: Plan | None = None
    cu_seqlens: torch.Tensor | None = None
    # The batch's sequence length, and the global position of each of this rank's tokens (int64
    # ``[B, L]``, -1 for a plan's padding slots): what layers that depend on a token's place in the
    # sequence need (chunked attention, Llama 4's attention temperature). None: not known.
    seq_len: int | None = None
    positions: torch.Tensor | None = None
    # The boundaries of chunked-attention layers, by chunk size and batch (made at the first layer).
    chunks: dict = field(default_factory=dict, repr=False)

    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def shard(self, x: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """This rank's part of a per-token tensor of the whole batch, as shard_batch shards the
        ids: ``[B, S, ...]`` (per-token weights, a reinforcement-learning step's old log-probs and
        advantages, ...) or ``[..., B, S]`` with leading axes (M-RoPE's rows of positions), each
        sharded along the sequence; a plan's padding slots get `fill`."""
        if self.positions is None or self.seq_len is None:
            raise ValueError("Sharding.shard(): this sharding was not made by shard_batch")
        batch, seq = self.positions.shape[0], self.seq_len
        if isinstance(x, torch.Tensor) and x.shape[:2] == (batch, seq):
            lead = 0
        elif isinstance(x, torch.Tensor) and x.shape[-2:] == (batch, seq):
            lead = x.dim() - 2  # moved behind the sequence axis, and back
            x = x.movedim(tuple(range(lead)), tuple(range(2, 2 + lead)))
        else:
            want = f"a [{batch}, {seq}, ...] or [..., {batch}, {seq}] tensor"
            raise ValueError(f"Sharding.shard(): {want}, not {_shape(x)}")
        where = self.positions.to(x.device)
        at = where.clamp(min=0).view(*where.shape, *(1,) * (x.dim() - 2)).expand(*where.shape, *x.shape[2:])
        picked = torch.gather(x, 1, at)
        if self.plan is not None:
            picked = picked.masked_fill((where < 0).view(*where.shape, *(1,) * (x.dim() - 2)), fill)
        if lead:
            picked = picked.movedim(tuple(range(2, 2 + lead)), tuple(range(lead)))
        return picked.contiguous()


@dataclass
class ShardedBatch:
    """One rank's part of a batch: its tokens' ids, position ids and next-token labels (ignored
    positions ``ignore_index``), the number of labels over all ranks (which each rank's loss is
    divided by), and the sharding its model's attention layers run on."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None
    num_items_in_batch: torch.Tensor | None
    sharding: Sharding
    inputs_embeds: torch.Tensor | None = None

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments of a transformers model's forward: with labels, its loss is this
        rank's share of the batch's mean loss (``shift_labels``: the labels are shifted already).
        With ``inputs_embeds`` (a multimodal batch embedded before sharding) they replace the ids."""
        tokens = {"input_ids": self.input_ids} if self.inputs_embeds is None else {"inputs_embeds": self.inputs_embeds}
        inputs: dict[str, Any] = {
            **tokens,
            "position_ids": self.position_ids,
            "use_cache": False,
            NAME: self.sharding,
        }
        if self.labels is not None:
            inputs.update(labels=self.labels, shift_labels=self.labels, num_items_in_batch=self.num_items_in_batch)
        _check_next_model(self.sharding.context, self.inputs_embeds is not None)
        return inputs


_current = threading.local()


@contextmanager
def sharded(sharding: Sharding) -> Iterator[Sharding]:
    """The sharding the attention layers of models called on this thread run on, inside the block
    (for models that do not pass ``stria=`` down to their attention layers)."""
    previous = getattr(_current, "sharding", None)
    _current.sharding = sharding
    try:
        yield sharding
    finally:
        _current.sharding = previous


def _boundaries(cu_seqlens: Any, batch: int, seq: int) -> torch.Tensor | None:
    """cu_seqlens as int64 ``[B, n + 1]`` on the CPU (one row for every batch row, or one each)."""
    if cu_seqlens is None:
        return None
    cu = torch.as_tensor(np.asarray(cu_seqlens.cpu() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens))
    if cu.dtype.is_floating_point or cu.dim() not in (1, 2) or cu.shape[-1] < 2:
        raise ValueError(f"cu_seqlens must be integer boundaries [0, s1, ..., S] (or one row per batch row), not {cu}")
    cu = cu.to(torch.int64).expand(batch, cu.shape[-1]).contiguous()
    if bool((cu[:, 0] != 0).any()) or bool((cu[:, -1] != seq).any()):
        raise ValueError(f"cu_seqlens rows must run from 0 to the sequence length {seq}: {cu.tolist()}")
    return cu


def _document_starts(cu: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor:
    """For each token, the position where its document starts ([B, S]; 0 without documents)."""
    if cu is None:
        return torch.zeros(batch, seq, dtype=torch.int64)
    index = torch.arange(seq).expand(batch, seq).contiguous()
    doc = torch.searchsorted(cu, index, right=True) - 1
    return torch.gather(cu, 1, doc)


def shard_batch(
    context: Context,
    input_ids: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    cu_seqlens: Any = None,
    layout: LayoutLike = Layout.STRIPED,
    plan: Plan | None = None,
    ignore_index: int = -100,
    pad_token_id: int = 0,
) -> ShardedBatch:
    """This rank's part of a batch of whole sequences ``input_ids`` ``[B, S]``.

    labels (``[B, S]``, as a causal LM takes them: usually input_ids) are shifted first, so that
    token i's label is token i + 1's (its document's last token, and the sequence's, get
    ignore_index), then sharded like the tokens. position_ids default to each token's position in
    its document (packed documents restart at 0, as for one-document sequences). cu_seqlens packs
    several documents into each sequence: global boundaries ``[0, s1, ..., S]`` for every batch row
    or one row each. The tokens go to the ranks by `layout` (S a multiple of the world size, twice
    it for zigzag), or by `plan` (a stria.Plan made from these boundaries and the world size:
    rank slots without a token get pad_token_id, position 0 and label ignore_index, and attend to
    nothing).

    Multimodal models: position_ids may carry leading axes (``[k, B, S]``: Qwen2-VL's M-RoPE rows,
    as its ``get_rope_index`` gives them), each sharded along the sequence; ``inputs_embeds``
    (``[B, S, hidden]``: the token embeddings with the image features merged in, made from the
    whole batch) are sharded like the tokens and given to the model instead of the ids (a rank's
    ids alone cannot be matched to its images' features). Padding slots get zero embeddings.
    """
    if not isinstance(context, Context):
        raise TypeError(f"shard_batch(): context must be a stria.Context, not {type(context).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("shard_batch(): input_ids must be a [B, S] torch tensor")
    batch, seq = input_ids.shape
    cu = _boundaries(cu_seqlens, batch, seq)
    if plan is not None:
        if not isinstance(plan, Plan):
            raise TypeError(f"shard_batch(): plan must be a stria.Plan, not {type(plan).__name__}")
        if cu is None:
            cu = torch.as_tensor(np.array(plan.cu_seqlens, dtype=np.int64)).expand(batch, -1).contiguous()
    starts = _document_starts(cu, batch, seq)
    if position_ids is None:
        position_ids = torch.arange(seq).expand(batch, seq) - starts
    elif (
        not isinstance(position_ids, torch.Tensor) or position_ids.dim() < 2 or position_ids.shape[-2:] != (batch, seq)
    ):
        raise ValueError(
            f"shard_batch(): position_ids must be [..., {batch}, {seq}] like input_ids, not {_shape(position_ids)}"
        )
    if inputs_embeds is not None and (
        not isinstance(inputs_embeds, torch.Tensor)
        or inputs_embeds.dim() != 3
        or inputs_embeds.shape[:2] != (batch, seq)
    ):
        raise ValueError(
            f"shard_batch(): inputs_embeds must be [{batch}, {seq}, hidden] like input_ids, not {_shape(inputs_embeds)}"
        )
    shifted = None
    if labels is not None:
        shifted = torch.full_like(labels, ignore_index)
        shifted[:, :-1] = labels[:, 1:]
        if cu is not None:  # a document's last token predicts nothing of the next document
            last = torch.zeros(batch, seq, dtype=torch.bool)
            ends = cu[:, 1:] - 1
            valid = ends >= 0
            last[torch.arange(batch)[:, None].expand_as(ends)[valid], ends[valid]] = True
            shifted[last.to(shifted.device)] = ignore_index
    n, rank, ulysses = context.world_size, context.rank, context.ulysses
    if plan is not None:
        # On a grid the plan is for the ring of groups, each group's slots cut into pieces.
        if plan.batch != batch or plan.seq_len != seq or plan.world_size != n // ulysses:
            raise ValueError(
                f"shard_batch(): the plan is for {plan.batch} rows of {plan.seq_len} tokens over {plan.world_size} "
                f"ranks, the batch is {batch} rows of {seq} over {n // ulysses}"
                + (f" groups of {ulysses}" if ulysses > 1 else "")
            )
        where = torch.from_numpy(plan.positions(rank, ulysses=ulysses).copy())  # -1 for padding
    else:
        # On a grid the layout places tokens on the ring of groups, each group's cut in pieces.
        index = layout_positions(layout, seq, n, rank, ulysses=context.ulysses).astype(np.int64)
        where = torch.from_numpy(index).expand(batch, -1)
    sharding = Sharding(context, Layout.of(layout), plan, cu, seq, where.contiguous())
    ids = sharding.shard(input_ids, pad_token_id)
    pos = sharding.shard(position_ids.to(input_ids.device))
    embeds = None if inputs_embeds is None else sharding.shard(inputs_embeds)
    lab = None if shifted is None else sharding.shard(shifted, ignore_index)
    count = None if shifted is None else (shifted != ignore_index).sum()
    return ShardedBatch(ids, pos, lab, count, sharding, embeds)


def _shape(x: Any) -> Any:
    """What a shape error names: a tensor's shape, or the type of what came instead."""
    return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def _refuse(message: str) -> None:
    raise ValueError(f"stria attention: {message}")


# transformers' layer types whose mixing of tokens stria computes on a rank's shard exactly: its own
# attention kinds, and layers that mix no tokens at all (the feed-forward kinds). Every other kind
# (recurrent and convolutional mixers, attention over compressed, pooled or selected keys) computes
# each token from its neighbours in the sequence, which a rank does not hold.
_LAYERS_STRIA_RUNS = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "mlp", "moe", "dense", "sparse"}
)


def _configs(config: Any, depth: int = 0) -> Iterator[Any]:
    """A model's config and the configs nested in it (a multimodal model's text config, ...)."""
    yield config
    if depth > 4:
        return
    for name in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, name, None)
        if isinstance(sub, PreTrainedConfig):
            yield from _configs(sub, depth + 1)


def check_model(model: torch.nn.Module, *, embeddings: bool = False) -> None:
    """Raises ValueError, naming the reason, if stria cannot run `model` exactly with each rank
    holding a shard of the sequence: a model that mixes tokens otherwise than by attention (Mamba,
    gated delta rule and other recurrent or convolutional layers, attention over compressed keys),
    which needs the tokens before each one; a model whose attention does not go through
    transformers' attention interface (it would attend within the rank's tokens); and one whose
    forward takes no position ids (it numbers positions from the rank's first token), or whose
    position embeddings count from another origin than shard_batch's (RoBERTa's). The first
    transformers model called with a ShardedBatch's model_inputs() on a thread is checked so; a
    model that passed is not checked again. `model` may be wrapped by torch.compile. With
    `embeddings` (a batch given as inputs_embeds) it also refuses a model that adds what its
    vision tower computes to its layers' states beside the embeddings (Qwen3-VL's deepstack
    features), which embeddings alone do not carry."""
    model = getattr(model, "_orig_mod", model)
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"check_model(): a transformers PreTrainedModel, not {type(model).__name__}")
    for config in _configs(model.config):
        others = sorted(set(getattr(config, "layer_types", None) or ()) - _LAYERS_STRIA_RUNS)
        if others:
            _refuse(
                f"{config.model_type} has layers of type {', '.join(others)}, which mix tokens otherwise than by the "
                "attention stria computes (recurrent or convolutional states, compressed or selected keys): each "
                "token needs its neighbours in the sequence, which a rank's shard does not hold"
            )
    for name, sub in model.named_modules():
        kind = type(sub)
        if isinstance(sub, torch.nn.Conv1d) and sub.kernel_size[0] > 1:
            _refuse(
                f"{name} ({kind.__name__} of width {sub.kernel_size[0]}) convolves along the sequence, which "
                "needs the tokens before each one: a rank's shard does not hold them"
            )
        # transformers' two signs that a model's attention layers call the attention interface: the
        # class's declaration, and (for classes that do without it) a look at its module's source.
        if isinstance(sub, PreTrainedModel) and not (
            getattr(kind, "_supports_attention_backend", False)
            or getattr(kind, "_can_set_attn_implementation", lambda: False)()
        ):
            _refuse(
                f"{kind.__name__} does not run its attention through transformers' attention interface, so on a "
                "shard its layers would attend within this rank's tokens only: stria cannot run it"
            )
        if isinstance(sub, torch.nn.Embedding) and "position" in name and sub.padding_idx is not None:
            _refuse(
                f"{name} counts positions from its padding index + 1 ({sub.padding_idx + 1}, RoBERTa's convention) "
                "and derives them from the ids, while shard_batch's position ids count from 0"
            )
    if embeddings:
        for config in _configs(model.config):
            if getattr(config, "deepstack_visual_indexes", None):
                _refuse(
                    f"{config.model_type} adds its vision tower's features to the states of layers "
                    f"{list(config.deepstack_visual_indexes)} at the image tokens, beside the embeddings, and "
                    "inputs_embeds do not carry them: the model would run without them"
                )
    if "position_ids" not in inspect.signature(type(model).forward).parameters:
        _refuse(
            f"{type(model).__name__} takes no position_ids: it numbers its tokens' positions itself, from the first "
            "token a rank holds instead of the token's place in the sequence"
        )


# The models check_model() passed, and the contexts whose first model was checked: each by whether
# the model was given embeddings (True) or ids (False).
_checked: dict[bool, weakref.WeakSet] = {False: weakref.WeakSet(), True: weakref.WeakSet()}
_checked_for: dict[bool, weakref.WeakSet] = {False: weakref.WeakSet(), True: weakref.WeakSet()}
_armed = threading.local()


def _check_next_model(context: Context, embeddings: bool = False) -> None:
    """Checks the next transformers model this thread calls, the first time a batch of `context` is
    given to a model (models that never call stria's attention cannot be caught there), and again
    the first time a batch comes as embeddings. Until then a hook on every module's call is armed,
    on this thread: the first module called is the model itself, or a wrapper (torch.compile's,
    data parallelism's, ...) whose first transformers model it is. Later batches arm nothing, so
    that no global hook stays in the way of torch.compile."""
    if context in _checked_for[embeddings] or getattr(_armed, "handle", None) is not None:
        return
    thread = threading.get_ident()

    def hook(module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != thread:
            return
        model = getattr(module, "_orig_mod", module)
        if not isinstance(model, PreTrainedModel):
            return
        handle.remove()
        _armed.handle = None
        if model not in _checked[embeddings]:
            check_model(model, embeddings=embeddings)  # raises on every rank alike: they run the same model
            _checked[embeddings].add(model)
        _checked_for[embeddings].add(context)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    _armed.handle = handle


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface on stria's ring: query ``[B, Hq, L, D]``, key and value
    ``[B, Hkv, L, D]`` of this rank's tokens; returns ``([B, L, Hq, D], None)``."""
    pending = getattr(_current, "pending", None)
    if pending is not None:  # a ShardedCache layer's update() came just before
        _current.pending = None
        if pending[1] is key:
            return _decode(pending[0], module, query, pending, attention_mask, scaling, sliding_window, softcap, s_aux)
        _refuse(
            "the model's cache holds states it transforms before attention (such as DeepSeek-V3's compressed "
            "latents), and a ShardedCache holds each layer's keys and values as attention takes them: generate "
            "with transformers' own cache"
        )
    sharding = kwargs.get(NAME) or getattr(_current, "sharding", None)
    if not isinstance(sharding, Sharding):
        _refuse(
            "no sharding for this call: pass a ShardedBatch's model_inputs() to the model (or call it inside "
            "stria.transformers.sharded(...))"
        )
    if attention_mask is not None:
        _refuse(
            "an attention mask tensor cannot be honoured (stria computes causal, document and window masks "
            "itself): pack sequences without padding and pass cu_seqlens to shard_batch"
        )
    if dropout and module.training:
        _refuse(f"attention dropout ({dropout}) in training is not supported: set the model's attention_dropout to 0")
    if kwargs.get("position_bias") is not None:
        _refuse("position biases cannot be honoured")
    if query.shape[2] != key.shape[2]:
        _refuse(
            f"{query.shape[2]} queries against {key.shape[2]} keys: a key/value cache (generation) or cross-attention "
            "is not supported; call the model with use_cache=False"
        )
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = None
    if sliding_window is not None:
        reach = int(sliding_window) - 1  # transformers' window of W: the W - 1 keys before a query and itself
        window = (reach, 0 if causal else reach)
    chunk = _chunk_size(module)
    documents = sharding.cu_seqlens if chunk is None else _chunk_boundaries(sharding, chunk, query.shape[0])
    query = _query_at_global_positions(module, query, sharding)
    out = stria_torch.scaled_dot_product_attention(
        query,
        key,
        value,
        is_causal=causal,
        scale=scaling,
        context=sharding.context,
        layout=sharding.layout,
        cu_seqlens=documents,
        window=window,
        plan=sharding.plan,
        softcap=softcap,
        sinks=s_aux,
    )
    return out.transpose(1, 2), None


def _chunk_size(module: torch.nn.Module) -> int | None:
    """The chunk of a chunked-attention layer (Llama 4's: a query sees the keys of its own chunk of
    that many positions only, chunks counted from its document's start), as the model's config
    names the layer's type; None for any other layer."""
    config = getattr(module, "config", None)
    layer = getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None)
    if layer is None or not types or not 0 <= layer < len(types) or types[layer] != "chunked_attention":
        return None
    size = getattr(config, "attention_chunk_size", None)
    if not size or int(size) < 1:
        _refuse(f"layer {layer} is a chunked-attention layer, but the config's attention_chunk_size is {size!r}")
    return int(size)


def _chunk_boundaries(sharding: Sharding, size: int, batch: int) -> torch.Tensor:
    """The documents of a chunked-attention layer: every document (the whole sequence without
    cu_seqlens) cut into chunks of `size` tokens from its start, as ``[B, n + 1]`` boundaries (rows
    with fewer chunks repeat the end): a document mask is then exactly the chunked mask."""
    if sharding.plan is not None:
        _refuse(
            "a chunked-attention layer (a query sees only its chunk of positions) cannot run on a document plan, "
            "whose placement is made from the documents alone: shard the batch by a layout (with cu_seqlens for "
            "packed documents)"
        )
    if sharding.seq_len is None:
        _refuse("a chunked-attention layer needs the batch's sequence length: shard the batch with shard_batch")
    key = (size, batch)
    found = sharding.chunks.get(key)
    if found is not None:
        return found
    seq = int(sharding.seq_len)
    rows = [[0, seq]] * batch if sharding.cu_seqlens is None else sharding.cu_seqlens.tolist()
    cut = []
    for row in rows:
        starts = [p for lo, hi in zip(row[:-1], row[1:]) for p in range(lo, hi, size)]
        cut.append(starts + [seq])
    width = max(len(r) for r in cut)
    found = torch.tensor([r + [seq] * (width - len(r)) for r in cut], dtype=torch.int64)
    sharding.chunks[key] = found
    return found


def _temperature(module: torch.nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """Llama 4's attention temperature of a query at each position (float32), as the model computes it."""
    steps = torch.floor((positions.to(torch.float32) + 1.0) / module.floor_scale)
    return torch.log1p(steps) * module.attn_scale + 1.0


def _query_at_global_positions(module: torch.nn.Module, query: torch.Tensor, sharding: Sharding) -> torch.Tensor:
    """The query as the model means it where the model scales it by its tokens' positions.

    Llama 4's layers without rotary embeddings scale each query by a temperature that grows with
    its position, computed from positions 0..L-1 of the tensor the layer holds. On a rank those are
    not the tokens' positions in the sequence: each query is rescaled from the temperature of its
    slot to that of its token (the same wherever both are below the model's floor_scale)."""
    if not getattr(module, "attn_temperature_tuning", False) or getattr(module, "use_rope", True):
        return query
    if sharding.positions is None:
        _refuse("Llama 4's attention temperature needs each token's position: shard the batch with shard_batch")
    slots = torch.arange(query.shape[2])
    ratio = _temperature(module, sharding.positions.clamp(min=0)) / _temperature(module, slots)  # [B, L]
    if bool((ratio == 1).all()):
        return query
    scaled = query.to(torch.float32) * ratio[:, None, :, None].to(query.device)
    return scaled.to(query.dtype)


class _ShardedLayer(CacheLayerMixin):
    """One layer's share of a ShardedCache: a stria.KVCache, made at the layer's first update (when
    the heads, head dim, dtype and device are known). update() stores nothing itself: it hands the new
    keys and values to the attention call that follows, which appends them as it decodes."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, ctx: Context, batch: int, capacity: int, layout: Layout) -> None:
        super().__init__()
        self.ctx, self.batch, self.capacity, self.layout = ctx, batch, capacity, layout
        self.kv: KVCache | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, heads, _, dim = key_states.shape
        if b != self.batch:
            raise ValueError(f"stria ShardedCache: made for a batch of {self.batch}, the model runs {b}")
        self.kv = KVCache(self.ctx, key_states, b, self.capacity, heads, dim, layout=self.layout)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        # [B, Hkv, T, D] as the attention layers give them; the cache takes [B, T, Hkv, D].
        _current.pending = (self, key_states, value_states)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0 if self.kv is None else int(self.kv.lens.max())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return self.ctx.world_size * self.capacity


class ShardedCache(Cache):
    """A transformers Cache whose every layer is spread over the ranks of a stria context: this rank
    holds ``capacity`` positions of each sequence per layer (the whole cache: world_size * capacity),
    placed by ``layout``. Pass it to ``generate`` (``cache=``; ``past_key_values=`` in older transformers) or a forward with
    ``use_cache=True``, on every rank with the same tokens, on a model whose ``attn_implementation``
    is ``"stria"``; every rank then gets the same logits. Sequences of a batch advance together (no
    padding: every sequence has the same length)."""

    def __init__(
        self, ctx: Context, config: Any, batch: int, capacity: int, layout: LayoutLike = Layout.STRIPED
    ) -> None:
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = [_ShardedLayer(ctx, int(batch), int(capacity), Layout.of(layout)) for _ in range(config.num_hidden_layers)]
        super().__init__(layers=layers)
        _check_next_model(ctx)  # the model it is given to, at its first forward


def _decode(
    layer: _ShardedLayer,
    module: torch.nn.Module,
    query: torch.Tensor,
    pending: tuple,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
    s_aux: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """The attention of a ShardedCache layer: the new tokens' queries against the sharded cache, the
    new keys and values appended by the ranks that hold their positions."""
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        _refuse("a padded batch cannot be decoded on a ShardedCache: give every sequence the same length")
    _, key, value = pending
    q = query.transpose(1, 2).contiguous()
    k_new, v_new = (x.transpose(1, 2).contiguous() for x in (key, value))
    window = -1 if sliding_window is None else int(sliding_window) - 1
    chunk = _chunk_size(module)
    assert layer.kv is not None
    if chunk is not None:
        # The new tokens at positions start..start + T - 1 each see their chunk's keys up to them:
        # plain causal attention while they are all in the first chunk, and for one token a window
        # reaching back to its chunk's start; several tokens past the first chunk see windows of
        # different reach, which one call cannot express.
        start, count = int(layer.kv.lens.max()), q.shape[1]
        if start + count > chunk:
            if count != 1:
                _refuse(
                    f"{count} new tokens at positions {start}.. on a chunked-attention layer (chunks of {chunk}) "
                    "reach past the first chunk: give them to the cache one at a time (or a prompt within the chunk)"
                )
            reach = start % chunk
            window = reach if window < 0 else min(window, reach)
    sinks = None if s_aux is None else s_aux.detach().float().contiguous()
    out = layer.kv.decode(
        q, k_new, v_new, softmax_scale=scaling, window_left=window, softcap=softcap, sinks=sinks
    )
    return out, None


def _mask_parts(function: Any, depth: int = 0) -> Iterator[Any]:
    """The mask functions a transformers mask function is made of (itself, and what its closures
    hold: and_masks and or_masks keep theirs in a tuple)."""
    yield function
    if depth > 8:
        return
    for cell in getattr(function, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for part in held if isinstance(held, (tuple, list)) else (held,):
            if callable(part) and not isinstance(part, (torch.Tensor, torch.nn.Module, type)):
                yield from _mask_parts(part, depth + 1)


def _mask(
    *args: Any, attention_mask: torch.Tensor | None = None, mask_function: Any = None, **kwargs: Any
) -> None:
    """transformers' mask interface: stria builds its masks itself, so none is made. What it would
    drop is refused instead: a padding mask with padding in it, and blocks of tokens that see each
    other both ways (a multimodal model's image tokens)."""
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        _refuse(
            "the attention_mask pads some tokens, which stria cannot honour: pack sequences without padding and "
            "pass cu_seqlens to shard_batch"
        )
    if any(getattr(part, "__qualname__", "").startswith("blockwise_overlay.") for part in _mask_parts(mask_function)):
        _refuse(
            "the model lets blocks of tokens (such as an image's) attend to each other both ways, which stria's "
            "causal, document and window masks cannot express"
        )
    return None


def register(name: str = NAME) -> None:
    """Registers the attention and its (empty) mask as ``attn_implementation=name``."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _mask)


register()
