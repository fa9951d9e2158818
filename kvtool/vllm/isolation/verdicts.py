"""Verdicts of the isolation check, from a record alone (no engine needed: recorded runs replay here).

Evidence, strongest first:

1. **Cached tokens** per request (``usage.prompt_tokens_details.cached_tokens``): a victim that reports more
   cached tokens than a correct engine would (0, or the blocks with equal embedding rows) reused another
   partition's KV blocks: **leak**.  A control that reports fewer than its prime stored proves nothing about the
   victim after it (cache off, evicted, too small): **inconclusive**, never pass.
2. **Published block hashes** (KV events, with every request's full blocks re-published through
   ``kv_cache_report_mode=full`` and tagged with the probe's ``session_id``): a victim publishing a hash its
   prime published, or one hash published under two partitions, is a leak; prime blocks removed before the
   victim ran make a clean victim inconclusive (an eviction turns a leak into an apparent miss).
3. **Metric deltas** (``vllm:prefix_cache_hits``): used only for a probe whose ``queries`` delta equals its own
   prompt length, i.e. when no other traffic moved the counters; a clean delta above the expected hits is a leak.
4. **Timing** is reported as a channel (how well latency tells a hit from a miss, as an AUC), never as a verdict.

A trial is a leak when any evidence says so, inconclusive when its control failed (or its prime was evicted
before the victim ran), and a pass otherwise; a trial without KV events is judged on the rest.  A dimension passes
only when every trial passed.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from kvtool.vllm.isolation.plan import DIMENSION_TITLES, DIMENSIONS, Partition
from kvtool.vllm.isolation.record import EngineInfo, IsolationRecord, ProbeResult

PASS, LEAK, INCONCLUSIVE = "pass", "leak", "inconclusive"
TIMING_CHANNEL_AUC = 0.75  # an AUC at or above this (with MIN_TIMING_SAMPLES each side) = "channel present"
MIN_TIMING_SAMPLES = 4


@dataclasses.dataclass(frozen=True)
class HashEvidence:
    """What the KV events of one trial show (hash counts are full blocks)."""

    prime_blocks: int  # distinct hashes the prime published
    control_shared_blocks: int  # control hashes equal to the prime's
    victim_shared_blocks: int  # victim hashes equal to the prime's or the control's
    evicted_before_victim: int  # prime/control hashes removed (BlockRemoved) before the victim was sent


@dataclasses.dataclass(frozen=True)
class TrialVerdict:
    trial: str
    dimension: str
    variant: str  # exact | prefix
    first: str  # partition of prime and control
    second: str  # partition of the victim
    prime_cached_tokens: int
    control_cached_tokens: int
    control_expected_tokens: int
    victim_cached_tokens: int
    victim_expected_tokens: int  # the most a correct engine reuses for the victim
    hashes: HashEvidence | None  # None when KV events were not captured for this trial
    metric_clean_probes: int  # of the three, probes whose counter deltas no other traffic moved
    verdict: str
    reasons: tuple[str, ...]  # why, strongest evidence first


@dataclasses.dataclass(frozen=True)
class PairRow:
    """One row of a dimension's table: an ordered partition pair and variant, over its repeats."""

    first: str
    second: str
    variant: str
    trials: int
    control_cached_tokens: tuple[int, ...]  # one per repeat
    control_expected_tokens: int
    victim_cached_tokens: tuple[int, ...]
    victim_expected_tokens: int
    verdict: str
    evidence: str  # the strongest evidence, in words


@dataclasses.dataclass(frozen=True)
class TimingChannel:
    """Whether request latency tells a prefix hit (controls) from a miss (primes)."""

    hit_miss_auc: float  # P(a miss is slower than a hit); 0.5 = no channel, 1.0 = perfect
    hits: int
    misses: int
    present: bool  # AUC >= TIMING_CHANNEL_AUC with enough samples: timing reveals cache hits


@dataclasses.dataclass(frozen=True)
class DimensionResult:
    dimension: str
    title: str
    verdict: str  # pass | leak | inconclusive | not run
    trials: int
    controls_shared: int  # trials whose control reused all the blocks it should
    victims_reused: int  # trials whose victim reused more than a correct engine allows
    rows: tuple[PairRow, ...]
    evidence: tuple[str, ...]  # strongest first
    timing: TimingChannel | None
    skipped_reason: str | None  # why the dimension did not run
    trial_verdicts: tuple[TrialVerdict, ...]


@dataclasses.dataclass(frozen=True)
class IsolationReport:
    engine: EngineInfo
    verdict: str  # pass | leak | inconclusive
    exit_code: int  # 0 pass, 1 leak, 4 inconclusive (kvtool.core.errors)
    probes: int
    events_captured: int | None  # KV events in the record; None when not captured
    dimensions: tuple[DimensionResult, ...]


def _partition_key(partition: Partition) -> tuple[Any, ...]:
    return (partition.model, partition.cache_salt, partition.api_key, partition.adapter_path)


class _Events:
    """The record's KV events indexed by session (probe) and by removal time."""

    def __init__(self, rows: Iterable[dict[str, Any]]):
        self.stored: dict[str, set[Any]] = defaultdict(set)
        self.removed: list[tuple[float, Any]] = []
        for row in rows:
            hashes = row.get("block_hashes") or []
            if row.get("type") == "BlockStored" and row.get("session_id"):
                self.stored[str(row["session_id"])].update(hashes)
            elif row.get("type") == "BlockRemoved":
                ts = float(row.get("batch_ts") or 0.0)
                self.removed.extend((ts, h) for h in hashes)
            elif row.get("type") == "AllBlocksCleared":
                self.removed.append((float(row.get("batch_ts") or 0.0), None))

    def removed_between(self, hashes: set[Any], start_s: float, end_s: float) -> int:
        return sum(1 for ts, h in self.removed if start_s <= ts < end_s and (h is None or h in hashes))


def _hash_evidence(events: _Events, prime: ProbeResult, control: ProbeResult, victim: ProbeResult) -> HashEvidence:
    p = events.stored.get(prime.probe.session_id, set())
    c = events.stored.get(control.probe.session_id, set())
    v = events.stored.get(victim.probe.session_id, set())
    evicted = events.removed_between(p | c, prime.sent_at_s, victim.sent_at_s)
    return HashEvidence(len(p), len(c & p), len(v & (p | c)), evicted)


def _metric_clean(result: ProbeResult) -> bool:
    values = (result.queries_before, result.queries_after, result.hits_before, result.hits_after)
    if any(v is None for v in values) or result.prompt_tokens is None:
        return False
    return result.queries_after - result.queries_before == result.prompt_tokens  # type: ignore[operator]


def _metric_hits(result: ProbeResult) -> float:
    return result.hits_after - result.hits_before  # type: ignore[operator]


def judge_trial(
    prime: ProbeResult, control: ProbeResult, victim: ProbeResult, events: _Events | None, block_size: int
) -> TrialVerdict:
    """The verdict of one trial (see the module docstring for the rules)."""
    leaks: list[str] = []
    doubts: list[str] = []
    v_expected = victim.probe.expected_cached_tokens
    c_expected = control.probe.expected_cached_tokens
    first, second = prime.probe.partition.label, victim.probe.partition.label
    # 1. cached tokens
    if victim.cached_tokens > v_expected:
        leaks.append(f"reused {victim.cached_tokens} tokens of {first} (expected {v_expected})")
    if prime.cached_tokens > 0:
        doubts.append(f"the fresh prime already had {prime.cached_tokens} cached tokens")
    if control.cached_tokens < c_expected:
        doubts.append(
            f"control reused {control.cached_tokens} of {c_expected} tokens: the cache did not keep the prime"
        )
    # 2. published hashes
    hashes = None
    if events is not None and prime.probe.session_id in events.stored:
        hashes = _hash_evidence(events, prime, control, victim)
        expected_blocks = v_expected // block_size
        if hashes.victim_shared_blocks > expected_blocks:
            leaks.append(
                f"published {hashes.victim_shared_blocks} block hashes of {first} (expected {expected_blocks})"
            )
        if hashes.evicted_before_victim and not leaks:
            doubts.append(f"{hashes.evicted_before_victim} of the prime's blocks were evicted before the victim ran")
    # 3. metric deltas, only where no other traffic moved the counters
    clean = [r for r in (prime, control, victim) if _metric_clean(r)]
    if victim in clean and _metric_hits(victim) > v_expected:
        leaks.append(f"vllm:prefix_cache_hits rose by {_metric_hits(victim):g} tokens")
    verdict = LEAK if leaks else INCONCLUSIVE if doubts else PASS
    return TrialVerdict(
        prime.probe.trial, prime.probe.dimension, _variant(prime, control), first, second,
        prime.cached_tokens, control.cached_tokens, c_expected, victim.cached_tokens, v_expected,
        hashes, len(clean), verdict, tuple(leaks + doubts),
    )  # fmt: skip


def _variant(prime: ProbeResult, control: ProbeResult) -> str:
    return "exact" if prime.probe.block_seeds == control.probe.block_seeds else "prefix"


def timing_channel(hit_latencies: list[float], miss_latencies: list[float]) -> TimingChannel | None:
    """Mann-Whitney AUC of 'a miss is slower than a hit' (ties count half)."""
    if not hit_latencies or not miss_latencies:
        return None
    wins = sum((m > h) + 0.5 * (m == h) for m in miss_latencies for h in hit_latencies)
    auc = wins / (len(hit_latencies) * len(miss_latencies))
    enough = min(len(hit_latencies), len(miss_latencies)) >= MIN_TIMING_SAMPLES
    return TimingChannel(round(auc, 3), len(hit_latencies), len(miss_latencies), enough and auc >= TIMING_CHANNEL_AUC)


def _combine(verdicts: Iterable[str]) -> str:
    found = list(verdicts)
    if LEAK in found:
        return LEAK
    if not found or INCONCLUSIVE in found:
        return INCONCLUSIVE
    return PASS


def _rows(trials: list[TrialVerdict]) -> tuple[PairRow, ...]:
    groups: dict[tuple[str, str, str], list[TrialVerdict]] = {}
    for t in trials:
        groups.setdefault((t.first, t.second, t.variant), []).append(t)
    rows = []
    for (first, second, variant), group in groups.items():
        verdict = _combine(t.verdict for t in group)
        reasons = [r for t in group if t.verdict == verdict for r in t.reasons]
        if reasons:
            evidence = reasons[0]
        else:  # which kinds of evidence agreed, strongest first
            kinds = ["tokens"]
            kinds += ["hashes"] if all(t.hashes is not None for t in group) else []
            kinds += ["metrics"] if all(t.metric_clean_probes == 3 for t in group) else []
            evidence = "+".join(kinds)
        rows.append(
            PairRow(first, second, variant, len(group), tuple(t.control_cached_tokens for t in group),
                    group[0].control_expected_tokens, tuple(t.victim_cached_tokens for t in group),
                    group[0].victim_expected_tokens, verdict, evidence)
        )  # fmt: skip
    return tuple(rows)


def _cross_partition_hashes(results: list[ProbeResult], events: _Events) -> int:
    """Hashes published under two different partitions (token dimensions: fresh prompts never legitimately do)."""
    owners: dict[Any, set[tuple[Any, ...]]] = defaultdict(set)
    for r in results:
        if r.probe.kind == "tokens":
            for h in events.stored.get(r.probe.session_id, ()):
                owners[h].add(_partition_key(r.probe.partition))
    return sum(1 for keys in owners.values() if len(keys) > 1)


def _victims_reused(trials: list[TrialVerdict]) -> int:
    return sum(1 for t in trials if t.victim_cached_tokens > t.victim_expected_tokens)


def _controls_shared(trials: list[TrialVerdict]) -> int:
    return sum(1 for t in trials if t.control_cached_tokens >= t.control_expected_tokens)


def _dimension_evidence(
    trials: list[TrialVerdict], results: list[ProbeResult], events: _Events | None, timing: TimingChannel | None
) -> tuple[str, ...]:
    lines = []
    victims, controls = _victims_reused(trials), _controls_shared(trials)
    lines.append(f"cached tokens: {controls}/{len(trials)} controls shared, {victims} victims reused another's blocks")
    if events is not None:
        with_hashes = [t for t in trials if t.hashes is not None]
        shared = _cross_partition_hashes(results, events)
        lines.append(
            f"KV events: hashes for {len(with_hashes)}/{len(trials)} trials; {shared} hashes published under two "
            "partitions"
        )
    else:
        lines.append("KV events: not captured")
    clean = sum(t.metric_clean_probes for t in trials)
    lines.append(f"metrics: {clean}/{3 * len(trials)} probes had counter deltas no other traffic moved")
    if timing is not None:
        state = "present" if timing.present else "not evident"
        lines.append(
            f"timing channel {state}: latency tells a hit from a miss with AUC {timing.hit_miss_auc:.2f} "
            f"({timing.hits} hits, {timing.misses} misses; not a verdict)"
        )
    return tuple(lines)


def judge_dimension(
    dimension: str, results: list[ProbeResult], events: _Events | None, block_size: int
) -> DimensionResult:
    by_trial: dict[str, dict[str, ProbeResult]] = {}
    for r in results:
        by_trial.setdefault(r.probe.trial, {})[r.probe.role] = r
    trials = [
        judge_trial(t["prime"], t["control"], t["victim"], events, block_size)
        for t in by_trial.values()
        if {"prime", "control", "victim"} <= t.keys()
    ]
    hits = [r.latency_s for r in results if r.probe.role == "control" and r.cached_tokens > 0]
    misses = [r.latency_s for r in results if r.probe.role == "prime" and r.cached_tokens == 0]
    timing = timing_channel(hits, misses)
    verdict = _combine(t.verdict for t in trials)
    evidence = _dimension_evidence(trials, results, events, timing)
    return DimensionResult(
        dimension, DIMENSION_TITLES[dimension], verdict, len(trials), _controls_shared(trials),
        _victims_reused(trials), _rows(trials), evidence, timing, None, tuple(trials),
    )  # fmt: skip


def judge_record(record: IsolationRecord) -> IsolationReport:
    """Every dimension's verdict, the overall verdict and its exit code."""
    events = None if record.events is None else _Events(record.events)
    results_by_dim: dict[str, list[ProbeResult]] = defaultdict(list)
    for r in record.results:
        results_by_dim[r.probe.dimension].append(r)
    skipped = {s.dimension: s.reason for s in record.skipped}
    dims = []
    for dimension in DIMENSIONS:
        if dimension in results_by_dim:
            dims.append(judge_dimension(dimension, results_by_dim[dimension], events, record.plan.block_size))
        elif dimension in skipped:
            dims.append(
                DimensionResult(dimension, DIMENSION_TITLES[dimension], "not run", 0, 0, 0, (), (), None,
                                skipped[dimension], ())
            )  # fmt: skip
    verdict = _combine(d.verdict for d in dims if d.verdict != "not run")
    exit_code = {PASS: EXIT_OK, LEAK: EXIT_CHECK_FAILED}.get(verdict, EXIT_INCONCLUSIVE)
    n_events = None if record.events is None else len(record.events)
    return IsolationReport(record.engine, verdict, exit_code, len(record.results), n_events, tuple(dims))
