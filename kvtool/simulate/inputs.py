"""The inputs of `kvtool simulate` (the command and ``kvtool.api.simulate`` alike): option checks, the pool from
``--model``/``--gpu``, and the request lengths from a trace, an events file or a distribution."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvtool.core.errors import UsageError
from kvtool.simulate.lengths import (
    DEFAULT_OUTPUT_SHARE,
    DEFAULT_PARAMETRIC_REQUESTS,
    MAX_REQUEST_TOKENS,
    MAX_REQUESTS,
    RequestSet,
    load_event_lengths,
    load_trace,
    parametric_requests,
    sample_requests,
)
from kvtool.simulate.run import (
    DEFAULT_BLOCK_SIZES,
    MAX_KV_TOKENS,
    SimulateOptions,
    parse_block_sizes,
    planned_pool_tokens,
)
from kvtool.simulate.serving import DEFAULT_MAX_NUM_SEQS, CostModel


@dataclasses.dataclass(frozen=True)
class SimulateInputs:
    """Everything `kvtool simulate` (or ``kvtool.api.simulate``) was asked, as given; :func:`prepare` checks it."""

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
    block_sizes: str = ",".join(map(str, DEFAULT_BLOCK_SIZES))  # as --block-sizes takes them
    max_model_len: int | None = None
    kv_tokens: int | None = None
    model: str | None = None  # with gpu: the pool from estimate's planner
    gpu: str | None = None
    serve: bool = False
    qps: float | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    prefix_cache: bool = False
    split_pools: int | None = None  # threshold, tokens
    export_events: Path | None = None
    cost: CostModel = CostModel()


def prepare(inputs: SimulateInputs) -> tuple[RequestSet, SimulateOptions]:
    """Check the inputs, load the requests and resolve the pool: what :func:`~kvtool.simulate.run.run_simulation`
    takes.  UsageError / InputFileError name the option or file at fault."""
    sizes = parse_block_sizes(inputs.block_sizes)
    kv_tokens, kv_text = resolve_pool(inputs.kv_tokens, inputs.model, inputs.gpu)
    c = inputs.cost
    check_options(
        inputs.trace,
        inputs.from_events,
        inputs.dist,
        inputs.requests,
        inputs.output_share,
        inputs.shared_prefix,
        inputs.max_model_len,
        kv_tokens,
        inputs.qps,
        inputs.max_num_seqs,
        inputs.prefix_cache,
        inputs.split_pools,
        inputs.export_events,
        inputs.serve,
        (c.step_overhead_ms, c.token_us, c.kv_token_us, c.table_entry_us),
    )
    requests = load_requests(
        inputs.trace,
        inputs.from_events,
        inputs.dist,
        inputs.requests,
        inputs.seed,
        inputs.output_share,
        mean=inputs.mean,
        p99=inputs.p99,
        min_tokens=inputs.min_tokens,
        max_tokens=inputs.max_tokens,
        length=inputs.length,
        alpha=inputs.alpha,
    )
    options = SimulateOptions(
        block_sizes=sizes,
        shared_prefix_tokens=inputs.shared_prefix,
        max_model_len=inputs.max_model_len,
        kv_tokens=kv_tokens,
        kv_tokens_text=kv_text,
        serve=inputs.serve,
        qps=inputs.qps,
        seed=inputs.seed,
        max_num_seqs=inputs.max_num_seqs,
        prefix_cache=inputs.prefix_cache,
        split_threshold_tokens=inputs.split_pools,
        cost=inputs.cost,
        export_events=inputs.export_events,
    )
    return requests, options


def resolve_pool(kv_tokens: int | None, model: str | None, gpu: str | None) -> tuple[int | None, str | None]:
    """The KV budget in tokens and where it came from: ``--kv-tokens``, or estimate's plan for ``--model``/``--gpu``."""
    kv_text = "--kv-tokens" if kv_tokens is not None else None
    if model is not None or gpu is not None:
        if model is None or gpu is None:
            raise UsageError(
                "--model and --gpu go together (the pool of that model on that GPU)", where="--model/--gpu"
            )
        if kv_tokens is not None:
            raise UsageError("give either --kv-tokens or --model/--gpu, not both", where="--kv-tokens")
        kv_tokens, planned = planned_pool_tokens(model, gpu)
        kv_text = f"kvtool estimate's plan for {planned}"
    return kv_tokens, kv_text


def load_requests(
    trace: Path | None,
    from_events: Path | None,
    dist: str | None,
    requests: int | None,
    seed: int,
    output_share: float,
    **dist_params: float | None,
) -> RequestSet:
    """The requests to simulate: a trace or an events file (sampled to ``requests`` when given), else ``dist``
    with its parameters (``mean``, ``p99``, ``min_tokens``, ``max_tokens``, ``length``, ``alpha``)."""
    try:
        if trace is not None:
            reqs = load_trace(trace, output_share=output_share)
        elif from_events is not None:
            reqs = load_event_lengths(from_events)
        elif dist is None:
            raise UsageError("give a source of request lengths", where="--trace/--from-events/--dist")
        else:
            return parametric_requests(dist, requests or DEFAULT_PARAMETRIC_REQUESTS, seed, output_share, **dist_params)
        return sample_requests(reqs, requests, seed) if requests is not None else reqs
    except MemoryError:
        raise UsageError(
            f"not enough memory for {requests or DEFAULT_PARAMETRIC_REQUESTS:,} requests",
            where="--requests",
            tip="ask for fewer --requests",
        ) from None


def check_options(
    trace,
    from_events,
    dist,
    requests,
    output_share,
    shared_prefix,
    max_model_len,
    kv_tokens,
    qps,
    max_num_seqs,
    prefix_cache,
    split_pools,
    export_events,
    serve,
    cost,
) -> None:
    """Every check of `kvtool simulate`'s options that does not need the data: one UsageError naming the option."""
    if sum(x is not None for x in (trace, from_events, dist)) != 1:
        raise UsageError(
            "give exactly one source of lengths: --trace FILE, --from-events FILE or --dist NAME",
            where="--trace/--from-events/--dist",
        )
    for value, name, most in (
        (requests, "--requests", MAX_REQUESTS),
        (max_model_len, "--max-model-len", None),
        (kv_tokens, "--kv-tokens", MAX_KV_TOKENS),
        (split_pools, "--split-pools", MAX_REQUEST_TOKENS),
        (max_num_seqs, "--max-num-seqs", None),
    ):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be a positive integer, got {value}", where=name)
        if value is not None and most is not None and value > most:
            raise UsageError(f"{name} is too large: {value:,} (at most {most:,})", where=name)
    if shared_prefix < 0:
        raise UsageError(f"--shared-prefix must be 0 or more tokens, got {shared_prefix}", where="--shared-prefix")
    if shared_prefix > MAX_REQUEST_TOKENS:
        raise UsageError(
            f"--shared-prefix is too large: {shared_prefix:,} tokens (at most {MAX_REQUEST_TOKENS:,})",
            where="--shared-prefix",
        )
    if not 0 <= output_share < 1:
        raise UsageError(f"--output-share must be in [0, 1), got {output_share:g}", where="--output-share")
    if qps is not None and not qps > 0:
        raise UsageError(f"--qps must be a positive number, got {qps:g}", where="--qps")
    if prefix_cache and not shared_prefix:
        raise UsageError(
            "--prefix-cache needs --shared-prefix P (the tokens every prompt shares)", where="--prefix-cache"
        )
    for flag, value in (
        ("--qps", qps),
        ("--prefix-cache", prefix_cache or None),
        ("--split-pools", split_pools),
        ("--export-events", export_events),
    ):
        if value is not None and not serve:
            raise UsageError(f"{flag} applies to the serving simulation: add --serve", where=flag)
    if export_events is not None and export_events.is_dir():
        raise UsageError(
            "--export-events takes a file name (NAME.csv), not a folder", where=f"--export-events {export_events}"
        )
    if export_events is not None and not export_events.parent.is_dir():
        raise UsageError("the folder for the events file does not exist", where=f"--export-events {export_events}")
    for value, name in zip(cost, ("--step-overhead-ms", "--token-us", "--kv-token-us", "--table-entry-us")):
        if not value >= 0:
            raise UsageError(f"{name} must be 0 or more, got {value:g}", where=name)
