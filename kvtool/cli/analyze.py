"""`kvtool analyze FILE`: per-request holding time versus utilization, and the health of the block pool.

Thin layer: parse options, call ``load_events`` and ``analyze_events``, hand the result to a renderer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from kvtool.cli.options import JsonOpt
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress
from kvtool.core.errors import CheckFailed, UsageError

PROGRESS_MIN_BYTES = 16 * 1024 * 1024  # show a progress bar on a terminal for files at least this large
_STAGES = ("reading", "checking rows", "sorting", "integrating", "pool", "prefix reuse")


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    @handle_errors
    def command(
        events_file: Path = typer.Argument(
            ..., help="Events file: .csv, .csv.gz or .parquet (schema 1, docs/events-schema.md).", show_default=False
        ),
        block_size: int = typer.Option(16, "--block-size", help="Tokens per block where a row has no block_size."),
        long_threshold: int = typer.Option(
            2048, "--long-threshold", help="A request holding more tokens than this at its peak is a long request."
        ),
        long_share_alert: float = typer.Option(
            0.6, "--long-share-alert", help="Alert when long requests hold more than this share of the blocks."
        ),
        pool_blocks: Optional[int] = typer.Option(
            None, "--pool-blocks", help="Pool capacity in blocks (share basis for the long-request alert)."
        ),
        top: int = typer.Option(10, "--top", help="How many culprits to list."),
        json_output: JsonOpt = False,
        export: Optional[Path] = typer.Option(None, "--export", help="Write the per-request table to this CSV file."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write four PNG charts into this directory."),
        strict: bool = typer.Option(
            False,
            "--strict",
            help="Exit 1 if any row was rejected, a free was clamped, or a request leaked (vLLM "
            "events: if batches were lost).",
        ),
    ) -> None:
        """Per-request KV block holding time versus utilization, and the health of the block pool.

        EVENTS_FILE: .csv, .csv.gz or .parquet in the events schema 1 (docs/events-schema.md), or vLLM's KV-event
        JSON lines (.jsonl, as `kvtool capture` records them).
        """
        if _is_vllm_events_file(events_file):
            ignored = [
                name
                for name, value, default in (
                    ("--block-size", block_size, 16),
                    ("--long-threshold", long_threshold, 2048),
                    ("--long-share-alert", long_share_alert, 0.6),
                    ("--pool-blocks", pool_blocks, None),
                    ("--top", top, 10),
                )
                if value != default
            ]
            return _analyze_jsonl(
                events_file, json_output=json_output, plot=plot, export=export, strict=strict, ignored=ignored
            )

        from kvtool.cli.output import stdout_console
        from kvtool.events.analysis import analyze_events
        from kvtool.events.load import load_events
        from kvtool.events.render import anomaly_line, export_requests_csv, render_analysis, write_json

        with _progress(events_file) as progress:
            note = progress.stage
            table = load_events(events_file, default_block_size=_positive(block_size, "--block-size"), progress=note)
            analysis = analyze_events(
                table,
                long_threshold_tokens=long_threshold,
                long_share_alert=long_share_alert,
                top=top,
                pool_blocks=pool_blocks,
                progress=note,
            )
            del table
        written = []
        if export is not None:
            export_requests_csv(analysis, export)
            written.append(str(export))
        if plot is not None:
            from kvtool.events.plots import write_plots

            written += [str(p) for p in write_plots(analysis, plot)]
        if json_output:
            write_json(analysis, sys.stdout)
        else:
            console = stdout_console()
            render_analysis(analysis, console)
            for path in written:
                console.print(f"wrote {path}", highlight=False)
        if strict and analysis.anomalies.count:
            raise CheckFailed(anomaly_line(analysis), where=str(events_file))


def _positive(value: int, option: str) -> int:
    from kvtool.core.errors import UsageError

    if value <= 0:
        raise UsageError(f"{option} must be a positive number of tokens, got {value}", where=option)
    return value


_VLLM_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")
_CSV_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")


def _is_vllm_events_file(path: Path) -> bool:
    """vLLM's JSON-lines KV events: by suffix, or by content for a file with no tabular suffix."""
    name = path.name.lower()
    if name.endswith(_VLLM_SUFFIXES):
        return True
    if name.endswith(_CSV_SUFFIXES):
        return False
    from kvtool.vllm.analysis import looks_like_vllm_events

    return looks_like_vllm_events(path)


def _analyze_jsonl(
    path: Path, *, json_output: bool, plot: Optional[Path], export: Optional[Path], strict: bool, ignored: list[str]
) -> None:
    """vLLM's JSON-lines KV-cache events (as recorded or captured by `kvtool capture`): issue 6, section 3.

    These events carry no request ids, so the per-request table (--export) does not exist for them, and the
    per-request options (``ignored``: given but meaningless here) are named in a warning, not dropped silently.
    A malformed line is an error already; --strict also fails on lost batches (missing sequence numbers).
    """
    if export is not None:
        raise UsageError(
            "--export writes the per-request table, which vLLM's KV events cannot give (they carry no request id)",
            where=str(path),
            tip="use --json for the vLLM event analysis",
        )
    from kvtool.cli.analyze_vllm import run_vllm_analysis

    if ignored:
        from kvtool.cli.output import warn

        warn(
            f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to vLLM's KV events "
            "(no request ids, no per-request table): ignored"
        )
    analysis = run_vllm_analysis(path, json_output=json_output, plot_dir=plot)
    missing = analysis.counts.missing_seqs
    if strict and missing:
        raise CheckFailed(f"{missing:,} batch sequence numbers are missing: those events were lost", where=str(path))


def _progress(path: Path) -> StderrProgress:
    """A stage progress bar on stderr, only when stderr is a terminal and the file is large."""
    try:
        big = path.stat().st_size >= PROGRESS_MIN_BYTES
    except OSError:
        big = False
    return StderrProgress(enabled=big, label="analyze", stages=_STAGES)
