"""`kvtool simulate` end to end: requests in, a :class:`SimulateReport` out (no printing here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.simulate.results import SimulateReport
from kvtool.simulate.serving import DEFAULT_MAX_NUM_SEQS, CostModel

DEFAULT_BLOCK_SIZES = (8, 16, 32, 64, 128)

# The pool of --serve when no budget is given: what `kvtool estimate`'s planner gives this model on this GPU
# (vLLM's gpu_memory_utilization 0.9 and estimate's stated reserve), the model the default cost model describes.
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
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    prefix_cache: bool = False
    split_threshold_tokens: int | None = None
    cost: CostModel = CostModel()
    export_events: Path | None = None


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
            raise UsageError(f"block sizes must be positive integers, got {part!r}", where="--block-sizes") from None
        if value <= 0:
            raise UsageError(f"block sizes must be positive integers, got {value}", where="--block-sizes")
        if value > MAX_REQUEST_TOKENS:
            raise UsageError(
                f"block size {value:,} is above the longest request accepted ({MAX_REQUEST_TOKENS:,} tokens)",
                where="--block-sizes",
            )
        if value not in sizes:
            sizes.append(value)
    if not sizes:
        raise UsageError("no block sizes given", where="--block-sizes")
    return sizes


def run_simulation(
    requests,
    options: SimulateOptions,
    progress: Callable[[str, int, int], None] | None = None,
    keep_traces: bool = True,
) -> tuple[SimulateReport, dict[int, Any]]:
    """The static comparison, and with ``options.serve`` the serving simulation per block size.

    ``progress(label, done, total)`` is called during the serving simulation.  Returns the report and, with
    ``keep_traces``, the per-block-size :class:`~kvtool.simulate.serving.ServeTrace` (empty without --serve).
    """
    import numpy as np

    from kvtool.simulate.export import export_paths, write_events
    from kvtool.simulate.lengths import poisson_arrivals
    from kvtool.simulate.results import ServeSetup, cost_text, recommend
    from kvtool.simulate.serving import ServeConfig, simulate_serving
    from kvtool.simulate.static import compare_block_sizes

    static = compare_block_sizes(
        requests.prompt_tokens,
        requests.output_tokens,
        options.block_sizes,
        shared_prefix_tokens=options.shared_prefix_tokens,
        max_model_len=options.max_model_len,
        kv_tokens=options.kv_tokens,
    )
    serve_results = None
    setup = None
    traces: dict[int, Any] = {}
    exported: dict[int, str] = {}
    if options.serve:
        if options.qps is not None:
            arrival = poisson_arrivals(requests.count, options.qps, options.seed)
            arrivals_text = f"Poisson at {options.qps:g} requests/s (seed {options.seed})"
        elif requests.arrival_s is not None:
            arrival = requests.arrival_s
            arrivals_text = "from the trace's timestamps"
        else:
            arrival = np.zeros(requests.count)
            arrivals_text = "all at t=0 (an offline batch; give --qps for Poisson arrivals)"
        if options.kv_tokens is None:
            pool_tokens, planned = planned_pool_tokens(DEFAULT_POOL_MODEL, DEFAULT_POOL_GPU)
            pool_text = (
                f"{pool_tokens:,} tokens (the default: kvtool estimate's plan for {planned}; set "
                "--kv-tokens or --model/--gpu)"
            )
        else:
            pool_tokens = options.kv_tokens
            pool_text = f"{pool_tokens:,} tokens ({options.kv_tokens_text or '--kv-tokens'})"
        config = ServeConfig(
            pool_tokens=pool_tokens,
            max_num_seqs=options.max_num_seqs,
            cost=options.cost,
            shared_prefix_tokens=options.shared_prefix_tokens,
            prefix_cache=options.prefix_cache,
            split_threshold_tokens=options.split_threshold_tokens,
        )
        extras = []
        if options.prefix_cache:
            extras.append(f"prefix cache on ({options.shared_prefix_tokens} shared prompt tokens, full blocks)")
        if options.split_threshold_tokens is not None:
            extras.append(
                f"split pools at {options.split_threshold_tokens:,} tokens (final length), capacity in "
                "proportion to each class's tokens"
            )
        setup = ServeSetup(
            pool_tokens=pool_tokens,
            pool_is_default=options.kv_tokens is None,
            pool_text=pool_text,
            arrivals=arrivals_text,
            max_num_seqs=options.max_num_seqs,
            cost_model=options.cost,
            cost_text=cost_text(options.cost),
            extras="; ".join(extras) or "no prefix cache, one pool",
        )
        paths = export_paths(options.export_events, options.block_sizes) if options.export_events else {}
        serve_results = []
        for b in options.block_sizes:

            def step(done: int, b: int = b) -> None:
                if progress is not None:
                    progress(f"serve block {b}", done, requests.count)

            result, trace = simulate_serving(
                requests.prompt_tokens, requests.output_tokens, arrival, b, config, progress=step
            )
            serve_results.append(result)
            if keep_traces:
                traces[b] = trace
            if b in paths:
                write_events(trace, paths[b])
                exported[b] = str(paths[b])
    report = SimulateReport(
        source=requests.source,
        requests=requests.count,
        block_sizes=list(options.block_sizes),
        static=static,
        serve=serve_results,
        serve_setup=setup,
        recommendations=recommend(static, serve_results),
        exported_events=exported,
        kv_tokens_text=None if options.kv_tokens is None else options.kv_tokens_text or "--kv-tokens",
    )
    return report, traces
