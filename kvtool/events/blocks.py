"""Unique physical KV blocks in use over time, and block turnover, from the block_ids of an events file.

A block id listed by an allocate/append/reuse row is held by that request until a later free row of the same
request lists it, or until the request's holding interval ends (b back to 0), whichever is first; a request that
never frees it holds it to the end of the trace.  Each id's reference count is followed in event order (rows with
equal ts in file order; at one row a release before an attach); 0 -> 1 adds a physical block in use, 1 -> 0
removes one.  A reallocation is an id going 1 -> 0 and later 0 -> 1; the gap is its turnover time.

Times are positions in the global (stable) time order, so every sort here is an integer radix sort.  The steps:

1. ``_group_attaches``: the attach listings grouped by id, each id in time order (no need of b yet);
2. ``_releases``: when each attach is released - where its request's holding interval closes, or at an explicit
   free listing of the same id - once the per-request pass (running meanwhile) hands over b through ``later``;
3. ``_union_parts``: per id, the union of its hold intervals as rises (0 -> 1) and falls (1 -> 0);
4. ``_in_use_curve``: those transitions in time order as a step curve, and the turnover gaps.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kvtool.events.kernels import compiled
from kvtool.events.load import FREE, EventTable
from kvtool.events.segments import percentiles, radix_argsort

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

nan = float("nan")


@dataclasses.dataclass(frozen=True, eq=False)
class PhysicalBlocks:
    """Physical blocks (distinct ids) in use over time and their turnover."""

    unique: int  # distinct block ids listed
    peak: int
    mean: float  # time-weighted over the trace
    reallocations: int  # an id returned to the pool and later attached again
    turnover_s_p50: float
    turnover_s_p95: float
    curve_t: np.ndarray  # step curve: from each time on, curve_b blocks are in use
    curve_b: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class _Attaches:
    """Attach listings (allocate/append/reuse rows' ids), grouped by id, each id in time order."""

    ids: np.ndarray
    req: np.ndarray
    tpos: np.ndarray  # position of the row in the global time order
    grouped_by_request: bool  # grouped by (id, request) (explicit releases): not yet in time order per id


@dataclasses.dataclass(frozen=True, eq=False)
class _Transitions:
    """Rises (0 -> 1 references) and falls (1 -> 0) of each id, grouped by id, in event keys (2 x position + 1
    for an attach, 2 x position for a release: at one row a release comes first)."""

    ids: np.ndarray
    key: np.ndarray
    up: np.ndarray


def physical_blocks(table: EventTable, tpos_of_row, t_ts, t_end: float, later) -> PhysicalBlocks:
    """Physical blocks in use over time and turnover from block_ids (see the module docstring).

    ``later`` (a Future) delivers (close_tpos, close_req) from the per-request pass running meanwhile in the
    calling thread: the time-order position and request of each row that brings a request's blocks back to 0, in
    (request, time) order.  Everything that does not need them is done before waiting.
    """
    import numpy as np

    n = t_ts.size
    rows, ids = table.block_id_rows, table.block_id_values
    assert rows is not None and ids is not None  # the caller checks the column is there
    kernels = compiled()
    top = int(ids.max())
    listings = None  # (ids, request, attach, tpos) of every listing: made only where needed
    if kernels is not None and tpos_of_row is None and top < 4 * ids.size + (1 << 20):
        attaches, free_tpos = _group_attaches_compiled(kernels, table, top)
    else:
        listings = _listings(table, tpos_of_row, n, top)
        l_ids, l_req, l_attach, l_tpos = listings
        attaches = _group_attaches(l_ids, l_req, l_tpos, l_attach, tpos_of_row)
        free_tpos = l_tpos[~l_attach]
        del l_ids, l_req, l_attach, l_tpos
    unique = _distinct(ids)
    close_tpos, close_req = later.result()
    closing = np.zeros(n, dtype=bool)  # by ts position
    closing[close_tpos] = True
    explicit_rel = None
    if not bool(closing[free_tpos].all()):
        # some free row lists ids without closing its request's interval: group every listing by (id, request)
        l_ids, l_req, l_attach, l_tpos = listings or _listings(table, tpos_of_row, n, top)
        attaches, explicit_rel = _explicit_releases(l_ids, l_req, l_attach, l_tpos, tpos_of_row)
        del l_ids, l_req, l_attach, l_tpos
    del closing, free_tpos, listings
    if kernels is not None:
        if explicit_rel is None:
            rel = _close_releases(kernels, attaches, close_tpos, close_req, len(table.request_ids), n)
        else:
            rel = _releases(attaches, close_tpos, close_req, explicit_rel, n)
        return _in_use_curve_compiled(kernels, attaches, rel, t_ts, t_end, unique)
    rel = _releases(attaches, close_tpos, close_req, explicit_rel, n)
    transitions = _union_parts(attaches, rel, t_ts, n)
    return _in_use_curve(transitions, t_ts, t_end, unique)


def _listings(table: EventTable, tpos_of_row, n: int, top: int):
    """(ids, request, attach, time-order position) of every block-id listing, in file order."""
    import numpy as np

    rows = table.block_id_rows
    assert rows is not None and table.block_id_values is not None
    idx = np.int32 if n < 2**30 and top < 2**31 else np.int64
    ids = table.block_id_values.astype(idx, copy=False)
    tpos = (rows if tpos_of_row is None else tpos_of_row[rows]).astype(idx, copy=False)
    return ids, table.request[rows], table.event[rows] != FREE, tpos


def _group_attaches_compiled(kernels, table: EventTable, top: int):
    """_group_attaches (and the free listings' positions) in one compiled counting sort, for a file in time order."""
    import numpy as np

    assert table.block_id_rows is not None and table.block_id_values is not None
    m = table.block_id_values.size
    a_ids, a_req, a_tpos, free_tpos = (np.empty(m, dtype=np.int64) for _ in range(4))
    attaches, frees = kernels.group_attaches(
        np.ascontiguousarray(table.block_id_rows, dtype=np.int64),
        np.ascontiguousarray(table.block_id_values, dtype=np.int64),
        np.ascontiguousarray(table.event, dtype=np.int8),
        np.ascontiguousarray(table.request, dtype=np.int32),
        FREE,
        top,
        a_ids,
        a_req,
        a_tpos,
        free_tpos,
    )
    grouped = _Attaches(a_ids[:attaches], a_req[:attaches], a_tpos[:attaches], grouped_by_request=False)
    return grouped, free_tpos[:frees]


def _group_attaches(ids, req, tpos, attach, tpos_of_row) -> _Attaches:
    import numpy as np

    att = np.flatnonzero(attach)
    a_ids, a_req, a_tpos = ids[att], req[att], tpos[att]
    del att
    g = None if tpos_of_row is None else np.argsort(a_tpos, kind="stable")  # None: listings are in time order
    g = radix_argsort(a_ids, g)
    return _Attaches(a_ids[g], a_req[g], a_tpos[g], grouped_by_request=False)


def _releases(attaches: _Attaches, close_pos, close_req, explicit_rel, n: int):
    """The ts position at which each attach is released (n: never, it runs to the end of the trace).

    ``close_pos``/``close_req``: where (ts position) and for which request a holding interval closes, in
    (request, time) order; the first close of the attach's request after it releases it.
    """
    import numpy as np

    a_key = attaches.req.astype(np.int64) * (n + 1) + attaches.tpos
    close_key = close_req * (n + 1) + close_pos
    j = np.searchsorted(close_key, a_key, side="right")
    del a_key
    if close_pos.size:
        jj = np.minimum(j, close_pos.size - 1)
        found = (j < close_pos.size) & (close_req[jj] == attaches.req)
        rel = np.where(found, close_pos[jj], n).astype(np.int64)
    else:
        rel = np.full(attaches.ids.size, n, dtype=np.int64)
    if explicit_rel is not None:
        np.minimum(rel, explicit_rel, out=rel)
    return rel


def _union_parts(attaches: _Attaches, rel, t_ts, n: int) -> _Transitions:
    """Each id is in use while any of its holds [attach, release) covers the time: the union of those intervals.

    A hold that starts after every earlier hold of its id has ended starts a new part of the union (a rise); the
    part ends at the largest release seen so far (a fall; none when it runs to the end of the trace).
    """
    import numpy as np

    keep = (rel == n) | (t_ts[np.minimum(rel, n - 1)] > t_ts[attaches.tpos])  # a zero-length hold changes nothing
    a_ids, a_tpos, rel = attaches.ids[keep], attaches.tpos[keep], rel[keep]
    if attaches.grouped_by_request:  # put each id's holds in time order
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
    part = np.flatnonzero(rise)
    del rise, new_id
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
    return _Transitions(tr_id, tr_key, tr_up)


def _in_use_curve(tr: _Transitions, t_ts, t_end: float, unique: int) -> PhysicalBlocks:
    import numpy as np

    tr_t = t_ts[tr.key >> 1]  # key // 2: the ts position
    gap = (tr.ids[1:] == tr.ids[:-1]) & ~tr.up[:-1] & tr.up[1:]
    turnover = (tr_t[1:] - tr_t[:-1])[gap]
    oo = radix_argsort(tr.key)
    ct = tr_t[oo]
    cb = np.cumsum(np.where(tr.up[oo], 1, -1))
    del oo
    end_mask = np.r_[ct[1:] != ct[:-1], True] if ct.size else np.zeros(0, bool)
    return _physical_figures(ct[end_mask], cb[end_mask], turnover, t_ts, t_end, unique)


def _physical_figures(ct, cb, turnover, t_ts, t_end: float, unique: int) -> PhysicalBlocks:
    """Peak, time-weighted mean and turnover percentiles from the in-use step curve (ct, cb)."""
    import numpy as np

    duration = t_end - float(t_ts[0])
    integral = float((cb[:-1] * np.diff(ct)).sum() + (cb[-1] * (t_end - ct[-1]) if ct.size else 0.0))
    tp = percentiles(turnover)
    return PhysicalBlocks(
        unique=unique,
        peak=int(cb.max()) if cb.size else 0,
        mean=integral / duration if duration > 0 else nan,
        reallocations=int(turnover.size),
        turnover_s_p50=tp[0],
        turnover_s_p95=tp[1],
        curve_t=ct,
        curve_b=cb,
    )


def _close_releases(kernels, attaches: _Attaches, close_tpos, close_req, n_req: int, n: int):
    """_releases without explicit releases, compiled: the first close of each attach's request after it."""
    import numpy as np

    close_start = np.zeros(n_req + 1, dtype=np.int64)
    np.cumsum(np.bincount(close_req, minlength=n_req), out=close_start[1:])
    rel = np.empty(attaches.ids.size, dtype=np.int64)
    kernels.close_releases(
        np.ascontiguousarray(attaches.req, dtype=np.int64),
        np.ascontiguousarray(attaches.tpos, dtype=np.int64),
        np.ascontiguousarray(close_tpos, dtype=np.int64),
        close_start,
        n,
        rel,
    )
    return rel


def _in_use_curve_compiled(kernels, attaches: _Attaches, rel, t_ts, t_end: float, unique: int) -> PhysicalBlocks:
    """_union_parts and _in_use_curve as one compiled pass over the attaches grouped by id (see _kernels.c)."""
    import numpy as np

    a_ids, a_tpos = attaches.ids, attaches.tpos
    if attaches.grouped_by_request:  # put each id's holds in time order
        o = np.lexsort((a_tpos, a_ids))
        a_ids, a_tpos, rel = a_ids[o], a_tpos[o], rel[o]
        del o
    most = min(t_ts.size, 2 * a_ids.size)  # a point is a distinct ts with a rise or a fall
    point_pos = np.empty(most, dtype=np.int64)
    point_in_use = np.empty(most, dtype=np.int64)
    turnover = np.empty(a_ids.size)
    points, turnovers = kernels.union_curve(
        np.ascontiguousarray(a_ids, dtype=np.int64),
        np.ascontiguousarray(a_tpos, dtype=np.int64),
        np.ascontiguousarray(rel, dtype=np.int64),
        np.ascontiguousarray(t_ts, dtype=np.float64),
        point_pos,
        point_in_use,
        turnover,
    )
    return _physical_figures(
        t_ts[point_pos[:points]], point_in_use[:points].copy(), turnover[:turnovers], t_ts, t_end, unique
    )


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


def _explicit_releases(ids, req, attach, tpos, tpos_of_row) -> tuple[_Attaches, Any]:
    """Group every listing by (id, request), each group in time order.

    Returns the attaches in that order and the explicit release of each (the ts position of the next listing of
    its group when that is a free row, else the largest int64).
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
    return _Attaches(s_ids[a], s_req[a], s_tpos[a], grouped_by_request=True), rel
