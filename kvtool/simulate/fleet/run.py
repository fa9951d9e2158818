"""`kvtool simulate --serve --replicas ... --router ...` and `--sweep` end to end (no printing here).

The replicas: ``--replicas N`` (N of the --gpu/--tp replica) or groups ``COUNTxGPU[@tpK]`` joined by ``,`` or ``+``
(``2xh100-80gb+2xa100-80gb@tp2``: heterogeneous replicas, each with its GPU's KV budget, step times and vllm serve
defaults).  A sweep is a grid ``NAME=V,V;NAME=V,...`` over ``replicas`` (values joined by ``+`` inside one),
``router``, ``block_size``, ``kv_tokens``, ``gpu`` and ``max_num_seqs``; each point is an independent fleet run, in
this process or on Dask (``--workers``/``--scheduler``), with the same results either way.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.simulate.fleet.results import (
    FleetReport,
    PolicyResult,
    SweepPoint,
    SweepReport,
    SweepRow,
    recommend_point,
    summarise_policy,
)
from kvtool.simulate.fleet.routers import (
    DEFAULT_BALANCE_ABS,
    DEFAULT_BALANCE_REL,
    DEFAULT_CACHE_THRESHOLD,
    LOAD_METRICS,
    RouterSettings,
    parse_policies,
)
from kvtool.simulate.run import SimulateOptions

MAX_REPLICAS = 4096


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    """The fleet's options as the CLI takes them."""

    replicas: str = "1"
    router: str = "round-robin"  # a comma list of policies, or "all"
    load_metric: str = "requests"
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD
    balance_abs_threshold: int = DEFAULT_BALANCE_ABS
    balance_rel_threshold: float = DEFAULT_BALANCE_REL
    rate_scale: float = 1.0  # arrivals this many times faster (the trace's gaps divided by it)
    measure_regret: bool = True
    sweep: str | None = None
    workers: int | None = None
    scheduler: str | None = None

    def settings(self, policy: str) -> RouterSettings:
        return RouterSettings(
            policy, self.load_metric, self.cache_threshold, self.balance_abs_threshold, self.balance_rel_threshold
        )


_GROUP = re.compile(r"^(\d+)(?:x([^@]+))?(?:@tp(\d+))?$")


def parse_replicas(text: str, gpu: str | None, tp: int) -> list[tuple[int, str | None, int]]:
    """'4' -> [(4, gpu, tp)]; '2xh100-80gb+1xa100-80gb@tp2' -> [(2, 'h100-80gb', tp), (1, 'a100-80gb', 2)]."""
    groups = []
    for part in re.split(r"[,+]", text):
        m = _GROUP.match(part.strip())
        if not m or int(m.group(1)) <= 0 or (m.group(3) is not None and int(m.group(3)) <= 0):
            raise UsageError(
                f"not a replica count or group: {part.strip()!r}",
                where="--replicas",
                tip="give N, or NxGPU[@tpK] joined by +",
            )
        groups.append((int(m.group(1)), m.group(2) or gpu, int(m.group(3)) if m.group(3) else tp))
    if sum(g[0] for g in groups) > MAX_REPLICAS:
        raise UsageError(f"at most {MAX_REPLICAS:,} replicas", where="--replicas")
    return groups


@dataclasses.dataclass(frozen=True)
class FleetBase:
    """What every run of a command shares: the requests (prompts, outputs, arrivals, sessions) and the options."""

    prompts: list
    output_tokens: list[int]
    arrival_s: list[float]
    sessions: list | None
    options: SimulateOptions
    fleet: FleetOptions


def _replicas(base: FleetBase, replicas: str, block_size: int, kv_tokens, gpu, max_num_seqs):
    """The ReplicaSpecs of one fleet, and the pool in words."""
    from kvtool.simulate.costs import RooflineCost, pool_blocks
    from kvtool.simulate.fleet.loop import ReplicaSpec
    from kvtool.simulate.run import _model_groups, resolve_serving_hardware
    from kvtool.simulate.scheduler import EngineConfig

    o = base.options
    specs: list = []
    hardware: dict = {}
    for count, g, tp in parse_replicas(replicas, gpu if gpu is not None else o.gpu, o.tp):
        key = (g, tp)
        if key not in hardware:
            hw = resolve_serving_hardware(dataclasses.replace(o, gpu=g, tp=tp))
            mnbt = o.max_num_batched_tokens or hw.max_num_batched_tokens
            groups = _model_groups(hw, block_size, o, mnbt)
            if groups is not None and groups.specs:
                raise UsageError(
                    f"the fleet simulation runs full-attention models only; {hw.model} has KV-cache groups "
                    f"({', '.join(groups.describe())})",
                    where="--replicas",
                    tip="simulate one engine of it without --replicas",
                )
            blocks = pool_blocks(hw, block_size, kv_tokens)
            config = EngineConfig(
                num_blocks=max(blocks, 1),
                block_size=block_size,
                max_num_seqs=max_num_seqs or o.max_num_seqs or hw.max_num_seqs,
                max_num_batched_tokens=mnbt,
                long_prefill_token_threshold=o.long_prefill_token_threshold,
                max_model_len=o.max_model_len or (1 << 40),
                enable_prefix_caching=o.prefix_cache,
            )
            hardware[key] = (hw, config, RooflineCost(hw, block_size))
        hw, config, cost = hardware[key]
        for _ in range(count):
            specs.append(ReplicaSpec(f"r{len(specs)}", config, cost, hw.gpu, tp))
    return specs


def _check(options: SimulateOptions, fleet: FleetOptions) -> None:
    if not options.serve:
        raise UsageError(
            "--replicas, --router and --sweep apply to the serving simulation: add --serve", where="--replicas"
        )
    for flag, bad in (
        ("--split-pools", options.split_threshold_tokens is not None),
        ("--kv-offloading-size", bool(options.offload_sizes_gib)),
        ("--export-events", options.export_events is not None),
    ):
        if bad:
            raise UsageError(f"{flag} is not simulated for a fleet (one engine only)", where=flag)
    if fleet.load_metric not in LOAD_METRICS:
        raise UsageError(
            f"unknown load metric {fleet.load_metric!r}", where="--load-metric", tip=" or ".join(LOAD_METRICS)
        )
    if not fleet.rate_scale > 0 or fleet.rate_scale == float("inf"):
        raise UsageError(f"--rate-scale must be a positive number, got {fleet.rate_scale:g}", where="--rate-scale")
    if not 0 <= fleet.cache_threshold <= 1:
        raise UsageError("--cache-threshold must lie in [0, 1]", where="--cache-threshold")
    if fleet.sweep is None and (fleet.workers is not None or fleet.scheduler is not None):
        raise UsageError("--workers/--scheduler run a --sweep's points on Dask", where="--workers")


def fleet_base(requests, options: SimulateOptions, fleet: FleetOptions) -> tuple[FleetBase, str]:
    """The shared inputs and the arrivals in words."""
    from kvtool.simulate.run import arrivals_for
    from kvtool.simulate.workloads import build_prompts

    _check(options, fleet)
    arrivals = arrivals_for(requests, options)
    times = arrivals.times_s
    text = arrivals.text
    if fleet.rate_scale != 1.0:
        times = times / fleet.rate_scale
        text += f", {fleet.rate_scale:g}x the rate (gaps divided by {fleet.rate_scale:g})"
    prompts = build_prompts(requests, options.shared_prefix_tokens, options.prefix_variant_share, options.seed)
    base = FleetBase(
        prompts, requests.output_tokens.tolist(), [float(t) for t in times], requests.sessions, options, fleet
    )
    return base, text


def run_one(
    base: FleetBase, replicas: str, policy: str, block_size: int, kv_tokens, gpu, max_num_seqs, progress=None
) -> PolicyResult:
    from kvtool.simulate.fleet.loop import run_fleet

    specs = _replicas(base, replicas, block_size, kv_tokens, gpu, max_num_seqs)
    run = run_fleet(
        specs,
        base.prompts,
        base.output_tokens,
        base.arrival_s,
        base.fleet.settings(policy),
        base.sessions,
        measure_regret=base.fleet.measure_regret,
        progress=progress,
    )
    P = [p.tokens for p in base.prompts]
    return summarise_policy(policy, run, P, base.output_tokens, base.arrival_s, base.options.max_model_len)


def run_policies(
    requests, options: SimulateOptions, fleet: FleetOptions, progress: Callable[[str, int, int], None] | None = None
) -> FleetReport:
    """One fleet run per --router policy."""
    _check(options, fleet)
    if len(options.block_sizes) != 1:
        raise UsageError(
            "a fleet runs one block size: give --block-size B (or --sweep block_size=...)", where="--block-size"
        )
    policies = parse_policies(fleet.router)
    base, arrivals_text = fleet_base(requests, options, fleet)
    b = options.block_sizes[0]
    results = []
    for policy in policies:

        def step(done: int, policy: str = policy) -> None:
            if progress is not None:
                progress(f"fleet {policy}", done, requests.count)

        results.append(run_one(base, fleet.replicas, policy, b, options.kv_tokens, None, None, step))
    first = results[0]
    replicas_text = ", ".join(f"{r.name} {r.gpu} tp{r.tp} ({r.pool_blocks:,} blocks)" for r in first.per_replica[:8])
    if len(first.per_replica) > 8:
        replicas_text += f", ... ({len(first.per_replica)} replicas)"
    pool = (
        f"--kv-tokens {options.kv_tokens:,} per replica"
        if options.kv_tokens
        else "each GPU's KV budget (kvtool estimate)"
    )
    return FleetReport(requests.source, requests.count, arrivals_text, replicas_text, pool, tuple(results))


# ----------------------------------------------------------------------------------------------- sweeps
_DIMENSIONS = ("replicas", "router", "block_size", "kv_tokens", "gpu", "max_num_seqs")
MAX_SWEEP_POINTS = 10_000


def parse_sweep(
    text: str, options: SimulateOptions, fleet: FleetOptions
) -> tuple[dict[str, list[Any]], list[SweepPoint]]:
    """The grid's axes (given ones; the others take the base run's value) and its points, last axis fastest."""
    axes: dict[str, list[Any]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, values = part.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in _DIMENSIONS:
            raise UsageError(
                f"not a sweep dimension: {part.strip()!r}",
                where="--sweep",
                tip=f"NAME=V,V;... with NAME one of {', '.join(_DIMENSIONS)}",
            )
        if name in axes:
            raise UsageError(f"sweep dimension {name} given twice", where="--sweep")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not items:
            raise UsageError(f"sweep dimension {name} has no values", where="--sweep")
        if name == "router":
            items = parse_policies(",".join(items))
        elif name in ("block_size", "kv_tokens", "max_num_seqs"):
            try:
                numbers = [int(v) for v in items]
            except ValueError:
                raise UsageError(f"sweep dimension {name} takes whole numbers", where="--sweep") from None
            items = numbers  # type: ignore[assignment]
            if min(numbers) <= 0:
                raise UsageError(f"sweep dimension {name} takes positive numbers", where="--sweep")
        elif name == "replicas":
            for v in items:
                parse_replicas(v, options.gpu, options.tp)
        axes[name] = items
    if len(options.block_sizes) != 1 and "block_size" not in axes:
        axes["block_size"] = list(options.block_sizes)
    defaults: dict[str, list[Any]] = {
        "replicas": [fleet.replicas],
        "router": parse_policies(fleet.router),
        "block_size": list(options.block_sizes),
        "kv_tokens": [options.kv_tokens],
        "gpu": [None],
        "max_num_seqs": [None],
    }
    grid = [axes.get(d, defaults[d]) for d in _DIMENSIONS]
    count = 1
    for g in grid:
        count *= len(g)
    if count > MAX_SWEEP_POINTS:
        raise UsageError(f"the sweep has {count:,} points, at most {MAX_SWEEP_POINTS:,}", where="--sweep")
    points = [SweepPoint(*values) for values in itertools.product(*grid)]
    return axes, points


def sweep_point(point: SweepPoint, base: FleetBase) -> PolicyResult:
    """One grid point (a task of its own: on a Dask worker, or in this process)."""
    return run_one(base, point.replicas, point.router, point.block_size, point.kv_tokens, point.gpu, point.max_num_seqs)


def run_sweep(
    requests, options: SimulateOptions, fleet: FleetOptions, progress: Callable[[str, int, int], None] | None = None
) -> SweepReport:
    from kvtool.core.dask_map import check_dask_options, map_on_dask

    _check(options, fleet)
    check_dask_options(fleet.workers, fleet.scheduler)
    axes, points = parse_sweep(fleet.sweep or "", options, fleet)
    base, _ = fleet_base(requests, options, fleet)
    note = (lambda done, total: progress("sweep points", done, total)) if progress is not None else None
    if fleet.workers is None and fleet.scheduler is None:
        results = []
        for i, point in enumerate(points):
            results.append(sweep_point(point, base))
            if note is not None:
                note(i + 1, len(points))
        ran_on = "this process"
    else:
        results = map_on_dask(
            sweep_point,
            points,
            base,
            workers=fleet.workers,
            scheduler=fleet.scheduler,
            feature="kvtool simulate --sweep --workers/--scheduler",
            progress=note,
        )
        ran_on = (
            f"a local Dask cluster of {fleet.workers} workers"
            if fleet.workers
            else f"the Dask cluster at {fleet.scheduler}"
        )
    rows = tuple(SweepRow(p, r) for p, r in zip(points, results))
    return SweepReport(requests.source, requests.count, axes, rows, recommend_point(rows, options.slo_ttft_ms), ran_on)
