"""KV bytes against hand computations and published configs (kvtool.estimate.layout, kvtool.estimate.hf_config)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import load_config_path, manual_spec, parse_config
from kvtool.estimate.layout import kv_layout
from kvtool.estimate.profiles import find_model, model_spec
from tests.support import DATA

EST = DATA / "estimate"


def spec_of(name):
    return model_spec(find_model(name))


def config_spec(dirname):
    data, file = load_config_path(EST / dirname)
    return parse_config(data, where=str(file))


# The seed article (/work/shared/seeds/kv-catch-paged-cache.txt, section 1.2): 2 x L x H x S x D x P x B with
# 7B, MHA, FP16, S=2048, B=1: 2 x 32 x 32 x 2048 x 128 x 2 = 1,073,741,824 bytes ("1.07 GB" = 1.0 GiB);
# 16 requests: 17,179,869,184; GQA with 8 KV heads: a quarter; FP8: half.
def test_seed_worked_example_llama_2_7b():
    layout = kv_layout(spec_of("llama-2-7b"), "auto")
    assert layout.kv_dtype == "fp16"
    assert layout.kv_bytes_per_gpu(2048, 1) == 1_073_741_824
    assert layout.kv_bytes_per_gpu(2048, 16) == 17_179_869_184


def test_seed_gqa_quarter_and_fp8_half():
    mha = manual_spec(layers=32, kv_heads=32, head_dim=128, heads=32, hidden=4096)
    gqa = manual_spec(layers=32, kv_heads=8, head_dim=128, heads=32, hidden=4096)
    assert kv_layout(gqa, "fp16").kv_bytes_per_gpu(2048, 1) == 1_073_741_824 // 4
    assert kv_layout(mha, "fp8").kv_bytes_per_gpu(2048, 1) == 1_073_741_824 // 2


@pytest.mark.parametrize(
    "kv_dtype, bytes_per_token",
    [
        # 2 x 32 layers x 32 heads x 128 dims = 262,144 values per token, times the element size
        ("fp32", 262_144 * 4),
        ("fp16", 262_144 * 2),
        ("bf16", 262_144 * 2),
        ("fp8", 262_144),
        ("fp8_e4m3", 262_144),
        ("fp8_e5m2", 262_144),
        ("int8", 262_144),
        ("int4", 262_144 // 2),
        # nvfp4: per head 128/2 data + 128/16 scale bytes = 72 (vLLM nvfp4_kv_cache_full_dim)
        ("nvfp4", 2 * 32 * 32 * 72),
    ],
)
def test_every_kv_dtype_size(kv_dtype, bytes_per_token):
    layout = kv_layout(spec_of("llama-2-7b"), kv_dtype)
    assert layout.bytes_per_token_per_gpu == bytes_per_token


def test_int4_half_byte_stays_exact_for_odd_head_dim():
    spec = manual_spec(layers=1, kv_heads=1, head_dim=3, heads=1, hidden=None)
    layout = kv_layout(spec, "int4")
    assert layout.bytes_per_token_per_gpu == Fraction(3)  # 2 x 3 values x 1/2 byte
    assert layout.kv_bytes_per_gpu(1, 1) == 3


def test_falcon_7b_multi_query_is_one_kv_head():
    # tiiuae/falcon-7b config.json: multi_query true, new_decoder_architecture false, 71 heads, hidden 4544
    spec = config_spec("falcon-7b")
    assert (spec.num_kv_heads, spec.head_dim, spec.num_layers) == (1, 64, 32)
    # 2 x 32 layers x 1 head x 64 dims x 2 bytes = 8,192 bytes per token; 71x less than MHA
    assert kv_layout(spec).bytes_per_token_per_gpu == 8192
    assert kv_layout(spec).kv_bytes_per_gpu(2048, 1) == 16_777_216


def test_falcon_new_decoder_architecture_ignores_multi_query():
    data = {
        "model_type": "falcon",
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "multi_query": True,
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
    }
    assert parse_config(data, where="x").num_kv_heads == 8


def test_gemma_2_alternates_sliding_and_full():
    # google/gemma-2-9b config.json: 42 layers, 8 KV heads, head_dim 256, sliding_window 4096, float32
    spec = config_spec("gemma-2-9b")
    assert spec.layer_kinds[:4] == ("sliding", "full", "sliding", "full")
    assert spec.layer_kinds.count("sliding") == 21 and spec.sliding_window == 4096
    layout = kv_layout(spec, "bf16")
    # per layer per token: 2 x 8 x 256 x 2 = 8,192 B.  S=8192 (past the window):
    # 21 full layers x 8192 tokens + 21 sliding layers x 4096 tokens = 258,048 layer-tokens x 8,192 B
    assert layout.kv_bytes_per_gpu(8192, 1) == 258_048 * 8192 == 2_113_929_216
    # below the window every layer holds every token: 42 x 1000 x 8192
    assert layout.kv_bytes_per_gpu(1000, 1) == 42 * 1000 * 8192
    assert kv_layout(spec).kv_dtype == "fp32"  # auto = the published float32


def test_mistral_sliding_window_caps_past_the_window():
    # mistralai/Mistral-7B-v0.1: sliding_window 4096 on every layer; 2 x 32 x 8 x 128 x 2 B = 131,072 B per token
    layout = kv_layout(config_spec("mistral-7b-v0.1"))
    assert layout.kv_bytes_per_gpu(4096, 1) == 131_072 * 4096
    assert layout.kv_bytes_per_gpu(32768, 1) == 131_072 * 4096 == 536_870_912  # not 8x more


def test_mla_deepseek_v2_lite():
    # deepseek-ai/DeepSeek-V2-Lite: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per token per layer,
    # 27 layers, bf16, no factor 2: 576 x 2 x 27 = 31,104 bytes per token
    spec = config_spec("deepseek-v2-lite")
    assert spec.is_mla and spec.head_dim == 576 and spec.num_layers == 27
    layout = kv_layout(spec)
    assert layout.bytes_per_token_per_gpu == 31_104
    assert layout.kv_bytes_per_gpu(4096, 1) == 31_104 * 4096
    # replicated on every tensor-parallel rank
    assert kv_layout(spec, "auto", tp=2).bytes_per_token_per_gpu == 31_104
    # vLLM fp8_ds_mla: 656 bytes per token per layer
    assert kv_layout(spec, "fp8_ds_mla").bytes_per_token_per_gpu == 656 * 27


def test_fp8_ds_mla_rejected_for_non_mla():
    with pytest.raises(UsageError):
        kv_layout(spec_of("llama-2-7b"), "fp8_ds_mla")


def test_tp_larger_than_kv_heads_replicates_one_head_per_gpu():
    # Llama-3-8B: 8 KV heads.  tp=4: 2 heads per GPU, 2 x 32 x 2 x 128 x 2 = 32,768 B per token per GPU.
    spec = spec_of("llama-3-8b")
    assert kv_layout(spec, tp=4).bytes_per_token_per_gpu == 32_768
    # tp=16 > 8: max(1, 8 // 16) = 1 head per GPU: 16,384 B per GPU, 16 GPUs hold 2x the unsplit 131,072 B
    layout = kv_layout(spec, tp=16)
    assert layout.groups[0].kv_heads_per_gpu == 1
    assert layout.bytes_per_token_per_gpu == 16_384
    assert any("replicated" in n for n in layout.notes)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 128),
    kv_heads=st.integers(1, 64),
    head_dim=st.integers(1, 512),
    seq=st.integers(1, 1 << 20),
    batch=st.integers(1, 512),
    k=st.integers(2, 9),
    dtype=st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8"]),
)
def test_linear_in_batch_and_seq_len(layers, kv_heads, head_dim, seq, batch, k, dtype):
    layout = kv_layout(manual_spec(layers=layers, kv_heads=kv_heads, head_dim=head_dim, heads=None, hidden=None), dtype)
    one = layout.kv_bytes_per_gpu(seq, batch)
    assert layout.kv_bytes_per_gpu(seq, batch * k) == k * one
    assert layout.kv_bytes_per_gpu(seq * k, batch) == k * one
    assert (
        one
        == 2
        * layers
        * kv_heads
        * head_dim
        * int(layout.groups[0].bytes_per_token_per_layer / (2 * kv_heads * head_dim))
        * seq
        * batch
    )
