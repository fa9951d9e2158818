"""Each command on an install without its extra: one ``Error:`` line, the extra's ``Tip:``, exit 69, no traceback;
and estimate, analyze, simulate and ``--help`` whole on the base install (no torch, no matplotlib).

The CLI runs in a fresh interpreter whose import system has no torch and no matplotlib (a meta-path finder that
refuses them, as for a module pip never installed), so what is already imported in the test process hides nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvtool.core.errors import EXIT_MISSING_EXTRA
from tests.support import DATA, REPO_ROOT

TORCH_ERROR = (
    "Error: kvtool repro needs PyTorch, which is not installed\n"
    "Tip: pip install 'kvtool[repro]' (without a GPU, first the CPU-only wheel: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu)\n"
)

_WITHOUT = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
{body}
"""
_CLI = "from kvtool.cli import run\nsys.exit(run(sys.argv[1:]))"


def run_without(blocked: set[str], *args, body: str = _CLI, cwd=None) -> subprocess.CompletedProcess:
    """``kvtool ARGS...`` (or ``body``) in a fresh interpreter where the modules ``blocked`` are not installed."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), COLUMNS="120")
    code = _WITHOUT.format(blocked=sorted(blocked), body=body)
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd or REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


BASE = {"torch", "matplotlib", "pandas"}  # what `pip install kvtool` leaves out (transformers: with torch's extras)


@pytest.mark.parametrize(
    "args",
    [
        ["repro"],
        ["repro", "shared-instance-cache", "--json"],
        ["repro", "--target", "decoders:slot_pool"],
        ["repro", "--target", f"hf:{DATA / 'repro' / 'hf_llama'}"],
    ],
    ids=["repro", "repro-json", "repro-target", "repro-target-hf"],
)
def test_repro_without_torch_names_the_repro_extra(args):
    proc = run_without(BASE, *args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (EXIT_MISSING_EXTRA, "", TORCH_ERROR)


def test_repro_list_needs_no_torch():
    proc = run_without(BASE, "repro", "--list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "shared-instance-cache" in [s["name"] for s in json.loads(proc.stdout)["scenarios"]]


def test_an_hf_target_without_transformers_names_the_hf_extra():
    proc = run_without({"transformers"}, "repro", "--target", f"hf:{DATA / 'repro' / 'hf_llama'}", "--json")
    assert proc.returncode == EXIT_MISSING_EXTRA and proc.stdout == ""
    assert proc.stderr == (
        "Error: kvtool repro --target hf:DIR needs transformers, which is not installed (--target)\n"
        "Tip: pip install 'kvtool[hf]'\n"
    )


@pytest.mark.parametrize(
    "command, args",
    [
        ("analyze", [DATA / "analyze" / "basic.csv"]),
        ("analyze", [DATA / "vllm-events" / "small-cache-evictions-full-report.jsonl"]),
        ("simulate", ["--dist", "lognormal", "--mean", "1000", "--p99", "6000"]),
        ("simulate", ["--dist", "lognormal", "--mean", "1000", "--p99", "6000", "--json"]),
    ],
    ids=["analyze-csv", "analyze-vllm-jsonl", "simulate", "simulate-json"],
)
def test_plot_without_matplotlib_names_the_plots_extra_before_any_work(tmp_path, command, args):
    # was a traceback (ModuleNotFoundError: No module named 'matplotlib') after the whole analysis (issue 24)
    charts = tmp_path / "charts"
    proc = run_without(BASE, command, *args, "--plot", charts)
    assert (proc.returncode, proc.stdout) == (EXIT_MISSING_EXTRA, "")
    assert proc.stderr == (
        f"Error: kvtool {command} --plot needs matplotlib, which is not installed\nTip: pip install 'kvtool[plots]'\n"
    )
    assert not charts.exists()


def test_check_target_of_the_api_without_torch():
    body = (
        "from kvtool.api import check_target\n"
        "from kvtool.core.errors import MissingExtraError\n"
        "try:\n"
        "    check_target('decoders:slot_pool')\n"
        "except MissingExtraError as err:\n"
        "    print(err.exit_code, err.one_line(), err.tip, sep='|')\n"
    )
    proc = run_without(BASE, body=body)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split("|") == [
        "69",
        "kvtool.api.check_target needs PyTorch, which is not installed",
        TORCH_ERROR.splitlines()[1].removeprefix("Tip: "),
    ]


@pytest.mark.parametrize("name", ["load_events", "analyze", "simulate", "AnalyzeResult"])
def test_the_dataframe_api_without_pandas_names_the_api_extra(name):
    body = (
        "import kvtool.api\n"
        "from kvtool.core.errors import MissingExtraError\n"
        "try:\n"
        f"    kvtool.api.{name}\n"
        "except MissingExtraError as err:\n"
        "    print(err.exit_code, err.one_line(), err.tip, sep='|')\n"
    )
    proc = run_without(BASE, body=body)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split("|") == [
        "69",
        f"kvtool.api.{name} needs pandas, which is not installed",
        "pip install 'kvtool[api]'",
    ]


def test_the_api_estimate_needs_no_pandas():
    body = "from kvtool.api import estimate\nprint(estimate(model='llama-3.1-8b', gpu='L4').kv_bytes)\n"
    proc = run_without(BASE, body=body)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 0


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4"],
        ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "--json"],
        ["models"],
        ["analyze", DATA / "analyze" / "basic.csv"],
        ["analyze", DATA / "vllm-events" / "small-cache-evictions-full-report.jsonl", "--json"],
        ["simulate", "--dist", "lognormal", "--mean", "1000", "--p99", "6000"],
        ["simulate", "--trace", DATA / "simulate" / "length-head20.csv", "--serve", "--model", "llama-3.1-8b"],
        ["repro", "--help"],
    ],
    ids=lambda a: " ".join(map(str, a))[:40],
)
def test_the_base_install_runs_estimate_analyze_and_simulate(args):
    proc = run_without(BASE, *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.strip()
