"""The model of a request: a built-in or user profile, a Hugging Face id in the local cache, a config.json (or a
folder holding one), or the manual options; its dtype and quantization as vLLM runs it, and its weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import (
    ModelSpec,
    kv_heads_not_dividing,
    load_config_path,
    manual_spec,
    parse_config,
)
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.weights import WeightEstimate, estimate_weights

if TYPE_CHECKING:  # kvtool.estimate.multimodal is imported for a config with a vision_config only
    from kvtool.estimate.multimodal import VisionEncoder


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """The model as vLLM would run it, and its weights (None in manual mode, or when the config cannot size them)."""

    spec: ModelSpec
    weights: WeightEstimate | None
    # a config.json's vision tower (kvtool.estimate.multimodal), and whether ``weights`` already hold it (safetensors
    # headers count the whole checkpoint; the config estimate counts the language model only)
    encoder: VisionEncoder | None = None
    encoder_in_weights: bool = False
    # --speculative-config's drafter's weights within ``weights`` (all GPUs; kvtool.estimate.estimator.with_drafter)
    draft_weights_bytes: int = 0


def encoder_not_counted(weights: WeightEstimate | None) -> bool:
    """Whether ``weights`` are a config estimate of the language model only, a vision or audio tower of the config
    left out (kvtool does not know its architecture)."""
    return weights is not None and "encoder is not counted" in weights.method


def resolve_model(request: EstimateRequest) -> ResolvedModel:
    """The model of --model, --config or the manual options, checked against the request's --tp and --pp."""
    spec, weights, encoder = _model_and_weights(request)
    check_tp(spec, request.tp, request.pp)
    in_weights = encoder is not None and weights is not None and not weights.method.startswith("config estimate")
    return ResolvedModel(spec, weights, encoder, in_weights)


def _model_and_weights(request: EstimateRequest) -> tuple[ModelSpec, WeightEstimate | None, VisionEncoder | None]:
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
        return _model_from_options(request), None, None
    encoder = None
    if request.config or (request.model and "/" in request.model):
        encoder = _encoder_of(request, spec)
    return (*_with_quantization(spec, weights, request.quantization), encoder)


def _knows_vision_tower(data: dict, spec: ModelSpec) -> bool:
    from kvtool.estimate.multimodal import vision_encoder

    return vision_encoder(data, spec.hidden_size) is not None


def _encoder_of(request: EstimateRequest, spec: ModelSpec) -> VisionEncoder | None:
    """The vision tower of the config.json behind --config (or a cached --model), when kvtool knows it."""
    from kvtool.estimate.hf_cache import find_snapshot

    path = request.config or (
        str(find_snapshot(request.model)) if request.model and find_snapshot(request.model) else None
    )
    if path is None:
        return None
    try:
        data, _ = load_config_path(Path(path).expanduser())
    except UsageError:
        return None
    if not isinstance(data.get("vision_config"), dict):
        return None
    from kvtool.estimate.multimodal import vision_encoder

    return vision_encoder(data, spec.hidden_size)


def _model_from_name(request: EstimateRequest, name: str) -> tuple[ModelSpec, WeightEstimate | None]:
    """A built-in or user profile, a Hugging Face repository id found in the local cache (offline), or a local
    model folder holding config.json (vllm serve's --model takes one too)."""
    from kvtool.estimate.profiles import find_model, find_model_by_repo, model_spec

    if "/" in name:
        from kvtool.estimate.hf_cache import find_snapshot

        snapshot = find_snapshot(name)
        if snapshot is not None:  # named by its repository, not by the snapshot's commit hash
            return _model_from_config(request, str(snapshot), name=name.strip().strip("/"))
        profile = find_model_by_repo(name, request.profile_dirs)
        if profile is None:
            if _is_local_folder(name):
                return _model_from_config(request, name)
            from kvtool.estimate.hf_cache import cache_dir

            raise UsageError(
                f"{name} is neither in the local Hugging Face cache ({cache_dir()}) nor a built-in profile; kvtool "
                "reads only local files",
                where="--model",
                tip=f"fetch its config first (hf download {name} config.json), or pass --config DIR",
            )
    else:
        try:
            profile = find_model(name, request.profile_dirs)
        except UsageError:
            if _is_local_folder(name):
                return _model_from_config(request, name)
            raise
    spec = model_spec(profile)
    spec = dataclasses.replace(spec, source=f"{profile.file} (values from {profile.hf_repo} config.json)")
    spec = _with_dtype(spec, request.dtype)
    return spec, estimate_weights(spec, request.vllm_version, request.tp)


def _is_local_folder(name: str) -> bool:
    """A --model that names no profile or cached repository but a local folder: read as vllm serve reads it (its
    config.json).  A file is refused: --config takes a config.json."""
    path = Path(name).expanduser()
    if path.is_dir():
        return True
    if path.exists():
        raise UsageError(
            f"{name} is a file; --model takes a profile name, a Hugging Face id or a model folder",
            where="--model",
            tip=f"pass it as --config {name}",
        )
    return False


def model_name(data: dict, path: str | Path) -> str:
    """What to call the model of a config.json: its ``_name_or_path`` when the config has one (a Hugging Face id as
    is, a local path by its last part), else the folder's name (the folder given, or the one holding the file)."""
    named = data.get("_name_or_path")
    if isinstance(named, str) and named.strip().strip("/"):
        named = named.strip()
        looks_like_id = named.count("/") == 1 and not named.startswith((".", "/", "~"))
        return named if looks_like_id else Path(named.rstrip("/")).name
    p = Path(path).expanduser().resolve()
    return p.name if p.is_dir() else p.parent.name


def _model_from_config(
    request: EstimateRequest, path: str, name: str | None = None
) -> tuple[ModelSpec, WeightEstimate | None]:
    """A config.json (or a directory holding one), with exact weights from safetensors headers beside it; ``name``
    (a cached repository's id) else :func:`model_name` names it."""
    data, file = load_config_path(Path(path).expanduser())
    parsed = parse_config(data, where=str(file), name=name or model_name(data, file.parent))
    spec = _with_dtype(parsed, request.dtype)
    weights = None
    if file.parent.is_dir() and request.quantization is None:
        from kvtool.estimate.safetensors import weights_from_dir

        found = weights_from_dir(file.parent)
        if found is not None:
            weights = WeightEstimate(found.num_params, found.weights_bytes, found.method)
            quant = spec.weight_quant
            if quant is not None and quant.mxfp4_experts:
                weights = None  # vLLM pads the experts on the GPU (kvtool.estimate.quant): the config estimate does
            elif quant is None and found.num_params and spec.dtype != parsed.dtype:
                # vLLM loads an unquantized checkpoint in the run dtype, whatever the files store
                from kvtool.estimate.dtypes import model_dtype_bytes

                weights = WeightEstimate(
                    found.num_params,
                    found.num_params * model_dtype_bytes(spec.dtype),
                    f"{found.method} (parameters) at {spec.dtype}",
                )
    if weights is None:
        weights = estimate_weights(spec, request.vllm_version, request.tp)
        towers = [key for key in ("vision_config", "audio_config") if isinstance(data.get(key), dict)]
        if towers and "vision_config" in towers and _knows_vision_tower(data, spec):
            towers.remove("vision_config")  # counted by kvtool.estimate.multimodal, beside the language model
        if weights is not None and towers:
            # vLLM loads the encoder too ("Model loading took" counts it); the config estimate sizes the language
            # model only, so it says so rather than passing the figure off as the whole checkpoint
            weights = dataclasses.replace(
                weights,
                method=f"{weights.method} of the language model only: the {' and '.join(towers)} encoder is not "
                "counted (a folder with the safetensors files is exact)",
            )
    return spec, weights


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
    return spec, estimate_weights(spec)  # online methods are not mxfp4: no version rule


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
                mamba_state=_state_in(spec, "bfloat16"),
                notes=(
                    *spec.notes,
                    "float32 checkpoint runs in bfloat16, as vLLM's --dtype auto downcasts it; --dtype float32 keeps it",
                ),
            )
        return spec
    from kvtool.estimate.dtypes import MODEL_DTYPE_BYTES

    if dtype not in MODEL_DTYPE_BYTES:
        raise UsageError(f"unknown --dtype {dtype!r}", where="--dtype", tip="use float16, bfloat16 or float32")
    return dataclasses.replace(
        spec,
        dtype=dtype,
        mamba_state=_state_in(spec, dtype),
        notes=(*spec.notes, f"model dtype set to {dtype} by --dtype"),
    )


def _state_in(spec: ModelSpec, dtype: str):
    """A hybrid's state in the model dtype vLLM runs: mamba_cache_dtype 'auto' is the model dtype
    (vllm/model_executor/models/config.py / MambaStateDtypeCalculator), for the conv state and, unless the config
    pins it (mamba_ssm_dtype float32, Nemotron-H's float32 default), the temporal state."""
    from kvtool.estimate.dtypes import MODEL_DTYPE_BYTES

    state = spec.mamba_state
    if state is None:
        return None
    size = MODEL_DTYPE_BYTES[dtype]
    return dataclasses.replace(
        state, conv_bytes=size, ssm_bytes=size if state.ssm_follows_model_dtype else state.ssm_bytes
    )


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
