"""--mamba-cache-mode / --mamba-block-size and the hybrid prefix-caching default, against vLLM's source rules by
hand (kvtool.estimate.hybrid_block) and public logs of the attention block vLLM chose."""

from __future__ import annotations

import json

import pytest

from kvtool.estimate.vllm_args import parse_vllm_serve

DATA = "tests/data/estimate"
NEMOTRON = f"{DATA}/nemotron-3-nano-30b-a3b"


def _est(run_cli, config, *args):
    r = run_cli("estimate", "--config", config, "--json", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


# Nemotron-3-Nano-30B-A3B (tests/data/estimate): 6 attention + 23 Mamba-2 layers; one state 2,134,016 B = 2,084
# tokens of a 1,024 B/token attention page; chunk_size 128.  Groups of 6 layers (23 >= 1.5 x 6): 1 attention
# group + cdiv(23, 6) = 4 Mamba groups.  At 8,192 tokens on 0.27.1:
#   default (prefix caching opt-in for hybrids): block 16 x cdiv(2,084, 16) = 2,096; cdiv(8,192, 2,096) = 4
#     + 4 groups x 1 state block = 8
#   --enable-prefix-caching ('all' for NemotronH): block 128 x cdiv(2,084, 128) = 2,176; 4 + 4 x cdiv(8,192, 2,176)
#     = 4 + 16 = 20 (MambaSpec.max_memory_usage_bytes 'all': cdiv(max_model_len, block_size))
#   --mamba-cache-mode align: 2,096; 4 + 4 x 2 = 12
#   --mamba-block-size 64 ('all'): 64 x cdiv(2,084, 64) = 2,112; 4 + 4 x 4 = 20
@pytest.mark.parametrize(
    ("args", "block", "per_request"),
    [
        ((), 2096, 8),
        (("--enable-prefix-caching",), 2176, 20),
        (("--enable-prefix-caching", "--mamba-cache-mode", "align"), 2096, 12),
        (("--enable-prefix-caching", "--mamba-block-size", "64"), 2112, 20),
    ],
)
def test_mamba_settings_change_the_capacity_by_hand(run_cli, args, block, per_request):
    out = _est(run_cli, NEMOTRON, "--kv-memory", "10GiB", "--seq-len", "8192", "--vllm-version", "0.27.1", *args)
    assert (out["block_size"], out["blocks_per_request"]) == (block, per_request)
    assert out["prefix_cache"]["attention_block_size_tokens"] == block  # one rule for both


def test_the_newest_release_aligns_by_default(run_cli):
    # 0.28.0+: prefix caching on for hybrids; 0.32.0+: 'align' only -> 2,096-token blocks, 4 + 4 x 2 = 12
    out = _est(run_cli, NEMOTRON, "--kv-memory", "10GiB", "--seq-len", "8192", "--vllm-version", "0.33.0")
    assert (out["block_size"], out["blocks_per_request"], out["prefix_cache"]["min_prompt_tokens"]) == (2096, 12, 2097)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--vllm-version", "0.14.1", "--mamba-cache-mode", "align"), "vLLM 0.14.1 has no --mamba-cache-mode"),
        (("--vllm-version", "0.32.0", "--mamba-cache-mode", "all"), "vLLM 0.32.0 takes align, none"),
        (("--vllm-version", "0.11.0", "--mamba-block-size", "128"), "vLLM 0.11.0 has no --mamba-block-size"),
        (("--no-enable-prefix-caching", "--mamba-block-size", "128"), "can only be set with --enable-prefix-caching"),
    ],
)
def test_options_a_release_lacks_are_refused(run_cli, args, said):
    r = run_cli("estimate", "--config", NEMOTRON, "--seq-len", "8192", *args)
    assert r.exit_code != 0 and said in r.stderr and "Traceback" not in r.stderr


def test_the_vllm_serve_line_reads_the_mamba_flags():
    line = parse_vllm_serve(
        ["vllm", "serve", "m", "--enable-prefix-caching", "--mamba-cache-mode", "align", "--mamba-block-size", "256"]
    )
    assert line.values() == {"model": "m", "prefix_caching": True, "mamba_cache_mode": "align", "mamba_block_size": 256}


def test_the_vllm_serve_line_sizes_with_them(run_cli):
    # as the --enable-prefix-caching --mamba-cache-mode align row above: 2,096-token blocks, 12 a request
    r = run_cli(
        "estimate", "--kv-memory", "10GiB", "--vllm-version", "0.27.1", "--json", "--",
        "vllm", "serve", NEMOTRON, "--max-model-len", "8192", "--enable-prefix-caching", "--mamba-cache-mode", "align",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["block_size"], out["blocks_per_request"]) == (2096, 12)


def test_report_40696_qwen3_5_4b_528_tokens_on_0_19_1(run_cli):
    # https://github.com/vllm-project/vllm/issues/40696 (vLLM 0.19.1, Qwen/Qwen3.5-4B): "INFO [config.py:281]
    # Setting attention block size to 528 tokens to ensure that attention page size is >= mamba page size."
    # By hand: Gated DeltaNet state = conv 3 x (2 x 16 x 128 + 32 x 128) x 2 B (bf16: vLLM downcasts the float32
    # copy) + 32 x 128 x 128 x 4 B (mamba_ssm_dtype float32) = 49,152 + 2,097,152 = 2,146,304 B; attention 2 x 4 KV
    # heads x 256 x 2 B = 4,096 B per token; 16 x cdiv(2,146,304, 16 x 4,096) = 16 x 33 = 528.
    for args in ((), ("--enable-prefix-caching",)):
        pc = _est(run_cli, f"{DATA}/qwen3.5-4b", "--seq-len", "8192", "--vllm-version", "0.19.1", *args)["prefix_cache"]
        assert pc["attention_block_size_tokens"] == 528
    # the point: with prefix caching a prompt needs 529+ tokens sharing its first 528 to hit
    assert (pc["mamba_cache_mode"], pc["min_shared_prefix_tokens"], pc["min_prompt_tokens"]) == ("align", 528, 529)


def test_report_rocm_5590_granite_4_0_h_small_528_tokens_prefix_caching_off_on_0_11_1(run_cli):
    # https://github.com/ROCm/ROCm/issues/5590 (vllm serve ibm-granite/granite-4.0-h-small, no cache flags, vLLM
    # 0.11.1rc6.dev115): "Setting attention block size to 528 tokens" and the engine config
    # "enable_prefix_caching=False": 0.11.1 keeps prefix caching opt-in for hybrids (default_prefix_caching = not
    # is_hybrid), so kvtool says no prefix caching, and the block of the non-'all' formula, 528.
    pc = _est(run_cli, f"{DATA}/granite-4.0-h-small", "--seq-len", "131072", "--vllm-version", "0.11.1")
    assert pc["prefix_cache"]["attention_block_size_tokens"] == 528
    assert pc["prefix_cache"]["prefix_caching"] is False and pc["prefix_cache"]["min_prompt_tokens"] is None
