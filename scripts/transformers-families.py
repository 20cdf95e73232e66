#!/usr/bin/env python3
"""Every causal-LM family of the installed transformers through attn_implementation="stria": each
family's model class, built from a tiny random configuration, runs on local groups of CPU ranks
(each rank on its striped shard of the batch) and its logits are set against the same model with
transformers' eager attention on the whole sequence in float64. Prints a markdown table, a row a
family:

    matches      the largest relative error of the logits over the rank counts
    refused      stria refused the model, with the reason it gave (stria.transformers.check_model,
                 or an attention layer that passed what stria cannot honour)
    wrong        neither: the sharded model computed something else (a defect of stria)
    not built    the sweep's generic tiny configuration does not build this family, its float64
                 reference does not run (nothing of stria was called), or it needs more memory
                 than the sweep gives a family
    failed       an error of another kind on shards (a defect of stria, or of the sweep)

Each family runs in a process of its own under a memory and time limit (some multimodal families
build vision or audio towers of their full default size).

    PYTHONPATH=build/bindings/python python scripts/transformers-families.py [family ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import json
import resource
import subprocess
import sys
import time

VOCAB, SEQ, BATCH = 64, 24, 2
TOLERANCE = 1e-4  # float32 sharded against float64 whole: what the model suites ask


def tiny_config(transformers, family: str):
    """Two layers, 4 query heads of 8 dims sharing 2 K/V heads, token ids inside the vocabulary."""
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attention_dropout=0.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        kv_lora_rank=16, q_lora_rank=16, qk_head_dim=16,
    )
    config = transformers.AutoConfig.for_model(family, **common)
    if getattr(config, "kv_lora_rank", None):  # latent attention: as many key/value heads as query heads
        config = transformers.AutoConfig.for_model(family, **{**common, "num_key_value_heads": 4})
    return config


def run_one(family: str, ranks: list[int]) -> dict:
    """The verdict on one family (run in its own process)."""
    import torch
    import transformers

    import stria
    import stria.transformers as st

    stage = "build"
    try:
        torch.manual_seed(3)
        config = tiny_config(transformers, family)
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                config, attn_implementation="stria", experts_implementation="eager"
            )
        except TypeError:  # a model class without the experts option
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="stria")
        model = model.float().eval()  # eval: dropout and router noise would differ between the runs
        input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
        ref = copy.deepcopy(model).double()
        ref.set_attn_implementation("eager")
        with torch.no_grad():
            want = ref(input_ids=input_ids, use_cache=False).logits.double()
        stage = "stria"
        worst, with_block = 0.0, False

        def run(n: int) -> torch.Tensor:
            got = torch.full_like(want, float("nan"))

            def rank_fn(ctx):
                batch = st.shard_batch(ctx, input_ids)
                with torch.no_grad(), st.sharded(batch.sharding) if with_block else contextlib.nullcontext():
                    out = model(**batch.model_inputs())
                got[:, torch.from_numpy(stria.positions("striped", SEQ, n, ctx.rank))] = out.logits.double()

            with stria.local_group(n, timeout_s=60) as group:
                group.run(rank_fn)
            return got

        for n in ranks:
            try:
                got = run(n)
            except ValueError as e:
                if "no sharding for this call" not in str(e):
                    raise
                with_block = True  # a model that does not pass its keyword arguments down
                got = run(n)
            worst = max(worst, float((got - want).norm() / want.norm()))
            if not worst < TOLERANCE:  # NaN is wrong too
                return {"verdict": "wrong", "detail": f"relative error {worst:.1e} on {n} ranks"}
        where = " inside stria.transformers.sharded()" if with_block else ""
        ranks_run = ", ".join(map(str, ranks))
        return {"verdict": "matches", "detail": f"relative error {worst:.1e} (ranks {ranks_run}){where}"}
    except Exception as e:  # noqa: BLE001 - every failure is a verdict
        message = " ".join(str(e).split())
        if isinstance(e, MemoryError) or "can't allocate memory" in message:  # the sweep's limit, not a verdict
            return {"verdict": "not built", "detail": f"over the sweep's memory limit ({stage} stage)"}
        if stage == "stria" and "stria attention:" in message:
            return {"verdict": "refused", "detail": message.split("stria attention:", 1)[1].strip()}
        return {
            "verdict": "not built" if stage == "build" else "failed",
            "detail": f"{type(e).__name__}: {message[:160]}",
        }


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="model types (default: every causal-LM family)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a family may take")
    parser.add_argument("--memory-gib", type=float, default=10.0, help="address space a family may take")
    parser.add_argument("--jobs", type=int, default=2, help="families run at once")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one family, a JSON line out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.ranks)), flush=True)
        return 0

    import transformers

    limit = int(args.memory_gib * 2**30)

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    names = args.families or families()
    counts: dict[str, int] = {}
    print(f"transformers {transformers.__version__}, {len(names)} families, ranks {args.ranks}\n")
    print("| family | verdict | detail |\n| --- | --- | --- |", flush=True)
    start = time.monotonic()

    def verdict(name: str) -> dict:
        cmd = [sys.executable, __file__, "--one", name, "--ranks", *map(str, args.ranks)]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout, preexec_fn=limit_memory
            )
        except subprocess.TimeoutExpired:
            return {"verdict": "not built", "detail": f"over {args.timeout:.0f} s"}
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        tail = " ".join(done.stderr.split()[-12:])
        return {"verdict": "not built", "detail": f"exit {done.returncode}: {tail[:160]}"}

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, result in zip(names, pool.map(verdict, names)):  # in order, as they finish
            counts[result["verdict"]] = counts.get(result["verdict"], 0) + 1
            detail = result["detail"].replace("|", "\\|")
            print(f"| {name} | {result['verdict']} | {detail} |", flush=True)
    summary = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
    print(f"\n{summary} ({time.monotonic() - start:.0f} s)")
    return 1 if counts.get("wrong") or counts.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
