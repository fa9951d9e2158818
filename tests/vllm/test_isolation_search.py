"""The isolation search (kvtool issue 31) against the fake engine of tests/vllm/isolation_fake.py, whose defects
are the families a security reviewer planted in vLLM: salts compared case-insensitively, the salt ignored past
N blocks, tenants sharing on one adapter, a gateway giving tenants 1 and 3 one salt, the salt lost once the pool
evicted.  Each must be caught on its own dimension, with the first leak minimized; the correct engine is clean.
Expected numbers by hand: BLOCK = 16 tokens; the fake's max_model_len 512 caps prompts at (512 - 1 - 8) // 16 = 31
full blocks (kvtool.vllm.isolation.check._limits)."""

from __future__ import annotations

import pytest

from kvtool.core.errors import KvtoolError
from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.verdicts import judge_record
from tests.vllm.isolation_fake import BLOCK, FakeVllm


def run(fake: FakeVllm, **options):
    options = {"repeats": 1, "seed": 3, **options}
    record = run_isolation(IsolationOptions(endpoint=fake.url, **options))
    return record, judge_record(record)


def leaking(report) -> set[str]:
    return {d.dimension for d in report.dimensions if d.verdict == "leak"}


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_the_correct_engine_is_clean_on_every_dimension_and_length():
    with FakeVllm() as fake:
        _, report = run(fake, adapters=("lora-a",), hidden_size=8)
    assert report.verdict == "pass" and report.exit_code == 0
    lengths = dim(report, "length")
    # the ladder up to the 31-block cap, both sides of each power of two
    assert sorted({t.full_blocks for t in lengths.trial_verdicts}) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 31]
    variants = dim(report, "salt-variant")
    refused = [t for t in variants.trial_verdicts if t.verdict == "refused"]
    # vLLM 0.32 (and the fake) refuse an empty salt: both orders of empty-absent, named in the coverage
    assert len(refused) == 2 and any("empty-absent" in line for line in variants.coverage)
    assert all(d.minimal is None for d in report.dimensions)


@pytest.mark.parametrize(
    ("defect", "dimension", "minimal_blocks", "salts"),
    [
        ("casefold", "salt-variant", 1, ("a", "A")),
        ("salt-after:8", "length", 9, ("a", "b")),  # 8 full blocks pass, 9 leak: the minimum is 9
        ("adapter-shared", "salt-adapter", 1, ("a", "b")),
    ],
)
def test_each_planted_defect_is_caught_on_its_own_dimension_and_minimized(defect, dimension, minimal_blocks, salts):
    with FakeVllm(defects=frozenset({defect})) as fake:
        _, report = run(fake, adapters=("lora-a",), hidden_size=8)
    assert leaking(report) == {dimension} and report.exit_code == 1
    minimal = dim(report, dimension).minimal
    assert minimal.full_blocks == minimal_blocks and minimal.prompt_tokens == minimal_blocks * BLOCK + BLOCK // 2
    assert (minimal.first_salt, minimal.second_salt) == salts  # the simplest pair of its kind still leaked
    assert minimal.steps >= 1 and "reused" in minimal.evidence[0]


def test_a_gateway_giving_the_first_and_third_tenant_one_salt_is_caught():
    # neighbours only (1-2, 2-3) passed this gateway; all pairs in both orders catch 1-3 and 3-1, and only those
    keys = {"k1": "s1", "k2": "s2", "k3": "s1"}
    with FakeVllm(key_salts=keys, adapters=()) as fake:
        _, report = run(fake, api_keys=(("t1", "k1"), ("t2", "k2"), ("t3", "k3")), dimensions=("salt",))
    rows = [r for r in dim(report, "salt").rows if r.first.startswith("tenant:")]
    assert {(r.first, r.second) for r in rows if r.verdict == "leak"} == {
        ("tenant:t1", "tenant:t3"),
        ("tenant:t3", "tenant:t1"),
    }
    assert len({(r.first, r.second) for r in rows}) == 6  # 3 pairs x 2 orders


def test_the_salt_lost_after_evictions_is_caught_only_after_the_pool_evicted():
    # a pool large enough that nothing before the eviction dimension evicts (the search writes < 1500 blocks)
    with FakeVllm(defects=frozenset({"evict"}), pool_blocks=1500) as fake:
        record, report = run(fake, adapters=(), dimensions=("salt", "length", "eviction"))
    assert leaking(report) == {"eviction"}
    trial = next(t for t in record.plan.trials if t.dimension == "eviction")
    # fillers of 31 blocks each, more than the pool: ceil((1500 + 31) / 31) = 50 before each prime
    assert len(trial.fillers) == 50
    assert any("filler requests" in line for line in dim(report, "eviction").coverage)


def test_a_budget_bounds_the_requests_and_the_report_says_what_it_left_out():
    with FakeVllm() as fake:
        record, report = run(fake, adapters=("lora-a",), budget_requests=60, minimize=False)
    assert len(record.results) <= 60
    assert report.not_covered and any(p.name == "budget" and p.state == "partial" for p in report.preconditions)
    # coverage first: every dimension's first trials ran before any second pair of the first dimension's repeats
    assert {d.dimension for d in report.dimensions if d.trials} >= {"salt", "adapter"}


def precondition(report, name):
    return next(p for p in report.preconditions if p.name == name)


def test_prefix_caching_off_is_named_with_its_fix():
    with FakeVllm(caching=False) as fake:
        _, report = run(fake, adapters=(), dimensions=("salt",))
    assert report.verdict == "inconclusive" and report.exit_code == 4
    off = precondition(report, "prefix-caching")
    assert off.state == "failed" and 'enable_prefix_caching="False"' in off.detail
    assert "--enable-prefix-caching" in off.fix
    assert report.headline.startswith("prefix caching is off")


def test_a_cache_too_small_to_keep_a_prime_is_named_with_its_fix():
    # 3 blocks cannot keep a prime of 4 full blocks + a partial one (5 blocks); the fake's LRU drops the oldest
    # full blocks, so the control finds no prefix left
    with FakeVllm(pool_blocks=3, adapters=()) as fake:
        _, report = run(fake, dimensions=("salt",))
    assert report.verdict == "inconclusive"
    small = precondition(report, "cache-size")
    assert small.state == "failed" and "too small to keep a prime of 5 blocks" in small.detail
    assert "--kv-cache-memory-bytes" in small.fix and precondition(report, "prefix-caching").state == "ok"


def test_metrics_unavailable_is_named_with_its_fix():
    with FakeVllm(metrics=False, adapters=()) as fake:
        _, report = run(fake, dimensions=("salt",), block_size=BLOCK)
    metrics = precondition(report, "metrics")
    assert metrics.state == "failed" and "HTTP 404" in metrics.detail and "--block-size" in metrics.fix
    assert precondition(report, "kv-events").state == "missing"


def test_a_401_on_the_model_list_tips_at_key():
    with FakeVllm(models_status=401) as fake, pytest.raises(KvtoolError) as err:
        run(fake)
    assert "HTTP 401" in err.value.message and "--key" in err.value.tip


def test_budget_and_length_through_the_cli(run_cli):
    import json

    with FakeVllm(adapters=()) as fake:
        result = run_cli("vllm", "isolation", "--endpoint", fake.url, "--budget", "30", "--no-minimize", "--json")
        lengths = run_cli("vllm", "isolation", "--endpoint", fake.url, "--dimension", "length", "--length", "2",
                          "--length", "7", "--repeats", "1", "--json")  # fmt: skip
        refused = run_cli("vllm", "isolation", "--endpoint", fake.url, "--budget", "2")
    data = json.loads(result.stdout)
    assert data["probes"] <= 30 and data["not_covered"] and data["budget_requests"] == 30
    trials = next(d for d in json.loads(lengths.stdout)["dimensions"] if d["dimension"] == "length")
    assert sorted({t["full_blocks"] for t in trials["trial_verdicts"]}) == [2, 7]
    assert refused.exit_code == 2 and "--budget must be at least 3" in refused.stderr
