"""Generation with a KV cache sharded over the ranks (stria.transformers.ShardedCache): every model
family's tiny random model generates greedily on local groups of N ranks, and its tokens and logits
match transformers' own attention and cache on one process, on every rank."""

from __future__ import annotations

import os

import pytest
import stria
from conftest import TIMEOUT_S, torch_or_skip
from reference import rel_err

torch = torch_or_skip()
if os.environ.get("STRIA_REQUIRE_TRANSFORMERS") == "1":  # the test script installs it: missing is a failure
    import transformers
else:
    transformers = pytest.importorskip("transformers")
import stria.transformers as st  # noqa: E402 - needs torch and transformers

PROMPT, NEW = 10, 24


def tiny_model(family: str, attn: str):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, attention_dropout=0.0)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=8),
        "gemma2": lambda: transformers.Gemma2Config(**common, sliding_window=8, attn_logit_softcapping=30.0,
                                                    query_pre_attn_scalar=16),
        "gpt_oss": lambda: transformers.GptOssConfig(**common, sliding_window=8, num_local_experts=4,
                                                     num_experts_per_tok=2,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        # Chunks of 16 (the generation crosses two boundaries, one token at a time), the second
        # layer without rotary embeddings and its query temperature growing from position 4.
        "llama4": lambda: transformers.Llama4TextConfig(**common, attention_chunk_size=16, no_rope_layers=[1, 0],
                                                        num_local_experts=2, intermediate_size_mlp=128,
                                                        floor_scale=5, attn_scale=0.5),
        "gemma4": lambda: transformers.Gemma4TextConfig(**{**common, "head_dim": 256}, sliding_window=8,
                                                        global_head_dim=512),
        "deepseek_v3": lambda: transformers.DeepseekV3Config(  # value heads of 8 beside query and key heads of 16
            vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
            n_group=1, topk_group=1, max_position_embeddings=256),
    }
    torch.manual_seed(3)
    return transformers.AutoModelForCausalLM.from_config(configs[family](), attn_implementation=attn).eval()


def generate(model, prompt, **kwargs):
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt),
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2", "gpt_oss", "llama4"])
@pytest.mark.parametrize("n,layout", [(1, "striped"), (2, "contiguous"), (3, "zigzag"), (4, "striped")])
def test_generate_matches_one_process(family, n, layout):
    prompt = torch.randint(0, 96, (2, PROMPT), generator=torch.Generator().manual_seed(n))
    expected, expected_logits = generate(tiny_model(family, "eager"), prompt)
    model = tiny_model(family, "stria")
    capacity = -(-(PROMPT + NEW) // n) + 1
    capacity += capacity % 2

    def rank_fn(ctx):
        return generate(model, prompt, cache=st.ShardedCache(ctx, model.config, batch=2, capacity=capacity,
                                                             layout=layout))

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    for tokens, logits in results:
        assert torch.equal(tokens, expected)
        assert rel_err(logits.double().numpy(), expected_logits.double().numpy()) < 1e-5
        assert torch.equal(logits, results[0][1])  # the same bits on every rank


def test_gemma4_generates_at_its_head_dims():
    """Gemma 4's decode at heads of 256 (sliding-window layers) and 512 (full layers), on three ranks."""
    test_generate_matches_one_process("gemma4", 3, "zigzag")


@pytest.mark.parametrize("family,batch,prompt,match", [
    # a cache made for another batch than the model runs
    ("llama", 3, (2, 4), "made for a batch of 3"),
    # a chunked-attention layer's new tokens past the first chunk see windows of different reach,
    # which one decode call cannot give: refused with the reason, not computed as plain causal
    ("llama4", 1, (1, 20), "chunked-attention layer"),
    # DeepSeek-V3 caches its compressed latents and expands them into keys and values before each
    # attention call, which a ShardedCache (each layer's keys and values) cannot follow: a clear
    # error rather than one about a missing sharding
    ("deepseek_v3", 1, (1, 4), "compressed latents"),
], ids=["another_batch", "past_the_first_chunk", "compressed_latents"])
def test_sharded_cache_refuses_what_it_cannot_follow(family, batch, prompt, match):
    model = tiny_model(family, "stria")
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        cache = st.ShardedCache(group[0], model.config, batch=batch, capacity=64)
        with pytest.raises(ValueError, match=match):
            generate(model, torch.zeros(*prompt, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("family,match", [("bloom", "attention interface"), ("qwen3_next", "linear_attention")])
def test_a_sharded_cache_checks_the_model(family, match):
    """A family a sharded cache cannot serve exactly (attention of its own; recurrent layers, whose
    state a rank cannot hold for tokens it does not have) is refused at its first forward."""
    config = transformers.AutoConfig.for_model(
        family, vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="stria").eval()
    with stria.local_group(1, timeout_s=TIMEOUT_S) as group:
        cache = st.ShardedCache(group[0], model.config, batch=1, capacity=64)
        with pytest.raises(ValueError, match=match):
            generate(model, torch.zeros(1, 4, dtype=torch.long), cache=cache)
