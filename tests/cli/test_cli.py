"""The command-line shell: help, version, usage errors, exit codes, and start-up imports."""

from __future__ import annotations

import pytest

import kvtool
from kvtool.core.errors import EXIT_USAGE
from tests.support import DATA, heavy_modules_loaded_by, run_subprocess


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


_BASIC = str(DATA / "analyze" / "basic.csv")
_CHARTS_TIP = "give a folder for the charts ('.' for the current one)"


@pytest.mark.parametrize(
    "args, option, tip",
    [
        # the defect: typer made '' Path('.'), and the four charts were written into the current folder, exit 0
        (["analyze", _BASIC, "--plot", ""], "--plot", _CHARTS_TIP),
        (["analyze", _BASIC, "--plot=", "--json"], "--plot", _CHARTS_TIP),
        (
            ["analyze", _BASIC, "--export", "", "--json"],
            "--export",
            "give the file of the per-request table (NAME.csv, NAME.csv.gz or NAME.parquet)",
        ),
        (["simulate", "--dist", "fixed", "--length", "100", "--plot", ""], "--plot", _CHARTS_TIP),
        (
            ["simulate", "--dist", "fixed", "--length", "100", "--serve", "--export-events", ""],
            "--export-events",
            "give the file to write (NAME.csv, NAME.csv.gz or NAME.parquet)",
        ),
        (["simulate", "--trace", ""], "--trace", "give a trace file (CSV or JSON lines)"),
        (["simulate", "--from-events", ""], "--from-events", "give an events file of `kvtool analyze`'s schema"),
        (["record", "-o", "", "--", "true"], "--output", "give the events file to write (NAME.csv or NAME.parquet)"),
        # was a ValueError traceback from Path.with_name
        (["capture", "-o", "", "--duration", "0.1"], "--output", "give the JSON-lines file to write (NAME.jsonl)"),
        (["vllm", "isolation", "--model", ""], "--model", "give a model folder ('.' for the current one)"),
        (["vllm", "isolation", "--replay", ""], "--replay", "give a file written by --record"),
        (
            ["vllm", "isolation", "--endpoint", "http://127.0.0.1:1", "--record", ""],
            "--record",
            "give the JSON file to write",
        ),
    ],
    ids=[
        "analyze-plot",
        "analyze-plot-equals",
        "analyze-export",
        "simulate-plot",
        "simulate-export-events",
        "simulate-trace",
        "simulate-from-events",
        "record-output",
        "capture-output",
        "vllm-model",
        "vllm-replay",
        "vllm-record",
    ],
)
def test_an_empty_path_option_is_a_usage_error_naming_it(run_cli, tmp_path, monkeypatch, args, option, tip):
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert result.stderr == f"Error: {option} is empty ({option})\nTip: {tip}\n"
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


def test_every_path_option_refuses_an_empty_value():
    # typer turns '' into Path('.') before a command sees it; only an option declared with path_option checks the
    # raw string, so a plain Path option (click's Path type) added to any command would bring the defect back
    from typer.main import get_command

    from kvtool.cli import build_app

    def options(command, path=()):
        for param in command.params:
            yield " ".join(path), param
        for name, sub in getattr(command, "commands", {}).items():
            yield from options(sub, (*path, name))

    def checked_by_path_option(param) -> bool:
        return getattr(getattr(param.type, "func", None), "__qualname__", "") == "path_option.<locals>.path"

    found = list(options(get_command(build_app())))
    paths = [(where, p) for where, p in found if p.type.name == "path"]  # typer's Path type and path_option's alike
    plain = [(where, p.opts) for where, p in paths if not checked_by_path_option(p)]
    checked = {(where, p.opts[0]) for where, p in paths if checked_by_path_option(p)}
    assert plain == []
    assert {("analyze", "--plot"), ("analyze", "--export"), ("simulate", "--plot"), ("capture", "--output")} <= checked
