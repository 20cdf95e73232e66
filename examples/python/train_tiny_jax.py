#!/usr/bin/env python3
"""Trains a tiny causal transformer in JAX with stria ring attention under jax.shard_map.

The sequence axis of every batch is split over N JAX devices (here CPU devices: XLA's forced host
device count), device r holding the tokens of ring rank r in a token layout (stria.positions).
One jitted SPMD step runs the model with stria.jax.ring_attention in place of dense attention,
on a whole stria.LocalGroup (rank r computes device r's shard), and JAX sums the weights'
gradients over the devices. Before training, the ring's loss is checked against the same model
with dense attention over the whole sequence.

The task: each sequence counts upward mod the vocabulary from a random start by a random stride,
so the next token follows from the two before it, which attention has to find.

With --packed n every row packs n such sequences of random lengths (documents), each with position
ids from 0, and attention is masked to each document: the boundaries (cu_seqlens) are an argument
of the jitted step, replicated to every device, so new documents each batch do not retrace it.

    python examples/python/train_tiny_jax.py --devices 4 --steps 60
    python examples/python/train_tiny_jax.py --steps 12 --check   # exits 1 unless the loss fell
    python examples/python/train_tiny_jax.py --packed 4           # 4 documents packed per row
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4, help="ring ranks = JAX CPU devices")
    p.add_argument("--layout", default="striped", choices=["striped", "zigzag", "contiguous"])
    p.add_argument("--seq", type=int, default=64, help="global sequence length")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--packed", type=int, default=0, metavar="N", help="pack N documents into every row")
    p.add_argument("--check", action="store_true", help="exit 1 unless the loss fell by a quarter")
    return p.parse_args()


args = parse_args()
# Before JAX starts: N CPU devices in this process, one per ring rank.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import stria  # noqa: E402
import stria.jax as stria_jax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # JAX before 0.7
    from jax.experimental.shard_map import shard_map

D_MODEL, HEADS, KV_HEADS, LAYERS = 64, 4, 2, 2
HEAD_DIM = D_MODEL // HEADS


def init_params(key: jax.Array, vocab: int, max_len: int) -> dict:
    keys = iter(jax.random.split(key, 4 + 4 * LAYERS))

    def dense(n_in: int, n_out: int) -> jax.Array:
        return jax.random.normal(next(keys), (n_in, n_out)) / np.sqrt(n_in)

    blocks = [
        {
            "qkv": dense(D_MODEL, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
            "proj": dense(HEADS * HEAD_DIM, D_MODEL),
            "up": dense(D_MODEL, 4 * D_MODEL),
            "down": dense(4 * D_MODEL, D_MODEL),
        }
        for _ in range(LAYERS)
    ]
    return {
        "tok": jax.random.normal(next(keys), (vocab, D_MODEL)) * 0.1,
        "pos": jax.random.normal(next(keys), (max_len, D_MODEL)) * 0.1,
        "head": dense(D_MODEL, vocab),
        "blocks": blocks,
    }


def norm(x: jax.Array) -> jax.Array:
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def model(params: dict, tokens: jax.Array, positions: jax.Array, attention) -> jax.Array:
    """Logits [B, L, vocab] of tokens [B, L] at position ids [B, L]; attention(q, k, v) takes and
    returns stria's [B, L, H, D]."""
    x = params["tok"][tokens] + params["pos"][positions]
    b, length, _ = x.shape
    for blk in params["blocks"]:
        q, k, v = jnp.split(norm(x) @ blk["qkv"], [HEADS * HEAD_DIM, (HEADS + KV_HEADS) * HEAD_DIM], axis=-1)
        q, k, v = (t.reshape(b, length, -1, HEAD_DIM) for t in (q, k, v))
        x = x + attention(q, k, v).reshape(b, length, -1) @ blk["proj"]
        x = x + jax.nn.gelu(norm(x) @ blk["up"]) @ blk["down"]
    return norm(x) @ params["head"]


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, documents: jax.Array) -> jax.Array:
    """Causal attention over a whole sequence in global order, within each token's document
    (documents [B, S]: the document of every token): the check's reference."""
    k, v = (jnp.repeat(t, HEADS // KV_HEADS, axis=2) for t in (k, v))
    s = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM)
    visible = jnp.tril(jnp.ones(s.shape[-2:], bool)) & (documents[:, :, None] == documents[:, None, :])
    s = jnp.where(visible[:, None], s, -jnp.inf)
    return jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(s, axis=-1), v)


def token_losses(params, tokens, labels, weights, positions, attention):
    logp = jax.nn.log_softmax(model(params, tokens, positions, attention))
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0] * weights


def counting(rng: np.random.Generator, n: int, seq: int, vocab: int) -> np.ndarray:
    start = rng.integers(0, vocab, (n, 1))
    stride = rng.integers(1, 4, (n, 1))
    return (start + stride * np.arange(seq + 1)) % vocab  # seq + 1: the last label too


def batch(rng: np.random.Generator, n: int, seq: int, vocab: int, docs: int):
    """Tokens and labels [n, seq], position ids [n, seq] and document boundaries cu_seqlens
    [n, docs + 1] (global positions): with docs 0 one counting sequence a row ([0, seq]), else
    `docs` of random lengths, each labelled within itself and numbered from 0."""
    if docs == 0:
        data = counting(rng, n, seq, vocab)
        return data[:, :-1], data[:, 1:], np.broadcast_to(np.arange(seq), (n, seq)), np.array([[0, seq]] * n)
    tokens, labels, ids = (np.zeros((n, seq), np.int64) for _ in range(3))
    cu = []
    for row in range(n):
        bounds = [0, *sorted(rng.integers(0, seq + 1, docs - 1)), seq]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            data = counting(rng, 1, hi - lo, vocab)[0]
            tokens[row, lo:hi], labels[row, lo:hi], ids[row, lo:hi] = data[:-1], data[1:], np.arange(hi - lo)
        cu.append(bounds)
    return tokens, labels, ids, np.array(cu)


def main() -> int:
    n, seq = args.devices, args.seq
    mesh = Mesh(np.array(jax.devices()[:n]), ("ring",))
    # Device r's chunk of the sequence axis: rank r's tokens, in the layout's order.
    order = np.concatenate([stria.positions(args.layout, seq, n, r) for r in range(n)])
    rng = np.random.default_rng(0)
    params = init_params(jax.random.PRNGKey(0), args.vocab, seq)
    weights = jnp.ones((args.batch, seq))

    def data_of(rng: np.random.Generator) -> tuple:
        return tuple(jnp.asarray(x) for x in batch(rng, args.batch, seq, args.vocab, args.packed))

    with stria.local_group(n, num_threads=1, timeout_s=60) as group:

        def shard_loss(params, tokens, labels, weights, positions, cu_seqlens):
            def ring_attention(q, k, v):
                cu = cu_seqlens if args.packed else None  # without documents, the plain call
                return stria_jax.ring_attention(q, k, v, group, layout=args.layout, causal=True, cu_seqlens=cu)

            total = token_losses(params, tokens, labels, weights, positions, ring_attention).sum()
            return jax.lax.psum(total, "ring")

        seq_spec = P(None, "ring")
        ring_loss = shard_map(
            shard_loss, mesh=mesh, in_specs=(P(), seq_spec, seq_spec, seq_spec, seq_spec, P()), out_specs=P()
        )

        def loss(params, data):
            tokens, labels, positions, cu_seqlens = data
            shards = (x[:, order] for x in (tokens, labels, weights, positions))
            return ring_loss(params, *shards, cu_seqlens) / weights.sum()

        def dense_loss(params, data):
            tokens, labels, positions, cu_seqlens = data
            documents = jax.vmap(lambda cu: jnp.searchsorted(cu, jnp.arange(seq), side="right"))(cu_seqlens)

            def attention(q, k, v):
                return dense_attention(q, k, v, documents)

            return token_losses(params, tokens, labels, weights, positions, attention).sum() / weights.sum()

        data = data_of(rng)
        ring0, dense0 = float(jax.jit(loss)(params, data)), float(jax.jit(dense_loss)(params, data))
        packed = f", {args.packed} documents a row" if args.packed else ""
        print(f"{n} ranks, {args.layout} layout{packed}: ring loss {ring0:.6f}, dense attention {dense0:.6f}")
        if abs(ring0 - dense0) > 1e-4 * abs(dense0):
            print("the ring's loss differs from dense attention's")
            return 1

        @jax.jit
        def step(params, m, v, t, data):
            value, grads = jax.value_and_grad(loss)(params, data)
            m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
            v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
            scale = jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            params = jax.tree.map(lambda p, a, b: p - args.lr * scale * a / (jnp.sqrt(b) + 1e-8), params, m, v)
            return params, m, v, value

        m = jax.tree.map(jnp.zeros_like, params)
        v = jax.tree.map(jnp.zeros_like, params)
        losses, started = [], time.time()
        for t in range(1, args.steps + 1):
            params, m, v, value = step(params, m, v, t, data_of(rng))
            losses.append(float(value))
            print(f"step {t:3d}  loss {losses[-1]:.4f}")
    first, last = losses[0], float(np.mean(losses[-3:]))
    print(f"{args.steps} steps in {time.time() - started:.1f} s: loss {first:.4f} -> {last:.4f} (mean of the last 3)")
    if args.check and not last < 0.75 * first:
        print("the loss did not fall by a quarter")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
