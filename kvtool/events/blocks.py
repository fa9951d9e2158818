"""Unique physical KV blocks in use over time, and block turnover, from the block_ids of an events file."""

from __future__ import annotations

from kvtool.events.load import FREE, EventTable
from kvtool.events.segments import percentiles, radix_argsort

nan = float("nan")


def physical_blocks(table: EventTable, tpos_of_row, t_ts, t_end, later):
    """Unique physical blocks in use over time, and block turnover, from block_ids.

    A block id listed by an allocate/append/reuse row is held by that request until a later free row of the
    same request lists it, or until the request's holding interval ends (b back to 0), whichever is first; a
    request that never frees it holds it to the end of the trace.  Each id's reference count is followed in
    event order (rows with equal ts in file order; at one row a release before an attach); 0 -> 1 adds a
    physical block in use, 1 -> 0 removes one.  A reallocation is an id going 1 -> 0 and later 0 -> 1; the gap
    is its turnover time.

    Times are positions in the global (stable) time order, so every sort here is an integer radix sort.
    The grouping of listings runs first; ``later`` (a Future) then delivers (q, starts, b, bp) from the
    per-request pass running meanwhile in the calling thread.
    """
    import numpy as np

    n = t_ts.size
    rows, ids = table.block_id_rows, table.block_id_values
    small = n < 2**30 and int(ids.max()) < 2**31
    idx = np.int32 if small else np.int64
    ids = ids.astype(idx, copy=False)
    tpos = (rows if tpos_of_row is None else tpos_of_row[rows]).astype(idx, copy=False)
    req = table.request[rows]
    attach = table.event[rows] != FREE
    # Usually every free row that lists ids also ends its request's holding interval (b back to 0): then a
    # listed id is released exactly where the interval closes, and only the attaches need grouping, by id
    # alone.  That is checked once b is known; otherwise every listing is grouped by (id, request).
    att = np.flatnonzero(attach)
    a_ids, a_req, a_tpos = ids[att], req[att], tpos[att]
    del att
    g = None if tpos_of_row is None else np.argsort(a_tpos, kind="stable")  # None: listings are in time order
    g = radix_argsort(a_ids, g)
    a_ids, a_req, a_tpos = a_ids[g], a_req[g], a_tpos[g]  # attaches by id, each id in time order
    del g
    # what does not need b is done before waiting for it
    a_key, a_t = a_req.astype(np.int64) * (n + 1) + a_tpos, t_ts[a_tpos]  # (request, ts position) key; time
    unique = _distinct(ids)
    free_tpos = tpos[~attach]
    # where each request's holding intervals close (b back to 0), as (request, ts position) keys
    q, starts, b, bp = later.result()
    close = np.flatnonzero((b == 0) & (bp > 0))
    del b, bp
    closing = np.zeros(n, dtype=bool)  # by ts position
    closing[q[close]] = True
    only_closing_frees = bool(closing[free_tpos].all())
    del closing, free_tpos
    if not only_closing_frees:
        a_ids, a_req, a_tpos, explicit_rel = _explicit_releases(ids, req, attach, tpos, tpos_of_row)
        a_key, a_t = a_req.astype(np.int64) * (n + 1) + a_tpos, t_ts[a_tpos]
    close_req = np.searchsorted(starts, close, side="right") - 1
    close_key = close_req * (n + 1) + q[close]
    j = np.searchsorted(close_key, a_key, side="right")
    del a_key
    jj = np.minimum(j, max(close.size - 1, 0))
    found = (j < close.size) & (close_req[jj] == a_req) if close.size else np.zeros(a_ids.size, bool)
    rel = np.where(found, q[close[jj]] if close.size else n, n).astype(np.int64)  # n: never released
    if not only_closing_frees:
        np.minimum(rel, explicit_rel, out=rel)
        del explicit_rel
    keep = (rel == n) | (t_ts[np.minimum(rel, n - 1)] > a_t)  # a zero-length hold changes nothing
    del a_t
    a_ids, a_tpos, rel = a_ids[keep], a_tpos[keep], rel[keep]
    # Each id is in use while any of its holds [attach, release) covers the time: the union of those intervals,
    # in event keys (attach at 2 x position + 1, release at 2 x position, so at one row a release comes first;
    # never released: 2n).  A hold that starts after every earlier hold of its id has ended starts a new part
    # of the union (a rise, 0 -> 1 references); the part ends at the largest release seen so far (a fall).
    if not only_closing_frees:  # grouped by (id, request): put each id's holds in time order
        if int(a_ids.max(initial=0)) < (1 << 62) // (n + 1):
            o = np.argsort(a_ids.astype(np.int64) * (n + 1) + a_tpos, kind="stable")  # nearly sorted: timsort
        else:  # pragma: no cover - ids beyond 2**62 / n
            o = np.lexsort((a_tpos, a_ids))
        a_ids, a_tpos, rel = a_ids[o], a_tpos[o], rel[o]
        del o
    m = a_ids.size
    new_id = np.ones(m, dtype=bool)
    np.not_equal(a_ids[1:], a_ids[:-1], out=new_id[1:])
    span = 2 * n + 2  # every key is below it
    offset = (np.cumsum(new_id) - 1) * span  # ids in increasing order: a running max never crosses into the next
    reach = np.maximum.accumulate(rel * 2 + offset) - offset  # largest release key of the id so far
    del offset
    start_key = a_tpos.astype(np.int64) * 2 + 1
    rise = new_id
    rise[1:] |= start_key[1:] > reach[:-1]
    del new_id
    part = np.flatnonzero(rise)
    del rise
    end_key = reach[np.r_[part[1:] - 1, m - 1]] if m else np.zeros(0, np.int64)
    del reach
    ends = end_key < 2 * n  # released before the end of the trace
    slots = 1 + ends.astype(np.int64)
    at = np.cumsum(slots) - slots  # position of each rise among the transitions (each followed by its fall)
    tr_id = np.empty(int(slots.sum()), dtype=a_ids.dtype)
    tr_key = np.empty(tr_id.size, dtype=np.int64)
    tr_up = np.zeros(tr_id.size, dtype=bool)
    tr_id[at], tr_key[at], tr_up[at] = a_ids[part], start_key[part], True
    tr_id[at[ends] + 1], tr_key[at[ends] + 1] = a_ids[part[ends]], end_key[ends]
    del start_key, end_key, part, ends, slots, at, rel, a_ids, a_tpos
    tr_t = t_ts[tr_key >> 1]  # key // 2: the ts position
    gap = (tr_id[1:] == tr_id[:-1]) & ~tr_up[:-1] & tr_up[1:]
    turnover = (tr_t[1:] - tr_t[:-1])[gap]
    # physical blocks in use over time
    oo = radix_argsort(tr_key)
    ct = tr_t[oo]
    cb = np.cumsum(np.where(tr_up[oo], 1, -1))
    del oo
    end_mask = np.r_[ct[1:] != ct[:-1], True] if ct.size else np.zeros(0, bool)
    ct, cb = ct[end_mask], cb[end_mask]
    duration = t_end - float(t_ts[0])
    integral = float((cb[:-1] * np.diff(ct)).sum() + (cb[-1] * (t_end - ct[-1]) if ct.size else 0.0))
    tp = percentiles(turnover)
    return {
        "unique": unique,
        "peak": int(cb.max()) if cb.size else 0,
        "mean": integral / duration if duration > 0 else nan,
        "reallocations": int(gap.sum()),
        "turnover": (tp[0], tp[1]),
        "curve_t": ct,
        "curve_b": cb,
    }


def _distinct(ids) -> int:
    """How many distinct values (non-negative integers): a bitmap when they are dense enough, else a sort."""
    import numpy as np

    if not ids.size:
        return 0
    top = int(ids.max())
    if top < 8 * ids.size + (1 << 20):
        seen = np.zeros(top + 1, dtype=bool)
        seen[ids] = True
        return int(np.count_nonzero(seen))
    return int(np.unique(ids).size)


def _explicit_releases(ids, req, attach, tpos, tpos_of_row):
    """Group every listing by (id, request), each group in time order.

    Returns the attaches in that order (ids, requests, ts positions) and the explicit release of each (the ts
    position of the next listing of its group when that is a free row, else the largest int64).
    """
    import numpy as np

    g = None if tpos_of_row is None else np.argsort(tpos, kind="stable")  # None: listings are in time order
    g = radix_argsort(req, g)
    g = radix_argsort(ids, g)
    s_ids, s_req, s_att, s_tpos = ids[g], req[g], attach[g], tpos[g]  # sorted by id
    del g
    same = (s_ids[1:] == s_ids[:-1]) & (s_req[1:] == s_req[:-1])
    a = np.flatnonzero(s_att)
    nxt = np.minimum(a + 1, s_ids.size - 1)
    explicit = (a + 1 < s_ids.size) & ~s_att[nxt] & np.r_[same, False][a]
    rel = np.full(a.size, np.iinfo(np.int64).max, dtype=np.int64)
    rel[explicit] = s_tpos[nxt[explicit]]
    return s_ids[a], s_req[a], s_tpos[a], rel
