"""The verdict rules on hand-made observations (each expectation follows from the rule, worked by hand)."""

from __future__ import annotations

import dataclasses

import pytest

from kvtool.vllm.isolation.plan import DimensionPartitions, Partition, PlanOptions, plan_trials
from kvtool.vllm.isolation.record import RECORD_FORMAT, EngineInfo, IsolationRecord, ProbeResult
from kvtool.vllm.isolation.verdicts import judge_record, timing_channel

BLOCK = 32
A, B = Partition("salt:a", cache_salt="a"), Partition("salt:b", cache_salt="b")
ENGINE = EngineInfo("endpoint", "http://x", "base", BLOCK, None, None)


def one_trial_plan():
    """One exact-variant trial salt:a -> salt:b: prompts of 4 full blocks + 16 tokens (144 tokens)."""
    plan = plan_trials((DimensionPartitions("salt", ((A, B),)),), PlanOptions(BLOCK, repeats=1, seed=1), "t")
    trial = plan.trials[0]
    return dataclasses.replace(plan, trials=(trial,)), trial


def record(cached: tuple[int, int, int], *, events=None, hits=None, queries=None, latency=(0.2, 0.05, 0.2)):
    """prime, control, victim with the given cached tokens; counters move by the probe's own prompt unless told."""
    plan, trial = one_trial_plan()
    results, q, h = [], 0.0, 0.0
    for n, (probe, c) in enumerate(zip(trial.probes, cached)):
        dq = 144 if queries is None else queries[n]
        dh = c if hits is None else hits[n]
        results.append(ProbeResult(probe, c, 144, 100.0 + n, latency[n], q, h, q + dq, h + dh))
        q, h = q + dq, h + dh
    return IsolationRecord(RECORD_FORMAT, ENGINE, plan, tuple(results), events, ())


def trial_of(rec):
    return judge_record(rec).dimensions[0].trial_verdicts[0]


def test_plan_shape():
    plan, trial = one_trial_plan()
    prime, control, victim = trial.probes
    assert plan.prompt_tokens == 4 * BLOCK + BLOCK // 2  # four full blocks plus a partial one
    assert (prime.partition, control.partition, victim.partition) == (A, A, B)
    assert prime.block_seeds == control.block_seeds == victim.block_seeds  # exact variant: one prompt
    assert [p.expected_cached_tokens for p in trial.probes] == [0, 4 * BLOCK, 0]


def test_plan_runs_both_orders_both_variants_on_fresh_content():
    plan = plan_trials((DimensionPartitions("salt", ((A, B),)),), PlanOptions(BLOCK, repeats=2, seed=1), "t")
    assert [(t.first, t.second, t.variant) for t in plan.trials[:4]] == [
        ("salt:a", "salt:b", "exact"), ("salt:a", "salt:b", "prefix"),
        ("salt:b", "salt:a", "exact"), ("salt:b", "salt:a", "prefix"),
    ]  # fmt: skip
    assert len(plan.trials) == 8
    primes = [t.probes[0].block_seeds for t in plan.trials]
    assert len({s for seeds in primes for s in seeds}) == 8 * 5  # no block content reused across trials
    prefix = plan.trials[1].probes
    assert prefix[1].block_seeds[:2] == prefix[0].block_seeds[:2] != prefix[1].block_seeds[2:3]
    assert prefix[1].expected_cached_tokens == 2 * BLOCK and prefix[2].expected_cached_tokens == 0
    assert len({p.session_id for p in plan.probes}) == len(plan.probes)


def test_pass_leak_and_inconclusive_from_cached_tokens():
    assert trial_of(record((0, 128, 0))).verdict == "pass"
    leak = trial_of(record((0, 128, 128)))
    assert leak.verdict == "leak" and leak.reasons[0] == "reused 128 tokens of salt:a (expected 0)"
    # the control shared nothing: the victim's miss proves nothing
    doubt = trial_of(record((0, 0, 0)))
    assert doubt.verdict == "inconclusive" and "control reused 0 of 128" in doubt.reasons[0]
    # a victim hit is a leak even when the control failed
    assert trial_of(record((0, 0, 64))).verdict == "leak"
    assert trial_of(record((32, 128, 0))).verdict == "inconclusive"  # the "fresh" prime was already cached


def stored(session, hashes, ts):
    return {"seq": 0, "batch_ts": ts, "type": "BlockStored", "block_hashes": hashes, "session_id": session}


def test_published_hashes_prove_a_leak_the_cached_tokens_missed():
    rec = record((0, 128, 0))
    s = [p.session_id for p in rec.plan.trials[0].probes]
    events = (stored(s[0], [1, 2, 3, 4], 100.1), stored(s[1], [1, 2, 3, 4], 101.1), stored(s[2], [1, 9, 8, 7], 102.1))
    verdict = trial_of(dataclasses.replace(rec, events=events))
    assert verdict.verdict == "leak" and verdict.hashes.victim_shared_blocks == 1
    clean = (stored(s[0], [1, 2, 3, 4], 100.1), stored(s[1], [1, 2, 3, 4], 101.1), stored(s[2], [5, 6, 7, 8], 102.1))
    report = judge_record(dataclasses.replace(rec, events=clean))
    assert report.verdict == "pass" and report.dimensions[0].trial_verdicts[0].hashes.control_shared_blocks == 4


def test_an_eviction_before_the_victim_makes_a_clean_victim_inconclusive():
    rec = record((0, 128, 0))
    s = [p.session_id for p in rec.plan.trials[0].probes]
    removed = {"seq": 3, "batch_ts": 101.5, "type": "BlockRemoved", "block_hashes": [3]}
    events = (stored(s[0], [1, 2, 3, 4], 100.1), stored(s[1], [1, 2, 3, 4], 101.1), removed, stored(s[2], [5], 102.1))
    verdict = trial_of(dataclasses.replace(rec, events=events))
    assert verdict.verdict == "inconclusive" and "evicted" in verdict.reasons[0]


def test_metric_deltas_count_only_when_no_other_traffic_moved_them():
    # the victim reports 0 cached tokens but the hits counter rose by 128 while only its own 144 tokens were queried
    assert trial_of(record((0, 128, 0), hits=(0, 128, 128))).verdict == "leak"
    # the same rise with 288 tokens queried (someone else's request too) is not evidence
    other = trial_of(record((0, 128, 0), hits=(0, 128, 128), queries=(144, 144, 288)))
    assert other.verdict == "pass" and other.metric_clean_probes == 2


def test_timing_is_a_channel_never_a_verdict():
    # Mann-Whitney by hand: every miss slower than every hit -> 1.0; identical -> 0.5
    assert timing_channel([0.01] * 4, [0.1] * 4).hit_miss_auc == 1.0
    assert timing_channel([0.1] * 4, [0.1] * 4).hit_miss_auc == 0.5
    assert timing_channel([0.01, 0.3], [0.1, 0.2]).hit_miss_auc == 0.5  # 2 of 4 pairs
    assert not timing_channel([0.01] * 3, [0.1] * 3).present  # too few samples to claim a channel
    fast_victim = record((0, 128, 0), latency=(0.5, 0.01, 0.01))  # the victim is as fast as a hit
    assert judge_record(fast_victim).verdict == "pass"


# 0 pass, 1 leak, 4 inconclusive (it was 2, the usage-error code): README "Exit codes", kvtool.core.errors
@pytest.mark.parametrize(("cached", "code"), [((0, 128, 0), 0), ((0, 128, 128), 1), ((0, 0, 0), 4)])
def test_exit_codes(cached, code):
    assert judge_record(record(cached)).exit_code == code


def test_a_trial_without_kv_events_is_judged_on_the_rest():
    rec = record((0, 128, 0))
    other = stored("someone-else", [42], 100.5)  # events were captured, none for this trial's sessions
    verdict = trial_of(dataclasses.replace(rec, events=(other,)))
    assert verdict.verdict == "pass" and verdict.hashes is None
    assert judge_record(dataclasses.replace(rec, events=(other,))).dimensions[0].rows[0].evidence == "tokens+metrics"
