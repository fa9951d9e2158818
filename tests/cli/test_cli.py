"""The command-line shell: help, version, usage errors, exit codes, and start-up imports."""

from __future__ import annotations

import pytest

import kvtool
from kvtool.core.errors import EXIT_USAGE
from tests.support import heavy_modules_loaded_by, run_subprocess


def test_help_lists_every_command_with_one_line(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in ("estimate", "repro", "analyze", "simulate", "capture"):
        assert name in result.stdout


def test_version(run_cli):
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"kvtool {kvtool.__version__}"


def test_unknown_option_is_one_error_line_and_exit_2(run_cli):
    result = run_cli("estimate", "--no-such-option")
    assert result.exit_code == EXIT_USAGE
    lines = result.stderr.splitlines()
    # click words it "No such option: --x" or "No such option '--x'." depending on its version
    assert lines[0].startswith("Error: No such option")
    assert "--no-such-option" in lines[0]
    assert lines[1] == "Tip: run 'kvtool estimate --help' for the options."
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_unknown_command(run_cli):
    result = run_cli("frobnicate")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: No such command 'frobnicate'")


def test_python_dash_m_and_exit_code():
    proc = run_subprocess("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"kvtool {kvtool.__version__}"


def test_help_does_not_import_torch_or_pandas():
    codes, _, heavy = heavy_modules_loaded_by(["--help"], modules=("torch", "pandas", "matplotlib"))
    assert codes == [0]
    assert heavy == []


def test_argument_help_is_shown(run_cli):
    # click 8.5 blanks argument help under typer < 0.26 (https://github.com/Aletheore/Aletheore/pull/510);
    # typer >= 0.26 (pyproject) carries its own click, so this holds whichever click is installed
    result = run_cli("repro", "--help")
    assert result.exit_code == 0
    assert "Scenarios to run" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "tests/data/analyze/leak_preempt.csv"],
        ["simulate", "--trace", "tests/data/simulate/azure-2023-code-head20.csv"],
        ["analyze", "tests/data/vllm-events/small-cache-evictions-incremental.jsonl"],
    ],
    ids=["analyze", "simulate", "analyze-vllm"],
)
def test_tables_into_a_closed_pipe_exit_0_like_json(args):
    # rich's Console exits 1 on a broken pipe, which reads as "checks failed" (`kvtool analyze f.csv | head`),
    # while --json output into the same pipe exits 0
    import os
    import subprocess
    import sys

    from tests.support import REPO_ROOT

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: every write is a broken pipe
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    assert proc.stderr == ""
