"""The serving simulation of `kvtool simulate --serve`: requests through vLLM V1's scheduler, per block size.

The engine model is :mod:`kvtool.simulate.scheduler` (vLLM 0.32's ``Scheduler.schedule`` step by step, chunked
prefill, prefix cache, preemption by recompute); step times come from :mod:`kvtool.simulate.costs` (a roofline from
the model and the GPU).  This module sets up the pools (one, or a short and a long pool with ``--split-pools``), runs
the engine and summarises one block size in a :class:`ServeResult`.  docs/simulate.md has the long form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.simulate.costs import Hardware, RooflineCost
from kvtool.simulate.offload_tier import CpuTier
from kvtool.simulate.scheduler import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    EngineConfig,
    EngineRun,
    Prompt,
    run_engine,
)

__all__ = ["DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "ServeConfig", "ServeResult", "simulate_serving"]


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How the simulated engine is set up (the same for every block size)."""

    hardware: Hardware
    kv_tokens: int | None = None  # an explicit pool in tokens (--kv-tokens); None: the GPU's KV budget
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None  # None: no limit beyond the pool
    prefix_cache: bool = True  # vLLM's default: enable_prefix_caching
    split_threshold_tokens: int | None = None  # final length above which a request goes to the long pool
    record_events: bool = False


@dataclasses.dataclass(frozen=True)
class PoolResult:
    """Figures for one pool (one entry without --split-pools; short then long with it)."""

    name: str
    pool_blocks: int
    requests: int
    never_fit: int
    peak_blocks: int
    preemptions: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None


@dataclasses.dataclass(frozen=True)
class ServeResult:
    """Serving-simulation figures for one block size."""

    block_size: int
    pool_tokens: int  # usable KV tokens: (blocks - 1 null block) x block_size, all pools
    pool_blocks: int  # vLLM's num_gpu_blocks, all pools (null blocks included)
    requests: int
    completed: int
    never_fit: int  # requests whose whole sequence needs more blocks than their pool has: never run
    refused_too_long: int  # prompts of max_model_len tokens or more: vLLM refuses them at input, never run
    peak_blocks: int  # most blocks in use at any step (shared prefix blocks once)
    mean_blocks: float  # time-weighted blocks in use over the span (first arrival to last completion)
    utilization: float  # integral of tokens held / (block_size x integral of block-table entries): per request
    preemptions: int  # preemption events (a request can be preempted more than once)
    preempted_requests: int
    cached_prompt_tokens: int  # sum of num_cached_tokens (prefix hits at first admission)
    prefix_hit_rate: float  # cached_prompt_tokens / prompt tokens of requests that ran
    evicted_blocks: int  # cached blocks taken back for new data
    queue_delay_p50_s: float | None  # arrival to first admission
    queue_delay_p99_s: float | None
    ttft_p50_s: float | None  # arrival to the end of the step that produced the first token
    ttft_p99_s: float | None
    tpot_p50_s: float | None  # (completion - first token) / (output - 1)
    tpot_p99_s: float | None
    span_s: float  # first arrival to last completion
    steps: int  # engine steps executed (all pools)
    busy_s: float  # time the engines spent running steps
    throughput_tokens_per_s: float  # output tokens of completed requests / span
    requests_per_s: float
    pools: list[PoolResult]
    # vLLM's KV-cache groups the run simulated, in words ("full attention (2 layers)", "sliding window 64 (2 layers)")
    kv_groups: tuple[str, ...] = ("full attention (one group)",)
    # per group (same order): the prefix hit that group alone found at each request's first admission, summed
    # (tokens); cached_prompt_tokens is what every group agreed on.  Empty with one full-attention group.
    group_hit_tokens: tuple[int, ...] = ()


@dataclasses.dataclass
class ServeTrace:
    """What the simulation recorded, for event export and plots (one EngineRun per pool, with request maps)."""

    block_size: int
    runs: list[EngineRun]
    request_index: list[Any]  # per pool: numpy array of the original request numbers
    timeline_s: Any  # start time of each recorded interval (all pools merged, for plots)
    timeline_blocks: Any
    # per request (numpy float64, nan where it never produced a token / has one output token): what ServeResult's
    # percentiles are taken over (kvtool plan --qps takes its --slo-percentile of them with latency_percentiles)
    ttft_s: Any = None
    tpot_s: Any = None


@dataclasses.dataclass(frozen=True)
class _PoolPlan:
    name: str
    requests: Any  # numpy int64 array of request numbers
    num_blocks: int


def _plan_pools(final_tokens, block_size: int, total_blocks: int, split: int | None) -> list[_PoolPlan]:
    """One pool, or short/long pools split by final length with blocks shared in proportion to their tokens."""
    import numpy as np

    n = len(final_tokens)
    if split is None:
        return [_PoolPlan("all", np.arange(n), total_blocks)]
    is_long = final_tokens > split
    total = float(final_tokens.sum()) or 1.0
    long_blocks = int(round(total_blocks * float(final_tokens[is_long].sum()) / total))
    return [
        _PoolPlan("short", np.flatnonzero(~is_long), total_blocks - long_blocks),
        _PoolPlan("long", np.flatnonzero(is_long), long_blocks),
    ]


def simulate_serving(
    prompts: Sequence[Prompt],
    output_tokens,
    arrival_s,
    block_size: int,
    config: ServeConfig,
    total_blocks: int,
    progress: Callable[[int], None] | None = None,
    tier: CpuTier | None = None,
    groups=None,
) -> tuple[ServeResult, ServeTrace]:
    """Run every request through the simulated engine(s) at one block size and summarise.  ``tier``: a CPU tier of
    the offloading connector behind the pool (one pool, full attention only); ``groups``: the model's KV-cache groups
    (:class:`kvtool.simulate.grouped.ModelGroups`; None: one full-attention group)."""
    import numpy as np

    out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    prompt_len = np.array([p.tokens for p in prompts], dtype=np.int64)
    arrival = np.asarray(arrival_s, dtype=np.float64)
    plans = _plan_pools(prompt_len + out - 1, block_size, total_blocks, config.split_threshold_tokens)
    if tier is not None and len(plans) > 1:
        raise UsageError("kvtool does not model one CPU tier behind split pools", where="--kv-offloading-size")
    cost = RooflineCost(config.hardware, block_size)
    from kvtool.simulate.grouped import GroupedEngine

    runs = []
    for plan in plans:
        engine = EngineConfig(
            num_blocks=max(plan.num_blocks, 1),
            block_size=block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            max_model_len=config.max_model_len or (1 << 40),
            enable_prefix_caching=config.prefix_cache,
            kv_groups=groups.specs if groups is not None else (),
        )
        idx = plan.requests
        runs.append(
            run_engine(
                engine,
                [prompts[i] for i in idx],
                out[idx].tolist(),
                arrival[idx].tolist(),
                cost,
                progress,
                record_events=config.record_events,
                tier=tier,
                engine_class=GroupedEngine if groups is not None and groups.specs else None,
            )
        )
    result, trace = _summarise(block_size, total_blocks, plans, runs, prompt_len, out, arrival, config.max_model_len)
    if groups is not None and groups.specs:
        hits = [sum(r.group_hit_tokens[g] for r in runs if r.group_hit_tokens) for g in range(len(groups.specs))]
        # util. (tokens held / slots of the blocks held) counts every computed token, while a sliding or chunked
        # group holds only its window: not a figure of this run, so not given
        result = dataclasses.replace(
            result, kv_groups=groups.describe(), group_hit_tokens=tuple(hits), utilization=float("nan")
        )
    return result, trace


@dataclasses.dataclass(frozen=True)
class _PerRequest:
    """Per-request figures gathered from the pools' runs (numpy arrays over all requests; nan/-1 where never run)."""

    admit_s: Any
    first_token_s: Any
    finish_s: Any
    cached_tokens: Any
    preemptions: Any


def _gather(plans: list[_PoolPlan], runs: list[EngineRun], n: int) -> _PerRequest:
    import numpy as np

    admit = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    cached = np.zeros(n, dtype=np.int64)
    pre = np.zeros(n, dtype=np.int64)
    for plan, run in zip(plans, runs):
        idx = plan.requests
        admit[idx] = run.admit_s
        first[idx] = run.first_token_s
        finish[idx] = run.finish_s
        cached[idx] = np.maximum(np.asarray(run.num_cached_tokens, dtype=np.int64), 0)
        pre[idx] = run.num_preemptions
    return _PerRequest(admit, first, finish, cached, pre)


def latency_percentiles(values, qs):
    """The ``qs`` percentiles (numpy's linear interpolation) of the finite ``values``; None each when none is."""
    import numpy as np

    v = values[np.isfinite(values)]
    if not len(v):
        return [None] * len(qs)
    return [float(x) for x in np.percentile(v, qs)]


@dataclasses.dataclass(frozen=True)
class Latencies:
    """Per-request latencies and their summary, as both engines' simulations report them (vLLM's and SGLang's)."""

    ttft_s: Any  # numpy float64 per request: arrival to the end of the step that produced the first token (nan: none)
    tpot_s: Any  # (completion - first token) / (output - 1); nan with one output token or never finished
    queue_delay_p50_s: float | None  # arrival to first admission
    queue_delay_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    span_s: float  # first arrival (of the requests that ran) to the last completion
    throughput_tokens_per_s: float  # output tokens of completed requests / span (nan: no span)
    requests_per_s: float


def request_latencies(arrival_s, admit_s, first_token_s, finish_s, output_tokens, ran) -> Latencies:
    """The latencies of one run from per-request times (numpy arrays, nan where never reached); ``ran``: the
    requests that were admitted (a boolean array), whose first arrival opens the span."""
    import numpy as np

    finished = np.isfinite(finish_s)
    first_arrival = float(arrival_s[ran].min()) if ran.any() else 0.0
    span = float(np.nanmax(finish_s)) - first_arrival if finished.any() else 0.0
    ttft = first_token_s - arrival_s
    out = output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish_s - first_token_s) / (out - 1), np.nan)
    q50, q99 = latency_percentiles(admit_s - arrival_s, [50, 99])
    t50, t99 = latency_percentiles(ttft, [50, 99])
    p50, p99 = latency_percentiles(tpot, [50, 99])
    return Latencies(
        ttft_s=ttft,
        tpot_s=tpot,
        queue_delay_p50_s=q50,
        queue_delay_p99_s=q99,
        ttft_p50_s=t50,
        ttft_p99_s=t99,
        tpot_p50_s=p50,
        tpot_p99_s=p99,
        span_s=span,
        throughput_tokens_per_s=float(out[finished].sum()) / span if span > 0 else float("nan"),
        requests_per_s=float(finished.sum()) / span if span > 0 else float("nan"),
    )


def _summarise(
    b, total_blocks, plans, runs, prompt_len, out, arrival, max_model_len: int | None
) -> tuple[ServeResult, ServeTrace]:
    import numpy as np

    n = len(prompt_len)
    per = _gather(plans, runs, n)
    finished = np.isfinite(per.finish_s)
    refused = prompt_len >= max_model_len if max_model_len is not None else np.zeros(n, dtype=bool)
    if max_model_len is not None:  # outputs stop at max_model_len (vLLM's check_stop): the tokens really generated
        out = np.maximum(np.minimum(out, max_model_len - prompt_len), 1)
    never = ~np.isfinite(per.admit_s) & ~refused
    ran = ~never & ~refused
    lat = request_latencies(arrival, per.admit_s, per.first_token_s, per.finish_s, out, ran)
    span, ttft, tpot = lat.span_s, lat.ttft_s, lat.tpot_s
    block_s = sum(r.block_seconds for r in runs)
    entry_s = sum(r.entry_seconds for r in runs)
    token_s = sum(r.token_seconds for r in runs)
    busy = sum(r.busy_s for r in runs)
    pools = []
    for plan, run in zip(plans, runs):
        pt50, pt99 = latency_percentiles(ttft[plan.requests], [50, 99])
        pools.append(
            PoolResult(
                plan.name,
                plan.num_blocks,
                len(plan.requests),
                int(never[plan.requests].sum()),
                run.peak_blocks,
                run.preemptions,
                pt50,
                pt99,
            )
        )
    prompt_ran = float(prompt_len[ran].sum())
    result = ServeResult(
        block_size=b,
        pool_tokens=sum(max(p.num_blocks - 1, 0) for p in plans) * b,
        pool_blocks=total_blocks,
        requests=n,
        completed=int(finished.sum()),
        never_fit=int(never.sum()),
        refused_too_long=int(refused.sum()),
        peak_blocks=_peak(runs),
        mean_blocks=block_s / span if span > 0 else float("nan"),
        utilization=token_s / (b * entry_s) if entry_s > 0 else float("nan"),
        preemptions=sum(r.preemptions for r in runs),
        preempted_requests=int((per.preemptions > 0).sum()),
        cached_prompt_tokens=int(per.cached_tokens.sum()),
        prefix_hit_rate=float(per.cached_tokens.sum()) / prompt_ran if prompt_ran else 0.0,
        evicted_blocks=sum(r.evictions for r in runs),
        queue_delay_p50_s=lat.queue_delay_p50_s,
        queue_delay_p99_s=lat.queue_delay_p99_s,
        ttft_p50_s=lat.ttft_p50_s,
        ttft_p99_s=lat.ttft_p99_s,
        tpot_p50_s=lat.tpot_p50_s,
        tpot_p99_s=lat.tpot_p99_s,
        span_s=span,
        steps=sum(r.steps for r in runs),
        busy_s=busy,
        throughput_tokens_per_s=lat.throughput_tokens_per_s,
        requests_per_s=lat.requests_per_s,
        pools=pools,
    )
    return result, _trace(b, plans, runs, ttft, tpot)


def _peak(runs: list[EngineRun]) -> int:
    """Peak blocks in use: one pool's own peak, or the peak of the pools' sum over merged timelines."""
    if len(runs) == 1:
        return runs[0].peak_blocks
    return sum(r.peak_blocks for r in runs)


def _trace(b: int, plans: list[_PoolPlan], runs: list[EngineRun], ttft_s, tpot_s) -> ServeTrace:
    import numpy as np

    t = np.concatenate([np.asarray(r.timeline_s) for r in runs])
    blocks = np.concatenate([np.asarray(r.timeline_blocks, dtype=np.int64) for r in runs])
    order = np.argsort(t, kind="stable")
    return ServeTrace(
        block_size=b,
        runs=runs,
        request_index=[p.requests for p in plans],
        timeline_s=t[order],
        timeline_blocks=blocks[order],
        ttft_s=ttft_s,
        tpot_s=tpot_s,
    )
