"""One watch: its sources, its watcher and alerts, and the snapshots they make (what the CLI and exporter show).

The story of a tick: poll each source (the rows flushed since the last tick, vLLM's KV events, its /metrics),
then take a snapshot: the since-start analysis when due, the window's analysis, the lead holding's "now", the
alerts.  ``run`` repeats ticks every ``refresh_s`` until the source is finished, the duration is over or the
caller's ``stop`` says so, handing each snapshot to ``on_snapshot`` (the live view, the exporter).  A tick that
read no new row (and watches nothing but the recording) takes no snapshot unless the last one is ``IDLE_REFRESH_S``
old: an idle engine costs the watcher almost nothing.

The watcher yields to the engine: ``run`` lowers its own CPU priority by ``nice`` levels first (the whole process
for ``kvtool watch``; only its own thread inside ``kvtool record --serve-metrics``), so on a machine whose cores
the engine keeps busy the scheduler runs the engine first.  A replay watches no engine and keeps its priority.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.events.analysis import DEFAULT_LONG_THRESHOLD_TOKENS
from kvtool.watch.alerts import AlertRules, AlertTracker
from kvtool.watch.sources import FileFollower, Replay
from kvtool.watch.state import (
    DEFAULT_TOP_HOLDERS,
    DEFAULT_WINDOW_S,
    Snapshot,
    Watcher,
    figures_of,
)

DEFAULT_REFRESH_S = 0.5
DEFAULT_NICE = 10  # nice levels the watcher lowers its priority by (0: keep it); 19 is the lowest priority
IDLE_REFRESH_S = 2.0  # with no new row, a snapshot (and a redraw) at most this often: the clock, idle holders, a leak


@dataclasses.dataclass(frozen=True)
class WatchOptions:
    """What ``kvtool watch`` is given."""

    follow: Path | None = None  # a recording being written (kvtool record -o, KVTOOL_RECORD)
    replay: Path | None = None  # a recorded file played through the same path
    speed: float = 1.0  # replay pace (x real time; 0: at once)
    kv_events: str | None = None  # vLLM's ZMQ KV-event endpoint
    metrics_url: str | None = None  # vLLM's /metrics
    window_s: float = DEFAULT_WINDOW_S
    refresh_s: float = DEFAULT_REFRESH_S
    long_threshold_tokens: int = DEFAULT_LONG_THRESHOLD_TOKENS
    pool_blocks: int | None = None
    top: int = DEFAULT_TOP_HOLDERS
    rules: AlertRules = AlertRules()
    alerts_file: Path | None = None
    duration_s: float | None = None  # stop after this long (None: until the source ends or Ctrl-C)
    nice: int = DEFAULT_NICE  # lower the watcher's CPU priority by this many levels while it runs (0: keep it)

    def check(self) -> None:
        if self.follow is not None and self.replay is not None:
            raise UsageError("give a recording to follow or --replay FILE, not both", where="--replay")
        if self.follow is None and self.replay is None and not self.kv_events and not self.metrics_url:
            raise UsageError(
                "nothing to watch",
                tip="kvtool watch events.parquet (a recording), --replay FILE, --kv-events tcp://HOST:PORT or "
                "--metrics-url http://HOST:PORT/metrics",
            )
        if self.replay is not None and not self.replay.exists():
            raise UsageError(f"no such file: {self.replay}", where="--replay")
        if not self.window_s > 0:
            raise UsageError(f"--window must be > 0 seconds, got {self.window_s:g}", where="--window")
        if not self.refresh_s > 0:
            raise UsageError(f"--refresh must be > 0 seconds, got {self.refresh_s:g}", where="--refresh")
        if not self.speed >= 0:
            raise UsageError(f"--speed must be >= 0, got {self.speed:g}", where="--speed")
        if self.pool_blocks is not None and self.pool_blocks <= 0:
            raise UsageError(f"--pool-blocks must be positive, got {self.pool_blocks}", where="--pool-blocks")
        if self.long_threshold_tokens < 0:
            raise UsageError("--long-threshold must be >= 0 tokens", where="--long-threshold")
        if self.duration_s is not None and not self.duration_s > 0:
            raise UsageError(f"--duration must be > 0 seconds, got {self.duration_s:g}", where="--duration")
        if not 0 <= self.nice <= 19:
            raise UsageError(f"--nice must be 0 (keep the priority) to 19, got {self.nice}", where="--nice")
        self.rules.check()


class WatchSession:
    """The sources, the watcher and the alert tracker of one watch."""

    def __init__(self, options: WatchOptions):
        options.check()
        self.options = options
        name = str(options.replay or options.follow or options.kv_events or options.metrics_url)
        self.watcher = Watcher(
            name,
            window_s=options.window_s,
            long_threshold_tokens=options.long_threshold_tokens,
            late_free_ms=options.rules.free_latency_ms,
            top_holders=options.top,
            pool_blocks=options.pool_blocks,
        )
        self.tracker = AlertTracker(options.rules, options.alerts_file, options.window_s)
        self.rows: Any = None
        if options.replay is not None:
            self.rows = Replay(options.replay, self.watcher, options.speed)
        elif options.follow is not None:
            self.rows = FileFollower(options.follow, self.watcher)
        self.metrics = self.kv_events = None
        if options.metrics_url:
            from kvtool.watch.engine import MetricsSource

            self.metrics = MetricsSource(options.metrics_url, options.window_s)
        if options.kv_events:
            from kvtool.watch.engine import KvEventsSource

            self.kv_events = KvEventsSource(options.kv_events, options.window_s)
        self.history: list[tuple[float, float, float]] = []  # (clock, window utilization, blocks held) per tick
        self.latest: Snapshot | None = None

    @property
    def finished(self) -> bool:
        return self.rows is not None and self.rows.finished

    def clock(self) -> float:
        return self.rows.clock() if self.rows is not None else time.time()

    def poll(self) -> int:
        return self.rows.poll() if self.rows is not None else 0

    def snapshot(self, *, final: bool = False, clock_s: float | None = None) -> Snapshot:
        started = time.perf_counter()
        w = self.watcher
        since = w.since_start(force=final)
        capacity = w.capacity(since)
        clock = self.clock() if clock_s is None else clock_s
        window, opening, span = w.analyze_window(clock, capacity)
        alerts = self.tracker.evaluate(w, window, clock)
        engine = self.metrics.poll() if self.metrics is not None else None
        cache = self.kv_events.poll() if self.kv_events is not None else None
        since_figures = None
        if since is not None:
            since_figures = figures_of(since, "since_start", float(since.summary.duration_s))
        snap = Snapshot(
            source=w.source,
            rows=w.store.count,
            rejected_rows=w.store.rejected,
            now=w.now(clock, capacity, window),
            window_s=self.options.window_s,
            window=None if window is None else figures_of(window, "window", float(span), opening),
            since_start=since_figures,
            holders=w.holders(clock),
            alerts=alerts,
            engine=engine,
            cache_events=cache,
            analysis_s=time.perf_counter() - started,
        )
        if snap.window is not None:
            self.history.append((clock, snap.window.utilization, float(snap.now.blocks_held)))
            del self.history[:-240]
        self.latest = snap
        return snap

    def run(self, on_snapshot: Callable[[Snapshot], None], stop: Callable[[], bool] = lambda: False) -> Snapshot:
        """Tick until the source ends, the duration passes or ``stop()``; the last snapshot is final."""
        if self.options.replay is None:
            lower_priority(self.options.nice, this_thread=threading.current_thread() is not threading.main_thread())
        began = time.monotonic()
        refresh = self.options.refresh_s
        rows_only = self.metrics is None and self.kv_events is None
        shown = -float("inf")  # when the last snapshot was taken
        while True:
            tick = time.monotonic()
            added = self.poll()
            done = self.finished or stop()
            if self.options.duration_s is not None and tick - began >= self.options.duration_s:
                done = True
            if done:
                break
            if added or not rows_only or self.latest is None or tick - shown >= IDLE_REFRESH_S:
                on_snapshot(self.snapshot())
                shown = tick
            time.sleep(max(0.0, refresh - (time.monotonic() - tick)))
        last = self.snapshot(final=True)
        on_snapshot(last)
        return last

    def replay_in_trace_time(self, on_snapshot: Callable[[Snapshot], None] | None = None) -> Snapshot:
        """A replay stepped in trace time, a snapshot every ``refresh_s`` of the trace, as fast as it computes
        (``--once --replay``): the alerts fire at the trace times they would have fired live."""
        if not isinstance(self.rows, Replay):
            raise UsageError("only a --replay can be stepped in trace time")
        replay = self.rows
        t = replay.start_ts
        while True:
            replay.play_until(t)
            snap = self.snapshot(clock_s=t)
            if on_snapshot is not None:
                on_snapshot(snap)
            if replay.finished and t >= replay.end_ts:
                break
            t = min(t + self.options.refresh_s, replay.end_ts)
        last = self.snapshot(final=True, clock_s=replay.end_ts)
        return last

    def close(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()


def lower_priority(levels: int, *, this_thread: bool = False) -> int | None:
    """Lower the CPU priority by ``levels`` nice levels (capped at 19): the process, or on Linux only the calling
    thread (its nice value is per thread there).  Returns the new nice value; None when ``levels`` is 0 or the
    platform has no nice (a priority can only be lowered without privileges, so this is never undone)."""
    if levels <= 0:
        return None
    try:
        if this_thread:
            if not sys.platform.startswith("linux"):
                return None  # elsewhere a thread's priority is its process's: leave kvtool record's alone
            tid = threading.get_native_id()
            value = min(19, os.getpriority(os.PRIO_PROCESS, tid) + levels)
            os.setpriority(os.PRIO_PROCESS, tid, value)
            return value
        return os.nice(levels)
    except (AttributeError, OSError):  # no nice on this platform, or not allowed
        return None


def serve_in_background(options: WatchOptions, listen: str) -> Callable[[], None]:
    """Follow ``options.follow`` on a daemon thread and serve its figures on ``listen`` (``kvtool record
    --serve-metrics``: in kvtool record's own process, never the engine's).  Returns the function that stops it."""
    import threading

    from kvtool.watch.exporter import serve

    session = WatchSession(options)
    server, _ = serve(listen, lambda: session.latest)
    stop = threading.Event()
    thread = threading.Thread(
        target=session.run, args=(lambda snap: None, stop.is_set), name="kvtool-watch", daemon=True
    )
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(timeout=5.0)
        server.shutdown()
        session.close()

    return close
