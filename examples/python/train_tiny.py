#!/usr/bin/env python3
"""Trains a tiny causal transformer with stria ring attention across a local group.

The sequence of every batch is sharded across N ranks (threads of this process, one stria context
each) in a token layout; each rank embeds its own tokens at their global positions
(stria.positions), runs the model with stria.torch.scaled_dot_product_attention in place of
torch's, and back-propagates the loss of its own tokens. The ranks share one set of weights, so
their gradients add up in the parameters' .grad: the sum over ranks is the gradient of the loss
over the whole sequence. The main thread then takes the optimizer step.

The task: each sequence counts upward mod the vocabulary from a random start by a random stride,
so the next token follows from the two before it, which attention has to find.

    python examples/python/train_tiny.py --ranks 4 --steps 60
    python examples/python/train_tiny.py --steps 8 --check   # exits 1 unless the loss fell
    python examples/python/train_tiny.py --compile           # the model under torch.compile
    python examples/python/train_tiny.py --packed 4          # 4 documents packed per row

With --packed n every row packs n documents of random lengths, each its own counting sequence
with position ids from 0, and attention is masked to each document (cu_seqlens): what one
document says about the next is noise, and the mask keeps it out.

With --compile the model runs under torch.compile(fullgraph=True): stria's collectives are
torch custom operators, so the whole forward and backward, ring attention included, is one
compiled graph per rank (dynamo guards on each rank's context).
"""

from __future__ import annotations

import argparse
import sys
import time

import stria
import stria.torch as stria_torch
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(heads * self.head_dim, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, attention, cu_seqlens) -> torch.Tensor:
        b, length, _ = x.shape
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        q, k, v = self.qkv(self.norm1(x)).split(sizes, dim=-1)
        # SDPA's [B, H, L, D]: transposed views; stria takes them as they are.
        q, k, v = (t.view(b, length, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        x = x + self.proj(attention(q, k, v, cu_seqlens).transpose(1, 2).reshape(b, length, -1))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, max_len: int, d_model: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, kv_heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attention, cu_seqlens=None) -> torch.Tensor:
        """tokens [B, L] at position ids [L] (or [B, L]); attention(q, k, v, cu_seqlens) as torch's
        SDPA, masked to the documents cu_seqlens marks (None: one per row)."""
        pos = self.pos(positions)
        x = self.tok(tokens) + (pos[None] if positions.dim() == 1 else pos)
        for block in self.blocks:
            x = block(x, attention, cu_seqlens)
        return self.head(self.norm(x))


def make_batch(gen: torch.Generator, batch: int, seq: int, vocab: int):
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 5, (batch, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_packed_batch(gen: torch.Generator, batch: int, seq: int, vocab: int, docs: int):
    """Rows of `docs` counting sequences of random lengths each, their position ids (from 0 in
    every document) and the boundaries cu_seqlens [B, docs + 1]."""
    inputs, labels, ids, cu = [], [], [], []
    for _ in range(batch):
        cuts = torch.sort(torch.randint(0, seq + 1, (docs - 1,), generator=gen)).values.tolist()
        bounds = [0, *cuts, seq]
        row_in, row_out, row_ids = [], [], []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            x, y = make_batch(gen, 1, hi - lo, vocab)
            row_in.append(x[0])
            row_out.append(y[0])
            row_ids.append(torch.arange(hi - lo))
        inputs.append(torch.cat(row_in))
        labels.append(torch.cat(row_out))
        ids.append(torch.cat(row_ids))
        cu.append(bounds)
    return torch.stack(inputs), torch.stack(labels), torch.stack(ids), torch.tensor(cu)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the local group (threads)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layout", default="striped", choices=["contiguous", "striped", "zigzag"])
    parser.add_argument("--seq", type=int, default=64, help="global sequence length")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="exit 1 unless the loss fell")
    parser.add_argument("--compile", action="store_true", help="run the model under torch.compile(fullgraph=True)")
    parser.add_argument("--packed", type=int, default=0, metavar="N", help="pack N documents into every row")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    forward = torch.compile(model, fullgraph=True) if args.compile else model
    tokens_per_batch = args.batch * args.seq
    attentions = {}  # rank -> its attention function, made once (a compiled graph guards on it)

    def attention_of(ctx: stria.Context):
        if ctx.rank not in attentions:

            def attention(q, k, v, cu_seqlens):
                return stria_torch.scaled_dot_product_attention(
                    q, k, v, is_causal=True, context=ctx, layout=args.layout, cu_seqlens=cu_seqlens
                )

            attentions[ctx.rank] = attention
        return attentions[ctx.rank]

    def rank_step(ctx: stria.Context, inputs: torch.Tensor, labels: torch.Tensor, ids, cu_seqlens) -> float:
        # This rank's tokens and labels in the layout, and their position ids: their global
        # positions, or their places in their documents when the rows are packed.
        my_inputs = stria.shard(inputs, ctx.world_size, ctx.rank, layout=args.layout, seq_dim=1)
        my_labels = stria.shard(labels, ctx.world_size, ctx.rank, layout=args.layout, seq_dim=1)
        if ids is None:
            positions = torch.from_numpy(stria.positions(args.layout, args.seq, ctx.world_size, ctx.rank))
        else:
            positions = stria.shard(ids, ctx.world_size, ctx.rank, layout=args.layout, seq_dim=1)
        logits = forward(my_inputs, positions, attention_of(ctx), cu_seqlens)
        # This rank's share of the mean over the whole batch: the shares sum to the full loss.
        loss = (
            F.cross_entropy(logits.reshape(-1, args.vocab), my_labels.reshape(-1), reduction="sum") / tokens_per_batch
        )
        loss.backward()  # into the shared weights' .grad, added to the other ranks' gradients
        return loss.item()

    losses = []
    started = time.perf_counter()
    with stria.local_group(args.ranks, timeout_s=120) as group:
        for step in range(args.steps):
            ids = cu_seqlens = None
            if args.packed:
                inputs, labels, ids, cu_seqlens = make_packed_batch(gen, args.batch, args.seq, args.vocab, args.packed)
            else:
                inputs, labels = make_batch(gen, args.batch, args.seq, args.vocab)
            optimizer.zero_grad(set_to_none=True)
            each = [[x] * args.ranks for x in (inputs, labels, ids, cu_seqlens)]
            rank_losses = group.run(rank_step, *each)
            optimizer.step()
            losses.append(sum(rank_losses))
            print(
                f"step {step:3d}  loss {losses[-1]:.4f}  (ranks: {' '.join(f'{x:.3f}' for x in rank_losses)})",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    first, last = losses[0], sum(losses[-3:]) / len(losses[-3:])
    print(
        f"{args.ranks} ranks, {args.layout} layout{f', {args.packed} documents a row' if args.packed else ''}, "
        f"{args.steps} steps in {elapsed:.1f} s: "
        f"loss {first:.4f} -> {last:.4f} (mean of the last 3)"
    )
    if args.check and not last < 0.9 * first:
        print("FAILED: the loss did not fall by 10%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
