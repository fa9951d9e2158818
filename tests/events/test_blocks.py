"""Physical blocks (kvtool/events/blocks.py) on traces small enough to follow by hand.

Two paths give the same figures: when every free row that lists ids also ends its request's holding interval,
only the attaches are grouped; a partial free that lists an id releases that id early and needs every listing
grouped by (id, request).  Each case below is walked by hand in its comment.
"""

from __future__ import annotations

import pytest

from kvtool.events.analysis import analyze_events
from kvtool.events.load import load_events

HEADER = "ts,event,request_id,num_blocks,num_tokens,block_ids\n"


def _pool(tmp_path, rows: str):
    path = tmp_path / "events.csv"
    path.write_text(HEADER + rows)
    return analyze_events(load_events(path)).pool


def test_frees_that_end_the_interval(tmp_path):
    # a holds ids 1 and 2 over [0, 1); b takes id 1 back at t = 2 and frees it at 3.
    # In use: 2 on [0, 1), 0 on [1, 2), 1 on [2, 3): integral 3 over 3 s -> mean 1.0.
    # id 1 leaves the pool at 1 and comes back at 2: one reallocation, turnover 1 s.
    p = _pool(tmp_path, "0,allocate,a,2,32,1 2\n1,free,a,2,,1 2\n2,allocate,b,1,16,1\n3,free,b,1,,1\n")
    assert p.unique_physical_blocks == 2
    assert p.peak_physical_blocks_in_use == 2
    assert p.mean_physical_blocks_in_use == pytest.approx(1.0)
    assert p.reallocations == 1
    assert p.turnover_time_s_p50 == pytest.approx(1.0)


def test_a_partial_free_releases_its_listed_id_early(tmp_path):
    # a frees id 1 alone at t = 1 (it still holds id 2 until 3); b takes id 1 at 2 and frees it at 4.
    # In use: 2 on [0, 1), 1 on [1, 2), 2 on [2, 3), 1 on [3, 4): integral 6 over 4 s -> mean 1.5.
    # id 1 is back in the pool from 1 to 2: one reallocation, turnover 1 s.  (Held by a until its interval
    # closed at 3, it would instead count 2 blocks on [1, 2) and no reallocation.)
    p = _pool(
        tmp_path,
        "0,allocate,a,2,32,1 2\n1,free,a,1,,1\n2,allocate,b,1,16,1\n3,free,a,1,,2\n4,free,b,1,,1\n",
    )
    assert p.unique_physical_blocks == 2
    assert p.peak_physical_blocks_in_use == 2
    assert p.mean_physical_blocks_in_use == pytest.approx(1.5)
    assert p.reallocations == 1
    assert p.turnover_time_s_p50 == pytest.approx(1.0)
