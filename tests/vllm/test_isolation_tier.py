"""The second-tier dimension (kvtool.vllm.isolation.tier) against the fake engine's KV-connector tier
(tests/vllm/isolation_fake.py, shaped like vLLM 0.32's ExampleConnector: whole prompts under a key of their aligned
tokens).  Expected numbers by hand: BLOCK = 16, prompts of 4 full blocks + 8 tokens = 72 tokens, so a control reuses
4 x 16 = 64 tokens; the fake's pool is 400 blocks and prompts are capped at (512 - 1 - 8) // 16 = 31 full blocks
(kvtool.vllm.isolation.check._limits), so each trial sends ceil((400 + 31) / 31) = 14 fillers of 31 blocks."""

from __future__ import annotations

import pytest

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.plan import FILLER, send_order
from kvtool.vllm.isolation.record import read_record, write_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.vllm.isolation_fake import BLOCK, FakeVllm


def run(fake: FakeVllm, **options):
    options = {"repeats": 1, "seed": 5, "adapters": ("lora-a",), **options}
    record = run_isolation(IsolationOptions(endpoint=fake.url, **options))
    return record, judge_record(record)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def leaking(report) -> set[str]:
    return {d.dimension for d in report.dimensions if d.verdict == "leak"}


def test_without_a_connector_the_tier_is_not_run_and_the_report_says_it_was_not_covered():
    with FakeVllm() as fake:
        _, report = run(fake, dimensions=("salt", "tier"))
    tier = dim(report, "tier")
    assert tier.verdict == "not run" and report.exit_code == 0
    # the detection request left vllm:external_prefix_cache_queries at 0
    assert tier.skipped_reason.startswith(
        "not covered: no KV connector (vllm:external_prefix_cache_queries stayed at 0"
    )
    line = next(p for p in report.preconditions if p.name == "kv-connector")
    assert line.state == "missing" and "--kv-transfer-config" in line.fix


def test_a_salted_write_back_tier_is_clean_and_every_control_came_from_the_tier():
    with FakeVllm(tier="salted", tier_lazy=True) as fake:
        record, report = run(fake, hidden_size=8)
    assert report.verdict == "pass", [(d.dimension, d.verdict) for d in report.dimensions]
    tier = dim(report, "tier")
    assert tier.trials == 2 and tier.controls_shared == 2 and tier.victims_reused == 0
    trials = [t for t in record.plan.trials if t.dimension == "tier"]
    assert [len(t.fillers) for t in trials] == [14, 14]
    # sent as prime, 14 fillers, victim, control; indices ascend in that order
    order = send_order(trials[0])
    assert [p.role for p in order] == ["prime", *[FILLER] * 14, "victim", "control"]
    assert [p.index for p in order] == sorted(p.index for p in order)
    assert "second tier: 2/2 controls served from the KV connector after the fillers" in " ".join(tier.evidence)
    assert "(vllm:external_prefix_cache_hits +128 tokens)" in " ".join(tier.evidence)  # 2 controls x 64 tokens
    assert any("KV connector detected: vllm:external_prefix_cache_queries rose by 24" in c for c in tier.coverage)
    assert next(p for p in report.preconditions if p.name == "kv-connector").state == "ok"


def test_a_write_back_tier_keyed_by_tokens_leaks_on_the_tier_dimension_only_minimized():
    # its entries appear once the GPU cache evicted their owner, so only a trial that evicts sees them
    with FakeVllm(tier="tokens", tier_lazy=True) as fake:
        _, report = run(fake, hidden_size=8)
    assert leaking(report) == {"tier"} and report.exit_code == 1
    tier = dim(report, "tier")
    assert tier.victims_reused == 2
    minimal = tier.minimal
    assert (minimal.first_salt, minimal.second_salt) == ("a", "b") and minimal.full_blocks == 1
    assert minimal.prompt_tokens == BLOCK + BLOCK // 2
    assert minimal.evidence[0].startswith(f"reused {BLOCK} tokens of salt='a' after the fillers (expected 0) "
                                          f"({BLOCK} from the KV connector")  # fmt: skip


def test_an_example_connector_like_tier_leaks_wherever_the_salt_differs():
    # ExampleConnector (vLLM 0.32) keys by tokens and serves whenever the GPU cache misses: every salted pair leaks,
    # the adapter pairs too (its key has no LoRA either)
    with FakeVllm(tier="tokens") as fake:
        _, report = run(fake)
    assert {"salt", "salt-variant", "length", "salt-adapter", "eviction", "tier", "adapter"} <= leaking(report)


def test_a_tier_that_keeps_nothing_is_its_own_precondition_not_a_pass():
    with FakeVllm(tier="salted", tier_keeps=False) as fake:
        _, report = run(fake, dimensions=("salt", "tier"))
    assert dim(report, "tier").verdict == "inconclusive" and report.exit_code == 4
    line = next(p for p in report.preconditions if p.name == "kv-connector")
    assert line.state == "failed" and line.detail.startswith("the tier did not keep the prime in 2/2 trials")
    assert report.headline == "the tier did not keep the prime"
    # the tier's misses are not blamed on the GPU cache's size
    assert next(p for p in report.preconditions if p.name == "cache-size").state == "ok"


def test_fillers_that_left_the_prime_on_the_gpu_are_named_not_passed():
    # num_gpu_blocks says 400, the cache keeps 10,000: the fillers (sized from 400) evict nothing, the control's
    # hit comes from the GPU cache (vllm:prefix_cache_hits +64), so the tier was not exercised
    with FakeVllm(tier="salted", hold_blocks=10_000) as fake:
        _, report = run(fake, dimensions=("tier",))
    tier = dim(report, "tier")
    assert tier.verdict == "inconclusive" and report.exit_code == 4
    assert (
        tier.trial_verdicts[0]
        .reasons[0]
        .startswith(
            "the fillers did not evict the prime from the GPU cache: 64 of the control's 64 tokens came from the GPU cache"
        )
    )
    assert report.headline == "the fillers did not evict the prime from the GPU cache"


@pytest.mark.parametrize("fmt", ["json"])
def test_a_tier_record_replays_to_the_same_verdicts(tmp_path, fmt):
    with FakeVllm(tier="tokens", tier_lazy=True) as fake:
        record, report = run(fake, dimensions=("salt", "tier"))
    path = tmp_path / f"run.{fmt}"
    write_record(record, path)
    again = judge_record(read_record(path))
    assert [(d.dimension, d.verdict) for d in again.dimensions] == [(d.dimension, d.verdict) for d in report.dimensions]
    assert again.engine.kv_connector == report.engine.kv_connector and again.engine.kv_connector.startswith("detected")
    replayed = read_record(path).results
    assert any(r.external_hits_after for r in replayed)
