"""When each planted condition of tests/support/vllm_watch_driver.py began, read off the recorded file itself.

- long requests over 60 % of the pool: ``kvtool analyze``'s own ``long_requests.first_alert_at_s`` (threshold 256
  tokens: the driver's long prompts are 665 tokens, its others at most 124);
- late frees: the first free row with ``latency_ms`` above 100 ms (the delay-free plugin sleeps 300 ms);
- hit collapse: the admission (allocate row) of the 5th ``vary-*`` request: from then on at most 3 of the last 8
  admitted requests hit (every earlier one did), below half of the 100 % before.
"""

from __future__ import annotations

from pathlib import Path

LONG_THRESHOLD = 256
WATCH_ARGS = ("--long-threshold", str(LONG_THRESHOLD))
ALERTS = ("long_share", "late_free", "hit_collapse")


def onsets(path: Path) -> tuple[dict[str, float], dict[str, set[str]]]:
    """(rule -> trace time the condition began, rule -> the requests it may name)."""
    import numpy as np

    from kvtool.events.analysis import analyze_events
    from kvtool.events.load import ALLOCATE, FREE, load_events

    table = load_events(path)
    analysis = analyze_events(table, long_threshold_tokens=LONG_THRESHOLD)
    names = table.request_ids
    late = np.flatnonzero((table.event == FREE) & (table.latency_ms > 100))
    vary = [i for i in np.flatnonzero(table.event == ALLOCATE).tolist() if names[table.request[i]].startswith("vary-")]
    at = {
        "long_share": analysis.long_requests.first_alert_at_s,
        "late_free": float(table.ts[late[0]]),
        "hit_collapse": float(table.ts[vary[4]]),
    }
    behind = {
        "long_share": {n for n in names if n.startswith("long-")},
        "late_free": {names[table.request[i]] for i in late.tolist()},
        "hit_collapse": {n for n in names if n.startswith("vary-")},
    }
    return at, behind
