"""Invariants of `kvtool analyze` with hypothesis, and a plain-Python reference implementation.

The reference walks each request's events one by one, exactly as docs/analyze.md defines b(t), n(t), holding
time, block-seconds and utilization; the vectorised analysis must agree with it on random traces.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool.errors import KvtoolError
from kvtool.event_analysis import analyze_events
from kvtool.events_csv import load_events

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
    st.sampled_from(["", "0", "1", "-1", "2.5", "nan", "inf", "x", "allocate", "FREE", " append ", "reuse", "1e3",
                     "9" * 30, "\"q\"", "1 2 3", "a b"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=",\n\r\"\x00"), max_size=6),
)


@SETTINGS
@given(
    st.lists(st.lists(_cell, min_size=3, max_size=8), max_size=12),
    st.sampled_from([
        "ts,event,request_id,num_blocks,num_tokens",
        "ts,event,request_id,num_blocks,num_tokens,latency_ms,block_ids",
        "ts,event,request_id,num_blocks,num_tokens,block_size,free_pool_blocks,source_request_id",
    ]),
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
