"""``kvtool analyze`` over a fleet: many engines' event files, each engine its own pool, in-process or on Dask.

The analysis partitions naturally: one unit of work per engine (``analyze_pool``: load its files, split rows by
an ``instance``/``engine`` column when there is one, run :func:`analyze_events` per pool) and a small reduction
(``reduce_fleet``): the per-request rows of every pool, one health row per pool, the worst pools and requests, and
fleet percentiles computed exactly from the concatenated per-request (and per-free) rows, never from merged
sketches or averaged percentiles.  On Dask (``--workers`` / ``--scheduler``, the optional ``fleet`` extra) the
units run on workers and only their results travel; the result is the same as in-process, figure for figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES
from kvtool.events.analysis import (
    DEFAULT_LATE_FREE_MS,
    DEFAULT_LONG_SHARE_ALERT,
    DEFAULT_LONG_THRESHOLD_TOKENS,
    DEFAULT_TOP,
    REQUEST_COLUMNS,
    Analysis,
    analyze_events,
)
from kvtool.events.load import DEFAULT_BLOCK_SIZE, EventTable, RejectedRows, load_events
from kvtool.events.segments import nearest_rank, percentiles
from kvtool.events.sources import PoolFiles

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

MAX_TIMELINE_POINTS = 20_000  # a pool's step curves travel thinned to this many points (what the charts draw)
nan = float("nan")


@dataclasses.dataclass(frozen=True)
class AnalyzeOptions:
    """The options of one analysis, shipped with each unit of work."""

    default_block_size: int = DEFAULT_BLOCK_SIZE
    long_threshold_tokens: int = DEFAULT_LONG_THRESHOLD_TOKENS
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT
    top: int = DEFAULT_TOP
    pool_blocks: int | None = None
    late_free_ms: float = DEFAULT_LATE_FREE_MS
    # a fleet's pools keep their step curves (for charts and the library's pool_timeline); the CLI keeps them
    # only for --plot: 50 pools' curves are 40 MB of the fleet's peak memory, and nothing else prints them
    keep_timelines: bool = True
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES  # a compressed file inflating past this is refused

    def analyze(self, table: EventTable, progress: Callable[[str], None] | None = None) -> Analysis:
        return analyze_events(
            table,
            progress=progress,
            long_threshold_tokens=self.long_threshold_tokens,
            long_share_alert=self.long_share_alert,
            top=self.top,
            pool_blocks=self.pool_blocks,
            late_free_ms=self.late_free_ms,
        )


@dataclasses.dataclass(frozen=True)
class FileLoad:
    """One file as read: its accepted rows and rejected rows, or why it was refused as a whole."""

    path: str
    pool: str  # the pool files' name (the engine from the path)
    events: int
    rejected_rows: int
    rejected_by_reason: dict[str, int]
    blank_rows: int
    refused: str | None  # the error when the file could not be read at all (empty, binary, missing columns)


@dataclasses.dataclass(frozen=True, eq=False)
class PoolResult:
    """One engine's pool: its analysis (the same as ``kvtool analyze`` on its rows alone)."""

    instance: str
    paths: tuple[str, ...]
    analysis: Analysis


@dataclasses.dataclass(frozen=True, eq=False)
class UnitResult:
    """What one unit of work (one engine's files) returns: small, so it travels cheaply from a Dask worker."""

    files: tuple[FileLoad, ...]
    pools: tuple[PoolResult, ...]


# ---------------------------------------------------------------------------------------------------- one unit


def analyze_pool(pool_files: PoolFiles, options: AnalyzeOptions) -> UnitResult:
    """Load one engine's files, split them by instance column if any, and analyse each pool (a unit of work).

    A file that cannot be read at all is recorded as refused (the fleet goes on); bad rows are rejected per row.
    """
    loads: list[FileLoad] = []
    tables: list[EventTable] = []
    for path in pool_files.paths:
        try:
            table = load_events(
                path, default_block_size=options.default_block_size, max_input_bytes=options.max_input_bytes
            )
        except InputFileError as err:
            loads.append(FileLoad(path, pool_files.name, 0, 0, {}, 0, refused=err.one_line()))
            continue
        r = table.rejected
        loads.append(FileLoad(path, pool_files.name, table.events, r.count, dict(r.by_reason), r.blank_rows, None))
        tables.append(table)
    if not tables:
        return UnitResult(tuple(loads), ())
    merged = tables[0] if len(tables) == 1 else concat_tables(tables, pool_files.name)
    del tables
    return UnitResult(tuple(loads), _analyze_pools(merged, pool_files.name, pool_files.paths, options))


def pools_of_table(table: EventTable, name: str, paths: tuple[str, ...], options: AnalyzeOptions) -> UnitResult:
    """One loaded file (with an instance column) as a unit: its load record and one analysis per pool."""
    r = table.rejected
    load = FileLoad(table.path, name, table.events, r.count, dict(r.by_reason), r.blank_rows, None)
    return UnitResult((load,), _analyze_pools(table, name, paths, options))


def _analyze_pools(table: EventTable, name: str, paths: tuple[str, ...], options: AnalyzeOptions):
    return tuple(
        PoolResult(instance, paths, _kept_apart(_travel_light(options.analyze(pool), options.keep_timelines)))
        for instance, pool in split_instances(table, name)
    )


def _kept_apart(analysis: Analysis) -> Analysis:
    """The analysis with its arrays copied into one mapping of their own, outside the malloc heap.

    A fleet keeps every pool's result until the end.  Left where the analysis allocated them, between the
    temporaries of its file, they split the heap's free space into pieces too small for the next file's arrays,
    and the heap grows by more than they hold.
    """
    import mmap

    import numpy as np

    arrays: list[np.ndarray] = []
    _arrays_of(analysis, arrays)
    sizes = [-(-a.nbytes // 64) * 64 for a in arrays]  # each array 64-byte aligned
    if not sum(sizes):
        return analysis
    region = mmap.mmap(-1, sum(sizes))
    offsets = dict(zip(map(id, arrays), np.cumsum([0, *sizes[:-1]]).tolist()))

    def moved(a: np.ndarray) -> np.ndarray:
        copy = np.frombuffer(region, dtype=a.dtype, count=a.size, offset=offsets[id(a)]).reshape(a.shape)
        copy[...] = a
        return copy

    return _replaced(analysis, moved)


def _arrays_of(value, out: list) -> None:
    import numpy as np

    if isinstance(value, np.ndarray):
        if not value.dtype.hasobject:  # Python objects cannot live in a mapping
            out.append(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _arrays_of(getattr(value, field.name), out)


def _replaced(value, moved):
    import numpy as np

    if isinstance(value, np.ndarray):
        return value if value.dtype.hasobject else moved(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _replaced(getattr(value, f.name), moved) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changed)
    return value


def _travel_light(analysis: Analysis, keep_timelines: bool = True) -> Analysis:
    """The analysis with its step curves thinned to what a chart draws (per-bucket maxima), or emptied when they
    are not kept; the rest as is."""
    tl = analysis.timeline
    points = MAX_TIMELINE_POINTS if keep_timelines else 0
    t, b, long_b = _thinned(tl.time_s, tl.blocks_in_use, tl.long_blocks_in_use, points)
    pt = pb = None
    if tl.physical_time_s is not None:
        pt, pb, _ = _thinned(tl.physical_time_s, tl.physical_blocks_in_use, None, points)
    timeline = dataclasses.replace(
        tl, time_s=t, blocks_in_use=b, long_blocks_in_use=long_b, physical_time_s=pt, physical_blocks_in_use=pb
    )
    return dataclasses.replace(analysis, timeline=timeline)


def _thinned(t, v, w, points: int):
    """thin_step_curve to ``points`` buckets; no points: empty arrays of the same types (never views)."""
    from kvtool.events.segments import thin_step_curve

    if points:
        return thin_step_curve(t, v, w, points)
    return tuple(None if a is None else a[:0].copy() for a in (t, v, w))


def concat_tables(tables: Sequence[EventTable], name: str) -> EventTable:
    """The rows of several files of one engine as one table (request ids joined by value, block ids re-indexed)."""
    import numpy as np

    def cat(values):
        return np.concatenate(values)

    def optional(field: str, fill):
        columns = [getattr(t, field) for t in tables]
        if all(c is None for c in columns):
            return None
        return cat([c if c is not None else np.full(t.events, fill(t)) for c, t in zip(columns, tables)])

    request, request_ids = _join_codes([(t.request, t.request_ids) for t in tables])
    source, source_ids = _join_codes(
        [(t.source_request if t.source_request is not None else _blank(t), t.source_request_ids) for t in tables]
    )
    instance, instance_ids = _join_codes(
        [(t.instance if t.instance is not None else _blank(t), t.instance_ids) for t in tables]
    )
    offsets = np.cumsum([0] + [t.events for t in tables])[:-1]
    listed = [
        (t.block_id_rows + off, t.block_id_values) for t, off in zip(tables, offsets) if t.block_id_rows is not None
    ]
    return EventTable(
        path=name,
        columns_found=tuple(dict.fromkeys(c for t in tables for c in t.columns_found)),
        ts=cat([t.ts for t in tables]),
        event=cat([t.event for t in tables]),
        request=request,
        request_ids=request_ids,
        num_blocks=cat([t.num_blocks for t in tables]),
        num_tokens=cat([t.num_tokens for t in tables]),
        block_size=optional("block_size", lambda t: t.default_block_size),
        latency_ms=optional("latency_ms", lambda t: nan),
        free_pool_blocks=optional("free_pool_blocks", lambda t: nan),
        source_request=None if all(t.source_request is None for t in tables) else source,
        source_request_ids=source_ids,
        block_id_rows=cat([r for r, _ in listed]) if listed else None,
        block_id_values=cat([v for _, v in listed]) if listed else None,
        rejected=_joined_rejections(tables),
        default_block_size=tables[0].default_block_size,
        instance=None if all(t.instance is None for t in tables) else instance,
        instance_ids=instance_ids,
    )


def _blank(table: EventTable):
    import numpy as np

    return np.full(table.events, -1, dtype=np.int32)


def _join_codes(parts):
    """Codes into per-table value lists -> codes into one joined list (by value, first appearance order)."""
    import numpy as np

    joined: dict[str, int] = {}
    out = []
    for codes, values in parts:
        lut = np.array([joined.setdefault(v, len(joined)) for v in values] + [-1], dtype=np.int32)
        out.append(lut[codes])  # -1 (blank) -> the last entry, -1
    return (np.concatenate(out) if out else np.zeros(0, np.int32)), tuple(joined)


def _joined_rejections(tables: Sequence[EventTable]) -> RejectedRows:
    by_reason: dict[str, int] = {}
    first: list[tuple[int, str]] = []
    for t in tables:
        for reason, count in t.rejected.by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + count
        first += [(row, f"{reason} in {t.path}") for row, reason in t.rejected.first]
    return RejectedRows(
        count=sum(t.rejected.count for t in tables),
        by_reason=by_reason,
        first=tuple(first[:10]),
        blank_rows=sum(t.rejected.blank_rows for t in tables),
    )


def split_instances(table: EventTable, default_name: str) -> list[tuple[str, EventTable]]:
    """The table's pools: one per value of its instance column (blank: ``default_name``), else the whole table.

    Rejected rows cannot always be told apart by instance (a row with a wrong field count has none): in a split
    file they stay with the file (FileLoad), not with a pool.
    """
    import numpy as np

    if table.instance is None:
        return [(default_name, table)]
    codes = table.instance
    present = np.unique(codes)
    names = [default_name if c < 0 else table.instance_ids[c] for c in present.tolist()]
    if len(present) == 1:
        return [(names[0], table)]
    empty = RejectedRows(0, {}, (), 0)
    return [(name, _subset(table, codes == c, empty)) for name, c in zip(names, present.tolist())]


def _subset(table: EventTable, rows, rejected: RejectedRows) -> EventTable:
    """The table restricted to some rows (request ids renumbered, block id listings re-indexed)."""
    import numpy as np

    used, request = np.unique(table.request[rows], return_inverse=True)
    block_id_rows = block_id_values = None
    if table.block_id_rows is not None and table.block_id_values is not None:
        keep = rows[table.block_id_rows]
        block_id_rows = (np.cumsum(rows) - 1)[table.block_id_rows[keep]]
        block_id_values = table.block_id_values[keep]

    def pick(values):
        return None if values is None else values[rows]

    return dataclasses.replace(
        table,
        ts=table.ts[rows],
        event=table.event[rows],
        request=request.astype(np.int32),
        request_ids=tuple(table.request_ids[i] for i in used.tolist()),
        num_blocks=table.num_blocks[rows],
        num_tokens=table.num_tokens[rows],
        block_size=pick(table.block_size),
        latency_ms=pick(table.latency_ms),
        free_pool_blocks=pick(table.free_pool_blocks),
        source_request=pick(table.source_request),
        block_id_rows=block_id_rows,
        block_id_values=block_id_values,
        rejected=rejected,
        instance=None,
        instance_ids=(),
    )


# ---------------------------------------------------------------------------------------------------- the fleet


@dataclasses.dataclass(frozen=True)
class PoolHealth:
    """One row per pool (engine): its headline figures, for the per-instance table."""

    instance: str
    files: int
    events: int
    requests: int
    rejected_rows: int
    peak_blocks_in_use: int
    mean_blocks_in_use: float
    utilization: float
    wasted_slot_seconds: float
    late_free_requests: int
    late_free_block_seconds: float
    # wasted slot-seconds + late-free block-seconds x the free rows' block size: capacity that did no work
    lost_slot_seconds: float
    free_latency_ms_p99: float
    holding_time_s_p50: float
    leaked_requests: int
    over_frees: int
    preemptions: int
    long_peak_share: float
    long_alert: bool
    prefix_hit_share: float
    prefix_diagnosis: str


@dataclasses.dataclass(frozen=True)
class FleetSummary:
    """Fleet totals, and percentiles computed exactly from the concatenated per-request (per-free) rows."""

    files: int
    files_refused: int
    instances: int
    events: int
    requests: int
    rejected_rows: int  # of every file, including rows no pool could claim
    blank_rows: int
    leaked_requests: int
    leaked_blocks: int
    over_frees: int
    preemptions: int
    block_seconds: float
    wasted_slot_seconds: float
    late_free_block_seconds: float
    late_free_requests: int
    late_free_threshold_ms: float
    utilization: float  # sum of token-seconds / sum of slot-seconds over every request
    holding_time_s_p50: float
    holding_time_s_p95: float
    holding_time_s_p99: float
    holding_time_s_max: float
    free_latency_ms_p50: float  # over every free row with a latency
    free_latency_ms_p95: float
    free_latency_ms_p99: float
    free_latency_ms_max: float
    peak_blocks_p50: float  # per request, nearest rank (a block count that occurred)
    peak_blocks_p99: float
    match_tokens_p50: float  # per request with a prompt, nearest rank
    match_tokens_p90: float


@dataclasses.dataclass(frozen=True)
class FleetRequest:
    """A request named in a fleet ranking, with its pool."""

    instance: str
    request_id: str
    wasted_slot_seconds: float
    holding_time_s: float
    utilization: float
    free_latency_ms_max: float
    late_free_block_seconds: float
    peak_blocks: int
    leaked: bool


@dataclasses.dataclass(frozen=True, eq=False)
class FleetRequests:
    """The per-request table of every pool, concatenated in pool order (``columns()`` -> a DataFrame's dict)."""

    instance_names: tuple[str, ...]
    instance: np.ndarray  # int32 index into instance_names, per request
    request_ids: tuple[str, ...]
    values: dict[str, np.ndarray]  # REQUEST_COLUMNS (without request_id) -> concatenated column

    def __len__(self) -> int:
        return len(self.request_ids)

    def columns(self) -> dict[str, Any]:
        """``instance``, ``request_id`` and the per-request columns: ``pandas.DataFrame(fleet.requests.columns())``."""
        names = self.instance_names
        return {
            "instance": [names[i] for i in self.instance.tolist()],
            "request_id": list(self.request_ids),
            **self.values,
        }


@dataclasses.dataclass(frozen=True, eq=False)
class FleetAnalysis:
    """The result of ``kvtool analyze`` on several files: per pool, and for the fleet."""

    summary: FleetSummary
    health: tuple[PoolHealth, ...]  # every pool, in name order
    worst_instances: tuple[PoolHealth, ...]  # by lost slot-seconds (up to --top)
    worst_requests: tuple[FleetRequest, ...]  # by wasted slot-seconds (up to --top)
    late_freed: tuple[FleetRequest, ...]  # free latency above the threshold, by late-free block-seconds
    files: tuple[FileLoad, ...]
    pools: tuple[PoolResult, ...]
    requests: FleetRequests
    free_latencies_ms: np.ndarray  # every free row's latency, pool after pool
    options: AnalyzeOptions


def reduce_fleet(units: Sequence[UnitResult], options: AnalyzeOptions) -> FleetAnalysis:
    """Join the units' results: exact fleet figures from the per-request rows, the worst pools and requests."""
    import numpy as np

    files = tuple(f for u in units for f in u.files)
    pools = tuple(p for u in units for p in u.pools)
    if files and not pools:
        raise _every_file_refused(files)
    _check_unique(pools)
    requests = _fleet_requests(pools)
    free_lat = np.concatenate([p.analysis.free_latencies_ms for p in pools]) if pools else np.zeros(0)
    health = tuple(_health(p) for p in pools)
    top = options.top
    lost = np.array([h.lost_slot_seconds for h in health])
    worst = tuple(health[i] for i in np.argsort(-lost, kind="stable")[:top].tolist() if lost[i] > 0)
    return FleetAnalysis(
        summary=_fleet_summary(files, pools, requests, free_lat, options),
        health=health,
        worst_instances=worst,
        worst_requests=_ranked(requests, requests.values["wasted_slot_seconds"], top),
        late_freed=_ranked(
            requests,
            np.where(
                requests.values["free_latency_ms_max"] > options.late_free_ms,
                requests.values["late_free_block_seconds"],
                -1.0,
            ),
            top,
        ),
        files=files,
        pools=pools,
        requests=requests,
        free_latencies_ms=free_lat,
        options=options,
    )


def _every_file_refused(files: Sequence[FileLoad]) -> InputFileError:
    """A fleet none of whose files could be read: no pool, no answer (exit 3), as for one such file."""
    names = ", ".join(f.path for f in files[:3]) + (f", and {len(files) - 3:,} more" if len(files) > 3 else "")
    return InputFileError(
        f"every events file was refused ({len(files):,} of {len(files):,}): there is no pool to analyse",
        where=names,
        tip=f"the first one: {files[0].refused}",
    )


def _check_unique(pools: Sequence[PoolResult]) -> None:
    seen: dict[str, tuple[str, ...]] = {}
    for p in pools:
        if p.instance in seen and seen[p.instance] != p.paths:
            raise UsageError(
                f"instance {p.instance!r} has rows in files of different engines "
                f"({seen[p.instance][0]} and {p.paths[0]}): its pool would be split",
                tip="put each engine's files under one folder instance=NAME/ (Hive partitions) or one file",
            )
        seen[p.instance] = p.paths


def _fleet_requests(pools: Sequence[PoolResult]) -> FleetRequests:
    import numpy as np

    names = tuple(p.instance for p in pools)
    tables = [p.analysis.requests for p in pools]
    values = {
        name: np.concatenate([t.column(name) for t in tables]) if tables else np.zeros(0)
        for name in (*REQUEST_COLUMNS[1:], "token_seconds", "slot_seconds")
    }
    instance = np.repeat(np.arange(len(pools), dtype=np.int32), [len(t) for t in tables])
    return FleetRequests(names, instance, tuple(r for t in tables for r in t.request_ids), values)


def _health(pool: PoolResult) -> PoolHealth:
    a = pool.analysis
    s, p, lr, pr = a.summary, a.pool, a.long_requests, a.prefix_reuse
    return PoolHealth(
        instance=pool.instance,
        files=len(pool.paths),
        events=s.events,
        requests=s.requests,
        rejected_rows=s.rejected_rows,
        peak_blocks_in_use=s.peak_blocks_in_use,
        mean_blocks_in_use=s.mean_blocks_in_use,
        utilization=s.utilization,
        wasted_slot_seconds=s.wasted_slot_seconds,
        late_free_requests=a.late_frees.requests,
        late_free_block_seconds=p.late_free_block_seconds,
        lost_slot_seconds=s.wasted_slot_seconds + float(a.requests.late_free_slot_seconds.sum()),
        free_latency_ms_p99=p.free_latency_ms_p99,
        holding_time_s_p50=s.holding_time_s_p50,
        leaked_requests=s.leaked_requests,
        over_frees=s.over_frees,
        preemptions=s.preemptions,
        long_peak_share=lr.peak_share,
        long_alert=lr.alert,
        prefix_hit_share=pr.hit_share,
        prefix_diagnosis=", ".join(pr.diagnosis),
    )


def _fleet_summary(files, pools, requests: FleetRequests, free_lat, options: AnalyzeOptions) -> FleetSummary:
    import numpy as np

    v = requests.values
    slot = float(v["slot_seconds"].sum())
    hold = percentiles(v["holding_time_s"])
    with np.errstate(invalid="ignore"):
        hold_p99 = float(np.percentile(v["holding_time_s"], 99)) if len(requests) else nan
    fl = percentiles(free_lat)
    match = np.concatenate([p.analysis.match_tokens for p in pools]) if pools else np.zeros(0)
    late = v["free_latency_ms_max"] > options.late_free_ms
    return FleetSummary(
        files=len(files),
        files_refused=sum(1 for f in files if f.refused),
        instances=len(pools),
        events=sum(f.events for f in files),
        requests=len(requests),
        rejected_rows=sum(f.rejected_rows for f in files),
        blank_rows=sum(f.blank_rows for f in files),
        leaked_requests=int(v["leaked"].sum()),
        leaked_blocks=int(v["leaked_blocks"].sum()),
        over_frees=sum(p.analysis.summary.over_frees for p in pools),
        preemptions=int(v["preemptions"].sum()),
        block_seconds=float(v["block_seconds"].sum()),
        wasted_slot_seconds=float(v["wasted_slot_seconds"].sum()),
        late_free_block_seconds=float(v["late_free_block_seconds"].sum()),
        late_free_requests=int(late.sum()),
        late_free_threshold_ms=options.late_free_ms,
        utilization=float(v["token_seconds"].sum()) / slot if slot > 0 else nan,
        holding_time_s_p50=hold[0],
        holding_time_s_p95=hold[1],
        holding_time_s_p99=hold_p99,
        holding_time_s_max=hold[3],
        free_latency_ms_p50=fl[0],
        free_latency_ms_p95=fl[1],
        free_latency_ms_p99=fl[2],
        free_latency_ms_max=fl[3],
        peak_blocks_p50=nearest_rank(v["peak_blocks"], 50),
        peak_blocks_p99=nearest_rank(v["peak_blocks"], 99),
        match_tokens_p50=nearest_rank(match, 50),
        match_tokens_p90=nearest_rank(match, 90),
    )


def _ranked(requests: FleetRequests, score, top: int) -> tuple[FleetRequest, ...]:
    import numpy as np

    v = requests.values
    order = np.argsort(-score, kind="stable")[:top]
    return tuple(
        FleetRequest(
            instance=requests.instance_names[requests.instance[i]],
            request_id=requests.request_ids[i],
            wasted_slot_seconds=float(v["wasted_slot_seconds"][i]),
            holding_time_s=float(v["holding_time_s"][i]),
            utilization=float(v["utilization"][i]),
            free_latency_ms_max=float(v["free_latency_ms_max"][i]),
            late_free_block_seconds=float(v["late_free_block_seconds"][i]),
            peak_blocks=int(v["peak_blocks"][i]),
            leaked=bool(v["leaked"][i]),
        )
        for i in order.tolist()
        if score[i] > 0
    )


# ---------------------------------------------------------------------------------------------------- running


Progress = Callable[[int, int, "UnitResult | None", PoolFiles], None]  # (units done, units, result, its files)


def analyze_fleet(
    units: Sequence[PoolFiles],
    options: AnalyzeOptions,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Progress | None = None,
) -> FleetAnalysis:
    """Analyse every engine's files and reduce: in this process, or on Dask with ``workers``/``scheduler``."""
    if workers is not None and workers <= 0:
        raise UsageError(f"--workers must be a positive number of processes, got {workers}", where="--workers")
    note = progress or (lambda done, total, result, files: None)
    if workers is None and scheduler is None:
        results = []
        for i, unit in enumerate(units):
            results.append(analyze_pool(unit, options))
            note(i + 1, len(units), results[-1], unit)
    else:
        results = _on_dask(units, options, workers, scheduler, note)
    return reduce_fleet(results, options)


def _on_dask(units, options, workers, scheduler, note) -> list[UnitResult]:
    """One task per engine on a Dask cluster (a local one of ``workers`` processes, or ``scheduler``'s)."""
    from kvtool.core.dask_map import map_on_dask

    done = [0]

    def each(i: int, result: UnitResult) -> None:
        done[0] += 1
        note(done[0], len(units), result, units[i])

    return map_on_dask(
        analyze_pool,
        list(units),
        options,
        workers=workers,
        scheduler=scheduler,
        feature="kvtool analyze --workers/--scheduler",
        each=each,
    )
