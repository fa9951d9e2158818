import os, sys
if __name__ == "__main__":
    from transformers import LlamaConfig, LlamaForCausalLM
    import torch
    d = "/tmp/offl/tiny"
    if not os.path.exists(d + "/config.json"):
        cfg = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                          intermediate_size=512, vocab_size=1000, max_position_embeddings=2048, torch_dtype="bfloat16")
        m = LlamaForCausalLM(cfg).to(torch.bfloat16); m.save_pretrained(d)
    from vllm import LLM
    llm = LLM(model=d, skip_tokenizer_init=True, block_size=32, enable_prefix_caching=True, max_model_len=2048,
              enforce_eager=True, kv_cache_memory_bytes=5_000_000, kv_offloading_size=float(sys.argv[1]))
    print("GPU blocks", llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)
