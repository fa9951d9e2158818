"""Several simulated vLLM engines behind a router, advanced in global time order.

Each replica is :class:`kvtool.simulate.scheduler.Engine` (vLLM 0.32's V1 scheduler and prefix cache), given its
requests one by one (``Engine.add_request``) as the router hands them over.  The loop, per arrival in time order:

1. With a router that reads the replicas' state (or when the routing regret is measured), every busy replica is
   stepped up to the arrival (``Engine.advance_to``: to the first step boundary at or after it, a decode jump cut
   there), so the router sees each replica as it is then.  Otherwise only the chosen replica is stepped, just before
   its request joins: exactly as one engine runs its own arrivals.
2. The router picks among the replicas the request fits at all (vLLM would refuse it elsewhere: its prompt must be
   shorter than max_model_len and its sequence must fit the pool alone, ``scheduler._fits_alone``).
3. The request joins the replica's waiting queue (at the replica's next step boundary, as in one engine).

With one replica every step is the one-engine loop's step in the same order, so the per-request figures equal
``run_engine``'s exactly (tests/simulate/test_fleet.py runs the vLLM parity fixtures through here).

Measured beside the runs: the bound of one infinite prefix cache over the whole fleet (each request's longest prefix
of shareable blocks seen in any earlier request, in arrival order, capped as vLLM caps a hit at num_tokens - 1), and,
in state mode, each request's routing regret: the hit the best replica's cache held for it at routing time less the
hit its chosen replica held then (what a precise router would have had).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kvtool.simulate.fleet.routers import FleetView, RouterSettings, make_router
from kvtool.simulate.prefix_cache import BlockKeys
from kvtool.simulate.scheduler import (
    Engine,
    EngineConfig,
    EngineRun,
    Prompt,
    StepCost,
    _fits_alone,
    shared_block_contents,
)

_NEVER = float("inf")


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its engine settings and step-time model (GPU and TP in words)."""

    name: str
    config: EngineConfig
    cost: StepCost | None = None
    gpu: str = ""
    tp: int = 1


@dataclasses.dataclass
class FleetRun:
    """What a fleet run recorded.  Per request (global numbering, the input order): the replica it went to (-1:
    fits none), its index there, the best and the chosen replica's cached prefix at routing (blocks; -1 when not
    measured), the infinite cache's hit (blocks)."""

    replicas: list[ReplicaSpec]
    runs: list[EngineRun]
    routed: list[list[int]]  # per replica: the global request numbers, in its own index order
    replica_of: list[int]
    local_index: list[int]
    best_hit_blocks: list[int]
    chosen_hit_blocks: list[int]
    infinite_hit_blocks: list[int]
    regret_measured: bool

    def per_request(self, field: str) -> list[Any]:
        """One EngineRun list (``num_cached_tokens``, ``finish_s``, ...) in global request order (None: not run)."""
        out: list[Any] = [None] * len(self.replica_of)
        for run, ids in zip(self.runs, self.routed):
            values = getattr(run, field)
            for k, r in enumerate(ids):
                out[r] = values[k]
        return out


def infinite_cache_hits(keys: Sequence[list[int]], prompt_tokens: Sequence[int], block_size: int, order) -> list[int]:
    """Per request, the hit of one infinite prefix cache that has seen every earlier request (``order``: arrival
    order): the leading blocks whose chained key some earlier request had, at most (P - 1) // b."""
    seen: set[int] = set()
    out = [0] * len(keys)
    for r in order:
        sk = keys[r]
        limit = (prompt_tokens[r] - 1) // block_size
        h = 0
        for k in sk[:limit]:
            if k not in seen:
                break
            h += 1
        out[r] = h
        seen.update(sk)
    return out


def run_fleet(
    replicas: Sequence[ReplicaSpec],
    prompts: Sequence[Prompt],
    max_tokens: Sequence[int],
    arrival_s: Sequence[float] | None,
    router: RouterSettings,
    sessions: Sequence[Any] | None = None,
    measure_regret: bool = True,
    progress: Callable[[int], None] | None = None,
) -> FleetRun:
    """Route every request to a replica and run the replicas until all finish (or can never run)."""
    import gc

    # as run_engine: the run makes many small objects that live until it ends, the cyclic collector would walk
    # them again and again for nothing
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run_fleet(replicas, prompts, max_tokens, arrival_s, router, sessions, measure_regret, progress)
    finally:
        if collecting:
            gc.enable()


def _run_fleet(replicas, prompts, max_tokens, arrival_s, router, sessions, measure_regret, progress) -> FleetRun:
    n = len(prompts)
    sizes = {spec.config.block_size for spec in replicas}
    if len(sizes) != 1:
        raise ValueError("the replicas of one fleet share one block size")
    b = sizes.pop()
    keys = BlockKeys()
    engines = [Engine(spec.config, [], [], spec.cost, keys) for spec in replicas]
    m = len(engines)
    view = FleetView(engines)
    policy = make_router(router, view, m, b, sessions)
    state = policy.needs_state or measure_regret
    stop = m > 1  # one replica: nothing reads its state between its own arrivals
    out = [o if o > 1 else 1 for o in map(int, max_tokens)]
    P = [p.tokens for p in prompts]
    fits_by_config: dict[EngineConfig, list[bool]] = {}
    for spec in replicas:
        if spec.config not in fits_by_config:
            fits_by_config[spec.config] = _fits_alone(spec.config, P, out)
    fits = [fits_by_config[spec.config] for spec in replicas]
    arrival = list(arrival_s) if arrival_s is not None else [0.0] * n
    order = sorted(range(n), key=arrival.__getitem__)
    caching = all(spec.config.enable_prefix_caching for spec in replicas)
    piece_keys: dict[tuple, list[int]] = {}

    def keys_of(prompt: Prompt) -> list[int]:
        if not prompt.shared or not caching:
            return []
        if prompt.kind == "pieces":
            memo = tuple(prompt.shared)
            sk = piece_keys.get(memo)
            if sk is None:
                sk = piece_keys[memo] = keys.chain(shared_block_contents(prompt, b))
            return sk
        return keys.chain(shared_block_contents(prompt, b))

    all_keys: list[list[int]] = [[] for _ in range(n)]
    replica_of = [-1] * n
    local = [-1] * n
    best_hit = [-1] * n
    chosen_hit = [-1] * n
    routed: list[list[int]] = [[] for _ in range(m)]
    everywhere = list(range(m))
    for done, r in enumerate(order):
        t = arrival[r]
        if state:
            for e in engines:
                if e.now < t and (e.running or e.waiting):
                    e.advance_to(t, t if stop else _NEVER)
        candidates = [i for i in everywhere if fits[i][r]]
        prompt = prompts[r]
        sk = all_keys[r] = keys_of(prompt)
        if not candidates:
            continue
        limit = (P[r] - 1) // b
        i = policy.choose(r, sk, limit, P[r], candidates) if m > 1 or len(candidates) > 1 else candidates[0]
        if measure_regret:
            if sk and limit:
                hits = [view.cached_blocks(j, sk, limit) for j in candidates]
                best_hit[r] = max(hits)
                chosen_hit[r] = hits[candidates.index(i)]
            else:
                best_hit[r] = chosen_hit[r] = 0
        e = engines[i]
        if not state:
            e.advance_to(t)  # its own next arrival: exactly one engine's loop
        k = e.add_request(prompt, out[r], sk)
        if e.now < t:  # idle until now
            e.now = t
        e.waiting.append(k)
        replica_of[r], local[r] = i, k
        routed[i].append(r)
        if progress is not None and done % 2000 == 1999:
            progress(sum(e.finished for e in engines))
    for e in engines:
        e.advance_to(_NEVER)
        e.run.free_blocks_at_end = e.pool.num_free()
        e.run.evictions = e.pool.evictions
    if progress is not None:
        progress(sum(e.finished for e in engines))
    ran = [r for r in order if replica_of[r] >= 0]
    return FleetRun(
        replicas=list(replicas),
        runs=[e.run for e in engines],
        routed=routed,
        replica_of=replica_of,
        local_index=local,
        best_hit_blocks=best_hit,
        chosen_hit_blocks=chosen_hit,
        infinite_hit_blocks=infinite_cache_hits(all_keys, P, b, ran),
        regret_measured=measure_regret,
    )
