"""SGLang's KV pool: how many tokens ``python -m sglang.launch_server`` gives the model on a GPU, and what it logs.

The rule (srt/model_executor/model_runner.py ``ModelRunner.profile_max_num_token`` and ``init_memory_pool``;
model_runner_kv_cache_mixin.py 0.5.7-0.5.15, with pool_configurator.py ``DefaultPoolConfigurator`` from 0.5.11 and
srt/mem_cache/kv_cache_configurator.py ``KVCacheConfigurator._profile_available_bytes`` from 0.5.16: the same rule
in every release 0.4.0-0.5.23 for the layer kinds kvtool sizes, ``int(rest * 2**30) // cell_size`` from 0.5.7 giving
the same count; the figures are GiB, free bytes / 2**30, which SGLang prints as "GB")::

    total_gpu_memory = free memory before the weights (init_torch_distributed: min over the TP ranks)
    available        = free memory after the weights (get_available_gpu_memory, min over the ranks)
    rest_memory      = available - total_gpu_memory * (1 - mem_fraction_static)
    cell_size        = kv_heads_per_gpu * head_dim * layers * 2 * itemsize   (MHA/GQA/MQA; 0.5.7+: head_dim + v_head_dim,
                       the same for the models kvtool reads)
                     = (kv_lora_rank + qk_rope_head_dim) * layers * itemsize (MLA)
    max_total_num_tokens = int(rest_memory * 2**30 // cell_size), capped by --max-total-tokens, rounded down to
                     whole pages (0.4.4+)

So the static fraction holds the weights and the pool; the rest of the GPU (1 - mem_fraction_static of what was free)
is left for activations and CUDA graphs.  The pool is counted in tokens (page size 1 by default), each with a slot
for every layer.  mem_fraction_static's default, chunked_prefill_size and the other release-dependent rules are in
kvtool.estimate.sglang.rules.

Core code: returns a frozen :class:`SglangEstimate` and raises :class:`UsageError`; never prints.
"""

from __future__ import annotations

import dataclasses
import math

from kvtool.core.errors import UsageError
from kvtool.core.units import GIB, parse_size
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import FULL
from kvtool.estimate.sglang.rules import (
    ALLOCATED_LINE_RULES,
    KV_DTYPE_RULES,
    MEM_FRACTION_RULES,
    NO_MEMORY_RULES,
    PAGE_SIZE_SINCE,
    WINDOW_POOL_RULES,
    PrefillGraphInputs,
    default_mem_fraction_static,
    gpu_defaults,
    running_requests,
    vlm_fraction,
)
from kvtool.estimate.sglang.versions import NEWEST_RELEASE, pick, resolve_sglang_version, version_key

# Free memory before the weights, below the driver's total (the GPU profiles' memory): the CUDA context, 0.41 GiB
# (H100-80GB profile 79.22 GiB; SGLang on an H100 at TP 1 logs "Load weight begin. avail mem=78.81 GB",
# tests/data/sglang-logs/llama-3.1-8b-h100-v0.4.1), and at TP > 1 NCCL's buffers, "Init torch distributed ends. mem
# usage=0.13 GB" (tests/data/sglang-logs/qwq-32b-l4-tp4-v0.4.3).
CUDA_CONTEXT_BYTES = int(0.41 * GIB)
TP_DISTRIBUTED_BYTES = int(0.13 * GIB)
# What loading takes beyond the parameters: SGLang's own "Load weight end. ... mem usage" (a free-memory difference,
# so it holds the rotary caches, the CUDA kernels loaded on first use and the allocator's rounding too) exceeds
# kvtool's weights per GPU by 0.06-0.28 GiB, 0.136 GiB at the median over the 10 cases of tests/data/sglang-logs that
# log it and whose weights kvtool sizes (README there; measured, not derived from the source)
LOAD_OVERHEAD_BYTES = int(0.14 * GIB)
# max_prefill_tokens' default (srt/server_args.py ServerArgs, 0.4.0-0.5.6): logged beside max_total_num_tokens
MAX_PREFILL_TOKENS = 16384

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
_KV_DTYPE_OF = {"fp8_e4m3": ("float8_e4m3fn", 1), "fp8_e5m2": ("float8_e5m2", 1), "bf16": ("bfloat16", 2)}
_KV_DTYPE_OF["bfloat16"] = _KV_DTYPE_OF["bf16"]


@dataclasses.dataclass(frozen=True)
class SglangRequest:
    """What ``kvtool estimate --engine sglang`` was asked, in SGLang's terms (sizes still as typed)."""

    model: str | None = None
    config: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    heads: int | None = None
    hidden: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None
    tp: int = 1  # --tp-size
    pp: int = 1  # --pp-size (only 1 is modelled)
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    mem_fraction_static: float | None = None  # None: SGLang's default for the GPU, TP and release
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None  # None: SGLang's default for the GPU
    context_length: int | None = None  # None: the model's (max_position_embeddings)
    sglang_version: str = NEWEST_RELEASE
    profile_dirs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoggedMemory:
    """SGLang's own memory figures, in GiB as its log prints them (two decimals), instead of kvtool's model of them:
    ``Load weight begin. avail mem=X GB`` (free before the weights) and ``Load weight end. ... avail mem=Y GB``."""

    free_before_weights_gib: float
    free_after_weights_gib: float


@dataclasses.dataclass(frozen=True)
class PoolShape:
    """One token's slot in SGLang's KV pool on one GPU."""

    attention: str  # MHA, GQA, MQA or MLA
    num_layers: int
    kv_heads_per_gpu: int  # 1 for MLA (one latent per token)
    elements_per_head: int  # head_dim; MLA: kv_lora_rank + qk_rope_head_dim
    kv_dtype: str  # torch's name of the pool's dtype
    itemsize_bytes: int
    tensors: int  # 2 (K and V) or 1 (MLA's latent)

    @property
    def cell_bytes(self) -> int:
        """profile_max_num_token's cell_size: bytes of one token over all layers."""
        return self.kv_heads_per_gpu * self.elements_per_head * self.num_layers * self.tensors * self.itemsize_bytes

    def buffer_gib(self, tokens: int, page_size: int) -> float:
        """One of the K/V (or MLA's KV) buffers as get_kv_size_bytes counts it: size + page_size slots (slot 0 pads)."""
        per_tensor = self.cell_bytes // self.tensors
        return (tokens + page_size) * per_tensor / GIB


@dataclasses.dataclass(frozen=True)
class SglangEstimate:
    """SGLang's KV pool for a model on a GPU (one TP rank), and the lines it would log."""

    engine: str  # "sglang"
    model: str
    source: str
    sglang_version: str
    gpu: str | None
    gpu_memory_mib: int | None  # SGLang's gpu_mem (nvidia-smi total), which its defaults are keyed by
    tp: int
    attention: str
    num_layers: int
    kv_heads_per_gpu: int
    elements_per_head: int
    kv_dtype: str
    cell_bytes_per_token: int  # all layers of one token, one GPU
    mem_fraction_static: float
    mem_fraction_static_rule: str  # how it was chosen, in words
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None  # the default that mem_fraction_static's 0.5.3+ rule counts (None before 0.5.3)
    context_len: int
    page_size: int
    figures_from: str  # "log" (LoggedMemory given) or "model" (GPU profile and weights)
    total_gpu_memory_gib: float | None  # free before the weights (SGLang's total_gpu_memory)
    weights_bytes_per_gpu: int | None  # the model's weights on one GPU (kvtool's estimate; None with logged figures)
    available_gpu_memory_gib: float | None  # free after the weights
    headroom_gib: float | None  # total_gpu_memory * (1 - mem_fraction_static): left for activations and graphs
    rest_memory_gib: float | None  # the pool's memory
    max_total_num_tokens: int | None
    kv_pool_bytes: int | None  # the pool's buffers, K and V together
    max_num_reqs: int | None  # ReqToTokenPool's requests (init_memory_pool's default from the pool and context_len)
    max_running_requests: int | None  # as the scheduler logs it
    log_lines: tuple[str, ...]  # what SGLang logs for this pool
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        from kvtool.core.jsonable import to_jsonable

        return to_jsonable(self)


def sglang_request_from(values: dict) -> SglangRequest:
    """The :class:`SglangRequest` of ``kvtool estimate``'s options by name (``kv_dtype`` is --kv-cache-dtype,
    ``seq_len`` --context-length, ``profiles`` the profile folders); other names are ignored."""
    renamed = {"kv_dtype": "kv_cache_dtype", "seq_len": "context_length", "profiles": "profile_dirs"}
    fields = {f.name for f in dataclasses.fields(SglangRequest)}
    given = {renamed.get(name, name): value for name, value in values.items()}
    given["profile_dirs"] = tuple(given.get("profile_dirs") or ())
    return SglangRequest(**{name: value for name, value in given.items() if name in fields and value is not None})


def pool_shape(spec: ModelSpec, kv_cache_dtype: str, tp: int, version: str) -> PoolShape:
    """The pool's slot of ``spec`` at ``tp``; a layer kind SGLang sizes otherwise (sliding window from 0.4.9.post3,
    hybrid state) is refused."""
    _refuse_unmodelled_layers(spec, version)
    dtype_rule = pick(KV_DTYPE_RULES, version)
    choices = dtype_rule.choices
    if kv_cache_dtype in dtype_rule.unmodelled:
        raise UsageError(
            f"SGLang {version}'s --kv-cache-dtype {kv_cache_dtype} keeps scale buffers beside the cache, which kvtool "
            "does not model",
            where="--kv-cache-dtype",
            tip=f"kvtool sizes SGLang's {', '.join(choices)}",
        )
    if kv_cache_dtype not in choices:
        raise UsageError(
            f"--kv-cache-dtype {kv_cache_dtype} is not one SGLang {version} takes ({', '.join(choices)})",
            where="--kv-cache-dtype",
            tip="SGLang's fp8 KV caches are fp8_e4m3 and fp8_e5m2" if "fp8" in kv_cache_dtype else None,
        )
    if kv_cache_dtype == "auto":
        if spec.dtype not in _ITEMSIZE:
            raise UsageError(f"the model's dtype {spec.dtype} is not one kvtool sizes for SGLang", where="--dtype")
        kv_dtype, itemsize = spec.dtype, _ITEMSIZE[spec.dtype]
    else:
        kv_dtype, itemsize = _KV_DTYPE_OF[kv_cache_dtype]
    if spec.is_mla:
        if spec.kv_lora_rank is None or spec.qk_rope_head_dim is None:
            raise UsageError(f"{spec.name}: an MLA config without kv_lora_rank and qk_rope_head_dim", where=spec.source)
        return PoolShape("MLA", spec.num_layers, 1, spec.kv_lora_rank + spec.qk_rope_head_dim, kv_dtype, itemsize, 1)
    heads = max(1, spec.num_kv_heads // tp)  # srt/configs/model_config.py ModelConfig.get_num_kv_heads
    if spec.num_kv_heads == spec.num_attention_heads:
        attention = "MHA"
    else:
        attention = "MQA" if spec.num_kv_heads == 1 else "GQA"
    return PoolShape(attention, spec.num_layers, heads, spec.head_dim, kv_dtype, itemsize, 2)


def windowed_layers_get_full_slots(spec: ModelSpec, version: str) -> bool:
    """Whether ``spec`` has sliding-window or chunked layers that ``version`` sizes as full ones (WINDOW_POOL_RULES)."""
    return bool(set(spec.kv_layer_kinds) - {FULL}) and pick(WINDOW_POOL_RULES, version).uniform


def _refuse_unmodelled_layers(spec: ModelSpec, version: str) -> None:
    kinds = set(spec.kv_layer_kinds)
    if spec.state_layers or spec.mamba_state is not None:
        what = "hybrid linear-attention / Mamba state layers"
    elif spec.full_attention_kv is not None or spec.kv_shared_layers:
        what = "layers of two KV shapes or shared KV layers"
    elif kinds - {FULL} and not pick(WINDOW_POOL_RULES, version).uniform:
        what = "sliding-window or chunked-attention layers"
    else:
        return
    raise UsageError(
        f"{spec.name} has {what}: SGLang {version} sizes those pools apart (SWAKVPool, HybridLinearKVPool), which "
        "kvtool does not model yet",
        where=spec.source,
        tip="use --engine vllm for this model",
    )


def pool_tokens(rest_memory_gib: float, cell_bytes: int) -> int:
    """profile_max_num_token's last step: ``int(rest_memory * (1 << 30) // cell_size)``, in floats as SGLang does."""
    return int(rest_memory_gib * (1 << 30) // cell_bytes)


def estimate_sglang(request: SglangRequest, logged: LoggedMemory | None = None) -> SglangEstimate:
    """SGLang's pool for ``request``: from ``logged`` figures when given, else from the GPU profile and the weights."""
    version = resolve_sglang_version(request.sglang_version)
    request = dataclasses.replace(request, sglang_version=version)
    _check_request(request)
    model = _resolve(request)
    spec = model.spec
    shape = pool_shape(spec, request.kv_cache_dtype, request.tp, version)
    gpu_name, gpu_bytes, gpu_mem_mib = _gpu(request)
    tiers = gpu_defaults(gpu_mem_mib, request.tp, version, request.max_running_requests)
    chunked = request.chunked_prefill_size if request.chunked_prefill_size is not None else tiers.chunked_prefill_size
    if request.mem_fraction_static is not None:
        fraction, how = request.mem_fraction_static, "--mem-fraction-static"
    else:
        prefill = PrefillGraphInputs(
            mla=spec.is_mla,
            architectures=spec.architectures,
            model_path=request.model or spec.name,
            context_length=request.context_length,
            max_total_tokens=request.max_total_tokens,
        )
        fraction, how = default_mem_fraction_static(
            gpu_mem_mib, request.tp, request.pp, chunked, tiers.cuda_graph_max_bs, version, prefill
        )
    vit = (model.encoder.num_layers, model.encoder.hidden_size) if model.encoder and model.encoder.num_layers else None
    fraction, cut = vlm_fraction(fraction, request.mem_fraction_static is not None, spec.architectures, vit, version)
    if cut is not None:
        how = f"{how}; {cut}"
    context_len = request.context_length or spec.max_position_embeddings
    if context_len is None:
        raise UsageError(f"{spec.name} has no max_position_embeddings: give --context-length", where="--context-length")
    notes = [f"mem_fraction_static {how}"]
    if windowed_layers_get_full_slots(spec, version):
        notes.append(
            f"sliding-window / chunked layers get a full slot, as every layer does in SGLang {version} "
            f"({pick(WINDOW_POOL_RULES, version).source})"
        )
    if version_key(version) >= version_key("0.5.3") and request.mem_fraction_static is None:
        notes.append(f"cuda_graph_max_bs {tiers.cuda_graph_max_bs} (the GPU's default) counted in mem_fraction_static")
    weights_per_gpu: int | None = None
    total: float | None = None
    available: float | None = None
    figures = "none"
    if logged is not None:
        total, available, figures = logged.free_before_weights_gib, logged.free_after_weights_gib, "log"
    elif gpu_bytes is not None:
        if model.weights is None:
            raise UsageError(
                f"{spec.name}: kvtool cannot size its weights, which SGLang's pool depends on",
                where="--model",
                tip="give a config.json kvtool reads, or a model folder with *.safetensors",
            )
        weights_per_gpu = -(-model.weights.weights_bytes // request.tp)
        if model.encoder is not None and not model.encoder_in_weights:  # a vision tower the config estimate left out
            tower = model.encoder
            itemsize = _ITEMSIZE.get(spec.dtype, 2)
            weights_per_gpu += (tower.split_params // request.tp + tower.replicated_params) * itemsize
            notes.append(
                f"vision tower {tower.num_params / 1e9:.2f} B parameters ({tower.tower}), its linears split over TP"
            )
        free = gpu_bytes - CUDA_CONTEXT_BYTES - (TP_DISTRIBUTED_BYTES if request.tp > 1 else 0)
        loaded = weights_per_gpu + LOAD_OVERHEAD_BYTES
        total, available, figures = free / GIB, (free - loaded) / GIB, "model"
        notes.append(
            f"free before weights: the GPU's {gpu_bytes / GIB:.2f} GiB less the CUDA context "
            f"{CUDA_CONTEXT_BYTES / GIB:.2f} GiB"
            + (f" and NCCL {TP_DISTRIBUTED_BYTES / GIB:.2f} GiB" if request.tp > 1 else "")
        )
        notes.append(
            f"weights per GPU {weights_per_gpu / GIB:.2f} GiB ({model.weights.method}) and {LOAD_OVERHEAD_BYTES / GIB:.2f}"
            " GiB more that loading takes (SGLang's logged mem usage over the weights, the median of real logs)"
        )
    settings = _Settings(fraction, how, chunked, tiers.cuda_graph_max_bs, context_len, gpu_name, gpu_mem_mib)
    return _pool(request, spec, shape, settings, _Memory(figures, total, available, weights_per_gpu), notes)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The server arguments the pool is sized under, and the GPU they were chosen for."""

    fraction: float
    how: str
    chunked: int
    graph_bs: int | None
    context_len: int
    gpu_name: str | None
    gpu_mem_mib: int | None


@dataclasses.dataclass(frozen=True)
class _Memory:
    """profile_max_num_token's inputs in GiB (None without a GPU) and where they came from."""

    figures: str
    total: float | None
    available: float | None
    weights_per_gpu: int | None


def _pool(
    request: SglangRequest, spec: ModelSpec, shape: PoolShape, settings: _Settings, memory: _Memory, notes: list[str]
) -> SglangEstimate:
    """init_memory_pool: the pool's tokens from the memory figures, the request slots, the log lines."""
    fraction, chunked, context_len = settings.fraction, settings.chunked, settings.context_len
    total, available = memory.total, memory.available
    version = request.sglang_version
    tokens = headroom = rest = pool_bytes = max_num_reqs = running = None
    lines: list[str] = []
    warnings: list[str] = []
    if total is not None and available is not None:
        headroom = total * (1 - fraction)
        rest = available - headroom
        tokens = pool_tokens(rest, shape.cell_bytes)
        if request.max_total_tokens is not None and request.max_total_tokens < tokens:
            tokens = request.max_total_tokens
            notes.append(f"capped by --max-total-tokens {request.max_total_tokens:,}")
        tokens = tokens // request.page_size * request.page_size
        if tokens <= 0:
            raise _no_memory(rest, headroom, fraction, total, available, version)
        pool_bytes = int(shape.buffer_gib(tokens, request.page_size) * GIB) * shape.tensors
        max_num_reqs, running = running_requests(tokens, context_len, request.max_running_requests, version)
        lines.append(_allocated_line(shape, tokens, request.page_size, version))
        lines.append(
            f"max_total_num_tokens={tokens}, chunked_prefill_size={chunked}, max_prefill_tokens={MAX_PREFILL_TOKENS}, "
            f"max_running_requests={running}, context_len={context_len}"
        )
        if tokens < context_len:
            warnings.append(
                f"the pool holds {tokens:,} tokens, fewer than one request of context_len {context_len:,}: SGLang "
                "rejects longer prompts"
            )
    return SglangEstimate(
        engine="sglang",
        model=spec.name,
        source=spec.source,
        sglang_version=version,
        gpu=settings.gpu_name,
        gpu_memory_mib=settings.gpu_mem_mib,
        tp=request.tp,
        attention=shape.attention,
        num_layers=shape.num_layers,
        kv_heads_per_gpu=shape.kv_heads_per_gpu,
        elements_per_head=shape.elements_per_head,
        kv_dtype=shape.kv_dtype,
        cell_bytes_per_token=shape.cell_bytes,
        mem_fraction_static=fraction,
        mem_fraction_static_rule=settings.how,
        chunked_prefill_size=chunked,
        cuda_graph_max_bs=settings.graph_bs,
        context_len=context_len,
        page_size=request.page_size,
        figures_from=memory.figures,
        total_gpu_memory_gib=total,
        weights_bytes_per_gpu=memory.weights_per_gpu,
        available_gpu_memory_gib=available,
        headroom_gib=headroom,
        rest_memory_gib=rest,
        max_total_num_tokens=tokens,
        kv_pool_bytes=pool_bytes,
        max_num_reqs=max_num_reqs,
        max_running_requests=running,
        log_lines=tuple(lines),
        notes=tuple(notes),
        warnings=tuple(warnings),
    )


def _no_memory(
    rest: float, headroom: float, fraction: float, total: float, available: float, version: str
) -> UsageError:
    """SGLang's stop when the weights leave the pool nothing, in the release's words (NO_MEMORY_RULES)."""
    rule = pick(NO_MEMORY_RULES, version)
    if rest > 0:  # room for less than one token: the older message in every release
        rule = NO_MEMORY_RULES[0]
    minimum = math.ceil((1 - available / total) * 1000) / 1000 if total > 0 else 1.0
    said = rule.message.format(fraction=fraction, minimum=minimum)
    return UsageError(
        f"SGLang {version} would stop: '{said}' (rest memory {rest:.2f} GiB after {headroom:.2f} GiB of headroom)",
        where="--mem-fraction-static",
        tip=f"raise --mem-fraction-static above {max(fraction, minimum):.3f}, or use more GPUs (--tp-size)",
    )


def _allocated_line(shape: PoolShape, tokens: int, page_size: int, version: str) -> str:
    """srt/mem_cache/memory_pool.py's line: '#tokens' from 0.4.4 on, 'dtype: torch.X' from 0.5.13, 'KV size' for
    MLA's one buffer."""
    size = shape.buffer_gib(tokens, page_size)
    rule = pick(ALLOCATED_LINE_RULES, version)
    head = "KV Cache is allocated. " + (f"dtype: torch.{shape.kv_dtype}, " if rule.dtype else "")
    head += f"#tokens: {tokens}, " if rule.tokens else ""
    if shape.tensors == 1:
        return f"{head}KV size: {size:.2f} GB"
    return f"{head}K size: {size:.2f} GB, V size: {size:.2f} GB"


def _check_request(request: SglangRequest) -> None:
    version = request.sglang_version
    for name, value in (("--tp-size", request.tp), ("--page-size", request.page_size)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, not {value}", where=name)
    if request.pp != 1:
        raise UsageError(
            "--pp-size above 1: kvtool does not model SGLang's pipeline split yet",
            where="--pp-size",
            tip="use --engine vllm",
        )
    if request.page_size > 1 and version_key(version) < version_key(PAGE_SIZE_SINCE):
        raise UsageError(f"--page-size is new in SGLang {PAGE_SIZE_SINCE}, not in {version}", where="--page-size")
    fraction = request.mem_fraction_static
    if fraction is not None and not 0 < fraction < 1:
        raise UsageError(
            f"--mem-fraction-static must be between 0 and 1, not {fraction}", where="--mem-fraction-static"
        )
    for name, count in (
        ("--max-running-requests", request.max_running_requests),
        ("--max-total-tokens", request.max_total_tokens),
        ("--context-length", request.context_length),
    ):
        if count is not None and count < 1:
            raise UsageError(f"{name} must be at least 1, not {count}", where=name)
    if request.chunked_prefill_size is not None and request.chunked_prefill_size % request.page_size:
        raise UsageError(
            f"--chunked-prefill-size {request.chunked_prefill_size} is not a multiple of --page-size "
            f"{request.page_size} (SGLang asserts it)",
            where="--chunked-prefill-size",
        )


def _resolve(request: SglangRequest):  # noqa: ANN202 - kvtool.estimate.model.ResolvedModel
    """The model through kvtool's one resolution path (profiles, config.json, HF cache, manual options)."""
    from kvtool.estimate.model import resolve_model
    from kvtool.estimate.request import EstimateRequest, check_request

    asked = EstimateRequest(
        model=request.model,
        config=request.config,
        layers=request.layers,
        kv_heads=request.kv_heads,
        head_dim=request.head_dim,
        heads=request.heads,
        hidden=request.hidden,
        dtype=request.dtype,
        quantization=request.quantization,
        tp=request.tp,
        profile_dirs=request.profile_dirs,
    )
    return resolve_model(check_request(asked))


def _gpu(request: SglangRequest) -> tuple[str | None, int | None, int | None]:
    """The GPU's name, its memory as the driver reports it (bytes) and SGLang's gpu_mem (nvidia-smi MiB)."""
    if request.gpu and request.gpu_memory:
        raise UsageError("give --gpu or --gpu-memory, not both", where="--gpu")
    if request.gpu:
        from kvtool.estimate.profiles import find_gpu

        profile = find_gpu(request.gpu, request.profile_dirs)
        mib = profile.nvidia_smi_mib or profile.memory_bytes // 2**20
        return profile.name, profile.memory_bytes, mib
    if request.gpu_memory:
        size = parse_size(str(request.gpu_memory), option="--gpu-memory")
        return None, size, size // 2**20
    return None, None, None


__all__ = [
    "MEM_FRACTION_RULES",
    "LoggedMemory",
    "PoolShape",
    "SglangEstimate",
    "SglangRequest",
    "estimate_sglang",
    "pool_shape",
    "pool_tokens",
    "running_requests",
]
