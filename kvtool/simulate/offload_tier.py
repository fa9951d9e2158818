"""The CPU tier of vLLM's native KV offloading (``--kv-offloading-size GiB``) as a second level behind the
simulator's prefix cache: what `kvtool simulate --serve --kv-offloading-size 0,4,8` runs.

What vLLM 0.32.0 does (read in /work/vllm-src/0.32.0/vllm/; full-attention model, ``kv_offloading_backend
native``, so ``VllmConfig._post_init_kv_transfer_config`` (vllm/config/vllm.py) sets the ``OffloadingConnector``
with ``cpu_bytes_to_use = size x 2**30`` and nothing else):

- **Block size.**  One offloaded chunk is ``blocks_per_chunk`` GPU blocks; ``offloading/config.py`` defaults it to
  1 (no ``block_size`` / ``blocks_per_chunk`` in the extra config), so a CPU block holds one GPU block of every
  layer, of every rank.  Their number is ``CPUOffloadingSpec.__init__``'s ``num_chunks`` (cpu/spec.py), which
  :func:`kvtool.estimate.offload.plan_offload` computes; this module takes it from there (one code path).
- **Stores** (``OffloadingConnectorScheduler._build_store_jobs``, distributed/kv_transfer/kv_connector/v1/offloading/
  scheduler.py, called from ``build_connector_meta`` at the end of every ``Scheduler.schedule``): for each request
  scheduled in the step, the full blocks its computed tokens reach after the step (``num_computed_tokens +
  num_scheduled_tokens``), capped at its prompt (``offload_prompt_only``, True by default: ``OffloadingSpec.__init__``,
  v1/kv_offload/base.py), from the request's ``next_stored_chunk_idx`` on, are offered to
  ``CPUOffloadingManager.prepare_store`` (v1/kv_offload/cpu/manager.py): blocks already in the tier are left there,
  the others are stored, evicting as many LRU blocks as needed, never one of the blocks offered in the same call
  (``protected = set(keys)``); when that is not possible the call returns None, nothing is stored and the same
  blocks are offered again at the request's next step.  Every prompt block is offered, the ones its GPU prefix hit
  covered too (``update_state_after_alloc`` returns early without a load, so ``next_stored_chunk_idx`` stays 0); after
  a load, ``next_stored_chunk_idx`` is set to the blocks the hit covered.  Requests that finished in the previous step
  are offered their prompt blocks once more (``finished_req_ids``), after the scheduled ones.
- **Lookup** (``get_num_new_matched_tokens`` -> ``_lookup_complete_chunks`` -> ``_maximal_prefix_lookup``), called
  by ``Scheduler.schedule`` for a waiting request with ``num_computed_tokens == 0`` (a new or a preempted one),
  after the GPU prefix hit: consecutive blocks in the tier from the first block after the GPU hit, stopping at the
  first miss, up to ``request.num_tokens`` (no ``- 1`` for a full-attention model: the rule only applies with
  sliding-window groups), and not at all when less than one block would load.  The request's computed tokens are
  the GPU hit plus the CPU hit; ``num_cached_tokens`` (``prefill_stats.set``) counts both; when they reach the
  whole sequence, ``_update_waiting_for_remote_kv`` takes one token back so that it is computed for its logits.
- **Loaded blocks become GPU-cached blocks**: the scheduler allocates fresh GPU blocks for the CPU hit
  (``allocate_slots(num_external_computed_tokens=...)``) and ``_update_waiting_for_remote_kv`` caches them
  (``kv_cache_manager.cache_blocks``) once the load is done, so later requests hit them on the GPU.
- **Eviction: LRU** (``eviction_policy`` ``"lru"`` by default, ``CPUOffloadingSpec.__init__``; ``LRUCachePolicy``,
  v1/kv_offload/cpu/policies/lru.py).  A block's recency is set when it is stored (``insert``) and when a request
  that stored it, offered it while it was there, or loaded it finishes (``CPUOffloadingManager.on_request_finished``
  -> ``LRUCachePolicy.on_request_finished``: the request's blocks from its tail to its head, so its head ends most
  recent).  A lookup does not touch.  Blocks being stored (``ref_cnt -1``) or loaded (``ref_cnt > 0``) cannot be
  evicted; a block still being stored answers ``HIT_PENDING`` and delays the request.

What the simulation takes from it, and where it differs:

- stores and loads complete within the step that issued them (vLLM's run asynchronously: a block offered at step s
  is ``HIT_PENDING`` until its store is reported done, a request with a CPU hit waits in
  ``WAITING_FOR_REMOTE_KVS`` for at least one step while its blocks load).  So no block is ever pinned, and a CPU
  hit is taken at admission like a GPU hit;
- the load's time, ``blocks x bytes per CPU block / host-to-device bandwidth``, is added to the admitting step's
  time (vLLM overlaps it with the step and holds back the loading request instead): an upper bound for the other
  requests of that step, a lower bound for the loading request;
- offers that failed are offered again in the steps the simulator walks request by request and at the request's
  finish (decodes advanced as a group do not retry: their prompt blocks were offered while they were prefilling);
- prompt blocks with no shareable content (a request's private tail) are stored under a key of their own: only the
  same request, resumed after a preemption, can hit them, but they take CPU blocks as in vLLM.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

from kvtool.core.errors import UsageError

# Host-to-device copy rate of a CPU-tier load when none is given (decimal GB/s): PCIe 5.0 x16 carries 63 GB/s per
# direction before protocol overhead; pinned-memory copies reach about 50 of them (H100, H200, B200 hosts).
DEFAULT_H2D_GB_S = 50.0
# Offload rules of vLLM 0.32.0 read for this module (the simulator's scheduler is 0.32's)
SOURCE = (
    "vllm 0.32.0 distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py (_build_store_jobs, "
    "get_num_new_matched_tokens), v1/kv_offload/cpu/manager.py (prepare_store), cpu/policies/lru.py"
)


class CpuTier:
    """The offloading connector's CPU blocks under the LRU policy, for one engine (``CPUOffloadingManager`` with
    ``LRUCachePolicy``, every store and load complete at once).

    Keys are the engine's block keys: the chained key of a shareable prompt block, or :func:`own_key` for a
    request's private one.
    """

    __slots__ = (
        "capacity",
        "bytes_per_block",
        "h2d_bytes_per_s",
        "lru",
        "next_stored",
        "seen",
        "finished",
        "stored_blocks",
        "evicted_blocks",
        "failed_offers",
        "loaded_blocks",
        "_load_s",
    )

    def __init__(self, capacity_blocks: int, bytes_per_block: int = 0, h2d_bytes_per_s: float = 0.0):
        self.capacity = capacity_blocks
        self.bytes_per_block = bytes_per_block
        self.h2d_bytes_per_s = h2d_bytes_per_s
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # oldest first
        self.next_stored: dict[int, int] = {}  # request -> next_stored_chunk_idx
        self.seen: dict[int, set[int]] = {}  # request -> block indices it stored, offered while present, or loaded
        self.finished: list[int] = []  # requests finished in the last step (offered again at the next one)
        self.stored_blocks = 0
        self.evicted_blocks = 0
        self.failed_offers = 0
        self.loaded_blocks = 0
        self._load_s = 0.0

    # ------------------------------------------------------------------ lookup and load
    def hit(self, key_of: Callable[[int], int], start: int, end: int) -> int:
        """Blocks in the tier from index ``start`` on, consecutive, below ``end`` (``_maximal_prefix_lookup``)."""
        lru = self.lru
        i = start
        while i < end and key_of(i) in lru:
            i += 1
        return i - start

    def load(self, request: int, start: int, blocks: int) -> None:
        """A CPU hit of ``blocks`` blocks from ``start`` is loaded (``prepare_load``: they count as the request's
        reuse), and the request's next offer starts after them (``update_state_after_alloc``)."""
        self.seen.setdefault(request, set()).update(range(start, start + blocks))
        self.next_stored[request] = start + blocks
        self.loaded_blocks += blocks
        if self.h2d_bytes_per_s > 0:
            self._load_s += blocks * self.bytes_per_block / self.h2d_bytes_per_s

    def take_load_s(self) -> float:
        """Seconds of the loads issued since the last call (added to the step's time)."""
        s, self._load_s = self._load_s, 0.0
        return s

    # ------------------------------------------------------------------ stores
    def offer(self, request: int, key_of: Callable[[int], int], full_blocks: int) -> None:
        """``_build_store_jobs`` for one request: its prompt blocks [next_stored, full_blocks) to ``prepare_store``."""
        lo = self.next_stored.get(request, 0)
        if full_blocks <= lo:
            return
        lru = self.lru
        keys = [key_of(i) for i in range(lo, full_blocks)]
        seen = self.seen.setdefault(request, set())
        seen.update(range(lo, full_blocks))  # recorded before the allocation (_record_request_cache_access)
        new = [k for k in keys if k not in lru]
        if new:
            evict = len(new) - (self.capacity - len(lru))
            if evict > 0 and not self._evict(evict, set(keys)):
                self.failed_offers += 1
                return  # None: offered again at the next step
            for k in new:  # LRUCachePolicy.insert: each the most recent
                lru[k] = None
            self.stored_blocks += len(new)
        self.next_stored[request] = full_blocks

    def _evict(self, n: int, protected: set[int]) -> bool:
        """Take n least recently used blocks not in ``protected`` out; False (nothing taken) when there are fewer."""
        if n > len(self.lru) - sum(1 for k in protected if k in self.lru):
            return False
        victims = []
        for k in self.lru:
            if k not in protected:
                victims.append(k)
                if len(victims) == n:
                    break
        for k in victims:
            del self.lru[k]
        self.evicted_blocks += n
        return True

    def finish(self, request: int, key_of: Callable[[int], int], prompt_blocks: int) -> None:
        """The store phase of the step after a request finished: its prompt blocks offered once more, then its
        blocks' recency from tail to head (``on_request_finished``)."""
        self.offer(request, key_of, prompt_blocks)
        lru = self.lru
        for i in sorted(self.seen.pop(request, ()), reverse=True):
            k = key_of(i)
            if k in lru:
                lru.move_to_end(k)
        self.next_stored.pop(request, None)


def own_key(request: int, index: int) -> int:
    """The key of a request's private prompt block: negative, so never equal to an interned chain key (>= 1)."""
    return -((request << 32) | index) - 1


@dataclasses.dataclass(frozen=True)
class OffloadPoint:
    """One point of the hit-rate-versus-CPU-size curve: the serving simulation with a CPU tier of this size."""

    block_size: int
    kv_offloading_size_gib: float
    cpu_kv_blocks: int  # kvtool estimate's figure for the same model, GPU, tp, dtype and block size
    cpu_kv_tokens: int
    bytes_per_cpu_block: int
    prompt_tokens: int  # prompt tokens of the requests that ran
    gpu_hit_tokens: int  # sum of the GPU prefix-cache hits at first admission
    cpu_hit_tokens: int  # sum of the CPU-tier hits at first admission (loaded blocks x block size)
    hit_rate: float  # (gpu + cpu hit tokens) / prompt tokens
    stored_blocks: int  # blocks written to the tier
    evicted_blocks: int  # tier blocks evicted for new ones
    loaded_blocks: int  # tier blocks loaded, resumed requests' loads included
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_p50_change_s: float | None  # against the simulation without a CPU tier
    ttft_p99_change_s: float | None


@dataclasses.dataclass(frozen=True)
class OffloadCurve:
    """`--kv-offloading-size`'s curve: one point per block size and CPU size, in the order given."""

    backend: str
    h2d_gb_s: float  # the host-to-device rate a load's time is taken at
    h2d_from: str  # where that rate came from
    sizing: str  # how the CPU blocks were counted (estimate's rule), for the first nonzero size
    points: list[OffloadPoint]


def parse_offloading_sizes(text: str) -> list[float]:
    """'0,4,8' -> [0.0, 4.0, 8.0] (GiB): each a finite number, 0 (no tier) or more, no duplicates."""
    import math

    sizes: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise UsageError(
                f"--kv-offloading-size takes GiB as a number or a comma list, got {part!r}",
                where="--kv-offloading-size",
            ) from None
        if not 0 <= value < math.inf:
            raise UsageError(
                f"--kv-offloading-size must be 0 (no CPU tier) or more GiB, got {part}", where="--kv-offloading-size"
            )
        if value not in sizes:
            sizes.append(value)
    if not sizes:
        raise UsageError("no --kv-offloading-size given", where="--kv-offloading-size")
    return sizes


@dataclasses.dataclass(frozen=True)
class CpuTierSize:
    """One --kv-offloading-size at one block size, as `kvtool estimate` sizes it."""

    size_gib: float
    cpu_kv_blocks: int
    cpu_kv_tokens: int
    bytes_per_cpu_block: int
    method: str


def size_tiers(
    sizes_gib: list[float],
    backend: str,
    block_size: int,
    *,
    model: str | None,
    config: str | None,
    kv_budget_bytes: int,
    tp: int,
    kv_dtype: str,
    profile_dirs: tuple[str, ...],
    vllm_version: str,
) -> list[CpuTierSize]:
    """The CPU blocks of each size through `kvtool estimate` (``kvtool.estimate.offload.plan_offload``, one code
    path); size 0 is no tier.  A model whose KV cache is not one full-attention group is refused: the simulator's
    prefix cache models full attention only."""
    from kvtool.estimate.estimator import EstimateRequest, estimate

    out = []
    for size in sizes_gib:
        if size == 0:
            out.append(CpuTierSize(0.0, 0, 0, 0, "no CPU tier"))
            continue
        # the GPU tier by its KV budget: the bytes of a CPU block depend on the layout, not on the GPU
        result = estimate(
            EstimateRequest(
                model=model,
                config=config,
                kv_memory=str(kv_budget_bytes),
                block_size=block_size,
                tp=tp,
                kv_dtype=kv_dtype,
                profile_dirs=profile_dirs,
                vllm_version=vllm_version,
                kv_offloading_size=size,
                kv_offloading_backend=backend,
            )
        )
        kinds = {(g.kind, g.window_tokens) for g in result.layer_groups}
        if kinds != {("full", None)}:
            raise UsageError(
                f"kvtool simulates the CPU tier for full-attention models only; {result.model} has "
                f"{', '.join(sorted(k for k, _ in kinds))} layers",
                where="--kv-offloading-size",
            )
        out.append(
            CpuTierSize(
                size,
                int(result.cpu_kv_blocks or 0),
                int(result.cpu_kv_tokens or 0),
                int(result.cpu_kv_bytes_per_block or 0),
                result.cpu_kv_method or "",
            )
        )
    return out


def offload_point(
    block_size: int, tier_size: CpuTierSize, tier: CpuTier, result, trace, plain, prompts
) -> OffloadPoint:
    """One point of the curve from the serving simulation with the tier (``result``, ``trace``: one pool) and the
    same simulation without one (``plain``)."""
    import numpy as np

    run = trace.runs[0]
    admitted = np.isfinite(np.asarray(run.admit_s, dtype=np.float64))
    prompt_tokens = int(sum(p.tokens for p, ran in zip(prompts, admitted) if ran))
    cpu = int(np.maximum(np.asarray(run.num_external_cached_tokens, dtype=np.int64), 0).sum())

    def change(a, b):
        return None if a is None or b is None else a - b

    return OffloadPoint(
        block_size=block_size,
        kv_offloading_size_gib=tier_size.size_gib,
        cpu_kv_blocks=tier_size.cpu_kv_blocks,
        cpu_kv_tokens=tier_size.cpu_kv_tokens,
        bytes_per_cpu_block=tier_size.bytes_per_cpu_block,
        prompt_tokens=prompt_tokens,
        gpu_hit_tokens=result.cached_prompt_tokens - cpu,
        cpu_hit_tokens=cpu,
        hit_rate=result.cached_prompt_tokens / prompt_tokens if prompt_tokens else 0.0,
        stored_blocks=tier.stored_blocks,
        evicted_blocks=tier.evicted_blocks,
        loaded_blocks=tier.loaded_blocks,
        ttft_p50_s=result.ttft_p50_s,
        ttft_p99_s=result.ttft_p99_s,
        ttft_p50_change_s=change(result.ttft_p50_s, plain.ttft_p50_s),
        ttft_p99_change_s=change(result.ttft_p99_s, plain.ttft_p99_s),
    )
