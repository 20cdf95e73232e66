#!/usr/bin/env python3
"""Trains the tiny transformer of train_tiny.py on packed documents, each batch on a document plan.

Real training data packs documents of long-tailed lengths into every row. For each batch this
builds a stria.Plan from the rows' document boundaries: every rank holds the tokens the plan gives
it (plan.shard), embeds them at their positions within their documents, and predicts the labels
the plan shards alongside; its padding slots (position -1) carry no loss. Ring attention runs on
the plan (stria.torch.scaled_dot_product_attention(..., plan=plan)), masked to each document.

    python examples/python/train_packed.py --ranks 4 --steps 40
    python examples/python/train_packed.py --steps 12 --check     # exits 1 unless the loss fell

The documents are counting sequences (as in train_tiny.py) with lognormal lengths: many short,
a few long, so that some are kept whole on one rank and others are cut into tiles across ranks.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import stria
import stria.torch as stria_torch
import torch
from torch.nn import functional as F
from train_tiny import TinyTransformer, make_batch


def make_packed_rows(gen: np.random.Generator, batch: int, seq: int, vocab: int, median: float):
    """Rows of counting documents with lognormal lengths (median `median`, cut at the row's end):
    inputs and labels [B, S], position ids within each document [B, S], and the boundaries
    [B, n + 1] (rows with fewer documents repeat S)."""
    rows, bounds = [], []
    for _ in range(batch):
        cuts = [0]
        while cuts[-1] < seq:
            cuts.append(min(seq, cuts[-1] + max(1, int(round(gen.lognormal(np.log(median), 1.0))))))
        bounds.append(cuts)
        pieces = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            x, y = make_batch(torch.Generator().manual_seed(int(gen.integers(1 << 31))), 1, hi - lo, vocab)
            pieces.append((x[0], y[0], torch.arange(hi - lo)))
        rows.append([torch.cat(p) for p in zip(*pieces)])
    width = max(len(b) for b in bounds)
    cu = np.array([b + [seq] * (width - len(b)) for b in bounds], dtype=np.int64)
    inputs, labels, ids = (torch.stack(x) for x in zip(*rows))
    return inputs, labels, ids, cu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3, help="ranks of the local group (threads)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seq", type=int, default=250, help="tokens per row (any length: plans pad)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--median", type=float, default=24.0, help="median document length")
    parser.add_argument("--tile", type=int, default=16, help="the plan's tile (the kernels' is 64 or 128)")
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="exit 1 unless the loss fell")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = np.random.default_rng(args.seed)
    model = TinyTransformer(args.vocab, args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def rank_step(ctx: stria.Context, plan: stria.Plan, inputs, labels, ids) -> tuple[float, int]:
        # This rank's tokens, labels and position ids by the plan; padding slots get no loss.
        pad = torch.from_numpy(plan.positions(ctx.rank) < 0)
        my_inputs, my_ids = plan.shard(inputs, ctx.rank), plan.shard(ids, ctx.rank)
        my_labels = plan.shard(labels, ctx.rank).masked_fill(pad, -100)

        def attention(q, k, v, _cu_seqlens):
            return stria_torch.scaled_dot_product_attention(q, k, v, is_causal=True, context=ctx, plan=plan)

        logits = model(my_inputs, my_ids, attention)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), my_labels.reshape(-1), reduction="sum")
        (loss / inputs.numel()).backward()  # this rank's share of the batch's mean
        return loss.item(), int((~pad).sum())

    losses = []
    started = time.perf_counter()
    with stria.local_group(args.ranks, timeout_s=120) as group:
        for step in range(args.steps):
            inputs, labels, ids, cu = make_packed_rows(gen, args.batch, args.seq, args.vocab, args.median)
            with stria.Plan(cu, args.ranks, tile=args.tile) as plan:
                optimizer.zero_grad(set_to_none=True)
                each = [[x] * args.ranks for x in (plan, inputs, labels, ids)]
                results = group.run(rank_step, *each)
                optimizer.step()
            tokens = sum(n for _, n in results)
            assert tokens == inputs.numel(), "every token is on exactly one rank"
            losses.append(sum(x for x, _ in results) / tokens)
            print(f"step {step:3d}  loss {losses[-1]:.4f}  ({cu.shape[1] - 1} documents a row at most, "
                  f"{plan.local_len} slots a rank)", flush=True)
    elapsed = time.perf_counter() - started
    first, last = losses[0], sum(losses[-3:]) / len(losses[-3:])
    print(f"{args.ranks} ranks, plans per batch, {args.steps} steps in {elapsed:.1f} s: "
          f"loss {first:.4f} -> {last:.4f} (mean of the last 3)")
    if args.check and not last < 0.9 * first:
        print("FAILED: the loss did not fall by 10%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
