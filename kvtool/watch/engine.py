"""What vLLM itself says, beside the recorder's rows: its ``/metrics`` (Prometheus text) and its ZMQ KV events.

- :class:`MetricsSource` scrapes a vLLM ``/metrics`` URL (vllm/v1/metrics/loggers.py: ``vllm:kv_cache_usage_perc``,
  named ``vllm:gpu_cache_usage_perc`` before 0.9; ``vllm:prefix_cache_queries``/``_hits`` and
  ``vllm:num_preemptions`` counters; ``vllm:num_requests_running``/``_waiting`` gauges), parsed with
  prometheus_client's text parser; rates are the counters' change over the watcher's window.
- :class:`KvEventsSource` subscribes to vLLM's ZMQ KV-event publisher (as ``kvtool capture`` does) and counts
  blocks cached (BlockStored less BlockRemoved; AllBlocksCleared empties a rank) and stores/evictions per second.

Neither carries a request id: they give the engine's gauges, not the held-block figures of the rows.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from kvtool.core.errors import UsageError

USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the second: vLLM before 0.9
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
SCRAPE_TIMEOUT_S = 2.0
nan = float("nan")


@dataclasses.dataclass(frozen=True)
class EngineFigures:
    """vLLM's own gauges from /metrics, summed over engines."""

    url: str
    scraped_s: float  # wall time of the last good scrape (NaN: none yet)
    error: str | None  # why the last scrape failed, None when it worked
    kv_cache_usage_ratio: float  # vLLM's share of KV blocks in use (0-1)
    prefix_cache_hit_ratio_window: float  # hits / queries (tokens) over the window
    preemptions_per_s_window: float
    requests_running: float
    requests_waiting: float


def parse_metrics(text: str) -> dict[str, float]:
    """The samples kvtool reads, summed over their labels (engines, models), from Prometheus text."""
    from kvtool.core.extras import require

    require("prometheus_client", feature="kvtool watch --metrics-url")
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(USAGE) | set(GAUGES) | {c + "_total" for c in COUNTERS}
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except ValueError as err:
        raise UsageError(f"not Prometheus text: {err}") from None
    return out


class MetricsSource:
    """Scrape a vLLM /metrics URL once per snapshot; keep the counters' history over the window."""

    def __init__(self, url: str, window_s: float, fetch=None):
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--metrics-url must be an http:// URL, got {url!r}", where="--metrics-url")
        self.url = url
        self.window_s = window_s
        self.fetch = fetch or _fetch
        self.history: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.error: str | None = None

    def poll(self) -> EngineFigures:
        now = time.time()
        try:
            values = parse_metrics(self.fetch(self.url))
            self.error = None
            self.history.append((now, values))
        except (OSError, UsageError) as err:
            self.error = str(getattr(err, "message", None) or getattr(err, "reason", None) or err)
        while len(self.history) > 2 and self.history[1][0] < now - self.window_s:
            self.history.popleft()
        return self.figures()

    def figures(self) -> EngineFigures:
        if not self.history:
            return EngineFigures(self.url, nan, self.error, nan, nan, nan, nan, nan)
        (t0, first), (t1, last) = self.history[0], self.history[-1]

        def delta(name: str) -> float:
            key = name + "_total"
            return last.get(key, nan) - first.get(key, nan)

        queries, hits = delta("vllm:prefix_cache_queries"), delta("vllm:prefix_cache_hits")
        usage = next((last[k] for k in USAGE if k in last), nan)
        return EngineFigures(
            url=self.url,
            scraped_s=t1,
            error=self.error,
            kv_cache_usage_ratio=usage,
            prefix_cache_hit_ratio_window=hits / queries if queries > 0 else nan,
            preemptions_per_s_window=delta("vllm:num_preemptions") / (t1 - t0) if t1 > t0 else nan,
            requests_running=last.get(GAUGES[0], nan),
            requests_waiting=last.get(GAUGES[1], nan),
        )


def _fetch(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:  # noqa: S310 (the user's own URL)
        return response.read().decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class CacheFigures:
    """vLLM's prefix cache from its KV events."""

    endpoint: str
    batches: int
    blocks_cached: int  # BlockStored hashes less BlockRemoved ones, per rank; AllBlocksCleared empties it
    stored_per_s_window: float
    removed_per_s_window: float  # evictions of cached blocks
    last_batch_s: float


class KvEventsSource:
    """Subscribe to vLLM's KV-event publisher (``KVEventsConfig.endpoint``) and count its blocks."""

    def __init__(self, endpoint: str, window_s: float, role: str = "auto"):
        from kvtool.core.extras import require
        from kvtool.vllm.events.capture import resolve_role, validate_endpoint

        validate_endpoint(endpoint, "--kv-events")
        zmq = require("zmq", feature="kvtool watch --kv-events", where="--kv-events")
        require("msgpack", feature="kvtool watch --kv-events", where="--kv-events")
        role, address = resolve_role(endpoint, role)
        self.zmq = zmq
        self.endpoint = endpoint
        self.window_s = window_s
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        (self.sub.connect if role == "connect" else self.sub.bind)(address)
        self.cached: dict[object, set] = collections.defaultdict(set)
        self.recent: collections.deque[tuple[float, int, int]] = collections.deque()  # (ts, stored, removed)
        self.batches = 0
        self.last_s = nan

    def handle(self, payload: bytes) -> None:
        from kvtool.vllm.events.wire import MalformedFrame, decode_payload

        try:
            batch = decode_payload(payload)
        except MalformedFrame:
            return
        stored = removed = 0
        cached = self.cached[batch.dp_rank]
        for event in batch.events:
            kind = event.get("type")
            if kind == "BlockStored":
                hashes = event.get("block_hashes") or []
                cached.update(map(str, hashes))
                stored += len(hashes)
            elif kind == "BlockRemoved":
                hashes = event.get("block_hashes") or []
                cached.difference_update(map(str, hashes))
                removed += len(hashes)
            elif kind == "AllBlocksCleared":
                cached.clear()
        self.batches += 1
        self.last_s = batch.ts
        self.recent.append((batch.ts, stored, removed))

    def poll(self) -> CacheFigures:
        zmq = self.zmq
        while True:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if frames:
                self.handle(frames[-1])
        return self.figures(time.time())

    def figures(self, now: float) -> CacheFigures:
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()
        stored = sum(r[1] for r in self.recent)
        removed = sum(r[2] for r in self.recent)
        return CacheFigures(
            endpoint=self.endpoint,
            batches=self.batches,
            blocks_cached=sum(len(v) for v in self.cached.values()),
            stored_per_s_window=stored / self.window_s,
            removed_per_s_window=removed / self.window_s,
            last_batch_s=self.last_s,
        )

    def close(self) -> None:
        self.sub.close(0)
