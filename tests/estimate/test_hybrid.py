"""Hybrid models sized as vLLM 0.32 sizes them: state layers (MambaSpec), the attention block raised so one page
holds a state, groups of equal pages, two state blocks per request (prefix caching's "align" mode)."""

from __future__ import annotations

import json

QWEN3_NEXT = {
    # huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json (the values kvtool reads)
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "vocab_size": 151936,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}


def _run(run_cli, tmp_path, config, *args):
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = run_cli("estimate", "--config", str(tmp_path), "--json", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_qwen3_next_544_token_blocks(run_cli, tmp_path):
    # Gated DeltaNet state (MambaStateShapeCalculator.gated_delta_net_state_shape), bf16: conv 3 x (2 x 16 x 128 +
    # 32 x 128) = 3 x 8,192 values, temporal 32 x 128 x 128 = 524,288 values: (24,576 + 524,288) x 2 = 1,097,728 B.
    # Attention: 2 x 2 KV heads x 256 x 2 B = 2,048 B per token per layer, so the block is
    # 16 x cdiv(1,097,728, 16 x 2,048) = 544 tokens (the "544-token blocks" vLLM reports for Qwen3-Next) and the page
    # 1,114,112 B. 12 attention and 36 state layers: groups of 12 (1 attention + 3 state groups).
    out = _run(run_cli, tmp_path, QWEN3_NEXT, "--kv-memory", "20GiB", "--seq-len", "262144")
    assert out["block_size"] == 544
    assert out["num_blocks"] == 20 * 1024**3 // 1_114_112 // 12
    # a request: cdiv(262,144, 544) = 482 attention blocks + 3 groups x 2 state blocks
    assert out["blocks_per_request"] == 482 + 6
    state = next(g for g in out["layer_groups"] if g["kind"] == "mamba")
    assert state["num_layers"] == 36 and state["kv_bytes_per_gpu"] == 36 * 1_097_728


def test_state_splits_over_tensor_parallel_ranks(run_cli, tmp_path):
    # at tp 2: conv 3 x 4,096 and temporal 16 x 128 x 128 values: (12,288 + 262,144) x 2 = 548,864 B; attention
    # 1 KV head per GPU: 1,024 B per token, block 16 x cdiv(548,864, 16,384) = 544 again
    out = _run(run_cli, tmp_path, QWEN3_NEXT, "--kv-memory", "10GiB", "--seq-len", "8192", "--tp", "2")
    state = next(g for g in out["layer_groups"] if g["kind"] == "mamba")
    assert state["kv_bytes_per_gpu"] == 36 * 548_864 and out["block_size"] == 544


def test_jamba_by_hand(run_cli, tmp_path):
    # huggingface.co/ai21labs/Jamba-v0.1: attention on layers with i % 8 == 4 (4 of 32), Mamba-1 elsewhere.
    # State (mamba1_state_shape): conv 8,192 x 3 and temporal 8,192 x 16 values, bf16: 311,296 B.
    # Attention 2 x 8 x 128 x 2 = 4,096 B per token: block 16 x cdiv(311,296, 65,536) = 80, page 327,680 B.
    # Groups of 4 layers: 1 attention + 7 state groups; 10 GiB / 327,680 / 4 = 8,192 blocks;
    # a request of 8,000 tokens: cdiv(8,000, 80) = 100 + 7 x 2 = 114 blocks.
    config = {
        "model_type": "jamba",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 65536,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "torch_dtype": "bfloat16",
    }
    out = _run(run_cli, tmp_path, config, "--kv-memory", "10GiB", "--seq-len", "8000")
    assert (out["block_size"], out["num_blocks"], out["blocks_per_request"]) == (80, 8192, 114)


def test_without_prefix_caching_a_state_holds_one_block(run_cli, tmp_path):
    # MambaSpec.max_memory_usage_bytes: page x 2 in "align" mode (prefix caching, vLLM 0.32's default), page x 1
    # otherwise; Qwen3-Next at 262,144 tokens: 482 attention blocks + 3 state groups x 1
    out = _run(
        run_cli, tmp_path, QWEN3_NEXT, "--kv-memory", "20GiB", "--seq-len", "262144", "--no-enable-prefix-caching"
    )
    assert out["blocks_per_request"] == 482 + 3


def test_hf_config_names_every_hybrid_type_that_hybrid_reads():
    # hf_config keeps the list of hybrid model_types itself so that a plain decoder's estimate never imports
    # kvtool.estimate.hybrid; the list must stay the keys of hybrid.READERS (one reader per listed type)
    from kvtool.estimate.hf_config import HYBRID_TYPES
    from kvtool.estimate.hybrid import READERS

    assert HYBRID_TYPES == frozenset(READERS)
