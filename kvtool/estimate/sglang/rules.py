"""SGLang's defaults that change between releases, one table per rule, each row read from that release's
python/sglang/srt/server_args.py (``ServerArgs.__post_init__``, from 0.5.3 ``_handle_gpu_memory_settings``).

``gpu_mem`` is SGLang's ``get_device_memory_capacity``: nvidia-smi's ``memory.total`` in MiB on NVIDIA GPUs
(srt/utils.py ``get_nvgpu_memory_capacity``), the minimum over the visible GPUs.
"""

from __future__ import annotations

import dataclasses

from kvtool.estimate.sglang.versions import pick

MIB = 1024


@dataclasses.dataclass(frozen=True)
class MemFractionRule:
    """How ``mem_fraction_static`` defaults (``--mem-fraction-static`` unset)."""

    since: str
    kind: str  # "tp": by TP size alone; "tp_or_big_gpu": by TP up to 80 GiB; "reserved": (gpu_mem - reserved) / gpu_mem
    source: str


MEM_FRACTION_RULES: tuple[MemFractionRule, ...] = (
    # 0.4.0-0.4.5: tp >= 16: 0.79, >= 8: 0.81, >= 4: 0.85, >= 2: 0.87, else 0.88 (read in 0.4.0, 0.4.1.post7,
    # 0.4.3.post2, 0.4.4, 0.4.5)
    MemFractionRule("0.4.0", "tp", "srt/server_args.py ServerArgs.__post_init__ (0.4.0-0.4.5)"),
    # 0.4.6, 0.4.6.post1: by TP at gpu_mem <= 81920 MiB, else (gpu_mem - 13 GiB) / gpu_mem
    MemFractionRule("0.4.6", "tp_or_minus_13g", "srt/server_args.py ServerArgs.__post_init__ (0.4.6, 0.4.6.post1)"),
    # 0.4.6.post2-0.4.7.post1: by tp_size * pp_size at <= 81920 MiB, else 0.88; above 96 GiB raised to
    # min(m + 48 GiB * (1 - m) / gpu_mem, (gpu_mem - 18 GiB) / gpu_mem)
    MemFractionRule("0.4.6.post2", "tp_96g", "srt/server_args.py ServerArgs.__post_init__ (0.4.6.post2-0.4.7.post1)"),
    # 0.4.8-0.5.2: reserved = (2.8 + tp*pp/10) GiB below 35 GiB, (9.5 + tp*pp/2) below 90, (12 + tp*pp/2) below 160,
    # else 32 GiB; round((gpu_mem - reserved) / gpu_mem, 3)
    MemFractionRule("0.4.8", "reserved_by_gpu", "srt/server_args.py ServerArgs.__post_init__ (0.4.8-0.5.2)"),
    # 0.5.3 on: reserved = 512 MiB + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp*pp/8 GiB,
    # at least 10 GiB above 60 GiB; round((gpu_mem - reserved) / gpu_mem, 3)
    MemFractionRule("0.5.3", "reserved_by_batch", "srt/server_args.py ServerArgs._handle_gpu_memory_settings (0.5.3+)"),
)


def _by_parallel_size(parallel: int) -> float:
    if parallel >= 16:
        return 0.79
    if parallel >= 8:
        return 0.81
    if parallel >= 4:
        return 0.85
    if parallel >= 2:
        return 0.87
    return 0.88


@dataclasses.dataclass(frozen=True)
class GpuTierRule:
    """chunked_prefill_size and cuda_graph_max_bs defaults by gpu_mem (``cuda_graph_max_bs`` None: the release's
    mem_fraction_static rule does not use it)."""

    since: str
    kind: str  # "25000": 2048 below 25,000 MiB else 8192; "35g": 2048 / 8192 / 16384; "table": the 0.5.3 table
    small_tp_graph_bs: int  # cuda_graph_max_bs of the 20-35 GiB tier at TP < 4 (0.5.3+)
    source: str


GPU_TIER_RULES: tuple[GpuTierRule, ...] = (
    GpuTierRule("0.4.0", "25000", 0, "srt/server_args.py ServerArgs.__post_init__ (0.4.0-0.4.7.post1)"),
    GpuTierRule("0.4.8", "35g", 0, "srt/server_args.py ServerArgs.__post_init__ (0.4.8-0.5.2)"),
    GpuTierRule("0.5.3", "table", 16, "srt/server_args.py _handle_gpu_memory_settings (0.5.3-0.5.4)"),
    GpuTierRule("0.5.5", "table", 24, "srt/server_args.py _handle_gpu_memory_settings (0.5.5+)"),
)


@dataclasses.dataclass(frozen=True)
class GpuDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None


def gpu_defaults(gpu_mem_mib: int | None, tp: int, version: str) -> GpuDefaults:
    """SGLang's chunked_prefill_size and cuda_graph_max_bs for a GPU of ``gpu_mem_mib`` (None: no GPU asked)."""
    rule = pick(GPU_TIER_RULES, version)
    if rule.kind == "25000":
        return GpuDefaults(2048 if gpu_mem_mib is not None and gpu_mem_mib < 25_000 else 8192, None)
    if rule.kind == "35g":
        if gpu_mem_mib is None:
            return GpuDefaults(4096, None)
        if gpu_mem_mib < 35 * MIB:
            return GpuDefaults(2048, None)
        return GpuDefaults(8192 if gpu_mem_mib < 160 * MIB else 16384, None)
    if gpu_mem_mib is None:
        return GpuDefaults(4096, 160)
    small = tp < 4
    if gpu_mem_mib < 20 * MIB:
        return GpuDefaults(2048, 8)
    if gpu_mem_mib < 35 * MIB:
        return GpuDefaults(2048, rule.small_tp_graph_bs if small else 80)
    if gpu_mem_mib < 60 * MIB:
        return GpuDefaults(4096, 32 if small else 160)
    if gpu_mem_mib < 160 * MIB:
        return GpuDefaults(8192, 256 if small else 512)
    return GpuDefaults(16384, 512)


def default_mem_fraction_static(
    gpu_mem_mib: int | None, tp: int, pp: int, chunked_prefill_size: int, cuda_graph_max_bs: int | None, version: str
) -> tuple[float, str]:
    """SGLang's default mem_fraction_static and how it was reached, in words."""
    rule = pick(MEM_FRACTION_RULES, version)
    parallel = tp * pp
    if rule.kind == "tp":
        value = _by_parallel_size(tp)
        return value, f"{value} at TP {tp} ({rule.source})"
    if gpu_mem_mib is None:
        if rule.kind == "tp_or_minus_13g":
            value = _by_parallel_size(tp)
            return value, f"{value} at TP {tp}, no GPU given ({rule.source})"
        value = 0.88
        return value, f"{value} with no GPU given ({rule.source})"
    if rule.kind == "tp_or_minus_13g":
        if gpu_mem_mib <= 81920:
            value = _by_parallel_size(tp)
            return value, f"{value} at TP {tp} on {gpu_mem_mib:,} MiB ({rule.source})"
        value = (gpu_mem_mib - 1024 * 13) / gpu_mem_mib
        return value, f"({gpu_mem_mib:,} - 13,312) / {gpu_mem_mib:,} MiB = {value:.4f} ({rule.source})"
    if rule.kind == "tp_96g":
        value = _by_parallel_size(parallel) if gpu_mem_mib <= 81920 else 0.88
        how = f"{value} at TP x PP {parallel}"
        if gpu_mem_mib > 96 * 1024:
            value = min(value + 48 * 1024 * (1 - value) / gpu_mem_mib, (gpu_mem_mib - 1024 * 18) / gpu_mem_mib)
            how += f", raised for {gpu_mem_mib:,} MiB to {value:.4f}"
        return value, f"{how} ({rule.source})"
    if rule.kind == "reserved_by_gpu":
        if gpu_mem_mib < 35 * MIB:
            reserved = (2.8 + parallel / 10) * 1024
        elif gpu_mem_mib < 90 * MIB:
            reserved = (9.5 + parallel / 2) * 1024
        elif gpu_mem_mib < 160 * MIB:
            reserved = (12 + parallel / 2) * 1024
        else:
            reserved = 32 * 1024
    else:
        reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + (cuda_graph_max_bs or 0) * 2 + parallel / 8 * 1024
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
    value = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return value, f"round(({gpu_mem_mib:,} - {reserved:,.1f}) / {gpu_mem_mib:,} MiB, 3) = {value} ({rule.source})"


@dataclasses.dataclass(frozen=True)
class KvDtypeRule:
    since: str
    choices: tuple[str, ...]  # --kv-cache-dtype values the release takes (fp4_e2m1 of 0.5.5+ is not modelled)
    source: str


KV_DTYPE_RULES: tuple[KvDtypeRule, ...] = (
    KvDtypeRule("0.4.0", ("auto", "fp8_e5m2"), "srt/server_args.py add_cli_args (0.4.0)"),
    KvDtypeRule(
        "0.4.1", ("auto", "fp8_e5m2", "fp8_e4m3"), "srt/server_args.py add_cli_args (read in 0.4.1.post7-0.5.3)"
    ),
    KvDtypeRule(
        "0.5.4", ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"), "srt/server_args.py add_cli_args (0.5.4+)"
    ),
)


@dataclasses.dataclass(frozen=True)
class ReqPoolRule:
    """ReqToTokenPool's size: max_num_reqs + 1 slots before 0.4.7, max_num_reqs from 0.4.7
    (srt/model_executor/model_runner.py init_memory_pool)."""

    since: str
    extra_slots: int


REQ_POOL_RULES: tuple[ReqPoolRule, ...] = (ReqPoolRule("0.4.0", 1), ReqPoolRule("0.4.7", 0))

# --page-size exists from 0.4.4 (srt/server_args.py; init_memory_pool rounds the pool down to whole pages)
PAGE_SIZE_SINCE = "0.4.4"


@dataclasses.dataclass(frozen=True)
class WindowPoolRule:
    """How a model with sliding-window (or chunked) attention layers gets its KV pool."""

    since: str
    uniform: bool  # True: one MHATokenToKVPool with a full slot in every layer, the window only narrows attention
    source: str


WINDOW_POOL_RULES: tuple[WindowPoolRule, ...] = (
    # 0.4.0-0.4.9.post2: init_memory_pool builds MHATokenToKVPool(layer_num=num_hidden_layers) for every model; the
    # window (get_attention_sliding_window_size) reaches only the attention backend.  A hybrid pool exists from 0.4.7
    # for Llama 4 alone, behind --hybrid-kvcache-ratio (configs/model_config.py is_hybrid_model; not modelled).
    WindowPoolRule("0.4.0", True, "srt/model_executor/model_runner.py init_memory_pool (0.4.0-0.4.9.post2)"),
    # 0.4.9.post3 on: ModelRunner.__init__ sets is_hybrid for a model whose get_attention_sliding_window_size() > 0
    # (unless --disable-hybrid-swa-memory), sized as SWAKVPool (full and SWA sub-pools): not modelled
    WindowPoolRule("0.4.9.post3", False, "srt/model_executor/model_runner.py ModelRunner.__init__ (0.4.9.post3+)"),
)


# configs/model_config.py multimodal_model_archs (0.5.6.post2; earlier releases list a subset of these, each as it
# gained the model): the architectures SGLang serves as multimodal
MULTIMODAL_ARCHS = frozenset(
    (
        "CLIPModel DeepseekVL2ForCausalLM Gemma3ForConditionalGeneration Gemma3nForConditionalGeneration "
        "Glm4vForConditionalGeneration Glm4vMoeForConditionalGeneration Grok1VForCausalLM Grok1AForCausalLM "
        "LlavaLlamaForCausalLM Llama4ForConditionalGeneration LlavaMistralForCausalLM LlavaQwenForCausalLM "
        "LlavaForConditionalGeneration LlavaVidForCausalLM MiniCPMO MiniCPMV Mistral3ForConditionalGeneration "
        "MultiModalityCausalLM MllamaForConditionalGeneration NemotronH_Nano_VL_V2 PixtralForConditionalGeneration "
        "Qwen2AudioForConditionalGeneration Qwen2VLForConditionalGeneration Qwen2_5_VLForConditionalGeneration "
        "Qwen3VLForConditionalGeneration Qwen3VLMoeForConditionalGeneration Qwen3OmniMoeForConditionalGeneration "
        "KimiVLForConditionalGeneration InternVLChatModel InternS1ForConditionalGeneration Phi4MMForCausalLM "
        "Step3VLForConditionalGeneration POINTSV15ChatModel DotsVLMForCausalLM DotsOCRForCausalLM "
        "Sarashina2VisionForCausalLM NVILAForConditionalGeneration NVILALiteForConditionalGeneration "
        "DeepseekOCRForCausalLM JetVLMForConditionalGeneration PaddleOCRVLForConditionalGeneration"
    ).split()
)
_MM_OFF_046 = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration"})


@dataclasses.dataclass(frozen=True)
class VlmFractionRule:
    """How a multimodal model's mem_fraction_static is cut (for the image processing it needs besides the pool)."""

    since: str
    factor: float | None  # the cut; None: adjust_mem_fraction_for_vlm's, sized by the vision tower
    default_only: bool  # True: ServerArgs cuts its own default only; False: ModelRunner cuts any fraction, given too
    text_only: frozenset[str]  # architectures served text-only unless --enable-multimodal (ModelConfig mm_disabled)
    source: str


VLM_FRACTION_RULES: tuple[VlmFractionRule, ...] = (
    VlmFractionRule(
        "0.4.0", 0.95, False, frozenset(),
        "srt/model_executor/model_runner.py ModelRunner.model_specific_adjustment (0.4.0-0.4.4.post3)",
    ),
    VlmFractionRule(
        "0.4.4.post4", 0.90, False, frozenset(),
        "srt/model_executor/model_runner.py ModelRunner.model_specific_adjustment (0.4.4.post4-0.4.5.post3)",
    ),
    VlmFractionRule(
        "0.4.6", 0.90, False, _MM_OFF_046,
        "srt/model_executor/model_runner.py model_specific_adjustment, srt/configs/model_config.py ModelConfig "
        "mm_disabled_models (0.4.6-0.4.8.post1)",
    ),
    VlmFractionRule("0.4.9", 0.90, True, _MM_OFF_046, "srt/server_args.py ServerArgs.__post_init__ (0.4.9-0.4.9.post2)"),
    VlmFractionRule(
        "0.4.9.post3", None, True, _MM_OFF_046,
        "srt/server_args.py ServerArgs.adjust_mem_fraction_for_vlm (0.4.9.post3-0.4.9.post6)",
    ),
    VlmFractionRule(
        "0.4.10", None, True, _MM_OFF_046 | {"Step3VLForConditionalGeneration"},
        "srt/server_args.py ServerArgs.adjust_mem_fraction_for_vlm (0.4.10+)",
    ),
)  # fmt: skip


def vlm_fraction(
    fraction: float, given: bool, architectures: tuple[str, ...], vit: tuple[int, int] | None, version: str
) -> tuple[float, str | None]:
    """mem_fraction_static after SGLang's cut for a multimodal model (``vit``: the vision tower's layers and hidden
    size, None when kvtool does not read the tower), and the cut in words (None: not cut)."""
    rule = pick(VLM_FRACTION_RULES, version)
    if not architectures or architectures[0] not in MULTIMODAL_ARCHS or (given and rule.default_only):
        return fraction, None
    if architectures[0] in rule.text_only:
        return fraction, f"{architectures[0]} is served text-only (no --enable-multimodal): no multimodal cut"
    if rule.factor is not None:
        factor, how = rule.factor, f"x {rule.factor}"
    else:
        layers, hidden = vit or (24, 1024)  # getattr's fallbacks in adjust_mem_fraction_for_vlm
        ratio = layers * hidden**2 / (24 * 1024**2)  # against ViT-L/14
        factor = 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
        how = f"x {factor:.4f} (0.95 x the ViT's size, {layers} layers x {hidden}" + ("" if vit else ", not read") + ")"
    return (
        fraction * factor,
        f"multimodal {architectures[0]}: {fraction:.3f} {how} = {fraction * factor:.4f} ({rule.source})",
    )
