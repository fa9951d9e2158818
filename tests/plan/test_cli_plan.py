"""`kvtool plan` on the command line: --json, the trace form, bad input (one line, exit 2), no heavy imports."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_USAGE
from tests.support import heavy_modules_loaded_by

TRACE = "tests/data/simulate/azure-2023-code-head20.csv"


def test_json_lists_the_fitting_configurations(run_cli):
    result = run_cli(
        "plan", "-m", "llama-3.1-8b", "-n", "16", "--seq-len", "8192", "--gpu", "H100-80GB,L40S", "--tp", "1-4",
        "--kv-dtype", "auto,fp8", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["workload"] == {"concurrency": 16, "seq_len": 8192, "source": "--seq-len 8,192"}
    assert data["candidates"] == 2 * 3 * 2  # GPUs x tp 1, 2, 4 (the powers of two in 1-4) x KV dtypes
    assert data["fitting"] == len(data["rows"]) > 0
    assert all(row["fits"] and row["margin_requests"] >= 0 for row in data["rows"])
    assert data["rows"][0]["num_gpus"] == 1


def test_table_names_what_vllm_would_log(run_cli):
    result = run_cli("plan", "-m", "llama-3.1-8b", "-n", "4", "--seq-len", "4096", "--gpu", "L40S", "--tp", "1")
    assert result.exit_code == 0, result.stderr
    assert "1 of 1 configurations fit" in result.stdout
    assert "vLLM would log (L40S x1, tp 1, pp 1): Available KV cache memory:" in result.stdout


def test_trace_percentile_is_the_nearest_rank_length(run_cli):
    # the 20 requests' prompt + output tokens sorted: ..., 6994, 7435, 7445, 7447; p90 is the 18th (ceil(0.9 x 20))
    result = run_cli(
        "plan", "-m", "llama-3.1-8b", "-n", "2", "--trace", TRACE, "--percentile", "90", "--gpu", "L40S", "--tp",
        "1", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["workload"]["seq_len"] == 7435


def test_input_and_output_lengths_add_up(run_cli):
    result = run_cli(
        "plan", "-m", "llama-3.1-8b", "-n", "2", "--input-len", "3000", "--output-len", "1000", "--gpu", "L40S",
        "--tp", "1", "--json",
    )  # fmt: skip
    assert json.loads(result.stdout)["workload"]["seq_len"] == 4000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len", "1024"], "Error: --concurrency must be a number of requests greater than zero (--concurrency)"),
        (
            ["-n", "0", "--seq-len", "1024"],
            "Error: --concurrency must be a number of requests greater than zero, not 0",
        ),
        (["-n", "4"], "Error: give the request length one way"),
        (["-n", "4", "--seq-len", "1024", "--input-len", "5"], "(got --seq-len, --input-len/--output-len)"),
        (["-n", "4", "--seq-len", "1024", "--tp", "x"], "Error: --tp takes whole numbers separated by commas"),
        (["-n", "4", "--seq-len", "1024", "--tp", "8-2"], "Error: --tp 8-2 is not a range of sizes greater than zero"),
        (["-n", "4", "--seq-len", "1024", "--gpu", "H100-80GB,,L4"], "Error: --gpu has an empty item"),
        (["-n", "4", "--seq-len", "1024", "--gpu", "nope"], "Error: "),
        (["-n", "4", "--seq-len", "1024", "--gpu-memory-utilization", "1.5"], "must be in (0, 1], not 1.5"),
        (["-n", "4", "--seq-len", "1024", "--tp", "8", "--max-gpus", "4"], "Error: no candidate to try"),
        (["-n", "4", "--seq-len", "1024", "--percentile", "90"], "Error: --percentile needs --trace"),
        (["-n", "4", "--trace", TRACE, "--percentile", "0"], "Error: --percentile must be in (0, 100], not 0"),
        (["-n", "4", "--seq-len", "1024", "--top", "0"], "Error: --top must be greater than zero, not 0"),
        (["-n", "4", "--seq-len", "1024", "--vllm-version", "0.9.0"], "Error: vLLM 0.9.0 is not a release kvtool"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(run_cli, args, message):
    result = run_cli("plan", "-m", "llama-3.1-8b", *args)
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("Error:")]) == 1


def test_plan_does_not_import_torch_or_pandas():
    argv = ["plan", "-m", "llama-3.1-8b", "-n", "4", "--seq-len", "4096", "--json"]
    codes, _, heavy = heavy_modules_loaded_by(argv, modules=("torch", "pandas"))
    assert codes == [0]
    assert heavy == []


def test_the_memory_terms_are_estimates_options(run_cli):
    # plan takes estimate's memory-term options into the same request: --lora-memory 2GiB lowers each row's KV
    # budget by exactly 2 GiB against plan with --enable-lora --lora-memory 0 (the same terms otherwise)
    args = ["plan", "-m", "llama-3.1-8b", "-n", "4", "--seq-len", "8192", "--gpu", "H100-80GB", "--tp", "1", "--json"]
    none = json.loads(run_cli(*args, "--enable-lora", "--lora-memory", "0").stdout)["rows"][0]
    two = json.loads(run_cli(*args, "--enable-lora", "--lora-memory", "2GiB").stdout)["rows"][0]
    assert none["kv_budget_bytes"] - two["kv_budget_bytes"] == 2 * 1024**3
    bad = run_cli(*args, "--draft-memory", "1GiB")
    assert bad.exit_code == EXIT_USAGE and bad.stderr.startswith("Error: --draft-memory needs --speculative-config")
