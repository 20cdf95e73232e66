#!/usr/bin/env python3
"""Fine-tunes a small HuggingFace transformers model with stria's ring attention.

The model (random weights, so that nothing is downloaded: a tiny Llama, Qwen2, Mistral, Gemma 2,
gpt-oss, Llama 4 or DeepSeek-V3) is made with attn_implementation="stria". Every rank takes its shard of each batch's
sequences (stria.transformers.shard_batch: token ids, position ids, next-token labels) and runs
the model on it; the attention layers run stria's ring over the ranks. Each rank's loss is its
share of the batch's mean, so the ranks' gradients sum to the gradient of the whole batch.

Two ways to run the ranks, with the same training loop:

    # threads of this process, one stria context each, sharing one model (their gradients
    # accumulate in it); the main thread takes the optimizer step
    python examples/python/train_transformers.py --ranks 4 --steps 6

    # one process per rank (torchrun): contexts from the process group, K/V blocks over UCX; the
    # gradients are summed over the group before each process takes the same step
    torchrun --nproc_per_node 4 examples/python/train_transformers.py --steps 6

--reference also trains a copy on one process with transformers' own attention over the whole
sequences and prints both losses side by side; --check exits 1 unless the two agree (and the loss
fell). --packed n packs n documents of random lengths into every sequence (cu_seqlens).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import stria
import stria.transformers as st
import torch
import transformers


def tiny_model(family: str, attn: str, seed: int) -> torch.nn.Module:
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, attention_dropout=0.0)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=16),
        "gemma2": lambda: transformers.Gemma2Config(**common, sliding_window=16, attn_logit_softcapping=30.0,
                                                    query_pre_attn_scalar=16),
        "gpt_oss": lambda: transformers.GptOssConfig(**common, sliding_window=16, num_local_experts=4,
                                                     num_experts_per_tok=2,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        # Chunked attention in chunks of 16 on the first layer, the second without rotary embeddings.
        "llama4": lambda: transformers.Llama4TextConfig(**common, attention_chunk_size=16, no_rope_layers=[1, 0],
                                                        num_local_experts=2, intermediate_size_mlp=128),
        # Multi-head latent attention: query and key heads of 24, value heads of 16.
        "deepseek_v3": lambda: transformers.DeepseekV3Config(
            vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
            n_group=1, topk_group=1, max_position_embeddings=256, attention_dropout=0.0),
    }
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(configs[family](), attn_implementation=attn)


def batches(steps: int, batch: int, seq: int, packed: int, vocab: int, seed: int):
    """Counting sequences (each document counts up mod the vocabulary from a random start by a
    random stride) and their document boundaries: the next token follows from the two before."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        cu = None
        if packed > 1:
            cuts = torch.randperm(seq - 1, generator=gen)[: packed - 1].add(1).sort().values
            cu = [0, *cuts.tolist(), seq]
        starts = cu or [0, seq]
        rows = []
        for _ in range(batch):
            row = []
            for lo, hi in zip(starts[:-1], starts[1:]):
                start = int(torch.randint(0, vocab, (1,), generator=gen))
                stride = int(torch.randint(1, 7, (1,), generator=gen))
                row += [(start + stride * i) % vocab for i in range(hi - lo)]
            rows.append(row)
        yield torch.tensor(rows), cu


def reference_losses(model, args) -> list[float]:
    """The same training on one process with transformers' own attention over whole sequences."""
    model = copy.deepcopy(model)
    model.set_attn_implementation("eager")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for ids, cu in batches(args.steps, args.batch, args.seq, args.packed, model.config.vocab_size, args.seed):
        if cu is None:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        else:  # each document alone, its tokens' losses weighted as in the packed batch
            total, count = 0.0, 0
            for lo, hi in zip(cu[:-1], cu[1:]):
                if hi - lo > 1:
                    doc = ids[:, lo:hi]
                    total = total + model(input_ids=doc, labels=doc, use_cache=False).loss * doc[:, 1:].numel()
                    count += doc[:, 1:].numel()
            loss = total / count
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_local(model, args) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    with stria.local_group(args.ranks, timeout_s=120) as group:
        for ids, cu in batches(args.steps, args.batch, args.seq, args.packed, model.config.vocab_size, args.seed):

            def rank_fn(ctx, ids=ids, cu=cu):
                batch = st.shard_batch(ctx, ids, ids, cu_seqlens=cu, layout=args.layout)
                loss = model(**batch.model_inputs()).loss
                loss.backward()  # into the shared model: the sum over the ranks
                return loss.item()

            opt.zero_grad()
            losses.append(sum(group.run(rank_fn)))
            opt.step()
    return losses


def train_distributed(model, args) -> list[float]:
    import torch.distributed as dist  # noqa: PLC0415 - torchrun only

    dist.init_process_group("gloo")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    with stria.torch.context_from_group(timeout_s=120) as ctx:
        for ids, cu in batches(args.steps, args.batch, args.seq, args.packed, model.config.vocab_size, args.seed):
            batch = st.shard_batch(ctx, ids, ids, cu_seqlens=cu, layout=args.layout)
            loss = model(**batch.model_inputs()).loss
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # every process's share of the gradient, summed
                if p.grad is not None:
                    dist.all_reduce(p.grad)
            total = loss.detach().clone()
            dist.all_reduce(total)
            opt.step()
            losses.append(total.item())
    dist.destroy_process_group()
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    families = ["llama", "qwen2", "mistral", "gemma2", "gpt_oss", "llama4", "deepseek_v3"]
    parser.add_argument("--family", default="llama", choices=families)
    parser.add_argument("--ranks", type=int, default=4, help="threads of a local group (without torchrun)")
    parser.add_argument("--layout", default="striped", choices=["striped", "zigzag", "contiguous"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--packed", type=int, default=0, help="documents per sequence (0: one)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", action="store_true", help="also train on one process with eager attention")
    parser.add_argument("--check", action="store_true", help="exit 1 unless stria matches the reference")
    args = parser.parse_args()

    model = tiny_model(args.family, "stria", args.seed)
    distributed = "WORLD_SIZE" in os.environ
    losses = train_distributed(model, args) if distributed else train_local(model, args)
    if distributed and int(os.environ.get("RANK", "0")) != 0:
        return 0
    want = reference_losses(tiny_model(args.family, "stria", args.seed), args) if args.reference or args.check else None
    ranks = os.environ.get("WORLD_SIZE", str(args.ranks))
    print(f"{args.family}, {ranks} ranks ({'processes' if distributed else 'threads'}), {args.layout}")
    for step, loss in enumerate(losses):
        line = f"step {step}: loss {loss:.6f}"
        if want is not None:
            line += f"   one process, eager attention: {want[step]:.6f}"
        print(line, flush=True)
    if args.check:
        agree = all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(losses, want))
        fell = losses[-1] < losses[0]
        if not (agree and fell):
            print(f"check failed: losses agree {agree}, loss fell {fell}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
