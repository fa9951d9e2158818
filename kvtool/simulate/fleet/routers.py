"""The routers of a simulated fleet: which replica each arriving request goes to.

Five policies (docs/fleet.md has the long form and the sources):

- ``round-robin``: the next replica in turn (that can hold the request at all).
- ``least-loaded``: the fewest requests in flight (running + waiting), or with ``load_metric="kv-blocks"`` the
  smallest share of the pool's blocks in use; ties to the lower replica number.
- ``session-affinity``: every request of a session to the replica its session's first request went to; new sessions
  and requests without a session id in turn (round robin), as a consistent hash spreads them.
- ``prefix-aware`` (approximate): SGLang's cache-aware router, which vLLM's router forked (sgl-project/sglang
  ``rust/src/router.rs``, ``CacheAware``): a prefix tree over what was *routed* to each replica, never told of
  evictions.  When the loads are imbalanced (``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold
  x min``, loads being requests in flight) the least loaded replica; else the replica with the longest match when
  the match covers more than ``cache_threshold`` of the prompt, else the replica with the smallest tree.  Defaults
  are sglang_router's (``router_args.py``: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5).
  The tree here is over blocks of the prompt's shareable tokens (SGLang's is over characters).
- ``precise`` (KV-aware): the replicas' real cached block hashes, as llm-d's KV-cache indexer keeps them from vLLM's
  KV events (and SGLang's event-driven cache-aware mode): the replica whose prefix cache holds the longest prefix of
  the request now, ties to the least loaded; no hit anywhere, or imbalanced loads (the rule above): the least loaded.
  Any match wins, however small a share of the prompt: when every prompt shares a system prompt, a replica that
  does not hold it never wins (docs/fleet.md, "Precise below prefix-aware").

A router reads the replicas' state through :class:`FleetView` (``needs_state``): the fleet then brings every replica
to the arrival's time before asking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import islice, takewhile
from typing import Any, Protocol

from kvtool.core.errors import UsageError

ROUND_ROBIN = "round-robin"
LEAST_LOADED = "least-loaded"
SESSION = "session-affinity"
PREFIX = "prefix-aware"
PRECISE = "precise"
POLICIES = (ROUND_ROBIN, LEAST_LOADED, SESSION, PREFIX, PRECISE)
LOAD_METRICS = ("requests", "kv-blocks")

# sglang_router's defaults (sgl-model-gateway/bindings/python/src/sglang_router/router_args.py)
DEFAULT_CACHE_THRESHOLD = 0.3
DEFAULT_BALANCE_ABS = 64
DEFAULT_BALANCE_REL = 1.5


@dataclasses.dataclass(frozen=True)
class RouterSettings:
    """A policy and its parameters (the CLI's --router, --load-metric, --cache-threshold, --balance-*)."""

    policy: str
    load_metric: str = "requests"  # least-loaded: "requests" (running + waiting) or "kv-blocks" (share of the pool)
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD  # prefix-aware: match share above which the best match wins
    balance_abs_threshold: int = DEFAULT_BALANCE_ABS  # prefix-aware, precise: loads imbalanced if max - min > this
    balance_rel_threshold: float = DEFAULT_BALANCE_REL  # ... and max > this x min


def parse_policies(text: str) -> list[str]:
    """'round-robin,precise' or 'all' -> the policies, in the order given (no duplicates)."""
    if text.strip() == "all":
        return list(POLICIES)
    out: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name not in POLICIES:
            raise UsageError(
                f"unknown router policy {name!r}", where="--router", tip=f"one of {', '.join(POLICIES)}, or all"
            )
        if name not in out:
            out.append(name)
    return out


class FleetView:
    """What a router may read of the replicas: loads, pool use and (precise) their cached blocks, at the time of
    the arrival being routed."""

    __slots__ = ("engines",)

    def __init__(self, engines: Sequence[Any]):
        self.engines = engines

    def load(self, i: int) -> int:
        """Requests in flight on replica i: running + waiting (what a proxying router counts)."""
        e = self.engines[i]
        return len(e.running) + len(e.waiting)

    def kv_share(self, i: int) -> float:
        """Share of replica i's usable blocks held by requests."""
        e = self.engines[i]
        return e.used / max(e.cfg.num_blocks - 1, 1)

    def cached_blocks(self, i: int, keys: Sequence[int], limit: int) -> int:
        """The prefix hit replica i's cache would give now: consecutive cached blocks among the first ``limit``."""
        cached = self.engines[i].pool.cached
        return sum(1 for _ in takewhile(cached.__contains__, islice(keys, limit)))


class Router(Protocol):
    needs_state: bool

    def choose(self, r: int, keys: list[int], limit: int, prompt_tokens: int, candidates: list[int]) -> int:
        """The replica (one of ``candidates``, ascending) for request r with shareable block keys ``keys``
        (``limit``: the blocks a hit may cover)."""
        ...


class RoundRobin:
    needs_state = False

    def __init__(self, replicas: int):
        self.n = replicas
        self.next = 0

    def choose(self, r, keys, limit, prompt_tokens, candidates):
        return self.turn(candidates)

    def turn(self, candidates: list[int]) -> int:
        i = self.next
        if len(candidates) < self.n:
            while i not in candidates:
                i = (i + 1) % self.n
        self.next = (i + 1) % self.n
        return i


class LeastLoaded:
    needs_state = True

    def __init__(self, view: FleetView, metric: str):
        self.view = view
        self.metric = metric

    def choose(self, r, keys, limit, prompt_tokens, candidates):
        view = self.view
        if self.metric == "kv-blocks":
            return min(candidates, key=lambda i: (view.kv_share(i), view.load(i), i))
        return min(candidates, key=lambda i: (view.load(i), i))


class SessionAffinity:
    needs_state = False

    def __init__(self, replicas: int, sessions: Sequence[Any] | None):
        self.turns = RoundRobin(replicas)
        self.sessions = sessions
        self.home: dict[Any, int] = {}

    def choose(self, r, keys, limit, prompt_tokens, candidates):
        session = self.sessions[r] if self.sessions is not None else None
        if session is None:
            return self.turns.turn(candidates)
        home = self.home.get(session)
        if home is None or home not in candidates:
            home = self.turns.turn(candidates)
            self.home.setdefault(session, home)
        return home


def _imbalanced(loads: list[int], settings: RouterSettings) -> bool:
    """SGLang's rule: max - min above the absolute threshold and max above the relative one times min."""
    hi, lo = max(loads), min(loads)
    return hi - lo > settings.balance_abs_threshold and hi > settings.balance_rel_threshold * lo


class PrefixAware:
    """The approximate tree: block key -> bit mask of the replicas it was routed to (a chained key names its whole
    prefix, so a dict over keys is the trie), and each replica's tree size in blocks."""

    needs_state = True

    def __init__(self, view: FleetView, replicas: int, block_size: int, settings: RouterSettings):
        self.view = view
        self.b = block_size
        self.settings = settings
        self.tree: dict[int, int] = {}
        self.size = [0] * replicas

    def match(self, keys: list[int], candidates: list[int]) -> tuple[int, int]:
        """(blocks matched, bit mask of the candidates matching that far)."""
        mask = 0
        for i in candidates:
            mask |= 1 << i
        tree = self.tree
        depth = 0
        for k in keys:
            m = mask & tree.get(k, 0)
            if not m:
                break
            mask = m
            depth += 1
        return depth, mask

    def choose(self, r, keys, limit, prompt_tokens, candidates):
        view = self.view
        loads = [view.load(i) for i in candidates]
        if _imbalanced(loads, self.settings):
            best = min(loads)
            chosen = candidates[loads.index(best)]
        else:
            depth, mask = self.match(keys, candidates)
            if prompt_tokens and depth * self.b / prompt_tokens > self.settings.cache_threshold:
                chosen = min((i for i in candidates if mask >> i & 1), key=lambda i: (view.load(i), i))
            else:
                chosen = min(candidates, key=lambda i: (self.size[i], i))
        self.insert(keys, chosen)
        return chosen

    def insert(self, keys: list[int], i: int) -> None:
        bit = 1 << i
        tree = self.tree
        grown = 0
        for k in keys:
            m = tree.get(k, 0)
            if not m & bit:
                tree[k] = m | bit
                grown += 1
        self.size[i] += grown


class Precise:
    needs_state = True

    def __init__(self, view: FleetView, settings: RouterSettings):
        self.view = view
        self.settings = settings

    def choose(self, r, keys, limit, prompt_tokens, candidates):
        view = self.view
        loads = [view.load(i) for i in candidates]
        if _imbalanced(loads, self.settings):
            return candidates[loads.index(min(loads))]
        hits = [view.cached_blocks(i, keys, limit) for i in candidates] if keys and limit else [0] * len(candidates)
        best = max(hits)
        return min(
            (i for i, h in zip(candidates, hits) if h == best), key=lambda i: (view.load(i), i)
        )  # no hit anywhere: every replica ties, the least loaded wins


def make_router(settings: RouterSettings, view: FleetView, replicas: int, block_size: int, sessions) -> Router:
    p = settings.policy
    if p == ROUND_ROBIN:
        return RoundRobin(replicas)
    if p == LEAST_LOADED:
        if settings.load_metric not in LOAD_METRICS:
            raise UsageError(f"unknown load metric {settings.load_metric!r}", where="--load-metric")
        return LeastLoaded(view, settings.load_metric)
    if p == SESSION:
        return SessionAffinity(replicas, sessions)
    if p == PREFIX:
        return PrefixAware(view, replicas, block_size, settings)
    if p == PRECISE:
        return Precise(view, settings)
    raise UsageError(f"unknown router policy {p!r}", where="--router", tip=f"one of {', '.join(POLICIES)}")
