"""Live parity: record a fresh batch on a real vLLM and compare the simulator with it (skipped without vLLM).

Set VLLM_PYTHON to a Python that has vLLM (e.g. /work/vllm-venv/bin/python).  The recorder is
tests/data/simulate/record_vllm_parity.py; the checks are those of test_vllm_scheduler_parity.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.simulate.test_vllm_scheduler_parity import _simulate
from tests.support import DATA

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


def test_a_fresh_recording_matches_the_simulator(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), VLLM_CACHE_ROOT=str(tmp_path / "vc"), HF_HOME=str(tmp_path / "hf"))
    script = DATA / "simulate" / "record_vllm_parity.py"
    proc = subprocess.run(
        [VLLM_PYTHON, str(script), str(tmp_path), "e"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fx = json.loads((tmp_path / "vllm-parity-e.json").read_text())
    run = _simulate(fx)
    got = [(run.num_cached_tokens[i], run.num_preemptions[i], run.finish_step[i]) for i in range(len(fx["requests"]))]
    assert got == [(r["num_cached_tokens"], r["num_preemptions"], r["finish_step"]) for r in fx["requests"]]
