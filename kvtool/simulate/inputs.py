"""The inputs of `kvtool simulate` (the command and ``kvtool.api.simulate`` alike): option checks and the request
lengths from a trace, an events file or a distribution, turned into :class:`~kvtool.simulate.run.SimulateOptions`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from kvtool.core.errors import UsageError
from kvtool.estimate.vllm_versions import NEWEST_RELEASE
from kvtool.simulate.lengths import DEFAULT_OUTPUT_SHARE, RequestSet
from kvtool.simulate.run import DEFAULT_BLOCK_SIZES, SimulateOptions


@dataclasses.dataclass(frozen=True)
class SimulateInputs:
    """Everything `kvtool simulate` (or ``kvtool.api.simulate``) was asked, as given; :func:`prepare` checks it.

    Field names are the CLI's options (docs/cli.md); sizes in tokens, rates in requests/s.
    """

    trace: Path | None = None
    from_events: Path | None = None
    dist: str | None = None
    requests: int | None = None  # sample this many (default: every trace row; DEFAULT_PARAMETRIC_REQUESTS for dist)
    seed: int = 0
    mean: float | None = None  # lognormal: mean final length, tokens
    p99: float | None = None
    min_tokens: float | None = None  # uniform / zipf
    max_tokens: float | None = None
    length: float | None = None  # fixed
    alpha: float | None = None  # zipf
    output_share: float = DEFAULT_OUTPUT_SHARE
    shared_prefix: int = 0  # tokens
    block_size: str = ",".join(map(str, DEFAULT_BLOCK_SIZES))  # a comma list, as --block-size takes it
    max_model_len: int | None = None
    kv_tokens: int | None = None
    model: str | None = None
    config: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None  # a size such as 80GiB, instead of --gpu
    profiles: tuple[str, ...] = ()  # extra profile directories, as estimate takes them
    tp: int = 1
    kv_dtype: str = "auto"
    vllm_version: str = NEWEST_RELEASE  # whose rules size the pool and pick the scheduler defaults
    bandwidth_gb_s: float | None = None
    peak_tflops: float | None = None
    step_overhead_ms: float | None = None
    table_entry_us: float | None = None
    serve: bool = False
    qps: float | None = None
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU (kvtool.estimate.serve_defaults)
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = 0
    prefix_cache: bool = True
    prefix_variant_share: float = 0.0
    split_pools: int | None = None  # threshold, tokens
    slo_ttft_ms: float | None = None
    export_events: Path | None = None
    # vLLM's --kv-offloading-size as a comma list of GiB (0: no CPU tier), its backend, and the host-to-device rate
    # of a load (decimal GB/s; None: kvtool.simulate.offload_tier.DEFAULT_H2D_GB_S)
    kv_offloading_size: str | None = None
    kv_offloading_backend: str = "native"
    h2d_bandwidth_gb_s: float | None = None


def inputs_from(values: Mapping[str, Any]) -> SimulateInputs:
    """The :class:`SimulateInputs` named in ``values`` (the CLI's or the API's arguments, by option name)."""
    return SimulateInputs(**{f.name: values[f.name] for f in dataclasses.fields(SimulateInputs) if f.name in values})


def prepare(i: SimulateInputs) -> tuple[RequestSet, SimulateOptions]:
    """Check the inputs (UsageError names the option) and load the requests; return them with the run's options."""
    from kvtool.simulate.costs import CostOverrides
    from kvtool.simulate.run import parse_block_sizes

    source = _LengthSource(
        i.trace,
        i.from_events,
        i.dist,
        i.requests,
        i.seed,
        i.output_share,
        i.mean,
        i.p99,
        i.min_tokens,
        i.max_tokens,
        i.length,
        i.alpha,
    )
    serve_only = {
        "--qps": i.qps,
        "--split-pools": i.split_pools,
        "--export-events": i.export_events,
        "--slo-ttft-ms": i.slo_ttft_ms,
        "--max-num-batched-tokens": i.max_num_batched_tokens,
        "--prefix-variant-share": i.prefix_variant_share or None,
        "--long-prefill-token-threshold": i.long_prefill_token_threshold or None,
        "--kv-offloading-size": i.kv_offloading_size,
        "--h2d-bandwidth-gb-s": i.h2d_bandwidth_gb_s,
    }
    _check_options(source, i.shared_prefix, i.max_model_len, i.kv_tokens, i.max_num_seqs, i.serve, serve_only)
    _check_serving(i)
    _check_costs(i)
    offload_sizes = _check_offloading(i)
    reqs = _load_requests(source)
    options = SimulateOptions(
        block_sizes=parse_block_sizes(i.block_size),
        shared_prefix_tokens=i.shared_prefix,
        max_model_len=i.max_model_len,
        kv_tokens=i.kv_tokens,
        kv_tokens_text="--kv-tokens" if i.kv_tokens is not None else None,
        serve=i.serve,
        qps=i.qps,
        seed=i.seed,
        max_num_seqs=i.max_num_seqs,
        max_num_batched_tokens=i.max_num_batched_tokens,
        long_prefill_token_threshold=i.long_prefill_token_threshold,
        prefix_cache=i.prefix_cache,
        prefix_variant_share=i.prefix_variant_share,
        split_threshold_tokens=i.split_pools,
        model=i.model,
        config=i.config,
        gpu=i.gpu,
        gpu_memory=i.gpu_memory,
        profile_dirs=tuple(i.profiles),
        tp=i.tp,
        kv_dtype=i.kv_dtype,
        vllm_version=i.vllm_version,
        cost=CostOverrides(i.bandwidth_gb_s, i.peak_tflops, i.step_overhead_ms, i.table_entry_us),
        slo_ttft_ms=i.slo_ttft_ms,
        export_events=i.export_events,
        offload_sizes_gib=tuple(offload_sizes),
        offload_backend=i.kv_offloading_backend,
        h2d_bandwidth_gb_s=i.h2d_bandwidth_gb_s,
    )
    return reqs, options


def _check_offloading(i: SimulateInputs) -> list[float]:
    """--kv-offloading-size: the sizes (GiB) of the CPU-tier curve, refused where the simulation does not model
    the tier (no prefix cache, split pools, LMCache, a release without native offloading)."""
    from kvtool.estimate.offload import check_offload_options
    from kvtool.simulate.offload_tier import parse_offloading_sizes

    if i.kv_offloading_size is None:
        if i.kv_offloading_backend != "native":
            raise UsageError("--kv-offloading-backend needs --kv-offloading-size", where="--kv-offloading-backend")
        return []
    sizes = parse_offloading_sizes(i.kv_offloading_size)
    if not i.prefix_cache:
        raise UsageError(
            "the CPU tier is looked up behind the prefix cache: --kv-offloading-size needs --prefix-cache",
            where="--kv-offloading-size",
        )
    if i.split_pools is not None:
        raise UsageError("kvtool does not model one CPU tier behind split pools", where="--kv-offloading-size")
    if i.kv_offloading_backend != "native":
        # LMCache keeps chunks of its own (chunk_size 256 tokens, its own eviction) behind its connector
        raise UsageError(
            f"kvtool simulate does not model LMCache's CPU tier (--kv-offloading-backend {i.kv_offloading_backend}), "
            "only vLLM's native offloading connector",
            where="--kv-offloading-backend",
            tip="use --kv-offloading-backend native; `kvtool estimate ... --kv-offloading-backend lmcache` sizes "
            "LMCache's tier",
        )
    check_offload_options(None, i.kv_offloading_backend, i.vllm_version)
    for size in sizes:
        if size > 0:
            check_offload_options(size, i.kv_offloading_backend, i.vllm_version)
    if i.h2d_bandwidth_gb_s is not None and not 0 < i.h2d_bandwidth_gb_s < math.inf:
        raise UsageError(
            f"--h2d-bandwidth-gb-s must be a positive number, got {i.h2d_bandwidth_gb_s:g}",
            where="--h2d-bandwidth-gb-s",
        )
    return sizes


def _check_costs(i: SimulateInputs) -> None:
    for fixed, name in ((i.step_overhead_ms, "--step-overhead-ms"), (i.table_entry_us, "--table-entry-us")):
        if fixed is not None and not 0 <= fixed < math.inf:  # inf ended in an IndexError traceback
            raise UsageError(f"{name} must be a finite number, 0 or more, got {fixed:g}", where=name)
    for value, name in (
        (i.bandwidth_gb_s, "--bandwidth-gb-s"),
        (i.peak_tflops, "--peak-tflops"),
        (i.slo_ttft_ms, "--slo-ttft-ms"),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be a positive number, got {value:g}", where=name)


@dataclasses.dataclass(frozen=True)
class _LengthSource:
    """Where request lengths come from: a trace, an events file or a parametric distribution, with its options."""

    trace: Optional[Path]
    from_events: Optional[Path]
    dist: Optional[str]
    requests: Optional[int]
    seed: int
    output_share: float
    mean: Optional[float]
    p99: Optional[float]
    min_tokens: Optional[float]
    max_tokens: Optional[float]
    length: Optional[float]
    alpha: Optional[float]


def _load_requests(src: _LengthSource):
    from kvtool.simulate.lengths import (
        DEFAULT_PARAMETRIC_REQUESTS,
        load_event_lengths,
        load_trace,
        parametric_requests,
        sample_requests,
    )

    try:
        if src.trace is not None or src.from_events is not None:
            if src.trace is not None:
                reqs = load_trace(src.trace, output_share=src.output_share)
            else:
                reqs = load_event_lengths(src.from_events)  # type: ignore[arg-type]
            return sample_requests(reqs, src.requests, src.seed) if src.requests is not None else reqs
        return parametric_requests(
            src.dist,  # type: ignore[arg-type]
            src.requests or DEFAULT_PARAMETRIC_REQUESTS,
            src.seed,
            src.output_share,
            mean=src.mean,
            p99=src.p99,
            min_tokens=src.min_tokens,
            max_tokens=src.max_tokens,
            length=src.length,
            alpha=src.alpha,
        )
    except MemoryError:
        raise UsageError(
            f"not enough memory for {src.requests or DEFAULT_PARAMETRIC_REQUESTS:,} requests",
            where="--requests",
            tip="ask for fewer --requests",
        ) from None


def _check_options(
    src: _LengthSource,
    shared_prefix: int,
    max_model_len: Optional[int],
    kv_tokens: Optional[int],
    max_num_seqs: Optional[int],
    serve: bool,
    serve_only: dict,
) -> None:
    if sum(x is not None for x in (src.trace, src.from_events, src.dist)) != 1:
        raise UsageError(
            "give exactly one source of lengths: --trace FILE, --from-events FILE or --dist NAME",
            where="--trace/--from-events/--dist",
        )
    from kvtool.simulate.lengths import MAX_REQUEST_TOKENS, MAX_REQUESTS
    from kvtool.simulate.run import MAX_KV_TOKENS

    _refuse_unused_parameters(src)

    for value, name, most in (
        (src.requests, "--requests", MAX_REQUESTS),
        (max_model_len, "--max-model-len", None),
        (kv_tokens, "--kv-tokens", MAX_KV_TOKENS),
        (serve_only["--split-pools"], "--split-pools", MAX_REQUEST_TOKENS),
        (max_num_seqs, "--max-num-seqs", None),
        (serve_only["--max-num-batched-tokens"], "--max-num-batched-tokens", None),
    ):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be a positive integer, got {value}", where=name)
        if value is not None and most is not None and value > most:
            raise UsageError(f"{name} is too large: {value:,} (at most {most:,})", where=name)
    if src.seed < 0:  # numpy's generators take none: it was a ValueError traceback
        raise UsageError(f"--seed must be 0 or more, got {src.seed}", where="--seed")
    threshold = serve_only["--long-prefill-token-threshold"]
    if threshold is not None and threshold < 0:  # was taken as 0 (off) without a word
        raise UsageError(
            f"--long-prefill-token-threshold must be 0 (off) or more tokens, got {threshold}",
            where="--long-prefill-token-threshold",
        )
    if shared_prefix < 0:
        raise UsageError(f"--shared-prefix must be 0 or more tokens, got {shared_prefix}", where="--shared-prefix")
    if shared_prefix > MAX_REQUEST_TOKENS:
        raise UsageError(
            f"--shared-prefix is too large: {shared_prefix:,} tokens (at most {MAX_REQUEST_TOKENS:,})",
            where="--shared-prefix",
        )
    if not 0 <= src.output_share < 1:
        raise UsageError(f"--output-share must be in [0, 1), got {src.output_share:g}", where="--output-share")
    qps = serve_only["--qps"]
    if qps is not None and not qps > 0:
        raise UsageError(f"--qps must be a positive number, got {qps:g}", where="--qps")
    for flag, value in serve_only.items():
        if value is not None and not serve:
            raise UsageError(f"{flag} applies to the serving simulation: add --serve", where=flag)


# The parameters each --dist reads (parametric_lengths); the others would be ignored.
_DIST_PARAMETERS = {
    "lognormal": ("--mean", "--p99"),
    "uniform": ("--min", "--max"),
    "fixed": ("--length",),
    "zipf": ("--alpha", "--min", "--max"),
}


def _refuse_unused_parameters(src: _LengthSource) -> None:
    """A distribution parameter that the chosen source does not read is an error, not silently ignored (``--trace
    t.csv --length 100`` looked like a cap on the lengths and did nothing)."""
    if src.dist is not None and src.dist not in _DIST_PARAMETERS:
        return  # the unknown name is the error to report (parametric_lengths)
    used = _DIST_PARAMETERS.get(src.dist or "", ())
    source = f"--dist {src.dist}" if src.dist else ("--trace" if src.trace is not None else "--from-events")
    given = {
        "--mean": src.mean,
        "--p99": src.p99,
        "--min": src.min_tokens,
        "--max": src.max_tokens,
        "--length": src.length,
        "--alpha": src.alpha,
    }
    for flag, value in given.items():
        if value is not None and flag not in used:
            owners = " and ".join(f"--dist {name}" for name, names in _DIST_PARAMETERS.items() if flag in names)
            raise UsageError(f"{flag} is a parameter of {owners}, not of {source}: it would be ignored", where=flag)


def _check_serving(i: SimulateInputs) -> None:
    tp, variant_share, shared_prefix, export_events = i.tp, i.prefix_variant_share, i.shared_prefix, i.export_events
    if i.model is not None and i.config is not None:
        raise UsageError("give either --model or --config, not both", where="--model/--config")
    for value, flag, tip in (
        (i.model, "--model", "'kvtool models' lists the models"),
        (i.config, "--config", "give a config.json or its folder"),
        (i.gpu, "--gpu", "'kvtool models' lists the GPUs"),
        (i.gpu_memory, "--gpu-memory", "give a size such as 80GiB"),
    ):
        if value is not None and not value.strip():  # an empty --gpu fell back to the default GPU without a word
            raise UsageError(f"{flag} is empty", where=flag, tip=tip)
    if i.gpu is not None and i.gpu_memory is not None:
        raise UsageError("give --gpu or --gpu-memory, not both", where="--gpu")
    if tp <= 0:
        raise UsageError(f"--tp must be a positive integer, got {tp}", where="--tp")
    if not 0 <= variant_share <= 1:
        raise UsageError(
            f"--prefix-variant-share must be in [0, 1], got {variant_share:g}", where="--prefix-variant-share"
        )
    if variant_share and not shared_prefix:
        raise UsageError("--prefix-variant-share needs --shared-prefix P", where="--prefix-variant-share")
    if export_events is not None and export_events.is_dir():
        raise UsageError(
            "--export-events takes a file name (NAME.csv), not a folder", where=f"--export-events {export_events}"
        )
    if export_events is not None and export_events.parent.is_file():  # was "the folder ... does not exist"
        raise UsageError(f"{export_events.parent} is a file, not a folder", where=f"--export-events {export_events}")
    if export_events is not None and not export_events.parent.is_dir():
        raise UsageError("the folder for the events file does not exist", where=f"--export-events {export_events}")
