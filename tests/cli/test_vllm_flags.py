"""vLLM's own flag names on kvtool estimate and simulate, and a whole `vllm serve` line after `--`."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_USAGE

BASE = ("estimate", "--gpu", "H100", "--json")


def answer(run_cli, *args: str) -> dict:
    result = run_cli(*BASE, *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("ours", "vllms"),
    [
        (("--tp", "2"), ("-tp", "2")),
        (("--tp", "2"), ("--tensor-parallel-size", "2")),
        (("--pp", "2"), ("-pp", "2")),
        (("--pp", "2"), ("--pipeline-parallel-size=2",)),
        (("--kv-dtype", "fp8"), ("--kv-cache-dtype", "fp8")),
        (("--seq-len", "32768"), ("--max-model-len", "32768")),
    ],
)
def test_vllm_spellings_are_the_same_options(run_cli, ours, vllms):
    assert answer(run_cli, "--model", "qwen2.5-7b", *vllms) == answer(run_cli, "--model", "qwen2.5-7b", *ours)


def test_kv_cache_memory_bytes_takes_vllms_suffixes(run_cli):
    # vLLM's human_readable_int: 10G = 10 x 2**30 bytes = kvtool's 10GiB
    def budget(*args: str) -> dict:
        result = run_cli("estimate", "--model", "qwen2.5-7b", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    assert budget("--kv-cache-memory-bytes", "10G") == budget("--kv-memory", "10GiB")
    assert budget("--kv-cache-memory=10737418240") == budget("--kv-memory", "10GiB")


def test_a_vllm_serve_line_after_double_dash(run_cli):
    result = run_cli(
        *BASE,
        "--",
        "vllm",
        "serve",
        "qwen2.5-7b",
        "--max-model-len",
        "32k",
        "-tp",
        "2",
        "--kv-cache-dtype",
        "fp8",
        "--port",
        "8000",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    )
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)  # --json: one JSON object, nothing on stderr; the warning is in it
    assert result.stderr == ""
    assert got.pop("warnings")[0] == (
        "vllm serve line: ignored (kvtool does not model them): --port, --enable-auto-tool-choice, --tool-call-parser"
    )
    # Qwen2.5-7B (its config.json): 28 layers, 4 KV heads x 128; fp8 = 1 byte: K and V, 2 x 28 x 4 x 128 x 1 =
    # 28,672 bytes a token, 14,336 on each of the 2 GPUs
    assert got["bytes_per_token"] == 28_672
    assert got["bytes_per_token_per_gpu"] == 14_336
    same = answer(run_cli, "--model", "qwen2.5-7b", "--seq-len", "32000", "--tp", "2", "--kv-dtype", "fp8")
    same.pop("warnings")
    assert got == same


def test_the_line_warning_goes_to_stderr_without_json(run_cli):
    result = run_cli("estimate", "--gpu", "H100", "--", "vllm", "serve", "qwen2.5-7b", "--port", "8000")
    assert result.exit_code == 0
    assert "Warning: vllm serve line: ignored (kvtool does not model them): --port" in result.stderr.splitlines()


def test_the_line_as_one_quoted_word(run_cli):
    one = answer(run_cli, "--", "vllm serve qwen2.5-7b \\\n  -tp 2 --no-enable-prefix-caching")
    assert one == answer(run_cli, "--model", "qwen2.5-7b", "--tp", "2", "--no-enable-prefix-caching")


def test_kvtool_option_and_the_line_disagreeing_is_exit_2_naming_both(run_cli):
    result = run_cli(*BASE, "--tp", "4", "--", "vllm", "serve", "qwen2.5-7b", "-tp", "2")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.splitlines() == [
        "Error: --tp 4 and the vllm serve line's -tp 2 disagree (--tp and the vllm serve line)",
        "Tip: give the setting once, as kvtool's option or in the vllm serve line",
    ]
    assert result.stdout == ""


def test_the_same_setting_twice_agreeing_is_fine(run_cli):
    both = answer(run_cli, "--tp", "2", "--seq-len", "32000", "--", "vllm", "serve", "qwen2.5-7b", "-tp", "2",
                  "--max-model-len", "32k")  # fmt: skip
    assert both == answer(run_cli, "--model", "qwen2.5-7b", "--tp", "2", "--seq-len", "32000")


def test_model_disagreeing_is_exit_2(run_cli):
    result = run_cli(*BASE, "--model", "qwen2.5-7b", "--", "vllm", "serve", "qwen2.5-72b")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: --model qwen2.5-7b and the vllm serve line's the model qwen2.5-72b")


def test_an_unknown_model_gets_the_same_error_as_model(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: nothing is found
    line = run_cli(*BASE, "--", "vllm", "serve", "no-such-org/no-such-model", "-tp", "2")
    option = run_cli(*BASE, "--model", "no-such-org/no-such-model", "--tp", "2")
    assert line.exit_code == option.exit_code == EXIT_USAGE
    assert line.stderr.splitlines()[-2:] == option.stderr.splitlines()[-2:]
    assert "Traceback" not in line.stderr


def test_not_a_vllm_line_is_one_error(run_cli):
    result = run_cli(*BASE, "--", "sglang", "launch_server", "--model-path", "x")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: not a vllm serve command line: sglang launch_server --model-path x")


def test_help_shows_the_double_dash_form(run_cli):
    result = run_cli("estimate", "--help")
    assert "-- VLLM_SERVE_LINE" in result.stdout
    assert "-tp" in result.stdout and "--kv-cache-memory-bytes" in result.stdout


def test_simulate_takes_vllms_spellings(run_cli):
    def sim(*args: str) -> dict:
        result = run_cli("simulate", "--dist", "fixed", "--length", "1000", "--requests", "20", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    ours = sim("--tp", "2", "--kv-dtype", "fp8", "--no-prefix-cache")
    assert sim("-tp", "2", "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching") == ours
    assert sim("--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching") == ours
