"""``kvtool plan --qps``: each configuration that holds the workload in memory, run through `kvtool simulate
--serve`'s serving simulation, and judged against a TTFT/TPOT target at a percentile.

One code path with simulate: per candidate the options are simulate's own :class:`SimulateOptions` (the candidate's
GPU, tp, KV dtype, gpu_memory_utilization and quantization; its pool is the plan row's ``num_blocks``, given as
``kv_tokens``), the step-time model is :func:`~kvtool.simulate.run.resolve_serving_hardware`'s, and the engine runs
in :func:`~kvtool.simulate.run.serve_requests`, in process.  What makes it fast enough:

- only candidates that pass the memory check are simulated (plan's pass decides that first);
- candidates whose simulation inputs are identical (the step-time constants, the pool's blocks, the block size,
  max_num_seqs and max_num_batched_tokens: e.g. ``--kv-dtype auto,bfloat16`` on a bf16 model, or fp8 and fp8_e4m3)
  share one simulation.  A pool counts as identical to any other that is as large as :func:`ample_blocks`: the
  blocks the running requests can ever hold at once, so that no allocation ever waits, no request is preempted and
  the run is the same whatever the pool beyond (so ``--gpu-memory-utilization 0.9,0.95`` on a large GPU is one
  run); only for prompts that share nothing (no token ids in the trace), where the prefix cache never hits;
- with ``--top N`` the scan goes cheapest first and stops once N configurations meet the target (the rest are
  counted as not simulated, never dropped silently).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.plan.candidates import Candidate
from kvtool.plan.result import PlanRow, ServingFigures, ServingWorkload, Skipped, SloTarget

PP_NOT_SIMULATED = "pp > 1: the serving simulation models one engine over tensor parallelism only (no pipeline stages)"


@dataclasses.dataclass(frozen=True)
class ServingAsk:
    """What ``kvtool plan --qps`` simulates: the requests, simulate's options for them (the candidate's fields unset)
    and the target."""

    requests: Any  # a kvtool.simulate.lengths.RequestSet
    options: Any  # a kvtool.simulate.run.SimulateOptions: block size, --qps, --seed, scheduler limits, model
    target: SloTarget
    workload: ServingWorkload


@dataclasses.dataclass(frozen=True)
class ServedRows:
    """The fitting rows after the serving simulation, cheapest first each."""

    met: tuple[PlanRow, ...]  # meet the target
    missed: tuple[PlanRow, ...]  # simulated, miss it
    skipped: tuple[Skipped, ...]  # fit in memory, not simulated, and why
    simulations: int  # engine runs (fewer than the rows simulated where inputs were identical)


def candidate_options(ask: ServingAsk, row: PlanRow, candidate: Candidate):
    """Simulate's options for one candidate: its GPU, parallelism and settings, and its pool (the row's blocks)."""
    return dataclasses.replace(
        ask.options,
        gpu=candidate.gpu,
        tp=candidate.tp,
        kv_dtype=candidate.kv_dtype,
        gpu_memory_utilization=candidate.gpu_memory_utilization,
        quantization=candidate.quantization,
        kv_tokens=row.num_blocks * row.block_size,
        kv_tokens_text=f"kvtool plan's pool for the candidate ({row.num_blocks:,} blocks)",
    )


def serve_fitting(pairs: Iterable[tuple[PlanRow, Candidate]], ask: ServingAsk, top: int | None) -> ServedRows:
    """Simulate each (row, candidate) in the order given (cheapest first), judge it, stop after ``top`` meet."""
    from kvtool.simulate.run import resolve_serving_hardware

    met: list[PlanRow] = []
    missed: list[PlanRow] = []
    skipped: dict[str, int] = {}
    done: dict[tuple, ServingFigures] = {}
    ample = ample_blocks(ask.requests, ask.options.block_sizes[0])
    # the step-time model per (GPU, tp, KV dtype, quantization): gpu_memory_utilization changes only the KV budget,
    # and the pool is the row's own (kv_tokens), so one resolution serves every utilization
    hardware: dict[tuple, Any] = {}
    for row, candidate in pairs:
        if top is not None and len(met) >= top:  # the early stop: the rest cost as much or more
            _count(skipped, f"--top {top}: that many cheaper configurations meet the target already")
            continue
        if row.pp > 1:
            _count(skipped, PP_NOT_SIMULATED)
            continue
        options = candidate_options(ask, row, candidate)
        same = (candidate.gpu, candidate.tp, candidate.kv_dtype, candidate.quantization)
        if same not in hardware:
            try:
                hardware[same] = resolve_serving_hardware(options)
            except UsageError as err:  # e.g. a GPU profile without a bandwidth: no step times
                hardware[same] = err
        hw = hardware[same]
        if isinstance(hw, UsageError):
            _count(skipped, hw.one_line())
            continue
        seqs = options.max_num_seqs or hw.max_num_seqs
        mnbt = options.max_num_batched_tokens or hw.max_num_batched_tokens
        blocks = row.num_blocks if ample is None else min(row.num_blocks, ample(seqs))
        key = (_step_time_inputs(hw), blocks, row.block_size, seqs, mnbt)
        if key in done:
            figures = dataclasses.replace(done[key], shared_simulation=True)
        else:
            figures = done[key] = _simulate(ask, options, hw, seqs, mnbt)
        row = dataclasses.replace(row, serving=figures)
        (met if figures.meets_slo else missed).append(row)
    return ServedRows(
        met=tuple(met),
        missed=tuple(missed),
        skipped=tuple(Skipped(reason, n) for reason, n in skipped.items()),
        simulations=len(done),
    )


def ample_blocks(requests, block_size: int):
    """``ample(max_num_seqs)``: a pool of that many blocks never runs short (the null block and the ``max_num_seqs``
    largest requests' blocks, each its whole prompt + output), or None where prompts may share blocks.

    Past it the scheduler's decisions cannot depend on the pool's size: a request never waits for blocks, none is
    preempted, and with unrelated prompts the prefix cache never hits, so which cached blocks were evicted does
    not matter.  tests/plan/test_plan_serving.py checks rows sharing a run against simulate on each one's own pool.
    """
    import numpy as np

    if requests.shared is not None:
        return None
    need = np.sort(-(-(requests.prompt_tokens + np.maximum(requests.output_tokens, 1)) // block_size))[::-1]
    held = np.concatenate([[0], np.cumsum(need)])

    def ample(max_num_seqs: int) -> int:
        return 1 + int(held[min(max_num_seqs, len(need))])

    return ample


def _count(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


def _step_time_inputs(hw) -> tuple:
    """The Hardware fields the engine's step times depend on (not its names, sources or KV budget)."""
    return (
        hw.weights_bytes_per_gpu,
        hw.params_per_gpu,
        hw.kv_bytes_per_token_per_gpu,
        hw.num_layers,
        hw.attention_heads_per_gpu,
        hw.head_dim,
        hw.bandwidth_bytes_per_s,
        hw.peak_flops_per_s,
        hw.step_overhead_ms,
        hw.table_entry_us,
    )


def _simulate(ask: ServingAsk, options, hw, seqs: int, mnbt: int) -> ServingFigures:
    """One run of simulate's serving code path for one candidate, judged against the target."""
    from kvtool.simulate.run import serve_requests
    from kvtool.simulate.serving import latency_percentiles

    results, _, traces, _, _ = serve_requests(ask.requests, options, None, keep_traces=True, hardware=hw)
    result, trace = results[0], traces[options.block_sizes[0]]
    q = ask.target.percentile
    (ttft_s,) = latency_percentiles(trace.ttft_s, [q])
    (tpot_s,) = latency_percentiles(trace.tpot_s, [q])
    ttft_ms = None if ttft_s is None else ttft_s * 1e3
    tpot_ms = None if tpot_s is None else tpot_s * 1e3
    return judge(ask.target, ttft_ms, tpot_ms, result, seqs, mnbt)


def judge(target: SloTarget, ttft_ms: float | None, tpot_ms: float | None, result, seqs: int, mnbt: int):
    """The verdict: every request completed, and each target given at least met (value <= target)."""
    unfinished = result.requests - result.completed
    ttft_room = None if target.ttft_ms is None or ttft_ms is None else target.ttft_ms - ttft_ms
    tpot_room = None if target.tpot_ms is None or tpot_ms is None else target.tpot_ms - tpot_ms
    p = f"p{target.percentile:g}"
    said, meets = [], unfinished == 0
    for name, value, room, goal in (
        ("TTFT", ttft_ms, ttft_room, target.ttft_ms),
        ("TPOT", tpot_ms, tpot_room, target.tpot_ms),
    ):
        if goal is None:
            continue
        if value is None or room is None:
            meets = False
            said.append(f"no {name} (no request produced one)")
            continue
        meets = meets and room >= 0
        said.append(f"{name} {p} {_ms(abs(room))} {'under' if room >= 0 else 'over'} {goal:g} ms")
    if unfinished:
        said.append(f"{unfinished:,} of {result.requests:,} requests never ran (no room in the pool)")
    return ServingFigures(
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        ttft_p50_ms=None if result.ttft_p50_s is None else result.ttft_p50_s * 1e3,
        tpot_p50_ms=None if result.tpot_p50_s is None else result.tpot_p50_s * 1e3,
        throughput_tokens_per_s=result.throughput_tokens_per_s,
        requests_per_s=result.requests_per_s,
        requests=result.requests,
        completed=result.completed,
        preemptions=result.preemptions,
        peak_blocks=result.peak_blocks,
        max_num_seqs=seqs,
        max_num_batched_tokens=mnbt,
        meets_slo=meets,
        ttft_headroom_ms=ttft_room,
        tpot_headroom_ms=tpot_room,
        verdict=("meets: " if meets else "misses: ") + "; ".join(said),
    )


def _ms(x: float) -> str:
    return f"{x:,.1f} ms" if x >= 10 else f"{x:,.3g} ms"


def nobody_meets(served: ServedRows, target: SloTarget) -> str:
    """The explanation of an empty answer: what was simulated and the closest miss."""
    goal = " and ".join(
        f"{name} p{target.percentile:g} <= {value:g} ms"
        for name, value in (("TTFT", target.ttft_ms), ("TPOT", target.tpot_ms))
        if value is not None
    )
    if not served.missed:
        return f"no configuration meets {goal}: none could be simulated (see the notes)"
    closest = min(served.missed, key=_shortfall)
    s = closest.serving
    assert s is not None
    return (
        f"no configuration meets {goal}: of {len(served.missed):,} simulated, the closest is {closest.gpu} "
        f"x{closest.num_gpus} (tp {closest.tp}, kv {closest.kv_dtype}, util {closest.gpu_memory_utilization:g}), "
        f"{s.verdict.removeprefix('misses: ')}"
    )


def _shortfall(row: PlanRow) -> float:
    """How far a row misses, relative to the targets (the worst of its metrics)."""
    s = row.serving
    assert s is not None
    worst = 0.0 if s.completed == s.requests else float("inf")
    for value, room in ((s.ttft_ms, s.ttft_headroom_ms), (s.tpot_ms, s.tpot_headroom_ms)):
        if room is not None and value:
            worst = max(worst, -room / (value - room))
    return worst
