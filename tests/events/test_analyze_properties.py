"""Invariants of `kvtool analyze` with hypothesis, and a plain-Python reference implementation.

The reference walks each request's events one by one, exactly as docs/analyze.md defines b(t), n(t), holding
time, block-seconds and utilization; the vectorised analysis must agree with it on random traces.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool.core.errors import KvtoolError
from kvtool.events.analysis import analyze_events
from kvtool.events.load import load_events

EVENTS = ("allocate", "append", "reuse", "free")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _write(text: str | bytes, suffix: str = ".csv") -> str:
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)
    return path


def _analyze_text(text: str, block_size: int = 16):
    path = _write(text)
    try:
        return analyze_events(load_events(path, default_block_size=block_size))
    finally:
        os.unlink(path)


def reference(rows, block_size):
    """Per-request (holding, block_seconds, token_seconds, leaked_blocks, preemptions) by walking events."""
    t_end = max(r[0] for r in rows)
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # Python's sort is stable: file order at ties
    out = {}
    by_req: dict[str, list] = {}
    for i in order:
        by_req.setdefault(rows[i][2], []).append(rows[i])
    for req, evs in by_req.items():
        b = run = 0
        hold = bsec = tsec = 0.0
        ups = 0
        for k, (ts, ev, _, nb, nt) in enumerate(evs):
            before = b
            if before == 0:
                run = 0  # a new holding interval: the token sum restarts
            if ev == "free":
                b = max(0, b - nb)
            else:
                b += nb
                run += nt
            if before == 0 and b > 0:
                ups += 1
            n = min(run, b * block_size)
            nxt = evs[k + 1][0] if k + 1 < len(evs) else t_end
            dt = nxt - ts
            if b > 0:
                hold += dt
            bsec += b * dt
            tsec += n * dt
        out[req] = (hold, bsec, tsec, b, max(ups - 1, 0))
    return out


@st.composite
def traces(draw, all_freed: bool = False):
    n_req = draw(st.integers(1, 6))
    rows = []
    for r in range(n_req):
        t = draw(st.integers(0, 20))
        held = 0
        for _ in range(draw(st.integers(1, 8))):
            ev = draw(st.sampled_from(EVENTS))
            nb = draw(st.integers(0, 4))
            nt = draw(st.integers(0, 70))
            rows.append((float(t), ev, f"r{r}", nb, nt))
            held = max(0, held - nb) if ev == "free" else held + nb
            t += draw(st.integers(0, 3))  # repeated timestamps on purpose
        if all_freed and held:
            rows.append((float(t), "free", f"r{r}", held, 0))
    # the file need not be sorted: shuffle the rows, then put each request's rows back in its own order into the
    # slots it got (so rows of one request with equal ts keep their order, which the analysis must honour)
    perm = draw(st.permutations(range(len(rows))))
    shuffled = [rows[i] for i in perm]
    for req in {row[2] for row in rows}:
        slots = [k for k, row in enumerate(shuffled) if row[2] == req]
        own = [row for row in rows if row[2] == req]
        for k, row in zip(slots, own):
            shuffled[k] = row
    return shuffled


def _csv(rows) -> str:
    lines = ["ts,event,request_id,num_blocks,num_tokens"]
    lines += [f"{ts},{ev},{req},{nb},{'' if ev == 'free' else nt}" for ts, ev, req, nb, nt in rows]
    return "\n".join(lines) + "\n"


@SETTINGS
@given(traces(), st.sampled_from([4, 16]))
def test_matches_reference_and_stays_in_bounds(rows, block_size):
    a = _analyze_text(_csv(rows), block_size)
    ref = reference(rows, block_size)
    req = a.requests
    assert a.summary.requests == len(ref)
    for i, rid in enumerate(req.request_ids):
        hold, bsec, tsec, left, pre = ref[rid]
        assert math.isclose(req.holding_time_s[i], hold, abs_tol=1e-9)
        assert math.isclose(req.block_seconds[i], bsec, abs_tol=1e-9)
        assert req.leaked_blocks[i] == left
        assert req.preemptions[i] == pre
        if bsec > 0:
            assert math.isclose(req.utilization[i], tsec / (block_size * bsec), rel_tol=1e-9)
        else:
            assert math.isnan(req.utilization[i])
    util = req.utilization[~np.isnan(req.utilization)]
    assert ((util >= 0) & (util <= 1 + 1e-12)).all()
    assert (req.block_seconds >= 0).all() and (req.holding_time_s >= 0).all()
    assert (req.wasted_slot_seconds >= 0).all()


@SETTINGS
@given(traces(all_freed=True))
def test_when_every_request_is_freed_allocated_plus_reused_equals_freed(rows):
    a = _analyze_text(_csv(rows))
    assert a.summary.leaked_requests == 0
    assert a.pool.blocks_allocated + a.pool.blocks_reused == a.pool.blocks_freed


@SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_loader(data):
    path = _write(data)
    try:
        load_events(path)
    except KvtoolError:
        pass
    finally:
        os.unlink(path)


_cell = st.one_of(
    st.sampled_from(
        [
            "",
            "0",
            "1",
            "-1",
            "2.5",
            "nan",
            "inf",
            "x",
            "allocate",
            "FREE",
            " append ",
            "reuse",
            "1e3",
            "9" * 30,
            '"q"',
            "1 2 3",
            "a b",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=',\n\r"\x00'), max_size=6),
)


@SETTINGS
@given(
    st.lists(st.lists(_cell, min_size=3, max_size=8), max_size=12),
    st.sampled_from(
        [
            "ts,event,request_id,num_blocks,num_tokens",
            "ts,event,request_id,num_blocks,num_tokens,latency_ms,block_ids",
            "ts,event,request_id,num_blocks,num_tokens,block_size,free_pool_blocks,source_request_id",
        ]
    ),
)
def test_random_rows_never_crash_and_every_row_is_accounted_for(cells, header):
    text = header + "\n" + "".join(",".join(row) + "\n" for row in cells)
    path = _write(text)
    try:
        table = load_events(path)
    except KvtoolError:
        return
    finally:
        os.unlink(path)
    r = table.rejected
    assert table.events + r.count + r.blank_rows == len(cells)
    a = analyze_events(table)
    util = a.requests.utilization[~np.isnan(a.requests.utilization)]
    assert ((util >= 0) & (util <= 1 + 1e-12)).all()


def physical_reference(rows):
    """Distinct block ids held over time, walking rows in (ts, file) order as docs/analyze.md defines it.

    rows: (ts, event, request, num_blocks, ids).  A listed id is held by the request until a free of that
    request lists it, or until the request's blocks return to 0; the count is read after the last row of each
    timestamp.  Returns (peak, integral over the trace).
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    blocks = {}
    held = {}  # request -> list of ids it holds (one entry per listing)
    refs: dict[int, int] = {}
    t_end = max(r[0] for r in rows)
    curve = []
    for k, i in enumerate(order):
        ts, ev, req, nb, ids = rows[i]
        b = blocks.get(req, 0)
        mine = held.setdefault(req, [])
        if ev == "free":
            b = max(0, b - nb)
            for x in ids:
                if x in mine:
                    mine.remove(x)
                    refs[x] -= 1
            if b == 0:
                for x in mine:
                    refs[x] -= 1
                mine.clear()
        else:
            b += nb
            for x in ids:
                mine.append(x)
                refs[x] = refs.get(x, 0) + 1
        blocks[req] = b
        last_at_ts = k + 1 == len(order) or rows[order[k + 1]][0] != ts
        if last_at_ts:
            curve.append((ts, sum(1 for c in refs.values() if c > 0)))
    peak = max(c for _, c in curve)
    integral = sum(c * ((curve[j + 1][0] if j + 1 < len(curve) else t_end) - t) for j, (t, c) in enumerate(curve))
    return peak, integral


@st.composite
def block_traces(draw):
    n_req = draw(st.integers(1, 5))
    shared = [0, 1]  # a prefix every request may reuse
    next_id = [10]
    rows = []
    for r in range(n_req):
        t = draw(st.integers(0, 10))
        mine: list[int] = []
        for _ in range(draw(st.integers(1, 6))):
            ev = draw(st.sampled_from(EVENTS))
            if ev == "free":
                nb = draw(st.integers(0, len(mine) + 1))
                ids = draw(st.lists(st.sampled_from(mine), unique=True, max_size=nb)) if mine and nb else []
                for x in ids:
                    mine.remove(x)
                if nb >= len(mine) + len(ids):
                    mine = []  # everything is freed: the rest is released implicitly
            elif ev == "reuse":
                ids = [x for x in shared if x not in mine][: draw(st.integers(0, 2))]
                nb = len(ids)
                mine += ids
            else:
                nb = draw(st.integers(0, 2))
                ids = list(range(next_id[0], next_id[0] + nb))
                if draw(st.booleans()):  # recycle ids of requests that may have finished: turnover
                    ids = [x - 10 + 2 for x in ids]
                ids = [x for x in ids if x not in mine]
                nb = len(ids)
                next_id[0] += nb
                mine += ids
            rows.append((float(t), ev, f"r{r}", nb, ids))
            t += draw(st.integers(0, 2))
    return sorted(rows, key=lambda row: row[0])


@SETTINGS
@given(block_traces())
def test_physical_blocks_match_reference(rows):
    text = "ts,event,request_id,num_blocks,num_tokens,block_ids\n" + "".join(
        f"{ts},{ev},{req},{nb},{'' if ev == 'free' else 1},{' '.join(map(str, ids))}\n" for ts, ev, req, nb, ids in rows
    )
    a = _analyze_text(text)
    if not any(ids for *_, ids in rows):
        assert not a.pool.has_block_ids
        return
    peak, integral = physical_reference(rows)
    assert a.pool.peak_physical_blocks_in_use == peak
    duration = max(r[0] for r in rows) - min(r[0] for r in rows)
    if duration > 0:
        assert math.isclose(a.pool.mean_physical_blocks_in_use, integral / duration, rel_tol=1e-9, abs_tol=1e-12)
    assert a.pool.peak_physical_blocks_in_use <= a.pool.unique_physical_blocks


# ---- the vectorised helpers (kvtool/events/segments.py) against plain Python


@SETTINGS
@given(st.lists(st.integers(0, 2**40), max_size=300), st.booleans())
def test_radix_argsort_is_a_stable_sort(keys, with_prior_order):
    from kvtool.events.segments import radix_argsort

    arr = np.array(keys, dtype=np.int64)
    prior = np.arange(arr.size)[::-1].copy() if with_prior_order else None
    got = radix_argsort(arr, prior)
    base = list(range(arr.size))[::-1] if with_prior_order else list(range(arr.size))
    expected = sorted(base, key=lambda i: keys[i])  # Python's sort is stable
    assert got.tolist() == expected


@SETTINGS
@given(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=8), min_size=1, max_size=8))
def test_segment_cumsum_and_clamp_at_zero(segments):
    from kvtool.events.segments import clamp_at_zero, segment_cumsum

    values = np.array([v for seg in segments for v in seg], dtype=np.int64)
    lengths = np.array([len(seg) for seg in segments])
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    running, clamped = [], []
    for seg in segments:
        total = held = 0
        for v in seg:
            total += v
            held = max(0, held + v)  # a free larger than what is held stops at 0
            running.append(total)
            clamped.append(held)
    s = segment_cumsum(values, starts)
    assert s.tolist() == running
    assert clamp_at_zero(s, starts, lengths).tolist() == clamped


def test_percentiles_interpolate_linearly():
    from kvtool.events.segments import percentiles

    # [10, 800]: p50 = 10 + 0.5 * 790 = 405, p95 = 760.5, p99 = 792.1, max 800
    assert percentiles(np.array([800.0, 10.0])) == pytest.approx((405.0, 760.5, 792.1, 800.0))
    assert all(math.isnan(v) for v in percentiles(np.array([])))


def test_nearest_rank_percentiles_are_values_that_occurred():
    from kvtool.events.segments import nearest_rank

    # nearest rank: the smallest value with at least q % of the sample at or below it (rank ceil(q/100 x n))
    assert nearest_rank(np.array([512, 0, 16, 0]), 50) == 0  # rank 2 of [0, 0, 16, 512]
    assert nearest_rank(np.array([512, 0, 16, 0]), 90) == 512  # rank ceil(3.6) = 4
    assert nearest_rank(np.arange(1, 11), 90) == 9  # rank 9 exactly (0.9 x 10 is not rounded up to 10)
    assert nearest_rank(np.array([7]), 1) == 7 and math.isnan(nearest_rank(np.array([]), 50))
