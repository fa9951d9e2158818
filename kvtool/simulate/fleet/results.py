"""The figures of a fleet run (per policy, per replica) and of a design sweep, with the sweep's recommendation.

The fleet's latency, hit and throughput figures are the single-engine summary's
(:func:`kvtool.simulate.serving._summarise`, one "pool" per replica), so one replica gives today's figures exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.simulate.fleet.loop import FleetRun
from kvtool.simulate.serving import ServeResult, _PoolPlan, _summarise


@dataclasses.dataclass(frozen=True)
class ReplicaResult:
    name: str
    gpu: str
    tp: int
    pool_blocks: int  # vLLM's num_gpu_blocks (null block included)
    requests: int  # routed to this replica
    prompt_tokens: int  # of the requests routed here
    cached_prompt_tokens: int  # prefix hits at first admission
    prefix_hit_rate: float
    preemptions: int
    peak_blocks: int
    busy_s: float  # time spent in engine steps
    steps: int
    ttft_p99_s: float | None


@dataclasses.dataclass(frozen=True)
class PolicyResult:
    """One router policy over the fleet."""

    router: str
    replicas: int
    gpus: int  # replicas x their TP
    block_size: int
    max_num_seqs: int  # of the first replica (all, unless heterogeneous GPUs took their own defaults)
    serve: ServeResult  # the fleet's figures as the single-engine summary gives them (pools: the replicas)
    prefix_hit_rate: float  # cached prompt tokens / prompt tokens of requests that ran
    infinite_cache_hit_rate: float  # the bound: one infinite prefix cache that saw every earlier request
    # At routing time: the best replica's cached prefix (tokens, summed) / prompt tokens, and the routing regret (the
    # best replica's cached prefix less the chosen one's, tokens, summed): None when not measured (--no-regret)
    precise_hit_rate_at_routing: float | None
    regret_tokens: int | None
    regret_rate: float | None  # regret_tokens / prompt tokens of requests that ran
    regretted_requests: int | None  # requests whose chosen replica held less than the best one
    request_imbalance: float  # most requests on one replica / mean per replica (1: even)
    busy_imbalance: float  # longest busy time of one replica / mean (1: even)
    preemptions: int
    per_replica: tuple[ReplicaResult, ...]


def summarise_policy(
    policy: str, run: FleetRun, prompt_tokens, output_tokens, arrival_s, max_model_len
) -> PolicyResult:
    import numpy as np

    P = np.asarray(prompt_tokens, dtype=np.int64)
    out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    arrival = np.asarray(arrival_s if arrival_s is not None else np.zeros(len(P)), dtype=np.float64)
    b = run.replicas[0].config.block_size
    plans = [
        _PoolPlan(spec.name, np.asarray(ids, dtype=np.int64), spec.config.num_blocks)
        for spec, ids in zip(run.replicas, run.routed)
    ]
    total_blocks = sum(spec.config.num_blocks for spec in run.replicas)
    serve, trace = _summarise(b, total_blocks, plans, run.runs, P, out, arrival, max_model_len)
    ran = np.asarray(run.replica_of) >= 0
    ran &= np.isfinite(np.asarray([np.nan if x is None else x for x in run.per_request("admit_s")], dtype=float))
    prompt_ran = float(P[ran].sum())
    rate = (lambda x: float(x) / prompt_ran) if prompt_ran else (lambda x: 0.0)
    inf_hits = np.asarray(run.infinite_hit_blocks, dtype=np.int64) * b
    regret = best = None
    regretted = None
    if run.regret_measured:
        best_b = np.asarray(run.best_hit_blocks, dtype=np.int64)
        chosen_b = np.asarray(run.chosen_hit_blocks, dtype=np.int64)
        gap = np.where(ran, best_b - chosen_b, 0)
        regret = int(gap.sum()) * b
        best = rate(int(np.where(ran, best_b, 0).sum()) * b)
        regretted = int((gap > 0).sum())
    counts = np.asarray([len(ids) for ids in run.routed], dtype=float)
    busy = np.asarray([r.busy_s for r in run.runs], dtype=float)
    replicas = []
    for spec, ids, er, pool in zip(run.replicas, run.routed, run.runs, serve.pools):
        pt = int(P[ids].sum()) if ids else 0
        cached = sum(max(c, 0) for c in er.num_cached_tokens)
        replicas.append(
            ReplicaResult(
                name=spec.name,
                gpu=spec.gpu,
                tp=spec.tp,
                pool_blocks=spec.config.num_blocks,
                requests=len(ids),
                prompt_tokens=pt,
                cached_prompt_tokens=cached,
                prefix_hit_rate=cached / pt if pt else 0.0,
                preemptions=er.preemptions,
                peak_blocks=er.peak_blocks,
                busy_s=er.busy_s,
                steps=er.steps,
                ttft_p99_s=pool.ttft_p99_s,
            )
        )
    return PolicyResult(
        router=policy,
        replicas=len(run.replicas),
        gpus=sum(spec.tp for spec in run.replicas),
        block_size=b,
        max_num_seqs=run.replicas[0].config.max_num_seqs,
        serve=serve,
        prefix_hit_rate=serve.prefix_hit_rate,
        infinite_cache_hit_rate=rate(int(np.where(ran, inf_hits, 0).sum())),
        precise_hit_rate_at_routing=best,
        regret_tokens=regret,
        regret_rate=None if regret is None else rate(regret),
        regretted_requests=regretted,
        request_imbalance=float(counts.max() / counts.mean()) if counts.sum() else float("nan"),
        busy_imbalance=float(busy.max() / busy.mean()) if busy.sum() else float("nan"),
        preemptions=serve.preemptions,
        per_replica=tuple(replicas),
    )


@dataclasses.dataclass(frozen=True)
class FleetReport:
    """`kvtool simulate --serve --replicas N --router P[,P...]`: one result per policy."""

    source: str
    requests: int
    arrivals: str  # where the arrival times came from, in words (with the rate scale)
    replicas_text: str  # the replicas, in words
    pool_text: str
    results: tuple[PolicyResult, ...]

    def to_dict(self) -> dict[str, Any]:
        from kvtool.core.jsonable import to_jsonable

        return to_jsonable(self)


# ----------------------------------------------------------------------------------------------- design sweeps
@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point of the grid: the values of its dimensions (None: the base run's)."""

    replicas: str
    router: str
    block_size: int
    kv_tokens: int | None
    gpu: str | None
    max_num_seqs: int | None


@dataclasses.dataclass(frozen=True)
class SweepRow:
    point: SweepPoint
    result: PolicyResult


@dataclasses.dataclass(frozen=True)
class SweepRecommendation:
    point: SweepPoint
    rule: str
    reason: str  # the numbers behind the choice


@dataclasses.dataclass(frozen=True)
class SweepReport:
    source: str
    requests: int
    dimensions: dict[str, list[Any]]  # the grid's axes as given
    rows: tuple[SweepRow, ...]  # in grid order (the last dimension varying fastest)
    recommendation: SweepRecommendation | None
    ran_on: str  # "this process" or the Dask cluster

    def to_dict(self) -> dict[str, Any]:
        from kvtool.core.jsonable import to_jsonable

        return to_jsonable(self)


TIE_FRACTION = 0.01  # throughputs within 1 % tie (as single-engine simulate's recommendation)


def recommend_point(rows: tuple[SweepRow, ...], slo_ttft_ms: float | None) -> SweepRecommendation | None:
    """Among the points whose TTFT p99 meets ``slo_ttft_ms`` (all without a target): the fewest GPUs; among those,
    the highest output throughput, throughputs within 1 % tied to the higher prefix-hit rate, then the smaller
    block; when no point meets the target, the lowest TTFT p99."""
    ran = [row for row in rows if row.result.serve.completed]
    if not ran:
        return None
    slo_s = None if slo_ttft_ms is None else slo_ttft_ms / 1e3
    meets = [
        row
        for row in ran
        if slo_s is None or (row.result.serve.ttft_p99_s is not None and row.result.serve.ttft_p99_s <= slo_s)
    ]
    target = f"TTFT p99 <= {slo_ttft_ms:g} ms" if slo_s is not None else "no TTFT target (--slo-ttft-ms)"
    if meets:
        fewest = min(row.result.gpus for row in meets)
        cheap = [row for row in meets if row.result.gpus == fewest]
        top = max(row.result.serve.throughput_tokens_per_s for row in cheap)
        tied = [row for row in cheap if row.result.serve.throughput_tokens_per_s >= top * (1 - TIE_FRACTION)]
        best = max(tied, key=lambda row: (row.result.prefix_hit_rate, -row.point.block_size))
        rule = (
            f"{target}; the fewest GPUs; then the highest output throughput, within {TIE_FRACTION:.0%} the higher "
            "prefix-hit rate, then the smaller block"
        )
    else:
        best = min(ran, key=lambda row: (row.result.serve.ttft_p99_s or 0.0, row.result.gpus))
        rule = f"no point meets {target}: the lowest TTFT p99"
    r = best.result
    reason = (
        f"{r.replicas} replicas ({r.gpus} GPUs), router {r.router}, block {r.block_size}: "
        f"{r.serve.throughput_tokens_per_s:,.0f} output tok/s, TTFT p99 {_s(r.serve.ttft_p99_s)}, "
        f"prefix hits {r.prefix_hit_rate:.1%} (bound {r.infinite_cache_hit_rate:.1%}), {r.preemptions:,} preemptions"
    )
    return SweepRecommendation(best.point, rule, reason)


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
