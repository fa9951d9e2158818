"""Shared test fixtures.

- Every test runs with HOME, XDG dirs and kvtool's own environment variables pointed at tmp_path,
  so no test reads or writes the user's files (as simonw/llm's tests/conftest.py does).
- ``run_cli`` runs the real entry point (``kvtool.cli.run``) in-process and returns
  (exit_code, stdout, stderr): the same code path as the ``kvtool`` console script.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.support import DATA, REPO_ROOT  # noqa: F401  (re-exported for fixtures)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "160")
    for name in list(os.environ):
        if name.startswith("KVTOOL_") and name != "KVTOOL_NO_KERNELS":  # that one picks the numpy path on purpose
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
