"""The KV budget's rules per vLLM release (kvtool/estimate/reserve.py, serve_defaults.py), each against the release's
own source under vllm/ (unpacked by tests/support/fetch_vllm_sources.py), cited per test."""

from __future__ import annotations

import json
import re

import pytest

from kvtool.estimate import reserve
from kvtool.estimate.request import EstimateRequest, check_request
from kvtool.estimate.serve_defaults import ASYNC_SCHEDULING_RULES, BATCH_DEFAULTS_RULES, default_async_scheduling
from kvtool.estimate.vllm_versions import MODELLED_RELEASES, OLDEST_RELEASE

GIB = 1024**3
LLAMA_VOCAB = 128_256  # huggingface.co/meta-llama/Llama-3.1-8B-Instruct config.json vocab_size

TABLES = {
    "SAMPLER_RULES": reserve.SAMPLER_RULES,
    "NON_TORCH_RULES": reserve.NON_TORCH_RULES,
    "CUDAGRAPH_RULES": reserve.CUDAGRAPH_RULES,
    "BATCH_DEFAULTS_RULES": BATCH_DEFAULTS_RULES,
    "ASYNC_SCHEDULING_RULES": ASYNC_SCHEDULING_RULES,
}


@pytest.mark.parametrize("table", TABLES)
def test_every_row_names_its_upstream_function_at_its_release(table):
    rows = TABLES[table]
    assert rows[0].since == OLDEST_RELEASE  # every modelled release has a row
    for row in rows:
        assert row.since in MODELLED_RELEASES
        assert re.fullmatch(r"vllm/\S+\.py \S+ \((\d+\.\d+\.\d+)\)", row.source), row.source
        assert row.source.endswith(f"({row.since})")


def _budget(run_cli, version: str, *extra: str) -> dict:
    args = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-s", "8192", "--json"]
    result = run_cli(*args, "--vllm-version", version, *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_cuda_graphs_leave_the_budget_from_0_20(run_cli):
    # vllm/envs.py (0.19.1): VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "0", so determine_available_memory
    # (0.19.1) subtracts no estimate; (0.20.0) defaults to "1" and subtracts it (the 0.20.0 DGX Spark log of
    # tests/data/gpu-logs says "CUDA graph memory profiling is enabled ... equivalent to 0.8964 without").
    # 0.19.1 and 0.20.0 share every other rule (sampler, non-torch, batch defaults), so the budgets differ by
    # exactly the modelled pool: a dense model on one GPU at 512 capture sizes, 0.84 GiB (the median of the
    # "Estimated CUDA graph memory" that vLLM 0.19.0 H100 logs print, benchmarks/fit_reserve.py)
    old, new = _budget(run_cli, "0.19.1"), _budget(run_cli, "0.20.0")
    assert old["kv_budget_bytes"] - new["kv_budget_bytes"] == int(int(0.84 * GIB) * (0.1 + 0.9 * 1))
    # --enforce-eager captures no graphs: the same budget on both
    eager = [_budget(run_cli, v, "--enforce-eager")["kv_budget_bytes"] for v in ("0.19.1", "0.20.0")]
    assert eager[0] == eager[1] == old["kv_budget_bytes"]


@pytest.mark.parametrize("version", ["0.10.0", "0.11.0", "0.17.1", "0.18.0", "0.19.1"])
def test_no_release_before_0_20_subtracts_graphs(version):
    got = reserve.model_reserve(
        _llama_spec(), tp=1, max_num_batched_tokens=8192, max_num_seqs=1024, vllm_version=version
    )
    assert got.cudagraph_bytes == 0 and "not subtracted" in got.method


def _llama_spec():
    from kvtool.estimate.model import resolve_model

    return resolve_model(EstimateRequest(model="llama-3.1-8b")).spec


@pytest.mark.parametrize(
    ("version", "requests", "per_logit"),
    [
        # vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (0.16.0): always apply_top_k_top_p_pytorch
        # (a torch sort): 38.7 B per logit, fitted on the vLLM 0.11 H100 DEBUG tables
        ("0.16.0", 1024, 38.7),
        # (0.17.0): "if HAS_TRITON and logits.shape[0] >= 8: return apply_top_k_top_p_triton(...)", in place;
        # bf16 logits 2 B + float32 copy 4 B + softmax probs 4 B + exponential q 4 B = 14 B by the source, 14.4 B
        # fitted on vLLM 0.19.0 DEBUG logs (benchmarks/fit_reserve.py)
        ("0.17.0", 1024, 14.4),
        ("0.17.0", 4, 38.7),  # under 8 requests still the sort
        ("0.29.0", 7, 38.7),
        # (0.30.0): "if HAS_TRITON: return apply_top_k_top_p_triton(...)" at any batch
        ("0.30.0", 4, 14.4),
    ],
)
def test_the_sampler_peak_per_release(version, requests, per_logit):
    got = reserve.model_reserve(
        _llama_spec(), tp=1, max_num_batched_tokens=8192, max_num_seqs=requests, vllm_version=version
    )
    # from 0.17 the dummy forward's hidden states and residual stay alive beside the sampler: 2 x 8,192 tokens x
    # 4,096 hidden x 2 B (bf16)
    resident = 2 * 8192 * 4096 * 2 if version >= "0.17" else 0
    assert got.sampler_bytes == int(per_logit * requests * LLAMA_VOCAB) + resident


def test_the_sampler_does_not_shrink_with_tp():
    # vLLM 0.11 H100 DEBUG tables (tests/data/gpu-logs/qwen3-32b-h100-tp1, -tp2): 5.64 GiB activation at TP 1 and
    # TP 2 alike (compute_logits gathers the whole vocabulary on every rank)
    one, two = (
        reserve.model_reserve(_llama_spec(), tp=tp, max_num_batched_tokens=8192, max_num_seqs=1024) for tp in (1, 2)
    )
    assert one.sampler_bytes == two.sampler_bytes


@pytest.mark.parametrize(
    ("version", "pp", "expected"),
    [
        ("0.13.0", 1, False),  # vllm/config/scheduler.py SchedulerConfig (0.13.0): async_scheduling: bool = False
        ("0.14.0", 1, True),  # vllm/config/vllm.py VllmConfig.__post_init__ (0.14.0): None -> True
        ("0.14.1", 2, False),  # ... unless pipeline_parallel_size > 1
        ("0.15.0", 2, True),  # (0.15.0): PP no longer an exception
        ("0.31.0", 2, False),  # (0.31.0): PP with the V1 model runner is again
        ("0.32.0", 2, False),
        ("0.33.0", 2, True),  # (0.33.0): not any more
        ("0.33.0", 1, True),
    ],
)
def test_the_async_scheduling_default_per_release(version, pp, expected):
    assert default_async_scheduling(version, pp) is expected
    checked = check_request(EstimateRequest(model="x", vllm_version=version, pp=pp))
    assert checked.async_scheduling is expected
    # a choice the user made stands
    assert check_request(EstimateRequest(model="x", vllm_version=version, async_scheduling=True)).async_scheduling


def test_the_async_default_sizes_sliding_windows(run_cli):
    # gpt-oss-20b's sliding layers hold blocks for max_in_flight_tokens = max_num_batched_tokens x (pp + 1) with
    # async scheduling, x pp without (VllmConfig.max_in_flight_tokens, from 0.26.0: capacity.IN_FLIGHT_RULES).
    # vllm/config/vllm.py VllmConfig.__post_init__ (0.32.0) leaves async scheduling off at PP > 1 (V1 model
    # runner), (0.33.0) turns it on: at --pp 2 the 0.32 default is --no-async-scheduling's count
    args = ["estimate", "--model", "gpt-oss-20b", "--kv-memory", "20GiB", "-s", "65536", "--json", "--pp", "2"]
    args += ["--max-num-batched-tokens", "8192"]

    def concurrency(*extra: str) -> float:
        result = run_cli(*args, *extra)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["max_concurrency"]

    default_032 = concurrency("--vllm-version", "0.32.0")
    assert default_032 == concurrency("--vllm-version", "0.32.0", "--no-async-scheduling")
    assert concurrency("--vllm-version", "0.32.0", "--async-scheduling") < default_032
    assert concurrency("--vllm-version", "0.33.0") == concurrency("--vllm-version", "0.33.0", "--async-scheduling")
