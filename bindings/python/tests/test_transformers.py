"""stria.transformers: tiny random models of the families users fine-tune (Llama, Qwen2, Mistral
with a sliding window, Gemma 2 with logit softcapping and alternating windows, gpt-oss with
attention sinks, Llama 4 with chunked attention and position-dependent query temperatures,
DeepSeek-V3's latent attention with value heads narrower than its query and key heads, Gemma 4
with heads of 256 and 512, Qwen2-VL and Qwen2.5-VL with an image and M-RoPE) run with
attn_implementation="stria" on local groups of CPU ranks, each on its shard of the batch, against
the same model with transformers' own eager attention on the whole sequence in float64: the
logits, the loss (the sum of the ranks' shares) and every parameter's gradient (the sum of the
ranks' contributions)."""

from __future__ import annotations

import copy
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

VOCAB, SEQ, BATCH = 64, 24, 2


def tiny_config(family: str):
    """A model of two layers, 4 query heads of 8 dims sharing 2 K/V heads, random weights."""
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attention_dropout=0.0,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=6)
    if family == "gemma2":
        return transformers.Gemma2Config(**common, sliding_window=5, attn_logit_softcapping=3.0,
                                         final_logit_softcapping=20.0, query_pre_attn_scalar=8)
    if family == "gpt_oss":
        rope = {"rope_type": "default", "rope_theta": 10000.0}  # the default's YaRN wants longer contexts
        return transformers.GptOssConfig(**common, sliding_window=5, num_local_experts=4, num_experts_per_tok=2,
                                         rope_parameters=rope)
    if family == "llama4":  # chunks of 7; the second layer without rotary embeddings, its temperature from 4 on
        return transformers.Llama4TextConfig(**common, attention_chunk_size=7, no_rope_layers=[1, 0],
                                             num_local_experts=2, intermediate_size_mlp=48, floor_scale=5,
                                             attn_scale=0.5)
    if family == "gemma4":  # its real head dims: 256 on the sliding layers, 512 on the full ones
        return transformers.Gemma4TextConfig(**{**common, "head_dim": 256}, sliding_window=5, global_head_dim=512)
    if family == "deepseek_v3":  # multi-head latent attention: query and key heads of 16, value heads of 8
        return transformers.DeepseekV3Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
            n_group=1, topk_group=1, max_position_embeddings=64, attention_dropout=0.0)
    raise ValueError(family)


def make_model(family: str, attn: str):
    torch.manual_seed(3)
    # The experts as plain loops: the grouped matrix products have no float64, which the reference runs in.
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation=attn,
                                                          experts_implementation="eager")
    if family == "gpt_oss":  # the sinks start at 0 otherwise: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.uniform_(-1.0, 2.0)
    return model


def reference(model, input_ids):
    """logits, loss and gradients of the whole batch with eager attention, in float64."""
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("eager")
    out = ref(input_ids=input_ids, labels=input_ids.clone(), use_cache=False)
    out.loss.backward()
    return out.logits.detach(), out.loss.item(), {n: p.grad for n, p in ref.named_parameters()}


def run_sharded(model, input_ids, n, layout="striped", plan=None, cu_seqlens=None, ulysses=1):
    """Each rank of a local group of n runs the shared model on its shard; returns the full logits
    (unsharded), the sum of the losses and the accumulated gradients. ulysses > 1: the group as a
    grid of all-to-all groups of that many ranks (its plan made for the ring of groups)."""
    model.zero_grad(set_to_none=True)
    logits = torch.full((BATCH, SEQ, VOCAB), float("nan"), dtype=torch.float64)

    def rank_fn(ctx):
        batch = st.shard_batch(ctx, input_ids, input_ids, layout=layout, plan=plan, cu_seqlens=cu_seqlens)
        out = model(**batch.model_inputs())
        out.loss.backward()
        if plan is not None:
            where = torch.from_numpy(plan.positions(ctx.rank, ulysses=ulysses).copy())
            for b in range(BATCH):
                keep = where[b] >= 0
                logits[b, where[b][keep]] = out.logits[b][keep].detach().double()
        else:
            pos = torch.from_numpy(stria.positions(layout, SEQ, n, ctx.rank, ulysses=ulysses))
            logits[:, pos] = out.logits.detach().double()
        return out.loss.item()

    with stria.local_group(n, timeout_s=TIMEOUT_S, ulysses=ulysses) as group:
        losses = group.run(rank_fn)
    return logits, sum(losses), {name: p.grad for name, p in model.named_parameters()}


def check(got, want, tol):
    logits, loss, grads = got
    ref_logits, ref_loss, ref_grads = want
    assert rel_err(logits.numpy(), ref_logits.numpy()) < tol
    assert loss == pytest.approx(ref_loss, rel=tol)
    for name, g in ref_grads.items():
        assert grads[name] is not None, name
        assert rel_err(grads[name].double().numpy(), g.numpy()) < tol, name


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2", "gpt_oss", "llama4", "deepseek_v3"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
def test_model_matches_eager_attention(family, n, layout):
    model = make_model(family, "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(n))
    want = reference(model, input_ids)
    check(run_sharded(model, input_ids, n, layout), want, 2e-5)


@pytest.mark.parametrize("n,layout", [(2, "zigzag"), (3, "striped")])
def test_gemma4_heads_of_256_and_512(n, layout):
    """Gemma 4 at its own head dims: 256 on the sliding-window layers, 512 on the full ones. Float32
    itself is 3e-5 off float64 there (transformers' eager attention, on the key norms' gradients),
    so the bar is the integration's 1e-4."""
    model = make_model("gemma4", "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(n))
    want = reference(model, input_ids)
    check(run_sharded(model, input_ids, n, layout), want, 1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("on_plan", [False, True], ids=["zigzag", "plan"])
def test_model_on_a_grid_matches_eager_attention(family, on_plan):
    """A local group of 4 as all-to-all groups of 2 in a ring of 2 (GQA heads split over each group;
    Gemma 2's softcap and window, gpt-oss's sinks), by the layout or on a document plan made for
    the ring of groups."""
    model = make_model(family, "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
    want = reference(model, input_ids)
    plan = None
    if on_plan:  # one document per row: the plan's slots of each ring rank, in two pieces
        plan = stria.Plan([[0, SEQ]] * BATCH, 2, seq_len=SEQ, tile=4)
        if plan.local_len % 2:
            plan = stria.Plan([[0, SEQ]] * BATCH, 2, seq_len=SEQ, tile=4, local_len=plan.local_len + 1)
    check(run_sharded(model, input_ids, 4, "zigzag", plan=plan, ulysses=2), want, 2e-5)


@pytest.mark.parametrize("on_plan", [False, True], ids=["striped", "plan"])
def test_packed_documents_match_separate_sequences(on_plan):
    """Documents packed into one row (cu_seqlens; by the layout, or on a document plan whose
    padding slots attend to nothing) give each document's tokens the logits that document alone
    gets, position ids restarting at each document."""
    model = make_model("llama", "stria")
    cu = [0, 5, 13, 24]
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(9))
    plan = stria.Plan([cu] * BATCH, 3, seq_len=SEQ, tile=4) if on_plan else None
    logits, _, _ = run_sharded(model, input_ids, 3, cu_seqlens=cu, plan=plan)
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("eager")
    for lo, hi in zip(cu[:-1], cu[1:]):
        alone = ref(input_ids=input_ids[:, lo:hi], use_cache=False).logits
        assert rel_err(logits[:, lo:hi].numpy(), alone.detach().numpy()) < 2e-5


@pytest.mark.parametrize("n,layout", [(2, "zigzag"), (3, "striped")])
def test_chunked_attention_on_packed_documents(n, layout):
    """Llama 4 on packed documents: its chunks restart at each document, and its query temperatures
    follow the tokens' places in the packed row, as transformers' eager attention computes them on
    the packed row itself (position ids restarting at each document)."""
    model = make_model("llama4", "stria")
    cu = [0, 5, 13, 24]  # chunks of 7: [0, 5) | [5, 12) [12, 13) | [13, 20) [20, 24)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    starts = torch.tensor([lo for lo, hi in zip(cu[:-1], cu[1:]) for _ in range(lo, hi)])
    position_ids = (torch.arange(SEQ) - starts).expand(BATCH, SEQ)
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("eager")
    want = ref(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.detach()
    logits, _, _ = run_sharded(model, input_ids, n, layout, cu_seqlens=cu)
    assert rel_err(logits.numpy(), want.numpy()) < 2e-5


def test_chunked_attention_on_a_plan_is_refused():
    model = make_model("llama4", "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(6))
    plan = stria.Plan([[0, 11, SEQ]] * BATCH, 2, seq_len=SEQ, tile=4)
    with pytest.raises(ValueError, match="chunked-attention layer .* document plan"):
        run_sharded(model, input_ids, 2, plan=plan)


def test_the_mask_interface_refuses_blocks_that_see_each_other_both_ways():
    """transformers' masks as the interface gets them: causal, windowed, chunked and packed ones are
    stria's to build (none is made); one that lets a block of tokens (an image's) see itself both
    ways is refused rather than computed as causal."""
    mu = pytest.importorskip("transformers.masking_utils")
    interface = mu.ALL_MASK_ATTENTION_FUNCTIONS[st.NAME]
    packed = torch.tensor([[0, 0, 1, 1]])
    honoured = [
        mu.causal_mask_function,
        mu.sliding_window_causal_mask_function(3),
        mu.chunked_causal_mask_function(2, torch.zeros(1, dtype=torch.long)),
        mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(packed)),
    ]
    for function in honoured:
        assert interface(batch_size=1, q_length=4, kv_length=4, mask_function=function) is None
    blocks = mu.blockwise_overlay(torch.tensor([[-1, 0, 0, -1]]))
    overlaid = mu.or_masks(mu.causal_mask_function, blocks)
    for function in (overlaid, mu.and_masks(overlaid, mu.packed_sequence_mask_function(packed))):
        with pytest.raises(ValueError, match="both ways"):
            interface(batch_size=1, q_length=4, kv_length=4, mask_function=function)


def test_what_cannot_be_honoured_is_refused():
    model = make_model("llama", "stria")
    input_ids = torch.randint(0, VOCAB, (1, 8))
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        batch = st.shard_batch(ctx, input_ids, input_ids)
        padded = torch.ones(1, 8, dtype=torch.long)
        padded[0, :2] = 0
        with pytest.raises(ValueError, match="pads some tokens"):
            model(**batch.model_inputs(), attention_mask=padded)
        with pytest.raises(ValueError, match="no sharding"):
            model(input_ids=input_ids, use_cache=False)
        model.train()
        model.config.attention_dropout = 0.1
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.1
        with pytest.raises(ValueError, match="dropout"):
            model(**batch.model_inputs())


# Families stria cannot run on shards, each with the reason it must name: attention computed outside
# transformers' attention interface (Bloom's ALiBi), positions numbered by the model from the rank's
# first token (BART's decoder) or from another origin (RoBERTa's), recurrent and convolutional
# mixers (Mamba; Qwen3-Next's gated delta rule; MiniMax's lightning attention; Falcon-H1's parallel
# Mamba heads), attention over compressed keys (DeepSeek-V4). Each ran silently wrong before the
# model check.
CANNOT_RUN = {
    "bloom": ("attention interface", {}),
    "bart": ("takes no position_ids", {}),
    "camembert": ("padding index \\+ 1", {}),
    "mamba": ("linear_attention", {}),
    "qwen3_next": ("linear_attention", {}),
    "minimax": ("linear_attention", {}),
    "falcon_h1": ("hybrid", {}),
    "deepseek_v4": ("compressed_sparse_attention", {"layer_types": ["compressed_sparse_attention"] * 2}),
}


@pytest.mark.parametrize("family", sorted(CANNOT_RUN))
def test_models_stria_cannot_run_on_shards_are_refused(family):
    """The first call of such a model with a sharded batch raises on every rank, naming the reason,
    before it computes anything; the contexts stay usable: a model stria runs, given the next batch,
    matches the reference (and is checked once: no hook stays armed)."""
    reason, extra = CANNOT_RUN[family]
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(3)
    config = transformers.AutoConfig.for_model(family, **common, **extra)
    refused = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="stria").eval()
    good = make_model("llama", "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    want = reference(good, input_ids)
    logits = torch.full((BATCH, SEQ, VOCAB), float("nan"), dtype=torch.float64)
    hooks = torch.nn.modules.module._global_forward_pre_hooks

    def rank_fn(ctx):
        with pytest.raises(ValueError, match=reason):
            refused(**st.shard_batch(ctx, input_ids).model_inputs())
        assert not hooks  # the check disarmed before it raised
        for _ in range(2):
            batch = st.shard_batch(ctx, input_ids, input_ids)
            out = good(**batch.model_inputs())
        assert not hooks
        logits[:, torch.from_numpy(stria.positions("striped", SEQ, 2, ctx.rank))] = out.logits.detach().double()

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        group.run(rank_fn)
    assert rel_err(logits.numpy(), want[0].numpy()) < 1e-5
    st.check_model(good)
    st.check_model(torch.compile(good))  # torch.compile's wrapper: the model inside it
    with pytest.raises(TypeError, match="PreTrainedModel"):
        st.check_model(torch.nn.Linear(2, 2))


def test_a_convolution_along_the_sequence_is_refused():
    """A model whose config names only attention layers, with a short convolution over the sequence
    in a layer (as hybrid families put beside their attention): the check finds the module."""
    model = make_model("llama", "stria")
    st.check_model(model)
    model.model.layers[1].mixer = torch.nn.Conv1d(32, 32, 4, groups=32)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mixer \(Conv1d of width 4\) convolves"):
        st.check_model(model)
    model.model.layers[1].mixer = torch.nn.Conv1d(32, 32, 1)  # of width 1: a position-wise product
    st.check_model(model)


def tiny_vision_language_model(family: str):
    """A Qwen2-VL (or Qwen2.5-VL) of two text layers with M-RoPE and a one-layer vision tower on
    patches of 2 x 2, random weights; the text layers on stria, the vision tower on torch's SDPA
    (it runs on whole images, on every rank)."""
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=32, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                  in_channels=3)
    if family == "qwen2_vl":
        config = transformers.Qwen2VLConfig(text_config=text, vision_config={**vision, "embed_dim": 16},
                                            image_token_id=60, video_token_id=61, vision_start_token_id=62,
                                            vision_end_token_id=63)
        kind = transformers.Qwen2VLForConditionalGeneration
    else:
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config={**vision, "out_hidden_size": 32,
                                               "intermediate_size": 32, "fullatt_block_indexes": [0]},
                                               image_token_id=60, video_token_id=61, vision_start_token_id=62,
                                               vision_end_token_id=63)
        kind = transformers.Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(3)
    return kind._from_config(config, attn_implementation={"text_config": "stria", "vision_config": "sdpa", "": "sdpa"})


def image_batch():
    """Two rows of SEQ tokens, each with an image of 1 x 4 x 6 patches (6 tokens after merging) at
    its own place between its vision start and end tokens."""
    gen = torch.Generator().manual_seed(6)
    input_ids = torch.randint(0, 59, (BATCH, SEQ), generator=gen)
    for row, at in enumerate((3, 11)):
        input_ids[row, at] = 62
        input_ids[row, at + 1:at + 7] = 60
        input_ids[row, at + 7] = 63
    pixel_values = torch.randn(BATCH * 24, 3 * 2 * 2 * 2, generator=gen)
    grid = torch.tensor([[1, 4, 6]] * BATCH)
    return input_ids, dict(pixel_values=pixel_values, image_grid_thw=grid, mm_token_type_ids=(input_ids == 60).int())


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("n,layout", [(2, "zigzag"), (3, "striped")])
def test_vision_language_model_on_embeddings_and_mrope(family, n, layout):
    """A vision-language model's text side on shards: every rank embeds the whole batch as the model
    does (the vision tower on every image, the features merged at the image tokens) and computes
    M-RoPE's three rows of positions, and shard_batch shards both along the sequence. The logits,
    the loss and every gradient (the vision tower's too, through the embeddings) match the model
    run whole with eager attention on the pixels."""
    model = tiny_vision_language_model(family)
    input_ids, images = image_batch()
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation({"text_config": "eager", "vision_config": "eager", "": "eager"})
    out = ref(input_ids=input_ids, labels=input_ids.clone(), use_cache=False,
              **{k: v.double() if v.is_floating_point() else v for k, v in images.items()})
    out.loss.backward()
    want = out.logits.detach(), out.loss.item(), {name: p.grad for name, p in ref.named_parameters()}
    inner = model.model
    model.zero_grad(set_to_none=True)
    logits = torch.full((BATCH, SEQ, VOCAB), float("nan"), dtype=torch.float64)

    def rank_fn(ctx):
        embeds = inner.get_input_embeddings()(input_ids)
        features = torch.cat(inner.get_image_features(images["pixel_values"], images["image_grid_thw"]).pooler_output)
        mask, _ = inner.get_placeholder_mask(input_ids, inputs_embeds=embeds, image_features=features)
        embeds = embeds.masked_scatter(mask, features)
        positions, _ = inner.get_rope_index(input_ids, mm_token_type_ids=images["mm_token_type_ids"],
                                            image_grid_thw=images["image_grid_thw"])
        batch = st.shard_batch(ctx, input_ids, input_ids, position_ids=positions, inputs_embeds=embeds,
                               layout=layout)
        assert batch.position_ids.shape == (3, BATCH, SEQ // n)
        inputs = batch.model_inputs()
        assert "input_ids" not in inputs
        rank_out = model(**inputs)
        rank_out.loss.backward()
        logits[:, torch.from_numpy(stria.positions(layout, SEQ, n, ctx.rank))] = rank_out.logits.detach().double()
        return rank_out.loss.item()

    with stria.local_group(n, timeout_s=TIMEOUT_S) as group:
        losses = group.run(rank_fn)
    check((logits, sum(losses), {name: p.grad for name, p in model.named_parameters()}), want, 2e-5)


def test_deepstack_features_that_embeddings_do_not_carry_are_refused():
    """Qwen3-VL adds its vision tower's features to early layers' states at the image tokens, beside
    the embeddings: a batch given as embeddings would run without them, so it is refused; a batch of
    ids (text alone) runs, and matches."""
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]})
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=2, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3, out_hidden_size=32, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=60, video_token_id=61,
                                        vision_start_token_id=62, vision_end_token_id=63)
    torch.manual_seed(3)
    model = transformers.Qwen3VLForConditionalGeneration._from_config(
        config, attn_implementation={"text_config": "stria", "vision_config": "sdpa", "": "sdpa"})
    input_ids = torch.randint(0, 59, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation({"text_config": "eager", "vision_config": "eager", "": "eager"})
    want = ref(input_ids=input_ids, use_cache=False).logits.detach()
    logits = torch.full((BATCH, SEQ, VOCAB), float("nan"), dtype=torch.float64)

    def rank_fn(ctx):
        embeds = model.get_input_embeddings()(input_ids)
        with pytest.raises(ValueError, match=r"adds its vision tower's features to the states of layers \[0\]"):
            model(**st.shard_batch(ctx, input_ids, inputs_embeds=embeds).model_inputs())
        out = model(**st.shard_batch(ctx, input_ids).model_inputs())
        logits[:, torch.from_numpy(stria.positions("striped", SEQ, 2, ctx.rank))] = out.logits.detach().double()

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        group.run(rank_fn)
    assert rel_err(logits.numpy(), want.numpy()) < 1e-5


def test_shard_batch_refuses_misshapen_positions_and_embeddings():
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with stria.Context(timeout_s=TIMEOUT_S) as ctx:
        with pytest.raises(ValueError, match=r"position_ids must be \[\.\.\., 2, 24\]"):
            st.shard_batch(ctx, input_ids, position_ids=torch.zeros(3, BATCH, SEQ - 1, dtype=torch.long))
        with pytest.raises(ValueError, match=r"inputs_embeds must be \[2, 24, hidden\]"):
            st.shard_batch(ctx, input_ids, inputs_embeds=torch.zeros(BATCH, SEQ))
    # On a plan with padding slots: zero embeddings there, every row of positions taken by the plan.
    plan = stria.Plan([[0, 5, SEQ]] * BATCH, 2, seq_len=SEQ, tile=4)
    plan = stria.Plan([[0, 5, SEQ]] * BATCH, 2, seq_len=SEQ, tile=4, local_len=plan.local_len + 1)
    rows = torch.arange(SEQ).expand(3, BATCH, SEQ) * torch.tensor([1, 2, 3])[:, None, None]

    def rank_fn(ctx):
        batch = st.shard_batch(ctx, input_ids, plan=plan, inputs_embeds=torch.ones(BATCH, SEQ, 4), position_ids=rows)
        where = torch.from_numpy(plan.positions(ctx.rank).copy())
        assert bool((where < 0).any())
        # Any per-token tensor the same way (weights, advantages): [B, S, ...] and [..., B, S].
        weights = torch.rand(BATCH, SEQ, dtype=torch.float64)
        picked = batch.sharding.shard(weights, fill=-1.0)
        assert torch.equal(picked[where >= 0], weights[torch.arange(BATCH)[:, None].expand_as(where)[where >= 0],
                                                        where[where >= 0]])
        assert bool((picked[where < 0] == -1.0).all())
        assert torch.equal(batch.sharding.shard(rows), batch.position_ids)
        with pytest.raises(ValueError, match=r"a \[2, 24, \.\.\.\] or \[\.\.\., 2, 24\] tensor, not \(2, 23\)"):
            batch.sharding.shard(weights[:, 1:])
        assert torch.equal(batch.inputs_embeds[where < 0], torch.zeros(int((where < 0).sum()), 4))
        assert torch.equal(batch.inputs_embeds[where >= 0], torch.ones(int((where >= 0).sum()), 4))
        for k in range(3):
            assert torch.equal(batch.position_ids[k][where >= 0], (k + 1) * where[where >= 0])
            assert not bool(batch.position_ids[k][where < 0].any())

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        group.run(rank_fn)


def test_the_sharding_of_a_with_block_and_torch_compile():
    """The sharding given by stria.transformers.sharded (no keyword argument), and the model under
    torch.compile: the logits of eager stria, the gradients of the reference."""
    model = make_model("qwen2", "stria")
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
    want = reference(model, input_ids)
    compiled = torch.compile(model)
    model.zero_grad(set_to_none=True)

    def rank_fn(ctx):
        batch = st.shard_batch(ctx, input_ids, input_ids)
        inputs = batch.model_inputs()
        del inputs[st.NAME]
        with st.sharded(batch.sharding):
            eager = model(**inputs).logits
        out = compiled(**batch.model_inputs())
        out.loss.backward()
        return rel_err(out.logits.detach().double().numpy(), eager.detach().double().numpy()), out.loss.item()

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        results = group.run(rank_fn)
    assert all(err < 1e-5 for err, _ in results)
    assert sum(loss for _, loss in results) == pytest.approx(want[1], rel=2e-5)
    for name, g in want[2].items():
        assert rel_err(model.get_parameter(name).grad.double().numpy(), g.numpy()) < 2e-5, name


def test_example_under_torchrun(ucx):
    """The fine-tuning example as torchrun runs it: two processes, contexts from the gloo group, K/V
    blocks over UCX, the gradients all-reduced: its losses match one process's with eager attention."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "..", "examples", "python", "train_transformers.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), example, "--family", "gemma2", "--steps", "3", "--seq", "32", "--check"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gemma2, 2 ranks (processes)" in done.stdout
