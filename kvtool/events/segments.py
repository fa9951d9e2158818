"""Vectorised helpers over rows grouped in contiguous segments (one per request, or per block id).

numpy only, no Python loop over rows: a stable radix argsort, a segmented cumulative sum, a running sum clamped
at zero per segment, linearly interpolated percentiles (continuous quantities) and nearest-rank ones
(discrete quantities).
"""

from __future__ import annotations

import math

PERCENTILES = (50, 95, 99)
nan = float("nan")


def radix_argsort(keys, perm=None):
    """Stable argsort of non-negative integer keys as LSD radix passes of 16 bits (or one compiled counting sort).

    numpy's stable sort of uint16 is a radix sort, several times faster than a comparison sort; ``perm``
    (an order to refine, e.g. a time order) is kept for equal keys.
    """
    import numpy as np

    from kvtool.events.kernels import counting_argsort

    top = int(keys.max()) if keys.size else 0
    if top < 4 * keys.size + (1 << 20):  # a counting sort where the key range is small (compiled)
        counted = counting_argsort(keys, top + 1, perm)
        if counted is not None:
            return counted
    shift = 0
    while True:
        digit = np.uint8 if top >> shift < 256 else np.uint16  # a last digit of <= 8 bits sorts twice as fast
        part = (keys >> shift if shift else keys).astype(digit)  # the cast keeps the digit's low bits
        if perm is None:  # first pass without a prior order: no gather needed
            perm = np.argsort(part, kind="stable")
        else:  # gather the narrow digits, not the keys
            perm = perm[np.argsort(part[perm], kind="stable")]
        del part
        shift += 16
        if top >> shift == 0:
            return perm


def inverse_permutation(perm):
    import numpy as np

    dtype = np.int32 if perm.size < 2**31 else np.int64
    inv = np.empty(perm.size, dtype=dtype)
    inv[perm] = np.arange(perm.size, dtype=dtype)
    return inv


def segment_cumsum(values, starts, inplace: bool = False):
    """Cumulative sum restarting at each segment start (segments cover the array in order), in values' dtype.

    Each segment start subtracts the previous segment's total, so one cumulative sum does all segments (the
    caller picks a dtype wide enough for the total of all values).
    """
    import numpy as np

    y = values if inplace else values.copy()
    if starts.size > 1:
        totals = np.add.reduceat(y, starts)
        y[starts[1:]] -= totals[:-1]
    return np.cumsum(y, out=y)


def clamp_at_zero(s, starts, lengths):
    """Running sums clamped at 0 from below, per segment: b_i = S_i - min(0, min_{j<=i} S_j) (Skorokhod).

    Only segments that go negative are touched; their running minimum is taken over ranks offset per
    segment, so one ``minimum.accumulate`` handles them all without mixing segments.
    """
    import numpy as np

    seg_min = np.minimum.reduceat(s, starts)
    bad_seg = seg_min < 0
    rows = np.repeat(bad_seg, lengths)
    sub = s[rows]
    sub_starts = np.r_[0, np.cumsum(lengths[bad_seg])[:-1]]
    group = np.zeros(sub.size, dtype=np.int64)
    group[sub_starts[1:]] = 1
    group = np.cumsum(group)
    sort = np.argsort(sub, kind="stable")
    rank = np.empty(sub.size, dtype=np.int64)
    rank[sort] = np.arange(sub.size)
    span = sub.size + 1
    running = np.minimum.accumulate(rank - group * span) + group * span
    running_min = sub[sort][running]
    out = s.copy()
    out[rows] = sub - np.minimum(running_min, 0)
    return out


def percentiles(values) -> tuple[float, float, float, float]:
    """p50, p95, p99 (linear interpolation, numpy's default) and max; NaN for an empty sample."""
    import numpy as np

    if not values.size:
        return nan, nan, nan, nan
    p = np.percentile(values, PERCENTILES)
    return float(p[0]), float(p[1]), float(p[2]), float(values.max())


def nearest_rank(values, q: float) -> float:
    """The q-th percentile by nearest rank: the smallest value with at least q % of the sample at or below it.

    For discrete quantities (token counts, block counts) this is a value that occurred, never an interpolation
    between two: for [0, 0, 16, 512] p50 = 0 and p90 = 512.  NaN for an empty sample.
    """
    import numpy as np

    n = int(values.size)
    if not n:
        return nan
    rank = min(n, max(1, math.ceil(q * n / 100.0 - 1e-9)))  # the guard: 90 x 10 / 100 is 9, not 9.000...01
    return float(np.partition(values, rank - 1)[rank - 1])


def thin_step_curve(t, v, w, max_points: int):
    """A step curve kept to at most ``max_points`` buckets, each showing its maximum (so peaks stay visible).

    ``w`` is a second curve on the same times (or None).  Thinning a thinned curve changes nothing.
    """
    import numpy as np

    if t.size <= max_points:
        return t, v, w
    starts = np.linspace(0, t.size, max_points + 1).astype(np.int64)[:-1]
    return t[starts], np.maximum.reduceat(v, starts), None if w is None else np.maximum.reduceat(w, starts)
