"""``kvtool.api.simulate``: the block-size comparison of ``kvtool simulate``, per block size as a DataFrame."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from kvtool.estimate.vllm_versions import NEWEST_RELEASE
from kvtool.simulate.lengths import DEFAULT_OUTPUT_SHARE
from kvtool.simulate.run import DEFAULT_BLOCK_SIZES

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from kvtool.simulate.results import SimulateReport

PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass(frozen=True, eq=False)
class SimulateResult:
    """``kvtool simulate``'s result for a notebook.

    ``table``: one row per block size (index ``block_size``), the columns of ``--json``'s ``results`` (static
    figures, and with ``serve`` the serving figures); ``recommendations``: objective, block size and reason;
    ``report``: the core :class:`~kvtool.simulate.results.SimulateReport`; ``to_dict()``: the ``--json`` object
    (without ``plots``).
    """

    report: SimulateReport
    table: pd.DataFrame
    recommendations: pd.DataFrame
    traces: dict[int, Any]  # block size -> the serving trace (with serve), for events()

    def to_dict(self) -> dict[str, Any]:
        """``kvtool simulate --json``'s object, less its ``plots`` list."""
        return self.report.to_dict()

    def events(self, block_size: int) -> pd.DataFrame:
        """The serving simulation's events at ``block_size`` in the events schema (what ``--export-events``
        writes), read back through :func:`kvtool.api.load_events`'s checks: ready for :func:`kvtool.api.analyze`."""
        from kvtool.api._events import _frame
        from kvtool.core.errors import UsageError
        from kvtool.events.load import events_from_arrow
        from kvtool.simulate.export import events_table

        if block_size not in self.traces:
            raise UsageError(
                f"no serving simulation at block size {block_size} (simulated: "
                f"{', '.join(map(str, self.traces)) or 'none; pass serve=True'})",
                where="block_size",
            )
        where = f"simulate (block size {block_size})"
        return _frame(events_from_arrow(events_table(self.traces[block_size]), where, default_block_size=block_size))


@contextmanager
def _trace_file(trace: PathLike | pd.DataFrame | None) -> Iterator[Path | None]:
    """A DataFrame trace goes through the CLI's trace reader as a temporary CSV (one code path for checks)."""
    import pandas as pd

    if not isinstance(trace, pd.DataFrame):
        yield None if trace is None else Path(trace)
        return
    with tempfile.TemporaryDirectory(prefix="kvtool-trace-") as folder:
        path = Path(folder) / "trace.csv"
        trace.to_csv(path, index=False)
        yield path


@dataclasses.dataclass(frozen=True, eq=False)
class EngineSimulateResult:
    """``kvtool simulate --engine sglang`` / ``--engine vllm,sglang``'s result for a notebook.

    ``table``: one row per run (engine and its block or page size): with both engines the side-by-side table's
    columns (pool tokens, prefix hit rate, preemptions / retractions, TTFT / TPOT p50 / p99, throughput); with
    SGLang alone its results.  ``report``: the core report
    (:class:`~kvtool.simulate.sglang.compare.EngineComparison` or :class:`~kvtool.simulate.sglang.run.SglangReport`);
    ``to_dict()``: the ``--json`` object.
    """

    report: Any
    table: pd.DataFrame

    def to_dict(self) -> dict[str, Any]:
        """``kvtool simulate --engine ... --json``'s object."""
        from kvtool.core.jsonable import to_jsonable

        return to_jsonable(self.report)


def simulate(
    trace: PathLike | pd.DataFrame | None = None,
    *,
    from_events: PathLike | None = None,
    dist: str | None = None,
    requests: int | None = None,
    seed: int = 0,
    mean: float | None = None,
    p99: float | None = None,
    min_tokens: float | None = None,
    max_tokens: float | None = None,
    length: float | None = None,
    alpha: float | None = None,
    output_share: float = DEFAULT_OUTPUT_SHARE,
    shared_prefix: int = 0,
    block_size: int | Sequence[int] | None = None,
    max_model_len: int | None = None,
    kv_tokens: int | None = None,
    model: str | None = None,
    config: str | None = None,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    profiles: Sequence[str] = (),
    tp: int = 1,
    kv_dtype: str = "auto",
    vllm_version: str = NEWEST_RELEASE,
    bandwidth_gb_s: float | None = None,
    peak_tflops: float | None = None,
    step_overhead_ms: float | None = None,
    table_entry_us: float | None = None,
    serve: bool = False,
    qps: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    long_prefill_token_threshold: int = 0,
    prefix_cache: bool = True,
    prefix_variant_share: float = 0.0,
    split_pools: int | None = None,
    slo_ttft_ms: float | None = None,
    export_events: PathLike | None = None,
    block_sizes: Sequence[int] | None = None,
    kv_offloading_size: float | Sequence[float] | None = None,
    kv_offloading_backend: str = "native",
    h2d_bandwidth_gb_s: float | None = None,
    engine: str = "vllm",
    page_size: int | Sequence[int] | None = None,
    max_running_requests: int | None = None,
    chunked_prefill_size: int | None = None,
    mem_fraction_static: float | None = None,
    schedule_policy: str | None = None,
    sglang_version: str | None = None,
) -> SimulateResult | EngineSimulateResult:
    """Compare KV-cache block sizes against real or sampled request lengths (``kvtool simulate``).

    One source of lengths: ``trace`` (a trace file, or a DataFrame with ``prompt_tokens``, ``output_tokens`` and
    optionally ``arrival_s``, read by the same reader), ``from_events`` (an events file), or ``dist``
    (``lognormal`` with ``mean``/``p99``, ``uniform`` with ``min_tokens``/``max_tokens``, ``fixed`` with
    ``length``, ``zipf`` with ``alpha``).  ``block_size`` takes one size or a sequence to compare (default
    ``DEFAULT_BLOCK_SIZES``; ``block_sizes`` is its deprecated spelling).  ``max_num_seqs`` and ``max_num_batched_tokens`` default to vllm serve's for the
    GPU, the rule ``kvtool estimate`` states.  The other options are the CLI's (docs/simulate.md); ``serve`` adds the
    simulation of vLLM 0.32's scheduler (prefix cache on by default), ``model``/``config``/``gpu``/``tp``/``kv_dtype``/``vllm_version``
    and the cost overrides its roofline step time, ``export_events`` writes its events like ``--export-events``,
    ``kv_offloading_size`` (GiB, one or a sequence; 0: none) runs it again with vLLM's CPU tier behind the prefix
    cache: the curve is ``to_dict()["offload_curve"]``.

    Returns a :class:`SimulateResult`: ``table`` (one row per block size), ``recommendations``, ``to_dict()``,
    and with ``serve`` the simulated events of each block size through ``events(block_size)``.

    ``engine``: ``"sglang"`` runs SGLang's model (radix cache at ``page_size``, its scheduler, timed by the same
    step-time model), ``"vllm,sglang"`` both engines on the same requests side by side (vLLM at ``block_size``,
    default 16; SGLang at ``page_size``, default 1; ``max_running_requests``, ``chunked_prefill_size``,
    ``mem_fraction_static``, ``schedule_policy``, ``sglang_version`` are SGLang's, default SGLang's for the GPU):
    an :class:`EngineSimulateResult` (``kvtool simulate --engine``, docs/simulate.md).

    Example (every request 100 tokens: block 16 leaves 12 of 112 slots empty, block 32 28 of 128):

    >>> from kvtool.api import simulate
    >>> result = simulate(dist="fixed", length=100, requests=10, block_size=[16, 32])
    >>> result.table[["allocated_slots", "internal_fragmentation"]]  # doctest: +NORMALIZE_WHITESPACE
                allocated_slots  internal_fragmentation
    block_size
    16                     1120                0.107143
    32                     1280                0.218750
    """
    import pandas as pd

    from kvtool.simulate.inputs import inputs_from, prepare
    from kvtool.simulate.run import run_simulation

    if block_sizes is not None:
        import warnings

        warnings.warn("simulate(block_sizes=...) is deprecated: pass block_size=", DeprecationWarning, stacklevel=2)
        block_size = block_sizes
    from kvtool.simulate.sglang.engines import check_engine_options, engine_inputs, parse_simulate_engines

    engines = parse_simulate_engines(engine)
    with _trace_file(trace) as trace_path:
        given = {**locals(), "trace": trace_path, "block_size": _sizes(block_size), "page_size": _sizes(page_size)}
        given["gpu_memory"] = None if gpu_memory is None else str(gpu_memory)
        given["profiles"] = tuple(profiles)
        if kv_offloading_size is not None:
            offload = (kv_offloading_size,) if isinstance(kv_offloading_size, (int, float)) else kv_offloading_size
            given["kv_offloading_size"] = ",".join(repr(float(x)) for x in offload)
        given["from_events"] = None if from_events is None else Path(from_events)
        given["export_events"] = None if export_events is None else Path(export_events)
        check_engine_options(engines, given)
        if "sglang" in engines:
            inputs = engine_inputs(engines, given)
            reqs, options = prepare(inputs_from({k: v for k, v in inputs.items() if v is not None}))
            return _engine_result(reqs, options, engines, given)
        given["block_size"] = given["block_size"] or _sizes(DEFAULT_BLOCK_SIZES)
        reqs, options = prepare(inputs_from(given))  # every argument by its option name
    report, traces = run_simulation(reqs, options, keep_traces=serve, record_events=serve)
    doc = report.to_dict()
    return SimulateResult(
        report=report,
        table=pd.DataFrame(doc["results"]).set_index("block_size"),
        recommendations=pd.DataFrame(doc["recommendations"], columns=["objective", "block_size", "reason"]),
        traces=traces,
    )


def _sizes(sizes: int | Sequence[int] | None) -> str | None:
    """One size or a sequence, as the CLI's comma list (None: not given)."""
    if sizes is None:
        return None
    return ",".join(str(b) for b in ((sizes,) if isinstance(sizes, int) else tuple(sizes)))


def _engine_result(reqs, options, engines: tuple[str, ...], given: dict) -> EngineSimulateResult:
    import pandas as pd

    from kvtool.core.jsonable import to_jsonable
    from kvtool.simulate.sglang.engines import simulate_engines

    report = simulate_engines(reqs, options, engines, given)
    if engines == ("sglang",):
        table = pd.DataFrame(to_jsonable(report.results)).set_index("page_size")
    else:
        table = pd.DataFrame(to_jsonable(report.runs)).set_index(["engine", "unit_tokens"])
    return EngineSimulateResult(report=report, table=table)
