"""Shared test fixtures.

- Every test runs with HOME, XDG dirs and kvtool's own environment variables pointed at tmp_path,
  so no test reads or writes the user's files (as simonw/llm's tests/conftest.py does).
- ``run_cli`` runs the real entry point (``kvtool.cli.run``) in-process and returns
  (exit_code, stdout, stderr): the same code path as the ``kvtool`` console script.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "160")
    for name in list(os.environ):
        if name.startswith("KVTOOL_"):
            monkeypatch.delenv(name)


@dataclasses.dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys):
    """Run ``kvtool ARGS...`` in-process through the real entry point."""
    from kvtool.cli import run

    def _run(*args: str) -> CliResult:
        capsys.readouterr()  # drop anything printed before
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return _run


def run_subprocess(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    """Run ``python -m kvtool ARGS...`` in a fresh interpreter (for import and exit-code checks)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kvtool", *map(str, args)],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def heavy_modules_loaded_by(*invocations: list[str], modules=("torch", "pandas", "numpy", "matplotlib")):
    """Run each ``kvtool`` argument list in one fresh interpreter; return (exit codes, stdout, heavy modules loaded).

    The start-up rule (README, STYLE.md): `kvtool --help` and `kvtool estimate` never import torch or pandas.
    """
    code = "import sys\nfrom kvtool.cli import run\ncodes = []\n"
    code += "".join(f"codes.append(run({list(argv)!r}))\n" for argv in invocations)
    code += f"print('CODES', codes, 'HEAVY', [m for m in {list(modules)!r} if m in sys.modules])\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import ast

    last = proc.stdout.strip().splitlines()[-1]
    codes_text, heavy_text = last.removeprefix("CODES ").split(" HEAVY ")
    return ast.literal_eval(codes_text), proc.stdout, ast.literal_eval(heavy_text)
