"""The isolation check behind a router: several engines behind one endpoint.

A router (round-robin, least-loaded, prefix- or KV-aware) may send a trial's prime, control and victim to different
engines.  A victim's miss then proves nothing: it may have run on an engine that never saw the prime.  The rule
(kvtool issue 31): **a miss counts only when the same tenant's positive control hit on the same path**, and a
victim is judged only where a copy of the prime (or the control, which stores the same blocks) went.

Which engine served a request is read from ``/metrics``: vLLM labels every sample with ``engine="N"`` (its own
data-parallel engines do the same), and a router that exposes each backend's metrics under its own engine label lets
the check see whose ``vllm:prefix_cache_queries_total`` moved by the request's prompt length (one request at a time,
so exactly one engine moves).  Where the endpoint shows one engine, or sums its engines into one, nothing here
applies and the verdicts are as before.

Two ways to a conclusive run behind a spreading router (docs/isolation.md "Behind a router"):

- ``--repeat-primes N``: each prime is sent N times in a row, so a round-robin router over N engines leaves a copy on
  every engine before the control and the victim run;
- a prefix-aware router (the hash of the prompt's first block, as KV-aware routers score) sends one prompt to one
  engine, so prime, control and victim meet anyway.

A failed path is its own precondition, ``routing``, with that fix, not the ``cache-size`` line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kvtool.vllm.isolation.plan import REPRIME

if TYPE_CHECKING:
    from kvtool.vllm.isolation.client import PrefixCounters
    from kvtool.vllm.isolation.record import IsolationRecord, ProbeResult


class JudgedTrial(Protocol):
    """What the routing line reads of a judged trial (kvtool.vllm.isolation.verdicts.TrialVerdict)."""

    @property
    def control_cached_tokens(self) -> int: ...
    @property
    def control_expected_tokens(self) -> int: ...
    @property
    def spread(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class RoutingLine:
    """The ``routing`` precondition (verdicts turn it into a Precondition line)."""

    state: str  # ok | failed
    detail: str
    fix: str | None
    summary: str = ""  # a failed one in a few words: the headline of an inconclusive verdict


def served_by(before: PrefixCounters, after: PrefixCounters) -> str | None:
    """The engine label whose prefix-cache queries moved between two reads of /metrics, when there are several
    engines and exactly one moved; None otherwise (one engine, counters summed, or other traffic)."""
    old, new = dict(before.queries_by_engine), dict(after.queries_by_engine)
    if len(new) < 2:
        return None
    moved = [engine for engine, value in new.items() if value != old.get(engine, 0.0)]
    return moved[0] if len(moved) == 1 else None


def engine_count(counters: PrefixCounters) -> int | None:
    """Engines /metrics shows (distinct ``engine`` labels on the queries counter); None when it shows none."""
    return len(counters.queries_by_engine) or None


@dataclasses.dataclass(frozen=True)
class TrialPath:
    """Where one trial's requests ran, as far as /metrics tells."""

    copies: int  # times the prime was sent (1 + the --repeat-primes copies)
    first_prime_cached_tokens: int  # the first copy's cached tokens (the one that must be fresh)
    prime_engines: frozenset[str]  # engines that served a copy of the prime (empty: not known)
    control_engine: str | None
    victim_engine: str | None

    @property
    def known(self) -> bool:
        return bool(self.prime_engines) and self.control_engine is not None and self.victim_engine is not None

    @property
    def control_elsewhere(self) -> bool:
        """The control ran on an engine no copy of the prime reached."""
        return self.known and self.control_engine not in self.prime_engines

    @property
    def victim_elsewhere(self) -> bool:
        """The victim ran on an engine holding neither a copy of the prime nor the control's blocks."""
        return self.known and self.victim_engine not in self.prime_engines | {self.control_engine}

    def control_doubt(self) -> str:
        return (
            f"the control ran on engine {self.control_engine}, the prime on {_engines(self.prime_engines)}: the "
            "router spread them, so its miss says nothing about the cache"
        )

    def victim_doubt(self) -> str:
        return (
            f"the victim ran on engine {self.victim_engine}, which no copy of the prime reached "
            f"({_engines(self.prime_engines)}): its miss proves nothing"
        )


def _engines(engines: frozenset[str]) -> str:
    return ", ".join(sorted(engines))


def trial_path(results: list[ProbeResult]) -> TrialPath | None:
    """The path of one trial from all its results (copies of the prime included); None for a trial without
    copies of its prime on an endpoint that shows one engine (nothing to say)."""
    copies = [r for r in results if r.probe.role in (REPRIME, "prime")]
    roles = {r.probe.role: r for r in results}
    if "prime" not in roles or "control" not in roles or "victim" not in roles:
        return None
    engines = frozenset(r.engine for r in copies if r.engine is not None)
    if len(copies) < 2 and roles["prime"].engine is None:
        return None
    if any(r.engine is None for r in copies):
        engines = frozenset()  # a copy of unknown whereabouts: the path is not known
    return TrialPath(len(copies), copies[0].cached_tokens, engines, roles["control"].engine, roles["victim"].engine)


def routing_line(record: IsolationRecord, searched: Sequence[JudgedTrial]) -> RoutingLine | None:
    """The ``routing`` line: failed when the router sent controls or victims away from their primes; None when
    the endpoint shows a single engine (or none) and no trial was spread."""
    seen = {r.engine for r in record.results if r.engine is not None}
    engines = max(record.engine.engines or 0, len(seen))
    spread = [t for t in searched if t.spread]
    if engines < 2 and not spread:
        return None
    copies = 1 + max((sum(1 for p in t.fillers if p.role == REPRIME) for t in record.plan.trials), default=0)
    sent = f"; each prime sent {copies} times" if copies > 1 else ""
    if not seen:
        failed = [t for t in searched if t.control_cached_tokens < t.control_expected_tokens]
        if not failed:
            return RoutingLine("ok", f"{engines} engines behind the endpoint; every control found its "
                                f"prime{sent}", None)  # fmt: skip
        return RoutingLine(
            "failed",
            f"{engines} engines behind the endpoint, and /metrics does not tell which served each request: "
            f"{len(failed)}/{len(searched)} controls missed, which the router may have caused",
            _fix(engines), "the router may have spread the prime and the control over engines",
        )  # fmt: skip
    if spread:
        controls = sum(1 for t in spread if t.control_cached_tokens < t.control_expected_tokens)
        return RoutingLine(
            "failed",
            f"{engines} engines behind the endpoint (/metrics engine labels); in {len(spread)}/{len(searched)} trials "
            f"the router sent the control ({controls}) or the victim ({len(spread) - controls}) to an engine that no "
            f"copy of the prime reached{sent}",
            _fix(engines), "the router spread the prime and the control over engines",
        )  # fmt: skip
    return RoutingLine("ok", f"{engines} engines behind the endpoint; every control and victim ran on "
                        f"an engine holding its prime{sent}", None)  # fmt: skip


def _fix(engines: int) -> str:
    return (
        f"repeat each prime on every engine with --repeat-primes {engines} (round-robin or least-loaded routing), "
        "or route by prompt prefix (a prefix-aware or KV-aware policy sends one prompt to one engine)"
    )
