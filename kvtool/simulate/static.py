"""The static block-size comparison of `kvtool simulate`: what a length distribution costs in a paged KV cache.

For final lengths L (prompt + output tokens) and block size b, a request holds ceil(L/b) blocks.  Everything here
is a closed form over the length array, vectorised with numpy (imported inside the functions).

With a model (--model / --config) whose layers form several KV-cache groups, or one that is not full attention, each
group is also counted on its own (:class:`GroupHolding`): at its end a request holds in a sliding-window group only
the blocks its window still reads (vLLM's ``remove_skipped_blocks`` frees the others before every allocation), in a
chunked-local group the current chunk's, in a Mamba state group one state block.  The skipped tokens are the serving
simulation's own rule (``GroupKind.skipped_tokens`` of :mod:`kvtool.simulate.kv_groups`).
"""

from __future__ import annotations

import dataclasses

# Percentiles interpolate linearly between order statistics (numpy's default, the same rule as `kvtool analyze`).


@dataclasses.dataclass(frozen=True)
class GroupHolding:
    """One KV-cache group of the model, over every request at its end (final length L, block b)."""

    group: int  # vLLM's group index (the order vLLM forms them in)
    kind: str  # "full", "sliding", "chunked", "mamba"
    num_layers: int
    window_tokens: int | None  # the sliding window or the attention chunk
    blocks_held_mean: float  # blocks the request's table holds at its end: cdiv(L, b) - skipped(L) // b
    blocks_held_max: int
    slots_held: int  # sum of blocks held x b
    # tokens the next token would still read, L - skipped(L): L (full), min(L, window - 1) (sliding), L mod chunk
    # (chunked); None for a state group, whose block holds a state, not tokens
    tokens_needed: int | None
    internal_fragmentation: float | None  # empty slots after each request's last token / slots held
    outside_window_fraction: float | None  # slots holding tokens the window no longer reads (they share a block
    # with tokens it does) / slots held; 0 for full attention
    utilization: float | None  # tokens_needed / slots_held


@dataclasses.dataclass(frozen=True)
class StaticResult:
    """Block-size figures for one block size over all requests' final lengths."""

    block_size: int
    requests: int
    tokens: int  # sum of final lengths L
    allocated_slots: int  # sum of ceil(L/b) x b
    internal_fragmentation: float  # sum(ceil(L/b) x b - L) / sum(ceil(L/b) x b), a fraction
    effective_utilization: float  # 1 - internal_fragmentation: tokens / allocated slots
    mean_waste_tokens: float  # mean empty slots in a request's last block
    mean_table_entries: float  # block-table entries (blocks) per request
    p99_table_entries: float
    max_table_entries: int
    shared_prefix_tokens: int  # --shared-prefix P (0: none)
    prefix_shared_blocks: int  # floor(P/b): the full blocks of the prefix, the only shareable ones
    prefix_tail_tokens: int  # P mod b: prefix tokens duplicated in every request's own block
    prefix_saving_slots: int  # slots saved by storing the shared full blocks once
    prefix_saving_fraction: float  # prefix_saving_slots / allocated_slots
    utilization_with_prefix_sharing: float  # tokens stored once / slots after sharing
    requests_shorter_than_prefix: int  # prompts shorter than P (they share only their own full blocks)
    pool_blocks: int | None  # floor(kv_tokens / b) when a KV budget is given
    fit_at_once_p50: float | None  # requests that fit in the pool at once, over windows of consecutive requests
    fit_at_once_p99: float | None
    fit_at_once_p1: float | None  # the count that fits 99% of the time
    # What a fixed-length test at the mean length (and mean prompt, for the shared prefix) would claim, on the same
    # basis as the fit_at_once figures: its full prefix blocks stored once.
    fit_if_fixed_mean_length: int | None
    # The model's KV-cache groups counted one by one (empty: no model given, or one full-attention group, which the
    # figures above already are); groups_note: why a model's groups are not counted at this block size
    groups: tuple[GroupHolding, ...] = ()
    group_blocks_held_mean: float | None = None  # all groups together: the blocks (pages) one request holds
    groups_note: str | None = None


@dataclasses.dataclass(frozen=True)
class ContiguousBaseline:
    """Every request reserving ``max_model_len`` contiguous slots (pre-PagedAttention serving)."""

    max_model_len: int
    max_model_len_from_data: bool  # True: the default, the longest request in the data
    utilization: float  # tokens / reserved slots, over the requests that fit
    waste_fraction: float  # 1 - utilization
    requests_too_long: int  # L > max_model_len: cannot be served contiguously
    fit_at_once: int | None  # floor(kv_tokens / max_model_len) when a KV budget is given


@dataclasses.dataclass(frozen=True)
class StaticComparison:
    results: list[StaticResult]
    contiguous: ContiguousBaseline
    kv_tokens: int | None
    mean_length_tokens: float
    p99_length_tokens: float
    max_length_tokens: int
    min_length_tokens: int


# Windows evaluated for the requests-that-fit percentiles: every start when there are at most this many requests,
# else this many evenly spaced starts.
FIT_WINDOWS = 100_000


def fit_at_once(own_blocks, pool_blocks: int, max_windows: int = FIT_WINDOWS):
    """For starts i in the cyclic sequence, how many consecutive requests fit in ``pool_blocks``.

    Greedy over the requests in order: the largest k with blocks[i] + ... + blocks[i+k-1] <= pool (capped at N).
    Every start is used up to ``max_windows`` requests, else ``max_windows`` evenly spaced starts.
    """
    import numpy as np

    n = len(own_blocks)
    cum = np.concatenate([[0], np.cumsum(np.concatenate([own_blocks, own_blocks]), dtype=np.int64)])
    starts = np.arange(n) if n <= max_windows else np.linspace(0, n - 1, max_windows).astype(np.int64)
    ends = np.searchsorted(cum, cum[starts] + pool_blocks, side="right") - 1
    return np.minimum(ends - starts, n)


def _groups_at(lengths, block_size: int, model_groups) -> dict:
    """StaticResult's group fields at one block size."""
    if model_groups is None:
        return {}
    if isinstance(model_groups, str):
        return {"groups_note": model_groups}
    held = group_holdings(lengths, block_size, model_groups.specs)
    if not held:
        return {}
    return {"groups": held, "group_blocks_held_mean": sum(g.blocks_held_mean for g in held)}


def group_holdings(lengths, block_size: int, specs) -> tuple[GroupHolding, ...]:
    """Per group (:class:`~kvtool.simulate.kv_groups.GroupSpec`, vLLM's order): the blocks each request holds at its
    end and how full they are (see :class:`GroupHolding`)."""
    import numpy as np

    from kvtool.estimate.kinds import MAMBA
    from kvtool.simulate.kv_groups import kind_of

    lengths = np.asarray(lengths, dtype=np.int64)
    b = block_size
    unique, inverse = np.unique(lengths, return_inverse=True)
    blocks = (lengths + (b - 1)) // b
    out = []
    for g, spec in enumerate(specs):
        kind = kind_of(spec, b)
        skipped_u = np.fromiter((kind.skipped_tokens(int(x)) for x in unique), dtype=np.int64, count=len(unique))
        skipped = np.maximum(skipped_u[inverse], 0)
        first = skipped // b  # the first block the table still holds
        held = blocks - first
        slots = int(held.sum()) * b
        if spec.kind == MAMBA:
            needed = frag = outside = util = None
        else:
            needed = int((lengths - skipped).sum())
            stored = int((lengths - first * b).sum())  # tokens in the held blocks, stale ones included
            frag = (slots - stored) / slots
            outside = (stored - needed) / slots
            util = needed / slots
        out.append(
            GroupHolding(
                group=g,
                kind=spec.kind,
                num_layers=spec.num_layers,
                window_tokens=spec.window_tokens,
                blocks_held_mean=float(held.mean()),
                blocks_held_max=int(held.max()),
                slots_held=slots,
                tokens_needed=needed,
                internal_fragmentation=frag,
                outside_window_fraction=outside,
                utilization=util,
            )
        )
    return tuple(out)


def compare_block_sizes(
    prompt_tokens,
    output_tokens,
    block_sizes: list[int],
    *,
    shared_prefix_tokens: int = 0,
    max_model_len: int | None = None,
    kv_tokens: int | None = None,
    groups: dict | None = None,
) -> StaticComparison:
    """The static comparison for each block size (see the module docstring and docs/simulate.md).  ``groups``: per
    block size the model's :class:`~kvtool.simulate.grouped.ModelGroups`, or a string saying why there are none."""
    import numpy as np

    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    lengths = prompt + np.asarray(output_tokens, dtype=np.int64)
    n = len(lengths)
    total = int(lengths.sum())
    prefix_part = np.minimum(prompt, shared_prefix_tokens) if shared_prefix_tokens else None
    shorter = int((prompt < shared_prefix_tokens).sum()) if shared_prefix_tokens else 0
    # p99 of ceil(L/b) from the two order statistics of L around the 99th percentile: ceil(x/b) is monotone, so
    # the order statistics of the block counts are those of the lengths divided up (one partition for all b).
    pos = 0.99 * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    part = np.partition(lengths, [lo, hi])
    l_lo, l_hi, frac = int(part[lo]), int(part[hi]), pos - lo
    results = []
    for b in block_sizes:
        blocks = (lengths + (b - 1)) // b
        slots = int(blocks.sum()) * b
        waste = slots - total
        if prefix_part is not None:
            shared = prefix_part // b  # full prefix blocks of each request
            saving_blocks = int(shared.sum()) - int(shared.max())  # stored once instead of per request
            own = blocks - shared
            shared_once = int(shared.max())
        else:
            saving_blocks, own, shared_once = 0, blocks, 0
        saving_slots = saving_blocks * b
        fit = None
        pool = None
        if kv_tokens is not None:
            pool = kv_tokens // b
            counts = fit_at_once(own, max(pool - shared_once, 0))
            fit = np.percentile(counts, [50, 99, 1])
        mean_len = total / n
        if pool is not None:
            fixed_blocks = -(-round(mean_len) // b)
            fixed_shared = min(round(float(prompt.mean())), shared_prefix_tokens) // b
            fixed_claim = max(pool - fixed_shared, 0) // max(fixed_blocks - fixed_shared, 1)
        results.append(
            StaticResult(
                block_size=b,
                requests=n,
                tokens=total,
                allocated_slots=slots,
                internal_fragmentation=waste / slots,
                effective_utilization=total / slots,
                mean_waste_tokens=waste / n,
                mean_table_entries=float(blocks.mean()),
                p99_table_entries=float(-(-l_lo // b) + frac * (-(-l_hi // b) - -(-l_lo // b))),
                max_table_entries=int(blocks.max()),
                shared_prefix_tokens=shared_prefix_tokens,
                prefix_shared_blocks=shared_prefix_tokens // b,
                prefix_tail_tokens=shared_prefix_tokens % b,
                prefix_saving_slots=saving_slots,
                prefix_saving_fraction=saving_slots / slots,
                utilization_with_prefix_sharing=(total - saving_slots) / (slots - saving_slots),
                requests_shorter_than_prefix=shorter,
                pool_blocks=pool,
                fit_at_once_p50=None if fit is None else float(fit[0]),
                fit_at_once_p99=None if fit is None else float(fit[1]),
                fit_at_once_p1=None if fit is None else float(fit[2]),
                fit_if_fixed_mean_length=None if pool is None else int(fixed_claim),
                **_groups_at(lengths, b, (groups or {}).get(b)),
            )
        )
    from_data = max_model_len is None
    m = int(lengths.max()) if max_model_len is None else int(max_model_len)
    fits = lengths <= m
    served = int(fits.sum())
    util = float(lengths[fits].sum()) / (served * m) if served else float("nan")
    contiguous = ContiguousBaseline(
        max_model_len=m,
        max_model_len_from_data=from_data,
        utilization=util,
        waste_fraction=1.0 - util,
        requests_too_long=n - served,
        fit_at_once=None if kv_tokens is None else kv_tokens // m,
    )
    return StaticComparison(
        results=results,
        contiguous=contiguous,
        kv_tokens=kv_tokens,
        mean_length_tokens=total / n,
        p99_length_tokens=float(np.percentile(lengths, 99)),
        max_length_tokens=int(lengths.max()),
        min_length_tokens=int(lengths.min()),
    )
