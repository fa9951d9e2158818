"""`kvtool simulate`: block-size trade-offs against a real or sampled request-length distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvtool.cli.options import json_option
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress
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
        from kvtool.simulate.inputs import SimulateInputs, prepare
        from kvtool.simulate.run import run_simulation

        reqs, options = prepare(
            SimulateInputs(
                trace=trace,
                from_events=from_events,
                dist=dist,
                requests=requests,
                seed=seed,
                mean=mean,
                p99=p99,
                min_tokens=min_tokens,
                max_tokens=max_tokens,
                length=length,
                alpha=alpha,
                output_share=output_share,
                shared_prefix=shared_prefix,
                block_sizes=block_sizes,
                max_model_len=max_model_len,
                kv_tokens=kv_tokens,
                model=model,
                gpu=gpu,
                serve=serve,
                qps=qps,
                max_num_seqs=max_num_seqs,
                prefix_cache=prefix_cache,
                split_pools=split_pools,
                export_events=export_events,
                cost=CostModel(step_overhead_ms, token_us, kv_token_us, table_entry_us, _COST_DEFAULTS.refresh_steps),
            )
        )
        with StderrProgress(enabled=serve and reqs.count * len(options.block_sizes) >= 50_000) as progress:
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
