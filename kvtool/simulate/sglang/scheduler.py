"""SGLang's scheduler over its radix cache, step by step: the engine model of `kvtool simulate --engine sglang`.

Modelled on sglang 0.5.23 (``python/sglang/srt/``) for a full-attention model, no speculative decoding, no HiCache,
no mixed chunked prefill (its default).  Requests join the waiting queue at their arrival times (all at the start
without any); an idle engine waits for the next arrival.  The pool is counted in tokens (``max_total_num_tokens``), as SGLang's is.  One step is a prefill batch when
``PrefillAdder`` admits anything, else a decode batch (``Scheduler.get_next_batch_to_run``):

1. Prefill (``managers/schedule_policy.py: PrefillAdder``).  The waiting queue is ordered by the policy (``fcfs``;
   ``lpm``: longest radix-cache prefix first, ``SchedulePolicy.calc_priority``, falling back to FCFS past 128 waiting
   requests).  The memory budget (``mem_cache/prefill_budget.py: PrefillBudget``) is free + evictable tokens minus,
   for every running request, ``min(max_new - decoded, CLIP_MAX_NEW_TOKENS) * new_token_ratio``.  A request is
   admitted while ``extend + min(max_new, CLIP_MAX_NEW_TOKENS) < remaining_total`` (``check_prefill``), fewer than
   ``max_running_requests`` run, and the prefill token budget (``max_prefill_tokens``) and chunk budget
   (``chunked_prefill_size``) last; a prompt longer than the chunk budget left is cut to whole pages of it
   (one chunked request at a time, continued first in later steps).  Admission reserves
   ``ceil_page(extend) + page_size + max_new`` (``PrefillBudget.reserve``; 0 for max_new of a chunk).  The prefix is
   the radix match at the page size (locked), the extend is allocated, evicting LRU leaves when the pool is short.
2. Decode: every running request appends one token; if the pool (free + evictable) cannot take one token per request,
   requests are retracted (``ScheduleBatch.retract_decode``: order by (decoded, -prompt) and pop the last, until it
   fits; their KV is freed, they go back to the waiting queue and start over with their prefix hits) and
   ``new_token_ratio`` becomes ``min(1, (decoded + 20 * n) / (sum max_new + 1))``
   (``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``, SGLANG_RETRACT_DECODE_STEPS = 20); otherwise
   the ratio decays by ``(init - min) / 600`` per decode step to ``min = 0.14 * init``, ``init = 0.7``
   (``environ.py``: SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
   SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS).
3. A finished request inserts its page-aligned prompt + output into the tree (``RadixCache.cache_finished_req``:
   duplicates freed, the partial last page freed) and unlocks its prefix; a chunk's computed tokens are inserted
   and the lock moved to them (``checkpoint``) so the next chunk matches them.

Step times (with a ``cost``): each step is costed by the roofline of `kvtool simulate --serve`
(:class:`kvtool.simulate.costs.RooflineCost`, the one model both engines use) over what SGLang puts in that batch.
A prefill batch holds only the admitted requests' chunks (the running requests wait: no mixed chunk): ``tokens`` the
chunks' tokens, ``entries`` their pages (prefix + chunk, whole pages), ``pairs`` each chunk's attended query-key
pairs (:func:`kvtool.simulate.costs.attended_pairs`).  A decode batch holds every running request: one token each,
``entries`` the pages of each sequence, ``pairs`` each sequence's length.  A request's first token is out at the end
of the prefill step that finishes its prompt; it finishes at the end of the step that produced its last token.
Without a cost every step takes no time (the step and token counts are the same).

Not modelled: SGLang's overlap scheduler (the CPU scheduling of step n+1 runs while the GPU runs step n: a real
engine hides part of the fixed per-step time that the cost charges every step), CUDA graphs (decode launches;
their effect is whatever the fixed step time stands for, the same as for vLLM), the eviction policies other than
LRU, priorities, HiCache tiers, the extra page SGLang's paged allocator may take per request beyond the
reservation.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtool.simulate.costs import attended_pairs
from kvtool.simulate.sglang.radix_cache import Node, RadixCache

if TYPE_CHECKING:
    from kvtool.simulate.scheduler import StepCost

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
LPM_FALLBACK_QUEUE = 128  # schedule_policy.py: LPM becomes FCFS past this many waiting requests
POLICIES = ("fcfs", "lpm")


@dataclasses.dataclass(frozen=True)
class SglangConfig:
    pool_tokens: int  # max_total_num_tokens: the KV pool in tokens
    page_size: int = 1  # --page-size (SGLang's default 1)
    max_running_requests: int = 256  # --max-running-requests
    chunked_prefill_size: int | None = 8192  # --chunked-prefill-size (None: chunking off); GPU-dependent default
    max_prefill_tokens: int = 16384  # --max-prefill-tokens
    schedule_policy: str = "fcfs"  # --schedule-policy: fcfs or lpm


@dataclasses.dataclass(frozen=True)
class SglangResult:
    """One run of the SGLang model over a list of requests."""

    page_size: int
    pool_tokens: int
    requests: int
    finished_requests: int
    steps: int  # engine steps (prefill batches + decode batches)
    prefill_steps: int
    prompt_tokens: int  # sum of prompt lengths (each admission counts once, retractions included)
    cached_prompt_tokens: int  # of those, matched in the radix cache at admission
    cache_hit_fraction: float | None  # cached / prompt tokens
    computed_prompt_tokens: int  # prompt tokens prefilled (recomputation after retraction included)
    evicted_tokens: int  # tokens evicted from the radix cache
    retractions: int  # requests retracted under decode memory pressure
    peak_used_tokens: int  # most pool tokens in use at once (requests' KV + the tree)
    final_tree_tokens: int  # tokens cached in the tree at the end
    # the radix hit at each request's first admission, summed (vLLM's num_cached_tokens counts the same), and its
    # share of the prompt tokens of the requests admitted (each once): the figure the side-by-side table compares
    first_cached_prompt_tokens: int = 0
    prefix_hit_rate: float | None = None
    retracted_requests: int = 0  # requests retracted at least once
    # with a step-time model (None without one): as vLLM's ServeResult (kvtool.simulate.serving.Latencies)
    queue_delay_p50_s: float | None = None
    queue_delay_p99_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    span_s: float | None = None  # first arrival to last completion
    busy_s: float | None = None  # time spent in steps
    throughput_tokens_per_s: float | None = None  # output tokens / span
    requests_per_s: float | None = None


@dataclasses.dataclass
class _Req:
    index: int
    prompt: tuple[int, ...]
    max_new: int
    arrival_s: float = 0.0
    output: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0  # prompt tokens whose KV exists (prefix hit + prefilled)
    protected: int = 0  # leading tokens held by the tree under this request's lock
    owned: int = 0  # pool tokens charged to this request, not in the tree
    node: Node | None = None

    @property
    def seq(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.output)


class SglangEngine:
    """The state of one run: tree, queues, pool accounting and counters (see the module docstring)."""

    def __init__(self, config: SglangConfig, cost: StepCost | None = None):
        if config.schedule_policy not in POLICIES:
            raise ValueError(f"schedule_policy must be one of {POLICIES}")
        self.c = config
        self.tree = RadixCache(config.page_size)
        self.ratio_init = min(INIT_NEW_TOKEN_RATIO, 1.0)
        self.ratio_min = min(self.ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.ratio_init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = self.ratio_init
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.chunked: _Req | None = None
        self.steps = self.prefill_steps = 0
        self.prompt_tokens = self.cached_tokens = self.computed_tokens = 0
        self.evicted = self.retractions = self.peak = 0
        self.finished = 0
        self.owned_tokens = 0  # pool tokens held by requests outside the tree (sum of _Req.owned)
        self._unique = -1  # output tokens: unique negative ids (never shared between requests)
        self.cost = cost
        self.now = 0.0  # seconds (stays 0 without a cost)
        self.busy_s = 0.0
        self.first_hit: list[int] = []  # per request: the radix hit at its first admission (-1: not yet admitted)
        self.admit_s: list[float] = []  # per request: start of the step of its first admission (nan: never)
        self.first_token_s: list[float] = []  # end of the step that produced its first output token
        self.finish_s: list[float] = []
        self.retracted: set[int] = set()

    # --- pool -------------------------------------------------------------------------------------------------
    def used(self) -> int:
        return self.tree.size + self.owned_tokens

    def available(self) -> int:
        return self.c.pool_tokens - self.used()

    def _alloc(self, req: _Req, tokens: int) -> None:
        short = tokens - self.available()
        if short > 0:
            self.evicted += self.tree.evict(short)[0]
        req.owned += tokens
        self.owned_tokens += tokens
        self.peak = max(self.peak, self.used())

    def _cache(self, req: _Req, tokens: tuple[int, ...], finished: bool) -> None:
        """cache_finished_req / checkpoint: insert the page-aligned ``tokens``, free what the tree already had."""
        aligned = len(tokens) // self.c.page_size * self.c.page_size
        already, node = self.tree.insert(tokens[:aligned])
        req.owned -= aligned - req.protected  # now the tree's, or duplicates freed
        self.owned_tokens -= aligned - req.protected
        self.tree.dec_lock_ref(req.node)
        if finished:
            self.owned_tokens -= req.owned  # the partial last page
            req.owned, req.protected, req.node = 0, 0, None
            return
        req.node, req.protected = node, aligned
        self.tree.inc_lock_ref(node)

    # --- phases -----------------------------------------------------------------------------------------------
    def _reserved(self) -> float:
        return sum(min(r.max_new - len(r.output), CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)

    def _prefill(self) -> bool:
        c = self.c
        remaining_total = self.available() + self.tree.evictable_size - self._reserved()
        rem_input = c.max_prefill_tokens
        rem_chunk = c.chunked_prefill_size
        admitted: list[_Req] = []
        batch = _Batch()
        queue = list(self.waiting)
        if self.chunked is not None:
            queue.insert(0, self.chunked)
        elif c.schedule_policy == "lpm" and len(queue) <= LPM_FALLBACK_QUEUE:
            queue.sort(key=lambda r: -self.tree.match_prefix(r.prompt[:-1])[0])
        for req in queue:
            if len(self.running) + len(admitted) >= c.max_running_requests:
                break
            if remaining_total <= 0 or rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
            continuing = req is self.chunked
            if not continuing:
                hit, node = self.tree.match_prefix(req.prompt[:-1])  # _compute_max_prefix_len: input_len - 1
            else:
                assert req.node is not None  # a chunked request keeps its lock on the tree
                hit, node = req.computed, req.node
            extend = len(req.prompt) - hit
            max_new = min(req.max_new, CLIP_MAX_NEW_TOKENS)
            if extend + max_new >= remaining_total:
                break  # AddReqResult.NO_TOKEN
            paged = -(-extend // c.page_size) * c.page_size
            chunk = extend
            if rem_chunk is not None and paged > rem_chunk:
                end = (hit + rem_chunk // c.page_size * c.page_size) // c.page_size * c.page_size
                chunk = end - hit
                if chunk <= 0:
                    break
                max_new = 0
            if not continuing:
                self.waiting.remove(req)
                req.node, req.protected, req.computed = node, hit, hit
                self.tree.inc_lock_ref(node)
                self.prompt_tokens += len(req.prompt)
                self.cached_tokens += hit
                if self.first_hit[req.index] < 0:
                    self.first_hit[req.index] = hit
                    self.admit_s[req.index] = self.now
            paged_chunk = -(-chunk // c.page_size) * c.page_size
            remaining_total -= paged_chunk + c.page_size + max_new
            rem_input -= paged_chunk
            if rem_chunk is not None:
                rem_chunk -= paged_chunk
            self._alloc(req, chunk)
            batch.add(req.computed, chunk, c.page_size)
            req.computed += chunk
            self.computed_tokens += chunk
            admitted.append(req)
            if req.computed < len(req.prompt):
                self.chunked = req
                break
        if not admitted:
            return False
        self._run_step(batch, len(admitted))
        for req in admitted:
            if req.computed < len(req.prompt):
                self._cache(req, req.prompt[: req.computed], finished=False)
                continue
            if req is self.chunked:
                self.chunked = None
            if math.isnan(self.first_token_s[req.index]):
                self.first_token_s[req.index] = self.now
            req.output.append(self._next_token())  # the prefill samples the first output token
            self._alloc(req, 1)
            self.running.append(req)
        self._finish_done()
        self.prefill_steps += 1
        return True

    def _decode(self) -> None:
        need = len(self.running)
        if self.available() + self.tree.evictable_size < need:
            order = sorted(self.running, key=lambda r: (len(r.output), -len(r.prompt)), reverse=True)
            retracted = []
            while len(order) > 1 and self.available() + self.tree.evictable_size < len(order):
                req = order.pop()
                self.running.remove(req)
                self.tree.dec_lock_ref(req.node)
                self.owned_tokens -= req.owned
                req.owned = req.protected = req.computed = 0
                req.node, req.output = None, []
                retracted.append(req)
            self.retractions += len(retracted)
            self.retracted.update(r.index for r in retracted)
            reqs = order + retracted
            decoded = sum(len(r.output) for r in reqs)
            self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(reqs)) / (sum(r.max_new for r in reqs) + 1))
            self.waiting.extend(retracted)
        else:
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        batch = _Batch()
        page = self.c.page_size
        for req in self.running:
            batch.add(len(req.prompt) + len(req.output) - 1, 1, page)  # the last sampled token is fed
        self._run_step(batch, len(self.running))
        self._alloc_decode()
        for req in self.running:
            req.output.append(self._next_token())
            req.owned += 1
        self._finish_done()

    def _alloc_decode(self) -> None:
        """One token for every running request: what ``_alloc(req, 1)`` request by request does, at once.  The
        evictions are the same (each call pops LRU leaves until its shortfall is covered, and the next calls use
        what is left: one call for the whole shortfall pops the same leaves), and so is the peak: a pool short of
        room fills up to the last token before the first eviction."""
        need = len(self.running)
        available = self.available()
        if need > available:
            if available > 0:
                self.peak = max(self.peak, self.c.pool_tokens)
            self.evicted += self.tree.evict(need - available)[0]
        self.owned_tokens += need
        self.peak = max(self.peak, self.used())

    def _run_step(self, batch: _Batch, requests: int) -> None:
        """The step's time by the cost model (none without one): the clock moves to the step's end."""
        if self.cost is None:
            return
        dt = self.cost.time_s(batch.tokens, requests, batch.entries, batch.pairs)
        self.now += dt
        self.busy_s += dt

    def _finish_done(self) -> None:
        keep = []
        for req in self.running:
            if len(req.output) >= req.max_new:
                self._cache(req, req.seq, finished=True)
                self.finished += 1
                self.finish_s[req.index] = self.now
            else:
                keep.append(req)
        self.running = keep

    def _next_token(self) -> int:
        self._unique -= 1
        return self._unique

    def run(
        self, prompts: Sequence[Sequence[int]], max_new: Sequence[int], arrival_s: Sequence[float] | None = None
    ) -> SglangResult:
        n = len(prompts)
        arrivals = [0.0] * n if arrival_s is None else [float(a) for a in arrival_s]
        reqs = []
        for i, (p, m) in enumerate(zip(prompts, max_new)):
            if len(p) + m > self.c.pool_tokens:
                raise ValueError(
                    f"request {i + 1} needs {len(p) + m:,} tokens, more than the pool's {self.c.pool_tokens:,}"
                )
            reqs.append(_Req(i, tuple(p), max(int(m), 1), arrivals[i]))
        self.first_hit = [-1] * n
        self.admit_s = [math.nan] * n
        self.first_token_s = [math.nan] * n
        self.finish_s = [math.nan] * n
        pending = deque(sorted(reqs, key=lambda r: r.arrival_s))  # stable: equal arrivals keep the trace's order
        while pending or self.waiting or self.running or self.chunked:
            while pending and pending[0].arrival_s <= self.now:
                self.waiting.append(pending.popleft())
            if not (self.waiting or self.running or self.chunked):
                self.now = pending[0].arrival_s  # idle until the next arrival
                continue
            self.steps += 1
            if not self._prefill():
                if not self.running:
                    raise ValueError("no request can be admitted into an empty engine (pool too small)")
                self._decode()
        admitted_prompt = sum(len(r.prompt) for r in reqs if self.first_hit[r.index] >= 0)
        first_cached = sum(h for h in self.first_hit if h > 0)
        return dataclasses.replace(
            self._result(n),
            first_cached_prompt_tokens=first_cached,
            prefix_hit_rate=first_cached / admitted_prompt if admitted_prompt else None,
            retracted_requests=len(self.retracted),
            **(self._latencies(arrivals, [r.max_new for r in reqs]) if self.cost is not None else {}),
        )

    def _latencies(self, arrivals: list[float], max_new: list[int]) -> dict:
        """The time figures, summarised as vLLM's simulation summarises its own (one summary for both)."""
        import numpy as np

        from kvtool.simulate.serving import request_latencies

        admit = np.array(self.admit_s)
        lat = request_latencies(
            np.array(arrivals),
            admit,
            np.array(self.first_token_s),
            np.array(self.finish_s),
            np.array(max_new, dtype=np.int64),
            np.isfinite(admit),
        )
        return {
            "queue_delay_p50_s": lat.queue_delay_p50_s,
            "queue_delay_p99_s": lat.queue_delay_p99_s,
            "ttft_p50_s": lat.ttft_p50_s,
            "ttft_p99_s": lat.ttft_p99_s,
            "tpot_p50_s": lat.tpot_p50_s,
            "tpot_p99_s": lat.tpot_p99_s,
            "span_s": lat.span_s,
            "busy_s": self.busy_s,
            "throughput_tokens_per_s": lat.throughput_tokens_per_s,
            "requests_per_s": lat.requests_per_s,
        }

    def _result(self, n: int) -> SglangResult:
        return SglangResult(
            page_size=self.c.page_size,
            pool_tokens=self.c.pool_tokens,
            requests=n,
            finished_requests=self.finished,
            steps=self.steps,
            prefill_steps=self.prefill_steps,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_tokens,
            cache_hit_fraction=self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
            computed_prompt_tokens=self.computed_tokens,
            evicted_tokens=self.evicted,
            retractions=self.retractions,
            peak_used_tokens=self.peak,
            final_tree_tokens=self.tree.total_size(),
        )


class _Batch:
    """What one step computes, for the cost model: tokens, pages in the batch's tables, attended query-key pairs."""

    __slots__ = ("tokens", "entries", "pairs")

    def __init__(self) -> None:
        self.tokens = 0
        self.entries = 0
        self.pairs = 0.0

    def add(self, computed: int, new: int, page_size: int) -> None:
        """One request's ``new`` tokens after ``computed`` ones whose KV exists."""
        self.tokens += new
        self.entries += -(-(computed + new) // page_size)
        self.pairs += attended_pairs(computed, new)


def simulate_sglang(
    prompts: Sequence[Sequence[int]],
    max_new: Sequence[int],
    config: SglangConfig,
    arrival_s: Sequence[float] | None = None,
    cost: StepCost | None = None,
) -> SglangResult:
    """Run SGLang's scheduler model over token-id prompts (see the module docstring); ``arrival_s`` per request
    (None: all at 0), ``cost`` the step-time model (None: steps take no time, no time figures)."""
    return SglangEngine(config, cost).run(prompts, max_new, arrival_s)
