"""The tiny random-weight models and the offline engine shared by the live vLLM scripts of this folder.

Recipe: shared/docs/vllm-on-cpu.md.  The scripts (vllm_live_engine.py, vllm_record_driver.py, vllm_prefix_driver.py,
vllm_fleet_engine.py) run with a Python that has vLLM, as scripts, so they import this module as ``vllm_tiny`` (their
own folder is first on ``sys.path``); it imports vLLM, torch and transformers only inside the functions.  The
environment they run in (offline, loopback only) is ``tests.support.vllm_engine_env``.
"""

from __future__ import annotations

from pathlib import Path

BYTES_PER_TOKEN = 2 * 4 * 2 * 32 * 2  # K and V x 4 layers x 2 KV heads x head_dim 32 x bf16 = 1024
BLOCK_SIZE = 32

# The shape every tiny model shares (tests/data/simulate/record_vllm_parity.py's too): hidden 256, 4 layers, 8 heads,
# 2 KV heads (head_dim 256 / 8 = 32), vocab 1000.
TINY_SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=512,
    vocab_size=1000,
    max_position_embeddings=2048,
)

# arch -> (transformers config class, model class, settings beyond the shared shape)
ARCHS = {
    # full attention: one KV-cache group
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    # every layer a 64-token sliding window: one SlidingWindowSpec group
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 32, "sliding_window": 64}),
    # global and sliding-window (64 tokens) layers alternate: two KV-cache groups (a hybrid model), sliding-window
    # blocks released mid-request (Gemma 2's own head_dim default is 256, hence 32 given)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 32, "sliding_window": 64}),
}


def build_model(model_dir: Path, arch: str = "llama") -> None:
    """Save a random-weight model of ``arch`` (bf16, seed 0) in ``model_dir``."""
    import torch
    import transformers

    config_class, model_class, extra = ARCHS[arch]
    config = getattr(transformers, config_class)(**TINY_SHAPE, **extra)
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).to(torch.bfloat16).save_pretrained(model_dir)


def ensure_model(model_dir: Path, arch: str = "llama") -> None:
    """Build the model in ``model_dir`` unless a config.json is already there."""
    if not (model_dir / "config.json").exists():
        build_model(model_dir, arch)


def offline_llm(model_dir: Path, kv_cache_memory_bytes: int, **engine_args):
    """``vllm.LLM`` on the tiny model: token-id prompts (no tokenizer), block 32, prefix caching, length 1,024, eager,
    an exact KV budget; ``engine_args`` adds the rest (KV events, stats)."""
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        skip_tokenizer_init=True,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        max_model_len=1024,
        enforce_eager=True,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        **engine_args,
    )


def kv_events(endpoint: str, replay_endpoint: str | None = None):
    """KV-cache events published over ZMQ on ``endpoint`` (no topic), replayed on ``replay_endpoint`` when given."""
    from vllm.config import KVEventsConfig

    return KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint, replay_endpoint=replay_endpoint, topic=""
    )


def sampling(max_tokens: int, **params):
    """Exactly ``max_tokens`` output tokens (EOS ignored), not detokenized."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, **params)


def reset_and_flush(llm) -> None:
    """Reset the prefix cache; its AllBlocksCleared event is published with the next engine step, so run one short
    request (8 tokens, less than a block, so it stores nothing)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()
    engine = llm.llm_engine
    engine.add_request(
        "flush", TokensPrompt(prompt_token_ids=list(range(1, 9))), SamplingParams(max_tokens=1, detokenize=False)
    )
    while engine.has_unfinished_requests():
        engine.step()
