#!/usr/bin/env python3
"""Greedy generation with a HuggingFace transformers model whose KV cache is sharded over ranks.

The model (random weights, so that nothing is downloaded: a tiny Llama, Qwen2, Mistral, Gemma 2 or
gpt-oss) is made with attn_implementation="stria". Every rank of a local group (a thread of this
process with its own stria context) runs transformers' own generate() on the same prompt with a
stria.transformers.ShardedCache: each rank keeps its share of every layer's keys and values (striped
by position by default: position t on rank t mod N), and each attention layer is one
stria_attention_decode call, whose result, merged over the ranks, is the same on every rank.

    python examples/python/generate_sharded_cache.py --ranks 4 --family llama --new-tokens 32

--check generates the same tokens with transformers' own attention and cache on one process too and
exits 1 unless both give exactly the same tokens (and every rank the same).
"""

from __future__ import annotations

import argparse
import sys

import stria
import stria.transformers as st
import torch
import transformers


def tiny_model(family: str, attn: str, seed: int) -> torch.nn.Module:
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=512, attention_dropout=0.0)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=16),
        "gemma2": lambda: transformers.Gemma2Config(**common, sliding_window=16, attn_logit_softcapping=30.0,
                                                    query_pre_attn_scalar=16),
        "gpt_oss": lambda: transformers.GptOssConfig(**common, sliding_window=16, num_local_experts=4,
                                                     num_experts_per_tok=2,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    }
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs[family](), attn_implementation=attn)
    return model.eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "mistral", "gemma2", "gpt_oss"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=12, help="prompt tokens per sequence")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layout", default="striped", choices=["striped", "contiguous", "zigzag"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="compare with transformers' own generate on one process")
    args = parser.parse_args()

    model = tiny_model(args.family, "stria", args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), generator=gen)
    total = args.prompt + args.new_tokens
    capacity = -(-total // args.ranks) + 1  # slots per rank: the whole cache holds the prompt and every new token
    if args.layout == "zigzag":
        capacity += capacity % 2
    torch.set_num_threads(1)  # the ranks' threads share this machine's cores

    def rank_fn(ctx: stria.Context) -> torch.Tensor:
        cache = st.ShardedCache(ctx, model.config, batch=args.batch, capacity=capacity, layout=args.layout)
        with torch.no_grad():
            return model.generate(prompt, cache=cache, max_new_tokens=args.new_tokens, do_sample=False,
                                  attention_mask=torch.ones_like(prompt), pad_token_id=0)

    with stria.local_group(args.ranks) as group:
        tokens = group.run(rank_fn)
    print(f"{args.family}, {args.ranks} ranks, {args.layout} cache of {args.ranks} x {capacity} slots per layer")
    for b in range(args.batch):
        print(f"  sequence {b}: prompt {prompt[b].tolist()}")
        print(f"              stria  {tokens[0][b, args.prompt:].tolist()}")
    same_ranks = all(torch.equal(t, tokens[0]) for t in tokens)
    print(f"every rank generated the same tokens: {same_ranks}")
    if not args.check:
        return 0 if same_ranks else 1

    reference = tiny_model(args.family, "eager", args.seed)
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False,
                                      attention_mask=torch.ones_like(prompt), pad_token_id=0)
    for b in range(args.batch):
        print(f"  sequence {b}: eager  {expected[b, args.prompt:].tolist()}")
    same = torch.equal(tokens[0], expected)
    print(f"the same tokens as transformers' own generate on one process: {same}")
    return 0 if same and same_ranks else 1


if __name__ == "__main__":
    sys.exit(main())
