"""`kvtool simulate` end to end: requests in, a :class:`SimulateReport` out (no printing here).

Phases: the static comparison; with --serve, the hardware (model and GPU through estimate's resolution), the
arrivals, the prompts' prefix structure, then the engine per block size; the recommendation last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.estimate.vllm_versions import NEWEST_RELEASE
from kvtool.simulate.costs import CostOverrides, Hardware
from kvtool.simulate.results import SimulateReport

DEFAULT_BLOCK_SIZES = (8, 16, 32, 64, 128)

# The model and GPU of --serve when none is given: the step times and the pool are this model on this GPU.
DEFAULT_POOL_MODEL = "llama-2-7b"
DEFAULT_POOL_GPU = "h100-80gb"


def planned_pool_tokens(model: str, gpu: str) -> tuple[int, str]:
    """KV-cache tokens of ``model`` on ``gpu`` from the estimate command's capacity planner, and a description."""
    from kvtool.estimate.estimator import kv_budget_tokens

    capacity = kv_budget_tokens(model=model, gpu=gpu)
    return capacity.kv_cache_tokens, f"{model} on {gpu} ({capacity.num_blocks:,} blocks of {capacity.block_size})"


@dataclasses.dataclass(frozen=True)
class SimulateOptions:
    block_sizes: list[int]
    shared_prefix_tokens: int = 0
    max_model_len: int | None = None
    kv_tokens: int | None = None
    kv_tokens_text: str | None = None  # where the budget came from, e.g. "--kv-tokens"
    serve: bool = False
    qps: float | None = None
    seed: int = 0
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU (kvtool.estimate.serve_defaults)
    max_num_batched_tokens: int | None = None  # None: vllm serve's default for the GPU (the same rule)
    long_prefill_token_threshold: int = 0
    prefix_cache: bool = True
    prefix_variant_share: float = 0.0
    split_threshold_tokens: int | None = None
    model: str | None = None
    config: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None  # a GPU by its memory instead of --gpu (no step times without the rates)
    profile_dirs: tuple[str, ...] = ()
    tp: int = 1
    kv_dtype: str = "auto"
    vllm_version: str = NEWEST_RELEASE
    gpu_memory_utilization: float | None = None  # estimate's (None: vLLM's 0.9); kvtool plan --qps sets it
    quantization: str | None = None  # vLLM's --quantization, as estimate takes it; kvtool plan --qps sets it
    cost: CostOverrides = CostOverrides()
    slo_ttft_ms: float | None = None
    export_events: Path | None = None
    offload_sizes_gib: tuple[float, ...] = ()  # --kv-offloading-size: the CPU-tier curve's sizes (0: none)
    offload_backend: str = "native"
    h2d_bandwidth_gb_s: float | None = None  # None: offload_tier.DEFAULT_H2D_GB_S


# The largest KV budget accepted (tokens): a thousand times the pool of a thousand 80 GB GPUs, low enough that
# block counts and their sums stay inside int64.
MAX_KV_TOKENS = 10**15


def parse_block_sizes(text: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32]; every entry a positive integer up to MAX_REQUEST_TOKENS, no duplicates."""
    from kvtool.simulate.lengths import MAX_REQUEST_TOKENS

    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise UsageError(f"block sizes must be positive integers, got {part!r}", where="--block-size") from None
        if value <= 0:
            raise UsageError(f"block sizes must be positive integers, got {value}", where="--block-size")
        if value > MAX_REQUEST_TOKENS:
            raise UsageError(
                f"block size {value:,} is above the longest request accepted ({MAX_REQUEST_TOKENS:,} tokens)",
                where="--block-size",
            )
        if value not in sizes:
            sizes.append(value)
    if not sizes:
        raise UsageError("no block sizes given", where="--block-size")
    return sizes


def resolve_serving_hardware(options: SimulateOptions) -> Hardware:
    """The model and GPU of the serving simulation (the documented default pair when none is given)."""
    from kvtool.simulate.costs import resolve_hardware

    model = options.model
    if model is None and options.config is None:
        model = DEFAULT_POOL_MODEL
    return resolve_hardware(
        model=model,
        config=options.config,
        gpu=None if options.gpu_memory is not None else options.gpu or DEFAULT_POOL_GPU,
        gpu_memory=options.gpu_memory,
        profile_dirs=options.profile_dirs,
        tp=options.tp,
        kv_dtype=options.kv_dtype,
        vllm_version=options.vllm_version,
        overrides=options.cost,
        step_times=options.serve,
        gpu_memory_utilization=options.gpu_memory_utilization,
        quantization=options.quantization,
    )


def _gpu_text(options: SimulateOptions) -> str:
    """The GPU as the user named it (or the default)."""
    if options.gpu_memory is not None:
        return f"a {options.gpu_memory} GPU"
    return options.gpu or DEFAULT_POOL_GPU


def _gpu_given(options: SimulateOptions) -> bool:
    return options.gpu is not None or options.gpu_memory is not None


def scheduler_defaults_text(options: SimulateOptions, hw: Hardware) -> tuple[str, ...]:
    """The scheduler defaults the serving simulation took, in words (the rule `kvtool estimate` states)."""
    said = []
    if options.max_num_seqs is None:
        said.append(hw.batch_defaults.max_num_seqs_words())
    if options.max_num_batched_tokens is None:
        said.append(hw.batch_defaults.max_num_batched_tokens_words())
    return tuple(said)


@dataclasses.dataclass(frozen=True)
class _Arrivals:
    times_s: Any
    text: str


def arrivals_for(requests, options: SimulateOptions) -> _Arrivals:
    """The arrival times of the serving simulation: Poisson at --qps, else the trace's, else all at t=0."""
    import numpy as np

    from kvtool.simulate.lengths import poisson_arrivals

    if options.qps is not None:
        return _Arrivals(
            poisson_arrivals(requests.count, options.qps, options.seed),
            f"Poisson at {options.qps:g} requests/s (seed {options.seed})",
        )
    if requests.arrival_s is not None:
        return _Arrivals(requests.arrival_s, "from the trace's timestamps")
    return _Arrivals(np.zeros(requests.count), "all at t=0 (an offline batch; give --qps for Poisson arrivals)")


def _pool_text(options: SimulateOptions, hw: Hardware) -> str:
    if options.kv_tokens is not None:
        return f"{options.kv_tokens:,} tokens ({options.kv_tokens_text or '--kv-tokens'})"
    text = (
        f"{hw.kv_budget_bytes_per_gpu / 2**30:,.2f} GiB of KV per GPU (kvtool estimate's plan for "
        f"{_model_name(options)} on {_gpu_text(options)}, tp {hw.tp})"
    )
    if not _gpu_given(options) and options.model is None and options.config is None:
        text += "; the default: set --kv-tokens or --model/--gpu"
    return text


def _model_name(options: SimulateOptions) -> str:
    return options.model or options.config or DEFAULT_POOL_MODEL


def _extras(options: SimulateOptions, requests) -> str:
    parts = []
    if not options.prefix_cache:
        parts.append("prefix cache off")
    elif requests.shared is not None:
        parts.append("prefix cache on (the prompts' own token ids / hash ids)")
    elif options.shared_prefix_tokens:
        variant = (
            f", {options.prefix_variant_share:.0%} with a variant last token" if options.prefix_variant_share else ""
        )
        parts.append(f"prefix cache on ({options.shared_prefix_tokens:,}-token shared system prompt{variant})")
    else:
        parts.append("prefix cache on (prompts unrelated: hits only on a preempted request's own blocks)")
    if options.split_threshold_tokens is not None:
        parts.append(
            f"split pools at {options.split_threshold_tokens:,} tokens (final length), capacity in proportion to "
            "each class's tokens"
        )
    return "; ".join(parts)


def serve_requests(
    requests,
    options: SimulateOptions,
    progress,
    keep_traces: bool,
    record_events: bool = False,
    hardware: Hardware | None = None,
):
    """The serving simulation per block size: results, setup, traces and exported files (`kvtool simulate --serve`,
    and `kvtool plan --qps` once per candidate, which passes the ``hardware`` it resolved already from ``options``)."""
    from kvtool.simulate.export import export_paths, write_events
    from kvtool.simulate.results import ServeSetup, cost_text
    from kvtool.simulate.serving import ServeConfig, simulate_serving
    from kvtool.simulate.workloads import build_prompts

    hw = hardware if hardware is not None else resolve_serving_hardware(options)
    arrivals = arrivals_for(requests, options)
    prompts = build_prompts(requests, options.shared_prefix_tokens, options.prefix_variant_share, options.seed)
    mnbt = options.max_num_batched_tokens or hw.max_num_batched_tokens
    seqs = options.max_num_seqs or hw.max_num_seqs
    paths = export_paths(options.export_events, options.block_sizes) if options.export_events else {}
    config = ServeConfig(
        hardware=hw,
        kv_tokens=options.kv_tokens,
        max_num_seqs=seqs,
        max_num_batched_tokens=mnbt,
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        max_model_len=options.max_model_len,
        prefix_cache=options.prefix_cache,
        split_threshold_tokens=options.split_threshold_tokens,
        record_events=bool(paths) or record_events,
    )
    groups = {b: _model_groups(hw, b, options, mnbt) for b in options.block_sizes}
    pools = {b: _pool_blocks(hw, b, options.kv_tokens, groups[b]) for b in options.block_sizes}
    refuse_a_pool_without_room(requests, pools, null_block=True, options=options)
    tiers = _tier_sizes(options, hw) if options.offload_sizes_gib else {}  # refused models before any run
    results, traces, exported = [], {}, {}
    for b in options.block_sizes:

        def step(done: int, b: int = b) -> None:
            if progress is not None:
                progress(f"serve block {b}", done, requests.count)

        blocks = pools[b]
        result, trace = simulate_serving(
            prompts, requests.output_tokens, arrivals.times_s, b, config, blocks, step, groups=groups[b]
        )
        results.append(result)
        if keep_traces:
            traces[b] = trace
        if b in paths:
            write_events(trace, paths[b])
            exported[b] = str(paths[b])
    curve = _offload_curve(requests, options, tiers, config, pools, prompts, arrivals, results) if tiers else None
    setup = ServeSetup(
        pool_tokens=results[0].pool_tokens if results else 0,
        pool_is_default=options.kv_tokens is None and not _gpu_given(options),
        pool_text=_pool_text(options, hw),
        arrivals=arrivals.text,
        max_num_seqs=seqs,
        max_num_batched_tokens=mnbt,
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        hardware=hw,
        scheduler_defaults=scheduler_defaults_text(options, hw),
        cost_text=cost_text(hw),
        extras=_extras(options, requests),
        slo_ttft_ms=options.slo_ttft_ms,
    )
    return results, setup, traces, exported, curve


def _tier_sizes(options: SimulateOptions, hw) -> dict:
    """Per block size, the CPU tier of each --kv-offloading-size as `kvtool estimate` sizes it."""
    from kvtool.simulate.offload_tier import size_tiers

    model = options.model if options.model is not None or options.config is not None else DEFAULT_POOL_MODEL
    return {
        b: size_tiers(
            list(options.offload_sizes_gib),
            options.offload_backend,
            b,
            model=model,
            config=options.config,
            kv_budget_bytes=hw.kv_budget_bytes_per_gpu,
            tp=options.tp,
            kv_dtype=options.kv_dtype,
            profile_dirs=options.profile_dirs,
            vllm_version=options.vllm_version,
        )
        for b in options.block_sizes
    }


def _offload_curve(requests, options: SimulateOptions, tiers: dict, config, pools, prompts, arrivals, plain_results):
    """The serving simulation again per --kv-offloading-size, with the CPU tier behind the prefix cache."""
    from kvtool.simulate.offload_tier import DEFAULT_H2D_GB_S, CpuTier, OffloadCurve, offload_point
    from kvtool.simulate.serving import simulate_serving

    h2d = options.h2d_bandwidth_gb_s or DEFAULT_H2D_GB_S
    h2d_from = "--h2d-bandwidth-gb-s" if options.h2d_bandwidth_gb_s else "default: PCIe 5.0 x16, pinned host memory"
    points, sizing = [], ""
    for b, plain in zip(options.block_sizes, plain_results):
        sizes = tiers[b]
        sizing = sizing or next((s.method for s in sizes if s.size_gib > 0), "")
        for size in sizes:
            tier = CpuTier(size.cpu_kv_blocks, size.bytes_per_cpu_block, h2d * 1e9)
            result, trace = simulate_serving(
                prompts, requests.output_tokens, arrivals.times_s, b, config, pools[b], tier=tier
            )
            points.append(offload_point(b, size, tier, result, trace, plain, prompts))
    return OffloadCurve(options.offload_backend, h2d, h2d_from, sizing, points)


def _static_groups(options: SimulateOptions) -> dict | None:
    """Per block size, the KV-cache groups of --model / --config for the static comparison (None: no model given),
    or the one-line reason vLLM would not run the model at that block size (a hybrid's raised block, a kind not
    simulated)."""
    from kvtool.simulate.costs import model_kv_layout
    from kvtool.simulate.grouped import model_groups

    if options.model is None and options.config is None:
        return None
    kv = model_kv_layout(options.model, options.config, options.tp, options.kv_dtype, options.profile_dirs)
    max_len = options.max_model_len or (1 << 40)
    # the admission cap (in-flight tokens) is not used by the static count: the blocks a request holds at its end
    in_flight = options.max_num_batched_tokens or 2048
    out: dict = {}
    for b in options.block_sizes:
        try:
            out[b] = model_groups(kv["kv_layout"], b, max_len, in_flight, kv["kv_layer_kinds"])
        except UsageError as exc:
            out[b] = exc.message
    return out


def _model_groups(hw, block_size: int, options: SimulateOptions, max_num_batched_tokens: int):
    """vLLM's KV-cache groups for the model at this block size (a kind not simulated is refused here).  The cap of
    sliding / chunked groups counts one batch in flight: the simulated scheduler is the synchronous one."""
    from kvtool.simulate.grouped import model_groups

    if hw.kv_layout is None:
        return None
    max_len = options.max_model_len or (1 << 40)
    return model_groups(hw.kv_layout, block_size, max_len, max_num_batched_tokens, hw.kv_layer_kinds)


def _pool_blocks(hw, block_size: int, kv_tokens: int | None, groups) -> int:
    """num_gpu_blocks: one full-attention group as :func:`pool_blocks`; several groups share one pool of
    budget // page // layers per group blocks (vLLM's split, kvtool.estimate.capacity.vllm_groups)."""
    from kvtool.simulate.costs import pool_blocks

    if groups is None or not groups.specs or kv_tokens is not None:
        return pool_blocks(hw, block_size, kv_tokens)
    return groups.num_blocks(hw.kv_budget_bytes_per_gpu)


def refuse_a_pool_without_room(requests, pools: dict[int, int], *, null_block: bool, options: SimulateOptions) -> None:
    """A pool that cannot hold even the shortest request alone, at every block size, is no question to answer.

    ``pools``: blocks per block size.  A request of L tokens needs ceil(L / b) blocks; with ``null_block`` (the
    serving simulation, as vLLM's pool: block 0 is never handed out) one block fewer is usable.  It printed a
    "Recommendation (pick)" of 0 requests and exited 0; now it is a usage error (exit 2) naming the pool, the
    request's blocks and the smallest budget that holds it (docs/simulate.md).
    """
    shortest = int((requests.prompt_tokens + requests.output_tokens).min())
    reserved = 1 if null_block else 0
    if any(pools[b] - reserved >= -(-shortest // b) for b in pools):
        return
    b = min(pools, key=lambda size: abs(size - 16))  # vLLM's default block size, or the nearest compared
    need = min((-(-shortest // size) + reserved) * size for size in pools)
    sizes = ", ".join(str(size) for size in sorted(pools))
    compared = f"no block size compared ({sizes}) holds it" if len(pools) > 1 else f"block size {sizes} does not"
    budget = f"--kv-tokens {need:,} or more (what the shortest request needs at its best block size)"
    if options.kv_tokens is not None:
        where, fix = "--kv-tokens", f"give {budget}"
    else:
        where = f"--gpu {options.gpu}" if options.gpu else "--model"
        fix = f"a GPU with more memory, a smaller model, {budget}"
    usable = f", {max(pools[b] - 1, 0):,} usable (block 0 is vLLM's null block)" if null_block else ""
    raise UsageError(
        f"the KV pool cannot hold one request: {pools[b]:,} blocks of {b} tokens{usable}, and the shortest request "
        f"({shortest:,} tokens) needs {-(-shortest // b):,}; {compared}",
        where=where,
        tip=f"{fix}, or shorter requests",
    )


def run_simulation(
    requests,
    options: SimulateOptions,
    progress: Callable[[str, int, int], None] | None = None,
    keep_traces: bool = True,
    record_events: bool = False,
) -> tuple[SimulateReport, dict[int, Any]]:
    """The static comparison, and with ``options.serve`` the serving simulation per block size.

    ``progress(label, done, total)`` is called during the serving simulation.  Returns the report and, with
    ``keep_traces``, the per-block-size :class:`~kvtool.simulate.serving.ServeTrace` (empty without --serve).
    """
    from kvtool.simulate.results import recommend
    from kvtool.simulate.static import compare_block_sizes

    kv_tokens = options.kv_tokens
    if kv_tokens is None and _gpu_given(options):
        hw = resolve_serving_hardware(options)
        kv_tokens = hw.kv_budget_bytes_per_gpu // hw.kv_bytes_per_token_per_gpu
        options = dataclasses.replace(
            options, kv_tokens_text=f"kvtool estimate's plan for {_model_name(options)} on {_gpu_text(options)}"
        )
    if kv_tokens is not None:
        pools = {b: kv_tokens // b for b in options.block_sizes}
        refuse_a_pool_without_room(requests, pools, null_block=options.serve, options=options)
    static = compare_block_sizes(
        requests.prompt_tokens,
        requests.output_tokens,
        options.block_sizes,
        shared_prefix_tokens=options.shared_prefix_tokens,
        max_model_len=options.max_model_len,
        kv_tokens=kv_tokens,
        groups=_static_groups(options),
    )
    serve_results, setup, traces, exported, curve = None, None, {}, {}, None
    if options.serve:
        serve_results, setup, traces, exported, curve = serve_requests(
            requests, options, progress, keep_traces, record_events
        )
    report = SimulateReport(
        source=requests.source,
        requests=requests.count,
        block_sizes=list(options.block_sizes),
        static=static,
        serve=serve_results,
        serve_setup=setup,
        recommendations=recommend(static, serve_results, options.slo_ttft_ms),
        exported_events=exported,
        kv_tokens_text=None if kv_tokens is None else options.kv_tokens_text or "--kv-tokens",
        offload_curve=curve,
    )
    return report, traces
