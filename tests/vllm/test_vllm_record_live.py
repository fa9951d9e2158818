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


def _killed_driver_run(tmp_path: Path, signum: int) -> tuple[dict, str]:
    """A real vLLM under kvtool record whose driver gets ``signum`` once the engine has written rows."""
    import time

    scratch = Path(tempfile.mkdtemp(prefix="kvr"))
    events = tmp_path / "run.parquet"
    spool = tmp_path / "run.parquet.spool.csv"
    driver = REPO_ROOT / "tests" / "support" / "vllm_record_driver.py"
    command = [sys.executable, "-m", "kvtool", "record", "-o", str(events), "--grace", "5", "--json", "--"]
    command += [VLLM_PYTHON, str(driver), "--model-dir", str(tmp_path / "model"), "--figures", str(tmp_path / "f")]
    command += ["--requests", "400"]  # long enough to be killed in the middle
    env = vllm_engine_env(scratch, dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (spool.exists() and spool.stat().st_size > 20_000):  # the engine is recording
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it recorded"
            time.sleep(0.2)
        driver_pid = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout)
        os.kill(driver_pid, signum)
        out, err = proc.communicate(timeout=300)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return json.loads(out[out.index("{\n") :]), err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_a_killed_driver_loses_no_row_its_engine_wrote(tmp_path, signame):
    # issue 25: kvtool returned as soon as the driver died and converted the spool while the orphaned engine core
    # still wrote (51 % of a run lost; the meta claimed rows the file did not have); with SIGKILL the engine spun on
    import signal

    import pyarrow.parquet as pq

    summary, err = _killed_driver_run(tmp_path, getattr(signal, signame))
    (recorded,) = summary["files"]
    rows = pq.read_metadata(recorded["path"]).num_rows
    assert rows == recorded["rows"] > 0
    if recorded["engine_rows"] is not None:  # the engine closed its recording: every row it flushed is in the file
        assert recorded["engine_rows"] == rows
    meta = json.loads(Path(recorded["path"] + ".meta.json").read_text())
    assert meta["rows"] == rows and meta["open"] is False
    assert "Traceback" not in err.split("kvtool recorder:")[0]
