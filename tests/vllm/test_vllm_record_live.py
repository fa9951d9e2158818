"""Optional: record a real vLLM run with `kvtool record` and check it against vLLM's own figures.

Skipped unless VLLM_PYTHON points at a Python with vLLM 0.32 (e.g. /work/vllm-venv/bin/python), or vLLM is
importable here.  Nothing is installed into that Python: `kvtool record` puts a generated entry point on the
command's PYTHONPATH.  The same checks run in CI on the stored recording (test_vllm_record_fixture.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, vllm_engine_env
from tests.vllm.test_vllm_record_fixture import check_against_vllm

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


def test_a_live_recording_agrees_with_vllms_own_figures(tmp_path):
    # vLLM's ipc socket paths must stay under 107 characters: a short scratch folder, not tmp_path.
    scratch = Path(tempfile.mkdtemp(prefix="kvr"))
    events, figures = tmp_path / "run.parquet", tmp_path / "run.vllm.json"
    driver = REPO_ROOT / "tests" / "support" / "vllm_record_driver.py"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "record", "-o", str(events), "--json", "--", VLLM_PYTHON, str(driver)]
            + ["--model-dir", str(tmp_path / "model"), "--figures", str(figures)],
            env=vllm_engine_env(scratch, dict(os.environ, PYTHONPATH=str(REPO_ROOT))),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{\n") :])  # the driver prints its own line first
    (recorded,) = summary["files"]
    assert recorded["turned_off"] is None and recorded["rows"] > 0
    assert "kvtool recorder: recording KV-block events of DP rank 0" in proc.stderr
    check_against_vllm(events, json.loads(figures.read_text()))
