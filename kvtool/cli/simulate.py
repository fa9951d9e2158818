"""`kvtool simulate`: block-size trade-offs against a real or sampled request-length distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvtool.cli.options import PROFILES_HELP, json_option, path_option, scheduler_option, workers_option
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress
from kvtool.estimate.sglang.versions import NEWEST_RELEASE as SGLANG_NEWEST_RELEASE
from kvtool.estimate.vllm_versions import NEWEST_RELEASE
from kvtool.simulate.costs import DEFAULT_STEP_OVERHEAD_MS, DEFAULT_TABLE_ENTRY_US
from kvtool.simulate.lengths import DEFAULT_OUTPUT_SHARE, DEFAULT_PARAMETRIC_REQUESTS
from kvtool.simulate.run import DEFAULT_BLOCK_SIZES, DEFAULT_POOL_GPU, DEFAULT_POOL_MODEL

_LENGTHS = "Request lengths"
_STATIC = "Static comparison"
_SERVE = "Serving simulation (--serve)"
_COST = "Model, GPU and step time (--serve)"
_FLEET = "Fleet of replicas (--serve --replicas)"
_SGLANG = "SGLang (--engine sglang, --engine vllm,sglang)"
_OUT = "Output"


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    @handle_errors
    def command(
        trace: Optional[Path] = path_option(
            None,
            "--trace",
            empty_tip="give a trace file (CSV or JSON lines)",
            help="CSV or JSON-lines trace of real requests "
            "(Azure, Vidur, generic prompt_tokens/output_tokens or length, "
            "LLMServingSim; for the prefix cache, JSON lines of prompt_token_ids or the Mooncake format).",
            rich_help_panel=_LENGTHS,
        ),
        from_events: Optional[Path] = path_option(
            None,
            "--from-events",
            empty_tip="give an events file of `kvtool analyze`'s schema",
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
        block_size: Optional[str] = typer.Option(
            None,
            "--block-size",
            help="Tokens per KV block; a comma list compares several "
            f"(default {','.join(map(str, DEFAULT_BLOCK_SIZES))}).",
            rich_help_panel=_STATIC,
        ),
        block_sizes: Optional[str] = typer.Option(
            None, "--block-sizes", hidden=True, help="Deprecated: --block-size takes a comma list."
        ),
        max_model_len: Optional[int] = typer.Option(
            None,
            "--max-model-len",
            help="Slots each request reserves in the contiguous baseline (default: the longest request), and vLLM's "
            "max_model_len with --serve (default: no limit).",
            rich_help_panel=_STATIC,
        ),
        kv_tokens: Optional[int] = typer.Option(
            None,
            "--kv-tokens",
            help="KV-cache budget in tokens (the pool; default: none for the static comparison, and for --serve "
            "the KV budget of --model on --gpu as `kvtool estimate` plans it).",
            rich_help_panel=_STATIC,
        ),
        model: Optional[str] = typer.Option(
            None,
            "--model",
            help=f"Model profile, as estimate takes it: sets the pool and the step times (default {DEFAULT_POOL_MODEL}).",
            rich_help_panel=_COST,
        ),
        config: Optional[str] = typer.Option(
            None, "--config", help="A config.json (or its folder) instead of --model.", rich_help_panel=_COST
        ),
        gpu: Optional[str] = typer.Option(
            None,
            "--gpu",
            help=f"GPU profile, as estimate takes it (default {DEFAULT_POOL_GPU}).",
            rich_help_panel=_COST,
        ),
        gpu_memory: Optional[str] = typer.Option(
            None,
            "--gpu-memory",
            help="GPU memory instead of --gpu, e.g. 80GiB (with --serve, also give --bandwidth-gb-s and "
            "--peak-tflops).",
            rich_help_panel=_COST,
        ),
        profiles: Optional[list[str]] = typer.Option(
            None, "--profiles", help=PROFILES_HELP, show_default=False, rich_help_panel=_COST
        ),
        tp: int = typer.Option(
            1,
            "--tp",
            "--tensor-parallel-size",
            "-tp",
            help="Tensor-parallel size (weights and KV heads split across GPUs).",
            rich_help_panel=_COST,
        ),
        kv_dtype: str = typer.Option(
            "auto",
            "--kv-dtype",
            "--kv-cache-dtype",
            help="KV-cache dtype, as estimate takes it.",
            rich_help_panel=_COST,
        ),
        vllm_version: str = typer.Option(
            NEWEST_RELEASE,
            "--vllm-version",
            help="The vLLM release whose rules size the pool and pick vllm serve's defaults, as estimate takes it.",
            rich_help_panel=_COST,
        ),
        bandwidth_gb_s: Optional[float] = typer.Option(
            None, "--bandwidth-gb-s", help="Memory bandwidth (decimal GB/s; default: the GPU's).", rich_help_panel=_COST
        ),
        peak_tflops: Optional[float] = typer.Option(
            None, "--peak-tflops", help="Dense peak (TFLOP/s; default: the GPU's, 16-bit).", rich_help_panel=_COST
        ),
        step_overhead_ms: Optional[float] = typer.Option(
            None,
            "--step-overhead-ms",
            help=f"Fixed time per engine step (default {DEFAULT_STEP_OVERHEAD_MS:g}).",
            rich_help_panel=_COST,
        ),
        table_entry_us: Optional[float] = typer.Option(
            None,
            "--table-entry-us",
            help=f"Attention-kernel time per block-table entry (default {DEFAULT_TABLE_ENTRY_US:g}; docs/simulate.md).",
            rich_help_panel=_COST,
        ),
        serve: bool = typer.Option(
            False, "--serve", help="Also run vLLM V1's scheduler (0.32) over the requests.", rich_help_panel=_SERVE
        ),
        qps: Optional[float] = typer.Option(
            None,
            "--qps",
            help="Poisson arrivals at this rate (requests/s; default: the trace's timestamps, else all at t=0).",
            rich_help_panel=_SERVE,
        ),
        max_num_seqs: Optional[int] = typer.Option(
            None,
            "--max-num-seqs",
            help="Most requests running at once (default: vllm serve's for the GPU, as kvtool estimate takes it: "
            "256; 1024 at >= 70 GiB but A100).",
            rich_help_panel=_SERVE,
        ),
        max_num_batched_tokens: Optional[int] = typer.Option(
            None,
            "--max-num-batched-tokens",
            help="Token budget per step, decodes and prefill chunks together (default: vllm serve's for the GPU).",
            rich_help_panel=_SERVE,
        ),
        long_prefill_token_threshold: int = typer.Option(
            0,
            "--long-prefill-token-threshold",
            help="Cap on one request's prefill chunk (0: off).",
            rich_help_panel=_SERVE,
        ),
        prefix_cache: bool = typer.Option(
            True,
            "--prefix-cache/--no-prefix-cache",
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="vLLM's automatic prefix caching (on by default).",
            rich_help_panel=_SERVE,
        ),
        prefix_variant_share: float = typer.Option(
            0.0,
            "--prefix-variant-share",
            help="With --shared-prefix: this share of requests carry a variant system prompt (last token differs).",
            rich_help_panel=_SERVE,
        ),
        split_pools: Optional[int] = typer.Option(
            None,
            "--split-pools",
            metavar="THRESHOLD",
            help="Separate engines for requests longer than THRESHOLD tokens and the rest.",
            rich_help_panel=_SERVE,
        ),
        slo_ttft_ms: Optional[float] = typer.Option(
            None, "--slo-ttft-ms", help="TTFT p99 target of the recommendation.", rich_help_panel=_SERVE
        ),
        export_events: Optional[Path] = path_option(
            None,
            "--export-events",
            empty_tip="give the file to write (NAME.csv, NAME.csv.gz or NAME.parquet)",
            help="Write the simulated events in "
            "`kvtool analyze`'s schema (NAME-bB.csv per block size when "
            "several; .csv.gz or .parquet by the name).",
            rich_help_panel=_SERVE,
        ),
        kv_offloading_size: Optional[str] = typer.Option(
            None,
            "--kv-offloading-size",
            metavar="GIB[,GIB...]",
            help="vLLM's CPU tier (native offloading) behind the prefix cache: a comma list of GiB (0: none) gives "
            "the hit rate against its size, each size a run of the serving simulation (docs/simulate.md).",
            rich_help_panel=_SERVE,
        ),
        kv_offloading_backend: str = typer.Option(
            "native",
            "--kv-offloading-backend",
            help="vLLM's offloading backend: native (modelled; lmcache is sized by kvtool estimate, not simulated).",
            rich_help_panel=_SERVE,
        ),
        h2d_bandwidth_gb_s: Optional[float] = typer.Option(
            None,
            "--h2d-bandwidth-gb-s",
            help="Host-to-device rate of a CPU-tier load (decimal GB/s; default 50, PCIe 5.0 x16).",
            rich_help_panel=_SERVE,
        ),
        replicas: Optional[str] = typer.Option(
            None,
            "--replicas",
            help="Simulate a fleet: N replicas of --gpu/--tp, or groups NxGPU[@tpK] joined by + "
            "(2xh100-80gb+2xa100-80gb@tp2); each replica is the one-engine simulation (docs/fleet.md).",
            rich_help_panel=_FLEET,
        ),
        router: Optional[str] = typer.Option(
            None,
            "--router",
            help="The fleet's router: round-robin, least-loaded, session-affinity, prefix-aware (approximate tree), "
            "precise (real cached blocks); a comma list or 'all' compares them (default round-robin).",
            rich_help_panel=_FLEET,
        ),
        load_metric: str = typer.Option(
            "requests",
            "--load-metric",
            help="least-loaded: 'requests' (running + waiting) or 'kv-blocks' (share of the pool in use).",
            rich_help_panel=_FLEET,
        ),
        cache_threshold: float = typer.Option(
            0.3,
            "--cache-threshold",
            help="prefix-aware: match share above which the best match wins (sglang's).",
            rich_help_panel=_FLEET,
        ),
        balance_abs_threshold: int = typer.Option(
            64,
            "--balance-abs-threshold",
            help="prefix-aware, precise: loads imbalanced when max - min exceeds this.",
            rich_help_panel=_FLEET,
        ),
        balance_rel_threshold: float = typer.Option(
            1.5,
            "--balance-rel-threshold",
            help="... and max exceeds this x min (sglang's defaults).",
            rich_help_panel=_FLEET,
        ),
        rate_scale: float = typer.Option(
            1.0,
            "--rate-scale",
            help="Replay the arrivals this many times faster (gaps divided by it).",
            rich_help_panel=_FLEET,
        ),
        regret: bool = typer.Option(
            True,
            "--regret/--no-regret",
            help="Measure the routing regret (every replica brought to each arrival; --no-regret is faster for "
            "round-robin and session-affinity).",
            rich_help_panel=_FLEET,
        ),
        sweep: Optional[str] = typer.Option(
            None,
            "--sweep",
            metavar="GRID",
            help="A design grid 'replicas=2,4;router=round-robin,precise;block_size=16,32;kv_tokens=...;gpu=...;"
            "max_num_seqs=...': one fleet run per point and a recommendation.",
            rich_help_panel=_FLEET,
        ),
        workers: Optional[int] = workers_option("--sweep: run the points", _FLEET),
        scheduler: Optional[str] = scheduler_option("--sweep: run the points", _FLEET),
        engine: str = typer.Option(
            "vllm",
            "--engine",
            help="vllm, sglang, or vllm,sglang (one trace through both, side by side, as estimate's --engine): "
            "SGLang's radix cache (prefix match at the page size, LRU eviction) and scheduler (PrefillAdder "
            "admission, retraction) over its own pool, timed by the same step-time model (docs/simulate.md). With "
            "sglang alone, --block-size is the page size and --max-num-seqs / --max-num-batched-tokens stand for "
            "--max-running-requests / --chunked-prefill-size unless those are given.",
            rich_help_panel=_SGLANG,
        ),
        page_size: Optional[str] = typer.Option(
            None,
            "--page-size",
            help="SGLang's --page-size; a comma list compares several (default 1).",
            rich_help_panel=_SGLANG,
        ),
        max_running_requests: Optional[int] = typer.Option(
            None,
            "--max-running-requests",
            help="SGLang's (default: SGLang's for the pool, as kvtool estimate --engine sglang gives it).",
            rich_help_panel=_SGLANG,
        ),
        chunked_prefill_size: Optional[int] = typer.Option(
            None,
            "--chunked-prefill-size",
            help="SGLang's (default: SGLang's for the GPU).",
            rich_help_panel=_SGLANG,
        ),
        mem_fraction_static: Optional[float] = typer.Option(
            None,
            "--mem-fraction-static",
            help="SGLang's, which sizes its pool (default: SGLang's for the GPU and TP).",
            rich_help_panel=_SGLANG,
        ),
        schedule_policy: Optional[str] = typer.Option(
            None, "--schedule-policy", help="SGLang's: fcfs (default) or lpm.", rich_help_panel=_SGLANG
        ),
        sglang_version: Optional[str] = typer.Option(
            None,
            "--sglang-version",
            help=f"The SGLang release whose rules size its pool (default {SGLANG_NEWEST_RELEASE}).",
            rich_help_panel=_SGLANG,
        ),
        json_output: Annotated[bool, json_option(rich_help_panel=_OUT)] = False,
        plot: Optional[Path] = path_option(
            None,
            "--plot",
            empty_tip="give a folder for the charts ('.' for the current one)",
            needs=("matplotlib", "kvtool simulate --plot"),
            metavar="DIR",
            help="Write PNG charts into DIR.",
            rich_help_panel=_OUT,
        ),
    ) -> None:
        """Compare KV-cache block sizes against a real or sampled request-length distribution.

        Examples: `kvtool simulate --trace azure.csv --serve --model llama-3.1-8b --gpu h100 --slo-ttft-ms 500`;
        `kvtool simulate --dist lognormal --mean 1000 --p99 6000 --serve --shared-prefix 1500 --qps 20`.
        """
        from kvtool.simulate.inputs import inputs_from, prepare
        from kvtool.simulate.run import run_simulation

        given = dict(locals())  # every option by its name
        given.update(block_size=_block_size(block_size, block_sizes), profiles=tuple(profiles or ()))
        from kvtool.simulate.sglang.engines import check_engine_options, engine_inputs, parse_simulate_engines

        engines = parse_simulate_engines(engine)
        check_engine_options(engines, given)
        if "sglang" in engines:
            inputs = engine_inputs(engines, given)
            reqs, options = prepare(inputs_from({k: v for k, v in inputs.items() if v is not None}))
            return _engines(reqs, options, engines, given, json_output)
        reqs, options = prepare(inputs_from({k: v for k, v in given.items() if v is not None}))
        if replicas is not None or router is not None or sweep is not None:
            return _fleet(reqs, options, given, json_output)
        with StderrProgress(enabled=serve and reqs.count * len(options.block_sizes) >= 50_000) as progress:
            report, traces = run_simulation(reqs, options, progress.task, keep_traces=plot is not None)
        _show(report, traces, plot, json_output)


def _fleet(reqs, options, given: dict, json_out: bool) -> None:
    """--replicas / --router / --sweep: the fleet simulation, per policy or per grid point."""
    from kvtool.simulate.fleet.run import FleetOptions, run_policies, run_sweep

    fleet = FleetOptions(
        replicas=given["replicas"] or "1",
        router=given["router"] or "round-robin",
        load_metric=given["load_metric"],
        cache_threshold=given["cache_threshold"],
        balance_abs_threshold=given["balance_abs_threshold"],
        balance_rel_threshold=given["balance_rel_threshold"],
        rate_scale=given["rate_scale"],
        measure_regret=given["regret"],
        sweep=given["sweep"],
        workers=given["workers"],
        scheduler=given["scheduler"],
    )
    with StderrProgress(enabled=reqs.count >= 50_000 or fleet.sweep is not None) as progress:
        report = (run_sweep if fleet.sweep is not None else run_policies)(reqs, options, fleet, progress.task)
    if json_out:
        from kvtool.cli.output import print_json

        print_json(report.to_dict())
        return
    from kvtool.cli.output import stdout_console
    from kvtool.simulate.fleet.render import render_fleet, render_sweep
    from kvtool.simulate.fleet.results import SweepReport

    if isinstance(report, SweepReport):
        render_sweep(report, stdout_console())
    else:
        render_fleet(report, stdout_console())


def _engines(reqs, options, engines: tuple[str, ...], given: dict, json_output: bool) -> None:
    """--engine sglang (SGLang's table) or vllm,sglang (both side by side)."""
    from kvtool.simulate.sglang.engines import simulate_engines

    report = simulate_engines(reqs, options, engines, given)
    if json_output:
        from kvtool.cli.output import print_json

        print_json(report)
        return
    from kvtool.cli.output import stdout_console
    from kvtool.simulate.sglang.render import render_comparison, render_sglang

    console = stdout_console()
    if engines == ("sglang",):
        render_sglang(report, console)  # type: ignore[arg-type]
    else:
        render_comparison(report, console)  # type: ignore[arg-type]


def _block_size(block_size: Optional[str], block_sizes: Optional[str]) -> Optional[str]:
    """--block-size, or the deprecated --block-sizes (said on stderr); not both."""
    if block_sizes is None:
        return block_size
    from kvtool.cli.output import warn
    from kvtool.core.errors import UsageError

    if block_size is not None:
        raise UsageError("give --block-size only (--block-sizes is its deprecated spelling)", where="--block-sizes")
    warn(f"--block-sizes is deprecated: use --block-size {block_sizes} (a comma list, as estimate's --seq-len)")
    return block_sizes


def _show(report, traces, plot: Optional[Path], json_out: bool) -> None:
    plots = []
    if plot is not None:
        from kvtool.simulate.render import write_plots

        plots = write_plots(report, traces, plot)
    if json_out:
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
