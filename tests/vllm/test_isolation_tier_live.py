"""Optional: the tier dimension through KV connectors on a real vLLM (skipped unless vLLM is available: set
VLLM_PYTHON to a Python that has it, e.g. /work/vllm-venv/bin/python).  Each case starts one engine with
``--kv-transfer-config`` (tests/support/vllm_isolation_tier_driver.py, the commands the recordings under
tests/data/isolation/vllm-0.32-tier-*.json.gz came from) and runs the default search with ``--repeats 1``: on 2 shared
cores 20 minutes or more each.  The recordings are replayed without vLLM in test_isolation_recorded_tier.py.
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

from tests.support import REPO_ROOT
from tests.support.vllm_isolation_tier_driver import run

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


@pytest.fixture(scope="module")
def model_dir():
    """The tiny random Llama of shared/docs/vllm-on-cpu.md, built by tests/support/vllm_tiny.py."""
    folder = Path(tempfile.mkdtemp(prefix="kvtm"))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from vllm_tiny import build_model; "
    code += "from pathlib import Path; build_model(Path(sys.argv[2]))"
    subprocess.run([VLLM_PYTHON, "-c", code, str(REPO_ROOT / "tests" / "support"), str(folder / "model")], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    yield folder / "model"
    shutil.rmtree(folder, ignore_errors=True)


def verdicts(report) -> dict[str, str]:
    return {d["dimension"]: d["verdict"] for d in report["dimensions"]}


def test_a_salted_tier_passes_every_dimension(model_dir, tmp_path):
    code, report = run(model_dir, VLLM_PYTHON, "salted", 21850, tmp_path / "r.json", 1, 3600)
    assert {d for d, v in verdicts(report).items() if v != "pass"} == {"multimodal"}, report
    assert code == 0 and report["engine"]["kv_connector"].startswith("detected")


def test_a_write_back_tier_keyed_by_tokens_leaks_on_the_tier_dimension_only(model_dir, tmp_path):
    code, report = run(model_dir, VLLM_PYTHON, "tokens-after-eviction", 21860, tmp_path / "r.json", 1, 3600)
    assert {d for d, v in verdicts(report).items() if v == "leak"} == {"tier"}, report
    tier = next(d for d in report["dimensions"] if d["dimension"] == "tier")
    assert tier["minimal"]["evidence"][0].startswith(f"reused {32 * tier['minimal']['full_blocks']} tokens")
    assert code == 1


def test_vllms_example_connector_leaks_through_its_tier(model_dir, tmp_path):
    # its key (_generate_foldername_debug) is the prompt's tokens: no salt, no adapter
    # without embeddings and salt-embeds: a second prompt-embeds request kills an engine with ExampleConnector
    # (docs/isolation.md "Second tiers")
    dims = ("salt", "adapter", "adapter-version", "cross", "salt-variant", "length", "salt-adapter", "eviction", "tier")
    extra = tuple(f"--dimension={d}" for d in dims)
    code, report = run(model_dir, VLLM_PYTHON, "shipped", 21870, tmp_path / "r.json", 1, 3600, extra)
    leaking = {d for d, v in verdicts(report).items() if v == "leak"}
    assert {"tier", "salt"} <= leaking, report
    assert code == 1
