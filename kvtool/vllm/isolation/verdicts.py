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
4. **Timing** is reported as a channel (how well latency tells a hit from a miss: Mann-Whitney AUC with its
   Hanley-McNeil interval, kvtool.vllm.isolation.timing), never as a verdict.

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
from kvtool.vllm.isolation.multimodal import IMAGE_KIND, control_expected_tokens
from kvtool.vllm.isolation.plan import DIMENSION_TITLES, DIMENSIONS, FILLER, Partition, Trial
from kvtool.vllm.isolation.record import EngineInfo, IsolationRecord, ProbeResult
from kvtool.vllm.isolation.routing import TrialPath, routing_line, trial_path

PASS, LEAK, INCONCLUSIVE, REFUSED = "pass", "leak", "inconclusive", "refused"
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
    full_blocks: int = 4  # the prime's full blocks
    case: str = ""  # what the pair varies (salt variants, combinations)
    stage: str = "search"  # search | minimize
    prompt_tokens: int = 0  # the prime's length in tokens
    spread: bool = False  # behind a router: the control or victim ran where no copy of the prime went (routing)


@dataclasses.dataclass(frozen=True)
class MinimalCase:
    """The first leaking case of a dimension, shrunk: the shortest prompt, then the simplest salt pair, that still
    leaked (each shrinking step is a trial of its own in the record)."""

    first: str
    second: str
    first_salt: str | None
    second_salt: str | None
    variant: str
    full_blocks: int
    prompt_tokens: int
    trial: str  # the trial that convicted it
    evidence: tuple[str, ...]  # that trial's reasons
    searched_from_blocks: int  # the length of the first leaking search trial
    steps: int  # minimization trials run


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
    full_blocks: int = 4
    case: str = ""


@dataclasses.dataclass(frozen=True)
class TimingChannel:
    """Whether request latency tells a prefix hit (controls) from a miss (primes), as statistics
    (kvtool.vllm.isolation.timing)."""

    hit_miss_auc: float  # P(a miss is slower than a hit); 0.5 = no channel, 1.0 = perfect
    hits: int
    misses: int
    present: bool  # the AUC's 95% interval lies above 0.5 (with MIN_TIMING_SAMPLES a side): misses are slower
    auc_ci_low: float = 0.0  # Hanley-McNeil 95% interval of the AUC
    auc_ci_high: float = 1.0
    mann_whitney_u: float = 0.0  # U of the misses (slower) over the hits
    p_value: float = 1.0  # two-sided, normal approximation with tie correction
    samples_for_power: int | None = None  # per side, to tell this AUC from 0.5 at alpha 0.05 with power 0.8
    median_hit_ms: float = 0.0
    median_miss_ms: float = 0.0
    decides: bool = False  # the interval excludes 0.5; when False, say timing cannot decide


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
    minimal: MinimalCase | None = None  # the first leak, minimized (leaking dimensions only)
    coverage: tuple[str, ...] = ()  # what ran (lengths, cases, orders) and what did not (budget, refused)


@dataclasses.dataclass(frozen=True)
class Precondition:
    """One thing the check needs from the engine; a failed one is its own verdict line with its fix."""

    name: str  # prefix-caching | cache-size | metrics | kv-events | budget
    state: str  # ok | failed | unknown
    detail: str
    fix: str | None
    summary: str = ""  # a failed one in a few words: the headline of an inconclusive verdict


@dataclasses.dataclass(frozen=True)
class IsolationReport:
    engine: EngineInfo
    verdict: str  # pass | leak | inconclusive
    exit_code: int  # 0 pass, 1 leak, 4 inconclusive (kvtool.core.errors)
    probes: int
    events_captured: int | None  # KV events in the record; None when not captured
    dimensions: tuple[DimensionResult, ...]
    preconditions: tuple[Precondition, ...] = ()
    headline: str = ""  # the failed precondition that explains an inconclusive verdict, in words
    budget_requests: int | None = None
    not_covered: tuple[str, ...] = ()
    search_seconds: float | None = None


def _partition_key(partition: Partition) -> tuple[Any, ...]:
    return (partition.model, partition.cache_salt, partition.api_key, partition.adapter_path, partition.image)


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
    prime: ProbeResult,
    control: ProbeResult,
    victim: ProbeResult,
    events: _Events | None,
    block_size: int,
    path: TrialPath | None = None,
) -> TrialVerdict:
    """The verdict of one trial (see the module docstring for the rules); ``path`` says where its requests ran
    behind a router (kvtool.vllm.isolation.routing): a miss away from the prime's engines proves nothing."""
    if prime.probe.dimension == "tier":  # a second-tier trial has rules of its own (kvtool.vllm.isolation.tier)
        return _judge_tier_trial(prime, control, victim, events, block_size)
    trial = prime.probe.trial
    errors = [r.error for r in (prime, control, victim) if r.error]
    if errors:  # the engine refused a request (an empty salt): nothing was cached, nothing proven
        return TrialVerdict(
            trial, prime.probe.dimension, _variant(prime, control), prime.probe.partition.label,
            victim.probe.partition.label, 0, 0, control.probe.expected_cached_tokens, 0,
            victim.probe.expected_cached_tokens, None, 0, REFUSED, (f"refused: {errors[0]}",),
            len(prime.probe.block_seeds) - 1,
        )  # fmt: skip
    leaks: list[str] = []
    doubts: list[str] = []
    v_expected = victim.probe.expected_cached_tokens
    c_expected = control.probe.expected_cached_tokens
    if control.probe.kind == IMAGE_KIND:  # the image's placeholder tokens and the tokenizer set the length
        c_expected = control_expected_tokens(control.prompt_tokens, c_expected, block_size)
    first, second = prime.probe.partition.label, victim.probe.partition.label
    # 1. cached tokens
    if victim.cached_tokens > v_expected:
        leaks.append(f"reused {victim.cached_tokens} tokens of {first} (expected {v_expected})")
    fresh = prime.cached_tokens if path is None else path.first_prime_cached_tokens  # copies: the first is fresh
    if fresh > 0:
        doubts.append(f"the fresh prime already had {fresh} cached tokens")
    spread = False
    if control.cached_tokens < c_expected:
        spread = path is not None and path.control_elsewhere
        doubts.append(
            path.control_doubt() if path is not None and spread
            else f"control reused {control.cached_tokens} of {c_expected} tokens: the cache did not keep the prime"
        )  # fmt: skip
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
    if path is not None and path.victim_elsewhere and not leaks:
        spread = True
        doubts.append(path.victim_doubt())
    verdict = LEAK if leaks else INCONCLUSIVE if doubts else PASS
    return TrialVerdict(
        prime.probe.trial, prime.probe.dimension, _variant(prime, control), first, second,
        prime.cached_tokens, control.cached_tokens, c_expected, victim.cached_tokens, v_expected,
        hashes, len(clean), verdict, tuple(leaks + doubts), len(prime.probe.block_seeds) - 1, spread=spread,
    )  # fmt: skip


def _judge_tier_trial(
    prime: ProbeResult, control: ProbeResult, victim: ProbeResult, events: _Events | None, block_size: int
) -> TrialVerdict:
    from kvtool.vllm.isolation.tier import tier_findings

    hashes = None
    if events is not None and prime.probe.session_id in events.stored:
        hashes = _hash_evidence(events, prime, control, victim)
    leaks, doubts = tier_findings(prime, control, victim, hashes, block_size)
    verdict = LEAK if leaks else INCONCLUSIVE if doubts else PASS
    clean = sum(1 for r in (prime, control, victim) if _metric_clean(r))
    return TrialVerdict(
        prime.probe.trial, prime.probe.dimension, _variant(prime, control), prime.probe.partition.label,
        victim.probe.partition.label, prime.cached_tokens, control.cached_tokens, control.probe.expected_cached_tokens,
        victim.cached_tokens, victim.probe.expected_cached_tokens, hashes, clean, verdict, tuple(leaks + doubts),
        len(prime.probe.block_seeds) - 1,
    )  # fmt: skip


def _variant(prime: ProbeResult, control: ProbeResult) -> str:
    return "exact" if prime.probe.block_seeds == control.probe.block_seeds else "prefix"


def timing_channel(hit_latencies: list[float], miss_latencies: list[float]) -> TimingChannel | None:
    """Mann-Whitney AUC of 'a miss is slower than a hit' (ties count half), with its Hanley-McNeil interval, the
    two-sided U-test p-value and the samples per side that would tell this AUC from 0.5 (kvtool.vllm.isolation.timing)."""
    from kvtool.vllm.isolation.timing import compare

    if not hit_latencies or not miss_latencies:
        return None
    t = compare(miss_latencies, hit_latencies)
    enough = min(len(hit_latencies), len(miss_latencies)) >= MIN_TIMING_SAMPLES
    decides = enough and (t.ci_low > 0.5 or t.ci_high < 0.5)
    return TimingChannel(
        round(t.auc, 3), len(hit_latencies), len(miss_latencies), decides and t.ci_low > 0.5,
        round(t.ci_low, 3), round(t.ci_high, 3), t.u, t.p_value, t.samples_for_power,
        round(1000 * t.median_b, 2), round(1000 * t.median_a, 2), decides,
    )  # fmt: skip


def _combine(verdicts: Iterable[str]) -> str:
    found = [v for v in verdicts if v != REFUSED]
    if LEAK in found:
        return LEAK
    if not found or INCONCLUSIVE in found:
        return INCONCLUSIVE
    return PASS


def _rows(trials: list[TrialVerdict]) -> tuple[PairRow, ...]:
    groups: dict[tuple[str, str, str, int, str], list[TrialVerdict]] = {}
    for t in trials:
        if t.stage == "search":
            groups.setdefault((t.first, t.second, t.variant, t.full_blocks, t.case), []).append(t)
    rows = []
    for (first, second, variant, full_blocks, case), group in groups.items():
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
                    group[0].victim_expected_tokens, verdict, evidence, full_blocks, case)
        )  # fmt: skip
    return tuple(rows)


def _cross_partition_hashes(results: list[ProbeResult], events: _Events) -> int:
    """Hashes published under two different partitions (token dimensions: fresh prompts never legitimately do)."""
    owners: dict[Any, set[tuple[Any, ...]]] = defaultdict(set)
    for r in results:
        if r.probe.kind in ("tokens", IMAGE_KIND):  # fresh content: embeddings share rows on purpose
            for h in events.stored.get(r.probe.session_id, ()):
                owners[h].add(_partition_key(r.probe.partition))
    return sum(1 for keys in owners.values() if len(keys) > 1)


def _victims_reused(trials: list[TrialVerdict]) -> int:
    return sum(1 for t in trials if t.victim_cached_tokens > t.victim_expected_tokens)


def _controls_shared(trials: list[TrialVerdict]) -> int:
    """Controls that reused what their prime stored (a refused trial's control never ran: it counts as shared)."""
    return sum(1 for t in trials if t.control_cached_tokens >= t.control_expected_tokens or t.verdict == REFUSED)


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
        lines.append(timing_line(timing))
    return tuple(lines)


def timing_line(timing: TimingChannel) -> str:
    state = "present" if timing.present else "not evident" if timing.decides else "undecided"
    line = (
        f"timing channel {state}: latency tells a hit from a miss with AUC {timing.hit_miss_auc:.2f} "
        f"[95% {timing.auc_ci_low:.2f}-{timing.auc_ci_high:.2f}], Mann-Whitney p={timing.p_value:.2g} "
        f"({timing.hits} hits, median {timing.median_hit_ms:g} ms; {timing.misses} misses, median "
        f"{timing.median_miss_ms:g} ms; not a verdict)"
    )
    if not timing.decides:
        need = timing.samples_for_power
        line += "; timing cannot decide with these samples" + (f": about {need} per side needed" if need else "")
    return line


def judge_dimension(
    dimension: str,
    results: list[ProbeResult],
    events: _Events | None,
    block_size: int,
    trials_by_id: dict[str, Trial] | None = None,
) -> DimensionResult:
    by_trial: dict[str, dict[str, ProbeResult]] = {}
    all_of_trial: dict[str, list[ProbeResult]] = defaultdict(list)
    for r in results:
        by_trial.setdefault(r.probe.trial, {})[r.probe.role] = r
        all_of_trial[r.probe.trial].append(r)
    trials = []
    for trial_id, t in by_trial.items():
        if not {"prime", "control", "victim"} <= t.keys():
            continue
        path = trial_path(all_of_trial[trial_id])
        verdict = judge_trial(t["prime"], t["control"], t["victim"], events, block_size, path)
        plan_trial = (trials_by_id or {}).get(trial_id)
        tokens = t["prime"].prompt_tokens or (len(t["prime"].probe.block_seeds) - 1) * block_size
        verdict = dataclasses.replace(verdict, prompt_tokens=tokens)
        if plan_trial is not None:
            verdict = dataclasses.replace(verdict, case=plan_trial.case, stage=plan_trial.stage)
        trials.append(verdict)
    search = [t for t in trials if t.stage == "search"]
    search_ids = {t.trial for t in search}
    hits = [r.latency_s for r in results if r.probe.role == "control" and r.cached_tokens > 0 and not r.error
            and r.probe.trial in search_ids]  # fmt: skip
    misses = [r.latency_s for r in results if r.probe.role == "prime" and r.cached_tokens == 0 and not r.error
              and r.probe.trial in search_ids]  # fmt: skip
    timing = timing_channel(hits, misses)
    outcome = _combine(t.verdict for t in trials)
    evidence = _dimension_evidence(search, results, events, timing)
    minimal = _minimal(trials, results) if outcome == LEAK else None
    return DimensionResult(
        dimension, DIMENSION_TITLES[dimension], outcome, len(search), _controls_shared(search),
        _victims_reused(search), _rows(trials), evidence, timing, None, tuple(trials), minimal,
        _coverage(search, trials_by_id),
    )  # fmt: skip


def _salts(results: list[ProbeResult], trial: str) -> tuple[str | None, str | None]:
    roles = {r.probe.role: r.probe.partition.cache_salt for r in results if r.probe.trial == trial}
    return roles.get("prime"), roles.get("victim")


def _minimal(trials: list[TrialVerdict], results: list[ProbeResult]) -> MinimalCase | None:
    leaks = [t for t in trials if t.verdict == LEAK]
    if not leaks:
        return None
    first = next((t for t in leaks if t.stage == "search"), leaks[0])
    shrunk = [t for t in leaks if t.stage != "search"] or [first]

    def simplicity(t: TrialVerdict) -> tuple[int, int]:
        a, b = _salts(results, t.trial)
        return t.full_blocks, len(a or "") + len(b or "")

    best = min(shrunk, key=simplicity)
    if simplicity(first) < simplicity(best):
        best = first
    a, b = _salts(results, best.trial)
    steps = sum(1 for t in trials if t.stage != "search")
    return MinimalCase(best.first, best.second, a, b, best.variant, best.full_blocks, best.prompt_tokens,
                       best.trial, best.reasons, first.full_blocks, steps)  # fmt: skip


def _coverage(search: list[TrialVerdict], trials_by_id: dict[str, Trial] | None) -> tuple[str, ...]:
    if not search:
        return ()
    lines = []
    lengths = sorted({t.full_blocks for t in search})
    pairs = {(t.first, t.second) for t in search}
    orders = "both orders" if all((b, a) in pairs for a, b in pairs) else "one order"
    lines.append(f"{len(pairs)} ordered pairs ({orders}), variants {', '.join(sorted({t.variant for t in search}))}, "
                 f"prompts of {', '.join(map(str, lengths))} full blocks")  # fmt: skip
    cases = sorted({t.case for t in search if t.case})
    if cases:
        lines.append("cases: " + ", ".join(cases))
    refused = sorted({t.case or f"{t.first}/{t.second}" for t in search if t.verdict == REFUSED})
    if refused:
        lines.append("refused by the engine (not covered): " + ", ".join(refused))
    if trials_by_id:
        fillers = sum(1 for t in search if t.trial in trials_by_id for p in trials_by_id[t.trial].fillers
                      if p.role == FILLER)  # fmt: skip
        if fillers:
            lines.append(f"{fillers} filler requests made the pool evict before the primes")
        copies = sum(len(trials_by_id[t.trial].fillers) for t in search if t.trial in trials_by_id) - fillers
        if copies:
            lines.append(f"{copies} copies of the primes sent before them (--repeat-primes)")
    return tuple(lines)


def _preconditions(record: IsolationRecord, dims: list[DimensionResult]) -> tuple[Precondition, ...]:
    """Each thing the check needs, named: prefix caching, a pool that keeps a prime, /metrics, KV events, the
    budget.  A failed one is its own line with its fix, so an inconclusive run says why."""
    out: list[Precondition] = []
    config = record.engine.cache_config
    caching_off = config is not None and str(config.get("enable_prefix_caching")) == "False"
    if config is None:
        out.append(Precondition("prefix-caching", "unknown", "no vllm:cache_config_info in /metrics", None))
    elif caching_off:
        out.append(Precondition(
            "prefix-caching", "failed",
            'prefix caching is off (/metrics: vllm:cache_config_info enable_prefix_caching="False"): no request can '
            "reuse a block, so no leak can show",
            "start vLLM with --enable-prefix-caching (and without --no-enable-prefix-caching)",
            "prefix caching is off",
        ))  # fmt: skip
    else:
        out.append(Precondition("prefix-caching", "ok", 'enable_prefix_caching="True"', None))
    # the tier's controls run after fillers that evict on purpose: its own line (kv-connector) judges them
    searched = [t for d in dims if d.dimension != "tier" for t in d.trial_verdicts if t.verdict != REFUSED]
    if not caching_off:  # behind a router: controls sent away from their primes are the routing line's, not the cache's
        routing = routing_line(record, searched)
        if routing is not None:
            out.append(Precondition("routing", routing.state, routing.detail, routing.fix, routing.summary))
    failed_controls = [t for t in searched if t.control_cached_tokens < t.control_expected_tokens and not t.spread]
    pool = None
    if config and str(config.get("num_gpu_blocks", "")).isdigit():
        pool = int(config["num_gpu_blocks"])
    needed = max((t.full_blocks + 1 for t in searched), default=0)
    if caching_off:
        out.append(Precondition("cache-size", "unknown", "not judged: prefix caching is off", None))
    elif pool is not None and pool < needed:
        out.append(Precondition(
            "cache-size", "failed",
            f"the KV pool ({pool} blocks, vllm:cache_config_info num_gpu_blocks) is too small to keep a prime of "
            f"{needed} blocks; {len(failed_controls)}/{len(searched)} controls found the prime gone",
            "give the engine more KV cache (--kv-cache-memory-bytes or --gpu-memory-utilization)",
            "the KV pool is too small to keep a prime",
        ))  # fmt: skip
    elif failed_controls:
        out.append(Precondition(
            "cache-size", "failed",
            f"the cache did not keep the prime in {len(failed_controls)}/{len(searched)} trials"
            + (f" (pool {pool} blocks)" if pool else "") + ": too small for the prompts, or other traffic evicted it",
            "run on an idle engine, give it more KV cache (--kv-cache-memory-bytes or --gpu-memory-utilization), "
            "or shorter prompts (--length); behind a router over N engines, --repeat-primes N",
            "the cache did not keep the primes",
        ))  # fmt: skip
    else:
        out.append(Precondition("cache-size", "ok", f"every control found its prime ({pool or '?'} blocks)", None))
    status = record.engine.metrics_status
    no_counters = all(r.queries_before is None for r in record.results)
    if (status is not None and status != 200) or (status is None and no_counters and record.results):
        out.append(Precondition(
            "metrics", "failed",
            f"/metrics answered HTTP {status}" if status else "/metrics had no prefix-cache counters",
            "point --endpoint at the vLLM server itself (a proxy may hide /metrics); metric evidence and the "
            "precondition checks need it; give --block-size",
            "/metrics is unavailable",
        ))  # fmt: skip
    else:
        out.append(Precondition("metrics", "ok" if not no_counters else "unknown", "prefix-cache counters read", None))
    if record.events is None:
        out.append(Precondition("kv-events", "missing", "KV events were not captured: hash evidence not used",
                                "give --events tcp://HOST:PORT as in vLLM's --kv-events-config"))  # fmt: skip
    else:
        out.append(Precondition("kv-events", "ok", f"{len(record.events)} KV events", None))
    tier = next((d for d in dims if d.dimension == "tier"), None)
    if tier is not None:  # the second tier's own line (kvtool.vllm.isolation.tier)
        from kvtool.vllm.isolation.tier import tier_precondition

        out.append(Precondition(*tier_precondition(tier.trial_verdicts, tier.skipped_reason, record.engine)))
    if record.plan.not_covered:
        out.append(Precondition("budget", "partial", "; ".join(record.plan.not_covered),
                                f"raise --budget (now {record.plan.budget_requests})"))  # fmt: skip
    return tuple(out)


def judge_record(record: IsolationRecord) -> IsolationReport:
    """Every dimension's verdict, the overall verdict and its exit code."""
    events = None if record.events is None else _Events(record.events)
    results_by_dim: dict[str, list[ProbeResult]] = defaultdict(list)
    for r in record.results:
        results_by_dim[r.probe.dimension].append(r)
    trials_by_id = {t.id: t for t in record.plan.trials}
    skipped = {s.dimension: s.reason for s in record.skipped}
    dims = []
    for dimension in DIMENSIONS:
        if dimension in results_by_dim and dimension == "tier":  # with the tier's own evidence lines
            from kvtool.vllm.isolation.tier import tier_lines

            d = judge_dimension(dimension, results_by_dim[dimension], events, record.plan.block_size, trials_by_id)
            lines, coverage = tier_lines(d.trial_verdicts, results_by_dim[dimension], trials_by_id, record.engine,
                                         d.coverage, d.victims_reused)  # fmt: skip
            dims.append(dataclasses.replace(d, evidence=(*d.evidence, *lines), coverage=coverage))
        elif dimension in results_by_dim:
            dims.append(judge_dimension(dimension, results_by_dim[dimension], events, record.plan.block_size,
                                        trials_by_id))  # fmt: skip
        elif dimension in skipped:
            dims.append(
                DimensionResult(dimension, DIMENSION_TITLES[dimension], "not run", 0, 0, 0, (), (), None,
                                skipped[dimension], ())
            )  # fmt: skip
    if record.images is not None:  # how the run told whether the model takes images, and what it could not send
        dims = [dataclasses.replace(d, coverage=(record.images.how, *d.coverage, *(
            f"not sent: {line}" for line in record.images.not_covered)))
                if d.dimension == "multimodal" and d.skipped_reason is None else d for d in dims]  # fmt: skip
    verdict = _combine(d.verdict for d in dims if d.verdict != "not run")
    exit_code = {PASS: EXIT_OK, LEAK: EXIT_CHECK_FAILED}.get(verdict, EXIT_INCONCLUSIVE)
    n_events = None if record.events is None else len(record.events)
    pre = _preconditions(record, dims)
    failed = [p for p in pre if p.state == "failed"]
    headline = failed[0].summary if failed and verdict == INCONCLUSIVE else ""
    return IsolationReport(record.engine, verdict, exit_code, len(record.results), n_events, tuple(dims), pre,
                           headline, record.plan.budget_requests, record.plan.not_covered,
                           record.engine.search_seconds)  # fmt: skip
