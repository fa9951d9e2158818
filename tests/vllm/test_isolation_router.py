"""The isolation check behind a router (kvtool issue 31): tests/support/kv_router.py in front of two fake engines
(tests/vllm/isolation_fake.py), correct and with the planted defects users report of layers in front of vLLM.

By hand: a trial is prime, control, victim, one request each, so under round-robin over two engines trial k's prime
runs on engine (3k) mod 2, its control on the other engine and its victim back on the prime's: every control misses
and every victim lands where the prime is.  With --repeat-primes 2 the prime goes out twice in a row, so both
engines hold it before the control.  Under prefix routing the three share their first block, so one engine serves
all three.  Salt dimension: salt:a, salt:b, base = 3 pairs x 2 orders x 2 variants = 12 trials.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.client import parse_prefix_counters
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA
from tests.support.kv_router import KvRouter, merge_metrics
from tests.vllm.isolation_fake import BLOCK, FakeVllm


def run(policy: str, defect: str | None = None, dimensions=("salt",), **options):
    with FakeVllm(adapters=()) as a, FakeVllm(adapters=()) as b:
        with KvRouter([a.url, b.url], policy=policy, defect=defect, block_size=BLOCK) as router:
            options = {"repeats": 1, "seed": 5, "dimensions": dimensions, **options}
            record = run_isolation(IsolationOptions(endpoint=router.url, **options))
            routed = list(router.routed)
    return record, judge_record(record), routed


def pre(report, name):
    return next(p for p in report.preconditions if p.name == name)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_merged_metrics_label_each_backend_and_keep_one_header_per_family():
    # the /metrics vLLM 0.32 answered (tests/data/isolation/metrics-vllm-0.32.txt: 72 queried, 32 hit tokens), twice
    text = (DATA / "isolation" / "metrics-vllm-0.32.txt").read_text()
    merged = merge_metrics([text, text])
    assert merged.count("# HELP vllm:prefix_cache_queries_total") == 1
    counters = parse_prefix_counters(merged)
    assert counters.queries_tokens == 144.0 and counters.hits_tokens == 64.0
    assert counters.queries_by_engine == (("0", 72.0), ("1", 72.0))
    lines = merged.splitlines()
    queries = [n for n, line in enumerate(lines) if line.startswith("vllm:prefix_cache_queries_total")]
    assert queries == [queries[0], queries[0] + 1]  # one family's samples together, as Prometheus text requires


def test_prefix_routing_with_a_correct_router_is_clean_and_says_both_engines_were_seen():
    record, report, routed = run("prefix")
    assert report.verdict == "pass" and report.exit_code == 0
    assert record.engine.engines == 2 and set(routed) == {0, 1}  # both engines served trials
    for trial in record.plan.trials:  # one prompt, one engine: prime, control and victim together
        engines = {r.engine for r in record.results if r.probe.trial == trial.id}
        assert len(engines) == 1 and engines != {None}
    routing = pre(report, "routing")
    assert routing.state == "ok" and routing.detail.startswith("2 engines behind the endpoint")


def test_round_robin_is_named_as_the_router_spreading_the_trial_with_its_fix():
    record, report, routed = run("round-robin")
    assert routed[:6] == [0, 1, 0, 1, 0, 1]
    assert report.verdict == "inconclusive" and report.exit_code == 4
    assert report.headline == "the router spread the prime and the control over engines"
    routing = pre(report, "routing")
    assert routing.state == "failed" and "in 12/12 trials" in routing.detail
    assert "--repeat-primes 2" in routing.fix and "prefix" in routing.fix
    # the cache kept every prime where it went: cache-size is not blamed for the router's spreading
    assert pre(report, "cache-size").state == "ok"
    salt = dim(report, "salt")
    assert salt.controls_shared == 0 and all("the router spread them" in t.reasons[0] for t in salt.trial_verdicts)


def test_repeated_primes_make_round_robin_conclusive():
    record, report, _ = run("round-robin", repeat_primes=2)
    assert report.verdict == "pass" and pre(report, "routing").state == "ok"
    assert "each prime sent 2 times" in pre(report, "routing").detail
    assert len(record.results) == 12 * 4  # a copy of each prime, then prime, control, victim
    assert all(t.prime_cached_tokens == 0 for t in dim(report, "salt").trial_verdicts)  # the copy went elsewhere


def test_a_router_dropping_the_salt_leaks_every_salted_pair_minimized():
    _, report, _ = run("prefix", "drop-salt", dimensions=("salt", "salt-variant"))
    assert report.exit_code == 1
    salt = dim(report, "salt")
    assert salt.verdict == "leak" and salt.victims_reused == salt.trials == 12
    assert (
        salt.minimal.full_blocks == 1 and salt.minimal.evidence[0] == f"reused {BLOCK} tokens of salt='a' (expected 0)"
    )
    assert dim(report, "salt-variant").verdict == "leak"  # without a salt no pair of salts stays apart


def test_a_router_lower_casing_the_salt_leaks_only_the_case_variant():
    _, report, _ = run("prefix", "lowercase-salt", dimensions=("salt", "salt-variant"))
    assert dim(report, "salt").verdict == "pass"
    variants = dim(report, "salt-variant")
    assert variants.verdict == "leak" and {r.case for r in variants.rows if r.verdict == "leak"} == {"case"}
    assert (variants.minimal.first_salt, variants.minimal.second_salt) == ("a", "A")


def test_round_robin_still_convicts_a_leak_its_victims_land_on_the_prime():
    # a miss means nothing away from the prime, but a hit is a hit: the salt-dropping router under round-robin
    _, report, _ = run("round-robin", "drop-salt", minimize=False)
    assert dim(report, "salt").verdict == "leak" and report.exit_code == 1


@pytest.mark.parametrize("value", ["0", "-1"])
def test_repeat_primes_below_one_is_refused(run_cli, value):
    result = run_cli("vllm", "isolation", "--endpoint", "http://127.0.0.1:9", "--repeat-primes", value)
    assert result.exit_code == 2
    assert f"--repeat-primes must be at least 1, not {value}" in result.stderr


def test_without_knowing_which_engine_served_a_request_the_routing_line_says_the_router_may_be_why():
    # the round-robin run with the per-request engine erased (as when other traffic moves every engine's counters)
    record, _, _ = run("round-robin")
    record = dataclasses.replace(record, results=tuple(dataclasses.replace(r, engine=None) for r in record.results))
    report = judge_record(record)
    routing = pre(report, "routing")
    assert routing.state == "failed" and "12/12 controls missed" in routing.detail
    assert report.headline == "the router may have spread the prime and the control over engines"
    assert pre(report, "cache-size").state == "failed"  # the cache cannot be cleared either


def test_a_router_showing_one_engine_leaves_the_cache_size_line_with_the_router_tip():
    record, _, _ = run("round-robin")
    record = without_engines(record)
    report = judge_record(record)
    assert not any(p.name == "routing" for p in report.preconditions)
    cache = pre(report, "cache-size")
    assert cache.state == "failed" and "--repeat-primes N" in cache.fix


def without_engines(record):
    """The record as a router summing its engines' metrics into one would leave it: no engine seen."""
    results = tuple(dataclasses.replace(r, engine=None) for r in record.results)
    return dataclasses.replace(record, results=results, engine=dataclasses.replace(record.engine, engines=None))
