"""Rendering of an :class:`~kvtool.events.analysis.Analysis`: rich tables, the JSON object, and the CSV export.

The JSON and the tables are built from the same dataclasses, so they never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.core.format import fmt_num as _num
from kvtool.core.format import fmt_pct
from kvtool.events.analysis import REQUEST_COLUMNS, Analysis
from kvtool.events.fleet import FleetAnalysis
from kvtool.events.load import SCHEMA_VERSION, arrow_from_numpy
from kvtool.events.tables import (
    BOOL_COLUMNS,
    EXPORT_TABLES,
    FLOAT_COLUMNS,
    analysis_to_json,
    fleet_columns,
    fleet_to_json,
    request_records,
)


def _row_lines(columns: list[tuple[str, Any]]) -> str:
    """Rows of JSON objects from columns (text columns as lists of str, the others numpy arrays), one per line
    joined by ``ROW_SEPARATOR``; numbers are formatted by Arrow's casts (in C++, without the GIL), column by column.

    Arrow writes a float in the shortest form that reads back the same value, as Python's repr does, but without
    ``.0`` on an integral value (``5``, ``1e+15``, ``-0``): that suffix is added, so a JSON reader gets a float
    (and -0.0) back.  NaN and infinities are ``null``.  Arrow arrays are built from buffers: ``pa.array`` and
    ``pa.scalar`` would import pandas (0.16 s) to ask whether the input is a pandas object.
    """
    import json
    from json.encoder import encode_basestring_ascii  # what json.dumps does for one str, without its overhead

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: list[Any] = []
    for i, (name, values) in enumerate(columns):
        parts.append(_ascii_scalar(("{" if i == 0 else ", ") + json.dumps(name) + ": "))
        if isinstance(values, (list, tuple)):
            parts.append(
                _quoted_plain_texts(values)
                or _ascii_array([encode_basestring_ascii(v) if isinstance(v, str) else json.dumps(v) for v in values])
            )
        elif name in FLOAT_COLUMNS:
            floats = np.ascontiguousarray(values, dtype=np.float64)
            digits = arrow_from_numpy(pa.float64(), floats, valid=np.isfinite(floats)).cast(pa.string())
            integral = pc.invert(pc.match_substring_regex(digits, "[.en]"))  # "5", "-0": no point, no exponent
            digits = pc.if_else(
                integral, pc.binary_join_element_wise(digits, _ascii_scalar(".0"), _ascii_scalar("")), digits
            )
            parts.append(pc.coalesce(digits, _ascii_scalar("null")))
        elif name in BOOL_COLUMNS:
            flags = arrow_from_numpy(pa.bool_(), np.asarray(values, dtype=bool))
            parts.append(pc.if_else(flags, _ascii_scalar("true"), _ascii_scalar("false")))
        else:
            parts.append(arrow_from_numpy(pa.int64(), np.asarray(values, dtype=np.int64)).cast(pa.string()))
    parts.append(_ascii_scalar("}" + ROW_SEPARATOR))
    rows = pc.binary_join_element_wise(*parts, _ascii_scalar(""))
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=len(rows) + 1, offset=4 * rows.offset)
    data = rows.buffers()[2]
    return data[offsets[0] : offsets[-1] - len(ROW_SEPARATOR)].to_pybytes().decode("ascii")


def _ascii_array(texts: list[str]):
    """An Arrow string array of ASCII texts (one byte per character), built from its buffers."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(texts) + 1, dtype=np.int32)  # a chunk of ROWS_PER_CHUNK rows stays far below 2 GiB
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int32, count=len(texts)), out=offsets[1:])
    data = "".join(texts).encode("ascii")
    return pa.Array.from_buffers(pa.string(), len(texts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _quoted_plain_texts(texts):
    """The texts as JSON strings when none needs an escape (every character printable ASCII, no ``"`` or ``\\``):
    each one quoted, in one join instead of one encoder call per text; None when one needs an escape or is not
    a str."""
    import numpy as np
    import pyarrow as pa

    try:
        joined = '""'.join(texts)
    except TypeError:  # a None (null) among them
        return None
    if not (joined.isascii() and joined.isprintable()) or "\\" in joined or joined.count('"') != 2 * (len(texts) - 1):
        return None
    offsets = np.zeros(len(texts) + 1, dtype=np.int32)  # a chunk of ROWS_PER_CHUNK rows stays far below 2 GiB
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int32, count=len(texts)) + 2, out=offsets[1:])
    data = ('"' + joined + '"').encode("ascii")
    return pa.Array.from_buffers(pa.string(), len(texts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _ascii_scalar(text: str):
    return _ascii_array([text])[0]


def write_json(analysis: Analysis, stream) -> None:
    """Write the ``--json`` object: sections indented, then one compact line per request."""

    table = analysis.requests
    columns = [(name, table.column(name)) for name in REQUEST_COLUMNS]
    _write_with_rows(analysis_to_json(analysis, with_requests=False), columns, stream)


ROWS_PER_CHUNK = (
    20_000  # request rows encoded at a time: a fleet's million rows are never all text at once (peak memory)
)
ROW_SEPARATOR = ",\n    "


def _write_with_rows(doc: dict[str, Any], columns: list[tuple[str, Any]], stream) -> None:
    """The JSON object ``doc`` indented, then ``"requests"``: one compact line per row, written chunk by chunk."""
    import json

    head = json.dumps(doc, indent=2, allow_nan=False)[:-2]
    n = len(columns[0][1]) if columns else 0
    if not n:
        stream.write(head + ',\n  "requests": []\n}\n')
        stream.flush()
        return
    stream.write(head + ',\n  "requests": [\n    ')
    for start in range(0, n, ROWS_PER_CHUNK):
        part = [(name, values[start : start + ROWS_PER_CHUNK]) for name, values in columns]
        stream.write((ROW_SEPARATOR if start else "") + _row_lines(part))
    stream.write("\n  ]\n}\n")
    stream.flush()


EXPORT_SUFFIXES = (".csv", ".csv.gz", ".parquet")  # what --export writes, chosen by the name's ending


def check_export_path(path: Path) -> None:
    """``--export`` needs a file name ending in one of EXPORT_SUFFIXES, in a folder that exists; anything else is a
    usage error, said before any file is read (docs/analyze.md, "Output").  A folder (``.`` included, a traceback
    in ``with_name``), another suffix (``x.xlsx`` was written as CSV) or a missing folder (it was created without
    a word) is refused.  An empty value never gets here (``kvtool.cli.options.path_option`` refuses it)."""
    where = f"--export {path}"
    forms = "NAME.csv, NAME.csv.gz or NAME.parquet"
    if not path.name or path.is_dir():
        raise UsageError(f"--export takes a file name ({forms}), not a folder", where=where)
    if not path.name.lower().endswith(EXPORT_SUFFIXES):
        suffix = Path(path.name).suffix
        ending = f"ends in {suffix}" if suffix else "has no suffix"
        raise UsageError(
            f"--export writes CSV, gzip-compressed CSV or Parquet, chosen by the name: {path.name!r} {ending}",
            where=where,
            tip=f"name the file {forms}",
        )
    folder = next((p for p in path.parents if p.exists()), None)
    if folder is not None and not folder.is_dir():  # was "[Errno 17] File exists: '...'" after the analysis
        raise UsageError(f"{folder} is a file, not a folder", where=where)
    if not path.parent.is_dir():
        raise UsageError(
            f"the folder {path.parent} does not exist",
            where=where,
            tip=f"create it first (mkdir -p {path.parent}), or export into a folder that exists",
        )


def export_paths(path: Path, names: tuple[str, ...] = EXPORT_TABLES) -> dict[str, Path]:
    """Where ``--export PATH`` writes each table: the per-request table at PATH, each other one beside it with the
    table's name added to the stem (``out.csv`` -> ``out-pool_timeline.csv``; ``.csv.gz`` and ``.parquet`` alike)."""
    name = path.name
    lower = name.lower()
    suffix = next((s for s in (".csv.gz", ".parquet", ".csv") if lower.endswith(s)), "")
    stem = name[: len(name) - len(suffix)] if suffix else name
    return {
        table: path if table == names[0] else path.with_name(f"{stem}-{table}{suffix or '.csv'}") for table in names
    }


def export_tables(tables: dict, path: Path) -> list[Path]:
    """Write every table (``kvtool.events.tables.analysis_tables``): CSV, gzip-compressed CSV or Parquet by PATH's
    extension (``.csv``, ``.csv.gz``, ``.parquet``: check_export_path refuses any other), into a folder that
    exists.  Null values are empty CSV cells.
    Returns the paths written, the per-request table first."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    written = []
    check_export_path(path)
    paths = export_paths(path, tuple(tables))
    try:
        for name, table in tables.items():
            target = paths[name]
            lower = target.name.lower()
            if lower.endswith(".parquet"):
                pq.write_table(table, str(target))
            else:
                with pa.output_stream(str(target), compression="gzip" if lower.endswith(".gz") else None) as sink:
                    pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
            written.append(target)
    except (OSError, pa.ArrowException) as err:
        raise UsageError(f"cannot write the export file: {err}", where=str(path)) from None
    return written


def _columns_table(columns: list[tuple[str, Any]]):
    """An Arrow table of columns (text columns as lists of str, the others numpy arrays); NaN floats as null."""
    import numpy as np
    import pyarrow as pa

    arrays = {}
    for name, values in columns:
        if isinstance(values, (list, tuple)):
            arrays[name] = pa.array(list(values), pa.string())
        elif name in FLOAT_COLUMNS:
            values = np.asarray(values, dtype=float)
            arrays[name] = pa.array(values, mask=np.isnan(values))
        else:
            arrays[name] = pa.array(np.asarray(values))
    return pa.table(arrays)


# ---------------------------------------------------------------------------------------------------- tables


def _esc(text: str) -> str:
    """Request ids and paths are data, not rich markup ("[red]" stays literal)."""
    from rich.markup import escape

    return escape(text)


def _pct(value: Any) -> str:
    return fmt_pct(value, decimals=1, space=True)


def _pct0(value: Any) -> str:
    return fmt_pct(value, decimals=0)


def _kv_table(title: str, rows: list[tuple[str, str]]):
    from kvtool.core.render import new_table

    table = new_table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table


def render_analysis(analysis: Analysis, console) -> None:
    """Print the report as rich tables on ``console`` (stdout), one section after another."""
    for section in (
        _summary_section,
        _culprits_section,
        _late_frees_section,
        _pool_section,
        _prefix_section,
        _long_section,
        _anomalies_section,
    ):
        section(analysis, console)


def _summary_section(analysis: Analysis, console) -> None:
    s, p = analysis.summary, analysis.pool
    latencies = (s.free_latency_ms_p50, s.free_latency_ms_p95, s.free_latency_ms_p99, s.free_latency_ms_max)
    console.print(
        _kv_table(
            f"kvtool analyze: {_esc(analysis.file)} (events schema {analysis.schema_version})",
            [
                ("events (accepted rows)", _num(s.events, ",d")),
                ("requests", _num(s.requests, ",d")),
                ("rejected rows", _num(s.rejected_rows, ",d")),
                ("trace duration", _num(s.duration_s, ",.3f", " s")),
                ("peak blocks in use", f"{_num(s.peak_blocks_in_use, ',d')} (at {_num(p.peak_at_s, ',.3f')} s)"),
                ("mean blocks in use", _num(s.mean_blocks_in_use, ",.1f")),
                ("pool utilization (tokens / slots held)", _pct(s.utilization)),
                ("holding time p50 / p95", f"{_num(s.holding_time_s_p50)} / {_num(s.holding_time_s_p95)} s"),
                ("free latency p50 / p95 / p99 / max", " / ".join(_num(v, ",.1f") for v in latencies) + " ms"),
                ("wasted slot-seconds", _num(s.wasted_slot_seconds, ",.1f")),
                ("preemptions", _num(s.preemptions, ",d")),
                ("leaked requests (blocks)", f"{_num(s.leaked_requests, ',d')} ({_num(s.leaked_blocks, ',d')})"),
            ],
        )
    )
    console.print()


def _culprits_section(analysis: Analysis, console) -> None:
    from kvtool.core.render import new_table

    culprits = new_table(
        title="Culprits: requests that hold long and use little (by wasted slot-seconds)", title_justify="left"
    )
    for name, justify in (
        ("#", "right"),
        ("request_id", "left"),
        ("wasted slot-s", "right"),
        ("holding s", "right"),
        ("utilization", "right"),
        ("block-s", "right"),
        ("peak blocks", "right"),
        ("leaked", "left"),
    ):
        culprits.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, c in enumerate(analysis.culprits, 1):
        culprits.add_row(
            str(i),
            _esc(c.request_id),
            _num(c.wasted_slot_seconds, ",.1f"),
            _num(c.holding_time_s),
            _pct(c.utilization),
            _num(c.block_seconds, ",.1f"),
            _num(c.peak_blocks, ",d"),
            "yes" if c.leaked else "",
        )
    if analysis.culprits:
        console.print(culprits)
    elif analysis.summary.wasted_slot_seconds > 0:  # requests did waste slots: --top 0 asked for none to be listed
        console.print("Culprits: not listed (--top 0)")
    else:
        console.print("Culprits: none (no request holds unused slots)")
    console.print()


def _late_frees_section(analysis: Analysis, console) -> None:
    """The requests freed later than the threshold, named, by the block-seconds their late frees cost."""
    from kvtool.core.render import new_table

    late = analysis.late_frees
    if not analysis.pool.free_latency_count:
        return  # no latency_ms on free rows: nothing to say (the pool table says it)
    head = f"Late frees: free latency above {late.threshold_ms:,.0f} ms (--late-free-ms)"
    if not late.requests:
        console.print(f"{head}: none")
        console.print()
        return
    table = new_table(
        title=f"{head}: {late.requests:,} requests, {late.block_seconds:,.1f} block-seconds lost "
        f"({_pct(late.share_of_late_free_block_seconds)} of all frees' waiting)",
        title_justify="left",
    )
    for name in ("#", "request_id", "free latency ms", "block-s lost", "peak blocks", "holding s"):
        table.add_column(name, justify="left" if name == "request_id" else "right")
    for i, r in enumerate(late.top, 1):
        table.add_row(
            str(i),
            _esc(r.request_id),
            _num(r.free_latency_ms, ",.1f"),
            _num(r.late_free_block_seconds, ",.2f"),
            _num(r.peak_blocks, ",d"),
            _num(r.holding_time_s),
        )
    console.print(table if late.top else f"{head}: {late.requests:,} requests (not listed: --top 0)")
    console.print()


def _pool_section(analysis: Analysis, console) -> None:
    p = analysis.pool
    allocate = (p.allocate_latency_ms_p50, p.allocate_latency_ms_p95, p.allocate_latency_ms_max)
    pool_rows = [
        ("blocks allocated / reused / freed", f"{p.blocks_allocated:,} / {p.blocks_reused:,} / {p.blocks_freed:,}"),
        ("blocks allocated per second", _num(p.blocks_allocated_per_s, ",.1f")),
        ("late-free block-seconds (blocks x free latency)", _num(p.late_free_block_seconds, ",.1f")),
        ("allocate latency p50 / p95 / max", " / ".join(_num(v, ",.2f") for v in allocate) + " ms"),
    ]
    if p.has_block_ids:
        pool_rows += [
            ("distinct physical block ids", _num(p.unique_physical_blocks, ",d")),
            (
                "peak / mean physical blocks in use",
                f"{_num(p.peak_physical_blocks_in_use, ',d')} / {_num(p.mean_physical_blocks_in_use, ',.1f')}",
            ),
            ("reallocations (free -> same id allocated again)", _num(p.reallocations, ",d")),
            ("turnover time p50 / p95", f"{_num(p.turnover_time_s_p50)} / {_num(p.turnover_time_s_p95)} s"),
        ]
    else:
        pool_rows.append(("physical blocks, turnover", "- (no block_ids column)"))
    if p.free_pool_blocks_min is not None:
        pool_rows.append(("free pool blocks, minimum", _num(p.free_pool_blocks_min, ",.0f")))
    if p.capacity_blocks is not None:
        pool_rows.append(("pool capacity (blocks)", _num(p.capacity_blocks, ",.0f")))
    console.print(_kv_table("Pool", pool_rows))
    console.print()


def _prefix_section(analysis: Analysis, console) -> None:
    pr = analysis.prefix_reuse
    hist = ", ".join(f"{m:,} tok x {c:,}" for m, c in pr.histogram[:4]) or "-"
    rows = [
        ("requests with a hit", f"{pr.requests_with_hit:,} of {pr.requests_with_prompt:,} ({_pct(pr.hit_share)})"),
        ("reused / prompt tokens", f"{pr.reused_tokens:,} / {pr.prompt_tokens:,} ({_pct(pr.reused_token_share)})"),
        (
            "match length p50 / p90 (nearest rank)",
            f"{_num(pr.match_tokens_p50, ',.0f')} / {_num(pr.match_tokens_p90, ',.0f')} tokens",
        ),
        ("most common match lengths", hist),
        ("diagnosis", ", ".join(pr.diagnosis)),
    ]
    if pr.distinct_sources is not None:
        sources = ", ".join(f"{_esc(r)} ({b:,})" for r, b in pr.top_sources[:3]) or "-"
        rows.append(("prefix sources (most reused blocks)", f"{pr.distinct_sources:,}: {sources}"))
    console.print(_kv_table("Prefix reuse", rows))
    for line in pr.advice:
        console.print(f"  - {line}", highlight=False)
    console.print()


def _long_section(analysis: Analysis, console) -> None:
    lr = analysis.long_requests
    basis = "of the pool capacity" if lr.basis == "capacity" else "of the blocks in use"
    console.print(
        _kv_table(
            f"Long requests (> {lr.threshold_tokens:,} tokens held)",
            [
                ("long requests", _num(lr.long_requests, ",d")),
                (f"peak share {basis}", f"{_pct(lr.peak_share)} (at {_num(lr.peak_share_at_s, ',.3f')} s)"),
                ("mean share (time-weighted)", _pct(lr.mean_share)),
                (f"time above {lr.alert_share:.0%}", _num(lr.time_above_alert_s, ",.3f", " s")),
            ],
        )
    )
    if lr.alert:
        console.print(
            f"  [bold red]ALERT[/]: long requests held more than {lr.alert_share:.0%} {basis} for "
            f"{lr.time_above_alert_s:,.3f} s (first at {lr.first_alert_at_s:,.3f} s): short requests may starve; "
            "give long requests their own quota or a lower priority"
        )
    console.print()


def _anomalies_section(analysis: Analysis, console) -> None:
    an = analysis.anomalies
    anomaly_rows = [
        ("rejected rows", _num(an.rejected_rows, ",d")),
        (
            "over-frees (clamped at 0)",
            f"{an.over_frees:,} rows, {an.over_freed_blocks:,} blocks, {an.over_free_requests:,} requests",
        ),
        ("leaked requests (blocks)", f"{an.leaked_requests:,} ({an.leaked_blocks:,})"),
    ]
    if an.blank_rows:
        anomaly_rows.append(("blank rows skipped", _num(an.blank_rows, ",d")))
    console.print(_kv_table("Anomalies", anomaly_rows))
    for reason, count in an.rejected_by_reason.items():
        console.print(f"  - {count:,} rows: {reason}", highlight=False)
    if an.first_rejected:
        shown = ", ".join(f"row {row} ({reason})" for row, reason in an.first_rejected)
        console.print(f"  - first rejected: {shown}", highlight=False)
    if an.first_leaked_request_ids:
        console.print(
            f"  - leaked: {_esc(', '.join(an.first_leaked_request_ids))}"
            + (" ..." if an.leaked_requests > len(an.first_leaked_request_ids) else ""),
            highlight=False,
        )


def anomaly_line(analysis: Analysis) -> str:
    an = analysis.anomalies
    return (
        f"{an.count:,} anomalies: {an.rejected_rows:,} rejected rows, {an.over_frees:,} over-frees, "
        f"{an.leaked_requests:,} leaked requests"
    )


# ---------------------------------------------------------------------------------------------------- fleet

MAX_HEALTH_ROWS = 50  # pools shown in the health table (all are in --json)


def write_fleet_json(fleet: FleetAnalysis, stream) -> None:
    """The fleet ``--json``: sections indented, then one compact line per request (with its instance)."""
    _write_with_rows(fleet_to_json(fleet), fleet_columns(fleet), stream)


def export_fleet_tables(fleet: FleetAnalysis, path: Path) -> list[Path]:
    """The per-request table of every pool, with an ``instance`` column first (CSV, CSV.gz or Parquet by PATH)."""
    return export_tables({"requests": _columns_table(fleet_columns(fleet))}, path)


def render_fleet(fleet: FleetAnalysis, console) -> None:
    """Print the fleet report: fleet figures, pool health per instance, worst requests, late frees, files."""
    for section in (_fleet_summary_section, _health_section, _worst_requests_section, _late_freed_section):
        section(fleet, console)
    _files_section(fleet, console)


def _fleet_summary_section(fleet: FleetAnalysis, console) -> None:
    f = fleet.summary
    hold = (f.holding_time_s_p50, f.holding_time_s_p95, f.holding_time_s_p99, f.holding_time_s_max)
    free = (f.free_latency_ms_p50, f.free_latency_ms_p95, f.free_latency_ms_p99, f.free_latency_ms_max)
    console.print(
        _kv_table(
            f"kvtool analyze: fleet of {f.instances:,} pools from {f.files:,} files (events schema {SCHEMA_VERSION})",
            [
                ("events (accepted rows)", _num(f.events, ",d")),
                ("requests", _num(f.requests, ",d")),
                ("rejected rows (blank rows skipped)", f"{f.rejected_rows:,} ({f.blank_rows:,})"),
                ("files refused", _num(f.files_refused, ",d")),
                ("utilization (tokens / slots held)", _pct(f.utilization)),
                ("holding time p50 / p95 / p99 / max", " / ".join(_num(v) for v in hold) + " s"),
                ("free latency p50 / p95 / p99 / max", " / ".join(_num(v, ",.1f") for v in free) + " ms"),
                (
                    f"late frees (> {f.late_free_threshold_ms:,.0f} ms)",
                    f"{f.late_free_requests:,} requests, {f.late_free_block_seconds:,.1f} block-s",
                ),
                (
                    "peak blocks per request p50 / p99",
                    f"{_num(f.peak_blocks_p50, ',.0f')} / {_num(f.peak_blocks_p99, ',.0f')}",
                ),
                (
                    "prefix match p50 / p90",
                    f"{_num(f.match_tokens_p50, ',.0f')} / {_num(f.match_tokens_p90, ',.0f')} tokens",
                ),
                ("wasted slot-seconds", _num(f.wasted_slot_seconds, ",.1f")),
                ("leaked requests (blocks)", f"{f.leaked_requests:,} ({f.leaked_blocks:,})"),
                ("over-frees / preemptions", f"{f.over_frees:,} / {f.preemptions:,}"),
            ],
        )
    )
    console.print()


def _health_section(fleet: FleetAnalysis, console) -> None:
    """Pool health per instance, the worst first (lost slot-seconds); the worst --top marked."""
    from kvtool.core.render import new_table

    worst = {h.instance for h in fleet.worst_instances}
    rows = sorted(fleet.health, key=lambda h: -h.lost_slot_seconds)
    from rich import box

    table = new_table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title="Pool health per instance, worst first (* the worst --top). reqs: requests; rej: rejected rows; "
        "peak: peak blocks in use; util: tokens / slots held; lost: slot-seconds lost = wasted slot-seconds + "
        "late-free block-seconds x block size; late: requests freed late; leak: leaked requests; long: peak "
        "share of long requests (! alert); hits: requests with a prefix hit",
        title_justify="left",
    )
    columns = ("instance", "reqs", "rej", "peak", "util", "lost", "late", "leak", "long", "hits")
    for name in columns:
        if name == "instance":
            table.add_column(name, justify="left")  # a long instance name wraps, never cut
        else:
            table.add_column(name, justify="right", min_width=len(name))
    for h in rows[:MAX_HEALTH_ROWS]:
        table.add_row(
            ("* " if h.instance in worst else "") + _esc(h.instance),
            _num(h.requests, ",d"),
            _num(h.rejected_rows, ",d"),
            _num(h.peak_blocks_in_use, ",d"),
            _pct0(h.utilization),
            _num(h.lost_slot_seconds, ",.0f"),
            _num(h.late_free_requests, ",d"),
            _num(h.leaked_requests, ",d"),
            _pct0(h.long_peak_share) + ("!" if h.long_alert else ""),
            _pct0(h.prefix_hit_share),
        )
    console.print(table)
    if len(rows) > MAX_HEALTH_ROWS:
        console.print(f"  ({len(rows) - MAX_HEALTH_ROWS:,} more pools in --json)", highlight=False)
    console.print()


def _request_rows_table(title: str, requests, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(title=title, title_justify="left")
    for name in ("#", "instance", "request_id", "wasted slot-s", "holding s", "utilization", "free ms", "late block-s"):
        table.add_column(name, justify="left" if name in ("instance", "request_id") else "right")
    for i, r in enumerate(requests, 1):
        table.add_row(
            str(i),
            _esc(r.instance),
            _esc(r.request_id) + (" (leaked)" if r.leaked else ""),
            _num(r.wasted_slot_seconds, ",.1f"),
            _num(r.holding_time_s),
            _pct(r.utilization),
            _num(r.free_latency_ms_max, ",.1f"),
            _num(r.late_free_block_seconds, ",.2f"),
        )
    console.print(table)
    console.print()


def _worst_requests_section(fleet: FleetAnalysis, console) -> None:
    if fleet.worst_requests:
        title = "Worst requests in the fleet: hold long and use little (by wasted slot-seconds)"
        _request_rows_table(title, fleet.worst_requests, console)


def _late_freed_section(fleet: FleetAnalysis, console) -> None:
    threshold = fleet.summary.late_free_threshold_ms
    if fleet.late_freed:
        title = f"Late-freed requests: free latency above {threshold:,.0f} ms, by late-free block-seconds"
        _request_rows_table(title, fleet.late_freed, console)
    elif fleet.free_latencies_ms.size:
        console.print(f"Late-freed requests (free latency above {threshold:,.0f} ms): none")
        console.print()


def _files_section(fleet: FleetAnalysis, console) -> None:
    """Files refused as a whole, and files with rejected rows (the reasons)."""
    for f in fleet.files:
        if f.refused:
            console.print(f"  - refused: {_esc(f.refused)}", highlight=False)
        elif f.rejected_rows:
            reasons = ", ".join(f"{c:,} {r}" for r, c in f.rejected_by_reason.items())
            console.print(f"  - {_esc(f.path)}: {f.rejected_rows:,} rejected rows ({reasons})", highlight=False)


def fleet_anomaly_line(fleet: FleetAnalysis) -> str:
    f = fleet.summary
    return (
        f"fleet anomalies: {f.files_refused:,} files refused, {f.rejected_rows:,} rejected rows, "
        f"{f.over_frees:,} over-frees, {f.leaked_requests:,} leaked requests"
    )


def fleet_anomalies(fleet: FleetAnalysis) -> int:
    f = fleet.summary
    return f.files_refused + f.rejected_rows + f.over_frees + f.leaked_requests


__all__ = [
    "analysis_to_json",
    "fleet_anomalies",
    "fleet_anomaly_line",
    "fleet_to_json",
    "render_fleet",
    "write_fleet_json",
    "anomaly_line",
    "export_fleet_tables",
    "export_paths",
    "export_tables",
    "render_analysis",
    "request_records",
    "write_json",
]
