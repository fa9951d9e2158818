"""The watcher's state: rows in, figures out, each figure the one ``kvtool analyze`` computes.

Per row (the hot path of the watcher, O(1)): the row goes to the :class:`~kvtool.watch.rows.RowStore`, and the
*lead* holding of its request is updated: blocks held b and tokens added since b was last 0 (analysis.py's
definitions: b never below 0, tokens capped at b x block_size when read).  That gives "right now" (who holds what,
who has been idle since their last row) without any analysis.

Per snapshot (a few times a second), the figures of two scopes, each by :func:`kvtool.events.analysis.analyze_events`:

- *since start*: every row so far, the table ``load_events`` makes of the same file, so the figures are those of
  ``kvtool analyze FILE`` (recomputed no more often than every ``SINCE_START_EVERY_S``, and taking at most a
  hundredth of a core: a long run's whole table costs; the final snapshot always recomputes it);
- *window*: the rows of the last ``window_s`` seconds, preceded by one opening row per request that held blocks at
  the window's start (an ``append`` of the blocks it held and the tokens it had added since it last held none, at
  the start time).  A *lag* holding, the same update as the lead one applied to rows as they leave the window,
  gives those opening rows.  From the start on, b and the tokens held of every request are exactly what the
  analysis of the whole file has at those times; an opening row is no prompt (not an allocate or reuse), so the
  prefix-hit figures count the requests admitted inside the window.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from kvtool.events.analysis import DEFAULT_LATE_FREE_MS, DEFAULT_LONG_THRESHOLD_TOKENS, Analysis, analyze_events
from kvtool.events.load import APPEND, DEFAULT_BLOCK_SIZE, FREE, EventTable
from kvtool.watch.alerts import long_share_last
from kvtool.watch.rows import Row, RowStore

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.watch.alerts import Alert

DEFAULT_WINDOW_S = 10.0
DEFAULT_TOP_HOLDERS = 5
SINCE_START_DUTY = 0.01  # the since-start analysis takes at most this share of one core (its cost grows with the run)
SINCE_START_EVERY_S = 5.0  # ... and is recomputed at most this often (the final snapshot always recomputes it)
nan = float("nan")


@dataclasses.dataclass(frozen=True)
class Figures:
    """The figures of one scope (the window, or since start): each from analyze_events on that scope's rows."""

    scope: str  # "window" or "since_start"
    span_s: float  # the time the scope covers
    events: int  # rows in the scope (a window's opening rows not counted)
    requests: int
    utilization: float  # tokens held / token slots held, integrated over the scope (analyze: pool.utilization)
    mean_blocks_in_use: float
    peak_blocks_in_use: int
    prefix_hit_share: float  # requests admitted with a prefix-cache hit / requests admitted (prefix_reuse.hit_share)
    reused_token_share: float  # prefix-hit tokens / prompt tokens
    free_latency_count: int
    free_latency_ms_p50: float
    free_latency_ms_p99: float
    late_free_requests: int  # requests with a free slower than the late-free threshold
    preemptions: int
    preemptions_per_s: float
    long_share_peak: float  # long requests' share of the pool, its lasting peak (long_requests.peak_share)
    long_share_last: float  # ... and at the scope's last row


@dataclasses.dataclass(frozen=True)
class Holder:
    """A request holding blocks right now."""

    request_id: str
    blocks: int
    tokens: int  # tokens held: added since it last held none, at most blocks x block_size
    utilization: float  # tokens / (blocks x block_size)
    held_s: float  # since it last started holding
    idle_s: float  # since its last row
    long: bool  # its tokens held ever passed the long-request threshold


@dataclasses.dataclass(frozen=True)
class Now:
    """The pool right now (the lead holding and the last row)."""

    clock_s: float  # the watcher's clock: wall time live, trace time in a replay
    last_event_s: float  # ts of the last row (NaN before any)
    capacity_blocks: float | None  # the pool, as analyze infers it (None: no free_pool_blocks column)
    pool_blocks_in_use: float | None  # capacity - the last row's free_pool_blocks (a shared block counted once)
    blocks_held: int  # summed over requests (a shared prefix block counted once per holder)
    tokens_held: int
    utilization: float  # tokens held / token slots held, now
    requests_holding: int
    long_share: float  # the long requests' blocks / capacity at the last row (the alert's figure)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What ``kvtool watch`` shows at one moment."""

    source: str
    rows: int  # accepted rows so far
    rejected_rows: int
    now: Now
    window_s: float
    window: Figures | None  # None: no row and no holder in the window
    since_start: Figures | None
    holders: tuple[Holder, ...]  # the top holders, most blocks first
    alerts: tuple[Alert, ...]  # firing now
    engine: Any = None  # kvtool.watch.metrics.EngineFigures from a vLLM /metrics URL, if watched
    cache_events: Any = None  # kvtool.watch.zmq.CacheFigures from vLLM's KV events, if watched
    analysis_s: float = 0.0  # the time this snapshot's analyses took


class Holding:
    """Per request: [blocks held, tokens added since it last held none, block size, last ts, since, peak tokens].

    The update is analysis.py's (a free never takes b below 0; tokens restart when a row meets b = 0); requests
    holding nothing are forgotten (their next row starts afresh, as analysis.py's running sums do).
    """

    def __init__(self, default_block_size: int):
        self.held: dict[Any, list] = {}
        self.default_block_size = default_block_size

    def apply(self, key: Any, ts: float, event: int, num_blocks: int, num_tokens: int, block_size: int) -> None:
        state = self.held.get(key)
        if state is None:
            if event == FREE:
                return  # a free of nothing: b stays 0
            state = self.held[key] = [0, 0, block_size or self.default_block_size, ts, ts, 0]
        if event == FREE:
            state[0] = max(0, state[0] - num_blocks)
        else:
            if state[0] == 0:
                state[1] = num_tokens
                state[4] = ts
            else:
                state[1] += num_tokens
            state[0] += num_blocks
        if block_size:
            state[2] = block_size
        state[3] = ts
        tokens = min(state[1], state[0] * state[2])
        if tokens > state[5]:
            state[5] = tokens
        if state[0] == 0:
            del self.held[key]


class Watcher:
    """Rows of one engine in, :class:`Snapshot` out (the alerts are evaluated by the caller's AlertTracker)."""

    def __init__(
        self,
        source: str,
        *,
        columns: tuple[str, ...] = (),
        default_block_size: int = DEFAULT_BLOCK_SIZE,
        window_s: float = DEFAULT_WINDOW_S,
        long_threshold_tokens: int = DEFAULT_LONG_THRESHOLD_TOKENS,
        late_free_ms: float = DEFAULT_LATE_FREE_MS,
        top_holders: int = DEFAULT_TOP_HOLDERS,
        pool_blocks: int | None = None,
    ):
        self.source = source
        self.store = RowStore(columns, default_block_size)
        self.window_s = window_s
        self.long_threshold_tokens = long_threshold_tokens
        self.late_free_ms = late_free_ms
        self.top_holders = top_holders
        self.pool_blocks = pool_blocks
        self.lead = Holding(default_block_size)
        self.lag = Holding(default_block_size)
        self.lag_index = 0  # rows before this one have left the window (applied to the lag holding)
        self.last_free_pool = nan
        self.last_ts = nan
        self.first_ts = nan
        self._since: Analysis | None = None
        self._since_rows = -1
        self._since_at = -math.inf
        self._since_cost_s = 0.0

    def set_columns(self, columns: tuple[str, ...], default_block_size: int | None = None) -> None:
        """The header of the file being followed (before its first row)."""
        self.store.columns = columns
        if default_block_size:
            self.store.default_block_size = default_block_size
            self.lead.default_block_size = self.lag.default_block_size = default_block_size

    # ------------------------------------------------------------------------------------------ per row

    def add(self, row: Row) -> None:
        """One accepted row (the watcher's hot path)."""
        code = self.store.add(row)
        self.lead.apply(code, row.ts, row.event, row.num_blocks, row.num_tokens, row.block_size or 0)
        if row.free_pool_blocks == row.free_pool_blocks:  # not NaN
            self.last_free_pool = row.free_pool_blocks
        if not row.ts <= self.last_ts:
            self.last_ts = row.ts
        if self.first_ts != self.first_ts:
            self.first_ts = row.ts

    def reject(self, line_number: int, reason: str) -> None:
        self.store.reject(line_number, reason)

    # ------------------------------------------------------------------------------------------ per snapshot

    def since_start(self, *, force: bool = False) -> Analysis | None:
        """The analysis of every row so far (``kvtool analyze`` of the same file), recomputed when due."""
        n = self.store.count
        if not n:
            return None
        due = time.perf_counter() - self._since_at >= max(SINCE_START_EVERY_S, self._since_cost_s / SINCE_START_DUTY)
        if n != self._since_rows and (force or due or self._since is None):
            started = time.perf_counter()
            self._since = analyze_events(
                self.store.table(self.source),
                long_threshold_tokens=self.long_threshold_tokens,
                late_free_ms=self.late_free_ms,
                pool_blocks=self.pool_blocks,
            )
            self._since_at = time.perf_counter()
            self._since_cost_s = self._since_at - started
            self._since_rows = n
        return self._since

    def capacity(self, since: Analysis | None) -> float | None:
        if self.pool_blocks is not None:
            return float(self.pool_blocks)
        return None if since is None else since.pool.capacity_blocks

    def window_table(self, start_s: float) -> tuple[EventTable | None, int]:
        """The window's table (opening rows, then the rows from ``start_s``) and how many opening rows it has."""
        import numpy as np

        store = self.store
        a = store.arrays()
        end = self.lag_index + int(np.searchsorted(a.ts[self.lag_index :], start_s, side="left"))
        if end > self.lag_index:  # rows leaving the window: onto the lag holding
            sl = slice(self.lag_index, end)
            apply = self.lag.apply
            for ts, ev, req, nb, nt, bs in zip(
                a.ts[sl].tolist(),
                a.event[sl].tolist(),
                a.request[sl].tolist(),
                a.num_blocks[sl].tolist(),
                a.num_tokens[sl].tolist(),
                a.block_size[sl].tolist(),
            ):
                apply(req, ts, ev, nb, nt, bs)
            self.lag_index = end
        opening = [(code, s[0], s[1], s[2]) for code, s in self.lag.held.items()]
        k, rows = len(opening), a.count - self.lag_index
        if not k and not rows:
            return None, 0
        sl = slice(self.lag_index, a.count)
        o_code = np.array([o[0] for o in opening], dtype=np.int32)

        def cat(head, column):
            return np.concatenate((np.asarray(head, dtype=column.dtype), column[sl]))

        codes = cat(o_code, a.request)
        uniq, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        by_first = np.argsort(first, kind="stable")
        rank = np.empty_like(by_first)
        rank[by_first] = np.arange(by_first.size)
        names = store.request_ids
        block_size = cat([o[3] for o in opening], a.block_size)
        block_size = np.where(block_size > 0, block_size, store.default_block_size)
        table = EventTable(
            path=self.source,
            columns_found=store.columns,
            ts=cat([start_s] * k, a.ts),
            event=cat([APPEND] * k, a.event),
            request=rank[inverse.reshape(-1)].astype(np.int32),
            request_ids=tuple(names[i] for i in uniq[by_first].tolist()),
            num_blocks=cat([o[1] for o in opening], a.num_blocks),
            num_tokens=cat([min(o[2], 2**31 - 1) for o in opening], a.num_tokens),
            block_size=block_size,
            latency_ms=cat([nan] * k, a.latency_ms) if store.has("latency_ms") else None,
            free_pool_blocks=cat([nan] * k, a.free_pool_blocks) if store.has("free_pool_blocks") else None,
            source_request=cat([-1] * k, a.source_request) if store.has("source_request_id") else None,
            source_request_ids=tuple(store.source_ids),
            block_id_rows=None,  # the window needs no physical blocks: the pool in use comes from free_pool_blocks
            block_id_values=None,
            rejected=store.rejected_rows(),
            default_block_size=store.default_block_size,
        )
        return table, k

    def analyze_window(self, clock_s: float, capacity: float | None) -> tuple[Analysis | None, int, float]:
        """(the window's analysis, its opening rows, the span it covers)."""
        if self.first_ts != self.first_ts:
            return None, 0, 0.0
        start = max(clock_s - self.window_s, self.first_ts)
        table, opening = self.window_table(start)
        if table is None:
            return None, 0, 0.0
        pool = None if capacity is None else max(1, int(round(capacity)))
        analysis = analyze_events(
            table,
            long_threshold_tokens=self.long_threshold_tokens,
            late_free_ms=self.late_free_ms,
            pool_blocks=pool,
        )
        return analysis, opening, max(clock_s - start, 0.0)

    def now(self, clock_s: float, capacity: float | None, window: Analysis | None) -> Now:
        blocks = tokens = slots = 0
        for b, s, bs, *_ in self.lead.held.values():
            blocks += b
            tokens += min(s, b * bs)
            slots += b * bs
        in_use = None
        if capacity is not None and self.last_free_pool == self.last_free_pool:
            in_use = capacity - self.last_free_pool
        long_share = nan
        if window is not None:
            long_share = long_share_last(window)
        return Now(
            clock_s=clock_s,
            last_event_s=self.last_ts,
            capacity_blocks=capacity,
            pool_blocks_in_use=in_use,
            blocks_held=blocks,
            tokens_held=tokens,
            utilization=tokens / slots if slots else nan,
            requests_holding=len(self.lead.held),
            long_share=long_share,
        )

    def holders(self, clock_s: float) -> tuple[Holder, ...]:
        names = self.store.request_ids
        top = sorted(self.lead.held.items(), key=lambda kv: (-kv[1][0], kv[0]))[: self.top_holders]
        out = []
        for code, (b, s, bs, last, since, peak) in top:
            tokens = min(s, b * bs)
            out.append(
                Holder(
                    request_id=names[code],
                    blocks=b,
                    tokens=tokens,
                    utilization=tokens / (b * bs) if b else nan,
                    held_s=max(clock_s - since, 0.0),
                    idle_s=max(clock_s - last, 0.0),
                    long=peak > self.long_threshold_tokens,
                )
            )
        return tuple(out)

    def idle_holders(self, clock_s: float, idle_s: float) -> list[tuple[str, int, float]]:
        """(request, blocks, idle seconds) of the requests holding blocks with no row for more than ``idle_s``."""
        names = self.store.request_ids
        out = [(names[code], s[0], clock_s - s[3]) for code, s in self.lead.held.items() if clock_s - s[3] > idle_s]
        return sorted(out, key=lambda r: (-r[2], r[0]))


def figures_of(analysis: Analysis, scope: str, span_s: float, opening_rows: int = 0) -> Figures:
    """The figures of one scope, read off its analysis."""
    s, pool, prefix = analysis.summary, analysis.pool, analysis.prefix_reuse
    return Figures(
        scope=scope,
        span_s=span_s,
        events=s.events - opening_rows,
        requests=s.requests,
        utilization=pool.utilization,
        mean_blocks_in_use=s.mean_blocks_in_use,
        peak_blocks_in_use=s.peak_blocks_in_use,
        prefix_hit_share=prefix.hit_share,
        reused_token_share=prefix.reused_token_share,
        free_latency_count=pool.free_latency_count,
        free_latency_ms_p50=pool.free_latency_ms_p50,
        free_latency_ms_p99=pool.free_latency_ms_p99,
        late_free_requests=s.late_free_requests,
        preemptions=s.preemptions,
        preemptions_per_s=s.preemptions / span_s if span_s > 0 else nan,
        long_share_peak=analysis.long_requests.peak_share,
        long_share_last=long_share_last(analysis),
    )
