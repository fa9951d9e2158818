"""Decoding requests advanced together: the fast path of the simulated scheduler (:mod:`kvtool.simulate.scheduler`).

Once a running request has computed its whole prompt, every step that schedules it gives it exactly one token, so
its computed tokens are ``base + tick``, where ``tick`` counts the steps the group of decoding requests has taken.
:class:`DecodeGroup` keeps what the scheduler needs of its members without touching each member at each step:

- how many members open a new block at a step (those whose computed tokens are a multiple of the block size when the
  step starts): a member count per phase, indexed by the ticks (mod the block size) at which they open one;
- the sum of the members' computed tokens (a decode step's attention pairs);
- which member finishes first: a heap of (tick after its last step, place in the running list).

A member's own counters (tokens, blocks, cached blocks) are brought up to date only when they are needed: when it
finishes, or when a step the group cannot take alone (a prefill chunk, a preemption) runs the plain loop.

:func:`decode_span` gives the times and integrals of a run of decode steps in closed form when every step is
memory-bound (time = fixed + per-entry cost x block-table entries, the entries growing at the steps where members
open blocks): integer sums of the entries, their squares and their step-weighted sum, taken at C speed
(``itertools.accumulate``, ``sum(map(...))``), then a handful of float operations; no Python statement per step.
"""

from __future__ import annotations

import heapq
import math
import operator
from bisect import bisect_right
from itertools import accumulate
from typing import NamedTuple


class DecodeGroup:
    """The running requests that decode one token per step, advanced lazily (module docstring)."""

    __slots__ = ("block_size", "tick", "since", "base", "opens_at", "base_sum", "finish")

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.tick = 0  # steps taken by the group
        self.since: dict[int, int] = {}  # member -> tick at which its own counters were last brought up to date
        self.base: dict[int, int] = {}  # member -> computed tokens - tick (constant while a member)
        # opens_at[t % block_size]: members that open a block at the step starting at tick t (-base % block_size)
        self.opens_at = [0] * block_size
        self.base_sum = 0
        self.finish: list[tuple[int, int, int]] = []  # heap of (tick after its last step, running order, member)

    def join(self, r: int, computed: int, steps_left: int, order: int) -> None:
        """Request ``r`` decodes from now on: its computed tokens, the steps until it finishes (>= 1) and its place
        in the running list (admission order)."""
        base = computed - self.tick
        self.since[r] = self.tick
        self.base[r] = base
        self.opens_at[-base % self.block_size] += 1
        self.base_sum += base
        heapq.heappush(self.finish, (self.tick + steps_left, order, r))

    def lag(self, r: int) -> int:
        """Steps ``r`` decoded since its counters were last brought up to date (they count as up to date now)."""
        t = self.since[r]
        self.since[r] = self.tick
        return self.tick - t

    def pop_finished(self) -> list[tuple[int, int]]:
        """Members whose last step has run, in running order, with their lags; they leave the group."""
        heap, tick, since, base, opens_at, b = (
            self.finish,
            self.tick,
            self.since,
            self.base,
            self.opens_at,
            self.block_size,
        )
        out = []
        while heap and heap[0][0] <= tick:
            r = heapq.heappop(heap)[2]
            out.append((r, tick - since.pop(r)))
            q = base.pop(r)
            opens_at[-q % b] -= 1
            self.base_sum -= q
        return out

    def clear(self) -> list[tuple[int, int]]:
        """Every member with its lag; the group is left empty."""
        tick = self.tick
        out = [(r, tick - t) for r, t in self.since.items()]
        self.since.clear()
        self.base.clear()
        self.opens_at = [0] * self.block_size
        self.base_sum = 0
        self.finish.clear()
        return out

    def openings(self, steps: int) -> list[int]:
        """Members opening a block at each of the next ``steps`` steps (index 0: the next one)."""
        at = self.opens_at
        s = self.tick % self.block_size
        if s + steps <= self.block_size:  # within one turn of the phases
            return at[s : s + steps]
        cycle = at[s:] + at[:s]
        if steps <= len(cycle):
            return cycle[:steps]
        return (cycle * (steps // len(cycle) + 1))[:steps]


tuple_new = tuple.__new__  # builds a NamedTuple from a tuple at C speed (no Python-level __new__)


class DecodeStart(NamedTuple):
    """The state before a run of decode steps: block-table entries, blocks in use, tokens held, decoding requests."""

    entries: int
    blocks: int
    tokens: int
    requests: int


class DecodeSpan(NamedTuple):
    """A run of decode steps: how many ran, blocks opened, and the time and integrals over them."""

    steps: int
    opened: int
    elapsed_s: float
    block_s: float  # integral of blocks in use
    entry_s: float  # integral of block-table entries
    token_s: float  # integral of tokens held (each step's tokens counted from its start)


def decode_span(
    openings: list[int],
    start: tuple[int, int, int, int],
    rate: tuple[float, float],
    budget_s: float = math.inf,
    free: int = 1 << 62,
) -> DecodeSpan:
    """``len(openings)`` decode steps of ``step_s + entry_s x entries`` seconds each (``rate``), the entries growing
    by ``openings[k]`` at step k.  Ends before the first step whose openings exceed ``free`` blocks, and after the
    step whose end reaches ``budget_s`` seconds from the start.  ``start`` is a :class:`DecodeStart` or a plain tuple
    in its order (cheaper to build at every jump).  Integer sums over the steps (C-level iteration),
    then the float figures: the step-by-step loop gives the same to rounding."""
    step_s, entry_s = rate
    grown = list(accumulate(openings))  # G_k: blocks opened by the end of step k
    if grown[-1] > free:
        del grown[bisect_right(grown, free) :]
    steps = len(grown)
    if not steps:
        return DecodeSpan(0, 0, 0.0, 0.0, 0.0, 0.0)
    e0, blocks0, tokens0, requests = start  # entries at step k: e0 + G_k
    if not grown[-1]:  # no block opened: every step takes the same time
        return _flat_span(steps, start, rate, budget_s)
    summed = list(accumulate(grown))  # summed[k]: G_0 + ... + G_k
    if step_s * steps + entry_s * (e0 * steps + summed[-1]) >= budget_s:
        steps = _steps_to_reach(summed, e0, rate, budget_s)
        del grown[steps:], summed[steps:]
    g1 = summed[-1]
    g2 = sum(map(operator.mul, grown, grown)) if grown[-1] else 0
    gk = (steps + 1) * g1 - sum(summed)  # sum of (k + 1) G_k: each G_j counted K - j times in the partial sums
    half = steps * (steps + 1) // 2
    s1 = e0 * steps + g1  # sum over the steps of the entries
    s2 = e0 * (e0 * steps + 2 * g1) + g2  # of their squares
    sk = e0 * half + gk  # of (k + 1) x entries at step k
    elapsed = step_s * steps + entry_s * s1
    entry_integral = step_s * s1 + entry_s * s2
    # tuple.__new__: a NamedTuple's own __new__ is a Python function, a cost per jump worth avoiding
    return tuple_new(
        DecodeSpan,
        (
            steps,
            grown[-1],
            elapsed,
            entry_integral + (blocks0 - e0) * elapsed,
            entry_integral,
            tokens0 * elapsed + requests * (step_s * half + entry_s * sk),  # tokens at step k: t0 + n (k+1)
        ),
    )


def _flat_span(steps: int, start: tuple[int, int, int, int], rate: tuple[float, float], budget_s: float) -> DecodeSpan:
    """decode_span when no step opens a block: ``steps`` steps of ``step_s + entry_s x entries`` each."""
    step_s, entry_s = rate
    e0, blocks0, tokens0, requests = start
    if step_s * steps + entry_s * (e0 * steps) >= budget_s:
        steps = _steps_to_reach([0] * steps, e0, rate, budget_s)
    half = steps * (steps + 1) // 2
    s1 = e0 * steps
    elapsed = step_s * steps + entry_s * s1
    entry_integral = step_s * s1 + entry_s * (e0 * s1)
    return tuple_new(
        DecodeSpan,
        (
            steps,
            0,
            elapsed,
            entry_integral + (blocks0 - e0) * elapsed,
            entry_integral,
            tokens0 * elapsed + requests * (step_s * half + entry_s * (e0 * half)),
        ),
    )


def _steps_to_reach(summed: list[int], e0: int, rate: tuple[float, float], budget_s: float) -> int:
    """The fewest steps whose time reaches ``budget_s`` (all of them do): elapsed after k steps is step_s x k +
    entry_s x (e0 x k + summed[k - 1]), nondecreasing in k (``summed``: the partial sums of the blocks opened).
    Callers bound the steps by the budget over the least step time, so the answer is among the last few: searched
    from the end."""
    step_s, entry_s = rate
    k = len(summed)
    while k > 1 and step_s * (k - 1) + entry_s * (e0 * (k - 1) + summed[k - 2]) >= budget_s:
        k -= 1
    return k
