"""Rendering of an :class:`~kvtool.events.analysis.Analysis`: rich tables, the JSON object, and the CSV export.

The JSON and the tables are built from the same dataclasses, so they never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.core.format import fmt_num as _num
from kvtool.core.format import fmt_pct
from kvtool.core.jsonable import to_jsonable
from kvtool.events.analysis import REQUEST_COLUMNS, Analysis

_FLOAT_COLUMNS = {
    "holding_time_s",
    "utilization",
    "block_seconds",
    "wasted_slot_seconds",
    "free_latency_ms_max",
    "first_ts_s",
    "last_ts_s",
}
_BOOL_COLUMNS = {"leaked", "long"}


def request_records(analysis: Analysis) -> list[dict[str, Any]]:
    """The per-request table as JSON-ready dicts (NaN -> None), built column-wise."""
    table = analysis.requests
    columns = []
    for name in REQUEST_COLUMNS:
        values = table.column(name)
        if name == "request_id":
            columns.append(list(values))
        elif name in _FLOAT_COLUMNS:
            columns.append([None if v != v else v for v in values.astype(float).tolist()])
        elif name in _BOOL_COLUMNS:
            columns.append(values.astype(bool).tolist())
        else:
            columns.append(values.astype("int64").tolist())
    return [dict(zip(REQUEST_COLUMNS, row)) for row in zip(*columns)]


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
        **({"requests": request_records(analysis)} if with_requests else {}),
    }


def _request_lines(analysis: Analysis) -> list[str]:
    """One compact JSON object per request, encoded column by column (a few C-encoder calls, not one per row)."""
    import json

    table = analysis.requests
    columns = []
    for name in REQUEST_COLUMNS:
        values = table.column(name)
        if name == "request_id":
            columns.append([json.dumps(v) for v in values])  # str: the encoder's fast path
            continue
        if name in _FLOAT_COLUMNS:
            items = [None if v != v else v for v in values.astype(float).tolist()]
        elif name in _BOOL_COLUMNS:
            items = values.astype(bool).tolist()
        else:
            items = values.astype("int64").tolist()
        text = json.dumps(items, allow_nan=False)[1:-1]  # numbers, null, true, false: no comma inside an item
        columns.append(text.split(", ") if items else [])
    template = "{" + ", ".join(f'"{name}": %s' for name in REQUEST_COLUMNS) + "}"
    return [template % row for row in zip(*columns)]


def write_json(analysis: Analysis, stream) -> None:
    """Write the ``--json`` object: sections indented, then one compact line per request."""
    import json

    doc = analysis_to_json(analysis, with_requests=False)
    head = json.dumps(doc, indent=2, allow_nan=False)
    lines = _request_lines(analysis)
    if lines:
        text = head[:-2] + ',\n  "requests": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}"
    else:
        text = head[:-2] + ',\n  "requests": []\n}'
    stream.write(text + "\n")
    stream.flush()


def export_requests_csv(analysis: Analysis, path: Path) -> None:
    """Write the per-request table (the JSON ``requests`` columns) as CSV; blank where a value is null."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = analysis.requests
    arrays = {}
    for name in REQUEST_COLUMNS:
        values = table.column(name)
        if name == "request_id":
            arrays[name] = pa.array(list(values), pa.string())
        elif name in _FLOAT_COLUMNS:
            values = np.asarray(values, dtype=float)
            arrays[name] = pa.array(values, mask=np.isnan(values))
        else:
            arrays[name] = pa.array(np.asarray(values))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.table(arrays), str(path), pacsv.WriteOptions(quoting_style="needed"))
    except (OSError, pa.ArrowException) as err:
        raise UsageError(f"cannot write the export file: {err}", where=str(path)) from None


# ---------------------------------------------------------------------------------------------------- tables


def _esc(text: str) -> str:
    """Request ids and paths are data, not rich markup ("[red]" stays literal)."""
    from rich.markup import escape

    return escape(text)


def _pct(value: Any) -> str:
    return fmt_pct(value, decimals=1, space=True)


def _kv_table(title: str, rows: list[tuple[str, str]]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table


def render_analysis(analysis: Analysis, console) -> None:
    """Print the report as rich tables on ``console`` (stdout)."""
    from rich.table import Table

    s, p, pr, lr, an = (
        analysis.summary,
        analysis.pool,
        analysis.prefix_reuse,
        analysis.long_requests,
        analysis.anomalies,
    )
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
                (
                    "free latency p50 / p95 / p99 / max",
                    " / ".join(
                        _num(v, ",.1f")
                        for v in (
                            s.free_latency_ms_p50,
                            s.free_latency_ms_p95,
                            s.free_latency_ms_p99,
                            s.free_latency_ms_max,
                        )
                    )
                    + " ms",
                ),
                ("wasted slot-seconds", _num(s.wasted_slot_seconds, ",.1f")),
                ("preemptions", _num(s.preemptions, ",d")),
                ("leaked requests (blocks)", f"{_num(s.leaked_requests, ',d')} ({_num(s.leaked_blocks, ',d')})"),
            ],
        )
    )
    console.print()
    culprits = Table(
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
        culprits.add_column(name, justify=justify)
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
    elif s.wasted_slot_seconds > 0:  # requests did waste slots: --top 0 asked for none to be listed
        console.print("Culprits: not listed (--top 0)")
    else:
        console.print("Culprits: none (no request holds unused slots)")
    console.print()
    pool_rows = [
        ("blocks allocated / reused / freed", f"{p.blocks_allocated:,} / {p.blocks_reused:,} / {p.blocks_freed:,}"),
        ("blocks allocated per second", _num(p.blocks_allocated_per_s, ",.1f")),
        ("late-free block-seconds (blocks x free latency)", _num(p.late_free_block_seconds, ",.1f")),
        (
            "allocate latency p50 / p95 / max",
            " / ".join(
                _num(v, ",.2f")
                for v in (p.allocate_latency_ms_p50, p.allocate_latency_ms_p95, p.allocate_latency_ms_max)
            )
            + " ms",
        ),
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
    hist = ", ".join(f"{m:,} tok x {c:,}" for m, c in pr.histogram[:4]) or "-"
    console.print(
        _kv_table(
            "Prefix reuse",
            [
                (
                    "requests with a hit",
                    f"{pr.requests_with_hit:,} of {pr.requests_with_prompt:,} ({_pct(pr.hit_share)})",
                ),
                (
                    "reused / prompt tokens",
                    f"{pr.reused_tokens:,} / {pr.prompt_tokens:,} ({_pct(pr.reused_token_share)})",
                ),
                (
                    "match length p50 / p90",
                    f"{_num(pr.match_tokens_p50, ',.0f')} / {_num(pr.match_tokens_p90, ',.0f')} tokens",
                ),
                ("most common match lengths", hist),
                ("diagnosis", ", ".join(pr.diagnosis)),
            ]
            + (
                [
                    (
                        "prefix sources (most reused blocks)",
                        f"{pr.distinct_sources:,}: "
                        + (", ".join(f"{_esc(r)} ({b:,})" for r, b in pr.top_sources[:3]) or "-"),
                    )
                ]
                if pr.distinct_sources is not None
                else []
            ),
        )
    )
    for line in pr.advice:
        console.print(f"  - {line}", highlight=False)
    console.print()
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


__all__ = [
    "analysis_to_json",
    "anomaly_line",
    "export_requests_csv",
    "render_analysis",
    "request_records",
    "write_json",
]
