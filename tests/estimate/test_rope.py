"""The rotary cos/sin caches vLLM builds with the model (kvtool.estimate.rope), against hand computations from vLLM's
rotary_embedding sources and the "Model loading took" lines of real logs (tests/data/gpu-logs)."""

from __future__ import annotations

import json

from kvtool.estimate.hf_config import parse_config
from kvtool.estimate.rope import rotary_cache_bytes, rotary_caches
from tests.support import DATA

LOGS = DATA / "gpu-logs"


def _bytes(case: str, version: str = "0.19.0") -> int:
    spec = parse_config(json.loads((LOGS / case / "config.json").read_text()), where=case)
    return rotary_cache_bytes(spec.rotary_caches, spec.model_type, 2, version)[0]


def test_llama4_scout_holds_ten_million_positions_on_every_rank():
    # llama4.py get_rope(max_position=config.max_position_embeddings): 10,485,760 x 128 x 2 B (llama3 rope: no
    # scaling of the length); the 2.5 GiB the TP 4 log's 53.12 GiB per GPU held beyond the weights' 50.6
    assert _bytes("llama-4-scout-h100-tp4-v0.19.0") == 10_485_760 * 128 * 2 == 2_684_354_560


def test_gemma3_keeps_a_linear_scaled_and_a_local_cache():
    # gemma3.py: full layers the config's linear rope (factor 8: linear_scaling_rope.py max_len = 131,072 x 8),
    # sliding layers a default rope at rope_local_base_freq; head_dim 256 (4B) and 128 (27B)
    assert _bytes("gemma-3-4b-it-h100-v0.19.0") == (131_072 * 8 + 131_072) * 256 * 2 == 603_979_776
    assert _bytes("gemma-3-27b-it-h100-v0.19.0") == (131_072 * 8 + 131_072) * 128 * 2


def test_mrope_holds_four_times_the_positions_until_qwen3_vl_takes_one():
    # mrope.py cache_max_position_num = max_position_embeddings * 4 (0.13.0); qwen3_vl.py mrope_positions_factor
    # (0.32.0): 1 without video pruning
    assert _bytes("qwen3-vl-30b-a3b-h100nvl-v0.13.0", "0.13.0") == 262_144 * 4 * 128 * 2
    assert _bytes("qwen3-vl-30b-a3b-h100nvl-v0.13.0", "0.32.0") == 262_144 * 128 * 2


def test_scaled_lengths_by_rope_type():
    base = {"max_position_embeddings": 32_768}
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}}
    (c,) = rotary_caches({**base, **yarn}, "qwen3", 128, None)
    assert (c.positions, c.rotary_dim) == (131_072, 128)  # yarn_scaling_rope.py: original x factor
    dynamic = {"rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert rotary_caches({**base, **dynamic}, "llama", 128, None)[0].positions == 65_536
    longrope = {"rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": [1],
                                 "original_max_position_embeddings": 4_096}}  # fmt: skip
    assert rotary_caches({**base, **longrope}, "phi3", 96, None)[0].positions == 4_096 + 32_768
    partial = {**base, "partial_rotary_factor": 0.25}
    assert rotary_caches(partial, "qwen3_next", 256, None)[0].rotary_dim == 64  # get_rope: head x factor
    assert rotary_caches(base, "nemotron_h", 128, None) == ()  # nemotron_h.py builds no rope


def test_the_caches_join_the_weights_per_gpu(run_cli):
    # Llama 3.1 8B at TP 2: 7.51 GiB logged per rank (llama-3.1-8b-h100-tp2-v0.19.0); half the weights plus a whole
    # 131,072 x 128 cache (32 MiB) on each rank
    case = LOGS / "llama-3.1-8b-h100-tp2-v0.19.0"
    args = ["estimate", "--config", str(case), "--seq-len", "8192", "--tp", "2", "--gpu", "h100-80gb", "--json"]
    out = json.loads(run_cli(*args, "--vllm-version", "0.19.0").stdout)
    assert out["weights_bytes_per_gpu"] == out["weights_bytes"] // 2 + 131_072 * 128 * 2
    assert "rotary caches 32 MiB per GPU (131,072 x 128 x 2 B)" in out["weights_method"]
