"""``kvtool.api.load_events`` and ``kvtool.api.analyze``: events files as pandas DataFrames, and ``kvtool analyze``'s
analysis with every table as a DataFrame.

Both go through the CLI's code: the loader of ``kvtool.events.load`` (the same checks and rejected rows), the
analysis of ``kvtool.events.analysis``, and the tables and JSON of ``kvtool.events.tables``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, overload

from kvtool.core.errors import UsageError
from kvtool.core.jsonable import to_jsonable
from kvtool.events.analysis import DEFAULT_LATE_FREE_MS, DEFAULT_LONG_SHARE_ALERT, DEFAULT_TOP
from kvtool.events.analysis import DEFAULT_LONG_THRESHOLD_TOKENS as DEFAULT_LONG_THRESHOLD
from kvtool.events.load import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import pyarrow as pa

    from kvtool.events.analysis import Analysis
    from kvtool.events.fleet import AnalyzeOptions, FleetAnalysis
    from kvtool.events.load import EventTable, RejectedRows

PathLike = Union[str, "os.PathLike[str]"]

# DataFrame.attrs keys set by load_events
ATTR_SOURCE = "source"  # the file (one) or files (several) read
ATTR_REJECTED = "rejected_rows"  # {file: RejectedRows as a JSON dict} (attrs must stay JSON: to_parquet stores them)
ATTR_BLOCK_SIZE = "block_size"  # the default block size rows without a block_size were read with


def _paths(source: PathLike | Sequence[PathLike], where: str = "load_events") -> list[str]:
    """The files, directories, globs and URLs given, as text (``Path("s3://b/x")`` would read ``s3:/b/x``); none is
    a usage error (the CLI's EVENTS argument is required)."""
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    paths = [os.fspath(p) for p in source]
    if not paths:
        raise UsageError("no events files given", where=where, tip="give a file, a directory or a glob")
    return paths


def _frame(table: EventTable) -> pd.DataFrame:
    """The accepted rows of an :class:`EventTable` as a DataFrame in schema 1 (text columns categorical)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from kvtool.events.load import EVENT_TYPES

    columns: dict[str, Any] = {
        "ts": table.ts,
        "event": pd.Categorical.from_codes(table.event, categories=list(EVENT_TYPES)),
        "request_id": _categorical(table.request, table.request_ids),
        "num_blocks": table.num_blocks,
        "num_tokens": table.num_tokens,
    }
    if table.block_id_rows is not None and table.block_id_values is not None:
        # one list of ids per row (null where the row lists none), Arrow-backed: no Python object per row
        counts = np.bincount(table.block_id_rows, minlength=table.events)
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(table.block_id_values, pa.int64()))
        lists = pa.compute.if_else(pa.array(counts > 0), lists, pa.scalar(None, lists.type))
        columns["block_ids"] = pd.Series(lists, dtype=pd.ArrowDtype(lists.type))
    if table.latency_ms is not None:
        columns["latency_ms"] = table.latency_ms
    if table.source_request is not None:
        columns["source_request_id"] = _categorical(table.source_request, table.source_request_ids)
    if table.block_size is not None:
        columns["block_size"] = table.block_size
    if table.free_pool_blocks is not None:
        columns["free_pool_blocks"] = table.free_pool_blocks
    if table.instance is not None:
        columns["instance"] = _categorical(table.instance, table.instance_ids)
    frame = pd.DataFrame({k: v.array if isinstance(v, pd.Series) else v for k, v in columns.items()})
    frame.attrs[ATTR_SOURCE] = table.path
    frame.attrs[ATTR_REJECTED] = {table.path: to_jsonable(table.rejected)}
    frame.attrs[ATTR_BLOCK_SIZE] = table.default_block_size
    return frame


def _categorical(codes, values: Sequence[str]):
    """Codes into ``values`` (-1: blank) as a pandas Categorical; equal values (two spellings decoded alike) merge."""
    import numpy as np
    import pandas as pd

    position: dict[str, int] = {}
    for value in values:
        position.setdefault(value, len(position))
    if len(position) != len(values):
        remap = np.array([position[v] for v in values] + [-1], dtype=np.int64)
        codes = remap[codes]  # -1 indexes the appended -1
    return pd.Categorical.from_codes(codes, categories=list(position))


def load_events(source: PathLike | Sequence[PathLike], *, block_size: int = DEFAULT_BLOCK_SIZE) -> pd.DataFrame:
    """Read events files (schema 1: ``.csv``, ``.csv.gz``, ``.parquet``) into one pandas DataFrame.

    The rows are checked exactly as ``kvtool analyze`` checks them (docs/events-schema.md): the DataFrame holds the
    accepted rows in file order, with the schema's columns (``ts``, ``event``, ``request_id``, ``num_blocks``,
    ``num_tokens`` and the optional ones the file has); ``event``, ``request_id`` and ``source_request_id`` are
    categorical, ``block_ids`` a list of integers per row (Arrow-backed).  Rejected rows are beside it in
    ``frame.attrs["rejected_rows"]``: ``{file: {"count", "by_reason", "first", "blank_rows"}}`` (how many, how
    many per reason, ``[row number, reason]`` of the first ten, blank lines skipped), as ``--json`` reports them.
    Several files, directories, globs or URLs (as ``kvtool analyze`` takes them): the frames are concatenated and
    a categorical ``file`` column says where each row came from (an ``instance`` column, when the files have one,
    names the engine).

    ``block_size`` is the tokens per block of rows without a ``block_size`` (``--block-size``); it is kept in
    ``frame.attrs["block_size"]`` so :func:`analyze` uses it again.  Raises ``InputFileError`` for a missing,
    empty or malformed file, as the CLI does (exit code 3 there).

    Example:

    >>> import tempfile, pathlib
    >>> from kvtool.api import load_events
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "events.csv"
    >>> _ = path.write_text(
    ...     "ts,event,request_id,num_blocks,num_tokens,latency_ms\\n"
    ...     "0.0,allocate,a,2,20,\\n"
    ...     "0.5,append,a,1,1,\\n"
    ...     "0.9,allocate,b,1,-3,\\n"
    ...     "1.0,free,a,3,,800\\n"
    ... )
    >>> events = load_events(path)
    >>> events[["ts", "event", "request_id", "num_blocks", "latency_ms"]]
        ts     event request_id  num_blocks  latency_ms
    0  0.0  allocate          a           2         NaN
    1  0.5    append          a           1         NaN
    2  1.0      free          a           3       800.0
    >>> events.attrs["rejected_rows"][str(path)]["by_reason"]
    {'negative num_tokens': 1}
    """
    from kvtool.events.load import load_events as load_table
    from kvtool.events.sources import find_pool_files, is_single_file

    paths = _paths(source)
    if len(paths) == 1 and is_single_file(paths):
        return _frame(load_table(paths[0], default_block_size=block_size))
    units = find_pool_files(paths)  # directories, globs and URLs as `kvtool analyze` takes them
    files = [path for unit in units for path in unit.paths]
    frames = [_frame(load_table(path, default_block_size=block_size)) for path in files]
    return _concat(frames, files, block_size)


def _concat(frames: list[pd.DataFrame], names: list[str], block_size: int) -> pd.DataFrame:
    """One DataFrame of several files' rows: categoricals unioned, a ``file`` column, the rejected rows per file."""
    import numpy as np
    import pandas as pd
    from pandas.api.types import union_categoricals

    columns = list(dict.fromkeys(c for f in frames for c in f.columns))
    out: dict[str, Any] = {}
    for name in columns:
        like = next(f[name] for f in frames if name in f)
        parts = [f[name] if name in f else _blank_like(like, len(f)) for f in frames]
        if isinstance(like.dtype, pd.CategoricalDtype):
            out[name] = union_categoricals([p.array for p in parts])
        else:
            out[name] = pd.concat(parts, ignore_index=True).array
    codes = np.repeat(np.arange(len(frames)), [len(f) for f in frames])
    out["file"] = pd.Categorical.from_codes(codes, categories=list(dict.fromkeys(names)))
    frame = pd.DataFrame(out)
    frame.attrs[ATTR_SOURCE] = names
    frame.attrs[ATTR_REJECTED] = {k: v for f in frames for k, v in f.attrs[ATTR_REJECTED].items()}
    frame.attrs[ATTR_BLOCK_SIZE] = block_size
    return frame


def _blank_like(like: pd.Series, n: int) -> pd.Series:
    """``n`` blank values of ``like``'s kind: a file without an optional column (NaN, an empty category, null)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    if isinstance(like.dtype, pd.CategoricalDtype):
        none = pd.CategoricalDtype(like.cat.categories[:0])  # no category, the same kind of values
        return pd.Series(pd.Categorical.from_codes(np.full(n, -1), dtype=none))
    if isinstance(like.dtype, pd.ArrowDtype):
        return pd.Series(pa.nulls(n, like.dtype.pyarrow_dtype), dtype=like.dtype)
    return pd.Series(np.full(n, np.nan))


@dataclasses.dataclass(frozen=True, eq=False)
class AnalyzeResult:
    """``kvtool analyze``'s result for a notebook: every table a pandas DataFrame, every figure a dict.

    The dicts are the sections of ``kvtool analyze --json`` (same keys, same values, null as ``None``), and
    ``to_dict()`` is the whole object.  ``analysis`` is the core result the CLI renders
    (:class:`kvtool.events.analysis.Analysis`).
    """

    analysis: Analysis
    report: dict[str, Any]  # the --json object without "requests"
    requests: pd.DataFrame  # one row per request (the JSON's "requests", NaN for null)
    pool_timeline: pd.DataFrame  # time_s, duration_s, blocks_in_use, long_blocks_in_use: a step curve
    free_latency: pd.DataFrame  # free rows with a latency: request_id, ts_s, num_blocks, latency_ms, late_block_seconds
    prefix_matches: pd.DataFrame  # requests with a prompt: request_id, prompt_tokens, match_tokens
    physical_timeline: pd.DataFrame | None  # time_s, duration_s, physical_blocks_in_use; None without block_ids

    @property
    def summary(self) -> dict[str, Any]:
        """The headline figures: ``--json``'s ``summary``."""
        return self.report["summary"]

    @property
    def pool(self) -> dict[str, Any]:
        """Blocks in use, free latency and turnover: ``--json``'s ``pool``."""
        return self.report["pool"]

    @property
    def prefix_reuse(self) -> dict[str, Any]:
        """Hit share, match lengths and the diagnosis codes: ``--json``'s ``prefix_reuse``."""
        return self.report["prefix_reuse"]

    @property
    def long_requests(self) -> dict[str, Any]:
        """The long requests' share of the blocks and the alert: ``--json``'s ``long_requests``."""
        return self.report["long_requests"]

    @property
    def anomalies(self) -> dict[str, Any]:
        """Rejected rows, over-frees and leaks: ``--json``'s ``anomalies``."""
        return self.report["anomalies"]

    @property
    def culprits(self) -> list[dict[str, Any]]:
        """Requests that hold long and use little, worst first: ``--json``'s ``culprits``."""
        return self.report["culprits"]

    @property
    def late_frees(self) -> dict[str, Any]:
        """Requests whose blocks came back later than ``late_free_ms``, named: ``--json``'s ``late_frees``."""
        return self.report["late_frees"]

    def to_dict(self) -> dict[str, Any]:
        """The whole ``kvtool analyze --json`` object."""
        from kvtool.events.tables import request_records

        return {**self.report, "requests": request_records(self.analysis)}


def _arrow_frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()


def _rejected_rows(data: dict[str, Any]) -> RejectedRows:
    from kvtool.events.load import RejectedRows

    first = tuple((int(row), str(reason)) for row, reason in data["first"])
    return RejectedRows(int(data["count"]), dict(data["by_reason"]), first, int(data["blank_rows"]))


def _event_table(events: PathLike | pd.DataFrame, block_size: int | None) -> EventTable:
    """The events to analyse, read by the CLI's loader whatever their form."""
    import pandas as pd

    if isinstance(events, pd.DataFrame):
        import pyarrow as pa

        from kvtool.events.load import events_from_arrow

        source = events.attrs.get(ATTR_SOURCE)
        where = source if isinstance(source, str) else "<DataFrame>"
        size = block_size or events.attrs.get(ATTR_BLOCK_SIZE) or DEFAULT_BLOCK_SIZE
        bare = events.copy(deep=False)
        bare.attrs = {}  # pyarrow would try to store them as JSON in the schema
        try:
            arrow = pa.Table.from_pandas(bare, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as err:
            raise UsageError(f"cannot read the DataFrame as events: {err}", where=where) from None
        table = events_from_arrow(arrow, where=where, default_block_size=size)
        rejected = events.attrs.get(ATTR_REJECTED) or {}
        if isinstance(source, str) and source in rejected and table.rejected.count == 0:
            # the frame of one file: the rows its loader rejected are this analysis's rejected rows too
            table = dataclasses.replace(table, rejected=_rejected_rows(rejected[source]))
        return table
    from kvtool.events.load import load_events as load_table

    path = Path(events)
    if path.name.lower().endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")):
        raise UsageError(
            "vLLM's KV events carry no request ids: analyze takes events of schema 1 (docs/events-schema.md)",
            where=str(path),
            tip="run `kvtool analyze FILE.jsonl --json` for the vLLM event analysis",
        )
    if path.is_dir():
        raise UsageError(
            "a directory holds a fleet: give it as a list", where=str(path), tip=f"analyze([{str(path)!r}])"
        )
    return load_table(path, default_block_size=block_size or DEFAULT_BLOCK_SIZE)


@dataclasses.dataclass(frozen=True, eq=False)
class FleetResult:
    """``kvtool analyze`` on several files (one pool per engine) for a notebook.

    ``requests``: every pool's per-request table with an ``instance`` column; ``prefix_matches`` likewise;
    ``pool_timeline``: each pool's blocks in use (thinned to per-bucket maxima beyond 20,000 steps a pool, as the
    fleet keeps them); ``health``: one row per pool; ``files``: one row per file read (or refused); ``summary``:
    ``--json``'s ``fleet`` figures; ``to_dict()``: the whole fleet ``--json``; ``fleet``: the core
    :class:`kvtool.events.fleet.FleetAnalysis` (each pool's analysis in ``fleet.pools``).
    """

    fleet: FleetAnalysis
    report: dict[str, Any]  # the fleet --json object without "requests"
    requests: pd.DataFrame
    prefix_matches: pd.DataFrame  # instance, request_id, prompt_tokens, match_tokens
    pool_timeline: pd.DataFrame  # instance, time_s, duration_s, blocks_in_use, long_blocks_in_use
    health: pd.DataFrame
    files: pd.DataFrame

    @property
    def summary(self) -> dict[str, Any]:
        """Fleet figures, percentiles exact over every pool's rows: ``--json``'s ``fleet``."""
        return self.report["fleet"]

    @property
    def worst_requests(self) -> list[dict[str, Any]]:
        """The requests that wasted the most slot-seconds, with their pool: ``--json``'s ``worst_requests``."""
        return self.report["worst_requests"]

    @property
    def late_freed(self) -> list[dict[str, Any]]:
        """Requests freed later than ``late_free_ms``, with their pool: ``--json``'s ``late_freed``."""
        return self.report["late_freed"]

    def to_dict(self) -> dict[str, Any]:
        """The whole fleet ``kvtool analyze --json`` object."""
        from kvtool.events.tables import fleet_columns, records

        return {**self.report, "requests": records(fleet_columns(self.fleet))}


def _options(
    block_size: int | None, long_threshold: int, long_share_alert: float, pool_blocks: int | None, top: int, late: float
) -> AnalyzeOptions:
    from kvtool.events.fleet import AnalyzeOptions

    if block_size is not None and block_size <= 0:
        raise UsageError(f"--block-size must be a positive number of tokens, got {block_size}", where="--block-size")
    return AnalyzeOptions(
        default_block_size=block_size or DEFAULT_BLOCK_SIZE,
        long_threshold_tokens=long_threshold,
        long_share_alert=long_share_alert,
        top=top,
        pool_blocks=pool_blocks,
        late_free_ms=late,
    )


def _fleet_result(paths: Sequence[PathLike], options: AnalyzeOptions, workers, scheduler) -> FleetResult:
    import pandas as pd

    from kvtool.events.fleet import analyze_fleet
    from kvtool.events.sources import find_pool_files
    from kvtool.events.tables import fleet_columns, fleet_to_json, pool_timeline_table, prefix_matches_table

    fleet = analyze_fleet(find_pool_files([str(p) for p in paths]), options, workers=workers, scheduler=scheduler)
    requests = pd.DataFrame(dict(fleet_columns(fleet)))
    return FleetResult(
        fleet=fleet,
        report=fleet_to_json(fleet),
        requests=requests,
        prefix_matches=_per_pool(fleet, prefix_matches_table),
        pool_timeline=_per_pool(fleet, pool_timeline_table),
        health=pd.DataFrame([to_jsonable(h) for h in fleet.health]),
        files=pd.DataFrame([to_jsonable(f) for f in fleet.files]),
    )


def _per_pool(fleet: FleetAnalysis, table_of) -> pd.DataFrame:
    """One table of every pool's analysis, an ``instance`` column first (the tables of kvtool.events.tables)."""
    import pandas as pd

    frames = []
    for pool in fleet.pools:
        frame = _arrow_frame(table_of(pool.analysis))
        frame.insert(0, "instance", pool.instance)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@overload
def analyze(
    events: PathLike | pd.DataFrame,
    *,
    block_size: int | None = None,
    long_threshold: int = DEFAULT_LONG_THRESHOLD,
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT,
    pool_blocks: int | None = None,
    top: int = DEFAULT_TOP,
    late_free_ms: float = DEFAULT_LATE_FREE_MS,
    workers: None = None,
    scheduler: None = None,
) -> AnalyzeResult: ...


@overload
def analyze(
    events: Sequence[PathLike],
    *,
    block_size: int | None = None,
    long_threshold: int = DEFAULT_LONG_THRESHOLD,
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT,
    pool_blocks: int | None = None,
    top: int = DEFAULT_TOP,
    late_free_ms: float = DEFAULT_LATE_FREE_MS,
    workers: int | None = None,
    scheduler: str | None = None,
) -> FleetResult: ...


def analyze(
    events: PathLike | pd.DataFrame | Sequence[PathLike],
    *,
    block_size: int | None = None,
    long_threshold: int = DEFAULT_LONG_THRESHOLD,
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT,
    pool_blocks: int | None = None,
    top: int = DEFAULT_TOP,
    late_free_ms: float = DEFAULT_LATE_FREE_MS,
    workers: int | None = None,
    scheduler: str | None = None,
) -> AnalyzeResult | FleetResult:
    """Per-request holding time versus utilization, and the health of the block pool (``kvtool analyze``).

    ``events``: an events file (schema 1) or a DataFrame in that schema (from :func:`load_events`, or built by
    hand: extra columns are ignored, rows are checked as a file's are) -> :class:`AnalyzeResult`; or a list of
    files, directories and globs (``"logs/instance=*/**/*.parquet"``) -> :class:`FleetResult`, one pool per engine
    as ``kvtool analyze`` reports several files (``workers``/``scheduler`` run them on Dask).  The options are the
    CLI's (docs/analyze.md): ``block_size`` tokens per block where a row has none (default: the one
    ``load_events`` used, else 16), ``long_threshold`` tokens for a long request, ``long_share_alert``,
    ``pool_blocks`` (the pool's capacity), ``top`` culprits, ``late_free_ms`` (a free later than this is named).

    An :class:`AnalyzeResult` has ``requests``, ``pool_timeline``, ``free_latency``, ``prefix_matches`` (and
    ``physical_timeline``) as DataFrames; ``summary``, ``pool``, ``prefix_reuse``, ``long_requests``,
    ``anomalies``, ``culprits``, ``late_frees`` as the sections of ``--json``; ``to_dict()`` the whole ``--json``.

    Example: request ``a`` holds 2 blocks for 1 s, then 3 for 1 s, and its free comes 800 ms late:

    >>> import pandas as pd
    >>> from kvtool.api import analyze
    >>> events = pd.DataFrame({
    ...     "ts": [0.0, 1.0, 2.0],
    ...     "event": ["allocate", "append", "free"],
    ...     "request_id": ["a", "a", "a"],
    ...     "num_blocks": [2, 1, 3],
    ...     "num_tokens": [20, 1, None],
    ...     "latency_ms": [None, None, 800.0],
    ... })
    >>> result = analyze(events)
    >>> result.requests[["request_id", "holding_time_s", "block_seconds", "peak_blocks"]]
      request_id  holding_time_s  block_seconds  peak_blocks
    0          a             2.0            5.0            3
    >>> result.summary["free_latency_ms_max"], float(result.free_latency["late_block_seconds"].sum())
    (800.0, 2.4)
    >>> [(late["request_id"], late["free_latency_ms"]) for late in result.late_frees["top"]]
    [('a', 800.0)]
    """
    import pandas as pd

    options = _options(block_size, long_threshold, long_share_alert, pool_blocks, top, late_free_ms)
    if not isinstance(events, (str, os.PathLike, pd.DataFrame)):
        given = list(events)
        _paths(given, where="analyze")  # none given: refused as load_events([]) refuses
        return _fleet_result(given, options, workers, scheduler)
    if workers is not None or scheduler is not None:
        raise UsageError("workers and scheduler apply to several files (a list)", where="analyze")
    return _single_result(_event_table(events, block_size), options)


def _single_result(table: EventTable, options: AnalyzeOptions) -> AnalyzeResult:
    from kvtool.events.tables import (
        analysis_to_json,
        free_latency_table,
        physical_timeline_table,
        pool_timeline_table,
        prefix_matches_table,
        requests_table,
    )

    if table.instance is not None and len(set(table.instance.tolist()) - {-1}) > 1:
        raise UsageError(
            f"the events hold {len(table.instance_ids)} instances (an instance/engine column): one pool each",
            where=table.path,
            tip=f"analyze([{table.path!r}]) reports each pool and the fleet, as the CLI does",
        )
    analysis = options.analyze(table)
    physical = physical_timeline_table(analysis)
    return AnalyzeResult(
        analysis=analysis,
        report=analysis_to_json(analysis, with_requests=False),
        requests=_arrow_frame(requests_table(analysis)),
        pool_timeline=_arrow_frame(pool_timeline_table(analysis)),
        free_latency=_arrow_frame(free_latency_table(table)),
        prefix_matches=_arrow_frame(prefix_matches_table(analysis)),
        physical_timeline=None if physical is None else _arrow_frame(physical),
    )
