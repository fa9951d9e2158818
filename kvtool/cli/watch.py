"""`kvtool watch`: a live view of a running engine, its alerts, a Prometheus exporter (docs/watch.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import typer

from kvtool.cli.options import JsonOpt, path_option
from kvtool.cli.output import handle_errors
from kvtool.events.analysis import DEFAULT_LATE_FREE_MS, DEFAULT_LONG_SHARE_ALERT, DEFAULT_LONG_THRESHOLD_TOKENS

EXAMPLES = """
Examples:

  kvtool record -o events.csv -- vllm serve MODEL --enable-prefix-caching &
  kvtool watch events.csv --serve-metrics :9400

  kvtool watch events.csv --once --json        # cron: exit 5 when an alert fires

  kvtool watch --replay tests/data/vllm-record/recorded-48-blocks.parquet --speed 4

  kvtool watch --metrics-url http://127.0.0.1:8000/metrics --kv-events tcp://127.0.0.1:5557
"""
ALERTS = "Alerts"


@dataclasses.dataclass(frozen=True)
class WatchReport:
    """The answer of ``--once`` and of the end of a watch: the last snapshot and every alert that fired."""

    snapshot: object  # kvtool.watch.state.Snapshot
    fired: tuple[tuple[str, float], ...]  # (rule, clock of its first firing)
    exit_code: int


def register(app: typer.Typer) -> None:
    @app.command("watch", epilog=EXAMPLES)
    @handle_errors
    def command(
        recording: Optional[str] = typer.Argument(
            None,
            help="A recording being written: kvtool record -o FILE, or KVTOOL_RECORD=FILE (.csv or .parquet).",
            show_default=False,
        ),
        replay: Optional[Path] = path_option(
            None,
            "--replay",
            empty_tip="give a recorded events file (.csv, .csv.gz, .parquet)",
            help="Play a recorded events file through the same path instead.",
            show_default=False,
        ),
        speed: float = typer.Option(1.0, "--speed", help="Replay pace: x its recorded pace (0: at once)."),
        kv_events: Optional[str] = typer.Option(
            None, "--kv-events", help="vLLM's ZMQ KV-event endpoint (KVEventsConfig.endpoint).", show_default=False
        ),
        metrics_url: Optional[str] = typer.Option(
            None, "--metrics-url", help="vLLM's /metrics URL (its own gauges, shown beside).", show_default=False
        ),
        window: float = typer.Option(10.0, "--window", help="Seconds of the sliding window."),
        refresh: float = typer.Option(0.5, "--refresh", help="Seconds between two snapshots."),
        long_threshold: int = typer.Option(
            DEFAULT_LONG_THRESHOLD_TOKENS, "--long-threshold", help="A request is long above this many tokens held."
        ),
        pool_blocks: Optional[int] = typer.Option(
            None, "--pool-blocks", help="The pool's blocks (default: inferred as analyze does).", show_default=False
        ),
        top: int = typer.Option(5, "--top", help="Top holders shown."),
        once: bool = typer.Option(
            False, "--once", help="Print one snapshot on stdout and exit: 0 healthy, 5 an alert fires."
        ),
        duration: Optional[float] = typer.Option(
            None, "--duration", help="Stop after this many seconds.", show_default=False
        ),
        nice: int = typer.Option(
            10,
            "--nice",
            help="Lower the watcher's own CPU priority by this many levels, so it yields to the engine (0: keep it).",
        ),
        serve_metrics: Optional[str] = typer.Option(
            None, "--serve-metrics", help="Serve the figures to Prometheus on [HOST]:PORT.", show_default=False
        ),
        alerts_file: Optional[Path] = path_option(
            None,
            "--alerts-file",
            empty_tip="give the file to append the alerts to (JSON lines)",
            help="Append each alert fired and resolved here (JSON lines).",
            show_default=False,
        ),
        alert_long_share: float = typer.Option(
            DEFAULT_LONG_SHARE_ALERT,
            "--alert-long-share",
            help="Long requests' share of the pool.",
            rich_help_panel=ALERTS,
        ),
        alert_free_latency_ms: float = typer.Option(
            DEFAULT_LATE_FREE_MS,
            "--alert-free-latency-ms",
            help="A free slower than this (ms) in the window.",
            rich_help_panel=ALERTS,
        ),
        alert_hit_baseline: float = typer.Option(
            0.5, "--alert-hit-baseline", help="Hit share prompts must have had for a collapse.", rich_help_panel=ALERTS
        ),
        alert_hit_collapse: float = typer.Option(
            0.5, "--alert-hit-collapse", help="Fires below this fraction of that share.", rich_help_panel=ALERTS
        ),
        alert_hit_requests: int = typer.Option(
            8, "--alert-hit-requests", help="Recent requests the hit share is taken over.", rich_help_panel=ALERTS
        ),
        alert_preemptions_per_s: float = typer.Option(
            1.0, "--alert-preemptions-per-s", help="Preemptions per second over the window.", rich_help_panel=ALERTS
        ),
        alert_leak_after_s: float = typer.Option(
            60.0, "--alert-leak-after-s", help="Holding blocks this long after its last row.", rich_help_panel=ALERTS
        ),
        json_output: JsonOpt = False,
    ) -> None:
        """Watch a running engine: blocks in use, utilization, prefix hits, free latency, preemptions, the
        long-request share and the top holders, over a window and since start, with alerts.

        The view goes to stderr; --once or --json put the answer on stdout.  Exit codes: 0 no alert, 5 an alert
        fired (--once: fires now, or fired during a --replay).
        """
        from kvtool.core.errors import UsageError
        from kvtool.watch.alerts import AlertRules
        from kvtool.watch.session import WatchOptions, WatchSession

        if recording == "":
            raise UsageError("the recording to follow is empty", where="RECORDING", tip="kvtool watch events.csv")

        rules = AlertRules(
            long_share=alert_long_share,
            free_latency_ms=alert_free_latency_ms,
            hit_baseline=alert_hit_baseline,
            hit_collapse=alert_hit_collapse,
            hit_recent_requests=alert_hit_requests,
            preemptions_per_s=alert_preemptions_per_s,
            leak_after_s=alert_leak_after_s,
        )
        options = WatchOptions(
            follow=None if recording is None else Path(recording),
            replay=replay,
            speed=speed,
            kv_events=kv_events,
            metrics_url=metrics_url,
            window_s=window,
            refresh_s=refresh,
            long_threshold_tokens=long_threshold,
            pool_blocks=pool_blocks,
            top=top,
            rules=rules,
            alerts_file=alerts_file,
            duration_s=duration,
            nice=nice,
        )
        session = WatchSession(options)
        try:
            if serve_metrics:
                from kvtool.cli.output import warn
                from kvtool.watch.exporter import serve

                _, port = serve(serve_metrics, lambda: session.latest)
                warn(f"serving the figures on http://{serve_metrics.rpartition(':')[0] or '0.0.0.0'}:{port}/metrics")
            report = _once(session) if once else _live(session)
        finally:
            session.close()
        if once or json_output:
            _print(report, json_output)
        raise typer.Exit(report.exit_code)


def _report(session) -> WatchReport:
    from kvtool.core.errors import EXIT_ALERT, EXIT_OK

    snap = session.latest
    fired = tuple(sorted(session.tracker.first_fired_s.items(), key=lambda kv: kv[1]))
    firing = bool(snap.alerts) or (session.options.replay is not None and bool(fired))
    return WatchReport(snapshot=snap, fired=fired, exit_code=EXIT_ALERT if firing else EXIT_OK)


def _once(session) -> WatchReport:
    """One snapshot: a replay stepped in trace time, else what the sources hold now."""
    if session.options.replay is not None:
        session.replay_in_trace_time()
    else:
        while session.poll():  # the whole backlog
            pass
        session.snapshot(final=True)
    return _report(session)


def _live(session) -> WatchReport:
    import signal
    import threading

    from rich.live import Live

    from kvtool.cli.output import stderr_console
    from kvtool.watch.render import render, stamp

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    console = stderr_console()
    # rich draws a live screen only on a terminal (elsewhere only its last update, at the end): build it only there
    screen = console.is_terminal and not console.is_dumb_terminal
    shown: set[tuple[str, float]] = set()
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:

            def show(snap) -> None:
                for alert in snap.alerts:
                    key = (alert.rule, alert.since_s)
                    if key not in shown:
                        shown.add(key)
                        live.console.print(f"[bold red]ALERT[/] {stamp(alert.since_s)} {alert.rule}: {alert.message}")
                if screen:
                    live.update(render(snap, session.history), refresh=True)

            last = session.run(show, stop.is_set)
            if not screen:
                live.update(render(last, session.history), refresh=True)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    report = _report(session)
    if session.tracker.ever_fired:
        from kvtool.core.errors import EXIT_ALERT

        report = dataclasses.replace(report, exit_code=EXIT_ALERT)
    return report


def _print(report: WatchReport, json_output: bool) -> None:
    from kvtool.cli.output import print_json, stdout_console
    from kvtool.watch.render import render

    if json_output:
        print_json(report)
        return
    console = stdout_console(highlight=False)
    console.print(render(report.snapshot))  # type: ignore[arg-type]
    for rule, at in report.fired:
        console.print(f"fired: {rule} at {at:.3f}")
