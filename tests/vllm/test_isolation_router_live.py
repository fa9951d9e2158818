"""Optional: the router recordings rerun live (skipped unless vLLM is available: set VLLM_PYTHON to a Python that
has it, e.g. /work/vllm-venv/bin/python).

tests/support/vllm_isolation_router_driver.py starts two tiny engines once and runs every scenario of the recordings
(tests/data/isolation/README.md "Behind a router") through tests/support/kv_router.py; each fresh record must pass
the same checks as the recorded one (test_isolation_router_recorded.check_scenario).  About 10 minutes on 2 shared
cores, most of it the two engines' start-up.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import REPO_ROOT
from tests.vllm.test_isolation_router_recorded import SCENARIOS, check_scenario, record_path

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


@pytest.fixture(scope="module")
def recorded():
    """Every scenario's fresh record (one driver run: one pair of engines for all)."""
    folder = Path(tempfile.mkdtemp(prefix="kvr"))  # vLLM's ipc socket paths must stay short
    try:
        code = "import sys; sys.path.insert(0, sys.argv[1]); from vllm_tiny import build_model; "
        code += "from pathlib import Path; build_model(Path(sys.argv[2]))"
        subprocess.run([VLLM_PYTHON, "-c", code, str(REPO_ROOT / "tests" / "support"), str(folder / "model")],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.vllm_isolation_router_driver", "--model", str(folder / "model"),
             "--vllm-python", VLLM_PYTHON, "--out", str(folder)],
            cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True,
            timeout=3000,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", SCENARIOS)
def test_live_run_behind_the_router(recorded, name):
    record = read_record(record_path(recorded, name))
    check_scenario(name, record, judge_record(record))
