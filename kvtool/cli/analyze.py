"""`kvtool analyze FILE`: per-request holding time versus utilization, and the health of the block pool.

Thin layer: parse options, call ``load_events`` and ``analyze_events``, hand the result to a renderer.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import typer

from kvtool.cli.options import JsonOpt, path_option, scheduler_option, workers_option
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress
from kvtool.core.errors import CheckFailed, UsageError
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES, MAX_INPUT_ENV, MAX_INPUT_OPTION
from kvtool.core.memory import arrow_on_the_heap, keep_freed_memory

PROGRESS_MIN_BYTES = 16 * 1024 * 1024  # show a progress bar on a terminal for files at least this large
_STAGES = ("reading", "checking rows", "sorting", "integrating", "pool", "prefix reuse")


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    @handle_errors
    def command(
        events: list[str] = typer.Argument(
            ...,
            help="Events files (.csv, .csv.gz, .parquet; schema 1, docs/events-schema.md), directories, globs "
            "(fleet/instance=*/**/*.parquet) or fsspec URLs. Several files: one pool per engine, and a fleet report.",
            show_default=False,
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
        late_free_ms: float = typer.Option(
            100.0, "--late-free-ms", help="A free later than this (ms after the request ended) is named as late."
        ),
        top: int = typer.Option(10, "--top", help="How many culprits (late frees, worst pools) to list."),
        prompts: Optional[Path] = path_option(
            None,
            "--prompts",
            empty_tip="give the prompts file (JSON lines: request_id, prompt_token_ids, num_cached_tokens)",
            help="Classify each request's prefix-cache outcome instead (hit, unshared prefix, shared but shorter "
            "than the cacheable unit, not kept by the sliding window, evicted before reuse), with the share of "
            "prompt tokens lost to each and, from the recorder's rows, each KV-cache group's effective utilization "
            "beside vLLM's usage gauge. JSON lines in submission order: request_id, prompt_token_ids and "
            "(vLLM's events) num_cached_tokens. docs/prefix-cache.md.",
        ),
        json_output: JsonOpt = False,
        export: Optional[Path] = path_option(
            None,
            "--export",
            empty_tip="give the file of the per-request table (NAME.csv, NAME.csv.gz or NAME.parquet)",
            help="Write every table: the per-request table to this file, the pool timeline, prefix matches and free "
            "latencies beside it (NAME-pool_timeline.csv, ...); .csv, .csv.gz or .parquet by the name. A fleet: the "
            "per-request table of every pool.",
        ),
        plot: Optional[Path] = path_option(
            None,
            "--plot",
            empty_tip="give a folder for the charts ('.' for the current one)",
            needs=("matplotlib", "kvtool analyze --plot"),
            help="Write four PNG charts into this directory (a fleet: one folder per worst pool).",
        ),
        workers: Optional[int] = workers_option("Several files: run them"),
        scheduler: Optional[str] = scheduler_option("Several files: run them"),
        strict: bool = typer.Option(
            False,
            "--strict",
            help="Exit 1 if any row was rejected, a free was clamped, or a request leaked (vLLM "
            "events: if batches were lost or a line was rejected; a fleet: also if a file was refused).",
        ),
        max_input_bytes: str = typer.Option(
            "8GiB",
            MAX_INPUT_OPTION,
            envvar=MAX_INPUT_ENV,
            help="Refuse a compressed file (.csv.gz, .jsonl.gz) that inflates past this size (8GiB, 500MB, bytes), "
            "counted while it inflates: a gzip bomb stops there. Also KVTOOL_MAX_INPUT_BYTES.",
        ),
    ) -> None:
        """Per-request KV block holding time versus utilization, and the health of the block pool.

        EVENTS: .csv, .csv.gz or .parquet in the events schema 1 (docs/events-schema.md),
        or vLLM's KV-event JSON lines (.jsonl, as `kvtool capture` records them).

        Several files, a directory or a glob: each engine's events are one pool (an
        instance=NAME/ folder, an instance or engine column, or the file), reported per pool
        and for the fleet. --workers and --scheduler run them on Dask (the fleet extra).

        Several vLLM KV-event files, one per instance: the reuse missed across instances
        (blocks computed on one while another held them), docs/analyze.md.

        Examples: kvtool analyze events.csv --plot charts/
        kvtool analyze 'logs/instance=*/**/*.parquet' --workers 8 --json > fleet.json
        """
        from kvtool.core.units import parse_size
        from kvtool.events.fleet import AnalyzeOptions
        from kvtool.events.sources import is_single_file

        max_inflated_bytes = parse_size(max_input_bytes, option=MAX_INPUT_OPTION)
        if prompts is not None:
            return _prefix_outcomes(events, prompts, json_output=json_output, max_input_bytes=max_inflated_bytes)
        if len(events) > 1 and _all_vllm_event_files(events):
            ignored = [
                name
                for name, value, default in (
                    ("--block-size", block_size, 16),
                    ("--long-threshold", long_threshold, 2048),
                    ("--long-share-alert", long_share_alert, 0.6),
                    ("--pool-blocks", pool_blocks, None),
                    ("--late-free-ms", late_free_ms, 100.0),
                    ("--workers", workers, None),
                    ("--scheduler", scheduler, None),
                )
                if value != default
            ]
            return _cross_instance(
                events,
                _Output(json_output=json_output, export=export, plot=plot, strict=strict),
                top=top,
                ignored=ignored,
                max_input_bytes=max_inflated_bytes,
            )
        options = AnalyzeOptions(
            default_block_size=_positive(block_size, "--block-size"),
            long_threshold_tokens=long_threshold,
            long_share_alert=long_share_alert,
            top=top,
            pool_blocks=pool_blocks,
            late_free_ms=late_free_ms,
            keep_timelines=plot is not None,  # a fleet's step curves: only the charts draw them
            max_input_bytes=max_inflated_bytes,
        )
        output = _Output(json_output=json_output, export=export, plot=plot, strict=strict)
        if export is not None:
            from kvtool.events.render import check_export_path

            check_export_path(export)  # before a long read, not after it
        if not is_single_file(events):
            if workers is None and scheduler is None:
                arrow_on_the_heap()  # file after file in this process: one heap, reused, for reads and analyses
            return _analyze_fleet(events, options, output, workers=workers, scheduler=scheduler)
        keep_freed_memory()  # this process is ours: large temporaries reuse their pages (see kvtool.core.memory)
        events_file = Path(events[0])
        if workers is not None or scheduler is not None:
            from kvtool.cli.output import warn

            warn("one file is analysed in this process: --workers/--scheduler apply to several files")
        _require_content(events_file)
        if _is_vllm_events_file(events_file):
            ignored = [
                name
                for name, value, default in (
                    ("--block-size", block_size, 16),
                    ("--long-threshold", long_threshold, 2048),
                    ("--long-share-alert", long_share_alert, 0.6),
                    ("--pool-blocks", pool_blocks, None),
                    ("--late-free-ms", late_free_ms, 100.0),
                    ("--top", top, 10),
                )
                if value != default
            ]
            output = dataclasses.replace(output, max_input_bytes=max_inflated_bytes)
            return _analyze_jsonl(events_file, output, ignored=ignored)
        _analyze_file(events_file, options, output)


@dataclasses.dataclass(frozen=True)
class _Output:
    json_output: bool
    export: Optional[Path]
    plot: Optional[Path]
    strict: bool
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES  # vLLM's KV events (the CSV path has it in its AnalyzeOptions)


def _analyze_file(events_file: Path, options, output: _Output) -> None:
    """One file: in this process (no Dask import); a file holding several instances becomes a fleet."""
    from kvtool.events.fleet import pools_of_table, reduce_fleet
    from kvtool.events.load import load_events
    from kvtool.events.render import anomaly_line, export_tables, render_analysis, write_json
    from kvtool.events.tables import analysis_tables

    with _progress(events_file) as progress:
        note = progress.stage
        table = load_events(
            events_file,
            default_block_size=options.default_block_size,
            progress=note,
            max_input_bytes=options.max_input_bytes,
        )
        if table.instance is not None and len(set(table.instance.tolist())) > 1:
            unit = pools_of_table(table, str(events_file), (str(events_file),), options)
            del table
            return _report_fleet(reduce_fleet([unit], options), output, where=str(events_file))
        analysis = options.analyze(table, progress=note)
        tables = analysis_tables(analysis, table) if output.export is not None else None
        del table
    written = []
    if output.export is not None and tables is not None:
        written += [str(p) for p in export_tables(tables, output.export)]
    if output.plot is not None:
        from kvtool.events.plots import write_plots

        written += [str(p) for p in write_plots(analysis, output.plot)]
    _print(
        output, lambda: write_json(analysis, sys.stdout), lambda console: render_analysis(analysis, console), written
    )
    if output.strict and analysis.anomalies.count:
        raise CheckFailed(anomaly_line(analysis), where=str(events_file))


def _analyze_fleet(arguments: list[str], options, output: _Output, *, workers, scheduler) -> None:
    """Several files: one pool per engine, in this process or on Dask; progress per file on stderr."""
    from kvtool.events.fleet import analyze_fleet
    from kvtool.events.sources import find_pool_files

    units = find_pool_files(arguments)
    total_files = sum(len(u.paths) for u in units)
    done_files = 0
    with StderrProgress(label="analyze") as progress:

        def note(done: int, total: int, result, unit) -> None:
            nonlocal done_files
            for f in result.files:
                done_files += 1
                state = f"refused ({f.refused})" if f.refused else f"{f.events:,} events, {f.rejected_rows:,} rejected"
                if progress.task is not None:  # a terminal: one bar over the files
                    progress.task("analyze: files", done_files, total_files)
                else:  # a log: one line per file
                    sys.stderr.write(f"analyze: file {done_files}/{total_files} {f.path}: {state}\n")
                    sys.stderr.flush()

        fleet = analyze_fleet(units, options, workers=workers, scheduler=scheduler, progress=note)
    _report_fleet(fleet, output, where=", ".join(arguments))


def _report_fleet(fleet, output: _Output, where: str) -> None:
    from kvtool.events.render import (
        export_fleet_tables,
        fleet_anomalies,
        fleet_anomaly_line,
        render_fleet,
        write_fleet_json,
    )

    written = []
    if output.export is not None:
        written += [str(p) for p in export_fleet_tables(fleet, output.export)]
    if output.plot is not None:
        from kvtool.events.plots import pool_plot_folder, write_plots

        for health in fleet.worst_instances or fleet.health[:1]:
            pool = next(p for p in fleet.pools if p.instance == health.instance)
            folder = pool_plot_folder(output.plot, pool.instance)
            written += [str(p) for p in write_plots(pool.analysis, folder)]
    _print(output, lambda: write_fleet_json(fleet, sys.stdout), lambda console: render_fleet(fleet, console), written)
    if output.strict and fleet_anomalies(fleet):
        raise CheckFailed(fleet_anomaly_line(fleet), where=where)


def _print(output: _Output, as_json, as_tables, written: list[str]) -> None:
    """The answer on stdout: JSON only, or the tables and the files written."""
    if output.json_output:
        as_json()
        return
    from kvtool.cli.output import stdout_console

    console = stdout_console()
    as_tables(console)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def _require_content(path: Path) -> None:
    """A missing or empty file (an empty capture too) says so, whatever its suffix."""
    from kvtool.core.errors import InputFileError

    if not path.exists():
        raise InputFileError("events file not found", where=str(path))
    if path.is_dir():
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
        if head[:2] == b"\x1f\x8b":
            import gzip
            import zlib

            try:
                with gzip.open(path, "rb") as fh:
                    head = fh.read(1 << 16)
            except (OSError, EOFError, zlib.error):
                return  # the loader says what is wrong with it
    except OSError:
        return
    if not head.strip():
        raise InputFileError("the events file is empty: it has no events", where=str(path))


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
    from kvtool.vllm.events.analysis import looks_like_vllm_events

    return looks_like_vllm_events(path)


def _analyze_jsonl(path: Path, output: _Output, *, ignored: list[str]) -> None:
    """vLLM's JSON-lines KV-cache events (as recorded or captured by `kvtool capture`): issue 6, section 3.

    These events carry no request ids, so the per-request table (--export) does not exist for them, and the
    per-request options (``ignored``: given but meaningless here) are named in a warning, not dropped silently.
    A malformed line is an error already (a cut last line is a rejected line); --strict also fails on lost batches
    (missing sequence numbers) and on a rejected line.
    """
    if output.export is not None:
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
    analysis = run_vllm_analysis(
        path, json_output=output.json_output, plot_dir=output.plot, max_input_bytes=output.max_input_bytes
    )
    missing = analysis.counts.missing_seqs
    if output.strict and missing:
        raise CheckFailed(f"{missing:,} batch sequence numbers are missing: those events were lost", where=str(path))
    if output.strict and analysis.rejected_lines:
        line, reason = analysis.rejected_lines[0]
        raise CheckFailed(f"a line was rejected: {reason}", where=f"{path}, line {line}")


def _all_vllm_event_files(arguments: list[str]) -> bool:
    """Every argument names one local vLLM KV-event file: the cross-instance report.  Anything else (a mix with
    events-schema files too) is the fleet report, which refuses the vLLM files by name and analyses the others."""
    files = [Path(a) for a in arguments if "://" not in a and not set(a) & set("*?[") and Path(a).is_file()]
    return len(files) == len(arguments) and all(_is_vllm_events_file(f) for f in files)


def _cross_instance(
    arguments: list[str], output: _Output, *, top: int, ignored: list[str], max_input_bytes: int
) -> None:
    """Several vLLM KV-event files, one per instance: the reuse missed across them (kvtool.vllm.events.cross_instance).

    The replay is one pass over every instance's events in timestamp order, so it runs in this process (--workers
    and --scheduler are named in a warning).  --strict fails on lost batches or a cut line in any file.
    """
    from kvtool.cli.output import print_json, stdout_console, warn
    from kvtool.vllm.events.cross_instance import analyze_cross_instance, read_instances
    from kvtool.vllm.events.render import cross_instance_tables

    for option, value in (("--export", output.export), ("--plot", output.plot)):
        if value is not None:
            raise UsageError(
                f"{option} has no table or chart to write for the cross-instance report of vLLM's KV events",
                where=option,
                tip="use --json for the whole report",
            )
    if top < 0:
        raise UsageError(f"--top must be 0 or more, got {top}", where="--top")
    for argument in arguments:
        _require_content(Path(argument))
    if ignored:
        warn(
            f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to the cross-instance report "
            "of vLLM's KV events (one time-ordered replay in this process): ignored"
        )
    result = analyze_cross_instance(read_instances(arguments, max_input_bytes), top=top)
    if output.json_output:
        print_json(result)
    else:
        console = stdout_console()
        for renderable in cross_instance_tables(result):
            console.print(renderable)
    if output.strict:
        for i in result.instances:
            if i.missing_seqs:
                raise CheckFailed(
                    f"{i.missing_seqs:,} batch sequence numbers are missing: those events were lost", where=i.source
                )
            if i.rejected_lines:
                raise CheckFailed("a line was rejected: its last line is cut short", where=i.source)


def _prefix_outcomes(events: list[str], prompts: Path, *, json_output: bool, max_input_bytes: int) -> None:
    """``--prompts``: the prefix-outcome report of one recorder file or one vLLM KV-event file."""
    from kvtool.cli.output import print_json, stdout_console
    from kvtool.events.prefix_render import prefix_tables
    from kvtool.events.prefix_sources import prefix_report_from_events, prefix_report_from_rows, read_prompts

    if len(events) != 1:
        raise UsageError("--prompts classifies one run: give one events file", where="--prompts")
    path = Path(events[0])
    _require_content(path)
    records = read_prompts(prompts)
    if _is_vllm_events_file(path):
        from kvtool.vllm.events.wire import read_event_lines

        stream = read_event_lines(path, max_input_bytes, keep_tokens=True).events
        report = prefix_report_from_events(path, stream, records)
    else:
        report = prefix_report_from_rows(path, records)
    if json_output:
        print_json(report)
        return
    console = stdout_console()
    for part in prefix_tables(report):
        console.print(part)


def _progress(path: Path) -> StderrProgress:
    """A stage progress bar on stderr, only when stderr is a terminal and the file is large."""
    try:
        big = path.stat().st_size >= PROGRESS_MIN_BYTES
    except OSError:
        big = False
    return StderrProgress(enabled=big, label="analyze", stages=_STAGES)
