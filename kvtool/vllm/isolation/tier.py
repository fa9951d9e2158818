"""The second-tier dimension of the isolation check: does a hit served by a KV connector respect the salt?

vLLM's own prefix cache keys a block by its chained block hash, whose first block carries the ``cache_salt``.  A KV
connector (LMCache, the offloading connector's CPU tier, a disk tier such as vLLM's ExampleConnector) keeps blocks
under a key of its own and serves them back when the GPU cache misses.  If that key leaves out the salt, another
tenant's request with the same tokens is served the first tenant's KV from the tier, though the GPU cache kept them
apart.  A trial therefore has to make the GPU copy go away and see who the tier serves:

1. ``prime``   partition A, a fresh prompt: the engine computes it, the GPU cache and the connector store it;
2. fillers     fresh prompts writing more blocks than the GPU pool holds (``num_gpu_blocks`` + one prompt, as the
               eviction dimension sizes them), so the prime's GPU blocks are evicted; the tier may keep it;
3. ``victim``  partition B, the prime's tokens: a correct engine reuses nothing (expected 0); a hit here comes from
               the tier (the GPU copy is gone) and is a leak through it;
4. ``control`` partition A again, the same tokens: must reuse the prime's full blocks, from the tier.  If it does
               not, the tier did not keep the prime and the victim's miss proves nothing (inconclusive, with the
               ``kv-connector`` precondition failed: "the tier did not keep the prime").

The victim runs before the control so that it meets the state the fillers left (a tier that drops an entry once it
is loaded back cannot hide a leak).  Which cache served a hit is read from the counters around each request:
``vllm:prefix_cache_hits`` (the GPU cache) and ``vllm:external_prefix_cache_hits`` (the connector; vLLM 0.32
``vllm/v1/metrics/loggers.py``), used only when no other traffic moved them; vLLM reports a connector's tokens in
``usage.prompt_tokens_details.cached_tokens`` too (``PrefillStats.set``: local + external, vllm/v1/metrics/stats.py).
With KV events, the prime's ``BlockRemoved`` before the victim shows the GPU copy gone.

**Detection.**  The dimension runs only when the engine has a KV connector: before planning, one fresh request
(one full block and a partial one, under a salt of its own) is sent and ``vllm:external_prefix_cache_queries`` read
around it.  vLLM 0.32 counts connector lookups only when a connector exists (``Scheduler.connector_prefix_cache_stats``
is created with the connector, vllm/v1/core/sched/scheduler.py), so the counter rises with a connector and stays at 0
without one; absent from /metrics, it cannot be told (``unknown``).  Either way the dimension is then "not run" with
the reason, and the report says the tier was not covered.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from kvtool.vllm.isolation.plan import FILLER, MIN_FULL_BLOCKS, DimensionPartitions, Partition, Plan, Probe

if TYPE_CHECKING:
    from kvtool.vllm.isolation.client import Client
    from kvtool.vllm.isolation.record import EngineInfo, IsolationRecord, ProbeResult, SkippedDimension
    from kvtool.vllm.isolation.verdicts import DimensionResult, Precondition, TrialVerdict

TIER = "tier"
DETECTED, NONE, UNKNOWN = "detected", "none", "unknown"
TIER_LENGTHS = (MIN_FULL_BLOCKS,)  # full blocks of the tier primes (minimization shrinks a leak from here)
KEPT_NOTHING = "the tier did not keep the prime"
GPU_KEPT = "the fillers did not evict the prime from the GPU cache"
CONNECTOR_TIP = (
    'start vLLM with a KV connector (--kv-transfer-config \'{"kv_connector": ..., "kv_role": "kv_both"}\', or '
    "--kv-offloading-backend) to check its tier"
)


@dataclasses.dataclass(frozen=True)
class ConnectorDetection:
    """Whether the engine serves a second tier through a KV connector, and what showed it."""

    state: str  # detected | none | unknown
    detail: str  # the counter and its movement, in words

    @property
    def text(self) -> str:
        return f"{self.state}: {self.detail}"


def detect_connector(client: Client, block_size: int, run_id: str) -> ConnectorDetection:
    """Send one fresh request and read ``vllm:external_prefix_cache_queries`` around it (see the module docstring)."""
    before = client.counters()
    seeds = random.Random(f"{run_id}-detect")
    probe = Probe(-1, TIER, f"{TIER}/detect", FILLER, Partition("detect", cache_salt=f"kvtool-{run_id}-detect"),
                  "tokens", (seeds.getrandbits(63), seeds.getrandbits(63)), -1, f"kvtool-iso-{run_id}-detect")  # fmt: skip
    partial = max(1, block_size // 2)
    reply = client.complete(probe, Plan(block_size, 1, partial, run_id, ()), with_events=False, hidden_size=None)
    after = client.counters()
    tokens = reply.prompt_tokens or block_size + partial
    if before.external_queries_tokens is None or after.external_queries_tokens is None:
        return ConnectorDetection(UNKNOWN, "no vllm:external_prefix_cache_queries in /metrics")
    delta = after.external_queries_tokens - before.external_queries_tokens
    if delta > 0:
        return ConnectorDetection(
            DETECTED, f"vllm:external_prefix_cache_queries rose by {delta:g} tokens on a fresh {tokens}-token request"
        )
    return ConnectorDetection(
        NONE, f"vllm:external_prefix_cache_queries stayed at {after.external_queries_tokens:g} on a fresh "
        f"{tokens}-token request: no KV connector",
    )  # fmt: skip


def add_tier(
    partitions: tuple[DimensionPartitions, ...], skipped: tuple[SkippedDimension, ...],
    connector: ConnectorDetection | None, run_id: str, pool_blocks: int | None, max_blocks: int, budget: int | None,
) -> tuple[tuple[DimensionPartitions, ...], tuple[SkippedDimension, ...]]:  # fmt: skip
    """The tier dimension's partitions (two salts, both orders, exact prompts, fillers after the prime), or why it
    cannot run: no connector, no pool size to size the fillers from, or fillers too many for the budget."""
    from kvtool.vllm.isolation.record import SkippedDimension

    if connector is None:
        return partitions, skipped
    reason = None
    if connector.state != DETECTED:
        reason = f"not covered: no KV connector ({connector.detail}); {CONNECTOR_TIP}"
    elif not pool_blocks:
        reason = "needs the KV pool size to size the fillers (vllm:cache_config_info num_gpu_blocks in /metrics)"
    fill_prompt = max_blocks
    fill_blocks = (pool_blocks or 0) + fill_prompt  # more than the pool holds: the prime's GPU blocks are evicted
    requests = 2 * (-(-fill_blocks // fill_prompt) + 3)
    if reason is None and budget is not None and requests > budget // 3:
        reason = (f"filling the pool ({pool_blocks} blocks, {fill_prompt} per request) takes {requests} requests, more "
                  f"than a third of --budget {budget}")  # fmt: skip
    if reason is not None:
        return partitions, (*skipped, SkippedDimension(TIER, reason))
    pair = (
        Partition("salt:ta", cache_salt=f"kvtool-{run_id}-ta"),
        Partition("salt:tb", cache_salt=f"kvtool-{run_id}-tb"),
    )
    group = DimensionPartitions(TIER, (pair,), variants=("exact",), lengths=TIER_LENGTHS, filler_blocks=fill_blocks,
                                filler_prompt_blocks=fill_prompt, fillers_after_prime=True)  # fmt: skip
    return (*partitions, group), skipped


def minimize_fields(fillers: tuple[Probe, ...]) -> dict[str, Any]:
    """DimensionPartitions fields that give a shrinking trial the fillers of the tier trial it shrinks."""
    per = len(fillers[0].block_seeds) - 1 if fillers else 0
    return {"filler_blocks": len(fillers) * per, "filler_prompt_blocks": per, "fillers_after_prime": True}


def _sources(result: ProbeResult) -> tuple[float, float] | None:
    """(tokens from the GPU prefix cache, tokens from the KV connector) of one request, when no other traffic moved
    the counters; None otherwise."""
    from kvtool.vllm.isolation.verdicts import _metric_clean, _metric_hits

    if not _metric_clean(result) or result.external_hits_before is None or result.external_hits_after is None:
        return None
    return _metric_hits(result), result.external_hits_after - result.external_hits_before


def judge_tier_trial(
    prime: ProbeResult, control: ProbeResult, victim: ProbeResult, events: Any, block_size: int
) -> TrialVerdict:
    """One second-tier trial: a leak when the victim reused anything after the fillers; inconclusive when the control
    did not get the prime back from the tier, or the GPU cache still served it; a pass otherwise."""
    from kvtool.vllm.isolation.verdicts import (
        INCONCLUSIVE,
        LEAK,
        PASS,
        TrialVerdict,
        _hash_evidence,
        _metric_clean,
        _variant,
    )  # fmt: skip

    first, second = prime.probe.partition.label, victim.probe.partition.label
    c_expected, v_expected = control.probe.expected_cached_tokens, victim.probe.expected_cached_tokens
    leaks: list[str] = []
    doubts: list[str] = []
    v_src, c_src = _sources(victim), _sources(control)
    hashes = None
    if events is not None and prime.probe.session_id in events.stored:
        hashes = _hash_evidence(events, prime, control, victim)
    if victim.cached_tokens > v_expected:
        where = ""
        if v_src is not None:
            where = (f" ({v_src[1]:g} from the KV connector, vllm:external_prefix_cache_hits; {v_src[0]:g} from the "
                     "GPU prefix cache)")  # fmt: skip
        leaks.append(
            f"reused {victim.cached_tokens} tokens of {first} after the fillers (expected {v_expected}){where}"
        )
    if hashes is not None and hashes.victim_shared_blocks > v_expected // block_size:
        leaks.append(f"published {hashes.victim_shared_blocks} block hashes of {first} (GPU prefix cache)")
    if prime.cached_tokens > 0:
        doubts.append(f"the fresh prime already had {prime.cached_tokens} cached tokens")
    if control.cached_tokens < c_expected:
        doubts.append(f"{KEPT_NOTHING}: the control reused {control.cached_tokens} of {c_expected} tokens after the "
                      "fillers")  # fmt: skip
    elif c_src is not None and c_src[0] > 0:
        doubts.append(f"{GPU_KEPT}: {c_src[0]:g} of the control's {control.cached_tokens} tokens came from the GPU "
                      "cache (vllm:prefix_cache_hits), not the tier")  # fmt: skip
    elif c_src is None and (hashes is None or hashes.evicted_before_victim < hashes.prime_blocks):
        doubts.append("cannot tell that the tier served the control (no clean counter deltas, no KV events showing "
                      "the prime evicted)")  # fmt: skip
    verdict = LEAK if leaks else INCONCLUSIVE if doubts else PASS
    clean = sum(1 for r in (prime, control, victim) if _metric_clean(r))
    return TrialVerdict(
        prime.probe.trial, prime.probe.dimension, _variant(prime, control), first, second,
        prime.cached_tokens, control.cached_tokens, c_expected, victim.cached_tokens, v_expected,
        hashes, clean, verdict, tuple(leaks + doubts), len(prime.probe.block_seeds) - 1,
    )  # fmt: skip


def judge_tier_dimension(
    results: list[ProbeResult], events: Any, block_size: int, trials_by_id: dict[str, Any], engine: EngineInfo
) -> DimensionResult:
    """The generic dimension verdict (its trials judged by judge_tier_trial), with the tier's own evidence: which
    cache served the controls, whether the GPU copy was gone, and how the connector was detected."""
    from kvtool.vllm.isolation.verdicts import judge_dimension

    result = judge_dimension(TIER, results, events, block_size, trials_by_id)
    by_trial: dict[str, dict[str, ProbeResult]] = {}
    for r in results:
        by_trial.setdefault(r.probe.trial, {})[r.probe.role] = r
    search = [t for t in result.trial_verdicts if t.stage == "search"]
    from_tier = gpu_gone_counters = 0
    served = 0.0
    for t in search:
        src = _sources(by_trial[t.trial]["control"])
        if src is not None:
            served += src[1]
            gpu_gone_counters += src[0] == 0
            from_tier += src[1] >= t.control_expected_tokens
    gone_events = sum(1 for t in search if t.hashes is not None and t.hashes.evicted_before_victim >= t.hashes.prime_blocks
                      and t.hashes.prime_blocks)  # fmt: skip
    lines = [
        f"second tier: {from_tier}/{len(search)} controls served from the KV connector after the fillers "
        f"(vllm:external_prefix_cache_hits +{served:g} tokens); {result.victims_reused} victims reused the other "
        "tenant's blocks",
        f"GPU copy gone before the victim: {gpu_gone_counters}/{len(search)} trials by the counters (the control's "
        f"vllm:prefix_cache_hits +0), {gone_events}/{len(search)} by the KV events (the prime's blocks removed)",
    ]
    fillers = sum(len(trials_by_id[t.trial].fillers) for t in search if t.trial in trials_by_id)
    coverage = [c for c in result.coverage if "filler requests" not in c]
    coverage.append(f"{fillers} filler requests evicted the primes from the GPU cache before the victims")
    if engine.kv_connector:
        coverage.append(f"KV connector {engine.kv_connector}")
    return dataclasses.replace(result, evidence=(*result.evidence, *lines), coverage=tuple(coverage))


def tier_preconditions(record: IsolationRecord, dims: list[DimensionResult]) -> tuple[Precondition, ...]:
    """The ``kv-connector`` line: the connector's detection, and whether the tier kept the primes with their GPU copies
    gone; nothing when the tier was not asked for."""
    from kvtool.vllm.isolation.verdicts import REFUSED, Precondition

    tier = next((d for d in dims if d.dimension == TIER), None)
    if tier is None:
        return ()
    if tier.skipped_reason is not None:
        state = UNKNOWN if (record.engine.kv_connector or "").startswith(UNKNOWN) else "missing"
        return (Precondition("kv-connector", state, tier.skipped_reason, CONNECTOR_TIP),)
    trials = [t for t in tier.trial_verdicts if t.verdict != REFUSED]
    kept = [t for t in trials if not any(r.startswith(KEPT_NOTHING) for r in t.reasons)]
    gpu = [t for t in trials if any(r.startswith(GPU_KEPT) for r in t.reasons)]
    detected = record.engine.kv_connector or "detected"
    if len(kept) < len(trials):
        return (Precondition(
            "kv-connector", "failed",
            f"{KEPT_NOTHING} in {len(trials) - len(kept)}/{len(trials)} trials (KV connector {detected})",
            "give the connector room for the prime and the fillers (its CPU or disk capacity), or check that it "
            "stores (its log); a smaller GPU KV cache needs fewer fillers",
            KEPT_NOTHING,
        ),)  # fmt: skip
    if gpu:
        return (Precondition(
            "kv-connector", "failed", f"{GPU_KEPT} in {len(gpu)}/{len(trials)} trials",
            "run on an idle engine; the fillers are sized from vllm:cache_config_info num_gpu_blocks", GPU_KEPT,
        ),)  # fmt: skip
    return (Precondition("kv-connector", "ok", f"KV connector {detected}; the tier kept the prime in "
                         f"{len(kept)}/{len(trials)} trials", None),)  # fmt: skip
