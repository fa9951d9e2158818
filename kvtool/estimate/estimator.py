"""The core of ``kvtool estimate``: one request in, one frozen result out (never prints, never exits).

:func:`estimate` is a straight pass, each step a function of its own module returning a frozen dataclass:

    check the request      request.check_request
    resolve the model      model.resolve_model          -> ResolvedModel (spec as vLLM runs it, weights)
    lay out its KV cache   layout.kv_layout             -> KvLayout (per GPU)
    find the GPU           gpu.asked_gpu                -> AskedGpu | None
    scheduler settings     serve_defaults.scheduler_settings -> Scheduler (vllm serve's defaults by GPU and version)
    budget                 budget.plan_budget           -> PipelinePlan (KV budget, reserve, pipeline stages)
    capacity               fit.asked_lengths, fit.plan_fit -> Lengths, Fit (blocks and requests at each length)
    CPU tier               offload.plan_offload         -> OffloadTier | None (--kv-offloading-size)
    disaggregation         disagg.plan_disagg           -> Disaggregation | None (--kv-transfer-config, --ttft-budget-ms)
    speculative decoding   spec_decode.resolve_spec_decode -> SpecDecode (draft KV layers, state blocks, weights)
    what-ifs               whatif.compare_rows, whatif.suggest_fits
    result                 result.build_result          -> EstimateResult (the table's and --json's record)

Rules that change between vLLM releases live in the step that applies them, in a table keyed by version
(serve_defaults.BATCH_DEFAULTS_RULES for the scheduler defaults).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kvtool.core.errors import UsageError
from kvtool.estimate.budget import plan_budget, resolve_budget
from kvtool.estimate.capacity import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, Capacity, plan_capacity
from kvtool.estimate.fit import SweepPoint, asked_lengths, plan_fit
from kvtool.estimate.gpu import AskedGpu, asked_gpu, check_block_size
from kvtool.estimate.layout import KvLayout, kv_layout
from kvtool.estimate.model import ResolvedModel, resolve_model
from kvtool.estimate.request import _FIELD_OF_OPTION, EstimateRequest, check_request, request_from, wants_disagg
from kvtool.estimate.result import EstimateResult, LayerGroupResult, WhatIf, build_result
from kvtool.estimate.serve_defaults import scheduler_settings
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

if TYPE_CHECKING:  # imported with --speculative-config only; the what-ifs with --compare or a batch that does not fit
    from kvtool.estimate.spec_decode import SpecDecode
    from kvtool.estimate.whatif import CompareRow

__all__ = [
    "_FIELD_OF_OPTION",
    "AskedGpu",
    "CompareRow",
    "EstimateRequest",
    "EstimateResult",
    "LayerGroupResult",
    "ResolvedModel",
    "SweepPoint",
    "estimate",
    "kv_budget_tokens",
    "request_from",
]


def estimate(request: EstimateRequest) -> EstimateResult:
    """Bytes of KV cache for the asked lengths and batches, and with a budget what fits (vLLM's way)."""
    request = check_request(request)
    model = resolve_model(request)
    layout = kv_layout(model.spec, request.kv_dtype, request.tp)
    speculative = None
    if request.speculative_config is not None:
        model, layout, speculative = with_drafter(request, model, layout)
    gpu = asked_gpu(request)
    check_block_size(request.block_size, gpu)
    scheduler = scheduler_settings(request, gpu)
    plan = plan_budget(request, model, layout, gpu, scheduler)
    lengths = asked_lengths(request, model.spec)
    fit = plan_fit(request, plan, scheduler, lengths)
    budget = plan.planned.budget
    compare: tuple[CompareRow, ...] = ()
    if request.compare:
        from kvtool.estimate.whatif import compare_rows

        compare = compare_rows(
            model.spec,
            request,
            budget,
            scheduler,
            fit.seq_len,
            fit.batch,
            layout.kv_bytes_per_gpu(fit.seq_len, fit.batch),
        )
    suggestions: tuple[str, ...] = ()
    if request.suggest and fit.capacity is not None and not fit.capacity.fits:  # what suggest_fits answers
        from kvtool.estimate.whatif import suggest_fits

        suggestions = suggest_fits(request, model.spec, fit.capacity, scheduler, estimate)
    what_if = WhatIf(compare, suggestions)
    offload = None
    if request.kv_offloading_size is not None:
        from kvtool.estimate.offload import plan_offload

        offload = plan_offload(
            request.kv_offloading_size,
            request.kv_offloading_backend,
            fit.capacity,
            request.tp,
            request.pp,
            request.vllm_version,
            layout=layout,
            lmcache_chunk_size=request.lmcache_chunk_size,
        )
    disagg = None
    if wants_disagg(request):
        from kvtool.estimate.disagg import plan_disagg

        disagg = plan_disagg(
            layout,
            fit.capacity,
            prompt_len=request.prompt_len or fit.seq_len,
            block_size=request.block_size,
            tp=request.tp,
            transfer_config=request.kv_transfer_config,
            transfers_in_flight=request.transfers_in_flight,
            ttft_budget_ms=request.ttft_budget_ms,
            prefill_ms=request.prefill_ms,
        )
    return build_result(
        request,
        model,
        layout,
        scheduler,
        plan,
        lengths,
        fit,
        what_if,
        offload=offload,
        speculative=speculative,
        disagg=disagg,
    )


def with_drafter(
    request: EstimateRequest, model: ResolvedModel, layout: KvLayout
) -> tuple[ResolvedModel, KvLayout, SpecDecode]:
    """The model and KV layout with --speculative-config's drafter: its layers in the KV cache, its weights added."""
    from kvtool.estimate.spec_decode import (
        resolve_spec_decode,
        with_draft_layers,
        with_draft_memory,
        with_speculative_conv_rows,
    )

    assert request.speculative_config is not None
    weights = model.weights
    spec = with_speculative_conv_rows(model.spec, request.speculative_config, request.vllm_version)
    if spec is not model.spec:  # a larger state page: the layout again from the grown state
        model = dataclasses.replace(model, spec=spec)
        layout = kv_layout(spec, request.kv_dtype, request.tp)
    speculative, draft = resolve_spec_decode(
        request.speculative_config,
        model.spec,
        layout,
        weights.method if weights else None,
        request.kv_dtype,
        request.tp,
        request.vllm_version,
    )
    if request.draft_memory is not None:
        speculative = with_draft_memory(speculative, request.draft_memory, request.tp)
    if weights is not None and speculative.draft_weights_bytes:
        # the language model's method stays its own: the result names the drafter's beside it
        weights = dataclasses.replace(weights, weights_bytes=weights.weights_bytes + speculative.draft_weights_bytes)
    model = dataclasses.replace(
        model, weights=weights, draft_weights_bytes=speculative.draft_weights_bytes if weights is not None else 0
    )
    return model, with_draft_layers(layout, draft, speculative), speculative


def kv_budget_tokens(
    *,
    model: str | None = None,
    config: str | None = None,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    kv_memory: str | int | None = None,
    tp: int = 1,
    kv_dtype: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    gpu_memory_utilization: float | None = None,
    reserve: str | int | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    profile_dirs: tuple[str, ...] = (),
    vllm_version: str = NEWEST_RELEASE,
) -> Capacity:
    """Public API (used by ``kvtool simulate``): a model and a GPU or KV budget -> vLLM's block capacity.

    ``result.num_blocks`` and ``result.kv_cache_tokens`` are the pool size; ``block_size`` is echoed.
    Sizes may be ints (bytes) or strings such as ``"80GiB"``.  Raises KvtoolError subclasses on bad input.
    """
    request = EstimateRequest(
        model=model,
        config=config,
        gpu=gpu,
        gpu_memory=None if gpu_memory is None else str(gpu_memory),
        kv_memory=None if kv_memory is None else str(kv_memory),
        tp=tp,
        kv_dtype=kv_dtype,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        reserve=None if reserve is None else str(reserve),
        seq_lens=(max_model_len,) if max_model_len else (),
        max_num_batched_tokens=max_num_batched_tokens,
        profile_dirs=tuple(profile_dirs),
        vllm_version=vllm_version,
    )
    request = check_request(request)
    resolved = resolve_model(request)
    spec = resolved.spec
    layout = kv_layout(spec, kv_dtype, tp)
    asked = asked_gpu(request)
    scheduler = scheduler_settings(request, asked)
    budget = resolve_budget(request, spec, resolved.weights, asked, scheduler).budget
    if budget is None:
        raise UsageError("give --gpu, --gpu-memory or --kv-memory for a KV budget")
    length = max_model_len or spec.max_position_embeddings or 4096
    return plan_capacity(
        spec,
        layout,
        budget.kv_budget_bytes,
        block_size=block_size,
        max_model_len=length,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_version=request.vllm_version,
    )


def __getattr__(name: str):
    # CompareRow (in __all__) comes from kvtool.estimate.whatif, imported only when --compare or a suggestion needs it
    if name == "CompareRow":
        from kvtool.estimate.whatif import CompareRow

        return CompareRow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
