"""``--engine``: which engine's pool ``kvtool estimate`` sizes (vllm, sglang, or both side by side), and the options
that belong to one engine only.  Shared by the CLI and kvtool.api.estimate."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvtool.core.errors import UsageError

if TYPE_CHECKING:
    from kvtool.estimate.sglang.compare import EngineComparison
    from kvtool.estimate.sglang.pool import SglangEstimate

ENGINES = ("vllm", "sglang")
# options of SGLang's alone, and options that only vLLM's estimate reads (SGLang has no such setting, or kvtool does
# not model it for SGLang): each is refused where the other engine alone is asked
SGLANG_ONLY = (
    "mem_fraction_static",
    "max_running_requests",
    "max_total_tokens",
    "chunked_prefill_size",
    "sglang_version",
    "page_size",
)
VLLM_ONLY = tuple(
    (
        "kv_memory gpu_memory_utilization reserve activation_memory limit_mm_per_prompt mm_encoder_tp_mode "
        "encoder_memory non_torch_memory cudagraph_memory max_num_seqs enforce_eager prefix_caching mamba_cache_mode "
        "mamba_block_size async_scheduling block_size max_num_batched_tokens model_runner kv_offloading_size "
        "lmcache_chunk_size speculative_config draft_memory kv_transfer_config prompt_len transfers_in_flight "
        "ttft_budget_ms prefill_ms enable_lora max_loras max_lora_rank lora_memory compare batch vllm_version"
    ).split()
)


def parse_engines(text: str) -> tuple[str, ...]:
    """``"vllm,sglang"`` -> ("vllm", "sglang")."""
    engines = tuple(dict.fromkeys(part.strip() for part in str(text).split(",")))
    if not engines or any(e not in ENGINES for e in engines):
        raise UsageError(f"--engine takes vllm, sglang or vllm,sglang, not {text!r}", where="--engine")
    return engines


def refuse_other_engines_options(engines: tuple[str, ...], set_options: Iterable[str], spell: Any = None) -> None:
    """An option set for an engine not asked is a usage error naming it (``spell`` gives its flag)."""
    name = spell or (lambda option: "--" + option.replace("_", "-"))
    given = set(set_options)
    if "sglang" not in engines:
        for option in SGLANG_ONLY:
            if option in given:
                raise UsageError(
                    f"{name(option)} is SGLang's",
                    where=name(option),
                    tip="add --engine sglang (or --engine vllm,sglang)",
                )
    if "vllm" not in engines:
        for option in VLLM_ONLY:
            if option in given:
                raise UsageError(
                    f"{name(option)} is vLLM's: kvtool's SGLang estimate does not take it",
                    where=name(option),
                    tip="drop it, or give --engine vllm,sglang to see both engines",
                )


def estimate_engines(
    engines: tuple[str, ...], sglang_values: dict[str, Any], vllm_values: dict[str, Any] | None
) -> SglangEstimate | EngineComparison:
    """SGLang's pool (``engines == ("sglang",)``), or both engines' side by side; ``vllm_values`` are the vLLM
    request's fields by option name (kvtool.estimate.request.request_from), ``sglang_values`` SglangRequest's."""
    from kvtool.estimate.sglang.pool import estimate_sglang, sglang_request_from

    seq = sglang_values.get("seq_len")
    if isinstance(seq, (tuple, list)):
        if len(seq) > 1:
            raise UsageError("--context-length takes one length for SGLang, not a list", where="--context-length")
        sglang_values = dict(sglang_values, seq_len=seq[0] if seq else None)
    sglang = estimate_sglang(sglang_request_from(sglang_values))
    if engines == ("sglang",):
        return sglang
    from kvtool.estimate.estimator import estimate, request_from
    from kvtool.estimate.sglang.compare import compare_engines

    assert vllm_values is not None
    return compare_engines(estimate(request_from(vllm_values)), sglang)


def with_warnings(result: Any, warnings: tuple[str, ...]) -> Any:
    """``result`` with ``warnings`` first (a launch line's ignored flags)."""
    return dataclasses.replace(result, warnings=(*warnings, *result.warnings)) if warnings else result
