"""Optional: `kvtool vllm isolation --model` on a real vLLM, correct and deliberately broken (skipped unless vLLM is
available: set VLLM_PYTHON to a Python that has it, e.g. /work/vllm-venv/bin/python).

The broken engines load tests/support/broken_hash_plugin (a vLLM general plugin found through a scratch dist-info
entry point on the engine's PYTHONPATH; nothing is installed) that drops the cache salt or the LoRA path from
vLLM's block hash.  The check must then fail on exactly the dimensions that lost their key.  Each case starts one
engine (about a minute or more on a shared CPU); the recorded runs under tests/data/isolation/ came from these
commands (see the README there) and are replayed without vLLM in test_isolation_recorded.py.
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

from tests.support import REPO_ROOT

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)
PLUGIN = REPO_ROOT / "tests" / "support" / "broken_hash_plugin"
PLANTED = REPO_ROOT / "tests" / "support" / "planted_defect_plugin"
DIMENSIONS = ("salt", "adapter", "adapter-version", "embeddings", "cross", "salt-variant", "length", "salt-adapter",
              "salt-embeds", "eviction")  # fmt: skip

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


@pytest.fixture(scope="module")
def scratch():
    # vLLM's ipc socket paths must stay under 107 characters: a short folder, not tmp_path
    folder = Path(tempfile.mkdtemp(prefix="kvi"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def model_dir(scratch):
    """The tiny random Llama of docs (shared/docs/vllm-on-cpu.md), built by tests/support/vllm_tiny.py."""
    target = scratch / "model"
    code = "import sys; sys.path.insert(0, sys.argv[1]); from vllm_tiny import build_model; "
    code += "from pathlib import Path; build_model(Path(sys.argv[2]))"
    subprocess.run([VLLM_PYTHON, "-c", code, str(REPO_ROOT / "tests" / "support"), str(target)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return target


def run_check(scratch: Path, model_dir: Path, port: int, broken: str | None, planted: str | None = None):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for name in ("VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        env[name] = str(scratch / name.lower())
    if broken:
        env["PYTHONPATH"] += os.pathsep + str(PLUGIN)
        env["KVTOOL_TEST_BREAK_HASH"] = broken
    if planted:
        env["PYTHONPATH"] += os.pathsep + str(PLANTED)
        env["KVTOOL_TEST_DEFECT"] = planted
    record = scratch / f"record-{broken or planted or 'real'}.json".replace(":", "-")
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "vllm", "isolation", "--model", str(model_dir), "--vllm-python", VLLM_PYTHON,
         "--port", str(port), "--events-port", str(port + 1), "--block-size", "32", "--engine-arg=--enforce-eager",
         "--engine-arg=--max-model-len=2048", "--engine-arg=--kv-cache-memory-bytes=50000000", "--repeats", "1",
         "--record", str(record), "--json"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode in (0, 1, 2), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return proc.returncode, {d["dimension"]: d["verdict"] for d in report["dimensions"]}, report


def test_real_vllm_keeps_every_dimension_apart(scratch, model_dir):
    code, verdicts, report = run_check(scratch, model_dir, 21640, None)
    assert verdicts == {**dict.fromkeys(DIMENSIONS, "pass"), "multimodal": "not run", "tier": "not run"}, report
    assert code == 0
    assert report["events_captured"] > 0 and report["engine"]["version"].startswith("0.")


SALTED = {"salt", "salt-variant", "length", "salt-adapter", "salt-embeds", "eviction"}  # every pair differing by salt


@pytest.mark.parametrize(("broken", "leaking"), [("salt", SALTED), ("lora-path", {"adapter-version"})])
def test_a_broken_block_hash_fails_exactly_the_affected_dimension(scratch, model_dir, broken, leaking):
    code, verdicts, report = run_check(scratch, model_dir, 21650 if broken == "salt" else 21660, broken)
    assert {d for d, v in verdicts.items() if v == "leak"} == leaking, report
    assert all(v in ("pass", "not run") for d, v in verdicts.items() if d not in leaking), report
    assert code == 1


@pytest.mark.parametrize(
    ("planted", "leaking", "blocks", "port"),
    [
        ("casefold", "salt-variant", 1, 21670),
        ("salt-after:8", "length", 9, 21680),
        ("adapter-shared", "salt-adapter", 1, 21690),
    ],
)
def test_a_planted_defect_is_caught_on_its_own_dimension_minimized(scratch, model_dir, planted, leaking, blocks, port):
    # tests/support/planted_defect_plugin: the defects the fixed sample passed (kvtool issue 31)
    code, verdicts, report = run_check(scratch, model_dir, port, None, planted)
    assert {d for d, v in verdicts.items() if v == "leak"} == {leaking}, report
    minimal = next(d for d in report["dimensions"] if d["dimension"] == leaking)["minimal"]
    assert minimal["full_blocks"] == blocks and code == 1
