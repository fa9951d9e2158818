"""What kvtool refuses, in one line each: absurd configs, encoder-only and hybrid models, implausible sizes."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_USAGE

LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "intermediate_size": 11008,
}


def _config(tmp_path, **changes):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return str(tmp_path)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"num_hidden_layers": 10**30}, "num_hidden_layers 1e+30 is not a plausible model dimension"),
        ({"num_attention_heads": -32}, "num_attention_heads must be positive, not -32"),
        ({"model_type": "bert", "architectures": ["BertModel"]}, "encoder-only model"),
        # MiniMax-M1: attn_type_list, 0 = lightning (linear) attention (huggingface.co/MiniMaxAI/MiniMax-M1-80k)
        ({"model_type": "minimax_m1", "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1] * 10}, "attn_type_list"),
        # Qwen3-Next: layer_types with linear_attention (huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct)
        ({"layer_types": ["linear_attention"] * 3 * 8 + ["full_attention"] * 8}, "linear_attention"),
        ({"model_type": "zamba2"}, "model_type zamba2"),
        # Per-layer KV keys on a model type whose vLLM class kvtool has not read (Gemma 4 Unified's text model):
        # refused rather than sized with one shape
        (
            {"model_type": "gemma4_unified_text", "head_dim": 256, "num_key_value_heads": 16, "global_head_dim": 512},
            "per-layer KV shapes not modelled for model_type gemma4_unified_text: global_head_dim 512",
        ),
        # Gemma 4 with per_layer_config giving one sliding layer (layer 0) its own KV shape: kvtool keeps one shape
        # per kind of layer
        (
            {
                "model_type": "gemma4_text",
                "head_dim": 128,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                "num_hidden_layers": 6,
                "sliding_window": 1024,
                "per_layer_config": {"0": {"head_dim": 256}, "5": {"head_dim": 512}},
            },
            "per_layer_config gives sliding layers KV shapes",
        ),
        # Every layer KV-shared: no layer holds the KV they would read (vLLM cannot build the model)
        ({"model_type": "gemma3n_text", "num_kv_shared_layers": 32}, "num_kv_shared_layers must be between 0"),
        ({"model_type": "jamba"}, "hybrid config needs a positive integer attn_layer_period"),
    ],
)
def test_unmodelled_or_absurd_configs_get_one_line(run_cli, tmp_path, changes, words):
    r = run_cli("estimate", "--config", _config(tmp_path, **changes), "--seq-len", "1024")
    assert r.exit_code != 0 and "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("Error: ") and words in first


def test_implausible_gpu_memory_suggests_the_unit(run_cli):
    r = run_cli("estimate", "--model", "llama-2-7b", "--gpu-memory", "80")
    assert r.exit_code == EXIT_USAGE
    assert "80 bytes" in r.stderr and "did you mean 80GiB?" in r.stderr


def test_block_size_a_gpu_backend_refuses(run_cli):
    # FlashAttention's kernel block sizes are MultipleOf(16) in vLLM 0.32
    r = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "H100", "--block-size", "24")
    assert r.exit_code == EXIT_USAGE and "multiple of 16" in r.stderr


def test_does_not_fit_suggests_what_would(run_cli):
    # Llama-3.1-70B in bf16 (141 GB of weights) on one H100 leaves nothing for the KV cache; nor at --tp 2 under
    # vLLM 0.33's rules: each GPU holds half of the weights (65.71 GiB) and the reserve (sampler 1024 x 128,256 x
    # 14.4 B + two resident hidden copies 2 x 8,192 x 8,192 x 2 B = 2.01 GiB, non-torch 2.07 GiB at TP > 1 as vLLM
    # 0.19's TP 2 logs show, CUDA graphs 1.55) leaves 79.22 x 0.9 - 65.71 - 5.63 = -0.04 GiB (vLLM 0.19.0's
    # Qwen2.5-72B TP 2 log in tests/data/gpu-logs keeps 3.04 GiB at 0.95, -0.9 GiB at 0.9): --tp 4 is the answer
    r = run_cli("estimate", "--model", "llama-3.1-70b", "--gpu", "H100", "--seq-len", "8192", "--batch", "4", "--json")
    out = json.loads(r.stdout)
    assert out["fits"] is False
    assert out["suggestions"][0].startswith("--tp 4 fits")  # --tp 2 holds no request
    assert any(s.startswith("--kv-dtype fp8") for s in out["suggestions"])
    text = " ".join(
        run_cli("estimate", "--model", "llama-3.1-70b", "--gpu", "H100", "--seq-len", "8192").stdout.split()
    )
    assert (
        text.startswith("1 request of 8,192 tokens on H100-80GB fits: no, not even one request")
        and "Would fit: --tp 4 fits" in text
        and "--tp 2 fits" not in text
    )
