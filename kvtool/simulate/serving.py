"""The serving simulation of `kvtool simulate --serve`: event-driven continuous batching over a paged KV pool.

Model (docs/simulate.md has the long form):

- Time advances in engine steps.  At each step boundary the scheduler (vLLM V1's rules) first gives every running
  request a slot for its next token, allocating a block when the request crosses a block boundary; when the pool
  has no free block it preempts the newest running request (frees all its blocks; it returns to the front of the
  waiting queue and is recomputed later).  Then, only if nothing was preempted at this boundary, it admits waiting
  requests first-come-first-served while ``max_num_seqs`` and the free blocks allow.
- An admitted request is prefilled in one step (its whole prompt, or prompt + generated tokens after a preemption),
  which emits its first output token; every following step writes one token's KV and emits the next token.  A
  request with prompt P and output O >= 1 is in O steps and holds P + O - 1 tokens at the end (vLLM never writes
  the last token's KV).  A request with O = 0 is treated as O = 1.
- A request holds ceil(tokens / block_size) blocks; during a step the token being written counts as held.
- Step time (the cost model, :class:`CostModel`): overhead + token_us x (tokens computed in the step) +
  (table_entry_us + block_size x kv_token_us) x (blocks in use).  It is evaluated at every event and held constant
  until the next one, with an event at least every ``refresh_steps`` steps.

The loop jumps from event to event: arrivals, completions, the first block-boundary crossing that would overflow the
pool, and the refresh tick.  Between events every running request advances in lock-step, and the number of blocks
in use at any step is a closed form over a histogram of the requests' block phases, so block crossings that do not
overflow the pool cost nothing.  Time integrals (block-seconds, token-seconds) are computed afterwards with numpy
from the recorded step times.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

# vLLM's default cap on running requests.
DEFAULT_MAX_NUM_SEQS = 256


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Step time = overhead_ms + token_us x tokens computed + (table_entry_us + b x kv_token_us) x blocks in use.

    Defaults describe a 7B FP16 model on an H100-class GPU: reading 13.5 GB of weights at ~3 TB/s (~5 ms per step);
    ~13.4 GFLOP per token at ~400 TFLOP/s effective (~35 us per computed token); 512 KiB of KV per token read at
    ~3 TB/s (0.17 us per KV slot, whole blocks are read); and a block-table entry cost calibrated so that block size
    8 decodes ~4% slower than 16 for 64 requests of ~1,400 tokens (the seed article's figure).
    """

    step_overhead_ms: float = 5.0
    token_us: float = 35.0
    kv_token_us: float = 0.17
    table_entry_us: float = 0.17
    refresh_steps: int = 32  # the step time is re-evaluated at least this often


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    pool_tokens: int
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    cost: CostModel = CostModel()
    shared_prefix_tokens: int = 0
    prefix_cache: bool = False
    split_threshold_tokens: int | None = None  # final length above which a request goes to the long pool


@dataclasses.dataclass(frozen=True)
class PoolResult:
    """Figures for one pool (one entry without --split-pools; short then long with it)."""

    name: str
    pool_blocks: int
    requests: int
    never_fit: int
    peak_blocks: int
    preemptions: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None


@dataclasses.dataclass(frozen=True)
class ServeResult:
    """Serving-simulation figures for one block size."""

    block_size: int
    pool_tokens: int
    pool_blocks: int  # floor(pool_tokens / block_size), all pools together
    requests: int
    completed: int
    never_fit: int  # requests whose final length needs more blocks than their pool has: never run
    peak_blocks: int  # most physical blocks in use at any step
    mean_blocks: float  # time-weighted blocks in use over the span (first arrival to last completion)
    utilization: float  # integral of tokens held / (block_size x integral of blocks held), physical pool
    preemptions: int  # preemption events (a request can be preempted more than once)
    preempted_requests: int
    queue_delay_p50_s: float | None  # arrival to first admission
    queue_delay_p99_s: float | None
    ttft_p50_s: float | None  # arrival to the end of the first prefill step
    ttft_p99_s: float | None
    span_s: float  # first arrival to last completion
    steps: int  # engine steps executed
    busy_s: float  # time the engine spent running steps
    throughput_tokens_per_s: float  # output tokens of completed requests / span
    tpot_p50_s: float | None  # time per output token after the first, (completion - first token) / (output - 1)
    tpot_p99_s: float | None
    requests_per_s: float
    pools: list[PoolResult]


@dataclasses.dataclass
class ServeTrace:
    """What the simulation recorded, for per-request figures, event export and plots (numpy arrays)."""

    block_size: int
    step_start_s: Any  # start time of every executed step
    step_end_s: Any
    seg_request: Any  # one row per running segment (a preemption ends a segment)
    seg_first_step: Any
    seg_last_step: Any
    seg_start_tokens: Any  # tokens held at the first step (prefill), shared prefix included
    seg_shared_blocks: Any  # full prefix blocks the segment shares (0 without a prefix cache)
    seg_shared_new: Any  # of those, blocks this segment allocated itself (cold cache)
    seg_preempted: Any  # bool: the segment ended by preemption
    seg_pool: Any
    arrival_s: Any  # per request
    never_fit: Any  # bool per request
    completion_s: Any  # per request (nan if never run)
    first_token_s: Any  # per request: end of its first prefill step (nan if never run)
    timeline_s: Any  # start time of each event interval (for plots)
    timeline_blocks: Any  # physical blocks in use during the first step of that interval


class _Pool:
    __slots__ = (
        "name",
        "cap",
        "n",
        "sum_q",
        "cnt",
        "order",
        "waiting",
        "shared_counts",
        "shared",
        "peak",
        "preemptions",
        "requests",
        "never_fit",
    )

    def __init__(self, name: str, cap: int, block_size: int):
        self.name = name
        self.cap = cap
        self.n = 0  # running requests
        self.sum_q = 0  # sum of floor(A / b) over running requests (A: a request's own-token origin step)
        self.cnt = [0] * block_size  # running requests per phase A mod b
        self.order: list[int] = []  # segment ids in admission order (stale ones skipped lazily)
        self.waiting: collections.deque[int] = collections.deque()
        self.shared_counts: dict[int, int] = {}  # shared prefix blocks -> running requests using that many
        self.shared = 0  # physical shared prefix blocks in use (the most any running request uses)
        self.peak = 0
        self.preemptions = 0
        self.requests = 0
        self.never_fit = 0


def simulate_serving(
    prompt_tokens,
    output_tokens,
    arrival_s,
    block_size: int,
    config: ServeConfig,
    progress: Callable[[int], None] | None = None,
) -> tuple[ServeResult, ServeTrace]:
    """Run the serving simulation for one block size.

    ``prompt_tokens``, ``output_tokens`` and ``arrival_s`` (seconds) are parallel arrays, one entry per request;
    request i is ``r{i}`` in exported events.  ``progress(completed)`` is called every 2,000 completions.
    """
    import numpy as np

    b = block_size
    cost = config.cost
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    out_eff = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    n_req = len(prompt)
    final_tokens = prompt + out_eff - 1
    final_blocks = -(-final_tokens // b)
    total_blocks = config.pool_tokens // b

    # Pools: one, or short/long split by final length with capacity shared in proportion to their tokens.
    if config.split_threshold_tokens is not None:
        lengths = prompt + np.asarray(output_tokens, dtype=np.int64)
        is_long = lengths > config.split_threshold_tokens
        long_share = float(lengths[is_long].sum()) / float(lengths.sum())
        cap_long = int(round(total_blocks * long_share))
        pools = [_Pool("short", total_blocks - cap_long, b), _Pool("long", cap_long, b)]
        pool_of = is_long.astype(np.int64)
    else:
        pools = [_Pool("all", total_blocks, b)]
        pool_of = np.zeros(n_req, dtype=np.int64)
    if config.prefix_cache and config.shared_prefix_tokens:
        shared_of = np.minimum(prompt, config.shared_prefix_tokens) // b
    else:
        shared_of = np.zeros(n_req, dtype=np.int64)
    caps = np.array([p.cap for p in pools], dtype=np.int64)
    never = final_blocks > caps[pool_of]
    for i, p in enumerate(pools):
        p.requests = int((pool_of == i).sum())
        p.never_fit = int((never & (pool_of == i)).sum())

    # Python lists: scalar access in the loop is several times faster than numpy's.
    P = prompt.tolist()
    O = out_eff.tolist()  # noqa: E741  (the module docstring names outputs O)
    arr = np.asarray(arrival_s, dtype=np.float64).tolist()
    pool_l = pool_of.tolist()
    shared_l = shared_of.tolist()
    # Per pool, the requests that can run, in arrival order (ties in input order).
    arrival_np = np.asarray(arrival_s, dtype=np.float64)
    arrivals_of = []
    for i in range(len(pools)):
        idx = np.flatnonzero((pool_of == i) & ~never)
        arrivals_of.append(idx[np.argsort(arrival_np[idx], kind="stable")].tolist())
    arrival_times_of = [[arr[r] for r in a] for a in arrivals_of]
    arrivals_left = [len(a) for a in arrivals_of]
    nxt = [0] * len(pools)  # per pool: the next arrival not yet queued
    pool_range = range(len(pools))

    emitted = [0] * n_req
    first_admit = [float("nan")] * n_req
    ttft_at = [float("nan")] * n_req
    done_at = [float("nan")] * n_req
    preempt_count = [0] * n_req

    # Segments (a request's run between admission and completion or preemption): the fixed part as one tuple
    # (request, first step, tokens at the first step, shared blocks, shared blocks allocated, own-token origin A:
    # own tokens during step s = s - A), and the parts that change.
    seg_info: list[tuple[int, int, int, int, int, int]] = []
    seg_s1: list[int] = []
    seg_pre: list[bool] = []
    seg_alive: list[bool] = []
    # Event intervals: (first step, start time, steps, first step's time, later steps' time, blocks in use).
    intervals: list[tuple[int, float, int, float, float, int]] = []
    peak_all = 0

    heap: list[tuple[int, int]] = []  # (final step, segment id)
    overhead_s = cost.step_overhead_ms / 1e3
    token_s = cost.token_us / 1e6
    block_s = (cost.table_entry_us + b * cost.kv_token_us) / 1e6
    refresh = max(1, int(cost.refresh_steps))
    max_seqs = config.max_num_seqs
    heappush, heappop = heapq.heappush, heapq.heappop
    multi = len(pools) > 1

    def own_blocks(p: _Pool, s: int) -> int:
        z = s - 1
        return p.n * (1 + z // b) - p.sum_q - sum(p.cnt[z % b + 1 :])

    def remove(p: _Pool, seg: int) -> None:
        _, _, _, sh, _, A = seg_info[seg]
        p.n -= 1
        p.sum_q -= A // b
        p.cnt[A % b] -= 1
        seg_alive[seg] = False
        if sh:
            c = p.shared_counts[sh] - 1
            if c:
                p.shared_counts[sh] = c
            else:
                del p.shared_counts[sh]
                p.shared = max(p.shared_counts, default=0)

    def next_arrival() -> float:
        return min((arrival_times_of[i][nxt[i]] for i in pool_range if nxt[i] < arrivals_left[i]), default=float("inf"))

    running = 0
    s = 0
    T = next_arrival()
    completed = 0
    preemptions = 0
    last_report = 0
    while True:
        # 1. Completions: requests whose last step was s - 1 free their blocks now (time T).
        while heap and heap[0][0] < s:
            _, seg = heappop(heap)
            if not seg_alive[seg]:
                continue
            rid = seg_info[seg][0]
            remove(pools[pool_l[rid]], seg)
            seg_s1[seg] = s - 1
            done_at[rid] = T
            running -= 1
            completed += 1
        if progress is not None and completed - last_report >= 2000:
            last_report = completed
            progress(completed)
        # 2. Arrivals up to now join their pool's queue.
        for pi in pool_range:
            j = nxt[pi]
            times = arrival_times_of[pi]
            if j < arrivals_left[pi] and times[j] <= T:
                a, end, waiting = arrivals_of[pi], arrivals_left[pi], pools[pi].waiting
                while j < end and times[j] <= T:
                    waiting.append(a[j])
                    j += 1
                nxt[pi] = j
        # 3. Slots for the running requests' next tokens; preempt the newest when a pool overflows.
        preempted_now = False
        used = [0] * len(pools)
        for pi, p in enumerate(pools):
            if not p.n:
                used[pi] = p.shared
                continue
            u = own_blocks(p, s) + p.shared
            while u > p.cap:
                seg = p.order.pop()
                while not seg_alive[seg]:
                    seg = p.order.pop()
                rid, s0 = seg_info[seg][:2]
                emitted[rid] += s - s0
                remove(p, seg)
                seg_s1[seg] = s - 1
                seg_pre[seg] = True
                running -= 1
                preempt_count[rid] += 1
                preemptions += 1
                p.preemptions += 1
                p.waiting.appendleft(rid)
                preempted_now = True
                u = (own_blocks(p, s) if p.n else 0) + p.shared
            used[pi] = u
        # 4. Admissions (FCFS per pool; pools in the order of their heads' arrival).
        prefill_tokens = 0
        admitted = 0  # requests prefilled in this step (new or recomputed after a preemption)
        new_ttft: list[int] = []
        if not preempted_now and running < max_seqs:
            candidates = [pi for pi in pool_range if pools[pi].waiting]
            while candidates and running < max_seqs:
                pi = min(candidates, key=lambda i: arr[pools[i].waiting[0]]) if multi else candidates[0]
                p = pools[pi]
                rid = p.waiting[0]
                x = P[rid] + emitted[rid]
                sh = shared_l[rid]
                new_sh = sh - p.shared if sh > p.shared else 0
                need = -(-x // b) - sh + new_sh
                if need > p.cap - used[pi]:
                    candidates.remove(pi)
                    continue
                p.waiting.popleft()
                used[pi] += need
                seg = len(seg_info)
                A = s - (x - sh * b)
                seg_info.append((rid, s, x, sh, new_sh, A))
                seg_s1.append(-1)
                seg_pre.append(False)
                seg_alive.append(True)
                p.n += 1
                p.sum_q += A // b
                p.cnt[A % b] += 1
                if sh:
                    p.shared_counts[sh] = p.shared_counts.get(sh, 0) + 1
                    if sh > p.shared:
                        p.shared = sh
                p.order.append(seg)
                heappush(heap, (s + O[rid] - emitted[rid] - 1, seg))
                running += 1
                prefill_tokens += x - (sh - new_sh) * b
                admitted += 1
                if emitted[rid] == 0:
                    first_admit[rid] = T
                    new_ttft.append(rid)
                if not p.waiting:
                    candidates.remove(pi)
        if not running:
            if any(p.waiting for p in pools):  # pragma: no cover - excluded by the never-fit filter
                raise RuntimeError("a waiting request cannot be admitted into an empty pool")
            t_next = next_arrival()
            if t_next == float("inf"):
                break
            T = max(T, t_next)  # idle: jump to the next arrival
            continue
        # 5. Step time and the length of this interval (steps s .. s+K-1).
        blocks_now = sum(used)
        tau_r = overhead_s + token_s * running + block_s * blocks_now
        # The first step computes the prefills instead of one decode token for each admitted request.
        tau_f = tau_r + token_s * (prefill_tokens - admitted)
        K = 1 if preempted_now else refresh
        while heap and not seg_alive[heap[0][1]]:
            heappop(heap)
        kc = heap[0][0] + 1 - s
        if kc < K:
            K = kc
        if running < max_seqs:
            # The next arrival is an event only where it could be admitted: its pool's queue is empty.
            for pi in pool_range:
                if nxt[pi] < arrivals_left[pi] and not pools[pi].waiting:
                    rest = arrival_times_of[pi][nxt[pi]] - T - tau_f
                    ka = 1 if rest <= 0 else 1 + int(-(-rest // tau_r))
                    if ka < K:
                        K = ka
        if K > 1:
            for pi, p in enumerate(pools):
                # At most ceil(K/b) crossings per request by step s+K: skip the exact count when that fits.
                if p.n and used[pi] + p.n * ((K - 1) // b + 1) > p.cap and own_blocks(p, s + K) + p.shared > p.cap:
                    lo, hi = 1, K  # the first boundary that overflows is in [lo, hi]
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if own_blocks(p, s + mid) + p.shared > p.cap:
                            hi = mid
                        else:
                            lo = mid + 1
                    K = lo
        intervals.append((s, T, K, tau_f, tau_r, blocks_now))
        for rid in new_ttft:
            ttft_at[rid] = T + tau_f
        T += tau_f + (K - 1) * tau_r
        s += K
        # Peaks: blocks only grow inside an interval, so its last step holds its most.  At most ceil((K-1)/b)
        # crossings per request after the first step: count exactly only when that could beat a recorded peak.
        grow = running * ((K - 2) // b + 1) if K > 1 else 0
        if blocks_now + grow > peak_all or multi:
            in_use = 0
            for p in pools:
                u = (own_blocks(p, s - 1) if p.n else 0) + p.shared
                if u > p.peak:
                    p.peak = u
                in_use += u
            if in_use > peak_all:
                peak_all = in_use

    if progress is not None:
        progress(completed)
    return _summarise(
        b,
        config,
        pools,
        n_req,
        never,
        np.asarray(arr, dtype=np.float64),
        out_eff,
        intervals,
        s,
        (seg_info, seg_s1, seg_pre, pool_l),
        first_admit,
        ttft_at,
        done_at,
        preempt_count,
        preemptions,
        completed,
        total_blocks,
        peak_all,
    )


def _step_times(first, t_start, k, t_first, t_rest, steps: int):
    """Start and end time of every executed step from the recorded intervals."""
    import numpy as np

    t0 = np.repeat(t_start, k)
    tf = np.repeat(t_first, k)
    tr = np.repeat(t_rest, k)
    j = np.arange(steps, dtype=np.int64) - np.repeat(first, k)  # index of the step inside its interval
    start = np.where(j == 0, t0, t0 + tf + (j - 1) * tr)
    end = start + np.where(j == 0, tf, tr)
    # Back-to-back steps: the end of one step is exactly the start of the next (the two formulas round
    # differently), so a free at the end of a step and an allocation at the start of the next share a timestamp.
    touching = np.abs(start[1:] - end[:-1]) <= 1e-9 * np.maximum(1.0, np.abs(end[:-1]))
    end[:-1][touching] = start[1:][touching]
    return start, end


def segment_integrals(trace: ServeTrace):
    """Per segment: holding time, token-seconds and block-seconds (logical: shared blocks counted per request),
    and the blocks held at the last step.  Closed forms over prefix sums of step start times (docs/simulate.md).
    """
    import numpy as np

    b = trace.block_size
    start, end = trace.step_start_s, trace.step_end_s
    s0, s1 = trace.seg_first_step, trace.seg_last_step
    x0 = trace.seg_start_tokens
    E = end[s1]
    t0 = start[s0]
    cs = np.concatenate([[0.0], np.cumsum(start)])
    token_s = x0 * (E - t0) + (s1 - s0) * E - (cs[s1 + 1] - cs[s0 + 1])
    b0 = -(-x0 // b)
    A = s0 - x0  # tokens during step s = s - A
    first_cross = A + b0 * b + 1  # the step that writes token b0 x b + 1 needs block b0 + 1
    m = np.where(first_cross <= s1, (s1 - first_cross) // b + 1, 0)
    # sum of start[first_cross + i*b] for i < m, from per-phase prefix sums of start times
    q_total = -(-len(start) // b) + 1
    padded = np.zeros(q_total * b)
    padded[: len(start)] = start
    c2 = np.concatenate([np.zeros((1, b)), np.cumsum(padded.reshape(q_total, b), axis=0)])
    fc = np.where(m > 0, first_cross, 0)
    phase, q0 = fc % b, fc // b
    ap_sum = np.where(m > 0, c2[q0 + m, phase] - c2[q0, phase], 0.0)
    block_s = b0 * (E - t0) + m * E - ap_sum
    return E - t0, token_s, block_s, b0 + m


def _percentiles(values, qs):
    import numpy as np

    v = values[np.isfinite(values)]
    if not len(v):
        return [None] * len(qs)
    return [float(x) for x in np.percentile(v, qs)]


def _summarise(
    b,
    config,
    pools,
    n_req,
    never,
    arrival,
    out_eff,
    intervals,
    steps,
    segs,
    first_admit,
    ttft_at,
    done_at,
    preempt_count,
    preemptions,
    completed,
    total_blocks,
    peak_all,
):
    import numpy as np

    iv = np.array(intervals, dtype=np.float64).reshape(-1, 6)
    first, k = iv[:, 0].astype(np.int64), iv[:, 2].astype(np.int64)
    start, end = _step_times(first, iv[:, 1], k, iv[:, 3], iv[:, 4], steps)
    seg_info, seg_s1, seg_pre, pool_l = segs
    info = np.array(seg_info, dtype=np.int64).reshape(-1, 6)
    done = np.asarray(done_at)
    trace = ServeTrace(
        block_size=b,
        step_start_s=start,
        step_end_s=end,
        seg_request=info[:, 0],
        seg_first_step=info[:, 1],
        seg_last_step=np.asarray(seg_s1, dtype=np.int64),
        seg_start_tokens=info[:, 2],
        seg_shared_blocks=info[:, 3],
        seg_shared_new=info[:, 4],
        seg_preempted=np.asarray(seg_pre, dtype=bool),
        seg_pool=np.asarray(pool_l, dtype=np.int64)[info[:, 0]],
        arrival_s=arrival,
        never_fit=never,
        completion_s=done,
        first_token_s=np.asarray(ttft_at),
        timeline_s=iv[:, 1],
        timeline_blocks=iv[:, 5].astype(np.int64),
    )
    held_s, token_s, block_s, _ = segment_integrals(trace)
    # Physical pool: a shared prefix block is stored once.  Subtract each segment's shared blocks and add the
    # pool's shared blocks over time (piecewise constant between events; reconstructed from the segments).
    shared = trace.seg_shared_blocks
    phys_block_s = float(block_s.sum() - (shared * held_s).sum())
    phys_token_s = float(token_s.sum() - (shared * b * held_s).sum())
    if shared.any():
        extra = _shared_pool_block_seconds(trace, len(pools))
        phys_block_s += extra
        phys_token_s += extra * b
    arrival_min = float(arrival[~never].min()) if (~never).any() else 0.0
    last_done = float(np.nanmax(done)) if np.isfinite(done).any() else arrival_min
    span = last_done - arrival_min
    arrival_all = arrival
    queue = np.asarray(first_admit) - arrival_all
    ttft = np.asarray(ttft_at) - arrival_all
    q50, q99 = _percentiles(queue, [50, 99])
    t50, t99 = _percentiles(ttft, [50, 99])
    finished = np.isfinite(done)
    out_done = float(np.asarray(out_eff)[finished].sum())
    busy = float((end - start).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_eff > 1, (done - np.asarray(ttft_at)) / (out_eff - 1), np.nan)
    tp50, tp99 = _percentiles(tpot, [50, 99])
    pool_results = []
    pool_arr = np.asarray(pool_l)
    for i, p in enumerate(pools):
        pt50, pt99 = _percentiles(ttft[pool_arr == i], [50, 99])
        pool_results.append(PoolResult(p.name, p.cap, p.requests, p.never_fit, p.peak, p.preemptions, pt50, pt99))
    result = ServeResult(
        block_size=b,
        pool_tokens=config.pool_tokens,
        pool_blocks=total_blocks,
        requests=n_req,
        completed=int(completed),
        never_fit=int(never.sum()),
        peak_blocks=int(peak_all),
        mean_blocks=phys_block_s / span if span > 0 else float("nan"),
        utilization=phys_token_s / (b * phys_block_s) if phys_block_s > 0 else float("nan"),
        preemptions=int(preemptions),
        preempted_requests=int(sum(1 for c in preempt_count if c)),
        queue_delay_p50_s=q50,
        queue_delay_p99_s=q99,
        ttft_p50_s=t50,
        ttft_p99_s=t99,
        span_s=span,
        steps=int(len(start)),
        busy_s=busy,
        throughput_tokens_per_s=out_done / span if span > 0 else float("nan"),
        requests_per_s=completed / span if span > 0 else float("nan"),
        tpot_p50_s=tp50,
        tpot_p99_s=tp99,
        pools=pool_results,
    )
    return result, trace


def _shared_pool_block_seconds(trace: ServeTrace, n_pools: int) -> float:
    """Integral of the physical shared-prefix blocks over time.

    A pool stores its shared prefix blocks once: at any time it holds as many as the running segment that shares
    the most.  Level by level (sorted distinct shared-block counts), that is the union length of the segments
    sharing at least that level, times the level's increment.
    """
    import numpy as np

    total = 0.0
    t_in_all = trace.step_start_s[trace.seg_first_step]
    t_out_all = trace.step_end_s[trace.seg_last_step]
    for pi in range(n_pools):
        sel = (trace.seg_pool == pi) & (trace.seg_shared_blocks > 0)
        sh = trace.seg_shared_blocks[sel]
        below = 0
        for level in np.unique(sh):
            at_least = sh >= level
            total += _union_length(t_in_all[sel][at_least], t_out_all[sel][at_least]) * float(level - below)
            below = level
    return total


def _union_length(starts, ends) -> float:
    """Total length of the union of intervals [start, end)."""
    import numpy as np

    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new_group = np.flatnonzero(s[1:] > run_end[:-1]) + 1  # a gap before these intervals
    first = np.concatenate([[0], new_group])
    last = np.concatenate([new_group - 1, [len(s) - 1]])
    return float((run_end[last] - s[first]).sum())
