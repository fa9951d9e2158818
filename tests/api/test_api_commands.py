"""kvtool.api.estimate, simulate and check_target against the CLI's --json on the same inputs, and the import rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

import kvtool
import kvtool.api
from kvtool.core.errors import UsageError
from tests.support import DATA, REPO_ROOT


def _json(run_cli, *args) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------------------------------- import


def test_import_kvtool_loads_no_heavy_module():
    code = (
        "import sys, kvtool, kvtool.api\n"
        "dir(kvtool); kvtool.analyze; kvtool.load_events; kvtool.check_target\n"
        "print([m for m in ('torch', 'pandas', 'numpy', 'matplotlib', 'pyarrow') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_top_level_exports_are_the_api():
    for name in ("analyze", "load_events", "check_target", "AnalyzeResult", "SimulateResult"):
        assert getattr(kvtool, name) is getattr(kvtool.api, name)
        assert name in dir(kvtool)
    assert kvtool.api.__all__ == sorted(kvtool.api._WHERE)  # every lazy name is public, and sorted
    # estimate and simulate are subpackages at the top level: the functions live in kvtool.api only
    import importlib

    package = importlib.import_module("kvtool.estimate")
    assert kvtool.estimate is package
    assert callable(kvtool.api.estimate) and callable(kvtool.api.simulate)
    with pytest.raises(AttributeError):
        kvtool.no_such_name  # noqa: B018


# ---------------------------------------------------------------------------------------------------- estimate


def test_estimate_is_the_seed_articles_figure():
    # seed article: 7B, MHA, FP16, 2048 tokens, batch 1: 2 x 32 x 32 x 2048 x 128 x 2 = 1,073,741,824 bytes
    result = kvtool.api.estimate("llama-2-7b", seq_len=2048, kv_dtype="fp16")
    assert result.kv_bytes == 2 * 32 * 32 * 2048 * 128 * 2


@pytest.mark.parametrize(
    ("kwargs", "argv"),
    [
        (
            {"model": "llama-2-7b", "seq_len": [1024, 4096], "batch": 8},
            ["--model", "llama-2-7b", "-s", "1024,4096", "-b", "8"],
        ),
        (
            {"model": "llama-3.1-8b", "gpu": "h100-80gb", "kv_dtype": "fp8", "compare": True},
            ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--kv-dtype", "fp8", "--compare"],
        ),
        (
            {"layers": 32, "kv_heads": 8, "head_dim": 128, "kv_memory": "10GiB", "block_size": 32},
            ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-memory", "10GiB", "--block-size", "32"],
        ),
        (
            {"config": str(DATA / "estimate" / "mistral-7b-v0.1"), "tp": 2},
            ["--config", str(DATA / "estimate" / "mistral-7b-v0.1"), "--tp", "2"],
        ),
        (  # the vLLM reserve and scheduler options
            {
                "model": "llama-3.1-70b",
                "gpu": "h100-80gb",
                "tp": 2,
                "pp": 2,
                "max_num_seqs": 128,
                "enforce_eager": True,
                "prefix_caching": False,
                "activation_memory": "3GiB",
                "quantization": "fp8",
            },
            [
                "--model",
                "llama-3.1-70b",
                "--gpu",
                "h100-80gb",
                "--tp",
                "2",
                "--pp",
                "2",
                "--max-num-seqs",
                "128",
                "--enforce-eager",
                "--no-enable-prefix-caching",
                "--activation-memory",
                "3GiB",
                "--quantization",
                "fp8",
            ],
        ),
    ],
)
def test_estimate_to_dict_equals_the_cli_json(run_cli, kwargs, argv):
    assert kvtool.api.estimate(**kwargs).to_dict() == _json(run_cli, "estimate", *argv)


def test_every_estimate_option_is_an_argument_of_the_api():
    # request_from() maps arguments by name: an option the API lacks (or names differently) would be a silent gap
    import dataclasses
    import inspect

    from kvtool.cli import build_app
    from kvtool.estimate.estimator import _FIELD_OF_OPTION, EstimateRequest

    fields = {f.name for f in dataclasses.fields(EstimateRequest)} - {"suggest"}  # internal: the fit suggestions
    renamed = {field: option for option, field in _FIELD_OF_OPTION.items()}
    options = {renamed.get(name, name) for name in fields}
    command = next(c for c in build_app("estimate").registered_commands if c.name == "estimate").callback
    assert options <= set(inspect.signature(command).parameters)
    assert options <= set(inspect.signature(kvtool.api.estimate).parameters)


def test_estimate_errors_are_the_clis(run_cli):
    with pytest.raises(UsageError) as err:
        kvtool.api.estimate("llama-2-7b", seq_len=0)
    cli = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "0")
    assert cli.stderr.splitlines()[0] == f"Error: {err.value.one_line()}"


# ---------------------------------------------------------------------------------------------------- simulate


def test_simulate_equals_the_cli_json(run_cli, tmp_path):
    trace = DATA / "simulate" / "generic-head20.csv"
    args = ["--block-size", "16,32", "--kv-tokens", "4096", "--serve", "--max-num-seqs", "8"]
    expected = _json(run_cli, "simulate", "--trace", trace, *args)
    result = kvtool.api.simulate(trace, block_size=[16, 32], kv_tokens=4096, serve=True, max_num_seqs=8)
    assert result.to_dict() == {k: v for k, v in expected.items() if k != "plots"}
    assert expected["plots"] == []
    assert result.table.index.tolist() == [16, 32]
    assert result.table.loc[32, "ttft_p99_s"] == expected["results"][1]["ttft_p99_s"]
    assert result.recommendations.objective.tolist() == [r["objective"] for r in expected["recommendations"]]


@pytest.mark.parametrize(
    ("kwargs", "argv"),
    [
        ({"block_size": [16, 32, 64], "kv_tokens": 500_000}, ["--block-size", "16,32,64", "--kv-tokens", "500000"]),
        (
            {"block_size": [16], "requests": 1500, "seed": 3, "serve": True, "qps": 20.0, "kv_tokens": 200_000},
            [
                "--block-size",
                "16",
                "--requests",
                "1500",
                "--seed",
                "3",
                "--serve",
                "--qps",
                "20",
                "--kv-tokens",
                "200000",
            ],
        ),
    ],
)
def test_simulate_on_the_real_azure_trace_equals_the_cli(run_cli, kwargs, argv):
    # the Azure LLM inference trace 2023, conversation, 19,366 requests (tests/data/simulate/README.md)
    trace = DATA / "simulate" / "azure-2023-conv.csv"
    expected = _json(run_cli, "simulate", "--trace", trace, *argv)
    result = kvtool.api.simulate(trace, **kwargs)
    assert result.to_dict() == {k: v for k, v in expected.items() if k != "plots"}
    assert result.table.index.tolist() == kwargs["block_size"]


def test_simulate_dataframe_trace_and_events(run_cli, tmp_path):
    """A DataFrame trace reads like its CSV; events(b) analyse like the --export-events file."""
    trace = DATA / "simulate" / "generic-head20.csv"
    frame = pd.read_csv(trace)
    from_file = kvtool.api.simulate(trace, block_size=[16], kv_tokens=4096, serve=True)
    from_frame = kvtool.api.simulate(frame, block_size=[16], kv_tokens=4096, serve=True)
    strip = ("source",)
    assert {k: v for k, v in from_frame.to_dict().items() if k not in strip} == {
        k: v for k, v in from_file.to_dict().items() if k not in strip
    }
    out = tmp_path / "events.csv"
    cli = run_cli(
        "simulate", "--trace", trace, "--block-size", "16", "--kv-tokens", "4096", "--serve", "--export-events", out
    )
    assert cli.exit_code == 0, cli.stderr
    expected = _json(run_cli, "analyze", out)
    got = kvtool.api.analyze(from_frame.events(16)).to_dict()
    assert {k: v for k, v in got.items() if k != "file"} == {k: v for k, v in expected.items() if k != "file"}
    with pytest.raises(UsageError, match="no serving simulation at block size 32"):
        from_frame.events(32)


def test_simulate_errors_are_the_clis(run_cli):
    cli = run_cli("simulate", "--dist", "fixed", "--length", "100", "--qps", "3")
    with pytest.raises(UsageError) as err:
        kvtool.api.simulate(dist="fixed", length=100, qps=3)
    assert cli.stderr.splitlines()[0] == f"Error: {err.value.one_line()}"
    with pytest.raises(UsageError, match="block sizes must be positive integers"):
        kvtool.api.simulate(dist="fixed", length=100, block_size=[0])


# ---------------------------------------------------------------------------------------------------- repro

TARGETS = DATA / "repro"


@pytest.fixture
def targets(monkeypatch):
    monkeypatch.syspath_prepend(str(TARGETS))
    sys.modules.pop("repro_targets", None)
    import repro_targets

    yield repro_targets
    sys.modules.pop("repro_targets", None)


def _stable(report: dict) -> dict:
    """The report without its timings (the run's and each check's elapsed_s)."""
    if isinstance(report, dict):
        return {k: _stable(v) for k, v in report.items() if k != "elapsed_s"}
    if isinstance(report, list):
        return [_stable(v) for v in report]
    return report


def test_check_target_equals_the_cli_json(run_cli, targets):
    expected = _json(run_cli, "repro", "--target", "repro_targets:correct", "--interleavings", "20")
    assert _stable(kvtool.api.check_target("repro_targets:correct", interleavings=20).to_dict()) == _stable(expected)
    # the factory itself and the module it makes: the same checks
    by_factory = kvtool.api.check_target(targets.correct, interleavings=20).to_dict()
    by_module = kvtool.api.check_target(targets.correct(), interleavings=20).to_dict()
    assert _stable(by_factory["target"]["checks"]) == _stable(expected["target"]["checks"])
    assert _stable(by_module["target"]["checks"]) == _stable(expected["target"]["checks"])
    # repro_targets.correct is a decorated closure (not importable by its qualname): registered under its name
    assert by_factory["target"]["target"] == "kvtool_api_targets:factory"
    assert by_module["target"]["target"].startswith("kvtool_api_targets:")


def test_target_spec_names_objects_as_the_cli_would():
    from kvtool.api._repro import target_spec

    assert target_spec("pkg.mod:make") == "pkg.mod:make"
    assert target_spec(json.dumps) == "json:dumps"  # importable by module:qualname: named so
    assert target_spec(lambda: None).startswith("kvtool_api_targets:")
    import kvtool_api_targets  # the registry is importable, so the CLI's loader finds what it names

    name = target_spec(lambda: None).split(":")[1]
    assert callable(getattr(kvtool_api_targets, name))


def test_check_target_finds_the_clis_bugs(run_cli, targets):
    expected = _json(run_cli, "repro", "--target", "repro_targets:scratch_alias", "--interleavings", "20")
    report = kvtool.api.check_target(targets.scratch_alias, interleavings=20)
    assert report.passed is False
    assert (
        list(report.target.failed_checks) == expected["target"]["failed_checks"] == ["isolation", "no-shared-storage"]
    )
    with pytest.raises(UsageError, match="--d-model must be positive"):
        kvtool.api.check_target(targets.correct, d_model=0)


def test_every_estimate_cli_option_is_an_argument_of_the_api():
    # the SGLang options (--engine, --mem-fraction-static, ...) are not EstimateRequest fields: checked by name here
    import inspect

    from kvtool.cli import build_app

    command = next(c for c in build_app("estimate").registered_commands if c.name == "estimate").callback
    cli = set(inspect.signature(command).parameters) - {"ctx", "vllm_line", "verbose", "json_output", "list_models"}
    assert cli <= set(inspect.signature(kvtool.api.estimate).parameters)


@pytest.mark.parametrize(
    ("kwargs", "argv"),
    [
        (
            {"model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": "sglang", "mem_fraction_static": 0.8},
            ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--engine", "sglang", "--mem-fraction-static", "0.8"],
        ),
        (
            {"model": "qwen2.5-7b", "gpu": "l4", "tp": 2, "engine": "vllm,sglang", "sglang_version": "0.4.6.post5"},
            [
                "-m",
                "qwen2.5-7b",
                "--gpu",
                "l4",
                "--tp-size",
                "2",
                "--engine",
                "vllm,sglang",
                "--sglang-version",
                "0.4.6.post5",
            ],
        ),
    ],
)
def test_sglang_estimate_equals_the_cli_json(run_cli, kwargs, argv):
    from kvtool.core.jsonable import to_jsonable

    assert to_jsonable(kvtool.api.estimate(**kwargs)) == _json(run_cli, "estimate", *argv)
