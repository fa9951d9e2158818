"""The tables of an :class:`~kvtool.events.analysis.Analysis` as plain data: the ``--json`` object and Arrow tables.

Not a renderer: ``kvtool analyze --json`` and ``--export`` (``kvtool.events.render``) and the library
(``kvtool.api``: pandas DataFrames) build on the same functions here, so the CLI and a notebook never disagree.

Tables (one Arrow table each; null where a value does not exist):

- ``requests``: one row per request, the columns of :data:`~kvtool.events.analysis.REQUEST_COLUMNS`;
- ``pool_timeline``: blocks in use (all requests, long requests) as a step curve, one row per change, with
  ``duration_s`` to the next change (the last one to the end of the trace), so time-weighted figures are sums;
- ``prefix_matches``: requests with prompt tokens, their prompt and their prefix match (tokens reused in the
  first holding interval), the population of the prefix-reuse figures;
- ``free_latency``: free rows with a ``latency_ms``, naming the request, and the blocks x latency they cost;
- ``physical_timeline``: distinct physical blocks in use over time (only with a ``block_ids`` column).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.core.jsonable import to_jsonable
from kvtool.events.analysis import REQUEST_COLUMNS, Analysis
from kvtool.events.fleet import FleetAnalysis
from kvtool.events.load import FREE, SCHEMA_VERSION, EventTable

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

FLOAT_COLUMNS = frozenset(
    {
        "holding_time_s",
        "utilization",
        "block_seconds",
        "wasted_slot_seconds",
        "free_latency_ms_max",
        "late_free_block_seconds",
        "first_ts_s",
        "last_ts_s",
    }
)
BOOL_COLUMNS = frozenset({"leaked", "long"})
# The tables `kvtool analyze --export` writes, in order; the first keeps the name given, the others get a suffix.
EXPORT_TABLES = ("requests", "pool_timeline", "prefix_matches", "free_latency", "physical_timeline")


def records(columns: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN -> None), built column-wise; text columns are lists, the others numpy."""
    values = []
    for name, column in columns:
        if isinstance(column, (list, tuple)):
            values.append(list(column))
        elif name in FLOAT_COLUMNS:
            values.append([None if v != v else v for v in column.astype(float).tolist()])
        elif name in BOOL_COLUMNS:
            values.append(column.astype(bool).tolist())
        else:
            values.append(column.astype("int64").tolist())
    names = [name for name, _ in columns]
    return [dict(zip(names, row)) for row in zip(*values)]


def request_records(analysis: Analysis) -> list[dict[str, Any]]:
    """The per-request table as JSON-ready dicts (the ``--json`` ``requests``)."""
    return records([(name, analysis.requests.column(name)) for name in REQUEST_COLUMNS])


def analysis_to_json(analysis: Analysis, with_requests: bool = True) -> dict[str, Any]:
    """The ``--json`` object: ``summary`` and ``requests`` plus the other sections."""
    anomalies = to_jsonable(analysis.anomalies)
    anomalies["first_rejected"] = [{"row": row, "reason": reason} for row, reason in analysis.anomalies.first_rejected]
    prefix = to_jsonable(analysis.prefix_reuse)
    prefix["histogram"] = [{"match_tokens": m, "requests": c} for m, c in analysis.prefix_reuse.histogram]
    prefix["top_sources"] = [{"source_request_id": r, "reused_blocks": b} for r, b in analysis.prefix_reuse.top_sources]
    return {
        "schema_version": analysis.schema_version,
        "file": analysis.file,
        "summary": to_jsonable(analysis.summary),
        "pool": to_jsonable(analysis.pool),
        "prefix_reuse": prefix,
        "long_requests": to_jsonable(analysis.long_requests),
        "anomalies": anomalies,
        "culprits": to_jsonable(list(analysis.culprits)),
        "late_frees": to_jsonable(analysis.late_frees),
        **({"requests": request_records(analysis)} if with_requests else {}),
    }


def fleet_columns(fleet: FleetAnalysis) -> list[tuple[str, Any]]:
    """The fleet's per-request table: ``instance`` then the per-request columns (text as lists, numbers numpy)."""
    columns = fleet.requests.columns()
    return [(name, columns[name]) for name in ("instance", *REQUEST_COLUMNS)]


def fleet_to_json(fleet: FleetAnalysis) -> dict[str, Any]:
    """The fleet ``--json`` object (without ``requests``, which the CLI adds one line per request)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "fleet": to_jsonable(fleet.summary),
        "worst_instances": [h.instance for h in fleet.worst_instances],
        "worst_requests": to_jsonable(list(fleet.worst_requests)),
        "late_freed": to_jsonable(list(fleet.late_freed)),
        "files": to_jsonable(list(fleet.files)),
        "instances": [
            {
                "instance": pool.instance,
                "paths": list(pool.paths),
                "health": to_jsonable(health),
                **analysis_to_json(pool.analysis, with_requests=False),
            }
            for pool, health in zip(fleet.pools, fleet.health)
        ],
    }


def _floats(values) -> pa.Array:
    """Float values with NaN as null (the JSON's null, the CSV's empty cell)."""
    import numpy as np
    import pyarrow as pa

    values = np.asarray(values, dtype=float)
    return pa.array(values, mask=np.isnan(values))


def requests_table(analysis: Analysis) -> pa.Table:
    """One row per request: the columns of the JSON ``requests``."""
    import numpy as np
    import pyarrow as pa

    table = analysis.requests
    arrays = {}
    for name in REQUEST_COLUMNS:
        values = table.column(name)
        if name == "request_id":
            arrays[name] = pa.array(list(values), pa.string())
        elif name in FLOAT_COLUMNS:
            arrays[name] = _floats(values)
        elif name in BOOL_COLUMNS:
            arrays[name] = pa.array(np.asarray(values, dtype=bool))
        else:
            arrays[name] = pa.array(np.asarray(values, dtype=np.int64))
    return pa.table(arrays)


def _durations(time_s, end_s: float):
    """Time from each point of a step curve to the next, the last to ``end_s``."""
    import numpy as np

    time_s = np.asarray(time_s, dtype=float)
    return np.diff(np.r_[time_s, end_s]) if time_s.size else np.zeros(0)


def pool_timeline_table(analysis: Analysis) -> pa.Table:
    """Blocks in use over time (a request's block counted once per request holding it), and the long requests'."""
    import numpy as np
    import pyarrow as pa

    tl = analysis.timeline
    return pa.table(
        {
            "time_s": pa.array(np.asarray(tl.time_s, dtype=float)),
            "duration_s": pa.array(_durations(tl.time_s, analysis.summary.trace_end_s)),
            "blocks_in_use": pa.array(np.asarray(tl.blocks_in_use, dtype=np.int64)),
            "long_blocks_in_use": pa.array(np.asarray(tl.long_blocks_in_use, dtype=np.int64)),
        }
    )


def physical_timeline_table(analysis: Analysis) -> pa.Table | None:
    """Distinct physical blocks in use over time; None without a ``block_ids`` column."""
    import numpy as np
    import pyarrow as pa

    tl = analysis.timeline
    if tl.physical_time_s is None or tl.physical_blocks_in_use is None:
        return None
    return pa.table(
        {
            "time_s": pa.array(np.asarray(tl.physical_time_s, dtype=float)),
            "duration_s": pa.array(_durations(tl.physical_time_s, analysis.summary.trace_end_s)),
            "physical_blocks_in_use": pa.array(np.asarray(tl.physical_blocks_in_use, dtype=np.int64)),
        }
    )


def prefix_matches_table(analysis: Analysis) -> pa.Table:
    """Requests with prompt tokens: prompt tokens and prefix match tokens (the prefix-reuse population)."""
    import numpy as np
    import pyarrow as pa

    prompt = np.asarray(analysis.requests.prompt_tokens, dtype=np.int64)
    has_prompt = np.flatnonzero(prompt > 0)
    ids = analysis.requests.request_ids
    return pa.table(
        {
            "request_id": pa.array([ids[i] for i in has_prompt.tolist()], pa.string()),
            "prompt_tokens": pa.array(prompt[has_prompt]),
            "match_tokens": pa.array(np.asarray(analysis.match_tokens, dtype=np.int64)),
        }
    )


def free_latency_table(events: EventTable) -> pa.Table:
    """Free rows with a ``latency_ms``, in file order: who waited, how long, and the block-seconds it cost."""
    import numpy as np
    import pyarrow as pa

    if events.latency_ms is None:
        rows = np.zeros(0, dtype=np.int64)
        latency = np.zeros(0)
    else:
        rows = np.flatnonzero((events.event == FREE) & ~np.isnan(events.latency_ms))
        latency = events.latency_ms[rows]
    ids = pa.array(events.request_ids, pa.string()) if events.request_ids else pa.array([], pa.string())
    blocks = events.num_blocks[rows].astype(np.int64)
    return pa.table(
        {
            "request_id": ids.take(pa.array(events.request[rows])),
            "ts_s": pa.array(events.ts[rows].astype(float)),
            "num_blocks": pa.array(blocks),
            "latency_ms": pa.array(latency.astype(float)),
            "late_block_seconds": pa.array(blocks * latency / 1000.0),
        }
    )


def analysis_tables(analysis: Analysis, events: EventTable) -> dict[str, pa.Table]:
    """Every table of :data:`EXPORT_TABLES` that exists for this analysis, by name."""
    tables = {
        "requests": requests_table(analysis),
        "pool_timeline": pool_timeline_table(analysis),
        "prefix_matches": prefix_matches_table(analysis),
        "free_latency": free_latency_table(events),
    }
    physical = physical_timeline_table(analysis)
    if physical is not None:
        tables["physical_timeline"] = physical
    return tables
