"""Why each request did or did not hit the prefix cache, and how full the blocks of each KV-cache group are.

Per request, with its prompt of ``n`` tokens and the cacheable unit ``U`` (:func:`cacheable_unit_tokens`):

- ``shared`` s: the longest common token prefix of the prompt with any earlier request's prompt (in submission order);
  0 when no earlier prompt starts with the same token;
- ``cacheable`` c = floor(min(s, n - 1) / U) x U: the shared tokens vLLM could serve from its cache.  Only whole
  blocks are cached (``BlockPool.cache_full_blocks``) and the last prompt token is always computed
  (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = request.num_tokens - 1``);
- ``hit`` h: the tokens vLLM served from the cache at the request's first admission (``num_cached_tokens``; the
  recorder's ``reuse`` row).

- ``reachable`` r (models with a sliding-window group only): the longest of those shared whole blocks whose end the
  sliding-window group kept.  vLLM 0.32 (``prefix_cache_retention_interval`` 0, its default) caches in such a
  group only the ``cdiv(window - 1, block)`` blocks that end at an earlier prompt's own last-block boundary
  floor((n' - 1) / block) x block (:func:`window_kept_boundary`), so r is the largest such boundary of an earlier
  prompt that is at most min(its common prefix with this one, n - 1); c for a full-attention model.

Outcome (one per request), from those block boundaries:

- ``hit``: h > 0;
- ``unshared``: h = 0 and s = 0: no earlier prompt starts like this one;
- ``too_short``: h = 0, s > 0 and c = 0: the shared prefix ends before the first unit boundary (or it is the whole
  prompt of one unit and the last token must be computed anyway);
- ``window``: h = 0, c > 0 and r = 0: whole blocks were shared, but no earlier prompt ended where this one's hit
  would end, so the sliding-window group never kept the blocks a hit needs (the seed's trailing whitespace
  followed by more text, on a sliding-window or hybrid model);
- ``evicted``: h = 0 and r > 0: the blocks a hit needed had been cached, yet none hit: they were evicted before
  reuse (on a sliding-window group: freed as they left the earlier request's window, then evicted).  vLLM's KV
  events name the group whose blocks were removed (:attr:`RequestOutcome.evidence`).

Prompt tokens lost, per request (they add up to ``n``): ``hit_tokens`` h; ``evicted_tokens`` r - h (reachable, not
hit: also a partial hit's missing blocks); ``window_tokens`` c - r; ``too_short_tokens`` s - c (shared tokens past
the last whole unit); ``unshared_tokens`` n - s.  An observed hit longer than the prompts show as shared (an earlier
request's generated tokens, which the prompts do not carry) counts as shared and reachable: s, c and r are raised
to h.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

HIT, UNSHARED, TOO_SHORT, WINDOW, EVICTED = "hit", "unshared", "too_short", "window", "evicted"
OUTCOMES = (HIT, UNSHARED, TOO_SHORT, WINDOW, EVICTED)
OUTCOME_WORDS = {
    HIT: "hit",
    UNSHARED: "unshared prefix",
    TOO_SHORT: "shared, shorter than the cacheable unit",
    WINDOW: "shared, not kept by the sliding window",
    EVICTED: "evicted before reuse",
}


@dataclasses.dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group of the engine (vLLM's ``kv_cache_config.kv_cache_groups``)."""

    index: int
    kind: str  # the spec class: FullAttentionSpec, SlidingWindowSpec, ...
    block_size_tokens: int
    sliding_window_tokens: int | None  # None: not a sliding window (or not recorded: files before issue 28)


def cacheable_unit_tokens(groups: Sequence[CacheGroup]) -> int:
    """The shortest prefix vLLM can serve from its cache: a block of every group at once (their lcm).

    A sliding window does not lengthen it: a run of cached blocks that starts at block 0 is a hit even when it is
    shorter than the window (``SlidingWindowManager.find_longest_cache_hit``, vLLM 0.32).  Kept small on purpose:
    ``kvtool estimate``'s minimum cacheable prefix can replace it.
    """
    return math.lcm(*(g.block_size_tokens for g in groups)) if groups else 0


def sliding_groups(groups: Sequence[CacheGroup]) -> tuple[CacheGroup, ...]:
    return tuple(g for g in groups if g.sliding_window_tokens)


def window_kept_boundary(prompt_tokens: int, block_size_tokens: int) -> int:
    """The one hit boundary (tokens) a sliding-window group keeps blocks for after a prompt, in vLLM 0.32.

    ``KVCacheCoordinator.cache_blocks`` passes ``replay_boundaries(num_prompt_tokens, ...)`` = (n - 1,) and
    ``SlidingWindowManager.reachable_block_mask`` with ``prefix_cache_retention_interval`` 0 (the default of
    ``vllm/config/cache.py``) marks only the ``cdiv(window - 1, block)`` blocks ending at floor((n - 1) / block)
    (``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``, vLLM 0.32.0).
    """
    return (prompt_tokens - 1) // block_size_tokens * block_size_tokens


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """A request as its driver knew it: id, prompt token ids, and vLLM's ``num_cached_tokens`` when known."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    num_cached_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    request_id: str
    prompt_tokens: int
    shared_tokens: int  # longest common prefix with an earlier prompt (raised to hit_tokens when shorter)
    shared_with: str | None  # the earlier request sharing it (the first one with that length)
    cacheable_tokens: int  # floor(min(shared, prompt - 1) / unit) x unit
    reachable_tokens: int  # of those, what the sliding-window group kept (= cacheable without such a group)
    hit_tokens: int
    outcome: str  # one of OUTCOMES
    unshared_tokens: int  # prompt - shared
    too_short_tokens: int  # shared - cacheable
    window_tokens: int  # cacheable - reachable
    evicted_tokens: int  # reachable - hit
    evidence: str | None = None  # what the events or rows show about an eviction (which group, which blocks)


@dataclasses.dataclass(frozen=True)
class OutcomeShare:
    outcome: str
    requests: int
    lost_tokens: int  # prompt tokens of this kind (for "hit": the tokens served from the cache)
    share_of_prompt_tokens: float  # lost_tokens / all prompt tokens


@dataclasses.dataclass(frozen=True)
class GroupUtilization:
    """One KV-cache group over the recorded run, time-weighted between rows."""

    group: CacheGroup
    mean_blocks_held: float  # distinct block ids held by running requests
    mean_slots_held: float  # mean_blocks_held x block size
    mean_slots_written: float  # of those, slots holding a token (held slots minus each request's unfilled tail)
    effective_utilization: float | None  # mean_slots_written / mean_slots_held (None: nothing held)


@dataclasses.dataclass(frozen=True)
class PrefixReport:
    source: str
    unit_tokens: int
    groups: tuple[CacheGroup, ...]
    requests: tuple[RequestOutcome, ...]
    shares: tuple[OutcomeShare, ...]  # one per outcome, in OUTCOMES order
    utilization: tuple[GroupUtilization, ...]  # empty for vLLM's KV events (they carry no held blocks)
    vllm_usage_mean: float | None  # vLLM's gauge 1 - free / (blocks - 1), time-weighted over the same rows
    vllm_usage_peak: float | None
    notes: tuple[str, ...] = ()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def classify(
    request_id: str,
    prompt_tokens: int,
    shared_tokens: int,
    hit_tokens: int,
    unit_tokens: int,
    shared_with: str | None = None,
    reachable_tokens: int | None = None,
    evidence: str | None = None,
) -> RequestOutcome:
    """One request's outcome and lost tokens (module docstring); ``reachable_tokens`` None: no sliding window."""
    shared = max(shared_tokens, hit_tokens)
    cacheable = (min(shared, prompt_tokens - 1) // unit_tokens) * unit_tokens if unit_tokens > 0 else 0
    cacheable = max(cacheable, hit_tokens)
    reachable = cacheable if reachable_tokens is None else max(min(reachable_tokens, cacheable), hit_tokens)
    if hit_tokens > 0:
        outcome = HIT
    elif shared == 0:
        outcome = UNSHARED
    elif cacheable == 0:
        outcome = TOO_SHORT
    elif reachable == 0:
        outcome = WINDOW
    else:
        outcome = EVICTED
    return RequestOutcome(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        shared_tokens=shared,
        shared_with=shared_with,
        cacheable_tokens=cacheable,
        reachable_tokens=reachable,
        hit_tokens=hit_tokens,
        outcome=outcome,
        unshared_tokens=prompt_tokens - shared,
        too_short_tokens=shared - cacheable,
        window_tokens=cacheable - reachable,
        evicted_tokens=reachable - hit_tokens,
        evidence=evidence if reachable > hit_tokens or cacheable > reachable else None,
    )


def reachable_prefixes(prompts: Sequence[PromptRecord], groups: Sequence[CacheGroup]) -> list[int | None]:
    """Per prompt, the longest shared prefix the sliding-window groups kept (None: the model has no such group)."""
    windows = sliding_groups(groups)
    if not windows:
        return [None] * len(prompts)
    block = math.lcm(*(g.block_size_tokens for g in windows))
    out: list[int | None] = []
    for i, p in enumerate(prompts):
        limit = len(p.prompt_token_ids) - 1
        best = 0
        for q in prompts[:i]:
            kept = window_kept_boundary(len(q.prompt_token_ids), block)
            if kept > best and kept <= min(common_prefix(p.prompt_token_ids, q.prompt_token_ids), limit):
                best = kept
        out.append(best)
    return out


def shared_prefixes(prompts: Sequence[PromptRecord]) -> list[tuple[int, str | None]]:
    """Per prompt, (longest common prefix with an earlier prompt, the earlier request's id)."""
    out: list[tuple[int, str | None]] = []
    for i, p in enumerate(prompts):
        best, who = 0, None
        for q in prompts[:i]:
            n = common_prefix(p.prompt_token_ids, q.prompt_token_ids)
            if n > best:
                best, who = n, q.request_id
        out.append((best, who))
    return out


def outcome_shares(requests: Iterable[RequestOutcome]) -> tuple[OutcomeShare, ...]:
    requests = tuple(requests)
    total = sum(r.prompt_tokens for r in requests)
    field = {
        HIT: "hit_tokens",
        UNSHARED: "unshared_tokens",
        TOO_SHORT: "too_short_tokens",
        WINDOW: "window_tokens",
        EVICTED: "evicted_tokens",
    }
    shares = []
    for outcome in OUTCOMES:
        tokens = sum(getattr(r, field[outcome]) for r in requests)
        shares.append(
            OutcomeShare(
                outcome=outcome,
                requests=sum(1 for r in requests if r.outcome == outcome),
                lost_tokens=tokens,
                share_of_prompt_tokens=tokens / total if total else 0.0,
            )
        )
    return tuple(shares)
