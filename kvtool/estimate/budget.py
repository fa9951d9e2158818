"""The KV budget per GPU: --kv-memory as is, or the GPU's memory less the weights and the modelled reserve, for the
whole model or, with pipeline parallelism, for the stage with the fewest blocks (vLLM's shared pool)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kvtool.core.errors import UsageError
from kvtool.core.units import parse_override_size, parse_size
from kvtool.estimate.capacity import DEFAULT_GPU_MEMORY_UTILIZATION, Budget, gpu_budget, plan_capacity
from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.gpu import AskedGpu, implausible_size
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.layout import KvLayout, kv_layout
from kvtool.estimate.model import ResolvedModel, encoder_not_counted
from kvtool.estimate.model_runner import choose_runner
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.reserve import Reserve, ReserveOverrides, model_reserve
from kvtool.estimate.rope import rotary_cache_bytes
from kvtool.estimate.serve_defaults import Scheduler
from kvtool.estimate.weights import WeightEstimate

if TYPE_CHECKING:  # kvtool.estimate.pipeline is imported at pp > 1 only, lora with --enable-lora
    from kvtool.estimate.lora import LoraPlan
    from kvtool.estimate.multimodal import EncoderPlan
    from kvtool.estimate.pipeline import Stage

DEFAULT_MANUAL_SEQ_LEN = 2048  # the length of a model that names no max_position_embeddings (manual mode)


@dataclasses.dataclass(frozen=True)
class WeightTerms:
    """The weights one GPU loads before vLLM measures "Model loading took", term by term (bytes per GPU); they sum to
    the budget's ``weights_bytes_per_gpu`` exactly (the language model's and the drafter's shares of the ceil over
    TP are split so that they do)."""

    language_model_bytes: int  # the checkpoint's (or the config estimate's) language model; a stage's at pp > 1
    drafter_bytes: int  # --speculative-config's drafter (or --draft-memory); 0 without one or inside the checkpoint
    encoder_bytes: int  # the vision tower and projector (or --encoder-memory); 0 without one or inside the checkpoint
    lora_bytes: int  # --enable-lora's adapter buffers (or --lora-memory)
    rotary_cache_bytes: int  # the rotary cos/sin caches (kvtool.estimate.rope), on every rank whole

    @property
    def total_bytes(self) -> int:
        return (
            self.language_model_bytes
            + self.drafter_bytes
            + self.encoder_bytes
            + self.lora_bytes
            + self.rotary_cache_bytes
        )


@dataclasses.dataclass(frozen=True)
class PlannedBudget:
    """The KV budget per GPU and the reserve it was computed with (both None without a GPU or --kv-memory)."""

    budget: Budget | None  # None without --kv-memory or a GPU
    reserve: Reserve | None  # None with --kv-memory or without a GPU
    encoder: EncoderPlan | None = None  # a multimodal checkpoint's vision encoder (kvtool.estimate.multimodal)
    lora: LoraPlan | None = None  # --enable-lora's adapter buffers (kvtool.estimate.lora), within the weights
    # the rotary cos/sin caches per GPU (kvtool.estimate.rope), within the weights: built with the model, in no
    # checkpoint
    rotary_bytes: int = 0
    rotary_method: str = ""
    weights: WeightTerms | None = None  # the weights per GPU term by term (None without a GPU budget)


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """What sets capacity: the whole model (pp 1) or the pipeline stage with the fewest blocks."""

    spec: ModelSpec  # the binding stage's layers (the whole model at pp 1)
    layout: KvLayout
    planned: PlannedBudget
    stages: tuple[Stage, ...]  # empty at pp 1


def plan_budget(
    request: EstimateRequest, model: ResolvedModel, layout: KvLayout, gpu: AskedGpu | None, scheduler: Scheduler
) -> PipelinePlan:
    """Budget every pipeline stage on its own and keep the one with the fewest blocks, as vLLM's shared pool does."""
    spec, weights = model.spec, model.weights
    if request.pp == 1:
        return PipelinePlan(
            spec,
            layout,
            resolve_budget(
                request,
                spec,
                weights,
                gpu,
                scheduler,
                encoder=encoder_plan(request, model, scheduler),
                draft_weights_bytes=model.draft_weights_bytes,
            ),
            (),
        )
    from kvtool.estimate.pipeline import stage_spec, stages

    options: list[tuple[int, Stage, ModelSpec, KvLayout, PlannedBudget]] = []
    for stage in stages(spec, weights.weights_bytes if weights else 0, request.pp, request.tp):
        part = stage_spec(spec, stage.first_layer, stage.num_layers)
        part_layout = kv_layout(part, request.kv_dtype, request.tp)
        planned = resolve_budget(request, part, weights, gpu, scheduler, stage, encoder_plan(request, model, scheduler))
        blocks = -1
        if planned.budget is not None:
            blocks = plan_capacity(
                part,
                part_layout,
                planned.budget.kv_budget_bytes,
                block_size=request.block_size,
                max_model_len=spec.max_position_embeddings or DEFAULT_MANUAL_SEQ_LEN,
                max_num_batched_tokens=scheduler.max_num_batched_tokens,
                max_in_flight=scheduler.max_in_flight_tokens,
                prefix_caching=request.prefix_caching,
                vllm_version=request.vllm_version,
                mamba_cache_mode=request.mamba_cache_mode,
                mamba_block_size=request.mamba_block_size,
            ).num_blocks
        budget_bytes = planned.budget.kv_budget_bytes if planned.budget else None
        stage = dataclasses.replace(stage, kv_budget_bytes=budget_bytes, num_blocks=blocks if blocks >= 0 else None)
        options.append((blocks, stage, part, part_layout, planned))
    _, _, part, part_layout, planned = min(options, key=lambda o: (o[0], -o[1].num_layers))
    return PipelinePlan(part, part_layout, planned, tuple(o[1] for o in options))


def resolve_budget(
    request: EstimateRequest,
    spec: ModelSpec,
    weights: WeightEstimate | None,
    gpu: AskedGpu | None,
    scheduler: Scheduler,
    stage: Stage | None = None,
    encoder: EncoderPlan | None = None,
    draft_weights_bytes: int = 0,
) -> PlannedBudget:
    """The per-GPU KV budget from --kv-memory, or the GPU's memory less weights and the modelled reserve.

    With a pipeline ``stage``, its weights per GPU replace the whole model's, and only the last stage samples.
    ``draft_weights_bytes`` is the drafter's part of ``weights`` (all GPUs), kept apart in the weight terms.
    """
    if request.kv_memory is not None:
        text = str(request.kv_memory)
        size = parse_size(text, option="--kv-memory")
        implausible_size(text, size, "--kv-memory", 1024)
        return PlannedBudget(Budget(size, "--kv-memory"), None)
    if gpu is None:
        return PlannedBudget(None, None)
    if weights is None:
        how = (
            "put the safetensors files (headers suffice) beside config.json, or give --kv-memory"
            if request.config
            else "use --model or --config, or give --kv-memory in manual mode"
        )
        raise UsageError(f"GPU planning needs the weights: {how}", where="--gpu" if request.gpu else "--gpu-memory")
    runner = choose_runner(spec, request.model_runner, request.vllm_version)
    reserve = model_reserve(
        spec,
        tp=request.tp,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
        enforce_eager=request.enforce_eager,
        overrides=_reserve_overrides(request),
        pp=request.pp,
        last_stage=stage is None or stage.index == request.pp - 1,
        vllm_version=request.vllm_version,
        model_runner=runner.runner,
        encoder=encoder,
    )
    reserve = dataclasses.replace(reserve, method=f"{runner.why}; {reserve.method}")
    terms = _weight_terms(request, spec, weights, stage, encoder, draft_weights_bytes)
    lora = lora_plan(request, spec, stage)
    if lora is not None:  # built inside vLLM's model-loading measurement, so counted with the weights
        terms = dataclasses.replace(terms, lora_bytes=lora.bytes_per_gpu)
    rotary, rotary_how = rotary_cache_bytes(
        spec.rotary_caches, spec.model_type, model_dtype_bytes(spec.dtype), request.vllm_version
    )
    terms = dataclasses.replace(terms, rotary_cache_bytes=rotary)  # on every rank whole, inside "Model loading took"
    budget = gpu_budget(
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_memory_utilization=(
            DEFAULT_GPU_MEMORY_UTILIZATION if request.gpu_memory_utilization is None else request.gpu_memory_utilization
        ),
        weights_bytes=terms.total_bytes,
        tp=1,  # the terms are per GPU already
        reserve_bytes=reserve.total_bytes,
        gpu_name=gpu.name,
    )
    return PlannedBudget(budget, reserve, encoder, lora, rotary, rotary_how, terms)


def _weight_terms(
    request: EstimateRequest,
    spec: ModelSpec,
    weights: WeightEstimate,
    stage: Stage | None,
    encoder: EncoderPlan | None,
    draft_weights_bytes: int,
) -> WeightTerms:
    """The language model's, the drafter's and the encoder's weights per GPU (LoRA and rotary caches come after).

    ``weights`` holds the drafter's ``draft_weights_bytes`` (all GPUs); both are split over TP as one ceil, as
    before the split, so the terms add up to ``ceil((language model + drafter) / tp)``.  The encoder loads on the
    first pipeline stage only; --encoder-memory replaces its modelled weights (or adds a tower kvtool does not know).
    """
    tp = request.tp
    if stage is not None:
        language_model, drafter = stage.weights_bytes_per_gpu, 0
    else:
        language_model = -(-(weights.weights_bytes - draft_weights_bytes) // tp)
        drafter = -(-weights.weights_bytes // tp) - language_model
    on_first_stage = stage is None or stage.index == 0
    encoder_bytes = encoder.weights_bytes_per_gpu if encoder is not None and on_first_stage else 0
    given = _size_or_none(request.encoder_memory, "--encoder-memory")
    if given is not None and on_first_stage:
        encoder_bytes = given
    return WeightTerms(language_model, drafter, encoder_bytes, 0, 0)


def lora_plan(request: EstimateRequest, spec: ModelSpec, stage: Stage | None = None) -> LoraPlan | None:
    """--enable-lora's buffers per GPU for ``spec``'s layers (one stage's with pp > 1), or --lora-memory's; None
    without --enable-lora."""
    if not request.enable_lora:
        return None
    from kvtool.estimate.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraOptions, LoraPlan, plan_lora

    options = LoraOptions(
        DEFAULT_MAX_LORAS if request.max_loras is None else request.max_loras,
        DEFAULT_MAX_LORA_RANK if request.max_lora_rank is None else request.max_lora_rank,
    )
    given = _size_or_none(request.lora_memory, "--lora-memory")
    if given is not None:
        return LoraPlan(options.max_loras, options.max_lora_rank, given, 0, "--lora-memory")
    return plan_lora(
        spec,
        options,
        tp=request.tp,
        vllm_version=request.vllm_version,
        first_stage=stage is None or stage.index == 0,
        last_stage=stage is None or stage.index == request.pp - 1,
    )


def encoder_plan(request: EstimateRequest, model: ResolvedModel, scheduler: Scheduler) -> EncoderPlan | None:
    """The vision encoder's weights (when the config estimate left them out) and profiling terms, or None."""
    check_encoder_memory(request, model)
    if model.encoder is None:
        return None
    from kvtool.estimate.multimodal import check_tp_mode, parse_limit_mm_per_prompt, plan_encoder

    plan = plan_encoder(
        model.encoder,
        dtype_bytes=model_dtype_bytes(model.spec.dtype),
        tp=request.tp,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
        max_model_len=max(request.seq_lens) if request.seq_lens else model.spec.max_position_embeddings or 2048,
        limit_mm_per_prompt=parse_limit_mm_per_prompt(request.limit_mm_per_prompt),
        tp_mode=check_tp_mode(request.mm_encoder_tp_mode, request.vllm_version),
        vllm_version=request.vllm_version,
    )
    if model.encoder_in_weights:  # the safetensors headers hold it already
        plan = dataclasses.replace(plan, weights_bytes_per_gpu=0)
    if request.encoder_memory is not None:
        plan = dataclasses.replace(plan, method=f"{plan.method}; weights: --encoder-memory {request.encoder_memory}")
    return plan


def check_encoder_memory(request: EstimateRequest, model: ResolvedModel) -> None:
    """--encoder-memory replaces the vision encoder's weights that kvtool adds beside the language model: refused
    where there are none to replace (no vision tower, or safetensors headers that count every tensor already)."""
    if request.encoder_memory is None:
        return
    _size_or_none(request.encoder_memory, "--encoder-memory")
    if (model.encoder is not None and not model.encoder_in_weights) or encoder_not_counted(model.weights):
        return
    if model.encoder is not None or (model.weights is not None and "safetensors" in model.weights.method):
        why = "the safetensors headers beside the config count every tensor, the encoder's included"
        tip = "leave --encoder-memory out (the headers are exact)"
    else:
        why = "the model has no vision encoder kvtool adds beside the language model"
        tip = "--encoder-memory is for a multimodal config.json (a vision_config)"
    raise UsageError(f"--encoder-memory: {why}", where="--encoder-memory", tip=tip)


def _reserve_overrides(request: EstimateRequest) -> ReserveOverrides:
    return ReserveOverrides(
        total_bytes=_size_or_none(request.reserve, "--reserve"),
        activation_bytes=_size_or_none(request.activation_memory, "--activation-memory"),
        non_torch_bytes=_size_or_none(request.non_torch_memory, "--non-torch-memory"),
        cudagraph_bytes=_size_or_none(request.cudagraph_memory, "--cudagraph-memory"),
    )


def _size_or_none(text: str | None, option: str) -> int | None:
    return None if text is None else parse_override_size(text, option=option)
