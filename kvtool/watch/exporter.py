"""A Prometheus exporter of the watcher's figures (prometheus-client): ``kvtool watch --serve-metrics :PORT``.

Every metric is a gauge read off the latest :class:`~kvtool.watch.state.Snapshot` at scrape time, named with its
unit (Prometheus' base units: seconds, ratios); the window and since-start figures carry ``scope``.  The names are
those docs/grafana-kvtool.json queries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.watch.alerts import RULES
from kvtool.watch.state import Snapshot

PREFIX = "kvtool_"
# (name, help, figure field, scale): the scoped figures (scope="window" / "since_start")
SCOPED = (
    ("utilization_ratio", "Tokens held / token slots held (analyze's utilization)", "utilization", 1.0),
    ("prefix_hit_ratio", "Requests admitted with a prefix-cache hit / requests admitted", "prefix_hit_share", 1.0),
    ("reused_token_ratio", "Prefix-hit tokens / prompt tokens", "reused_token_share", 1.0),
    ("free_latency_p50_seconds", "Free latency p50: request finished -> blocks back", "free_latency_ms_p50", 1e-3),
    ("free_latency_p99_seconds", "Free latency p99: request finished -> blocks back", "free_latency_ms_p99", 1e-3),
    ("preemptions_per_second", "Preemptions per second", "preemptions_per_s", 1.0),
    ("preemptions", "Preemptions in the scope", "preemptions", 1.0),
    ("long_request_share_peak_ratio", "Long requests' share of the pool, lasting peak", "long_share_peak", 1.0),
    ("mean_blocks_in_use_blocks", "Blocks held, time-weighted mean", "mean_blocks_in_use", 1.0),
    ("late_free_requests", "Requests with a free slower than the late-free threshold", "late_free_requests", 1.0),
    ("requests", "Requests with a row in the scope", "requests", 1.0),
    ("events", "Rows in the scope", "events", 1.0),
)
# (name, help, Now field)
NOW = (
    ("pool_capacity_blocks", "The block pool (as analyze infers it, or --pool-blocks)", "capacity_blocks"),
    ("pool_in_use_blocks", "Pool blocks in use now (capacity - free_pool_blocks)", "pool_blocks_in_use"),
    ("held_blocks", "Blocks held now, summed over requests", "blocks_held"),
    ("held_tokens", "Tokens held now, summed over requests", "tokens_held"),
    ("utilization_now_ratio", "Tokens held / token slots held, now", "utilization"),
    ("requests_holding", "Requests holding blocks now", "requests_holding"),
    ("long_request_share_ratio", "Long requests' blocks / pool capacity, now (the alert's figure)", "long_share"),
    ("last_event_timestamp_seconds", "ts of the last row (Unix time)", "last_event_s"),
)


def _value(v: Any) -> float:
    if v is None:
        return math.nan
    return float(v)


class SnapshotCollector:
    """A prometheus-client collector over ``latest()`` (the newest snapshot, or None before the first)."""

    def __init__(self, latest: Callable[[], Snapshot | None]):
        self.latest = latest

    def describe(self):
        return []  # no describe at registration: collect() reads a snapshot that may not exist yet

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        snap = self.latest()
        if snap is None:
            return
        for name, text, field, scale in SCOPED:
            family = GaugeMetricFamily(PREFIX + name, text, labels=["scope"])
            for figures in (snap.window, snap.since_start):
                if figures is not None:
                    family.add_metric([figures.scope], _value(getattr(figures, field)) * scale)
            yield family
        for name, text, field in NOW:
            yield GaugeMetricFamily(PREFIX + name, text, value=_value(getattr(snap.now, field)))
        yield GaugeMetricFamily(PREFIX + "window_seconds", "The window's length", value=snap.window_s)
        yield GaugeMetricFamily(PREFIX + "rows", "Rows read so far", value=snap.rows)
        yield GaugeMetricFamily(PREFIX + "rejected_rows", "Rows not accepted so far", value=snap.rejected_rows)
        firing = {a.rule: a for a in snap.alerts}
        alert = GaugeMetricFamily(PREFIX + "alert_firing", "1 while the alert fires", labels=["rule"])
        for rule in RULES:
            alert.add_metric([rule], 1.0 if rule in firing else 0.0)
        yield alert
        holder = GaugeMetricFamily(
            PREFIX + "top_holder_blocks", "Blocks held by the top holders now", labels=["rank", "request_id"]
        )
        for rank, h in enumerate(snap.holders, 1):
            holder.add_metric([str(rank), h.request_id], float(h.blocks))
        yield holder


def registry_for(latest: Callable[[], Snapshot | None]):
    from kvtool.core.extras import require

    require("prometheus_client", feature="kvtool watch --serve-metrics", where="--serve-metrics")
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(latest))
    return registry


def exposition(latest: Callable[[], Snapshot | None]) -> str:
    """The /metrics text of the latest snapshot."""
    from prometheus_client import generate_latest

    return generate_latest(registry_for(latest)).decode("utf-8")


def parse_listen(text: str) -> tuple[str, int]:
    """``:9400``, ``9400`` or ``HOST:9400`` -> (host, port); the host defaults to all interfaces."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number < 65536:
        raise UsageError(f"--serve-metrics wants [HOST]:PORT, got {text!r}", where="--serve-metrics")
    return host.strip("[]") or "0.0.0.0", number


def serve(listen: str, latest: Callable[[], Snapshot | None]):
    """Start the exporter's HTTP server on a daemon thread; returns (server, port actually bound)."""
    host, port = parse_listen(listen)
    registry = registry_for(latest)
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise UsageError(f"cannot serve metrics on {listen}: {err.strerror or err}", where="--serve-metrics") from None
    return server, server.server_address[1]
