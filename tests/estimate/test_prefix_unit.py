"""The prefix-cache unit (kvtool.estimate.prefix_unit) against vLLM's source rules, computed by hand, and public
reports of the block sizes vLLM picked."""

from __future__ import annotations

import json

import pytest

from kvtool.estimate.hybrid_block import attention_block_size
from kvtool.estimate.layout import kv_layout
from kvtool.estimate.model import resolve_model
from kvtool.estimate.prefix_unit import prefix_unit
from kvtool.estimate.request import EstimateRequest, check_request

DATA = "tests/data/estimate"


def _unit(name: str, version: str = "0.33.0", **settings):
    request = check_request(EstimateRequest(config=f"{DATA}/{name}", vllm_version=version))
    spec = resolve_model(request).spec
    return prefix_unit(spec, kv_layout(spec, "auto", 1), vllm_version=request.vllm_version, **settings)


def test_full_attention_unit_is_the_block():
    # One full-attention group of 16-token blocks; get_computed_blocks caps a hit at num_tokens - 1, so a prompt of
    # 17 tokens can hit its first block, one of 16 cannot (vllm/v1/core/kv_cache_manager.py).
    u = _unit("tiny-llama")
    assert (u.cache_hit_unit_tokens, u.hash_block_size_tokens, u.min_prompt_tokens) == (16, 16, 17)
    assert _unit("tiny-llama", block_size=32).min_prompt_tokens == 33


def test_sliding_window_models_keep_the_16_token_unit():
    # Mistral-7B-v0.1: every layer sliding (window 4096), one group of 16-token blocks; Gemma-2-9B: full and sliding
    # groups, both 16 tokens, lcm 16.  A sliding window bounds which hits survive, not the unit.
    mistral, gemma = _unit("mistral-7b-v0.1"), _unit("gemma-2-9b")
    assert [g.kind for g in mistral.groups] == ["sliding"] and mistral.cache_hit_unit_tokens == 16
    assert {g.kind for g in gemma.groups} == {"full", "sliding"} and gemma.cache_hit_unit_tokens == 16


def test_gemma_4_unit_is_the_lcm_of_unified_blocks():
    # Gemma-4-31B: sliding pages 16 KV heads x 256 x 2 (K, V), full pages 4 x 512 x 1 (k_eq_v): 8,192 vs 4,096 B per
    # token, so vLLM's unify_kv_cache_spec_page_size gives full layers 32-token blocks; hits are multiples of
    # lcm(32, 16) = 32, and 0.20.0+'s hash block is gcd = 16.
    u = _unit("gemma-4-31b-it")
    assert {g.kind: g.block_size_tokens for g in u.groups} == {"full": 32, "sliding": 16}
    assert (u.cache_hit_unit_tokens, u.hash_block_size_tokens, u.min_prompt_tokens) == (32, 16, 33)


# Nemotron-3-Nano-30B-A3B: 23 Mamba-2 layers of 2,134,016 B each (one GPU, bf16 conv, float32 SSM state), attention
# 2 KV heads x 128 x 2 (K, V) x 2 B = 1,024 B per token: one state is exactly 2,084 tokens of attention page.
def test_hybrid_align_mode_by_hand():
    # 'align' (0.32.0+ default): 16 x cdiv(2,134,016, 16 x 1,024) = 16 x 131 = 2,096; mamba_block_size = block_size
    u = _unit("nemotron-3-nano-30b-a3b", "0.33.0")
    assert u.mamba_cache_mode == "align"
    assert {g.kind: g.block_size_tokens for g in u.groups} == {"full": 2096, "mamba": 2096}
    assert (u.cache_hit_unit_tokens, u.min_shared_prefix_tokens, u.min_prompt_tokens) == (2096, 2096, 2097)


def test_hybrid_all_mode_by_hand():
    # 'all' (0.15.0-0.31.0 mode with prefix caching for SupportsMambaPrefixCaching models such as NemotronH):
    # chunk_size 128 from the config, lcm(128, 16) = 128, 128 x cdiv(2,084, 128) = 128 x 17 = 2,176
    # (HybridAttentionMambaModelConfig / Platform._align_hybrid_block_size); --mamba-block-size 64 replaces the
    # chunk: 64 x cdiv(2,084, 64) = 2,112.  0.27.1 keeps prefix caching opt-in for hybrids, so it is asked for.
    u = _unit("nemotron-3-nano-30b-a3b", "0.27.1", prefix_caching=True)
    assert (u.mamba_cache_mode, u.cache_hit_unit_tokens) == ("all", 2176)
    on = {"prefix_caching": True}
    assert _unit("nemotron-3-nano-30b-a3b", "0.27.1", mamba_block_size=64, **on).cache_hit_unit_tokens == 2112
    assert _unit("nemotron-3-nano-30b-a3b", "0.27.1", mamba_cache_mode="align", **on).cache_hit_unit_tokens == 2096
    # with prefix caching, vLLM reads mamba_cache_mode 'none' (CacheConfig's default value) as not given
    assert _unit("nemotron-3-nano-30b-a3b", "0.27.1", mamba_cache_mode="none", **on).mamba_cache_mode == "all"


@pytest.mark.parametrize(
    ("version", "caching", "mode"),
    [
        # vllm/engine/arg_utils.py: default_prefix_caching = not is_hybrid (0.11.1), is_prefix_caching_supported,
        # False for hybrids (0.12.0-0.25.1), "and not model_config.is_hybrid" (0.26.0-0.27.1); True from 0.28.0
        ("0.11.1", False, "none"),
        ("0.19.1", False, "none"),
        ("0.27.1", False, "none"),
        ("0.28.0", True, "all"),
        ("0.32.0", True, "align"),
    ],
)
def test_hybrid_prefix_caching_default_by_release(version, caching, mode):
    u = _unit("nemotron-3-nano-30b-a3b", version)
    assert (u.prefix_caching, u.mamba_cache_mode) == (caching, mode)
    if not caching:
        assert "unless --enable-prefix-caching" in (u.why_off or "")
        assert any(w.startswith("--enable-prefix-caching:") for w in _with_what_ifs(version).what_if)


def _with_what_ifs(version):
    from kvtool.estimate.prefix_unit import prefix_unit_with_what_ifs

    spec = resolve_model(EstimateRequest(config=f"{DATA}/nemotron-3-nano-30b-a3b")).spec
    return prefix_unit_with_what_ifs(spec, kv_layout(spec, "auto", 1), vllm_version=version)


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.10.0", "refuses to start"),  # gpu_model_runner.py: NotImplementedError with prefix caching on Mamba
        ("0.10.2", "turns prefix caching off"),  # MambaModelConfig: enable_prefix_caching = False
        ("0.11.0", "turns prefix caching off"),
    ],
)
def test_hybrid_prefix_caching_off_before_0_11_1(version, why):
    u = _unit("nemotron-3-nano-30b-a3b", version)
    assert not u.prefix_caching and why in (u.why_off or "") and u.min_prompt_tokens is None


def test_no_prefix_caching():
    off = _unit("nemotron-3-nano-30b-a3b", prefix_caching=False)
    assert off.cache_hit_unit_tokens is None and off.why_off == "--no-enable-prefix-caching"


def test_pre_0_20_step_is_16_whatever_block_size():
    # 0.10.0-0.19.1: kernel_block_alignment_size = 16, so --block-size 64 leaves 16 x cdiv(...) = 2,096 (> 64);
    # 0.20.0+: the step is max(16, 64) = 64: 64 x cdiv(2,084, 64) = 2,112
    assert attention_block_size(2_134_016, 1024, 64, mode="align", chunk_tokens=None, vllm_version="0.19.1")[0] == 2096
    assert attention_block_size(2_134_016, 1024, 64, mode="align", chunk_tokens=None, vllm_version="0.20.0")[0] == 2112


def test_report_53749_nemotron_h_30b_a3b_align_block_2096():
    # https://github.com/vllm-project/vllm/issues/53749 (v0.27.1, nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16,
    # NemotronHForCausalLM, `--mamba-cache-mode align --enable-prefix-caching`): "auto-selected attention block
    # size | **2096**" and "zero hits for any shared prefix shorter than one attention block".  The config kvtool
    # has is the Nemotron-3-Nano-30B-A3B one (the same NemotronH 30B-A3B geometry); it gives the same 2,096.
    u = _unit("nemotron-3-nano-30b-a3b", "0.27.1", mamba_cache_mode="align", prefix_caching=True)
    assert u.attention_block_size_tokens == 2096 and u.min_shared_prefix_tokens == 2096


def test_report_48401_no_hit_when_max_model_len_below_the_block():
    # https://github.com/vllm-project/vllm/issues/48401: "`--enable-prefix-caching` is silently inert whenever
    # `max_model_len` is smaller than the attention block size that vLLM auto-selects"; the PR that warns
    # (vllm-project/vllm#48402) measured "max_model_len 4096 (< block size 8320): prefix_cache_hits = 0".
    assert not _unit("nemotron-3-nano-30b-a3b", max_model_len=2096).hit_possible_within_max_model_len
    assert _unit("nemotron-3-nano-30b-a3b", max_model_len=2097).hit_possible_within_max_model_len


def test_cli_row_and_json(run_cli):
    out = run_cli("estimate", "--config", f"{DATA}/nemotron-3-nano-30b-a3b", "--seq-len", "8192", "--json")
    pc = json.loads(out.stdout)["prefix_cache"]
    assert pc["cache_hit_unit_tokens"] == 2096 and pc["min_prompt_tokens"] == 2097
    assert any("--block-size" in line for line in pc["what_if"])
    table = run_cli("estimate", "--config", f"{DATA}/nemotron-3-nano-30b-a3b", "--seq-len", "8192").stdout
    assert "prefix-cache unit" in table and "2,097+" in table
