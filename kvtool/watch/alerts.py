"""The watcher's alerts: the seed's rules (KV_Catch), each threshold an option, each alert naming its requests.

Every rule reads figures analysis.py computed over the window (or the lead holding, for a leak):

- ``long_share``: the long requests' blocks at the window's last row, as a share of the pool's capacity, above
  ``long_share`` (the article: "long requests holding more than 60 % of the total capacity");
- ``late_free``: a free in the window slower than ``free_latency_ms`` after its request finished (analyze's late
  frees at that threshold; the article's frees 800 ms late);
- ``hit_collapse``: the prefix-hit share of the last ``hit_recent_requests`` requests admitted fell below
  ``hit_collapse`` x the best share seen over as many requests before, that best share being at least
  ``hit_baseline`` (prompts did repeat their prefix; now they miss: the article's trailing space, 87 % -> 3 %);
- ``preemption_storm``: preemptions in the window per second of the window above ``preemptions_per_s``;
- ``leak``: a request holding blocks with no row for more than ``leak_after_s`` (a running request has a row
  every engine step it decodes in).

:class:`AlertTracker` keeps which alerts fire, when each started, and appends every change (fired, resolved) to
the alerts file as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kvtool.core.errors import UsageError
from kvtool.core.jsonable import to_jsonable
from kvtool.events.analysis import DEFAULT_LATE_FREE_MS, DEFAULT_LONG_SHARE_ALERT

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.events.analysis import Analysis

RULES = ("long_share", "late_free", "hit_collapse", "preemption_storm", "leak")
NAMED_REQUESTS = 10  # requests named per alert, the most involved first


@dataclasses.dataclass(frozen=True)
class AlertRules:
    """The thresholds (``kvtool watch`` options of the same names)."""

    long_share: float = DEFAULT_LONG_SHARE_ALERT  # share of the pool's capacity held by long requests
    free_latency_ms: float = DEFAULT_LATE_FREE_MS  # a free slower than this in the window
    hit_baseline: float = 0.5  # the hit share prompts must have had for a collapse to count
    hit_collapse: float = 0.5  # fires below this fraction of that share
    hit_recent_requests: int = 8  # the requests the recent hit share is taken over
    preemptions_per_s: float = 1.0  # over the window
    leak_after_s: float = 60.0  # a request holding blocks this long after its last row

    def check(self) -> None:
        if not 0 < self.long_share <= 1:
            raise UsageError(f"--alert-long-share must be a share in (0, 1], got {self.long_share:g}")
        if not self.free_latency_ms >= 0:
            raise UsageError(f"--alert-free-latency-ms must be >= 0, got {self.free_latency_ms:g}")
        if not 0 < self.hit_baseline <= 1 or not 0 < self.hit_collapse < 1:
            raise UsageError("--alert-hit-baseline must be in (0, 1] and --alert-hit-collapse in (0, 1)")
        if self.hit_recent_requests < 1:
            raise UsageError(f"--alert-hit-requests must be >= 1, got {self.hit_recent_requests}")
        if not self.preemptions_per_s >= 0:
            raise UsageError(f"--alert-preemptions-per-s must be >= 0, got {self.preemptions_per_s:g}")
        if not self.leak_after_s > 0:
            raise UsageError(f"--alert-leak-after-s must be > 0 seconds, got {self.leak_after_s:g}")


class Holders(Protocol):
    """What the leak rule reads of the watcher (kvtool.watch.state.Watcher), which imports this module."""

    def idle_holders(self, clock_s: float, idle_s: float) -> list[tuple[str, int, float]]: ...


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert firing."""

    rule: str  # one of RULES
    value: float  # the figure the rule read
    threshold: float
    unit: str  # of value and threshold: "share", "ms", "per_s", "s"
    message: str  # one line, naming the requests
    request_ids: tuple[str, ...]  # the requests behind it, the most involved first
    since_s: float  # the watcher's clock when it started firing


class AlertTracker:
    """The alerts firing now, evaluated per snapshot; every change goes to the alerts file."""

    def __init__(self, rules: AlertRules, log: Path | None = None, window_s: float = 10.0):
        rules.check()
        self.rules = rules
        self.log = log
        self.window_s = window_s
        self.firing: dict[str, Alert] = {}
        self.first_fired_s: dict[str, float] = {}  # clock of the first firing of each rule
        self.fired_wall_s: dict[str, float] = {}  # wall time of the first firing of each rule
        self.hit_best = float("nan")  # the best recent hit share seen (over hit_recent_requests requests)
        if log is not None:
            try:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.open("a", encoding="utf-8").close()
            except OSError as err:
                raise UsageError(f"cannot write the alerts file: {err.strerror or err}", where=str(log)) from None

    @property
    def ever_fired(self) -> bool:
        return bool(self.first_fired_s)

    def evaluate(self, watcher: Holders, window: Analysis | None, clock_s: float) -> tuple[Alert, ...]:
        found: dict[str, tuple[float, float, str, str, tuple[str, ...]]] = {}
        if window is not None:
            for check in (self._long_share, self._late_free, self._hit_collapse, self._preemptions):
                hit = check(window)
                if hit is not None:
                    found[hit[0]] = hit[1:]
        leak = self._leak(watcher, clock_s)
        if leak is not None:
            found["leak"] = leak[1:]
        for rule in RULES:
            if rule in found:
                value, threshold, unit, message, ids = found[rule]
                since = self.firing[rule].since_s if rule in self.firing else clock_s
                alert = Alert(rule, value, threshold, unit, message, ids, since)
                if rule not in self.firing:
                    self.first_fired_s.setdefault(rule, clock_s)
                    self.fired_wall_s.setdefault(rule, time.time())
                    self._write("firing", alert, clock_s)
                self.firing[rule] = alert
            elif rule in self.firing:
                self._write("resolved", self.firing.pop(rule), clock_s)
        return tuple(self.firing[r] for r in RULES if r in self.firing)

    # ------------------------------------------------------------------------------------------ rules

    def _long_share(self, window: Analysis):
        import numpy as np

        share = long_share_last(window)
        limit = self.rules.long_share
        if not share > limit:
            return None
        r = window.requests
        idx = np.flatnonzero(r.long & (r.leaked_blocks > 0))
        idx = idx[np.argsort(-r.leaked_blocks[idx], kind="stable")]
        ids = _names(r.request_ids, idx)
        detail = ", ".join(f"{r.request_ids[i]} ({int(r.leaked_blocks[i])} blocks)" for i in idx[:NAMED_REQUESTS])
        basis = "of the pool" if window.long_requests.basis == "capacity" else "of the blocks held"
        message = (
            f"long requests (> {window.long_requests.threshold_tokens:,} tokens) hold {share:.0%} {basis} "
            f"(alert above {limit:.0%}): {detail}"
        )
        return ("long_share", share, limit, "share", message, ids)

    def _late_free(self, window: Analysis):
        late = window.late_frees  # analyze's late frees, at the threshold the watcher was given
        if not late.requests:
            return None
        slowest = window.pool.free_latency_ms_max
        ids = tuple(f.request_id for f in late.top)[:NAMED_REQUESTS]
        detail = ", ".join(f"{f.request_id} ({f.free_latency_ms:,.0f} ms)" for f in late.top[:NAMED_REQUESTS])
        message = (
            f"frees return late: {late.requests} request(s) in the window got their blocks back over "
            f"{late.threshold_ms:g} ms after finishing (slowest {slowest:,.1f} ms, p99 "
            f"{window.pool.free_latency_ms_p99:,.1f} ms): {detail}"
        )
        return ("late_free", slowest, late.threshold_ms, "ms", message, ids)

    def _hit_collapse(self, window: Analysis):
        import numpy as np

        rules, r = self.rules, window.requests
        admitted = np.flatnonzero(r.prompt_tokens > 0)
        if admitted.size < rules.hit_recent_requests:
            return None
        recent = admitted[np.argsort(r.first_ts_s[admitted], kind="stable")][-rules.hit_recent_requests :]
        hit = r.prefix_hit_tokens[recent] > 0
        share = float(hit.mean())
        best = self.hit_best
        if not best >= rules.hit_baseline or not share < best * rules.hit_collapse:
            if not share <= best:
                self.hit_best = share
            return None
        missed = recent[~hit][::-1]  # the latest first
        ids = _names(r.request_ids, missed)
        message = (
            f"prefix hits collapsed: {share:.0%} of the last {recent.size} requests admitted hit the prefix cache, "
            f"against {best:.0%} before (alert below {rules.hit_collapse:.0%} of it); missed: {', '.join(ids)}"
        )
        return ("hit_collapse", share, best * rules.hit_collapse, "share", message, ids)

    def _preemptions(self, window: Analysis):
        import numpy as np

        count = window.summary.preemptions
        rate = count / self.window_s
        limit = self.rules.preemptions_per_s
        if not count or not rate > limit:
            return None
        r = window.requests
        idx = np.flatnonzero(r.preemptions > 0)
        idx = idx[np.argsort(-r.preemptions[idx], kind="stable")]
        ids = _names(r.request_ids, idx)
        detail = ", ".join(f"{r.request_ids[i]} ({int(r.preemptions[i])}x)" for i in idx[:NAMED_REQUESTS])
        message = (
            f"preemption storm: {count} preemptions in the last {self.window_s:g} s ({rate:.2f}/s, alert above "
            f"{limit:g}/s): {detail}"
        )
        return ("preemption_storm", rate, limit, "per_s", message, ids)

    def _leak(self, watcher: Holders, clock_s: float):
        limit = self.rules.leak_after_s
        idle = watcher.idle_holders(clock_s, limit)
        if not idle:
            return None
        ids = tuple(rid for rid, _, _ in idle[:NAMED_REQUESTS])
        detail = ", ".join(f"{rid} ({blocks} blocks, {s:,.0f} s)" for rid, blocks, s in idle[:NAMED_REQUESTS])
        message = f"{len(idle)} request(s) hold blocks with no event for over {limit:g} s: {detail}"
        return ("leak", idle[0][2], limit, "s", message, ids)

    # ------------------------------------------------------------------------------------------ the file

    def _write(self, state: str, alert: Alert, clock_s: float) -> None:
        if self.log is None:
            return
        record = {"state": state, "at_s": clock_s, "wall_s": time.time(), **to_jsonable(alert)}
        with self.log.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, allow_nan=False, default=str) + "\n")


def _names(request_ids: tuple[str, ...], idx) -> tuple[str, ...]:
    return tuple(request_ids[i] for i in idx[:NAMED_REQUESTS].tolist())


def long_share_last(analysis: Analysis) -> float:
    """The long requests' share at the last point of analyze's curve, on analyze's basis (capacity when known)."""
    t = analysis.timeline
    if not t.time_s.size:
        return float("nan")
    long_now = float(t.long_blocks_in_use[-1])
    capacity = analysis.long_requests.capacity_blocks
    if capacity:
        return long_now / capacity
    held = float(t.blocks_in_use[-1])
    return long_now / held if held > 0 else 0.0
