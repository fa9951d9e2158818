"""`kvtool explain` end to end: tables, --json, stdin, the one-line errors and their exit codes, the imports."""

from __future__ import annotations

import io
import json

from kvtool.core.errors import EXIT_INPUT, EXIT_USAGE
from tests.support import REPO_ROOT, heavy_modules_loaded_by

DATA = REPO_ROOT / "tests" / "data"
LLAMA = DATA / "explain" / "llama-3.2-1b-debug-v0.10-dev"
LLAVA = DATA / "gpu-logs" / "llava-v1.6-mistral-7b-h100-v0.10.2"


def test_json_is_one_object_with_each_figure_and_its_status(run_cli):
    result = run_cli(
        "explain", LLAMA / "log.txt", "--config", LLAMA / "config.json", "--vllm-version", "0.10.0", "--json"
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    figures = {t["name"]: t for t in data["figures"]}
    size = figures["GPU KV cache size"]
    assert (size["logged"], size["line"], size["status"]) == (1215552, 18, "logged")  # line 18 of log.txt
    terms = {t["name"]: t for t in data["terms"]}
    assert terms["activation peak"]["logged"] == round(0.45 * 2**30)  # the DEBUG profiling line
    assert data["vllm_version"] == "0.10.0" and data["logged_version"] == "0.1.dev8168+g475c1a0"
    assert {w["setting"] for w in data["what_ifs"]} == {"kv_dtype", "gpu_memory_utilization", "max_model_len"}


def test_the_table_names_each_status_and_the_what_if_asked(run_cli):
    result = run_cli("explain", LLAVA / "log.txt", "--max-num-seqs", "64")
    assert result.exit_code == 0, result.stderr
    assert "Budget terms per GPU" in result.stdout and "logged" in result.stdout
    assert "The --kv-cache-memory suggestion, recomputed" in result.stdout
    assert "max_num_seqs" in result.stdout
    # the model id does not resolve here: said once on stderr, the logged figures still shown
    assert result.stderr.count("Warning: llava-hf/llava-v1.6-mistral-7b-hf is neither") == 1


def test_stdin_is_read_with_a_dash(run_cli, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO((LLAVA / "log.txt").read_text()))
    result = run_cli("explain", "-", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == "<stdin>"
    assert {t["name"]: t["logged"] for t in data["figures"]}["maximum concurrency"] == 110.29


def test_a_file_that_is_not_a_vllm_log_is_one_line_naming_the_line_expected(run_cli, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("INFO started\nINFO done\n")
    result = run_cli("explain", notes)
    assert result.exit_code == EXIT_INPUT
    assert result.stdout == ""
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        "Error: not a vLLM start-up log kvtool can read: no 'Available KV cache memory: N GiB' line"
    )
    assert first.endswith(f"({notes})")
    assert "Traceback" not in result.stderr


def test_a_missing_log_and_a_bad_what_if_are_refused(run_cli, tmp_path):
    missing = run_cli("explain", tmp_path / "nope.log")
    assert missing.exit_code == EXIT_INPUT and missing.stderr.startswith("Error: no such file")
    bad = run_cli("explain", LLAVA / "log.txt", "--gpu-memory-utilization", "1.5")
    assert bad.exit_code == EXIT_USAGE and "--gpu-memory-utilization must be in (0, 1]" in bad.stderr


def test_explain_imports_neither_torch_nor_pandas():
    codes, _, heavy = heavy_modules_loaded_by(
        ["explain", str(LLAVA / "log.txt"), "--json"], modules=("torch", "pandas", "matplotlib")
    )
    assert codes == [0] and heavy == []
