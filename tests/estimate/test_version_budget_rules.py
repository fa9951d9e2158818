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
        # (a torch sort): 38.6 B per logit, fitted on the vLLM 0.11 H100 DEBUG tables
        ("0.16.0", 1024, 38.6),
        # (0.17.0): "if HAS_TRITON and logits.shape[0] >= 8: return apply_top_k_top_p_triton(...)", in place;
        # bf16 logits 2 B + float32 copy 4 B + softmax probs 4 B + exponential q 4 B = 14 B by the source, 14.3 B
        # fitted on vLLM 0.19.0 DEBUG logs (benchmarks/fit_reserve.py)
        ("0.17.0", 1024, 14.3),
        ("0.17.0", 4, 38.6),  # under 8 requests still the sort
        ("0.29.0", 7, 38.6),
        # (0.30.0): "if HAS_TRITON: return apply_top_k_top_p_triton(...)" at any batch
        ("0.30.0", 4, 14.3),
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


# --- the model runner (kvtool/estimate/model_runner.py) ---------------------------------------------------------


def _arch_spec(architectures: tuple[str, ...], **changes):
    import dataclasses

    return dataclasses.replace(_llama_spec(), architectures=architectures, **changes)


@pytest.mark.parametrize(
    ("version", "architectures", "experts", "expected"),
    [
        # vllm/envs.py (0.21.0): VLLM_USE_V2_MODEL_RUNNER defaults to "0": V1 for every model
        ("0.21.0", ("Qwen3ForCausalLM",), None, "V1"),
        # vllm/config/vllm.py (0.22.0): DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = {"Qwen3ForCausalLM"}, not is_moe
        ("0.22.0", ("Qwen3ForCausalLM",), None, "V2"),
        ("0.22.1", ("LlamaForCausalLM",), None, "V1"),
        # (0.23.0): Llama and Mistral join the list
        ("0.23.0", ("LlamaForCausalLM",), None, "V2"),
        ("0.23.0", ("Qwen2ForCausalLM",), None, "V1"),
        # (0.24.0): Qwen2MoeForCausalLM listed, the MoE condition dropped
        ("0.24.0", ("Qwen2MoeForCausalLM",), 60, "V2"),
        ("0.24.0", ("Qwen3MoeForCausalLM",), 128, "V1"),
        # (0.25.0): "... or not model_config.is_moe": any dense model; an unlisted MoE stays on V1
        ("0.25.0", ("Qwen2ForCausalLM",), None, "V2"),
        ("0.28.0", ("Qwen3MoeForCausalLM",), 128, "V1"),
        # (0.29.0): use_v2_model_runner is True for every model
        ("0.29.0", ("Qwen3MoeForCausalLM",), 128, "V2"),
        ("0.33.0", ("GptOssForCausalLM",), 32, "V2"),
    ],
)
def test_the_default_runner_per_release(version, architectures, experts, expected):
    from kvtool.estimate.model_runner import default_runner

    spec = _arch_spec(architectures, num_experts=experts)
    assert default_runner(spec, version).runner == expected


def test_a_quantized_model_stays_on_v1_where_the_list_asks_for_unquantized():
    # vllm/config/vllm.py _is_default_v2_model_runner_model (0.23.0): "not model_config.is_moe and not
    # model_config.is_quantized"; (0.24.0) drops the condition
    from kvtool.estimate.model_runner import default_runner
    from kvtool.estimate.quant import online

    spec = _arch_spec(("LlamaForCausalLM",), weight_quant=online("fp8"))
    assert default_runner(spec, "0.23.0").runner == "V1"
    assert default_runner(spec, "0.24.0").runner == "V2"


def test_model_runner_rows_name_their_source():
    from kvtool.estimate.model_runner import MODEL_RUNNER_RULES, V2_RESERVE_RULES

    for rows in (MODEL_RUNNER_RULES, V2_RESERVE_RULES):
        for row in rows:
            assert row.since in MODELLED_RELEASES
            assert re.match(r"vllm/\S+\.py \S+", row.source), row.source


def test_v2_before_0_29_takes_no_graph_memory_and_profiles_a_greedy_sampler():
    # vllm/v1/worker/gpu/model_runner.py (0.27.1): profile_cudagraph_memory returns 0; _dummy_sampler_run's dummy
    # requests were never added (temperature 0, top_k = vocab, top_p = 1), so Sampler keeps the bf16 logits only,
    # plus gumbel_sample's int64 + float32 per 1024 logits: 2 + 12 / 1024 = 2.01171875 B per logit.
    # Llama-3.1-8B, 1024 requests x 128,256 vocab: 1024 x 128,256 x 2.01171875 = 264,207,360 B; + 2 resident
    # hidden copies 2 x 8192 x 4096 x 2 = 134,217,728 B: 398,425,088 B.
    v2 = reserve.model_reserve(
        _arch_spec(("LlamaForCausalLM",)),
        tp=1,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        vllm_version="0.27.1",
        model_runner="V2",
    )
    assert v2.cudagraph_bytes == 0 and v2.model_runner == "V2"
    assert v2.sampler_bytes == 264_207_360 + 134_217_728
    # V1 on the same release subtracts the graph pool (0.20.0 on): V2's budget is larger by exactly that
    v1 = reserve.model_reserve(
        _arch_spec(("LlamaForCausalLM",)), tp=1, max_num_batched_tokens=8192, max_num_seqs=1024, vllm_version="0.27.1"
    )
    assert v1.cudagraph_bytes > 0 and v1.model_runner == "V1"
    # from 0.29.0 V2 measures the graphs (cudagraph_utils.py profile_cudagraph_memory), modelled as V1's estimate
    late = reserve.model_reserve(
        _arch_spec(("LlamaForCausalLM",)),
        tp=1,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        vllm_version="0.29.0",
        model_runner="V2",
    )
    assert late.cudagraph_bytes == v1.cudagraph_bytes


def test_v2_0_33_profiles_the_warmup_sampler_like_v1():
    # vllm/v1/worker/gpu/model_runner.py _dummy_sampler_run (0.33.0): a second pass with
    # SamplingParams.for_sampler_warmup "pays for the fp32 logits pipeline": V1's per-logit figure
    args = dict(tp=1, max_num_batched_tokens=8192, max_num_seqs=1024, vllm_version="0.33.0")
    v2 = reserve.model_reserve(_arch_spec(("LlamaForCausalLM",)), model_runner="V2", **args)
    v1 = reserve.model_reserve(_arch_spec(("LlamaForCausalLM",)), model_runner="V1", **args)
    assert v2.activation_bytes == v1.activation_bytes and v2.cudagraph_bytes == v1.cudagraph_bytes


def _wsl(run_cli, name: str, util: str, seq_len: str, *extra: str) -> dict:
    from tests.support import DATA

    args = ["estimate", "--config", str(DATA / "gpu-logs" / name), "--gpu-memory", "23.99GiB", "--json"]
    args += ["--gpu-memory-utilization", util, "-s", seq_len, "--vllm-version", "0.27.1", *extra]
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("name", "util", "seq_len", "logged_kv_gib"),
    [
        # tests/data/gpu-logs/qwen2.5-0.5b-4090-wsl-v0.27.1/log.txt: "[model_runner.py:329] Model loading took 0.93
        # GiB" (V2's file), "Available KV cache memory: 20.52 GiB", hint line "0.31 GiB for peak activation, and 0.0
        # GiB for CUDAGraph memory". By hand (vllm serve defaults on a 24 GiB GPU: 2048 tokens, 256 requests):
        # 0.92 x 23.99 = 22.07 GiB; weights 988,065,536 B = 0.92 GiB; activation max(forward 2048 x (3 x 4864 +
        # 4 x 896) x 2 = 74,448,896 B, sampler 256 x 151,936 x 2.01171875 + 2 x 2048 x 896 x 2 = 85,587,072 B) =
        # 0.080 GiB; non-torch 0.25 GiB; graphs 0: 22.07 - 0.92 - 0.08 - 0.25 = 20.82 GiB, 0.30 above the logged
        # 20.52 (the run was LLM() at 8192 tokens, logging 0.31 GiB activation + 0.30 non-torch).  V1's rules
        # (14.4 B per logit, 0.84 GiB graphs subtracted) said 19.53 GiB, 0.99 below.
        ("qwen2.5-0.5b-4090-wsl-v0.27.1", "0.92", "32768", 20.52),
        # ...-mml2048-v0.27.1: 0.85 x 23.99 = 20.39; 20.39 - 0.92 - 0.08 - 0.25 = 19.14 GiB against the logged 18.65
        # (it logs 0.25 activation and 1.49 - 0.93 = 0.56 GiB non-torch); V1's rules said 17.85, 0.80 below
        ("qwen2.5-0.5b-instruct-4090-wsl-mml2048-v0.27.1", "0.85", "2048", 18.65),
    ],
)
def test_v2_budget_on_the_0_27_1_logs(run_cli, name, util, seq_len, logged_kv_gib):
    out = _wsl(run_cli, name, util, seq_len)
    assert out["model_runner"] == "V2" and out["cudagraph_bytes"] == 0
    assert out["activation_bytes"] == 85_587_072
    budget_gib = out["kv_budget_bytes"] / GIB
    assert abs(budget_gib - logged_kv_gib) <= 0.5
    # forcing V1 (VLLM_USE_V2_MODEL_RUNNER=0) brings back V1's graph pool and sampler, and the ~1 GiB gap
    v1 = _wsl(run_cli, name, util, seq_len, "--model-runner", "v1")
    assert v1["model_runner"] == "V1" and v1["cudagraph_bytes"] > 0
    assert budget_gib - v1["kv_budget_bytes"] / GIB > 0.7


def test_model_runner_option_is_checked(run_cli):
    result = run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--model-runner", "v3")
    assert result.exit_code != 0 and "--model-runner" in result.stderr and "Traceback" not in result.stderr
    old = run_cli(
        "estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--vllm-version", "0.11.0", "--model-runner", "v2"
    )
    assert old.exit_code != 0 and "no Model Runner V2" in old.stderr
