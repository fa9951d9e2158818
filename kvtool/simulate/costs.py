"""Step time of the serving simulation: a roofline from the model and the GPU, resolved exactly as `kvtool estimate`
resolves them (``kvtool.estimate.estimator.estimate``; one code path), plus a per-block-table-entry term.

One engine step (one forward pass over the scheduled tokens) on one GPU of a tensor-parallel group takes

    step_overhead_ms
    + max(bytes read / memory bandwidth, FLOPs / peak FLOP/s)
    + table_entry_us x block-table entries of the scheduled requests

- bytes read = the GPU's share of the weights + KV bytes per token per GPU x block_size x block-table entries
  (attention reads whole blocks, so a half-empty last block costs a full one);
- FLOPs = 2 x parameters per GPU x tokens scheduled + 4 x layers x query heads per GPU x head_dim x attended pairs
  (QK^T and PV: for a chunk of n new tokens after c computed ones, n x (c + (n + 1) / 2) query-key pairs);
- table_entry_us: the paged-attention kernel's cost per block it walks (address translation, one more small load
  and a partially used tile), beyond the bytes.  Its default is calibrated on the seed article's figure (block 8
  decodes ~4 % slower than block 16 for 64 requests of ~1,400 tokens, Llama-2-7B FP16 on an H100), so that figure
  agrees by construction; what the model adds is how the term scales with batch, length and block size.

Every constant is shown in the report and can be overridden (``--bandwidth-gb-s``, ``--peak-tflops``,
``--step-overhead-ms``, ``--table-entry-us``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.estimate.serve_defaults import BatchDefaults
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

DEFAULT_STEP_OVERHEAD_MS = 1.0  # scheduler, input preparation and kernel launches per step (eager CUDA graphs off)
DEFAULT_TABLE_ENTRY_US = 0.17  # see the module docstring


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Everything the step time depends on, with where each figure came from."""

    model: str
    gpu: str
    tp: int
    kv_dtype: str
    weights_bytes_per_gpu: int
    params_per_gpu: float
    kv_bytes_per_token_per_gpu: int
    num_layers: int
    attention_heads_per_gpu: int
    head_dim: int
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    step_overhead_ms: float
    table_entry_us: float
    kv_budget_bytes_per_gpu: int
    max_num_batched_tokens: int  # vllm serve's default for this GPU (estimate's figure)
    max_num_seqs: int  # vllm serve's default for this GPU (estimate's figure)
    batch_defaults: BatchDefaults  # the rule both came from (kvtool.estimate.serve_defaults), with its reason
    sources: tuple[str, ...]  # one line per constant: value and origin
    # the model's KV layout per GPU (kvtool.estimate.layout.KvLayout): its layer kinds, from which the serving
    # simulation forms vLLM's KV-cache groups (kvtool.simulate.grouped.model_groups); None: not known
    kv_layout: Any = None
    kv_layer_kinds: tuple[str, ...] = ()  # the model's KV layers' kinds in layer order (vLLM's order of groups)


@dataclasses.dataclass(frozen=True)
class CostOverrides:
    bandwidth_gb_s: float | None = None
    peak_tflops: float | None = None
    step_overhead_ms: float | None = None
    table_entry_us: float | None = None


def attended_pairs(computed: int, new: int) -> float:
    """Query-key pairs of a chunk of ``new`` tokens after ``computed`` ones (causal attention): each new token attends
    the computed ones and the new ones up to itself, ``new x (computed + (new + 1) / 2)``.  A decode (new 1) attends
    ``computed + 1``.  The one formula both engines' batches are costed with (vLLM's scheduler, SGLang's)."""
    return new * (computed + (new + 1) / 2)


class RooflineCost:
    """The step-time model (``kvtool.simulate.scheduler.StepCost``) for one block size; coefficients precomputed."""

    __slots__ = ("hw", "block_size", "_fixed_s", "_weights_s", "_entry_read_s", "_token_flop_s", "_pair_flop_s")

    def __init__(self, hw: Hardware, block_size: int):
        self.hw = hw
        self.block_size = block_size
        self._fixed_s = hw.step_overhead_ms * 1e-3
        self._weights_s = hw.weights_bytes_per_gpu / hw.bandwidth_bytes_per_s
        # one block-table entry: its KV bytes read, plus the kernel's per-entry cost
        self._entry_read_s = hw.kv_bytes_per_token_per_gpu * block_size / hw.bandwidth_bytes_per_s
        self._token_flop_s = 2.0 * hw.params_per_gpu / hw.peak_flops_per_s
        self._pair_flop_s = 4.0 * hw.num_layers * hw.attention_heads_per_gpu * hw.head_dim / hw.peak_flops_per_s

    def time_s(self, tokens: int, requests: int, entries: int, pairs: float) -> float:
        memory = self._weights_s + self._entry_read_s * entries
        compute = self._token_flop_s * tokens + self._pair_flop_s * pairs
        return self._fixed_s + (memory if memory > compute else compute) + self.hw.table_entry_us * 1e-6 * entries

    def decode_coefficients(self, requests: int) -> tuple[float, float, float, float, float, float]:
        return (
            self._fixed_s,
            self._weights_s,
            self._entry_read_s,
            self.hw.table_entry_us * 1e-6,
            self._token_flop_s * requests,
            self._pair_flop_s,
        )


@dataclasses.dataclass(frozen=True)
class _Rates:
    bandwidth_gb_s: float
    bandwidth_from: str
    peak_tflops: float
    peak_from: str


def _gpu_rates(
    gpu: str | None, dtype: str, overrides: CostOverrides, profile_dirs: tuple[str, ...], step_times: bool
) -> _Rates:
    """Memory bandwidth and the dense peak for ``dtype``: the options, else the GPU profile's fields (a GPU given
    by --gpu-memory has no profile: both options, or no step times)."""
    from kvtool.estimate.profiles import find_gpu

    if gpu is None:
        if overrides.bandwidth_gb_s is not None and overrides.peak_tflops is not None:
            return _Rates(overrides.bandwidth_gb_s, "--bandwidth-gb-s", overrides.peak_tflops, "--peak-tflops")
        if step_times:
            raise UsageError(
                "--gpu-memory gives the memory only: the step times need the GPU's bandwidth and peak",
                where="--gpu-memory",
                tip="give --bandwidth-gb-s and --peak-tflops, or --gpu NAME ('kvtool models' lists the GPUs)",
            )
        return _Rates(float("nan"), "no GPU profile", float("nan"), "no GPU profile")
    profile = find_gpu(gpu, profile_dirs)
    if overrides.bandwidth_gb_s is not None:
        bw, why = overrides.bandwidth_gb_s, "--bandwidth-gb-s"
    elif profile.memory_bandwidth_gb_s:
        bw, why = float(profile.memory_bandwidth_gb_s), f"GPU profile {profile.name}"
    else:
        raise UsageError(
            f"the GPU profile {profile.name} gives no memory_bandwidth_gb_s",
            where=profile.file,
            tip="give --bandwidth-gb-s",
        )
    profile_peak = profile.peak_dense_tflops.for_dtype(dtype)
    if overrides.peak_tflops is not None:
        peak, pwhy = overrides.peak_tflops, "--peak-tflops"
    elif profile_peak:
        peak, pwhy = float(profile_peak), f"GPU profile {profile.name}, dense {dtype}"
    else:
        raise UsageError(
            f"the GPU profile {profile.name} gives no dense peak for {dtype}",
            where=profile.file,
            tip="give --peak-tflops",
        )
    return _Rates(bw, why, peak, pwhy)


def resolve_hardware(
    *,
    model: str | None,
    config: str | None,
    gpu: str | None,
    tp: int = 1,
    kv_dtype: str = "auto",
    kv_memory: str | None = None,
    overrides: CostOverrides = CostOverrides(),
    gpu_memory: str | None = None,
    profile_dirs: tuple[str, ...] = (),
    step_times: bool = True,
    vllm_version: str = NEWEST_RELEASE,
    gpu_memory_utilization: float | None = None,
    quantization: str | None = None,
) -> Hardware:
    """The model and GPU (``gpu``, a profile, or ``gpu_memory``, a size) through `kvtool estimate`'s resolution; a
    model whose weights do not fit says so.  ``step_times``: the bandwidth and peak are needed (--serve).
    ``gpu_memory_utilization`` and ``quantization`` are estimate's (None: vLLM's 0.9, the checkpoint as it is);
    `kvtool plan --qps` sets them per candidate."""
    from kvtool.estimate.estimator import EstimateRequest, estimate
    from kvtool.estimate.serve_defaults import serve_batch_defaults

    result = estimate(
        EstimateRequest(
            model=model,
            config=config,
            gpu=gpu,
            gpu_memory=gpu_memory,
            tp=tp,
            kv_dtype=kv_dtype,
            kv_memory=kv_memory,
            profile_dirs=profile_dirs,
            vllm_version=vllm_version,
            gpu_memory_utilization=gpu_memory_utilization,
            quantization=quantization,
        )
    )
    name = model or config or "model"
    gpu_text = gpu or f"--gpu-memory {gpu_memory}"
    if not result.kv_budget_bytes or result.kv_budget_bytes <= 0 or not result.num_blocks:
        weights = result.weights_bytes_per_gpu or 0
        raise UsageError(
            f"{name}'s weights ({weights / 1e9:,.1f} GB per GPU at --tp {tp}) leave no room for a KV cache on "
            f"{result.gpu or gpu_text} ({(result.gpu_memory_bytes or 0) / 2**30:,.0f} GiB, vLLM's gpu_memory_utilization "
            f"{result.gpu_memory_utilization or 0.9:g})",
            where="--model/--gpu/--tp",
            tip="; ".join(s for s in result.suggestions if s.startswith("--tp"))
            or "raise --tp or pick a larger GPU"
            + f"; `kvtool estimate --model {name} {'--gpu ' + gpu if gpu else gpu_text}` shows the memory plan",
        )
    rates = _gpu_rates(gpu, result.model_dtype, overrides, profile_dirs, step_times)
    bw, why, peak, pwhy = rates.bandwidth_gb_s, rates.bandwidth_from, rates.peak_tflops, rates.peak_from
    kv_dtype_used = result.kv_dtype
    sources = []
    overhead = DEFAULT_STEP_OVERHEAD_MS if overrides.step_overhead_ms is None else overrides.step_overhead_ms
    entry = DEFAULT_TABLE_ENTRY_US if overrides.table_entry_us is None else overrides.table_entry_us
    params = float(result.weights_params or 0) / tp
    sources.append(f"weights {(result.weights_bytes_per_gpu or 0) / 1e9:,.2f} GB per GPU ({result.weights_method})")
    sources.append(f"KV {result.bytes_per_token_per_gpu:,} B per token per GPU ({kv_dtype_used})")
    sources.append(f"memory bandwidth {bw:,.0f} GB/s ({why})")
    sources.append(f"peak {peak:,.0f} TFLOP/s ({pwhy})")
    sources.append(
        f"step overhead {overhead:g} ms ({'--step-overhead-ms' if overrides.step_overhead_ms is not None else 'default'})"
    )
    sources.append(
        f"block-table entry {entry:g} us ({'--table-entry-us' if overrides.table_entry_us is not None else 'default'})"
    )
    return Hardware(
        model=result.model,
        gpu=result.gpu or gpu_text,
        tp=tp,
        kv_dtype=kv_dtype_used,
        # what a step streams: the weights less the rotary cos/sin cache, of which a step gathers only its positions' rows
        weights_bytes_per_gpu=int((result.weights_bytes_per_gpu or 0) - (result.rotary_cache_bytes_per_gpu or 0)),
        params_per_gpu=params,
        kv_bytes_per_token_per_gpu=int(result.bytes_per_token_per_gpu),
        num_layers=result.num_layers,
        attention_heads_per_gpu=max(1, result.num_attention_heads // tp),
        head_dim=result.head_dim,
        bandwidth_bytes_per_s=bw * 1e9,
        peak_flops_per_s=peak * 1e12,
        step_overhead_ms=overhead,
        table_entry_us=entry,
        kv_budget_bytes_per_gpu=int(result.kv_budget_bytes),
        max_num_batched_tokens=int(result.max_num_batched_tokens),
        max_num_seqs=int(result.max_num_seqs or 0),
        batch_defaults=serve_batch_defaults(result.gpu_memory_bytes, result.gpu, result.vllm_version),
        sources=tuple(sources),
        **model_kv_layout(model, config, tp, kv_dtype, profile_dirs),
    )


def model_kv_layout(
    model: str | None, config: str | None, tp: int, kv_dtype: str, profile_dirs: tuple[str, ...]
) -> dict[str, Any]:
    """The model's KV layout, as `kvtool estimate` lays it out (one resolution of the model, one layout rule), and
    its layers' kinds in order: Hardware's kv_layout and kv_layer_kinds."""
    from kvtool.estimate.estimator import EstimateRequest
    from kvtool.estimate.layout import kv_layout
    from kvtool.estimate.model import resolve_model

    spec = resolve_model(EstimateRequest(model=model, config=config, tp=tp, profile_dirs=profile_dirs)).spec
    return {"kv_layout": kv_layout(spec, kv_dtype, tp), "kv_layer_kinds": tuple(spec.kv_layer_kinds)}


def pool_blocks(hw: Hardware, block_size: int, kv_tokens: int | None = None) -> int:
    """vLLM's num_gpu_blocks for this block size: floor(KV budget / (block_size x bytes per token)), null included.

    With ``kv_tokens`` (an explicit budget in tokens) the pool is floor(kv_tokens / block_size) blocks.
    """
    if kv_tokens is not None:
        return kv_tokens // block_size
    return hw.kv_budget_bytes_per_gpu // (block_size * hw.kv_bytes_per_token_per_gpu)
