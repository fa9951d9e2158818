"""``kvtool estimate --engine vllm,sglang``: the same model and GPU on both engines, side by side.

vLLM's KV budget is gpu_memory_utilization x the GPU less the weights and its profiled reserve (activations,
non-torch memory, CUDA graphs); SGLang's is the free memory after the weights less (1 - mem_fraction_static) of the
free memory before them.  The two defaults (0.9 and about 0.84-0.88) put the headroom in different places, which is
why the same model gets a pool of different size on each (vllm-project/vllm#21348: Qwen3-235B-A22B-FP8 on 4 x H100
got 178,880 tokens on vLLM and 367,404 on SGLang at --mem-fraction-static 0.93).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kvtool.core.units import GIB

if TYPE_CHECKING:
    from kvtool.estimate.result import EstimateResult
    from kvtool.estimate.sglang.pool import SglangEstimate


@dataclasses.dataclass(frozen=True)
class EngineRow:
    """One line of the side-by-side table: the figure on vLLM and on SGLang (None: not known there)."""

    what: str
    vllm: str | None
    sglang: str | None


@dataclasses.dataclass(frozen=True)
class EngineComparison:
    """Both engines' results and the rows the table shows."""

    vllm: EstimateResult
    sglang: SglangEstimate
    rows: tuple[EngineRow, ...]
    sglang_over_vllm_tokens: float | None  # SGLang's pool in tokens over vLLM's (None without both)
    warnings: tuple[str, ...] = ()


def _gib(n: float | int | None) -> str | None:
    return None if n is None else f"{n / GIB:.2f} GiB"


def _int(n: int | None) -> str | None:
    return None if n is None else f"{n:,}"


def _held_back(vllm: EstimateResult) -> int | None:
    """What vLLM keeps out of the KV pool besides the weights: the GPU less the weights and the KV budget
    ((1 - gpu_memory_utilization) of the GPU and the profiled reserve)."""
    if vllm.gpu_memory_bytes is None or vllm.weights_bytes_per_gpu is None or vllm.kv_budget_bytes is None:
        return None
    return vllm.gpu_memory_bytes - vllm.weights_bytes_per_gpu - vllm.kv_budget_bytes


def compare_engines(vllm: EstimateResult, sglang: SglangEstimate) -> EngineComparison:
    """The rows of both results that answer the same question."""
    rest_bytes = None if sglang.rest_memory_gib is None else int(sglang.rest_memory_gib * GIB)
    headroom = None if sglang.headroom_gib is None else int(sglang.headroom_gib * GIB)
    rows = (
        EngineRow("release", vllm.vllm_version, sglang.sglang_version),
        EngineRow(
            "KV bytes per token (one GPU)", _int(vllm.bytes_per_token_per_gpu), _int(sglang.cell_bytes_per_token)
        ),
        EngineRow("weights per GPU", _gib(vllm.weights_bytes_per_gpu), _gib(sglang.weights_bytes_per_gpu)),
        EngineRow(
            "memory setting",
            f"gpu_memory_utilization {vllm.gpu_memory_utilization}"
            if vllm.gpu_memory_utilization is not None
            else None,
            f"mem_fraction_static {sglang.mem_fraction_static:.3f}",
        ),
        EngineRow("held back besides weights and KV", _gib(_held_back(vllm)), _gib(headroom)),
        EngineRow("KV pool memory per GPU", _gib(vllm.kv_budget_bytes), _gib(rest_bytes)),
        EngineRow("KV pool tokens", _int(vllm.kv_cache_tokens), _int(sglang.max_total_num_tokens)),
        EngineRow("tokens per request (max)", _int(vllm.seq_len), _int(sglang.context_len)),
        EngineRow("pool unit", f"blocks of {vllm.block_size}", f"pages of {sglang.page_size}"),
    )
    ratio = None
    if vllm.kv_cache_tokens and sglang.max_total_num_tokens:
        ratio = sglang.max_total_num_tokens / vllm.kv_cache_tokens
    return EngineComparison(vllm, sglang, rows, ratio, (*vllm.warnings, *sglang.warnings))
