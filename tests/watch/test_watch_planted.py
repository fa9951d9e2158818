"""The planted conditions of a real vLLM run (tests/data/watch, recorded with tests/support/vllm_watch_driver.py),
replayed in trace time: each alert fires within 2 s of its condition (tests/watch/planted.py reads when each began
off the file itself) and names the requests behind it; the healthy run of the same driver fires none."""

from __future__ import annotations

import pytest

from kvtool.watch.session import WatchOptions, WatchSession
from tests.support import DATA
from tests.watch.planted import ALERTS, LONG_THRESHOLD, onsets

PLANTED = DATA / "watch" / "planted.csv.gz"
HEALTHY = DATA / "watch" / "healthy.csv.gz"


def _replayed(path):
    session = WatchSession(WatchOptions(replay=path, speed=0, long_threshold_tokens=LONG_THRESHOLD))
    fired = {}

    def keep(snap):
        for alert in snap.alerts:
            fired.setdefault(alert.rule, alert)

    session.replay_in_trace_time(keep)
    return session, fired


@pytest.mark.parametrize("rule", ALERTS)
def test_each_planted_condition_fires_its_alert_within_2_s_naming_its_requests(rule):
    at, behind = onsets(PLANTED)
    session, fired = _replayed(PLANTED)
    alert = fired[rule]
    assert 0 <= alert.since_s - at[rule] <= 2.0, (alert.since_s, at[rule])
    assert alert.request_ids and set(alert.request_ids) <= behind[rule], alert.message


def test_the_healthy_run_fires_nothing():
    session, fired = _replayed(HEALTHY)
    assert fired == {} and not session.tracker.ever_fired
    assert session.latest.since_start.requests > 500  # a run as busy as the planted one (README there)
