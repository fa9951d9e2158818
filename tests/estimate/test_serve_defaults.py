"""vllm serve's max_num_seqs and max_num_batched_tokens by GPU: one rule for estimate, simulate and the API.

The reference is vLLM 0.32.0's own code, vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults`` (applied by
``_set_default_max_num_seqs_and_batched_tokens_args`` with ``usage_context=OPENAI_API_SERVER`` for ``vllm serve``):

    if device_memory >= 160 * GiB_bytes:                          # B200/B300
        max_num_batched_tokens 16384, max_num_seqs 1024
    elif device_memory >= 70 * GiB_bytes and "a100" not in device_name:   # H100, H200
        max_num_batched_tokens 8192,  max_num_seqs 1024
    else:                                                          # and when the device cannot be queried
        max_num_batched_tokens 2048,  max_num_seqs 256

``device_memory`` is the device's total memory (torch.cuda.get_device_properties().total_memory), which is what a
GPU profile's ``memory_gib`` records (an H100-80GB reports 79.2 GiB, a B200 178.4 GiB).
"""

from __future__ import annotations

import json
import re

import pytest

from kvtool.estimate.profiles import find_gpu
from kvtool.estimate.serve_defaults import BATCH_DEFAULTS_RULES, serve_batch_defaults

GIB = 1024**3


@pytest.mark.parametrize(
    ("gpu", "seqs", "tokens"),
    [
        ("h100-80gb", 1024, 8192),  # 79.2 GiB, not an A100
        ("h200", 1024, 8192),  # 139.8 GiB
        ("h100-nvl", 1024, 8192),
        ("a100-80gb", 256, 2048),  # >= 70 GiB but an A100 (PR #17885)
        ("a100-40gb", 256, 2048),
        ("l4", 256, 2048),  # 22 GiB
        ("l40s", 256, 2048),
        ("b200", 1024, 16384),  # 178.4 GiB
        ("mi300x", 1024, 16384),  # 191.7 GiB
    ],
)
def test_serve_defaults_follow_vllm_0_32_get_batch_defaults(gpu, seqs, tokens):
    profile = find_gpu(gpu)
    got = serve_batch_defaults(profile.memory_bytes, profile.name)
    assert (got.max_num_seqs, got.max_num_batched_tokens) == (seqs, tokens)
    assert got.source == "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.28.0)"


def test_the_boundaries_are_vllms():
    # exactly 70 GiB and 160 GiB take the larger defaults (vLLM compares with >=)
    assert serve_batch_defaults(70 * GIB, "x").max_num_seqs == 1024
    assert serve_batch_defaults(70 * GIB - 1, "x").max_num_seqs == 256
    assert serve_batch_defaults(160 * GIB, "a100").max_num_batched_tokens == 16384
    assert serve_batch_defaults(160 * GIB - 1, "x").max_num_batched_tokens == 8192
    # no device (--kv-memory): vLLM's except branch sets device_memory = 0, the smallest defaults
    unknown = serve_batch_defaults(None, None)
    assert (unknown.max_num_seqs, unknown.max_num_batched_tokens) == (256, 2048)


def test_a_size_alone_says_what_an_a100_would_use():
    said = serve_batch_defaults(80 * GIB, None)
    assert said.max_num_seqs_words() == (
        "max-num-seqs 1024 (vllm serve's default on non-A100 GPUs with >= 70 GiB; an A100 would use 256: "
        "pass --max-num-seqs)"
    )
    assert said.max_num_batched_tokens_words().endswith("; an A100 would use 2048: pass --max-num-batched-tokens)")
    assert "A100" not in serve_batch_defaults(80 * GIB, "H100-80GB").max_num_seqs_words().replace("non-A100", "")


def test_every_rule_names_its_upstream_function():
    # "vllm/<path> <function> (X.Y.Z)", X.Y.Z the row's own since
    for rule in BATCH_DEFAULTS_RULES:
        assert re.fullmatch(r"vllm/\S+\.py \S+ \((\d+\.\d+\.\d+)\)", rule.source), rule.source
        assert rule.source.endswith(f"({rule.since})")


@pytest.mark.parametrize(
    ("version", "tokens"),
    [
        # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.27.1): ">= 70 GiB and not an A100" is the
        # largest tier, so a B200 (178.4 GiB) takes 8192; the ">= 160 GiB" tier with 16384 first appears in 0.28.0
        ("0.10.0", 8192),
        ("0.27.1", 8192),
        ("0.28.0", 16384),
        ("0.33.0", 16384),
    ],
)
def test_the_160_gib_tier_starts_at_0_28(version, tokens):
    b200 = find_gpu("b200")
    got = serve_batch_defaults(b200.memory_bytes, b200.name, version)
    assert (got.max_num_seqs, got.max_num_batched_tokens) == (1024, tokens)
    assert got.source.endswith("(0.10.0)" if version < "0.28" else "(0.28.0)")


def test_estimate_states_the_rule_it_took(run_cli):
    out = json.loads(run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--json").stdout)
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (1024, 8192)
    assert "max-num-seqs 1024 (vllm serve's default on non-A100 GPUs with >= 70 GiB)" in out["defaults"]
    out = json.loads(run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--json").stdout)
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (256, 2048)
    assert "max-num-seqs 256 (vllm serve's default on A100s)" in out["defaults"]
