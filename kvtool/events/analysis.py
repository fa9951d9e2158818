"""Per-request block holding time versus utilization, and the health of a paged block pool, from KV-cache events.

Definitions (docs/analyze.md has them with examples).  For one request, with its rows in time order (equal ``ts``
in file order):

- b(t), blocks held: running sum of allocate + append + reuse ``num_blocks`` minus freed blocks, never below 0 (a
  free larger than what is held is clamped at 0 and counted as an over-free);
- n(t), tokens held: running sum of allocate + append + reuse ``num_tokens`` since b was last 0, never above
  b(t) x block_size (so 0 once every block is freed);
- holding time: total time with b > 0; block-seconds: integral of b; utilization: integral of n divided by the
  integral of b x block_size (a ratio of integrals; NaN/null when that integral is 0);
- a request still holding blocks at the end of the trace (the largest accepted ts) is leaked: its intervals run to
  that end;
- b returning to 0 and later rising again is a preemption (counted, not an anomaly).

Everything is vectorised with numpy: one stable sort by (request, ts), then segmented cumulative sums and
``ufunc.reduceat`` over the per-request segments.  No Python loop over events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtool.core.errors import UsageError
from kvtool.core.threads import in_background
from kvtool.events.blocks import PhysicalBlocks, physical_blocks
from kvtool.events.kernels import compiled
from kvtool.events.load import ALLOCATE, APPEND, FREE, REUSE, SCHEMA_VERSION, EventTable
from kvtool.events.segments import (
    clamp_at_zero,
    inverse_permutation,
    nearest_rank,
    percentiles,
    radix_argsort,
    segment_cumsum,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

DEFAULT_LONG_THRESHOLD_TOKENS = 2048
DEFAULT_LONG_SHARE_ALERT = 0.6  # the seed article's alert: long requests holding > 60 % of the blocks
DEFAULT_TOP = 10
SHORT_MATCH_SHARE = 0.5  # "many" zero or very short prefix matches: at least half of the requests
PILE_UP_SHARE = 0.5  # "piling up": at least half of the hits have the same, block-multiple match length
FIRST_LEAKS_SHOWN = 10
# A free later than this is late (the article: frees 800 ms late before the fix, under 5 ms after it; 100 ms is
# twenty times the healthy figure and an eighth of the pathological one).  --late-free-ms changes it.
DEFAULT_LATE_FREE_MS = 100.0

nan = float("nan")


@dataclasses.dataclass(frozen=True)
class Summary:
    """The headline figures (JSON ``summary``)."""

    requests: int  # distinct request_ids among accepted rows
    events: int  # accepted rows
    rejected_rows: int
    leaked_requests: int
    leaked_blocks: int  # blocks still held at the end of the trace, summed over leaked requests
    over_frees: int  # free rows releasing more blocks than held (clamped at 0)
    preemptions: int
    peak_blocks_in_use: int  # counting a block once per request holding it
    mean_blocks_in_use: float  # time-weighted over the trace
    utilization: float  # pool-wide: integral of tokens held / integral of slots held (fraction)
    free_latency_ms_p50: float
    free_latency_ms_p95: float
    free_latency_ms_p99: float
    free_latency_ms_max: float
    holding_time_s_p50: float
    holding_time_s_p95: float
    block_seconds: float  # sum over requests
    wasted_slot_seconds: float  # sum over requests of block_size x block-seconds x (1 - utilization)
    trace_start_s: float
    trace_end_s: float
    duration_s: float
    default_block_size: int
    late_free_requests: int  # requests with a free slower than the late-free threshold (late_frees.threshold_ms)


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """Blocks in use over time, free latency and block turnover."""

    peak_blocks_in_use: int
    peak_at_s: float
    mean_blocks_in_use: float
    utilization: float
    blocks_allocated: int  # allocate + append num_blocks
    blocks_reused: int  # reuse num_blocks (prefix-cache blocks attached)
    blocks_freed: int  # blocks actually released (over-frees clamped)
    blocks_allocated_per_s: float
    free_latency_count: int  # free rows with a latency_ms
    free_latency_ms_p50: float
    free_latency_ms_p95: float
    free_latency_ms_p99: float
    free_latency_ms_max: float
    late_free_block_seconds: float  # sum over frees of blocks x latency: block-seconds spent waiting to be freed
    allocate_latency_ms_p50: float
    allocate_latency_ms_p95: float
    allocate_latency_ms_max: float
    has_block_ids: bool
    unique_physical_blocks: int | None  # distinct block ids seen
    peak_physical_blocks_in_use: int | None  # a block shared by several requests counted once
    mean_physical_blocks_in_use: float | None
    reallocations: int | None  # a block id returned to the pool and later allocated again
    turnover_time_s_p50: float | None  # time a block id spends in the pool between free and reallocation
    turnover_time_s_p95: float | None
    free_pool_blocks_min: float | None  # from the free_pool_blocks column
    capacity_blocks: float | None  # --pool-blocks, else max(blocks in use + free_pool_blocks)


@dataclasses.dataclass(frozen=True)
class PrefixReuse:
    """Prefix-cache hits (reuse rows of each request's first holding interval) and a diagnosis."""

    requests_with_prompt: int  # requests whose first interval has allocate or reuse tokens
    requests_with_hit: int
    hit_share: float
    prompt_tokens: int
    reused_tokens: int
    reused_token_share: float  # reused tokens / prompt tokens
    match_tokens_p50: float  # nearest rank: a match length that occurred (no interpolation)
    match_tokens_p90: float
    short_match_requests: int  # requests matching at most one block (zero included)
    most_common_hit_tokens: int | None
    most_common_hit_share: float  # share of hits with exactly that match length
    block_multiple_hit_share: float  # share of hits whose match length is a multiple of the block size
    histogram: tuple[tuple[int, int], ...]  # (match tokens, requests), the most common first (up to 20)
    diagnosis: tuple[str, ...]  # codes: no_reuse_events, prompts_differ_early, block_alignment, ok
    advice: tuple[str, ...]
    distinct_sources: int | None  # distinct source_request_id of reuse rows; None without the column
    top_sources: tuple[tuple[str, int], ...]  # (source_request_id, blocks reused from it), most first (up to 5)


@dataclasses.dataclass(frozen=True)
class LongRequests:
    """Share of blocks held by long requests over time (the article's 60 % alert)."""

    threshold_tokens: int
    alert_share: float
    long_requests: int  # requests whose peak tokens held exceed the threshold
    basis: str  # "capacity" (share of the pool) or "blocks_in_use" (share of what is held)
    capacity_blocks: float | None
    peak_share: float  # the largest share that lasts (an instant at the very end of the trace is no peak)
    peak_share_at_s: float
    mean_share: float  # time-weighted over the time blocks are in use
    time_above_alert_s: float
    first_alert_at_s: float
    alert: bool


@dataclasses.dataclass(frozen=True)
class Anomalies:
    """Everything excluded or suspicious; ``--strict`` fails on any count here."""

    rejected_rows: int
    rejected_by_reason: dict[str, int]
    first_rejected: tuple[tuple[int, str], ...]  # (row number, reason)
    blank_rows: int  # skipped, not an anomaly
    over_frees: int
    over_freed_blocks: int
    over_free_requests: int
    leaked_requests: int
    leaked_blocks: int
    first_leaked_request_ids: tuple[str, ...]

    @property
    def count(self) -> int:
        return self.rejected_rows + self.over_frees + self.leaked_requests


# Per-request columns, in report order; (name, numpy dtype kind) - the JSON/CSV names.
REQUEST_COLUMNS = (
    "request_id",
    "holding_time_s",
    "utilization",
    "block_seconds",
    "wasted_slot_seconds",
    "peak_blocks",
    "peak_tokens",
    "tokens",
    "prompt_tokens",
    "reused_blocks",
    "reused_tokens",
    "prefix_hit_tokens",
    "free_latency_ms_max",
    "late_free_block_seconds",
    "preemptions",
    "over_frees",
    "leaked",
    "leaked_blocks",
    "long",
    "first_ts_s",
    "last_ts_s",
    "events",
)


@dataclasses.dataclass(frozen=True, eq=False)
class RequestTable:
    """One entry per request (columnar numpy arrays, aligned with ``request_ids``)."""

    request_ids: tuple[str, ...]
    holding_time_s: np.ndarray  # time with b > 0, leaks measured to the end of the trace
    utilization: np.ndarray  # NaN when the holding interval is empty
    block_seconds: np.ndarray
    wasted_slot_seconds: np.ndarray  # block_size x block-seconds x (1 - utilization)
    peak_blocks: np.ndarray
    peak_tokens: np.ndarray
    tokens: np.ndarray  # allocate + append + reuse num_tokens
    prompt_tokens: np.ndarray  # allocate + reuse tokens of the first holding interval
    reused_blocks: np.ndarray
    reused_tokens: np.ndarray
    prefix_hit_tokens: np.ndarray  # reuse tokens of the first holding interval (vLLM: num_cached_tokens)
    free_latency_ms_max: np.ndarray  # NaN without a latency
    late_free_block_seconds: np.ndarray  # sum over the request's free rows of blocks x latency_ms / 1000
    preemptions: np.ndarray
    over_frees: np.ndarray
    leaked: np.ndarray  # bool
    leaked_blocks: np.ndarray  # blocks held at the end of the trace
    long: np.ndarray  # bool: peak tokens above --long-threshold
    first_ts_s: np.ndarray
    last_ts_s: np.ndarray
    events: np.ndarray
    token_seconds: np.ndarray  # integral of tokens held (not a report column: pool utilization from the rows)
    slot_seconds: np.ndarray  # integral of b x block_size
    # sum over the request's free rows of blocks x latency_ms / 1000 x the row's block_size (not a report column:
    # the fleet's lost slot-seconds per pool; the block size of each row, not --block-size's default)
    late_free_slot_seconds: np.ndarray

    def __len__(self) -> int:
        return len(self.request_ids)

    def column(self, name: str):
        return self.request_ids if name == "request_id" else getattr(self, name)


@dataclasses.dataclass(frozen=True)
class Culprit:
    """A request that holds long and uses little: ranked by wasted slot-seconds."""

    request_id: str
    wasted_slot_seconds: float
    holding_time_s: float
    utilization: float
    block_seconds: float
    peak_blocks: int
    leaked: bool


@dataclasses.dataclass(frozen=True)
class LateFree:
    """A request whose blocks returned to the pool late, and what that cost."""

    request_id: str
    free_latency_ms: float  # its slowest free: request finished -> blocks back in the pool
    late_free_block_seconds: float  # blocks x latency over its free rows: pool capacity idle while waiting
    peak_blocks: int
    holding_time_s: float


@dataclasses.dataclass(frozen=True)
class LateFrees:
    """Late frees named (the article's 800 ms case): requests with a free slower than the threshold."""

    threshold_ms: float
    requests: int
    block_seconds: float  # their late-free block-seconds
    share_of_late_free_block_seconds: float  # of all frees' block-seconds (pool.late_free_block_seconds)
    top: tuple[LateFree, ...]  # by late-free block-seconds, then latency (up to --top)


@dataclasses.dataclass(frozen=True, eq=False)
class Timeline:
    """Step curves for the charts (not in the JSON): values hold from each time to the next."""

    time_s: np.ndarray
    blocks_in_use: np.ndarray
    long_blocks_in_use: np.ndarray
    physical_time_s: np.ndarray | None
    physical_blocks_in_use: np.ndarray | None


@dataclasses.dataclass(frozen=True, eq=False)
class Analysis:
    """The whole result of ``kvtool analyze``."""

    file: str
    schema_version: int
    summary: Summary
    pool: PoolStats
    prefix_reuse: PrefixReuse
    long_requests: LongRequests
    anomalies: Anomalies
    culprits: tuple[Culprit, ...]
    requests: RequestTable
    timeline: Timeline
    free_latencies_ms: np.ndarray  # latency_ms of free rows, for the histogram
    match_tokens: np.ndarray  # prefix match length of each request with a prompt
    late_frees: LateFrees


def analyze_events(
    table: EventTable,
    *,
    long_threshold_tokens: int = DEFAULT_LONG_THRESHOLD_TOKENS,
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT,
    top: int = DEFAULT_TOP,
    pool_blocks: int | None = None,
    late_free_ms: float = DEFAULT_LATE_FREE_MS,
    progress: Callable[[str], None] | None = None,
) -> Analysis:
    """Analyse an :class:`EventTable` (see the module docstring for the definitions).

    The story: one pass over each request's rows in time order gives the blocks it holds after each row (b) and
    their integrals, the per-request table; the changes of b in global time order give the pool's blocks in use;
    physical block ids (a second thread) give the unique blocks in use; the rest are small reductions of those
    (prefix reuse, long requests, late frees, anomalies).  The per-request and physical passes are compiled loops
    (kernels.py) where built, else the numpy steps below.
    """
    _check_options(long_threshold_tokens, long_share_alert, top, pool_blocks, late_free_ms)
    note = progress or (lambda stage: None)
    note("sorting")
    order = _time_order(table)
    physical_job, passed = _request_pass_beside_physical(table, order)
    rows = _row_figures(table, passed.second_rise, order.tpos_of_row)
    requests = _request_table(table, passed, rows, long_threshold_tokens)
    note("pool")
    curves = _pool_curves_of(table, order, passed, requests.long)
    block_size_of_request = passed.first_block_size
    # what needs no physical blocks first: the physical pass may still be running on the other thread
    note("prefix reuse")
    has_prompt = rows.prompt_tokens > 0
    match_tokens = rows.match_tokens[has_prompt]
    prefix = _prefix_reuse(
        match_tokens,
        rows.prompt_tokens[has_prompt],
        block_size_of_request[has_prompt],
        bool((table.event == REUSE).any()),
    )
    prefix = dataclasses.replace(prefix, **_reuse_sources(table))
    flows = _pool_flows(table, passed)
    late = _late_frees(requests, late_free_ms, top, float(requests.late_free_block_seconds.sum()))
    anomalies = _anomalies(table, passed, requests)
    culprits = _culprits(requests, top)
    physical = physical_job.result() if physical_job is not None else None
    capacity = _capacity(table, pool_blocks, physical, order, curves.in_use)
    pool = _pool_stats(order, curves, flows, passed, requests, physical, capacity)
    long_stats = _long_share(
        curves,
        capacity,
        order.t_end,
        long_threshold_tokens,
        long_share_alert,
        int(requests.long.sum()),
    )
    return Analysis(
        file=table.path,
        schema_version=SCHEMA_VERSION,
        summary=_summary(table, order, requests, pool, anomalies, late),
        pool=pool,
        prefix_reuse=prefix,
        long_requests=long_stats,
        anomalies=anomalies,
        culprits=culprits,
        requests=requests,
        timeline=Timeline(
            time_s=curves.time_s,
            blocks_in_use=curves.blocks_in_use,
            long_blocks_in_use=curves.long_blocks_in_use,
            physical_time_s=None if physical is None else physical.curve_t,
            physical_blocks_in_use=None if physical is None else physical.curve_b,
        ),
        free_latencies_ms=flows.free_latencies_ms,
        match_tokens=match_tokens,
        late_frees=late,
    )


def _check_options(long_threshold_tokens, long_share_alert, top, pool_blocks, late_free_ms) -> None:
    if long_threshold_tokens < 0:
        raise UsageError(f"--long-threshold must be >= 0 tokens, got {long_threshold_tokens}")
    if not 0 < long_share_alert <= 1:
        raise UsageError(f"--long-share-alert must be a fraction in (0, 1], got {long_share_alert}")
    if top < 0:
        raise UsageError(f"--top must be >= 0, got {top}")
    if pool_blocks is not None and pool_blocks <= 0:
        raise UsageError(f"--pool-blocks must be a positive number of blocks, got {pool_blocks}")
    if not late_free_ms >= 0:
        raise UsageError(f"--late-free-ms must be >= 0 ms, got {late_free_ms}")


# ---------------------------------------------------------------------------------------------------- steps


@dataclasses.dataclass(frozen=True, eq=False)
class _TimeOrder:
    """The stable time order of the rows (equal ts in file order)."""

    p0: np.ndarray | None  # row of each time-order position (None: the file is already in time order)
    tpos_of_row: np.ndarray | None  # the inverse: time-order position of each row
    t_ts: np.ndarray  # ts in time order
    t_start: float
    t_end: float  # the end of the trace: the largest accepted ts
    duration: float


def _time_order(table: EventTable) -> _TimeOrder:
    import numpy as np

    n, ts = table.events, table.ts
    sorted_already = n < 2 or bool((ts[1:] >= ts[:-1]).all())  # usually: one pass, no sort
    p0 = None if sorted_already else np.argsort(ts, kind="stable")
    t_ts = ts if p0 is None else ts[p0]
    t_start = float(t_ts[0]) if n else nan
    t_end = float(t_ts[-1]) if n else nan
    return _TimeOrder(
        p0=p0,
        tpos_of_row=None if p0 is None else inverse_permutation(p0),
        t_ts=t_ts,
        t_start=t_start,
        t_end=t_end,
        duration=t_end - t_start if n else 0.0,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _RequestPass:
    """The per-request pass: each request's integrals and counts (arrays aligned with request_ids), and the
    change it makes to the blocks in use at each row (in time order) for the pool curves."""

    holding_s: np.ndarray
    block_seconds: np.ndarray
    slot_seconds: np.ndarray
    token_seconds: np.ndarray
    peak_tokens: np.ndarray
    peak_blocks: np.ndarray
    tokens: np.ndarray
    leaked_blocks: np.ndarray
    rises: np.ndarray  # holding intervals begun (b rising from 0)
    over_frees: np.ndarray  # over-free rows per request
    events: np.ndarray  # rows per request
    first_ts_s: np.ndarray
    last_ts_s: np.ndarray
    first_block_size: np.ndarray  # block size of each request's first row
    second_rise: np.ndarray  # time-order position of each request's second rise of b from 0 (n: none)
    over_free_rows: int
    over_freed_blocks: int
    db_ts: np.ndarray  # change of b at each time-order position (over-frees clamped); int32 when totals fit


def _request_pass_beside_physical(table: EventTable, order: _TimeOrder) -> tuple[Any, _RequestPass]:
    """Run the per-request pass here while the physical-block pass (block_ids) starts on a second core.

    numpy and the compiled loops release the GIL; the physical pass needs where each request's holding intervals
    close, which this thread hands over through a Future once known (or the error, so that thread never waits
    forever).
    """
    from concurrent.futures import Future

    physical_job: Future[PhysicalBlocks] | None = None
    later: Future[tuple[Any, Any]] | None = None
    if table.events and table.block_id_rows is not None and table.block_id_rows.size:
        later = Future()
        physical_job = in_background(physical_blocks, table, order.tpos_of_row, order.t_ts, order.t_end, later)
    hand_over = None if later is None else later.set_result
    try:
        kernels = compiled()
        if kernels is not None:
            passed = _request_pass_compiled(kernels, table, order, hand_over)
        else:
            passed = _request_pass_numpy(table, order, hand_over)
    except BaseException as err:
        if later is not None and not later.done():
            later.set_exception(err)
        raise
    return physical_job, passed


def _running_sum_dtype(table: EventTable):
    """int32 when the running sums of blocks (times block size) and tokens fit in it, else int64."""
    import numpy as np

    max_bs = table.default_block_size if table.block_size is None else int(table.block_size.max(initial=1))
    total_blocks = int(table.num_blocks.sum(dtype=np.int64))
    total_tokens = int(table.num_tokens.sum(dtype=np.int64))
    return np.int32 if max(total_blocks * max_bs, total_tokens) < 2**31 else np.int64


def _request_pass_compiled(kernels, table: EventTable, order: _TimeOrder, hand_over) -> _RequestPass:
    """The per-request pass as one compiled sweep over the rows in time order (see _kernels.c)."""
    import numpy as np

    n, n_req = table.events, len(table.request_ids)
    floats = [np.empty(n_req) for _ in range(4)]  # holding, block-, slot- and token-seconds
    counts = [np.empty(n_req, dtype=np.int64) for _ in range(7)]  # peaks, tokens, leaked, rises, over, events
    first_ts, last_ts = np.empty(n_req), np.empty(n_req)
    first_bs, second_rise = np.empty(n_req, dtype=np.int64), np.empty(n_req, dtype=np.int64)
    db_ts = np.empty(n, dtype=_running_sum_dtype(table))
    cap = int(np.count_nonzero(table.event == FREE))  # a close is a free row
    close_tpos, close_req = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
    bs = None if table.block_size is None else np.ascontiguousarray(table.block_size, dtype=np.int64)
    closes, over_rows, over_blocks = kernels.request_sweep(
        np.ascontiguousarray(table.ts, dtype=np.float64),
        np.ascontiguousarray(table.event, dtype=np.int8),
        np.ascontiguousarray(table.request, dtype=np.int32),
        np.ascontiguousarray(table.num_blocks, dtype=np.int32),
        np.ascontiguousarray(table.num_tokens, dtype=np.int32),
        bs,
        table.default_block_size,
        None if order.p0 is None else np.ascontiguousarray(order.p0, dtype=np.int64),
        order.t_end,
        FREE,
        n_req,
        *floats,
        *counts,
        first_ts,
        last_ts,
        first_bs,
        second_rise,
        db_ts,
        close_tpos,
        close_req,
    )
    if hand_over is not None:  # closes in (request, time) order
        by_request = np.argsort(close_req[:closes], kind="stable")
        hand_over((close_tpos[:closes][by_request], close_req[:closes][by_request]))
    holding, block_seconds, slot_seconds, token_seconds = floats
    peak_tokens, peak_blocks, tokens, leaked, rises, over_frees, events = counts
    return _RequestPass(
        holding,
        block_seconds,
        slot_seconds,
        token_seconds,
        peak_tokens,
        peak_blocks,
        tokens,
        leaked,
        rises,
        over_frees,
        events,
        first_ts,
        last_ts,
        first_bs,
        second_rise,
        int(over_rows),
        int(over_blocks),
        db_ts,
    )


def _request_pass_numpy(table: EventTable, order: _TimeOrder, hand_over) -> _RequestPass:
    """The per-request pass as numpy steps: a stable sort by (request, ts), then segmented sums (the reference
    of the compiled sweep)."""
    import numpy as np

    def closes(held_state) -> None:  # where each request's holding intervals close, in (request, time) order
        q, starts, b, bp = held_state
        close = np.flatnonzero((b == 0) & (bp > 0))
        hand_over((q[close], np.searchsorted(starts, close, side="right") - 1))

    held = _hold_blocks(table, order.p0, None if hand_over is None else closes)
    return _integrate(table, held, order.t_end)


@dataclasses.dataclass(eq=False)
class _Held:
    """The numpy per-request pass: rows in (request, ts) order and the blocks held after each.

    Working state, not a result: the large per-row arrays are dropped (set to None) as soon as they are used.
    """

    q: Any  # sorted position k holds time-order position q[k]
    codes: Any  # request of each row in time order
    starts: Any  # first sorted position of each request
    lengths: Any  # rows per request
    last: Any  # last sorted position of each request
    t: Any  # ts, sorted
    d: Any  # signed block change of each row, sorted (free rows negative)
    tok: Any  # tokens added by each row, sorted (0 on free rows)
    bs: Any  # block size of each row, sorted (an int when every row has the default)
    acc: Any  # the integer dtype of running sums (int32 when the totals fit)
    b: Any  # blocks held after each row (clamped at 0)
    bp: Any  # blocks held before each row


def _hold_blocks(table: EventTable, p0, hand_over=None) -> _Held:
    """The stable sort by (request, ts) and b, the blocks each request holds after each of its rows.

    ``p0`` is the stable time order (None when the file is already in time order).  Only four columns are
    gathered into request order (signed blocks, tokens, ts, block size).  ``hand_over((q, starts, b, bp))`` is
    called as soon as b is known, before the other columns are gathered (the physical-block pass waits for it).
    """
    import numpy as np

    n, n_req = table.events, len(table.request_ids)
    req_f = table.request
    codes = req_f if p0 is None else req_f[p0]  # request of each row in ts order
    q = radix_argsort(codes)  # sorted position k holds ts-order position q[k]
    order = q if p0 is None else p0[q]
    counts = np.bincount(req_f, minlength=n_req).astype(np.int64)
    starts = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64) if n_req else np.zeros(0, np.int64)
    is_free_f = table.event == FREE
    nb_f, nt_f = table.num_blocks, table.num_tokens
    acc = _running_sum_dtype(table)  # int32 where the totals fit: half the memory of the per-row arrays
    d = np.where(is_free_f, -nb_f, nb_f).astype(acc, copy=False)[order]
    s = segment_cumsum(d, starts)
    b = clamp_at_zero(s, starts, counts) if n and s.min() < 0 else s
    del s
    bp = np.empty_like(b)  # blocks held before each row
    if n:
        bp[1:] = b[:-1]
        bp[starts] = 0
    if hand_over is not None:
        hand_over((q, starts, b, bp))
    tok = np.where(is_free_f, 0, nt_f).astype(acc, copy=False)[order]
    t = table.ts[order]
    bs = table.default_block_size if table.block_size is None else table.block_size.astype(acc)[order]
    del order
    return _Held(q, codes, starts, counts, starts + counts - 1, t, d, tok, bs, acc, b, bp)


def _integrate(table: EventTable, held: _Held, t_end: float) -> _RequestPass:
    """Integrals over each request's rows (b and n are step functions held until the request's next row), and
    what the pool curves need: the change of b at each row in time order, each request's second rise."""
    import numpy as np

    n, n_req = table.events, len(table.request_ids)
    starts, b, bp = held.starts, held.b, held.bp
    over = (held.d < 0) & (bp + held.d < 0)  # a free releasing more than is held: clamped at 0
    over_freed = int(-(bp + held.d)[over].sum())
    held.d = None
    episode = np.flatnonzero(bp == 0)  # a new holding interval starts where nothing was held
    tokens = np.add.reduceat(held.tok, starts, dtype=np.int64) if n else np.zeros(0, np.int64)
    held_tokens = segment_cumsum(held.tok, episode, inplace=True)
    held.tok = None
    np.minimum(held_tokens, b * held.bs, out=held_tokens)
    dt = np.empty(n)
    if n:
        np.subtract(held.t[1:], held.t[:-1], out=dt[:-1])
        dt[held.last] = t_end - held.t[held.last]

    def per_request(values, ufunc=np.add):
        return ufunc.reduceat(values, starts) if n else np.zeros(0)

    def count_per_request(positions):
        if not n:
            return np.zeros(0, np.int64)
        return np.bincount(np.searchsorted(starts, positions, side="right") - 1, minlength=n_req)

    block_seconds = per_request(b * dt)
    slot_seconds = block_seconds * held.bs if np.isscalar(held.bs) else per_request(b * held.bs * dt)
    token_seconds = per_request(held_tokens * dt)
    holding = per_request(np.where(b > 0, dt, 0.0))
    peak_tokens = per_request(held_tokens, np.maximum).astype(np.int64)
    del held_tokens, dt
    up_pos = np.flatnonzero((bp == 0) & (b > 0))
    second_rise = np.full(n_req, n, dtype=np.int64)  # ts-order position of each request's second rise
    if up_pos.size:
        up_req = np.searchsorted(starts, up_pos, side="right") - 1
        again = np.flatnonzero(up_req[1:] == up_req[:-1]) + 1
        again = again[np.r_[True, up_req[again[1:]] != up_req[again[:-1]]]] if again.size else again
        second_rise[up_req[again]] = held.q[up_pos[again]]
    db_ts = np.empty_like(b)
    db_ts[held.q] = b - bp
    if np.isscalar(held.bs):
        first_bs = np.full(n_req, table.default_block_size, dtype=np.int64)
    else:
        first_bs = held.bs[np.minimum(starts, max(n - 1, 0))].astype(np.int64)
    return _RequestPass(
        holding_s=holding,
        block_seconds=block_seconds,
        slot_seconds=slot_seconds,
        token_seconds=token_seconds,
        peak_tokens=peak_tokens,
        peak_blocks=per_request(b, np.maximum).astype(np.int64),
        tokens=tokens,
        leaked_blocks=b[held.last].astype(np.int64),
        rises=count_per_request(up_pos),
        over_frees=count_per_request(np.flatnonzero(over)),
        events=held.lengths,
        first_ts_s=held.t[starts] if n else np.zeros(0),
        last_ts_s=held.t[held.last] if n else np.zeros(0),
        first_block_size=first_bs,
        second_rise=second_rise,
        over_free_rows=int(over.sum()),
        over_freed_blocks=over_freed,
        db_ts=db_ts,
    )


def _request_table(table: EventTable, passed: _RequestPass, rows: _RowFigures, long_threshold: int):
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        utilization = np.where(passed.slot_seconds > 0, passed.token_seconds / passed.slot_seconds, nan)
    return RequestTable(
        request_ids=table.request_ids,
        holding_time_s=passed.holding_s,
        utilization=utilization,
        block_seconds=passed.block_seconds,
        wasted_slot_seconds=np.maximum(passed.slot_seconds - passed.token_seconds, 0.0),
        peak_blocks=passed.peak_blocks,
        peak_tokens=passed.peak_tokens,
        tokens=passed.tokens,
        prompt_tokens=rows.prompt_tokens,
        reused_blocks=rows.reused_blocks,
        reused_tokens=rows.reused_tokens,
        prefix_hit_tokens=rows.match_tokens,
        free_latency_ms_max=rows.free_latency_ms_max,
        late_free_block_seconds=rows.late_free_block_seconds,
        preemptions=np.maximum(passed.rises - 1, 0),
        over_frees=passed.over_frees,
        leaked=passed.leaked_blocks > 0,
        leaked_blocks=passed.leaked_blocks,
        long=passed.peak_tokens > long_threshold,
        first_ts_s=passed.first_ts_s,
        last_ts_s=passed.last_ts_s,
        events=passed.events,
        token_seconds=passed.token_seconds,
        slot_seconds=passed.slot_seconds,
        late_free_slot_seconds=rows.late_free_slot_seconds,
    )


def _capacity(table: EventTable, pool_blocks, physical: PhysicalBlocks | None, order: _TimeOrder, in_use):
    """--pool-blocks, else the largest blocks in use (physical when known) plus free_pool_blocks at a row."""
    import numpy as np

    if pool_blocks is not None:
        return float(pool_blocks)
    if table.free_pool_blocks is None:
        return None
    fp_rows = np.flatnonzero(~np.isnan(table.free_pool_blocks))
    if not fp_rows.size:
        return None
    fp = table.free_pool_blocks[fp_rows]
    pos = fp_rows if order.tpos_of_row is None else order.tpos_of_row[fp_rows]
    if physical is not None and physical.curve_t.size:
        k = np.searchsorted(physical.curve_t, order.t_ts[pos], side="right") - 1
        used_then = np.where(k >= 0, physical.curve_b[np.maximum(k, 0)], 0)
    else:
        used_then = in_use[pos]
    return float((used_then + fp).max())


def _latencies(table: EventTable, event: int):
    """latency_ms of the rows of one event type that have one."""
    import numpy as np

    if table.latency_ms is None:
        return np.zeros(0)
    values = table.latency_ms[table.event == event]
    return values[~np.isnan(values)]


@dataclasses.dataclass(frozen=True, eq=False)
class _Flows:
    """Blocks through the pool and the latencies of allocate and free rows (no physical blocks needed)."""

    free_latencies_ms: np.ndarray
    free_latency: tuple[float, float, float, float]  # p50, p95, p99, max
    allocate_latency: tuple[float, float, float, float]
    blocks_allocated: int  # allocate and append rows
    blocks_freed: int  # free rows, over-frees excluded
    free_pool_blocks_min: float | None  # from the free_pool_blocks column


def _pool_flows(table: EventTable, passed: _RequestPass) -> _Flows:
    import numpy as np

    ev, nb = table.event, table.num_blocks
    free_lat = _latencies(table, FREE)
    fp = table.free_pool_blocks
    return _Flows(
        free_latencies_ms=free_lat,
        free_latency=percentiles(free_lat),
        allocate_latency=percentiles(_latencies(table, ALLOCATE)),
        blocks_allocated=int(nb[(ev == ALLOCATE) | (ev == APPEND)].sum()),
        blocks_freed=int(nb[ev == FREE].sum()) - passed.over_freed_blocks,
        free_pool_blocks_min=None if fp is None or np.isnan(fp).all() else float(np.nanmin(fp)),
    )


def _pool_stats(
    order: _TimeOrder,
    curves: _Curves,
    flows: _Flows,
    passed: _RequestPass,
    requests: RequestTable,
    physical: PhysicalBlocks | None,
    capacity: float | None,
) -> PoolStats:
    fl, al = flows.free_latency, flows.allocate_latency
    peak_i = _lasting_peak(curves.time_s, curves.blocks_in_use, order.t_end)
    total_slot_seconds = float(requests.slot_seconds.sum())
    duration = order.duration
    return PoolStats(
        peak_blocks_in_use=int(curves.blocks_in_use[peak_i]) if curves.time_s.size else 0,
        peak_at_s=float(curves.time_s[peak_i]) if curves.time_s.size else nan,
        mean_blocks_in_use=float(passed.block_seconds.sum()) / duration if duration > 0 else nan,
        utilization=float(requests.token_seconds.sum()) / total_slot_seconds if total_slot_seconds > 0 else nan,
        blocks_allocated=flows.blocks_allocated,
        blocks_reused=int(requests.reused_blocks.sum()),
        blocks_freed=flows.blocks_freed,
        blocks_allocated_per_s=flows.blocks_allocated / duration if duration > 0 else nan,
        free_latency_count=int(flows.free_latencies_ms.size),
        free_latency_ms_p50=fl[0],
        free_latency_ms_p95=fl[1],
        free_latency_ms_p99=fl[2],
        free_latency_ms_max=fl[3],
        late_free_block_seconds=float(requests.late_free_block_seconds.sum()),
        allocate_latency_ms_p50=al[0],
        allocate_latency_ms_p95=al[1],
        allocate_latency_ms_max=al[3],
        has_block_ids=physical is not None,
        unique_physical_blocks=None if physical is None else physical.unique,
        peak_physical_blocks_in_use=None if physical is None else physical.peak,
        mean_physical_blocks_in_use=None if physical is None else physical.mean,
        reallocations=None if physical is None else physical.reallocations,
        turnover_time_s_p50=None if physical is None else physical.turnover_s_p50,
        turnover_time_s_p95=None if physical is None else physical.turnover_s_p95,
        free_pool_blocks_min=flows.free_pool_blocks_min,
        capacity_blocks=capacity,
    )


def _lasting_peak(time_s, values, t_end: float) -> int:
    """Index of the largest value that lasts: an instant at the very end of the trace (zero duration) is no peak.

    Falls back to every point when none lasts (a trace of one instant).
    """
    import numpy as np

    if not time_s.size:
        return 0
    lasts = np.diff(np.r_[time_s, t_end]) > 0
    if not lasts.any():
        return int(np.argmax(values))
    candidates = np.where(lasts, values, -np.inf if values.dtype.kind == "f" else np.iinfo(np.int64).min)
    return int(np.argmax(candidates))


def _late_frees(requests: RequestTable, threshold_ms: float, top: int, all_late_block_seconds: float) -> LateFrees:
    """Requests whose blocks returned to the pool later than ``threshold_ms`` after they finished, by cost."""
    import numpy as np

    lat = requests.free_latency_ms_max
    with np.errstate(invalid="ignore"):
        late = np.flatnonzero(lat > threshold_ms)
    cost = requests.late_free_block_seconds[late]
    ranked = late[np.lexsort((-lat[late], -cost))][:top]
    lost = float(cost.sum())
    return LateFrees(
        threshold_ms=float(threshold_ms),
        requests=int(late.size),
        block_seconds=lost,
        share_of_late_free_block_seconds=lost / all_late_block_seconds if all_late_block_seconds > 0 else nan,
        top=tuple(
            LateFree(
                request_id=requests.request_ids[i],
                free_latency_ms=float(lat[i]),
                late_free_block_seconds=float(requests.late_free_block_seconds[i]),
                peak_blocks=int(requests.peak_blocks[i]),
                holding_time_s=float(requests.holding_time_s[i]),
            )
            for i in ranked.tolist()
        ),
    )


def _anomalies(table: EventTable, passed: _RequestPass, requests: RequestTable) -> Anomalies:
    import numpy as np

    leaked_idx = np.flatnonzero(requests.leaked)
    return Anomalies(
        rejected_rows=table.rejected.count,
        rejected_by_reason=dict(table.rejected.by_reason),
        first_rejected=table.rejected.first,
        blank_rows=table.rejected.blank_rows,
        over_frees=passed.over_free_rows,
        over_freed_blocks=passed.over_freed_blocks,
        over_free_requests=int((requests.over_frees > 0).sum()),
        leaked_requests=int(leaked_idx.size),
        leaked_blocks=int(requests.leaked_blocks.sum()),
        first_leaked_request_ids=tuple(table.request_ids[i] for i in leaked_idx[:FIRST_LEAKS_SHOWN]),
    )


def _summary(
    table: EventTable,
    order: _TimeOrder,
    requests: RequestTable,
    pool: PoolStats,
    anomalies: Anomalies,
    late: LateFrees,
) -> Summary:
    hold_p = percentiles(requests.holding_time_s)
    return Summary(
        requests=len(requests),
        events=table.events,
        rejected_rows=anomalies.rejected_rows,
        leaked_requests=anomalies.leaked_requests,
        leaked_blocks=anomalies.leaked_blocks,
        over_frees=anomalies.over_frees,
        preemptions=int(requests.preemptions.sum()),
        peak_blocks_in_use=pool.peak_blocks_in_use,
        mean_blocks_in_use=pool.mean_blocks_in_use,
        utilization=pool.utilization,
        free_latency_ms_p50=pool.free_latency_ms_p50,
        free_latency_ms_p95=pool.free_latency_ms_p95,
        free_latency_ms_p99=pool.free_latency_ms_p99,
        free_latency_ms_max=pool.free_latency_ms_max,
        holding_time_s_p50=hold_p[0],
        holding_time_s_p95=hold_p[1],
        block_seconds=float(requests.block_seconds.sum()),
        wasted_slot_seconds=float(requests.wasted_slot_seconds.sum()),
        trace_start_s=order.t_start,
        trace_end_s=order.t_end,
        duration_s=order.duration,
        default_block_size=table.default_block_size,
        late_free_requests=late.requests,
    )


def _culprits(requests: RequestTable, top: int) -> tuple[Culprit, ...]:
    import numpy as np

    wasted = requests.wasted_slot_seconds
    ranked = np.argsort(-wasted, kind="stable")[:top]
    return tuple(
        Culprit(
            request_id=requests.request_ids[i],
            wasted_slot_seconds=float(wasted[i]),
            holding_time_s=float(requests.holding_time_s[i]),
            utilization=float(requests.utilization[i]),
            block_seconds=float(requests.block_seconds[i]),
            peak_blocks=int(requests.peak_blocks[i]),
            leaked=bool(requests.leaked[i]),
        )
        for i in ranked.tolist()
        if wasted[i] > 0
    )


# ---------------------------------------------------------------------------------------------------- helpers


@dataclasses.dataclass(frozen=True, eq=False)
class _RowFigures:
    """Per-request sums over the few rows that need them (arrays aligned with request_ids)."""

    prompt_tokens: np.ndarray  # allocate + reuse tokens of the first holding interval
    match_tokens: np.ndarray  # reuse tokens of the first holding interval (the prefix match)
    reused_blocks: np.ndarray
    reused_tokens: np.ndarray
    free_latency_ms_max: np.ndarray  # NaN without a latency
    late_free_block_seconds: np.ndarray  # sum over free rows of blocks x latency
    late_free_slot_seconds: np.ndarray  # sum over free rows of blocks x latency x the row's block size


def _row_figures(table: EventTable, second_rise, tpos_of_row) -> _RowFigures:
    """Per-request sums over the few rows that need them, in file order (no gather of whole columns).

    Prompt and prefix-match tokens count the allocate/reuse rows of the first holding interval: the rows before
    the request's second rise of b from 0, in (ts, file order) order.
    """
    import numpy as np

    n_req = len(table.request_ids)
    ev, req_f, nb_f, nt_f = table.event, table.request, table.num_blocks, table.num_tokens
    is_reuse = ev == REUSE
    prompt_rows = np.flatnonzero((ev == ALLOCATE) | is_reuse)
    pr_req = req_f[prompt_rows]
    pr_tpos = prompt_rows if tpos_of_row is None else tpos_of_row[prompt_rows]
    first = pr_tpos < second_rise[pr_req]

    def total(rows_req, weights):
        return np.bincount(rows_req, weights=weights, minlength=n_req).astype(np.int64)

    prompt_tokens = total(pr_req[first], nt_f[prompt_rows[first]])
    first_reuse = first & is_reuse[prompt_rows]
    match_tokens = total(pr_req[first_reuse], nt_f[prompt_rows[first_reuse]])
    reuse_rows = np.flatnonzero(is_reuse)
    reused_blocks = total(req_f[reuse_rows], nb_f[reuse_rows])
    reused_tokens = total(req_f[reuse_rows], nt_f[reuse_rows])
    free_latency_max = np.full(n_req, nan)
    late_free = np.zeros(n_req)
    late_free_slots = np.zeros(n_req)
    if table.latency_ms is not None:
        rows = np.flatnonzero((ev == FREE) & ~np.isnan(table.latency_ms))
        np.fmax.at(free_latency_max, req_f[rows], table.latency_ms[rows])
        waited = nb_f[rows] * (table.latency_ms[rows] / 1000.0)
        late_free = np.bincount(req_f[rows], weights=waited, minlength=n_req).astype(float)
        bs = table.default_block_size if table.block_size is None else table.block_size[rows]
        late_free_slots = np.bincount(req_f[rows], weights=waited * bs, minlength=n_req).astype(float)
    return _RowFigures(
        prompt_tokens, match_tokens, reused_blocks, reused_tokens, free_latency_max, late_free, late_free_slots
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _Curves:
    """Blocks in use over time: step curves (the value holds from each time to the next) and per row."""

    time_s: np.ndarray
    blocks_in_use: np.ndarray
    long_blocks_in_use: np.ndarray
    in_use: np.ndarray | None  # blocks in use after each row, in time order (compiled: only with free_pool_blocks)


def _pool_curves_of(table: EventTable, order: _TimeOrder, passed: _RequestPass, long_request) -> _Curves:
    """The pool's step curves: one compiled pass where built, else _pool_curves."""
    import numpy as np

    kernels = compiled()
    if kernels is None:
        codes = table.request if order.p0 is None else table.request[order.p0]  # request of each row in ts order
        return _pool_curves(passed.db_ts, long_request[codes], order.t_ts, passed.db_ts.dtype)
    n = passed.db_ts.size
    in_use = np.empty(n, dtype=np.int64) if table.free_pool_blocks is not None else None  # for _capacity only
    curve_t, curve_b, curve_long = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    points = kernels.pool_curves(
        passed.db_ts,
        np.ascontiguousarray(long_request, dtype=np.uint8),
        np.ascontiguousarray(table.request, dtype=np.int32),
        None if order.p0 is None else np.ascontiguousarray(order.p0, dtype=np.int64),
        np.ascontiguousarray(order.t_ts, dtype=np.float64),
        in_use,
        curve_t,
        curve_b,
        curve_long,
    )
    return _Curves(curve_t[:points].copy(), curve_b[:points].copy(), curve_long[:points].copy(), in_use)


def _pool_curves(db_ts, long_row, t_ts, acc) -> _Curves:
    """Blocks in use (all, and long requests') as step curves in global time order.

    ``db_ts`` is each row's change in ts order, summed here.  The curves keep the value after the last row of
    each distinct time, and only where a value changes.
    """
    import numpy as np

    n = db_ts.size
    in_use = np.cumsum(db_ts, dtype=acc)
    long_in_use = np.cumsum(np.where(long_row, db_ts, 0), dtype=acc)
    # Candidate points: the first time, and the last row of each time whose rows change something (a time
    # whose rows change nothing repeats the value before it, so the change-point filter below would drop it).
    point = np.zeros(n, dtype=bool)
    if n:
        np.not_equal(t_ts[1:], t_ts[:-1], out=point[:-1])
        point[-1] = True  # point: the last row of each time
        first = int(np.argmax(point))
        moves = db_ts != 0
        del db_ts
        inner = np.flatnonzero(moves & ~point)  # a change on a row that is not its time's last
        point &= moves
        point[first] = True
        if inner.size:
            point[np.searchsorted(t_ts, t_ts[inner], side="right") - 1] = True
        del moves, inner
    point = np.flatnonzero(point)  # few: one scan of the mask, then small gathers
    curve_t, curve_b, curve_long = t_ts[point], in_use[point], long_in_use[point]
    del point
    if curve_t.size > 1:  # a decode step that fits in its block changes nothing
        changed = np.empty(curve_t.size, dtype=bool)
        changed[0] = True
        np.not_equal(curve_b[1:], curve_b[:-1], out=changed[1:])
        changed[1:] |= curve_long[1:] != curve_long[:-1]
        curve_t, curve_b, curve_long = curve_t[changed], curve_b[changed], curve_long[changed]
    return _Curves(curve_t, curve_b, curve_long, in_use)


def _reuse_sources(table: EventTable) -> dict:
    """Which requests' cached prefixes are reused (the optional source_request_id column of reuse rows)."""
    import numpy as np

    if table.source_request is None:
        return {"distinct_sources": None, "top_sources": ()}
    rows = np.flatnonzero((table.event == REUSE) & (table.source_request >= 0))
    src = table.source_request[rows]
    blocks = np.bincount(src, weights=table.num_blocks[rows], minlength=len(table.source_request_ids))
    used = np.flatnonzero(np.bincount(src, minlength=len(table.source_request_ids)))
    top = used[np.argsort(-blocks[used], kind="stable")][:5]
    return {
        "distinct_sources": int(used.size),
        "top_sources": tuple((table.source_request_ids[i], int(blocks[i])) for i in top.tolist()),
    }


def _prefix_reuse(match_tokens, prompt_tokens, block_size, any_reuse: bool) -> PrefixReuse:
    """Hit share, reused/prompt tokens, the match-length distribution and the diagnosis rules.

    Rules (docs/analyze.md): at least half of the requests matching at most one block (zero included) ->
    prompts differ early (normalise trailing whitespace and newlines before tokenising); at least half of the
    hits sharing one match length that is a multiple of the block size -> block alignment limits sharing.
    """
    import numpy as np

    n = int(match_tokens.size)
    hits = match_tokens[match_tokens > 0]
    hit_bs = block_size[match_tokens > 0]
    short = int((match_tokens <= block_size).sum())
    values, counts = np.unique(match_tokens, return_counts=True)
    top = np.argsort(-counts, kind="stable")[:20]
    histogram = tuple((int(values[i]), int(counts[i])) for i in top)
    most_common = None
    most_common_share = nan
    multiple_share = nan
    if hits.size:
        hv, hc = np.unique(hits, return_counts=True)
        k = int(np.argmax(hc))
        most_common = int(hv[k])
        most_common_share = float(hc[k] / hits.size)
        multiple_share = float((hits % hit_bs == 0).mean())
    diagnosis: list[str] = []
    advice: list[str] = []
    if not any_reuse:
        diagnosis.append("no_reuse_events")
        advice.append("no reuse rows: prefix caching is off, or the observer does not record hits")
    else:
        if n and short / n >= SHORT_MATCH_SHARE:
            diagnosis.append("prompts_differ_early")
            advice.append(
                f"{short / n:.0%} of requests match at most one block of cached prefix: if they share a system "
                "prompt, the prompts differ early (a trailing space or newline); normalise whitespace and newlines "
                "before tokenising"
            )
        if most_common is not None and most_common_share >= PILE_UP_SHARE:
            bsz = int(np.bincount(hit_bs).argmax())
            if most_common % bsz == 0:
                diagnosis.append("block_alignment")
                advice.append(
                    f"{most_common_share:.0%} of hits stop at exactly {most_common} tokens ({most_common // bsz} "
                    f"blocks of {bsz}): only whole blocks are shared, so the shared prefix's last partial block "
                    "is recomputed for every request; align the common prefix to the block size or use smaller "
                    "blocks"
                )
        if not diagnosis:
            diagnosis.append("ok")
    prompt_total = int(prompt_tokens.sum())
    reused_total = int(match_tokens.sum())
    return PrefixReuse(
        requests_with_prompt=n,
        requests_with_hit=int(hits.size),
        hit_share=hits.size / n if n else nan,
        prompt_tokens=prompt_total,
        reused_tokens=reused_total,
        reused_token_share=reused_total / prompt_total if prompt_total else nan,
        match_tokens_p50=nearest_rank(match_tokens, 50),
        match_tokens_p90=nearest_rank(match_tokens, 90),
        short_match_requests=short,
        most_common_hit_tokens=most_common,
        most_common_hit_share=most_common_share,
        block_multiple_hit_share=multiple_share,
        histogram=histogram,
        diagnosis=tuple(diagnosis),
        advice=tuple(advice),
        distinct_sources=None,
        top_sources=(),
    )


def _long_share(curves: _Curves, capacity, t_end, threshold, alert, n_long) -> LongRequests:
    """Share of blocks held by long requests, step-wise over time; how long it stays above the alert.

    The peak is the largest share that lasts: the very end of the trace (an instant) is not reported as a peak.
    """
    import numpy as np

    curve_t, curve_b, curve_long = curves.time_s, curves.blocks_in_use, curves.long_blocks_in_use
    if curve_t.size:
        dt = np.diff(np.r_[curve_t, t_end])
        with np.errstate(invalid="ignore", divide="ignore"):
            if capacity is not None:
                share = curve_long / capacity
                active = np.ones(curve_t.size, dtype=bool)
            else:
                share = np.where(curve_b > 0, curve_long / np.maximum(curve_b, 1), 0.0)
                active = curve_b > 0
        above = active & (share > alert) & (dt > 0)
        k = _lasting_peak(curve_t, share, t_end)
        active_time = float(dt[active].sum())
        mean = float((share * dt)[active].sum() / active_time) if active_time > 0 else nan
        first = float(curve_t[np.argmax(above)]) if above.any() else nan
        peak, peak_at, time_above = float(share[k]), float(curve_t[k]), float(dt[above].sum())
    else:
        peak = peak_at = mean = first = nan
        time_above = 0.0
        above = np.zeros(0, bool)
    return LongRequests(
        threshold_tokens=threshold,
        alert_share=alert,
        long_requests=n_long,
        basis="capacity" if capacity is not None else "blocks_in_use",
        capacity_blocks=capacity,
        peak_share=peak,
        peak_share_at_s=peak_at,
        mean_share=mean,
        time_above_alert_s=time_above,
        first_alert_at_s=first,
        alert=bool(above.any()),
    )
