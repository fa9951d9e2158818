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
    from kvtool.vllm.isolation.record import EngineInfo, ProbeResult, SkippedDimension

# kvtool.vllm.isolation.verdicts calls the judging functions below and builds its own dataclasses from what they
# return (this module imports nothing of it: no import cycle); TrialVerdict-like arguments are read by attribute.

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


def _clean(result: ProbeResult) -> bool:
    """No other traffic moved the counters around this request (as verdicts._metric_clean)."""
    values = (result.queries_before, result.queries_after, result.hits_before, result.hits_after)
    if any(v is None for v in values) or result.prompt_tokens is None:
        return False
    return result.queries_after - result.queries_before == result.prompt_tokens  # type: ignore[operator]


def _sources(result: ProbeResult) -> tuple[float, float] | None:
    """(tokens from the GPU prefix cache, tokens from the KV connector) of one request, when no other traffic moved
    the counters; None otherwise."""
    if not _clean(result) or result.external_hits_before is None or result.external_hits_after is None:
        return None
    gpu = result.hits_after - result.hits_before  # type: ignore[operator]
    return gpu, result.external_hits_after - result.external_hits_before


def tier_findings(
    prime: ProbeResult, control: ProbeResult, victim: ProbeResult, hashes: Any, block_size: int
) -> tuple[list[str], list[str]]:
    """(leaks, doubts) of one second-tier trial: a leak when the victim reused anything after the fillers; a doubt
    when the control did not get the prime back from the tier, or the GPU cache still served it.  ``hashes`` is the
    trial's verdicts.HashEvidence (None without KV events)."""
    first = prime.probe.partition.label
    c_expected, v_expected = control.probe.expected_cached_tokens, victim.probe.expected_cached_tokens
    leaks: list[str] = []
    doubts: list[str] = []
    v_src, c_src = _sources(victim), _sources(control)
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
    return leaks, doubts


def tier_lines(
    trial_verdicts: Any, results: list[ProbeResult], trials_by_id: dict[str, Any], engine: EngineInfo,
    coverage: tuple[str, ...], victims_reused: int,
) -> tuple[tuple[str, ...], tuple[str, ...]]:  # fmt: skip
    """The tier's own evidence lines (which cache served the controls, whether the GPU copy was gone) and its
    coverage (fillers after the primes, how the connector was detected)."""
    by_trial: dict[str, dict[str, ProbeResult]] = {}
    for r in results:
        by_trial.setdefault(r.probe.trial, {})[r.probe.role] = r
    search = [t for t in trial_verdicts if t.stage == "search"]
    from_tier = gpu_gone = 0
    served = 0.0
    for t in search:
        src = _sources(by_trial[t.trial]["control"])
        if src is not None:
            served += src[1]
            gpu_gone += src[0] == 0
            from_tier += src[1] >= t.control_expected_tokens
    gone_events = sum(1 for t in search if t.hashes is not None and t.hashes.prime_blocks
                      and t.hashes.evicted_before_victim >= t.hashes.prime_blocks)  # fmt: skip
    lines = (
        f"second tier: {from_tier}/{len(search)} controls served from the KV connector after the fillers "
        f"(vllm:external_prefix_cache_hits +{served:g} tokens); {victims_reused} victims reused the other "
        "tenant's blocks",
        f"GPU copy gone before the victim: {gpu_gone}/{len(search)} trials by the counters (the control's "
        f"vllm:prefix_cache_hits +0), {gone_events}/{len(search)} by the KV events (the prime's blocks removed)",
    )
    fillers = sum(len(trials_by_id[t.trial].fillers) for t in search if t.trial in trials_by_id)
    kept = [c for c in coverage if "filler requests" not in c]
    kept.append(f"{fillers} filler requests evicted the primes from the GPU cache before the victims")
    if engine.kv_connector:
        kept.append(f"KV connector {engine.kv_connector}")
    return lines, tuple(kept)


def tier_precondition(
    trial_verdicts: Any, skipped_reason: str | None, engine: EngineInfo
) -> tuple[str, str, str, str | None, str]:
    """The ``kv-connector`` line as (name, state, detail, fix, summary): the connector's detection, and whether the
    tier kept the primes with their GPU copies gone."""
    if skipped_reason is not None:
        state = UNKNOWN if (engine.kv_connector or "").startswith(UNKNOWN) else "missing"
        return "kv-connector", state, skipped_reason, CONNECTOR_TIP, ""
    trials = [t for t in trial_verdicts if t.verdict != "refused"]
    missed = [t for t in trials if any(r.startswith(KEPT_NOTHING) for r in t.reasons)]
    gpu = [t for t in trials if any(r.startswith(GPU_KEPT) for r in t.reasons)]
    detected = engine.kv_connector or "detected"
    if missed:
        return ("kv-connector", "failed", f"{KEPT_NOTHING} in {len(missed)}/{len(trials)} trials (KV connector "
                f"{detected})", "give the connector room for the prime and the fillers (its CPU or disk capacity), or "
                "check that it stores (its log)", KEPT_NOTHING)  # fmt: skip
    if gpu:
        return ("kv-connector", "failed", f"{GPU_KEPT} in {len(gpu)}/{len(trials)} trials",
                "run on an idle engine; the fillers are sized from vllm:cache_config_info num_gpu_blocks", GPU_KEPT)  # fmt: skip
    return ("kv-connector", "ok", f"KV connector {detected}; the tier kept the prime in {len(trials)}/{len(trials)} "
            "trials", None, "")  # fmt: skip
