"""`kvtool simulate`: block-size trade-offs against a real or sampled request-length distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvtool.cli.options import json_option
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress
from kvtool.core.errors import UsageError
from kvtool.simulate.lengths import DEFAULT_OUTPUT_SHARE, DEFAULT_PARAMETRIC_REQUESTS
from kvtool.simulate.run import DEFAULT_BLOCK_SIZES, DEFAULT_POOL_GPU, DEFAULT_POOL_MODEL
from kvtool.simulate.serving import DEFAULT_MAX_NUM_SEQS, CostModel

_COST_DEFAULTS = CostModel()

_LENGTHS = "Request lengths"
_STATIC = "Static comparison"
_SERVE = "Serving simulation (--serve)"
_COST = "Step-time cost model (--serve)"
_OUT = "Output"


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    @handle_errors
    def command(
        trace: Optional[Path] = typer.Option(
            None,
            "--trace",
            help="CSV or JSON-lines trace of real requests "
            "(Azure, Vidur, generic prompt_tokens/output_tokens or length, "
            "LLMServingSim).",
            rich_help_panel=_LENGTHS,
        ),
        from_events: Optional[Path] = typer.Option(
            None,
            "--from-events",
            help="Lengths recovered from an events file of `kvtool analyze`'s schema.",
            rich_help_panel=_LENGTHS,
        ),
        dist: Optional[str] = typer.Option(
            None,
            "--dist",
            help="Parametric lengths: lognormal (--mean, --p99), "
            "uniform (--min, --max), fixed (--length), zipf (--alpha, --min, "
            "--max).",
            rich_help_panel=_LENGTHS,
        ),
        requests: Optional[int] = typer.Option(
            None,
            "--requests",
            help="Sample this many requests with "
            "replacement (default: every trace row; "
            f"{DEFAULT_PARAMETRIC_REQUESTS:,} for --dist).",
            rich_help_panel=_LENGTHS,
        ),
        seed: int = typer.Option(0, "--seed", help="Seed for sampling, --dist and --qps.", rich_help_panel=_LENGTHS),
        mean: Optional[float] = typer.Option(
            None, "--mean", help="lognormal: mean final length (tokens).", rich_help_panel=_LENGTHS
        ),
        p99: Optional[float] = typer.Option(
            None, "--p99", help="lognormal: 99th percentile (tokens).", rich_help_panel=_LENGTHS
        ),
        min_tokens: Optional[float] = typer.Option(
            None, "--min", help="uniform/zipf: shortest length (tokens).", rich_help_panel=_LENGTHS
        ),
        max_tokens: Optional[float] = typer.Option(
            None, "--max", help="uniform/zipf: longest length (tokens).", rich_help_panel=_LENGTHS
        ),
        length: Optional[float] = typer.Option(
            None, "--length", help="fixed: the one length (tokens).", rich_help_panel=_LENGTHS
        ),
        alpha: Optional[float] = typer.Option(
            None, "--alpha", help="zipf: exponent (P(L) ~ L^-alpha).", rich_help_panel=_LENGTHS
        ),
        output_share: float = typer.Option(
            DEFAULT_OUTPUT_SHARE,
            "--output-share",
            help="Share of output tokens when only a total length is known (--dist, a `length` trace).",
            rich_help_panel=_LENGTHS,
        ),
        shared_prefix: int = typer.Option(
            0, "--shared-prefix", help="Tokens common to every prompt (a system prompt).", rich_help_panel=_LENGTHS
        ),
        block_sizes: str = typer.Option(
            ",".join(map(str, DEFAULT_BLOCK_SIZES)),
            "--block-sizes",
            help="Comma-separated block sizes (tokens).",
            rich_help_panel=_STATIC,
        ),
        max_model_len: Optional[int] = typer.Option(
            None,
            "--max-model-len",
            help="Slots each request reserves in the contiguous baseline (default: the longest request).",
            rich_help_panel=_STATIC,
        ),
        kv_tokens: Optional[int] = typer.Option(
            None,
            "--kv-tokens",
            help="KV-cache budget in tokens (the pool; default: none "
            "for the static comparison, and for --serve kvtool estimate's plan for "
            f"{DEFAULT_POOL_MODEL} on {DEFAULT_POOL_GPU}).",
            rich_help_panel=_STATIC,
        ),
        model: Optional[str] = typer.Option(
            None,
            "--model",
            help="With --gpu: the pool from `kvtool estimate`'s capacity planner (a profile name, as estimate takes).",
            rich_help_panel=_STATIC,
        ),
        gpu: Optional[str] = typer.Option(
            None, "--gpu", help="With --model: the GPU profile (e.g. h100-80gb).", rich_help_panel=_STATIC
        ),
        serve: bool = typer.Option(
            False, "--serve", help="Also run the event-driven continuous-batching simulation.", rich_help_panel=_SERVE
        ),
        qps: Optional[float] = typer.Option(
            None,
            "--qps",
            help="Poisson arrivals at this rate (requests/s; default: the trace's timestamps, else all at t=0).",
            rich_help_panel=_SERVE,
        ),
        max_num_seqs: int = typer.Option(
            DEFAULT_MAX_NUM_SEQS,
            "--max-num-seqs",
            help="Most requests running at once (vLLM's default).",
            rich_help_panel=_SERVE,
        ),
        prefix_cache: bool = typer.Option(
            False,
            "--prefix-cache",
            help="Share the --shared-prefix's full blocks between running requests.",
            rich_help_panel=_SERVE,
        ),
        split_pools: Optional[int] = typer.Option(
            None,
            "--split-pools",
            metavar="THRESHOLD",
            help="Separate pools for requests longer than THRESHOLD tokens and the rest.",
            rich_help_panel=_SERVE,
        ),
        export_events: Optional[Path] = typer.Option(
            None,
            "--export-events",
            help="Write the simulated events in "
            "`kvtool analyze`'s schema (NAME-bB.csv per block size when "
            "several; .csv.gz or .parquet by the name).",
            rich_help_panel=_SERVE,
        ),
        step_overhead_ms: float = typer.Option(
            _COST_DEFAULTS.step_overhead_ms, "--step-overhead-ms", help="Fixed time per step.", rich_help_panel=_COST
        ),
        token_us: float = typer.Option(
            _COST_DEFAULTS.token_us,
            "--token-us",
            help="Time per token computed (prefill or decode).",
            rich_help_panel=_COST,
        ),
        kv_token_us: float = typer.Option(
            _COST_DEFAULTS.kv_token_us,
            "--kv-token-us",
            help="Time to read one KV slot (whole blocks are read).",
            rich_help_panel=_COST,
        ),
        table_entry_us: float = typer.Option(
            _COST_DEFAULTS.table_entry_us, "--table-entry-us", help="Time per block-table entry.", rich_help_panel=_COST
        ),
        json_output: Annotated[bool, json_option(rich_help_panel=_OUT)] = False,
        plot: Optional[Path] = typer.Option(
            None, "--plot", metavar="DIR", help="Write PNG charts into DIR.", rich_help_panel=_OUT
        ),
    ) -> None:
        """Compare KV-cache block sizes against a real or sampled request-length distribution."""
        from kvtool.simulate.lengths import load_event_lengths, load_trace, parametric_requests, sample_requests
        from kvtool.simulate.run import SimulateOptions, parse_block_sizes, planned_pool_tokens, run_simulation

        sizes = parse_block_sizes(block_sizes)
        kv_text = "--kv-tokens" if kv_tokens is not None else None
        if model is not None or gpu is not None:
            if model is None or gpu is None:
                raise UsageError(
                    "--model and --gpu go together (the pool of that model on that GPU)", where="--model/--gpu"
                )
            if kv_tokens is not None:
                raise UsageError("give either --kv-tokens or --model/--gpu, not both", where="--kv-tokens")
            kv_tokens, kv_text = planned_pool_tokens(model, gpu)
            kv_text = f"kvtool estimate's plan for {kv_text}"
        _check_options(
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
            (step_overhead_ms, token_us, kv_token_us, table_entry_us),
        )
        try:
            if trace is not None or from_events is not None:
                reqs = load_trace(trace, output_share=output_share) if trace else load_event_lengths(from_events)
                if requests is not None:
                    reqs = sample_requests(reqs, requests, seed)
            else:
                reqs = parametric_requests(
                    dist,
                    requests or DEFAULT_PARAMETRIC_REQUESTS,
                    seed,
                    output_share,
                    mean=mean,
                    p99=p99,
                    min_tokens=min_tokens,
                    max_tokens=max_tokens,
                    length=length,
                    alpha=alpha,
                )
        except MemoryError:
            raise UsageError(
                f"not enough memory for {requests or DEFAULT_PARAMETRIC_REQUESTS:,} requests",
                where="--requests",
                tip="ask for fewer --requests",
            ) from None
        options = SimulateOptions(
            block_sizes=sizes,
            shared_prefix_tokens=shared_prefix,
            max_model_len=max_model_len,
            kv_tokens=kv_tokens,
            kv_tokens_text=kv_text,
            serve=serve,
            qps=qps,
            seed=seed,
            max_num_seqs=max_num_seqs,
            prefix_cache=prefix_cache,
            split_threshold_tokens=split_pools,
            cost=CostModel(step_overhead_ms, token_us, kv_token_us, table_entry_us, _COST_DEFAULTS.refresh_steps),
            export_events=export_events,
        )
        with StderrProgress(enabled=serve and reqs.count * len(sizes) >= 50_000) as progress:
            report, traces = run_simulation(reqs, options, progress.task, keep_traces=plot is not None)
        plots = []
        if plot is not None:
            from kvtool.simulate.render import write_plots

            plots = write_plots(report, traces, plot)
        if json_output:
            from kvtool.cli.output import print_json
            from kvtool.simulate.render import to_json

            obj = to_json(report)
            obj["plots"] = [str(p) for p in plots]
            print_json(obj)
            return
        from kvtool.cli.output import stdout_console
        from kvtool.simulate.render import render

        console = stdout_console()
        render(report, console)
        for p in plots:
            console.print(f"Plot written: {p}")


def _check_options(
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
    if sum(x is not None for x in (trace, from_events, dist)) != 1:
        raise UsageError(
            "give exactly one source of lengths: --trace FILE, --from-events FILE or --dist NAME",
            where="--trace/--from-events/--dist",
        )
    from kvtool.simulate.lengths import MAX_REQUEST_TOKENS, MAX_REQUESTS
    from kvtool.simulate.run import MAX_KV_TOKENS

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
