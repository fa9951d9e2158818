"""What-ifs calibrated on a start-up log: the same machine with one setting changed.

The calibration keeps what the log measured and lets kvtool's model say only how each term moves:

    budget' = logged available KV + (util' - util) x total
              - (weights' - weights) - (activation' - activation) - (non-torch' - non-torch) [- (graphs' - graphs)]

where each primed term is the logged one moved by kvtool's model: the weights and the activation peak scale by
kvtool's ratio (weights split over TP; the peak follows the profiled batch), the non-torch and CUDA-graph terms shift
by kvtool's difference (estimate() for the changed settings against estimate() for the log's own), none below zero. The CUDA-graph term counts where the release takes it from the budget. The token count and
concurrency at ``budget'`` are vLLM's rules for the changed settings (estimate() --kv-memory).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.errors import KvtoolError
from kvtool.estimate.estimator import EstimateResult, estimate
from kvtool.explain.reproduce import LoggedTerms
from kvtool.explain.settings import LogSettings

# option name -> EstimateRequest field
WHAT_IF_FIELDS = {
    "max_model_len": "seq_lens",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_dtype": "kv_dtype",
    "tp": "tp",
    "max_num_seqs": "max_num_seqs",
    "block_size": "block_size",
}


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """One setting changed on the log's machine, and what vLLM would then report."""

    setting: str  # option name: max_model_len, gpu_memory_utilization, kv_dtype, tp, max_num_seqs, block_size
    logged_value: Any  # the log's own setting
    value: Any  # the what-if's
    kv_budget_bytes: int | None  # per GPU, calibrated (None: the budget could not be calibrated, see note)
    num_blocks: int | None
    kv_cache_tokens: int | None  # what vLLM would log as the KV cache size
    max_concurrency: float | None  # what it would log as the maximum concurrency
    budget_change_bytes: int | None  # kv_budget_bytes - the logged available KV memory
    note: str  # how the budget was calibrated, or why it was not


def default_what_ifs(settings: LogSettings) -> dict[str, Any]:
    """The what-ifs shown when none is asked: an fp8 KV cache, a utilisation of 0.95, half the context."""
    asked: dict[str, Any] = {}
    if settings.kv_dtype == "auto":
        asked["kv_dtype"] = "fp8"
    if settings.gpu_memory_utilization < 0.95:
        asked["gpu_memory_utilization"] = 0.95
    if settings.max_model_len and settings.max_model_len >= 2048:
        asked["max_model_len"] = settings.max_model_len // 2
    return asked


def _request_change(setting: str, value: Any) -> dict[str, Any]:
    field = WHAT_IF_FIELDS[setting]
    return {field: (int(value),) if field == "seq_lens" else value}


def _logged_value(settings: LogSettings, setting: str) -> Any:
    return getattr(settings, setting, None)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The log's terms and the estimate they are anchored to (the log's own settings, on its GPU)."""

    terms: LoggedTerms
    base: EstimateResult | None  # estimate() for the log's settings with the device total; None without one
    graphs_subtracted: bool


def _shift(logged: float | None, base: int | None, new: int | None, scale: bool = False) -> float:
    """How much a term moves: kvtool's change applied to the logged value, by ratio (``scale``) or by difference;
    a term never goes below zero."""
    if base is None or new is None:
        return 0.0
    if logged is None:
        return float(new - base)
    if scale:
        return logged * (new / base) - logged if base > 0 else 0.0
    return max(float(new - base), -logged)


def calibrated_budget(
    settings: LogSettings, calibration: Calibration, new: EstimateResult, util: float
) -> tuple[int | None, str]:
    """``budget'`` of the module docstring; None with a reason when the log's budget is not known."""
    terms, base = calibration.terms, calibration.base
    available = terms.available[0]
    if settings.kv_cache_memory_bytes is not None:
        return settings.kv_cache_memory_bytes, "--kv-cache-memory-bytes of the log: the budget is set by hand"
    if available is None:
        return None, "the log gives no available KV memory"
    if base is None:
        return None, "no estimate of the log's own settings to calibrate on (see warnings)"
    change = 0.0
    if util != settings.gpu_memory_utilization:
        if settings.gpu_memory_bytes is None:
            return None, "a new utilisation needs the device total: give --gpu-memory"
        change += (util - settings.gpu_memory_utilization) * settings.gpu_memory_bytes
    change -= _shift(terms.weights[0], base.weights_bytes_per_gpu, new.weights_bytes_per_gpu, scale=True)
    change -= _shift(terms.activation[0], base.activation_bytes, new.activation_bytes, scale=True)
    change -= _shift(terms.non_torch[0], base.non_torch_bytes, new.non_torch_bytes)
    if calibration.graphs_subtracted:
        change -= _shift(terms.cudagraph[0], base.cudagraph_bytes, new.cudagraph_bytes)
    return int(available + change), "logged available KV memory, each term moved by kvtool's model"


def answer_what_if(settings: LogSettings, calibration: Calibration, setting: str, value: Any) -> WhatIf:
    """One what-if: the changed settings' terms from estimate(), the calibrated budget, then vLLM's counts."""
    change = _request_change(setting, value)
    logged_value = _logged_value(settings, setting)
    if settings.model is None and settings.config is None:
        return WhatIf(
            setting, logged_value, value, None, None, None, None, None, "needs the model: give --model or --config"
        )
    try:
        new = estimate(settings.request(**change)) if calibration.base is not None else None
        util = float(value) if setting == "gpu_memory_utilization" else settings.gpu_memory_utilization
        if new is None:
            budget, note = calibrated_budget_without_base(settings, calibration, setting, value)
        else:
            budget, note = calibrated_budget(settings, calibration, new, util)
        if budget is None:
            return WhatIf(setting, logged_value, value, None, None, None, None, None, note)
        counting = {**change, "gpu": None, "gpu_memory": None, "gpu_memory_utilization": None}
        counted = estimate(settings.request(kv_memory=str(budget), **counting))
    except KvtoolError as err:
        return WhatIf(setting, logged_value, value, None, None, None, None, None, err.one_line())
    available = calibration.terms.available[0]
    return WhatIf(
        setting,
        logged_value,
        value,
        budget,
        counted.num_blocks,
        counted.vllm_logged_tokens,
        counted.max_concurrency,
        None if available is None else int(budget - available),
        note,
    )


def calibrated_budget_without_base(
    settings: LogSettings, calibration: Calibration, setting: str, value: Any
) -> tuple[int | None, str]:
    """Without a device total the budget stays the logged one for the settings that do not move it (the context
    length, the KV dtype and the block size leave every term alone)."""
    available = calibration.terms.available[0]
    if settings.kv_cache_memory_bytes is not None:
        return settings.kv_cache_memory_bytes, "--kv-cache-memory-bytes of the log: the budget is set by hand"
    if available is None:
        return None, "the log gives no available KV memory"
    if setting in ("max_model_len", "kv_dtype", "block_size"):
        return int(available), "the logged budget (this setting moves no term of it)"
    if setting == "gpu_memory_utilization" and settings.gpu_memory_bytes is not None:
        util = float(getattr(settings, setting))
        return (
            int(available + (float(value) - util) * settings.gpu_memory_bytes),
            "the logged budget plus the change of utilisation x the device total",
        )
    return None, "this setting moves the budget's terms: give --gpu-memory to calibrate them"
