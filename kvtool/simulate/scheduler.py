"""vLLM V1's scheduler, step by step: the engine model behind `kvtool simulate --serve`.

Modelled on vllm 0.32.0, ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule`` and ``update_from_output``, the
synchronous scheduler; async scheduling off), ``kv_cache_manager.py`` (``get_computed_blocks``, ``allocate_slots``)
and ``block_pool.py`` (see :mod:`kvtool.simulate.prefix_cache`), for a full-attention model without speculative
decoding, KV connectors or LoRA, FCFS policy.  One engine step:

1. Running requests first, in admission order, while the token budget (``max_num_batched_tokens``) lasts: each is
   given ``num_tokens - num_computed_tokens`` tokens (1 for a decode, the rest of the prompt for a prefill), capped by
   ``long_prefill_token_threshold`` (only when more than one request is running or waiting) and the budget left.
   ``allocate_slots`` needs ``ceil((computed + new) / block_size)`` blocks; when the free queue is short, the last
   request of the running list is preempted (all its blocks freed, ``num_computed_tokens`` reset to 0, put at the
   front of the waiting queue; it is recomputed, with prefix hits, when resumed) until the allocation fits, or the
   request itself was the one preempted, which ends the running phase.
2. Waiting requests next, only if nothing was preempted in this step, FCFS, while the budget lasts and fewer than
   ``max_num_seqs`` requests run: the prefix-cache lookup gives the hit (whole cached blocks, at most
   ``num_tokens - 1`` tokens); admission needs room for the whole sequence (``scheduler_reserve_full_isl``, vLLM's
   default) and for the first chunk, counting cached free blocks that the hit takes out of the free queue; the first
   waiting request that does not fit stops admissions.  ``num_cached_tokens`` is the hit of the first admission.
3. The step runs; every request whose scheduled tokens reach its end samples one token; a request with
   ``max_tokens`` outputs finishes and frees its blocks (tail first) at the end of the step.

Full blocks are cached as soon as their tokens are scheduled (prompt and generated tokens alike; generated tokens
are taken as unique to their request).

Speed (the fast path, :mod:`kvtool.simulate.decode_group`; ``EngineConfig(fast_path=False)`` runs the plain loop
above, request by request, and the tests hold the two equal on random workloads): running requests past their
prompt form a group advanced by a tick, their own counters brought up to date only when they finish or when a step
needs the plain loop (a prefill chunk, a preemption).  A step where the group decodes and requests may be admitted
counts the group's decodes (blocks opened, attention pairs) instead of walking them.  When every running request
decodes, the budget covers them all and no waiting request can be admitted (none waiting, ``max_num_seqs`` reached,
or the head of the queue cannot fit: the free queue only shrinks until a request finishes), the loop jumps to the
step before the first completion, block shortage or arrival, allocating the blocks opened meanwhile in bulk, with
the time and integrals in closed form when the steps are memory-bound (step by step otherwise).
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import NamedTuple, Protocol

from kvtool.events.load import ALLOCATE, APPEND, FREE, REUSE
from kvtool.simulate.costs import attended_pairs
from kvtool.simulate.decode_group import DecodeGroup, DecodeSpan, decode_span
from kvtool.simulate.offload_tier import CpuTier, own_key
from kvtool.simulate.prefix_cache import BlockKeys, BlockPool, Run

# The engine's own defaults when a test builds one directly.  The commands never rely on them: they take vllm serve's
# figures for the GPU from kvtool.estimate.serve_defaults (1024 and 8192 on an H100, 256 and 2048 on an A100).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
_NO_COST = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
_NEVER = float("inf")  # no arrival ends the jump  # decode coefficients without a cost model: steps take no time


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The scheduler and cache settings of one simulated vLLM engine."""

    num_blocks: int  # the whole pool, null block included (vLLM's num_gpu_blocks)
    block_size: int
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_token_threshold: int = 0  # 0: off (vLLM's default)
    max_model_len: int = 1 << 40
    enable_prefix_caching: bool = True
    max_jump_steps: int = 1 << 30  # longest decode jump
    # False: every step through the plain loop, request by request (the reference the fast path is tested against)
    fast_path: bool = True
    # The model's KV-cache groups (kvtool.simulate.kv_groups.GroupSpec) when it has more than one or its one group is
    # not full attention (sliding window, chunked local): run by kvtool.simulate.grouped.GroupedEngine.  Empty: one
    # full-attention group, this module's engine.
    kv_groups: tuple = ()


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What the prefix cache needs to know of a prompt: its length and which of its leading tokens may be shared.

    ``shared`` is either the prompt's token ids (all of them may match other prompts) or pieces ``(piece_id,
    tokens)`` covering a prefix of the prompt (equal ids = equal tokens; a Mooncake hash id, a system prompt); tokens
    past the pieces are private to the request.
    """

    tokens: int
    shared: Sequence[int] | Sequence[tuple[object, int]] = ()
    kind: str = "pieces"  # "tokens" or "pieces"


def shared_block_contents(prompt: Prompt, block_size: int) -> list[object]:
    """The content of each full prompt block that lies inside the shareable part (what the chained key hashes)."""
    b = block_size
    if prompt.kind == "tokens":
        ids = list(prompt.shared)  # type: ignore[arg-type]
        return [tuple(ids[i : i + b]) for i in range(0, len(ids) - b + 1, b)]
    out: list[object] = []
    cur: list[tuple[object, int, int]] = []
    filled = 0
    for piece_id, length in prompt.shared:  # type: ignore[misc]
        offset = 0
        while offset < length:
            take = min(b - filled, length - offset)
            cur.append((piece_id, offset, offset + take))
            offset += take
            filled += take
            if filled == b:
                out.append(tuple(cur))
                cur = []
                filled = 0
    return out


@dataclasses.dataclass
class EngineRun:
    """What one run recorded, per request and per step (lists; ``-1`` where a request never reached that point)."""

    num_cached_tokens: list[int]  # prefix-cache hit at the first admission
    num_preemptions: list[int]
    first_token_step: list[int]  # 1-based engine step whose output was the first token
    finish_step: list[int]  # 1-based engine step whose output finished the request
    admit_step: list[int]  # first admission
    admit_s: list[float]  # start of the first admission's step (nan if never)
    first_token_s: list[float]  # end of the step that produced the first token
    finish_s: list[float]  # end of the finishing step
    steps: int  # engine steps run
    busy_s: float  # time spent in steps
    # Start and end time of every step (1-based step s is [step_start_s[s - 1], step_end_s[s - 1]]): only with
    # record_events (the export needs them), else empty.
    step_start_s: list[float]
    step_end_s: list[float]
    timeline_s: list[float]  # times at which the blocks in use were sampled (each exact step and jump start)
    timeline_blocks: list[int]  # blocks held by requests at those steps (shared blocks once)
    block_seconds: float  # integral of blocks in use over time (shared blocks once)
    entry_seconds: float  # integral of block-table entries over time (shared blocks once per request)
    token_seconds: float  # integral of tokens held (computed KV) over time
    peak_blocks: int
    preemptions: int
    evictions: int  # cached blocks reused for new data (counted by the pool, filled in when the run ends)
    hit_tokens: int  # prefix-cache hits over all admissions (resumptions too)
    queried_tokens: int  # tokens looked up at admissions
    free_blocks_at_end: int = -1  # the free queue when the run ended (all blocks back when every request finished)
    # With record_events: rows (step, event code, request, blocks, tokens, at the step's end) and decode jumps
    # (first step, steps, requests, their computed tokens before the jump); see kvtool.simulate.export.
    event_rows: list[tuple[int, int, int, int, int, int]] | None = None
    event_jumps: list[tuple[int, int, list[int], list[int]]] | None = None
    # With a CPU tier (kvtool.simulate.offload_tier): per request the CPU hit at the first admission (tokens, part of
    # num_cached_tokens as vLLM's prefill_stats counts it), and the CPU hits over all admissions
    num_external_cached_tokens: list[int] | None = None
    cpu_hit_tokens: int = 0
    # With several KV-cache groups: per group, the prefix hit (tokens) that group alone found at each request's first
    # admission, summed (before the coordinator cut it to what every group agrees on, num_cached_tokens)
    group_hit_tokens: list[int] | None = None


class _DecodeRates(NamedTuple):
    """A decode step's cost for one batch size: the cost's coefficients (StepCost.decode_coefficients), and a
    memory-bound step as (seconds, seconds per block-table entry)."""

    coefficients: tuple[float, float, float, float, float, float]
    rate: tuple[float, float]


class StepCost(Protocol):
    """The step-time model: seconds for a step that schedules ``tokens`` tokens of ``requests`` requests whose block
    tables hold ``entries`` blocks in all, attending ``pairs`` query-key pairs (:mod:`kvtool.simulate.costs`)."""

    def time_s(self, tokens: int, requests: int, entries: int, pairs: float) -> float: ...

    def decode_coefficients(self, requests: int) -> tuple[float, float, float, float, float, float]:
        """A step of ``requests`` decodes as fixed + max(memory + read x entries, compute + per_pair x pairs) +
        kernel x entries: (fixed, memory, read, kernel, compute, per_pair), in seconds (the decode jumps' fast path;
        it must agree with time_s)."""
        ...


class Engine:
    """One vLLM engine: the scheduler's queues, the requests' state and the block pool."""

    def __init__(
        self,
        config: EngineConfig,
        prompts: Sequence[Prompt],
        max_tokens: Sequence[int],
        cost: StepCost | None = None,
        keys: BlockKeys | None = None,
        record_events: bool = False,
        tier: CpuTier | None = None,
    ):
        n = len(prompts)
        nan = float("nan")
        self.cfg = config
        self.b = config.block_size
        self.prompts = prompts
        self.P = [p.tokens for p in prompts]
        out = list(map(int, max_tokens))
        self.out = out if not out or min(out) >= 1 else [o if o > 1 else 1 for o in out]  # at least one token
        self.cost = cost
        self.keys = keys or BlockKeys()
        self.pool = BlockPool(config.num_blocks)
        self.c = [0] * n  # num_computed_tokens
        self.g = [0] * n  # output tokens so far
        self.blocks: list[list[int]] = [[] for _ in range(n)]  # shareable blocks' ids (the first indices)
        self.npriv = [0] * n  # private blocks after them (counted only; prefix_cache.py)
        self.ncached = [0] * n  # blocks of the request that carry their hash (the first indices)
        # keys of the shareable full prompt blocks (computed at the first lookup; none for prompts sharing nothing)
        no_keys: list[int] = []
        self.skeys: list[list[int] | None] = [None if p.shared else no_keys for p in prompts]
        self.running: list[int] = []
        self.waiting: collections.deque[int] = collections.deque()
        self.prefilling: set[int] = set()  # running requests still short of their last token
        self.head_blocked = False  # the waiting head cannot fit until blocks are freed
        self.step = 0
        self.now = 0.0
        self.run = EngineRun(
            num_cached_tokens=[-1] * n,
            num_preemptions=[0] * n,
            first_token_step=[-1] * n,
            finish_step=[-1] * n,
            admit_step=[-1] * n,
            admit_s=[nan] * n,
            first_token_s=[nan] * n,
            finish_s=[nan] * n,
            steps=0,
            busy_s=0.0,
            step_start_s=[],
            step_end_s=[],
            timeline_s=[],
            timeline_blocks=[],
            block_seconds=0.0,
            entry_seconds=0.0,
            token_seconds=0.0,
            peak_blocks=0,
            preemptions=0,
            evictions=0,
            hit_tokens=0,
            queried_tokens=0,
            event_rows=[] if record_events else None,
            event_jumps=[] if record_events else None,
        )
        self.rows = self.run.event_rows
        self.finished = 0
        self.first_now: list[int] = []
        self._piece_keys: dict[tuple, list[int]] = {}  # requests whose first token comes out of the step being run
        self.used = 0  # blocks referenced by running requests (shared ones once)
        self.entries = 0  # block-table entries of running requests (shared blocks once per request)
        self.tokens_held = 0  # computed tokens of running requests
        # Running requests past their prompt, advanced together (their c, g, npriv, ncached lag behind; _sync).
        self.group = DecodeGroup(self.b)
        self._decode_rates: dict[int, _DecodeRates] = {}
        self.order = [0] * n  # place in the running list: admission count at the request's last admission
        self.admissions = 0
        self.tier = tier  # the CPU tier of the offloading connector, a second level behind the pool
        if tier is not None:
            self.run.num_external_cached_tokens = [-1] * n
        self.progress: Callable[[int], None] | None = None  # called with the finished count every 2,000 finishes
        self.done_reported = 0

    def add_request(self, prompt: Prompt, max_tokens: int, shared_keys: list[int] | None = None) -> int:
        """One more request known to the engine (a fleet's router hands requests over one by one): its state at
        the end of the per-request lists; ``shared_keys`` its shareable blocks' keys when the caller computed them
        already (:meth:`shared_keys`' result, with this engine's ``keys``).  Returns its index; the caller queues it
        (``waiting.append``).  Not with a CPU tier or several KV-cache groups."""
        r = len(self.P)
        if not isinstance(self.prompts, list):
            self.prompts = list(self.prompts)
        self.prompts.append(prompt)
        self.P.append(prompt.tokens)
        self.out.append(max_tokens if max_tokens >= 1 else 1)
        self.c.append(0)
        self.g.append(0)
        self.blocks.append([])
        self.npriv.append(0)
        self.ncached.append(0)
        if not prompt.shared:
            self.skeys.append([])
        elif shared_keys is not None and self.cfg.enable_prefix_caching:
            self.skeys.append(shared_keys)
        else:
            self.skeys.append(None)
        self.order.append(0)
        run = self.run
        run.num_cached_tokens.append(-1)
        run.num_preemptions.append(0)
        run.first_token_step.append(-1)
        run.finish_step.append(-1)
        run.admit_step.append(-1)
        nan = float("nan")
        run.admit_s.append(nan)
        run.first_token_s.append(nan)
        run.finish_s.append(nan)
        return r

    # ----------------------------------------------------------------- keys and blocks
    def shared_keys(self, r: int) -> list[int]:
        """Keys of the request's shareable full prompt blocks (computed once per request)."""
        sk = self.skeys[r]
        if sk is None:
            prompt = self.prompts[r]
            if not self.cfg.enable_prefix_caching:
                sk = []
            elif prompt.kind == "pieces":
                # Prompts built from the same pieces (a system prompt) share one key list.
                memo = tuple(prompt.shared)
                sk = self._piece_keys.get(memo)
                if sk is None:
                    sk = self._piece_keys[memo] = self.keys.chain(shared_block_contents(prompt, self.b))
            else:
                sk = self.keys.chain(shared_block_contents(prompt, self.b))
            self.skeys[r] = sk
        return sk

    def nblocks(self, r: int) -> int:
        return len(self.blocks[r]) + self.npriv[r]

    def fits_alone(self) -> list[bool]:
        """Per request: whether the engine ever takes it (:func:`_fits_alone`)."""
        return _fits_alone(self.cfg, self.P, self.out)

    def _allocate(self, r: int, m: int) -> None:
        """m new blocks at the request's next indices: ids for shareable ones, a count for private ones."""
        shareable = 0
        if not self.npriv[r]:
            sk = self.skeys[r]
            shareable = len(sk if sk is not None else self.shared_keys(r)) - len(self.blocks[r])
            if shareable > m:
                shareable = m
        if shareable > 0:
            self.pool.new_ids(shareable, self.blocks[r])
            m -= shareable
        if m:
            self.pool.consume(m)
            self.npriv[r] += m

    def _cache_full(self, r: int, tokens: int) -> None:
        """cache_full_blocks: the request's blocks full up to ``tokens`` get their keys."""
        if not self.cfg.enable_prefix_caching:
            return
        full = tokens // self.b
        done = self.ncached[r]
        if full > done:
            blocks = self.blocks[r]
            top = full if full < len(blocks) else len(blocks)
            if done < top:
                sk = self.shared_keys(r)
                for i in range(done, top):
                    self.pool.set_key(blocks[i], sk[i])
            self.ncached[r] = full

    def _lookup(self, r: int, num_tokens: int) -> tuple[list[int], list]:
        """get_computed_blocks: the longest run of cached blocks, at most num_tokens - 1 tokens (shareable ids, then
        the request's own cached private blocks)."""
        if not self.cfg.enable_prefix_caching:
            return [], []
        limit = (num_tokens - 1) // self.b
        sk = self.skeys[r]
        if sk is None:
            sk = self.shared_keys(r)
        if not sk and r not in self.pool.runs:  # nothing shareable and no blocks of its own cached
            return [], []
        hits: list[int] = []
        lookup = self.pool.lookup
        for i in range(min(limit, len(sk))):
            blk = lookup(sk[i])
            if blk < 0:
                return hits, []
            hits.append(blk)
        if len(hits) < len(sk) or limit <= len(sk):
            return hits, []
        return hits, self.pool.private_hits(r, len(sk), limit)

    def _tier_key(self, r: int):
        """The CPU tier's key of the request's prompt block i: its chained key, or its own for a private block."""
        sk = self.shared_keys(r)
        n = len(sk)
        return lambda i: sk[i] if i < n else own_key(r, i)

    def _cpu_hit(self, r: int, h: int) -> int:
        """get_num_new_matched_tokens: the tier's consecutive blocks after the GPU hit of ``h`` blocks (prompt
        blocks only are ever stored)."""
        return self.tier.hit(self._tier_key(r), h, self.P[r] // self.b)  # type: ignore[union-attr]

    def _offer_stores(self, scheduled: list[tuple[int, int]]) -> None:
        """build_connector_meta's stores, before the step's computed tokens advance: each scheduled request's full
        prompt blocks after the step, then the prompt blocks of the requests that finished in the last step."""
        tier, c, P, b = self.tier, self.c, self.P, self.b
        for r, n in scheduled:
            full = c[r] + n
            tier.offer(r, self._tier_key(r), (full if full < P[r] else P[r]) // b)  # type: ignore[union-attr]
        if tier.finished:  # type: ignore[union-attr]
            for r in tier.finished:  # type: ignore[union-attr]
                tier.finish(r, self._tier_key(r), P[r] // b)  # type: ignore[union-attr]
            tier.finished.clear()  # type: ignore[union-attr]

    def _release(self, r: int, finished: bool) -> None:
        blocks = self.blocks[r]
        p0 = len(blocks)
        total = p0 + self.npriv[r]
        hashed_end = self.ncached[r]
        if hashed_end > total:
            hashed_end = total
        if hashed_end < p0:
            hashed_end = p0
        freed = self.pool.free(r, blocks, p0, hashed_end, total - hashed_end, finished)
        self.used -= freed
        self.entries -= total
        self.tokens_held -= self.c[r]
        self.blocks[r] = []
        self.npriv[r] = 0
        self.ncached[r] = 0
        self.head_blocked = False

    def _preempt(self, r: int) -> None:
        if self.rows is not None:
            self.rows.append((self.step, FREE, r, self.nblocks(r), 0, 0))
        self._release(r, finished=False)
        self.prefilling.discard(r)
        self.c[r] = 0
        self.run.num_preemptions[r] += 1
        self.run.preemptions += 1
        self.waiting.appendleft(r)

    # ----------------------------------------------------------------- one exact step
    def _schedule_running(self, budget: int, lpt: int, scheduled: list[tuple[int, int]]) -> tuple[int, bool]:
        """Phase 1 of schedule(): the running requests.  Returns the budget left and whether anything was preempted."""
        running = self.running
        pool = self.pool
        b = self.b
        P, g, c = self.P, self.g, self.c
        max_len = self.cfg.max_model_len
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = P[r] + g[r] - c[r]
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget
            if n > max_len - c[r] - 1:
                n = max_len - c[r] - 1
            if n <= 0:
                i += 1
                continue
            need = -(-(c[r] + n) // b) - self.nblocks(r)
            if need < 0:
                need = 0
            if need > pool.num_free():
                preempted = True
                if not self._make_room(r, need):
                    break
            if need:
                self._allocate(r, need)
                self.used += need
                self.entries += need
            self._cache_full(r, min(c[r] + n, P[r] + g[r]))
            if self.rows is not None:
                self.rows.append((self.step, APPEND, r, need, n, 0))
            scheduled.append((r, n))
            budget -= n
            i += 1
        return budget, preempted

    def _make_room(self, r: int, need: int) -> bool:
        """Preempt from the back of the running queue until ``need`` blocks are free (vLLM's allocate_slots retry
        loop); False when ``r`` itself was the one preempted."""
        running, pool = self.running, self.pool
        while need > pool.num_free():
            victim = running.pop()
            self._preempt(victim)
            if victim == r:
                return False
        return True

    def _schedule_waiting(self, budget: int, lpt: int, scheduled: list[tuple[int, int]]) -> None:
        """Phase 2 of schedule(): admissions, FCFS, until one does not fit."""
        waiting, running, pool, b = self.waiting, self.running, self.pool, self.b
        run = self.run
        ref = pool.ref
        max_len = self.cfg.max_model_len
        skeys, caching = self.skeys, self.cfg.enable_prefix_caching
        hits: Sequence[int]
        private: Sequence[tuple[Run, int, int]]
        while budget > 0 and waiting and not self.head_blocked:
            if len(running) >= self.cfg.max_num_seqs:
                break
            r = waiting[0]
            total = self.P[r] + self.g[r]
            if skeys[r] == [] and r not in pool.runs:  # nothing shareable, nothing of its own cached
                hits, private = (), ()
            else:
                hits, private = self._lookup(r, total)
            npriv = sum(j - i for _, i, j in private) if private else 0
            h = len(hits) + npriv
            computed = h * b
            ext = self._cpu_hit(r, h) if self.tier is not None else 0
            if run.num_preemptions[r] == 0:
                # prefill_stats.set: the hit of the lookup that admits it (GPU and CPU tier together)
                run.num_cached_tokens[r] = computed + ext * b
                if self.tier is not None:
                    run.num_external_cached_tokens[r] = ext * b  # type: ignore[index]
            if ext:
                computed += ext * b
                if computed >= total:  # _update_waiting_for_remote_kv: the last token is computed for its logits
                    computed = total - 1
            n = total - computed
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget
            evictable = npriv + (sum(1 for x in hits if ref[x] == 0) if hits else 0)
            free = pool.free_plain + pool.lru_blocks
            need_full = -(-(total if total < max_len else max_len) // b) - h
            new = -(-(computed + n) // b) - h
            if (need_full if need_full > 0 else 0) + evictable > free or (new if new > 0 else 0) + evictable > free:
                self.head_blocked = True  # stays blocked until blocks are freed (free only shrinks meanwhile)
                break
            waiting.popleft()
            in_use_hits = h - evictable
            if hits or private:
                pool.touch(hits, private)
                self.blocks[r] = list(hits)  # else still the empty list its last release left
            self.npriv[r] = npriv
            if new > 0:
                self._allocate(r, new)
            held = len(self.blocks[r]) + self.npriv[r]
            self.used += held - in_use_hits
            self.entries += held
            self.c[r] = computed
            self.tokens_held += computed
            if self.blocks[r] or not caching:
                self.ncached[r] = h
                self._cache_full(r, computed + n)  # computed + n <= total
            else:  # no shareable block to key: the blocks full up to computed + n count as cached
                self.ncached[r] = (computed + n) // b
            running.append(r)
            self.order[r] = self.admissions
            self.admissions += 1
            if ext:
                self.tier.load(r, h, ext)  # type: ignore[union-attr]
                run.cpu_hit_tokens += ext * b
            run.hit_tokens += h * b
            run.queried_tokens += total
            if run.admit_step[r] < 0:
                run.admit_step[r] = self.step
                run.admit_s[r] = self.now
            if self.rows is not None:
                if h:
                    self.rows.append((self.step, REUSE, r, h, computed, 0))
                self.rows.append((self.step, ALLOCATE, r, max(new, 0), n, 0))
            scheduled.append((r, n))
            budget -= n

    def _update_from_output(self, scheduled: list[tuple[int, int]]) -> list[int]:
        """After the step: computed tokens advance; requests at their end sample a token.  Returns those that
        finished (in scheduled order)."""
        P, g, c, out = self.P, self.g, self.c, self.out
        run = self.run
        finished = []
        for r, n in scheduled:
            c[r] += n
            self.tokens_held += n
            if c[r] >= P[r] + g[r]:
                g[r] += 1
                self.prefilling.discard(r)
                if run.first_token_step[r] < 0:
                    run.first_token_step[r] = self.step
                    self.first_now.append(r)
                if g[r] >= out[r] or P[r] + g[r] >= self.cfg.max_model_len:
                    finished.append(r)
            else:
                self.prefilling.add(r)
        return finished

    def _finish(self, finished: list[int]) -> None:
        """Free finished requests' blocks in the order they were scheduled; drop them from the running list."""
        run = self.run
        for r in finished:
            run.finish_step[r] = self.step
            run.finish_s[r] = self.now
            if self.rows is not None:
                self.rows.append((self.step, FREE, r, self.nblocks(r), 0, 1))
            self._release(r, finished=True)
        if self.tier is not None:
            self.tier.finished.extend(finished)
        self.finished += len(finished)
        remove = self.running.remove
        for r in finished:
            remove(r)

    def exact_step(self) -> None:
        """One engine step: the decoding group's fast step when it can take the step alone (every running request
        decodes within the budget and the blocks they open fit: no preemption), else the plain loop."""
        group, pool = self.group, self.pool
        if (
            self.cfg.fast_path
            and self.rows is None
            and not self.prefilling
            and len(self.running) <= self.cfg.max_num_batched_tokens
            and group.opens_at[group.tick % self.b] <= pool.free_plain + pool.lru_blocks
        ):
            self._group_step()
        else:
            self._dissolve()
            self._plain_step()
            self._regroup()

    def _plain_step(self) -> None:
        """schedule(), the step's time and update_from_output, request by request."""
        self.step += 1
        budget = self.cfg.max_num_batched_tokens
        lpt = self._lpt()
        scheduled: list[tuple[int, int]] = []
        budget, preempted = self._schedule_running(budget, lpt, scheduled)
        if not preempted:
            self._schedule_waiting(budget, lpt, scheduled)
        c = self.c
        pairs = sum(attended_pairs(c[r], n) for r, n in scheduled)
        total = sum(n for _, n in scheduled)
        dt = self.cost.time_s(total, len(scheduled), self.entries, pairs) if self.cost else 0.0
        if self.tier is not None:
            self._offer_stores(scheduled)
            dt += self.tier.take_load_s()
        tokens_now = self.tokens_held + total  # the step's tokens are held from its start (analyze's definition)
        self._advance(dt, self.used, self.entries, tokens_now)
        finished = self._update_from_output(scheduled)
        if finished:
            self._finish(finished)
        self._first_tokens_out()

    def _lpt(self) -> int:
        """long_prefill_token_threshold, which applies only when more than one request is running or waiting."""
        return self.cfg.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0

    def _first_tokens_out(self) -> None:
        for r in self.first_now:
            self.run.first_token_s[r] = self.now
        self.first_now.clear()

    def _advance(self, dt: float, blocks: int, entries: int, tokens: int) -> None:
        """The step's time: the clock moves to its end; integrals and the timeline are updated."""
        run = self.run
        run.entry_seconds += entries * dt
        run.timeline_s.append(self.now)
        if run.event_rows is not None:
            run.step_start_s.append(self.now)
            run.step_end_s.append(self.now + dt)
        self.now += dt
        run.steps += 1
        run.busy_s += dt
        run.block_seconds += blocks * dt
        run.token_seconds += tokens * dt
        if blocks > run.peak_blocks:
            run.peak_blocks = blocks
        run.timeline_blocks.append(blocks)

    # ----------------------------------------------------------------- the decoding group (decode_group.py)
    def _sync(self, r: int, lag: int) -> None:
        """Bring a group member's counters up to date: ``lag`` decode steps (private blocks opened at multiples of
        the block size, full blocks cached)."""
        if lag:
            b = self.b
            c0 = self.c[r]
            self.npriv[r] += (c0 + lag - 1) // b - (c0 - 1) // b  # multiples of b in [c0, c0 + lag - 1]
            self.c[r] = c0 + lag
            self.g[r] += lag
            if self.cfg.enable_prefix_caching:
                self.ncached[r] = (c0 + lag) // b

    def _dissolve(self) -> None:
        for r, lag in self.group.clear():
            self._sync(r, lag)

    def _steps_left(self, r: int) -> int:
        to_out = self.out[r] - self.g[r]
        to_max_len = self.cfg.max_model_len - self.P[r] - self.g[r]
        return to_out if to_out < to_max_len else to_max_len

    def _regroup(self) -> None:
        """After a plain step: every running request past its prompt joins the group."""
        if not self.cfg.fast_path:
            return
        group, prefilling, c, order = self.group, self.prefilling, self.c, self.order
        for r in self.running:
            if r not in prefilling:
                group.join(r, c[r], self._steps_left(r), order[r])

    def _take(self, blocks: int) -> None:
        """Blocks opened by decodes: private blocks off the free queue."""
        self.pool.consume(blocks)
        self.used += blocks
        self.entries += blocks

    def _group_step(self) -> None:
        """The step when the running requests all decode (the group) and admissions may follow: as _plain_step,
        with the group's decodes counted, not walked."""
        group = self.group
        self.step += 1
        n = len(self.running)
        opened = group.opens_at[group.tick % self.b]
        if opened:
            self._take(opened)
        scheduled: list[tuple[int, int]] = []
        waiting = self.waiting
        if waiting:
            lpt = self.cfg.long_prefill_token_threshold if n + len(waiting) > 1 else 0  # as _lpt()
            self._schedule_waiting(self.cfg.max_num_batched_tokens - n, lpt, scheduled)
        c = self.c
        # the decodes' pairs: sum of (c + 1), an integer, exact in a float as the plain loop's sum is
        pairs = float(group.base_sum + n * group.tick + n)
        total = n
        for r, k in scheduled:
            pairs += attended_pairs(c[r], k)
            total += k
        dt = self.cost.time_s(total, n + len(scheduled), self.entries, pairs) if self.cost else 0.0
        if self.tier is not None:
            self._offer_stores(scheduled)
            dt += self.tier.take_load_s()
        self._advance(dt, self.used, self.entries, self.tokens_held + total)
        group.tick += 1
        self.tokens_held += n
        finished = self._pop_group_finished() if group.finish and group.finish[0][0] <= group.tick else []
        if scheduled:
            finished += self._update_admitted(scheduled)
        if finished:
            self._finish(finished)
        if self.first_now:
            self._first_tokens_out()

    def _pop_group_finished(self) -> list[int]:
        """Group members whose last step has run, brought up to date, in running order."""
        finished = self.group.pop_finished()
        for r, lag in finished:
            self._sync(r, lag)
        return [r for r, _ in finished]

    def _update_admitted(self, scheduled: list[tuple[int, int]]) -> list[int]:
        """_update_from_output for the requests admitted in a group step; those whose prompt is done and that go on
        decoding join the group.  Returns those that finished."""
        finished = self._update_from_output(scheduled)
        prefilling, c, order, join = self.prefilling, self.c, self.order, self.group.join
        for r, _ in scheduled:
            if r not in prefilling and r not in finished:
                join(r, c[r], self._steps_left(r), order[r])
        return finished

    # ----------------------------------------------------------------- between arrivals
    def advance_to(self, t: float, stop_s: float = _NEVER) -> None:
        """Steps while the clock is before ``t`` (the next arrival): run_engine's loop between two arrivals, and a
        fleet's (kvtool.simulate.fleet) for each replica.  Returns at the first step boundary at or after ``t``, or
        when the engine is idle (nothing running or waiting) or only a request that can never fit waits.

        Each step: the waiting head may be admitted (no jump then), else a jump if the step is quiet (it ends after
        the step that reaches ``t``, as at an arrival, or, when the next arrival could not be admitted anyway, at
        the first finish; ``stop_s`` bounds that too: a fleet router reads the engine's state at ``t``), else an
        exact step."""
        waiting, running = self.waiting, self.running
        cfg = self.cfg
        room = min(cfg.max_num_seqs, cfg.max_num_batched_tokens)  # running requests that leave room for one more
        progress = self.progress
        while self.now < t:
            if not running and (not waiting or self.head_blocked):
                return
            if waiting and not self.head_blocked and len(running) < room or not self.jump(t, stop_s):
                self.exact_step()
            if progress is not None and self.finished - self.done_reported >= 2000:
                self.done_reported = self.finished
                progress(self.done_reported)

    # ----------------------------------------------------------------- decode jumps
    def jump(self, next_arrival_s: float, stop_s: float = _NEVER) -> bool:
        """Pure-decode steps at once, while the step is quiet: every running request decodes (all in the group),
        all fit the budget, and no admission can happen.  A jump ends with the first finish (at most
        ``max_jump_steps``), before the first step whose new blocks do not fit, or after the step that reaches an
        arrival at ``next_arrival_s`` that could be admitted; after a finish, the next jump follows at once when no
        arrival is due.  False when not one step could run so (the caller takes an exact step)."""
        cfg, group, pool, run = self.cfg, self.group, self.pool, self.run
        jumped = False
        while True:
            n = len(self.running)
            if not n or self.prefilling or not cfg.fast_path or n > cfg.max_num_batched_tokens:
                return jumped
            until_s = _NEVER
            if self.waiting:
                if n < cfg.max_num_seqs and n < cfg.max_num_batched_tokens and not self.head_blocked:
                    return jumped  # the head may be admitted
            elif n < cfg.max_num_seqs:
                until_s = next_arrival_s
            if stop_s < until_s:
                until_s = stop_s
            steps = group.finish[0][0] - group.tick  # quiet: every running request is in the group
            if cfg.max_jump_steps < steps:
                steps = cfg.max_jump_steps
            if steps < 2:
                return jumped
            rates = self._decode_rates.get(n) or self._rates(n)
            entries, tokens, used, budget_s = self.entries, self.tokens_held, self.used, until_s - self.now
            co, rate = rates
            least = rate[0] + rate[1] * entries  # every step of the jump takes at least this
            if least > 0 and budget_s / least + 2 < steps:  # not listing openings past the arrival
                steps = int(budget_s / least) + 2
            start = (entries, used, tokens, n)  # a DecodeStart's fields
            # memory grows with the entries, compute with the attended tokens: memory-bound throughout if memory at
            # the first step is at least compute at the last
            if self.rows is None and co[1] + co[2] * entries >= co[4] + co[5] * (tokens + n * steps):
                span = decode_span(group.openings(steps), start, rate, budget_s, pool.free_plain + pool.lru_blocks)
            else:
                span = self._span_one_by_one(steps, start, rates, until_s)
            k, opened, elapsed_s, block_s, entry_s, token_s = span
            if not k:
                return jumped
            # the jump's blocks, time and integrals
            run.timeline_s.append(self.now)
            run.timeline_blocks.append(used)
            if opened:
                if opened <= pool.free_plain:  # pool.consume's common case, inline
                    pool.free_plain -= opened
                else:
                    pool.consume(opened)
                self.used = used = used + opened
                self.entries = entries + opened
                if used > run.peak_blocks:
                    run.peak_blocks = used
            self.now += elapsed_s
            run.busy_s += elapsed_s
            run.steps += k
            run.block_seconds += block_s
            run.entry_seconds += entry_s
            run.token_seconds += token_s
            self.tokens_held = tokens + n * k
            group.tick += k
            self.step += k
            if group.finish[0][0] > group.tick:
                return True
            self._finish(self._pop_group_finished())
            if next_arrival_s <= self.now or stop_s <= self.now:
                return True
            jumped = True

    def _span_one_by_one(
        self, steps: int, start: tuple[int, int, int, int], rates: _DecodeRates, until_s: float
    ) -> DecodeSpan:
        """A jump's span when steps may be compute-bound (taken one by one) or when events are recorded (the
        step times and the decode rows of the export)."""
        group = self.group
        free = self.pool.free_plain + self.pool.lru_blocks
        computed = self._computed_before_jump() if self.rows is not None else None
        co, rate = rates
        entries, _, tokens, n = start
        if co[1] + co[2] * entries >= co[4] + co[5] * (tokens + n * steps):
            openings = group.openings(steps)
            span = decode_span(openings, start, rate, until_s - self.now, free)
            if computed is not None:
                self._record_step_times(openings[: span.steps], entries, rate, span.elapsed_s)
        else:
            span = self._decode_steps(group.openings(steps), start, until_s, co, free)
        if computed is not None and span.steps:
            self.run.event_jumps.append((self.step + 1, span.steps, list(self.running), computed))  # type: ignore[union-attr]
        return span

    def _rates(self, n: int) -> _DecodeRates:
        """The cost's decode coefficients for n requests, and the memory-bound step time they give (kept per n)."""
        co = self.cost.decode_coefficients(n) if self.cost is not None else _NO_COST
        rates = self._decode_rates[n] = _DecodeRates(co, (co[0] + co[1], co[2] + co[3]))
        return rates

    def _record_step_times(
        self, openings: list[int], entries: int, rate: tuple[float, float], elapsed_s: float
    ) -> None:
        """With record_events: the start and end of each step of a closed-form jump (the export's timestamps).  The
        run's clock and figures come from the closed form, as without events, so the last step ends exactly where
        the clock goes (``elapsed_s`` on; the steps' own sum may differ in the last bits)."""
        step_s, entry_s = rate
        ends = list(accumulate((step_s + entry_s * (entries + g) for g in accumulate(openings)), initial=self.now))
        ends[-1] = self.now + elapsed_s
        self.run.step_start_s.extend(ends[:-1])
        self.run.step_end_s.extend(ends[1:])

    def _computed_before_jump(self) -> list[int]:
        """With record_events: the running requests' computed tokens before the jump (the export's decode rows)."""
        group = self.group
        for r in self.running:
            self._sync(r, group.lag(r))
        return [self.c[r] for r in self.running]

    def _decode_steps(
        self, grow_at: list[int], start: tuple[int, int, int, int], until_s: float, coefficients: tuple, free: int
    ) -> DecodeSpan:
        """Times and integrals of a jump step by step (blocks grow with the openings, tokens by one per request per
        step), as far as the openings fit ``free`` blocks; stops after the step that reaches ``until_s``."""
        grown = list(accumulate(grow_at))
        if grown and grown[-1] > free:  # only the steps whose openings fit
            del grow_at[bisect_right(grown, free) :]
        run = self.run
        entries, blocks, tokens, n = start
        blocks0 = blocks
        attended = tokens + n
        fixed, memory0, read_entry, kernel_entry, compute0, per_pair = coefficients
        keep_steps = run.event_rows is not None
        now = self.now
        block_s = entry_s = token_s = 0.0
        steps = len(grow_at)
        for k in range(steps):
            grow = grow_at[k]
            blocks += grow
            entries += grow
            memory = memory0 + read_entry * entries
            compute = compute0 + per_pair * attended
            dt = fixed + (memory if memory > compute else compute) + kernel_entry * entries
            tokens += n
            if keep_steps:
                run.step_start_s.append(now)
                run.step_end_s.append(now + dt)
            now += dt
            block_s += blocks * dt
            entry_s += entries * dt
            token_s += tokens * dt
            attended += n
            if now >= until_s:
                steps = k + 1
                break
        return DecodeSpan(steps, blocks - blocks0, now - self.now, block_s, entry_s, token_s)


def run_engine(
    config: EngineConfig,
    prompts: Sequence[Prompt],
    max_tokens: Sequence[int],
    arrival_s: Sequence[float] | None = None,
    cost: StepCost | None = None,
    progress: Callable[[int], None] | None = None,
    keys: BlockKeys | None = None,
    record_events: bool = False,
    tier: CpuTier | None = None,
    engine_class: type[Engine] | None = None,
) -> EngineRun:
    """Run requests through one simulated engine until all finish (or can never run).

    ``engine_class``: :class:`Engine` (one full-attention group), or for a config with ``kv_groups``
    :class:`kvtool.simulate.grouped.GroupedEngine`, which the caller passes (that module builds on this one).

    Arrivals (seconds; all 0 when None) join the waiting queue at the first step boundary at or after them.  A
    request whose whole sequence cannot fit the pool even alone is never admitted; the run stops when only such
    requests wait (their ``finish_step`` stays -1).
    """
    import gc

    # The loop makes many small tuples and lists that live until the run ends: the cyclic collector would walk
    # them again and again and find nothing (the run holds no cycles it needs collected).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(config, prompts, max_tokens, arrival_s, cost, progress, keys, record_events, tier, engine_class)
    finally:
        if collecting:
            gc.enable()


def _fits_alone(config: EngineConfig, prompt_tokens: list[int], max_tokens: list[int]) -> list[bool]:
    """Per request: whether the engine ever takes it.

    Its prompt must be shorter than max_model_len: vLLM 0.32's input processor refuses a prompt of max_model_len
    tokens or more (``InputProcessor._validate_model_input``: "plus the number of requested output tokens (at least
    1) is longer than the maximum model length"), so such a request never reaches the scheduler.  And its whole
    sequence (prompt + outputs - 1 tokens of KV) must fit the pool alone, else vLLM would preempt it forever (vLLM
    itself refuses a max_model_len beyond the pool)."""
    pool_tokens = (config.num_blocks - 1) * config.block_size  # blocks needed <= usable blocks: tokens <= this
    if config.max_model_len <= pool_tokens:
        fits = [True] * len(prompt_tokens)
    else:  # prompt + outputs - 1 <= pool_tokens, at C speed
        fits = list(map((pool_tokens + 1).__ge__, map(operator.add, prompt_tokens, max_tokens)))
    if prompt_tokens and max(prompt_tokens) >= config.max_model_len:
        fits = list(map(operator.and_, fits, map(config.max_model_len.__gt__, prompt_tokens)))
    return fits


def _run(
    config, prompts, max_tokens, arrival_s, cost, progress, keys, record_events, tier=None, engine_class=None
) -> EngineRun:
    n = len(prompts)
    arrival = list(arrival_s) if arrival_s is not None else [0.0] * n
    if config.kv_groups:
        if engine_class is None or engine_class is Engine:
            raise ValueError("an EngineConfig with kv_groups runs on kvtool.simulate.grouped.GroupedEngine")
        engine: Engine = engine_class(
            config, prompts, max_tokens, cost, keys, record_events
        )  # no CPU tier: refused before
    else:
        engine = (engine_class or Engine)(config, prompts, max_tokens, cost, keys, record_events, tier)
    order = sorted(range(n), key=arrival.__getitem__)
    nxt = 0
    fits = engine.fits_alone()
    times = [arrival[i] for i in order]
    times.append(float("inf"))  # times[nxt]: the next arrival
    waiting = engine.waiting
    engine.progress = progress
    while True:
        while times[nxt] <= engine.now:
            r = order[nxt]
            nxt += 1
            if fits[r]:
                waiting.append(r)
        engine.advance_to(times[nxt])
        if engine.now < times[nxt]:  # idle (or only requests that never fit wait: excluded by the fits filter)
            if waiting or nxt >= n:
                break
            engine.now = times[nxt]
    if progress is not None:
        progress(engine.finished)
    engine.run.free_blocks_at_end = engine.pool.num_free()
    engine.run.evictions = engine.pool.evictions
    return engine.run
