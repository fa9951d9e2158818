"""kvtool plan against estimate run candidate by candidate, a hand-checked case, and the auto-fit length."""

from __future__ import annotations

import dataclasses

import pytest

from kvtool.core.errors import UsageError
from kvtool.estimate.estimator import estimate
from kvtool.estimate.request import EstimateRequest
from kvtool.plan.candidates import Workload, build_grid
from kvtool.plan.search import PlanRequest, candidate_request, plan_deployments
from tests.support import DATA

GPUS = ("H100-80GB", "L40S", "A100-80GB")


QWEN36 = str(DATA / "gpu-logs" / "qwen3.6-27b-int4-3090-tp2-v0.20.1")  # a hybrid with an MTP layer
MTP = '{"method": "mtp", "num_speculative_tokens": 3}'


@pytest.mark.parametrize(
    ("model", "workload", "kv_dtypes", "pps", "terms"),
    [
        ("llama-3.1-70b", Workload(64, 16384, "hand"), ("auto", "fp8"), (1, 2), {}),  # GQA, pipeline stages
        ("gemma-3-27b", Workload(16, 32768, "hand"), ("auto", "fp8"), (1,), {}),  # sliding + full groups
        ("qwen2.5-7b", Workload(128, 8192, "hand"), ("auto", "fp8"), (1,), {}),  # 28 heads: tp 8 refused
        # the memory terms ride in the base request: LoRA's buffers, an MTP drafter's KV layer, state blocks and
        # weights (pp 2 is refused with --speculative-config, as estimate refuses it)
        ("llama-3.1-8b", Workload(64, 32768, "hand"), ("auto",), (1,), {"enable_lora": True, "max_loras": 4}),
        (None, Workload(4, 65536, "hand"), ("auto", "fp8"), (1, 2), {"config": QWEN36, "speculative_config": MTP}),
    ],
)
def test_plan_fits_exactly_where_estimate_says_it_fits(model, workload, kv_dtypes, pps, terms):
    # the independent reference is estimate() itself, run from scratch for every candidate as a user would
    grid = build_grid(GPUS, (1, 2, 4, 8), pps, kv_dtypes, (0.85, 0.9, 0.95), (None,))
    assert len(grid.candidates) >= 27
    base = EstimateRequest(model=model, **terms)
    result = plan_deployments(PlanRequest(base, workload, grid))
    planned = {(r.gpu, r.tp, r.pp, r.kv_dtype, r.gpu_memory_utilization): r for r in result.rows}
    expected = {}
    for candidate in grid.candidates:
        try:
            r = estimate(candidate_request(base, workload, candidate))
        except UsageError:  # vLLM refuses the parallelism (qwen2.5-7b's 28 heads at tp 8): nothing fits
            continue
        if r.fits:
            expected[(r.gpu, r.tp, r.pp, r.kv_dtype, r.gpu_memory_utilization)] = r
    assert planned.keys() == expected.keys()
    assert expected  # the grid has fitting and non-fitting candidates
    assert result.candidates > len(expected)
    for key, row in planned.items():
        r = expected[key]
        figures = (r.kv_budget_bytes, r.num_blocks, r.blocks_per_request, r.max_concurrency, r.max_batch)
        assert (row.kv_budget_bytes, row.num_blocks, row.blocks_per_request, row.max_concurrency, row.max_batch) == (
            figures
        )
        assert row.vllm_logged_tokens == r.vllm_logged_tokens
        assert row.max_num_seqs == r.max_num_seqs


def test_rows_are_cheapest_first():
    grid = build_grid(GPUS, (1, 2, 4, 8), (1,), ("auto", "fp8"), (0.9,), (None,))
    rows = plan_deployments(PlanRequest(EstimateRequest(model="llama-3.1-8b"), Workload(8, 8192, "x"), grid)).rows
    keys = [(r.num_gpus, r.idle_kv_bytes) for r in rows]
    assert keys == sorted(keys)
    assert rows[0].num_gpus == 1


def test_hand_checked_manual_budget_case():
    # llama-3.1-8b (config.json: 32 layers, 8 KV heads, head_dim 128, bf16): one token of one layer on one GPU is
    # 2 x 8 x 128 x 2 B = 4,096 B; a 16-token block of one layer 65,536 B, of all 32 layers 2,097,152 B (2 MiB).
    # 4 requests of 8,192 tokens need 4 x 512 blocks + the null block = 2,049 blocks.
    grid = build_grid(("H100-80GB",), (1,), (1,), ("auto",), (0.9,), (None,))
    result = plan_deployments(PlanRequest(EstimateRequest(model="llama-3.1-8b"), Workload(4, 8192, "x"), grid))
    (row,) = result.rows
    assert row.num_blocks == row.kv_budget_bytes // 2_097_152
    assert row.blocks_per_request == 512
    assert row.max_batch == (row.num_blocks - 1) // 512
    assert row.margin_requests == row.max_batch - 4
    assert row.idle_kv_bytes == row.kv_budget_bytes - 2_049 * 2_097_152
    # vLLM's auto-fit: the whole 131,072-token context is 8,192 blocks, far below num_blocks
    assert row.max_model_len_auto == 131_072
    gib = round(row.kv_budget_bytes / 1024**3, 2)
    assert row.vllm_log.startswith(f"Available KV cache memory: {gib} GiB; KV cache size: ")


def test_auto_fit_is_the_longest_length_whose_blocks_fit_without_the_null_block():
    # llama-3.1-70b at tp 2 on H100-80GB: the pool holds fewer blocks than the 131,072-token context needs; vLLM's
    # _estimate_max_model_len_from_groups keeps the largest S with cdiv(S, 16) <= num_blocks, so S = 16 x num_blocks
    grid = build_grid(("H100-80GB",), (2,), (1,), ("auto",), (0.9,), (None,))
    result = plan_deployments(PlanRequest(EstimateRequest(model="llama-3.1-70b"), Workload(1, 1024, "x"), grid))
    (context,) = result.longest_context
    row = result.rows[0]
    assert 0 < row.num_blocks * 16 < 131_072
    assert context.max_model_len_auto == row.max_model_len_auto == 16 * row.num_blocks
    assert not context.full_context


def test_auto_fit_is_none_before_vllm_0_14():
    # vLLM 0.13.0's ModelConfig takes no max_model_len -1 / auto (auto-fit arrived in 0.14.0's kv_cache_utils.py)
    grid = build_grid(("H100-80GB",), (1,), (1,), ("auto",), (0.9,), (None,))
    base = EstimateRequest(model="llama-3.1-8b", vllm_version="0.13.0")
    result = plan_deployments(PlanRequest(base, Workload(1, 1024, "x"), grid))
    assert result.rows[0].max_model_len_auto is None
    assert result.longest_context == ()


def test_a_tp_vllm_refuses_is_reported_not_tried():
    # qwen2.5-7b: 28 attention heads; tp 8 does not divide them (vllm/config/model.py verify_with_parallel_config)
    grid = build_grid(("H100-80GB", "L40S"), (1, 8), (1,), ("auto",), (0.9,), (None,))
    result = plan_deployments(PlanRequest(EstimateRequest(model="qwen2.5-7b"), Workload(1, 1024, "x"), grid))
    (refused,) = result.refused
    assert (refused.tp, refused.candidates) == (8, 2)
    assert "does not divide the 28 attention heads" in refused.reason
    assert result.candidates == 2


def test_top_keeps_the_cheapest_and_counts_all():
    grid = build_grid(GPUS, (1, 2), (1,), ("auto",), (0.9,), (None,))
    request = PlanRequest(EstimateRequest(model="llama-3.1-8b"), Workload(1, 1024, "x"), grid)
    full = plan_deployments(request)
    top = plan_deployments(dataclasses.replace(request, top=2))
    assert top.fitting == full.fitting > 2
    assert top.rows == full.rows[:2]
