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
from typing import TYPE_CHECKING

from kvtool.core.errors import UsageError
from kvtool.core.threads import in_background
from kvtool.events.blocks import physical_blocks
from kvtool.events.load import ALLOCATE, APPEND, FREE, REUSE, SCHEMA_VERSION, EventTable
from kvtool.events.segments import clamp_at_zero, inverse_permutation, percentiles, radix_argsort, segment_cumsum

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

DEFAULT_LONG_THRESHOLD_TOKENS = 2048
DEFAULT_LONG_SHARE_ALERT = 0.6  # the seed article's alert: long requests holding > 60 % of the blocks
DEFAULT_TOP = 10
SHORT_MATCH_SHARE = 0.5  # "many" zero or very short prefix matches: at least half of the requests
PILE_UP_SHARE = 0.5  # "piling up": at least half of the hits have the same, block-multiple match length
FIRST_LEAKS_SHOWN = 10

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
    match_tokens_p50: float
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
    peak_share: float
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
    preemptions: np.ndarray
    over_frees: np.ndarray
    leaked: np.ndarray  # bool
    leaked_blocks: np.ndarray  # blocks held at the end of the trace
    long: np.ndarray  # bool: peak tokens above --long-threshold
    first_ts_s: np.ndarray
    last_ts_s: np.ndarray
    events: np.ndarray

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


def analyze_events(
    table: EventTable,
    *,
    long_threshold_tokens: int = DEFAULT_LONG_THRESHOLD_TOKENS,
    long_share_alert: float = DEFAULT_LONG_SHARE_ALERT,
    top: int = DEFAULT_TOP,
    pool_blocks: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Analysis:
    """Analyse an :class:`EventTable` (see the module docstring for the definitions)."""
    import numpy as np

    if long_threshold_tokens < 0:
        raise UsageError(f"--long-threshold must be >= 0 tokens, got {long_threshold_tokens}")
    if not 0 < long_share_alert <= 1:
        raise UsageError(f"--long-share-alert must be a fraction in (0, 1], got {long_share_alert}")
    if top < 0:
        raise UsageError(f"--top must be >= 0, got {top}")
    if pool_blocks is not None and pool_blocks <= 0:
        raise UsageError(f"--pool-blocks must be a positive number of blocks, got {pool_blocks}")
    note = progress or (lambda stage: None)

    n = table.events
    n_req = len(table.request_ids)
    ts = table.ts
    t_end = float(ts.max()) if n else nan
    t_start = float(ts.min()) if n else nan
    duration = t_end - t_start if n else 0.0

    # ---- one stable sort by (request, ts): ts first (usually already sorted), then radix passes on the request
    # (_hold_blocks).  Everything that concerns a few rows (reuse, latency, prompts) is computed on those rows
    # in file order (_row_figures).
    note("sorting")
    ts_sorted_already = n < 2 or bool((ts[1:] >= ts[:-1]).all())
    p0 = None if ts_sorted_already else np.argsort(ts, kind="stable")
    tpos_of_row = None if p0 is None else inverse_permutation(p0)
    t_ts = ts if p0 is None else ts[p0]
    # unique physical blocks (block_ids) run on a second core meanwhile (numpy releases the GIL in its sorts
    # and loops); they need b, which this thread hands over through `later` once computed
    physical_job = later = None
    if n and table.block_id_rows is not None and table.block_id_rows.size:
        from concurrent.futures import Future

        later = Future()
        physical_job = in_background(physical_blocks, table, tpos_of_row, t_ts, t_end, later)
    try:
        order, q, codes, starts, lengths, last, t, d, tok, bs, acc, b, bp = _hold_blocks(table, p0)
    except BaseException as err:
        if later is not None:
            later.set_exception(err)  # the physical-block thread must not wait forever
        raise
    if later is not None:
        later.set_result((q, starts, b, bp))
    note("integrating")
    ev = table.event
    is_free_f = ev == FREE
    nb_f = table.num_blocks
    over = (d < 0) & (bp + d < 0)  # a free releasing more than is held: clamped at 0
    over_freed = int(-(bp + d)[over].sum())
    del d
    episode = np.flatnonzero(bp == 0)  # a new holding interval starts where nothing was held
    tokens = np.add.reduceat(tok, starts, dtype=np.int64) if n else np.zeros(0, np.int64)
    held_tokens = segment_cumsum(tok, episode, inplace=True)
    del tok
    np.minimum(held_tokens, b * bs, out=held_tokens)
    up = (bp == 0) & (b > 0)
    dt = np.empty(n)
    if n:
        np.subtract(t[1:], t[:-1], out=dt[:-1])
        dt[last] = t_end - t[last]

    def per_request(values, ufunc=np.add):
        return ufunc.reduceat(values, starts) if n else np.zeros(0)

    block_seconds = per_request(b * dt)
    slot_seconds = block_seconds * bs if np.isscalar(bs) else per_request(b * bs * dt)
    token_seconds = per_request(held_tokens * dt)
    holding = per_request(np.where(b > 0, dt, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        utilization = np.where(slot_seconds > 0, token_seconds / slot_seconds, nan)
    wasted = np.maximum(slot_seconds - token_seconds, 0.0)
    peak_tokens = per_request(held_tokens, np.maximum).astype(np.int64)
    del held_tokens, dt
    up_pos = np.flatnonzero(up)
    del up
    ups = np.bincount(np.searchsorted(starts, up_pos, side="right") - 1, minlength=n_req) if n else np.zeros(0, int)
    leaked_blocks = b[last]
    db = b - bp  # the change each row actually made (over-frees clamped)
    peak_blocks = per_request(b, np.maximum)

    prompt_tokens, match_tokens_all, reused_blocks, reused_tokens, free_latency_max = _row_figures(
        table, starts, q, up_pos, tpos_of_row
    )
    over_per_request = (
        np.bincount(np.searchsorted(starts, np.flatnonzero(over), side="right") - 1, minlength=n_req)
        if n
        else np.zeros(0, int)
    )
    requests = RequestTable(
        request_ids=table.request_ids,
        holding_time_s=holding,
        utilization=utilization,
        block_seconds=block_seconds,
        wasted_slot_seconds=wasted,
        peak_blocks=peak_blocks,
        peak_tokens=peak_tokens,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        reused_blocks=reused_blocks,
        reused_tokens=reused_tokens,
        prefix_hit_tokens=match_tokens_all,
        free_latency_ms_max=free_latency_max,
        preemptions=np.maximum(ups - 1, 0),
        over_frees=over_per_request,
        leaked=leaked_blocks > 0,
        leaked_blocks=leaked_blocks,
        long=peak_tokens > long_threshold_tokens,
        first_ts_s=t[starts],
        last_ts_s=t[last],
        events=lengths,
    )

    note("pool")
    curve_t, curve_b, curve_long, in_use = _pool_curves(db, q, requests.long[codes], t_ts, acc)
    del db
    peak_i = int(np.argmax(curve_b)) if curve_b.size else 0
    total_block_seconds = float(block_seconds.sum())
    mean_in_use = total_block_seconds / duration if duration > 0 else nan

    del b, bp
    physical = physical_job.result() if physical_job is not None else None

    capacity = float(pool_blocks) if pool_blocks is not None else None
    free_pool_min = None
    if table.free_pool_blocks is not None:
        fp_rows = np.flatnonzero(~np.isnan(table.free_pool_blocks))
        if fp_rows.size:
            fp = table.free_pool_blocks[fp_rows]
            free_pool_min = float(fp.min())
            if capacity is None:
                pos = fp_rows if tpos_of_row is None else tpos_of_row[fp_rows]
                if physical is not None and physical["curve_t"].size:
                    k = np.searchsorted(physical["curve_t"], t_ts[pos], side="right") - 1
                    used_then = np.where(k >= 0, physical["curve_b"][np.maximum(k, 0)], 0)
                else:
                    used_then = in_use[pos]
                capacity = float((used_then + fp).max())
    del in_use

    latency = table.latency_ms
    free_rows_lat = latency[is_free_f] if latency is not None else np.zeros(0)
    free_rows_lat = free_rows_lat[~np.isnan(free_rows_lat)]
    alloc_lat = latency[ev == ALLOCATE] if latency is not None else np.zeros(0)
    alloc_lat = alloc_lat[~np.isnan(alloc_lat)]
    fl = percentiles(free_rows_lat)
    al = percentiles(alloc_lat)
    late_free = 0.0
    if latency is not None:
        free_lat_rows = np.flatnonzero(is_free_f & ~np.isnan(latency))
        late_free = float((nb_f[free_lat_rows] * latency[free_lat_rows]).sum() / 1000.0)
    blocks_allocated = int(nb_f[(ev == ALLOCATE) | (ev == APPEND)].sum())
    blocks_reused = int(reused_blocks.sum())
    blocks_freed = int(nb_f[is_free_f].sum()) - over_freed
    total_token_seconds = float(token_seconds.sum())
    total_slot_seconds = float(slot_seconds.sum())
    pool_util = total_token_seconds / total_slot_seconds if total_slot_seconds > 0 else nan
    pool = PoolStats(
        peak_blocks_in_use=int(curve_b[peak_i]) if curve_b.size else 0,
        peak_at_s=float(curve_t[peak_i]) if curve_t.size else nan,
        mean_blocks_in_use=mean_in_use,
        utilization=pool_util,
        blocks_allocated=blocks_allocated,
        blocks_reused=blocks_reused,
        blocks_freed=blocks_freed,
        blocks_allocated_per_s=blocks_allocated / duration if duration > 0 else nan,
        free_latency_count=int(free_rows_lat.size),
        free_latency_ms_p50=fl[0],
        free_latency_ms_p95=fl[1],
        free_latency_ms_p99=fl[2],
        free_latency_ms_max=fl[3],
        late_free_block_seconds=late_free,
        allocate_latency_ms_p50=al[0],
        allocate_latency_ms_p95=al[1],
        allocate_latency_ms_max=al[3],
        has_block_ids=physical is not None,
        unique_physical_blocks=None if physical is None else physical["unique"],
        peak_physical_blocks_in_use=None if physical is None else physical["peak"],
        mean_physical_blocks_in_use=None if physical is None else physical["mean"],
        reallocations=None if physical is None else physical["reallocations"],
        turnover_time_s_p50=None if physical is None else physical["turnover"][0],
        turnover_time_s_p95=None if physical is None else physical["turnover"][1],
        free_pool_blocks_min=free_pool_min,
        capacity_blocks=capacity,
    )

    note("prefix reuse")
    has_prompt = prompt_tokens > 0
    match_tokens = match_tokens_all[has_prompt]
    block_size_of_request = (
        np.full(n_req, table.default_block_size) if np.isscalar(bs) else bs[np.minimum(starts, max(n - 1, 0))]
    )[has_prompt]
    prefix = _prefix_reuse(match_tokens, prompt_tokens[has_prompt], block_size_of_request, bool((ev == REUSE).any()))
    prefix = dataclasses.replace(prefix, **_reuse_sources(table))

    long_stats = _long_share(
        curve_t, curve_b, curve_long, capacity, t_end, long_threshold_tokens, long_share_alert, int(requests.long.sum())
    )

    leaked_idx = np.flatnonzero(requests.leaked)
    anomalies = Anomalies(
        rejected_rows=table.rejected.count,
        rejected_by_reason=dict(table.rejected.by_reason),
        first_rejected=table.rejected.first,
        blank_rows=table.rejected.blank_rows,
        over_frees=int(over.sum()),
        over_freed_blocks=over_freed,
        over_free_requests=int((requests.over_frees > 0).sum()),
        leaked_requests=int(leaked_idx.size),
        leaked_blocks=int(leaked_blocks.sum()),
        first_leaked_request_ids=tuple(table.request_ids[i] for i in leaked_idx[:FIRST_LEAKS_SHOWN]),
    )
    hold_p = percentiles(holding)
    summary = Summary(
        requests=n_req,
        events=n,
        rejected_rows=anomalies.rejected_rows,
        leaked_requests=anomalies.leaked_requests,
        leaked_blocks=anomalies.leaked_blocks,
        over_frees=anomalies.over_frees,
        preemptions=int(requests.preemptions.sum()),
        peak_blocks_in_use=pool.peak_blocks_in_use,
        mean_blocks_in_use=mean_in_use,
        utilization=pool_util,
        free_latency_ms_p50=fl[0],
        free_latency_ms_p95=fl[1],
        free_latency_ms_p99=fl[2],
        free_latency_ms_max=fl[3],
        holding_time_s_p50=hold_p[0],
        holding_time_s_p95=hold_p[1],
        block_seconds=total_block_seconds,
        wasted_slot_seconds=float(wasted.sum()),
        trace_start_s=t_start,
        trace_end_s=t_end,
        duration_s=duration,
        default_block_size=table.default_block_size,
    )
    ranked = np.argsort(-wasted, kind="stable")[:top]
    culprits = tuple(
        Culprit(
            request_id=table.request_ids[i],
            wasted_slot_seconds=float(wasted[i]),
            holding_time_s=float(holding[i]),
            utilization=float(utilization[i]),
            block_seconds=float(block_seconds[i]),
            peak_blocks=int(requests.peak_blocks[i]),
            leaked=bool(requests.leaked[i]),
        )
        for i in ranked.tolist()
        if wasted[i] > 0
    )
    timeline = Timeline(
        time_s=curve_t,
        blocks_in_use=curve_b,
        long_blocks_in_use=curve_long,
        physical_time_s=None if physical is None else physical["curve_t"],
        physical_blocks_in_use=None if physical is None else physical["curve_b"],
    )
    return Analysis(
        file=table.path,
        schema_version=SCHEMA_VERSION,
        summary=summary,
        pool=pool,
        prefix_reuse=prefix,
        long_requests=long_stats,
        anomalies=anomalies,
        culprits=culprits,
        requests=requests,
        timeline=timeline,
        free_latencies_ms=free_rows_lat,
        match_tokens=match_tokens,
    )


# ---------------------------------------------------------------------------------------------------- helpers


def _hold_blocks(table: EventTable, p0):
    """The stable sort by (request, ts) and b, the blocks each request holds after each of its rows.

    ``p0`` is the stable time order (None when the file is already in time order).  Only three columns are
    gathered into request order (signed blocks, tokens, ts).  Returns (order, q, codes, starts, lengths, last,
    t, d, tok, bs, acc, b, bp): q maps each sorted position to its position in time order, codes are the
    requests in time order, d the signed block change of each row, bp the blocks held before it.
    """
    import numpy as np

    n, n_req = table.events, len(table.request_ids)
    req_f = table.request
    codes = req_f if p0 is None else req_f[p0]  # request of each row in ts order
    q = radix_argsort(codes)  # sorted position k holds ts-order position q[k]
    order = q if p0 is None else p0[q]
    counts = np.bincount(req_f, minlength=n_req).astype(np.int64)
    starts = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64) if n_req else np.zeros(0, np.int64)
    lengths = counts
    last = starts + counts - 1
    is_free_f = table.event == FREE
    nb_f, nt_f = table.num_blocks, table.num_tokens
    # running sums fit int32 when the totals do (halves the memory of the per-row arrays)
    max_bs = table.default_block_size if table.block_size is None else int(table.block_size.max(initial=1))
    total_blocks = int(nb_f.sum(dtype=np.int64))
    total_tokens = int(nt_f.sum(dtype=np.int64))
    acc = np.int32 if max(total_blocks * max_bs, total_tokens) < 2**31 else np.int64
    d = np.where(is_free_f, -nb_f, nb_f).astype(acc, copy=False)[order]
    tok = np.where(is_free_f, 0, nt_f).astype(acc, copy=False)[order]
    t = table.ts[order]
    bs = table.default_block_size if table.block_size is None else table.block_size.astype(acc)[order]
    s = segment_cumsum(d, starts)
    b = clamp_at_zero(s, starts, lengths) if n and s.min() < 0 else s
    del s
    bp = np.empty_like(b)  # blocks held before each row
    if n:
        bp[1:] = b[:-1]
        bp[starts] = 0
    return order, q, codes, starts, lengths, last, t, d, tok, bs, acc, b, bp


def _row_figures(table: EventTable, starts, q, up_pos, tpos_of_row):
    """Per-request sums over the few rows that need them, in file order (no gather of whole columns).

    Prompt and prefix-match tokens count the allocate/reuse rows of the first holding interval: the rows before
    the request's second rise of b from 0, in (ts, file order) order.  Returns (prompt_tokens, match_tokens,
    reused_blocks, reused_tokens, free_latency_ms_max) per request.
    """
    import numpy as np

    n, n_req = table.events, len(table.request_ids)
    ev, req_f, nb_f, nt_f = table.event, table.request, table.num_blocks, table.num_tokens
    second_rise = np.full(n_req, n, dtype=np.int64)  # ts-order position of each request's second rise
    if up_pos.size:
        up_req = np.searchsorted(starts, up_pos, side="right") - 1
        again = np.flatnonzero(up_req[1:] == up_req[:-1]) + 1
        again = again[np.r_[True, up_req[again[1:]] != up_req[again[:-1]]]] if again.size else again
        second_rise[up_req[again]] = q[up_pos[again]]
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
    if table.latency_ms is not None:
        rows = np.flatnonzero((ev == FREE) & ~np.isnan(table.latency_ms))
        np.fmax.at(free_latency_max, req_f[rows], table.latency_ms[rows])
    return prompt_tokens, match_tokens, reused_blocks, reused_tokens, free_latency_max


def _pool_curves(db, q, long_row, t_ts, acc):
    """Blocks in use (all, and long requests') as step curves in global time order.

    ``db`` is each row's change in (request, ts) order; it is scattered back to ts order and summed.  The curves
    keep the value after the last row of each distinct time, and only where a value changes.  Returns
    (time_s, blocks_in_use, long_blocks_in_use, in_use_per_row).
    """
    import numpy as np

    n = db.size
    db_ts = np.empty_like(db)
    db_ts[q] = db
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
    return curve_t, curve_b, curve_long, in_use


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
        match_tokens_p50=float(np.percentile(match_tokens, 50)) if n else nan,
        match_tokens_p90=float(np.percentile(match_tokens, 90)) if n else nan,
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


def _long_share(curve_t, curve_b, curve_long, capacity, t_end, threshold, alert, n_long) -> LongRequests:
    """Share of blocks held by long requests, step-wise over time; how long it stays above the alert."""
    import numpy as np

    if curve_t.size:
        dt = np.diff(np.r_[curve_t, t_end])
        with np.errstate(invalid="ignore", divide="ignore"):
            if capacity is not None:
                share = curve_long / capacity
                active = np.ones(curve_t.size, dtype=bool)
            else:
                share = np.where(curve_b > 0, curve_long / np.maximum(curve_b, 1), 0.0)
                active = curve_b > 0
        above = active & (share > alert)
        k = int(np.argmax(share))
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
