"""What fits: the lengths and batches asked (or the model's context and batch 1), and vLLM's capacity at each."""

from __future__ import annotations

import dataclasses

from kvtool.estimate.budget import DEFAULT_MANUAL_SEQ_LEN, PipelinePlan
from kvtool.estimate.capacity import Budget, Capacity, plan_capacity
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.layout import KvLayout
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.serve_defaults import Scheduler


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The sequence lengths and batch sizes asked (or defaulted), each once."""

    seq_lens: tuple[int, ...]  # each once, in the order asked
    batches: tuple[int, ...]
    defaults: tuple[str, ...]  # the defaults used for them, in words


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One (seq_len, batch) of a --seq-len / --batch sweep: its KV bytes and, with a budget, whether it fits."""

    seq_len: int
    batch: int
    kv_bytes: int
    kv_bytes_per_gpu: int
    fits: bool | None
    max_concurrency: float | None


@dataclasses.dataclass(frozen=True)
class Fit:
    """Capacity at the first (seq_len, batch) asked, and every point of a sweep."""

    seq_len: int
    batch: int
    capacity: Capacity | None  # None without a budget
    sweep: tuple[SweepPoint, ...]  # every (seq_len, batch) asked when a list was given; empty otherwise


def asked_lengths(request: EstimateRequest, spec: ModelSpec) -> Lengths:
    """The sequence lengths and batches asked, or the model's context and batch 1."""
    said: list[str] = []
    seq_lens = tuple(dict.fromkeys(request.seq_lens))  # a value given twice is one row of the sweep, not two
    if not seq_lens:
        default_len = spec.max_position_embeddings or DEFAULT_MANUAL_SEQ_LEN
        seq_lens = (default_len,)
        why = (
            "the model's max_position_embeddings, vLLM's default max_model_len"
            if spec.max_position_embeddings
            else "kvtool's default"
        )
        said.append(f"seq-len {default_len:,} ({why})")
    if not request.batches:
        said.append("batch 1")
    return Lengths(seq_lens, tuple(dict.fromkeys(request.batches)) or (1,), tuple(said))


def plan_fit(request: EstimateRequest, plan: PipelinePlan, scheduler: Scheduler, lengths: Lengths) -> Fit:
    """vLLM's capacity for the binding stage at the first length and batch asked, and at every point of a sweep."""
    seq_len, batch = lengths.seq_lens[0], lengths.batches[0]
    budget = plan.planned.budget
    capacity = capacity_at(plan.spec, plan.layout, budget, request, scheduler, seq_len, batch)
    return Fit(seq_len, batch, capacity, _sweep(plan, request, scheduler, lengths))


def capacity_at(
    spec: ModelSpec,
    layout: KvLayout,
    budget: Budget | None,
    request: EstimateRequest,
    scheduler: Scheduler,
    seq_len: int,
    batch: int,
) -> Capacity | None:
    """vLLM's block count and what fits for one (seq_len, batch); None without a budget."""
    if budget is None:
        return None
    return plan_capacity(
        spec,
        layout,
        budget.kv_budget_bytes,
        block_size=request.block_size,
        max_model_len=seq_len,
        batch=batch,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_in_flight=scheduler.max_in_flight_tokens,
        prefix_caching=request.prefix_caching,
        vllm_version=request.vllm_version,
        speculative_blocks=_speculative_blocks(request),
        mamba_cache_mode=request.mamba_cache_mode,
        mamba_block_size=request.mamba_block_size,
    )


def _sweep(
    plan: PipelinePlan, request: EstimateRequest, scheduler: Scheduler, lengths: Lengths
) -> tuple[SweepPoint, ...]:
    if len(lengths.seq_lens) == 1 and len(lengths.batches) == 1:
        return ()
    points = []
    for s in lengths.seq_lens:
        for b in lengths.batches:
            cap = capacity_at(plan.spec, plan.layout, plan.planned.budget, request, scheduler, s, b)
            per_gpu = plan.layout.kv_bytes_per_gpu(s, b)
            points.append(
                SweepPoint(
                    s, b, per_gpu * request.tp, per_gpu, cap.fits if cap else None, cap.max_concurrency if cap else None
                )
            )
    return tuple(points)


def _speculative_blocks(request: EstimateRequest) -> int:
    """The extra state blocks a request holds with --speculative-config (0 without one)."""
    if request.speculative_config is None:
        return 0
    from kvtool.estimate.spec_decode import speculative_state_blocks

    return speculative_state_blocks(request.speculative_config, request.vllm_version)
