"""`kvtool estimate` against real vLLM start-up logs from real GPUs (tests/data/gpu-logs, sources in each case).

Every case runs under the vLLM release it logged (``--vllm-version`` from case.yaml's ``vllm_version:``) with the
engine arguments it logged (vLLM's flag names, which estimate takes), so the release's rules apply.  From scratch
(model config + GPU memory + engine arguments): the KV budget per GPU within 0.5 GiB of the logged "Available KV
cache memory", within 0.25 GiB and the token count within 0.5 % at the median (the issue's target).  Given the logged
budget (printed to two decimals of GiB, so known to +-0.005 GiB): kvtool's token count and concurrency at the low and
high ends of that interval bracket the logged "GPU KV cache size" and "Maximum concurrency".
The logged figures are read from case.yaml, copied from the public logs, never from kvtool's output.

A case kvtool cannot size is kept (explain reads its log) and left out here, with its reason in case.yaml:
no config.json (``config_source: not found``), ``from_scratch: false`` (weights or reserve not knowable from the
config: custom quantization, encoders, an unknown device total), ``sizing_not_modelled:`` (speculative-decoding
drafters, per-layer KV sharing ...).  The counts of cases left out are checked too, so a case cannot drop out
silently.
"""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from tests.support import DATA

LOGS = DATA / "gpu-logs"
CASES = sorted(p.name for p in LOGS.iterdir() if (p / "case.yaml").is_file())
GIB = 1024**3

# the engine arguments a case may log, as estimate's flags (vLLM's names)
_VALUE_FLAGS = ("max_num_seqs", "max_num_batched_tokens", "dtype")
_ONLINE_QUANTIZATION = ("fp8", "bitsandbytes")  # what --quantization does to an unquantized checkpoint
_BOOL_FLAGS = ("enforce_eager", "enable_prefix_caching", "async_scheduling")


def _case(name: str) -> dict:
    return yaml.safe_load((LOGS / name / "case.yaml").read_text(encoding="utf-8"))


def _engine_flags(case: dict, name: str) -> list[str]:
    engine = case.get("engine_args") or {}
    flags: list[str] = []
    for key in _VALUE_FLAGS:
        if engine.get(key) is not None:
            flags += [f"--{key.replace('_', '-')}", str(engine[key])]
    if engine.get("quantization") in _ONLINE_QUANTIZATION:  # a quantized checkpoint's own config says the rest
        flags += ["--quantization", engine["quantization"]]
    for key in _BOOL_FLAGS:
        if key in engine:
            flags.append(f"--{'' if engine[key] else 'no-'}{key.replace('_', '-')}")
    if engine.get("speculative_config"):  # vLLM's JSON, as the log's non-default args give it
        speculative = dict(engine["speculative_config"])
        if case.get("draft_config"):  # the drafter's config.json kept beside the case, for the log's drafter path
            speculative["model"] = str(LOGS / name / case["draft_config"])
        flags += ["--speculative-config", json.dumps(speculative)]
    return flags


def _estimate(run_cli, name: str, *args: str) -> dict:
    case = _case(name)
    base = ["estimate", "--config", str(LOGS / name), "--seq-len", str(case["seq_len"])]
    base += ["--block-size", str(case.get("block_size", 16)), "--tp", str(case.get("tp", 1)), "--json"]
    base += ["--pp", str(case.get("pp", 1)), "--vllm-version", str(case["vllm_version"])]
    if case.get("kv_dtype"):
        base += ["--kv-dtype", case["kv_dtype"]]
    result = run_cli(*base, *_engine_flags(case, name), *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _gpu_args(case: dict) -> list[str]:
    """The device as the log gives it (its printed total), else the GPU profile the case names."""
    if case.get("gpu_memory_gib"):
        args = ["--gpu-memory", f"{case['gpu_memory_gib']}GiB"]
    else:
        args = ["--gpu", case["gpu_profile"]]
    return args + ["--gpu-memory-utilization", str(case.get("gpu_memory_utilization", 0.9))]


def _budget_gib(case: dict, out: dict) -> float:
    """The budget of the rank the case logged: the pool's (the least) unless it names a pipeline stage."""
    if case.get("logged_stage") is not None:
        return out["stages"][case["logged_stage"]]["kv_budget_bytes"] / GIB
    return out["kv_budget_bytes"] / GIB


def _from_scratch(run_cli, name: str) -> float:
    case = _case(name)
    out = _estimate(run_cli, name, *_gpu_args(case))
    return _budget_gib(case, out) - case["logged"]["kv_gib"]


def _has_config(name: str) -> bool:
    return (LOGS / name / "config.json").is_file()


SIZED = [c for c in CASES if _has_config(c) and not _case(c).get("sizing_not_modelled")]
SCRATCH = [
    c
    for c in SIZED
    if _case(c).get("from_scratch", True) and (_case(c).get("gpu_memory_gib") or _case(c).get("gpu_profile"))
]
WEIGHTS = [c for c in SCRATCH if "weights_gib" in _case(c)["logged"]]
TOKENS = [c for c in SIZED if "tokens" in _case(c)["logged"]]


def test_the_cases_cover_the_issue_evidence():
    # issue 26: at least 40 public logs from real GPUs, across at least 8 releases and 6 GPU kinds
    releases = {str(_case(c)["vllm_version"]) for c in CASES}
    gpus = {str(_case(c).get("gpu_profile") or _case(c).get("gpu")) for c in CASES}
    assert len(CASES) >= 40 and len(releases) >= 8 and len(gpus) >= 6
    # and most of them are sized here: a case leaving the checks has to say why in its case.yaml
    assert len(TOKENS) >= 30 and len(SCRATCH) >= 15


def test_the_dflash_cases_are_sized_with_their_drafters():
    # issue 27: the three DFlash logs (two Qwen3.6-27B TP 2 composes, one Qwen3.6-35B-A3B) are sized from their
    # drafters' configs (case.yaml draft_config), no longer left out
    dflash = [
        c for c in CASES if (_case(c).get("engine_args") or {}).get("speculative_config", {}).get("method") == "dflash"
    ]
    assert len(dflash) == 3 and set(dflash) <= set(TOKENS)
    assert all(_case(c).get("draft_config") for c in dflash)


@pytest.mark.parametrize("name", [c for c in CASES if c not in SIZED])
def test_a_case_left_out_says_why(name):
    case = _case(name)
    assert case.get("sizing_not_modelled") or case.get("config_source", "").startswith("not found")


@pytest.mark.parametrize("name", CASES)
def test_every_case_names_a_modelled_release(name):
    # free text about the version lives under notes:, so --vllm-version can be passed as is
    from kvtool.estimate.vllm_versions import MODELLED_RELEASES

    assert str(_case(name)["vllm_version"]) in MODELLED_RELEASES


@pytest.mark.parametrize("name", WEIGHTS)
def test_weights_per_gpu_within_a_quarter_gib_of_model_loading_took(run_cli, name):
    # bf16, and MXFP4 experts for gpt-oss (kvtool.estimate.quant): the logged "Model loading took" per GPU
    case = _case(name)
    out = _estimate(run_cli, name, *_gpu_args(case))
    assert abs(out["weights_bytes_per_gpu"] / GIB - case["logged"]["weights_gib"]) <= 0.25


@pytest.mark.parametrize("name", SCRATCH)
def test_budget_from_scratch_within_half_a_gib(run_cli, name):
    assert abs(_from_scratch(run_cli, name)) <= 0.5


def test_budget_from_scratch_median_error_is_within_a_quarter_gib(run_cli):
    errors = [abs(_from_scratch(run_cli, name)) for name in SCRATCH]
    assert len(errors) >= 15 and statistics.median(errors) <= 0.25


@pytest.mark.parametrize("name", TOKENS)
def test_given_the_logged_budget_the_logged_token_count(run_cli, name):
    case = _case(name)
    logged = case["logged"]
    # the pool's budget: the logged one, or under PP the least stage's, which sizes every stage's pool
    kv_gib = case.get("pool_kv_gib", logged["kv_gib"])
    low = _estimate(run_cli, name, "--kv-memory", f"{kv_gib - 0.005:.3f}GiB")
    high = _estimate(run_cli, name, "--kv-memory", f"{kv_gib + 0.005:.3f}GiB")
    # each release's logged count (num_blocks // groups x block before 0.20.1, int(concurrency x max_model_len)
    # since); hybrid models hold fixed state blocks per request too
    assert low["vllm_logged_tokens"] <= logged["tokens"] <= high["vllm_logged_tokens"]
    if "block_size" in logged:  # the attention block vLLM chose to fit a state in one page
        assert low["block_size"] == logged["block_size"]
    if "concurrency" in logged:  # printed with two decimals
        printed = float(str(logged["concurrency"]).rstrip("x"))
        assert round(low["max_concurrency"], 2) - 0.01 <= printed <= round(high["max_concurrency"], 2) + 0.01


def test_token_count_from_scratch_within_half_a_percent_at_the_median(run_cli):
    # the token count from scratch against the count at the logged budget (whose own match with vLLM's logged
    # counts is checked above): the issue's "within 0.5 % at the median"
    errors = []
    for name in SCRATCH:
        case = _case(name)
        if case.get("logged_stage") is not None:
            continue  # the pool is the least stage's, the log gives one stage's budget
        scratch = _estimate(run_cli, name, *_gpu_args(case))["kv_cache_tokens"]
        given = _estimate(run_cli, name, "--kv-memory", f"{case['logged']['kv_gib']}GiB")["kv_cache_tokens"]
        errors.append(abs(scratch - given) / given)
    assert statistics.median(errors) <= 0.005
