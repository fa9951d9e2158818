"""The watch view: one snapshot as rich renderables (the live screen and ``--once``); JSON is the dataclass."""

from __future__ import annotations

import math
import time

from kvtool.watch.state import Figures, Snapshot

SPARK = " ▁▂▃▄▅▆▇█"


def _pct(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.1%}"


def _num(v: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:{fmt}}{unit}"


def sparkline(values: list[float], lo: float = 0.0, hi: float = 1.0) -> str:
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(" ")
            continue
        k = 0 if hi <= lo else int(round((min(max(v, lo), hi) - lo) / (hi - lo) * (len(SPARK) - 1)))
        out.append(SPARK[k])
    return "".join(out)


def figures_rows(window: Figures | None, since: Figures | None) -> list[tuple[str, str, str]]:
    def both(fn) -> tuple[str, str]:
        return (fn(window) if window is not None else "-", fn(since) if since is not None else "-")

    rows = [
        ("utilization (tokens / slots held)", *both(lambda f: _pct(f.utilization))),
        ("prefix-hit share (requests)", *both(lambda f: _pct(f.prefix_hit_share))),
        ("reused tokens / prompt tokens", *both(lambda f: _pct(f.reused_token_share))),
        ("free latency p50", *both(lambda f: _num(f.free_latency_ms_p50, ",.2f", " ms"))),
        ("free latency p99", *both(lambda f: _num(f.free_latency_ms_p99, ",.2f", " ms"))),
        ("preemptions / s", *both(lambda f: _num(f.preemptions_per_s, ",.2f"))),
        ("long-request share (peak)", *both(lambda f: _pct(f.long_share_peak))),
        (
            "blocks held (mean / peak)",
            *both(lambda f: f"{_num(f.mean_blocks_in_use, ',.1f')} / {f.peak_blocks_in_use:,}"),
        ),
        ("requests / rows", *both(lambda f: f"{f.requests:,} / {f.events:,}")),
        ("span", *both(lambda f: _num(f.span_s, ",.1f", " s"))),
    ]
    return rows


def render(snap: Snapshot, history: list[tuple[float, float, float]] | None = None):
    """The whole screen: pool now, figures (window | since start), the utilization curve, holders, alerts."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    now = snap.now
    head = Text()
    cap = now.capacity_blocks
    head.append(f"kvtool watch  {snap.source}\n", style="bold")
    in_use = now.pool_blocks_in_use
    head.append(
        f"pool in use {_num(in_use)} / {_num(cap)} blocks"
        + (f" ({in_use / cap:.0%})" if in_use is not None and cap else "")
        + f"   held {now.blocks_held:,} blocks by {now.requests_holding:,} requests"
        + f"   utilization now {_pct(now.utilization)}   long share now {_pct(now.long_share)}\n"
    )
    lag = now.clock_s - now.last_event_s if math.isfinite(now.last_event_s) else math.nan
    head.append(f"rows {snap.rows:,} (rejected {snap.rejected_rows:,})   last row {_num(lag, ',.1f', ' s')} ago")
    table = Table(title=None, expand=False)
    table.add_column("figure")
    table.add_column(f"last {snap.window_s:g} s", justify="right")
    table.add_column("since start", justify="right")
    for row in figures_rows(snap.window, snap.since_start):
        table.add_row(*row)
    parts: list = [head, table]
    if history:
        util = [h[1] for h in history][-60:]
        held = [h[2] for h in history][-60:]
        top = max([v for v in held if math.isfinite(v)] + [cap or 0.0, 1.0])
        curve = Text()
        curve.append("utilization  ")
        curve.append(sparkline(util), style="green")
        curve.append(f"  {_pct(util[-1])}\nblocks held  ")
        curve.append(sparkline(held, 0.0, top), style="cyan")
        curve.append(f"  {_num(held[-1])}")
        parts.append(curve)
    holders = Table(title="top holders now", expand=False)
    for name, justify in (("request", "left"), ("blocks", "right"), ("tokens", "right"), ("util", "right")):
        holders.add_column(name, justify=justify)  # type: ignore[arg-type]
    holders.add_column("held", justify="right")
    holders.add_column("idle", justify="right")
    for h in snap.holders:
        name = h.request_id + (" (long)" if h.long else "")
        holders.add_row(
            name, f"{h.blocks:,}", f"{h.tokens:,}", _pct(h.utilization), f"{h.held_s:,.1f} s", f"{h.idle_s:,.1f} s"
        )
    parts.append(holders)
    if snap.engine is not None:
        e = snap.engine
        text = (
            f"vLLM /metrics: kv cache usage {_pct(e.kv_cache_usage_ratio)}, prefix-cache hits "
            f"{_pct(e.prefix_cache_hit_ratio_window)} (tokens, window), preemptions/s "
            f"{_num(e.preemptions_per_s_window, ',.2f')}, running {_num(e.requests_running)}, waiting "
            f"{_num(e.requests_waiting)}" + (f"  [{e.error}]" if e.error else "")
        )
        parts.append(Text(text))
    if snap.cache_events is not None:
        c = snap.cache_events
        parts.append(
            Text(
                f"vLLM KV events: {c.blocks_cached:,} blocks cached, stored {c.stored_per_s_window:,.1f}/s, "
                f"evicted {c.removed_per_s_window:,.1f}/s ({c.batches:,} batches)"
            )
        )
    if snap.alerts:
        lines = Text()
        for a in snap.alerts:
            lines.append(f"ALERT {a.rule}: ", style="bold red")
            lines.append(a.message + "\n")
        parts.append(Panel(lines, title="alerts", border_style="red"))
    else:
        parts.append(Text("no alert", style="green"))
    return Group(*parts)


def stamp(clock_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(clock_s))
