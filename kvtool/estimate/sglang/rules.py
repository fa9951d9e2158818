"""SGLang's defaults that change between releases, one table per rule, each row read from that release's
python/sglang/srt/server_args.py (``ServerArgs.__post_init__``, from 0.5.3 ``_handle_gpu_memory_settings``, from 0.5.19
srt/arg_groups/memory_hook.py ``handle_gpu_memory_settings``).

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
    no_gpu_value: float = 0.88  # the value with no GPU memory known (gpu_mem None)


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
    MemFractionRule(
        "0.5.3", "reserved_by_batch", "srt/server_args.py ServerArgs._handle_gpu_memory_settings (0.5.3-0.5.9)"
    ),
    # 0.5.10 on: the prefill (piecewise, from 0.5.16 breakable) CUDA graph is on by default, and its reserve is added
    # before the 10 GiB floor: 8 MiB per captured token count (non-MLA), 1.5 GiB (MLA); see PREFILL_GRAPH_RULES.
    # (0.5.7-0.5.9 add a piecewise reserve only with --enable-piecewise-cuda-graph, off by default.)
    MemFractionRule(
        "0.5.10",
        "reserved_by_batch_and_prefill_graph",
        "srt/server_args.py ServerArgs._handle_gpu_memory_settings (0.5.10-0.5.15; 0.5.16-0.5.18 with "
        "reserve_for_graph_mb)",
    ),
    # 0.5.19: the same rule moved to srt/arg_groups/memory_hook.py handle_gpu_memory_settings / reserve_for_graph_mb
    MemFractionRule(
        "0.5.19", "reserved_by_batch_and_prefill_graph", "srt/arg_groups/memory_hook.py handle_gpu_memory_settings"
    ),
    # 0.5.20 on: with no GPU memory known the default is 0.95, not 0.88
    MemFractionRule(
        "0.5.20",
        "reserved_by_batch_and_prefill_graph",
        "srt/arg_groups/memory_hook.py handle_gpu_memory_settings (0.5.20+)",
        no_gpu_value=0.95,
    ),
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
    mid_chunked_prefill_size: int = 2048  # chunked_prefill_size of the 20-35 GiB tier ("table")
    mid_big_tp_graph_bs: int = 80  # cuda_graph_max_bs of the 20-35 GiB tier at TP >= 4 ("table")
    graph_bs_capped_by_running: bool = False  # a default decode max_bs above --max-running-requests is cut to it


GPU_TIER_RULES: tuple[GpuTierRule, ...] = (
    GpuTierRule("0.4.0", "25000", 0, "srt/server_args.py ServerArgs.__post_init__ (0.4.0-0.4.7.post1)"),
    GpuTierRule("0.4.8", "35g", 0, "srt/server_args.py ServerArgs.__post_init__ (0.4.8-0.5.2)"),
    GpuTierRule("0.5.3", "table", 16, "srt/server_args.py _handle_gpu_memory_settings (0.5.3-0.5.4)"),
    GpuTierRule("0.5.5", "table", 24, "srt/server_args.py _handle_gpu_memory_settings (0.5.5-0.5.18)"),
    GpuTierRule("0.5.19", "table", 24, "srt/arg_groups/memory_hook.py handle_gpu_memory_settings (0.5.19)"),
    # 0.5.20: the 20-35 GiB tier (A10, 4090, 5090) takes chunked_prefill_size 4096 and max_bs 48 (TP < 4) / 160
    GpuTierRule(
        "0.5.20",
        "table",
        48,
        "srt/arg_groups/memory_hook.py handle_gpu_memory_settings (0.5.20-0.5.21)",
        mid_chunked_prefill_size=4096,
        mid_big_tp_graph_bs=160,
    ),
    # 0.5.22: a default decode max_bs larger than --max-running-requests is cut to it
    GpuTierRule(
        "0.5.22",
        "table",
        48,
        "srt/arg_groups/memory_hook.py handle_gpu_memory_settings (0.5.22+)",
        mid_chunked_prefill_size=4096,
        mid_big_tp_graph_bs=160,
        graph_bs_capped_by_running=True,
    ),
)


@dataclasses.dataclass(frozen=True)
class GpuDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None


def gpu_defaults(
    gpu_mem_mib: int | None, tp: int, version: str, max_running_requests: int | None = None
) -> GpuDefaults:
    """SGLang's chunked_prefill_size and cuda_graph_max_bs for a GPU of ``gpu_mem_mib`` (None: no GPU asked)."""
    rule = pick(GPU_TIER_RULES, version)
    tiers = _table_defaults(gpu_mem_mib, tp, rule)
    if rule.graph_bs_capped_by_running and max_running_requests is not None and tiers.cuda_graph_max_bs is not None:
        return GpuDefaults(tiers.chunked_prefill_size, min(tiers.cuda_graph_max_bs, max_running_requests))
    return tiers


def _table_defaults(gpu_mem_mib: int | None, tp: int, rule: GpuTierRule) -> GpuDefaults:
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
        return GpuDefaults(rule.mid_chunked_prefill_size, rule.small_tp_graph_bs if small else rule.mid_big_tp_graph_bs)
    if gpu_mem_mib < 60 * MIB:
        return GpuDefaults(4096, 32 if small else 160)
    if gpu_mem_mib < 160 * MIB:
        return GpuDefaults(8192, 256 if small else 512)
    return GpuDefaults(16384, 512)


@dataclasses.dataclass(frozen=True)
class PrefillGraphRule:
    """The prefill CUDA graph that is on by default from 0.5.10 (piecewise, torch.compile'd; from 0.5.16 "breakable"),
    whose capture mem_fraction_static reserves: 8 MiB per captured token count for non-MLA models, 1.5 GiB for MLA.
    The token counts are 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256 and
    4608 step 512 up to the largest (srt/server_args.py _generate_piecewise_cuda_graph_tokens 0.5.10-0.5.13,
    _generate_prefill_cuda_graph_batch_sizes 0.5.14-0.5.18, srt/arg_groups/cuda_graph_hook.py
    generate_prefill_cuda_graph_batch_sizes 0.5.19+: the same list)."""

    since: str
    mla_reserve_mib: float  # 0 where the default prefill graph is off for MLA
    clamps_to_context_length: bool  # the largest token count is cut to --context-length when given
    disabled_architectures: tuple[str, ...]  # config.json architectures the default prefill graph is off for
    source: str


_PIECEWISE_OFF_0510 = (
    "DeepseekV32ForCausalLM",
    "Qwen3NextForCausalLM",
    "GlmMoeDsaForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "LLaDAModelLM",
)
_DEEPSEEK_V4 = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN")
PREFILL_GRAPH_RULES: tuple[PrefillGraphRule, ...] = (
    PrefillGraphRule(
        "0.5.10",
        1536,
        False,
        _PIECEWISE_OFF_0510,
        "srt/server_args.py _handle_piecewise_cuda_graph, srt/configs/model_config.py "
        "piecewise_cuda_graph_disabled_model_archs (0.5.10-0.5.11)",
    ),
    PrefillGraphRule(
        "0.5.12",
        1536,
        False,
        _PIECEWISE_OFF_0510 + _DEEPSEEK_V4,
        "srt/configs/model_config.py piecewise_cuda_graph_disabled_model_archs (0.5.12)",
    ),
    # 0.5.13: clamped to --context-length (_handle_gpu_memory_settings); DeepseekV32 and GlmMoeDsa dropped from the list
    PrefillGraphRule(
        "0.5.13",
        1536,
        True,
        (*_DEEPSEEK_V4, "Qwen3NextForCausalLM", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"),
        "srt/server_args.py _handle_gpu_memory_settings, _disable_tc_piecewise_cudagraph_if_incompatible (0.5.13-0.5.15)",
    ),
    # 0.5.16: the default prefill backend is "breakable" on CUDA (srt/model_executor/cuda_graph_config.py
    # default_prefill_backend), which _disable_breakable_cudagraph_if_incompatible turns off for MLA and DeepSeek-V4
    PrefillGraphRule(
        "0.5.16",
        0,
        True,
        (*_DEEPSEEK_V4, "DeepseekV4ForCausalLMDSpark"),
        "srt/server_args.py _disable_breakable_cudagraph_if_incompatible, reserve_for_graph_mb (0.5.16)",
    ),
    # 0.5.17: no --context-length clamp any more
    PrefillGraphRule(
        "0.5.17",
        0,
        False,
        (*_DEEPSEEK_V4, "DeepseekV4ForCausalLMDSpark"),
        "srt/server_args.py _handle_gpu_memory_settings, _disable_breakable_cudagraph_if_incompatible (0.5.17)",
    ),
    # 0.5.18: the breakable graph no longer refuses MLA, whose reserve is 1.5 GiB again
    PrefillGraphRule(
        "0.5.18",
        1536,
        False,
        (*_DEEPSEEK_V4, "DeepseekV4ForCausalLMDSpark"),
        "srt/server_args.py reserve_for_graph_mb (0.5.18), srt/arg_groups/memory_hook.py reserve_for_graph_mb and "
        "cuda_graph_hook.py disable_breakable_cudagraph_if_incompatible (0.5.19+)",
    ),
)


def prefill_graph_tokens(max_tokens: int) -> list[int]:
    """The prefill CUDA graph's captured token counts up to ``max_tokens`` (PrefillGraphRule's list)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [size for size in sizes if size <= max_tokens]


@dataclasses.dataclass(frozen=True)
class PrefillGraphInputs:
    """What the default prefill CUDA graph's reserve depends on besides the GPU (0.5.10+)."""

    mla: bool = False
    architectures: tuple[str, ...] = ()
    model_path: str = ""  # "llama-2" in it caps the largest token count at 4096
    context_length: int | None = None  # --context-length as given (None: not given)
    max_total_tokens: int | None = None  # --max-total-tokens as given


def prefill_graph_reserve_mib(chunked_prefill_size: int, inputs: PrefillGraphInputs, version: str) -> tuple[float, str]:
    """The prefill CUDA graph's share of mem_fraction_static's reserve in MiB, and how it was reached."""
    rule = pick(PREFILL_GRAPH_RULES, version)
    if set(inputs.architectures) & set(rule.disabled_architectures):
        return 0.0, "prefill CUDA graph off for this architecture"
    if inputs.mla:
        if not rule.mla_reserve_mib:
            return 0.0, "prefill CUDA graph off for MLA"
        return rule.mla_reserve_mib, f"prefill CUDA graph (MLA) {rule.mla_reserve_mib:.0f}"
    largest = chunked_prefill_size
    if inputs.max_total_tokens is not None:
        largest = min(largest, inputs.max_total_tokens)
    if "llama-2" in inputs.model_path.lower():
        largest = min(largest, 4096)
    if rule.clamps_to_context_length and inputs.context_length is not None:
        largest = min(largest, inputs.context_length)
    count = len(prefill_graph_tokens(largest))
    return count * 8.0, f"prefill CUDA graph {count} x 8"


def default_mem_fraction_static(
    gpu_mem_mib: int | None,
    tp: int,
    pp: int,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int | None,
    version: str,
    prefill: PrefillGraphInputs | None = None,
) -> tuple[float, str]:
    """SGLang's default mem_fraction_static and how it was reached, in words (``prefill``: the model's inputs to the
    prefill CUDA graph's reserve of 0.5.10+; None: a non-MLA model with no caps)."""
    rule = pick(MEM_FRACTION_RULES, version)
    parallel = tp * pp
    source = rule.source
    if rule.kind == "tp":
        value = _by_parallel_size(tp)
        return value, f"{value} at TP {tp} ({rule.source})"
    if gpu_mem_mib is None:
        if rule.kind == "tp_or_minus_13g":
            value = _by_parallel_size(tp)
            return value, f"{value} at TP {tp}, no GPU given ({rule.source})"
        value = rule.no_gpu_value
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
        if rule.kind == "reserved_by_batch_and_prefill_graph":
            graph, graph_how = prefill_graph_reserve_mib(chunked_prefill_size, prefill or PrefillGraphInputs(), version)
            reserved += graph
            source = f"{graph_how} MiB included; {source}"
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
    value = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return value, f"round(({gpu_mem_mib:,} - {reserved:,.1f}) / {gpu_mem_mib:,} MiB, 3) = {value} ({source})"


@dataclasses.dataclass(frozen=True)
class KvDtypeRule:
    since: str
    choices: tuple[str, ...]  # --kv-cache-dtype values the release takes that kvtool models
    source: str
    unmodelled: tuple[str, ...] = ()  # values the release takes whose pool (FP4/MX scale buffers) kvtool does not model


KV_DTYPE_RULES: tuple[KvDtypeRule, ...] = (
    KvDtypeRule("0.4.0", ("auto", "fp8_e5m2"), "srt/server_args.py add_cli_args (0.4.0)"),
    KvDtypeRule(
        "0.4.1", ("auto", "fp8_e5m2", "fp8_e4m3"), "srt/server_args.py add_cli_args (read in 0.4.1.post7-0.5.3)"
    ),
    KvDtypeRule(
        "0.5.4", ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"), "srt/server_args.py add_cli_args (0.5.4)"
    ),
    KvDtypeRule(
        "0.5.5",
        ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
        "srt/server_args.py add_cli_args (0.5.5-0.5.15)",
        unmodelled=("fp4_e2m1",),
    ),
    KvDtypeRule(
        "0.5.16",
        ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
        "srt/server_args.py add_cli_args (0.5.16-0.5.19), srt/arg_groups/fields/model.py (0.5.20)",
        unmodelled=("mxfp8", "nvfp4", "fp4_mx_block16", "fp4_e2m1"),
    ),
    KvDtypeRule(
        "0.5.21",
        ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
        "srt/arg_groups/fields/model.py kv_cache_dtype (0.5.21+)",
        unmodelled=("mxfp8", "nvfp4", "fp4_mx_block16"),
    ),
)


@dataclasses.dataclass(frozen=True)
class ReqPoolRule:
    """ReqToTokenPool's size and the max_running_requests the scheduler logs, from the pool's tokens and the
    requests cap (``max_running_requests`` given or not)."""

    since: str
    extra_slots: int  # ReqToTokenPool slots beyond max_num_reqs
    # "pool": max_num_reqs = the cap given, else min(max(int(tokens / context_len * 512), 2048), 4096); logged
    #   min(tokens // 2 (no cap) or the cap, pool size)
    # "estimated": the cap is cut to that estimate (no cap: min(estimate, tokens // 2)); logged as sized
    # "half_tokens": the cap is cut to tokens // 2 (no cap: min(estimate, tokens // 2)); logged as sized
    kind: str
    source: str


REQ_POOL_RULES: tuple[ReqPoolRule, ...] = (
    ReqPoolRule("0.4.0", 1, "pool", "srt/model_executor/model_runner.py init_memory_pool, managers/tp_worker.py"),
    ReqPoolRule("0.4.7", 0, "pool", "srt/model_executor/model_runner.py init_memory_pool (0.4.7-0.5.9)"),
    ReqPoolRule(
        "0.5.10",
        0,
        "estimated",
        "srt/model_executor/model_runner_kv_cache_mixin.py _resolve_max_num_reqs (0.5.10-0.5.13)",
    ),
    ReqPoolRule(
        "0.5.14",
        0,
        "half_tokens",
        "srt/model_executor/model_runner_kv_cache_mixin.py _resolve_max_num_reqs (0.5.14-0.5.15), "
        "srt/mem_cache/kv_cache_configurator.py KVCacheConfigurator.resolve_max_num_reqs (0.5.16+)",
    ),
)


def running_requests(tokens: int, context_len: int, cap: int | None, version: str) -> tuple[int, int]:
    """(ReqToTokenPool's max_num_reqs, the logged max_running_requests) for a pool of ``tokens``."""
    rule = pick(REQ_POOL_RULES, version)
    estimated = min(max(int(tokens / context_len * 512), 2048), 4096)
    if rule.kind == "pool":
        max_num_reqs = cap or estimated
        return max_num_reqs, min(tokens // 2 if cap is None else cap, max_num_reqs + rule.extra_slots)
    if cap is None:
        max_num_reqs = min(estimated, tokens // 2)
    else:
        max_num_reqs = min(cap, estimated if rule.kind == "estimated" else tokens // 2)
    return max_num_reqs, max_num_reqs


@dataclasses.dataclass(frozen=True)
class AllocatedLineRule:
    """The pool's allocation line (srt/mem_cache/memory_pool.py MHATokenToKVPool / MLATokenToKVPool)."""

    since: str
    tokens: bool  # "#tokens: N, " after "KV Cache is allocated. "
    dtype: bool  # "dtype: torch.X, " before it


ALLOCATED_LINE_RULES: tuple[AllocatedLineRule, ...] = (
    AllocatedLineRule("0.4.0", False, False),
    AllocatedLineRule("0.4.4", True, False),
    AllocatedLineRule("0.5.13", True, True),  # srt/mem_cache/memory_pool.py (0.5.13+)
)


@dataclasses.dataclass(frozen=True)
class NoMemoryRule:
    """What SGLang says when the weights leave the pool no memory."""

    since: str
    message: str  # "{fraction}" and "{minimum}" are filled in
    source: str


NO_MEMORY_RULES: tuple[NoMemoryRule, ...] = (
    NoMemoryRule(
        "0.4.0",
        "Not enough memory. Please try to increase --mem-fraction-static.",
        "srt/model_executor/model_runner.py init_memory_pool",
    ),
    NoMemoryRule(
        "0.5.14",
        "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={fraction}. "
        "Raise --mem-fraction-static above {minimum:.3f}",
        "srt/model_executor/model_runner_kv_cache_mixin.py _profile_available_bytes (0.5.14-0.5.15), "
        "srt/mem_cache/kv_cache_configurator.py KVCacheConfigurator._profile_available_bytes (0.5.16+)",
    ),
)

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
