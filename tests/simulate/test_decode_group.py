"""The serving simulation's fast path (kvtool/simulate/decode_group.py: decoding requests advanced as a group, decode
jumps in closed form) against the plain step-by-step loop (``EngineConfig(fast_path=False)``, the loop the vLLM
parity fixtures check), on seeded random workloads: chunked prefill, prefix sharing (token ids and pieces),
preemptions, arrivals, ``max_model_len``, memory- and compute-bound step times.  Every per-request figure must be
equal, times and integrals equal to rounding (the closed form sums in another order)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.simulate.decode_group import DecodeStart, decode_span
from kvtool.simulate.export import events_table
from kvtool.simulate.scheduler import EngineConfig, Prompt, run_engine
from kvtool.simulate.serving import ServeTrace


class Roofline:
    """A roofline step time like kvtool.simulate.costs.RooflineCost, with constants that make decode steps
    memory-bound for small batches and compute-bound for large ones (both branches of the max are taken)."""

    def __init__(self, weights_s: float, read_s: float, token_s: float, pair_s: float, kernel_s: float):
        self.fixed, self.weights, self.read, self.token, self.pair, self.kernel = (
            1e-4,
            weights_s,
            read_s,
            token_s,
            pair_s,
            kernel_s,
        )

    def time_s(self, tokens, requests, entries, pairs):
        memory = self.weights + self.read * entries
        compute = self.token * tokens + self.pair * pairs
        return self.fixed + (memory if memory > compute else compute) + self.kernel * entries

    def decode_coefficients(self, requests):
        return (self.fixed, self.weights, self.read, self.kernel, self.token * requests, self.pair)


def _prompts(rng: random.Random, n: int, b: int) -> list[Prompt]:
    """Token-id prompts with shared heads, or pieces (a system prompt, Mooncake-like hash ids) with private tails."""
    if rng.random() < 0.5:
        heads = [[rng.randrange(30) for _ in range(rng.randint(0, 4 * b))] for _ in range(3)]
        out = []
        for _ in range(n):
            ids = rng.choice(heads) + [rng.randrange(30) for _ in range(rng.randint(1, 5 * b))]
            out.append(Prompt(len(ids), ids, "tokens"))
        return out
    out = []
    for _ in range(n):
        pieces = [(f"sys{rng.randrange(2)}", rng.choice([b, 2 * b + 3, 40]))]
        if rng.random() < 0.5:
            pieces.append((rng.randrange(4), rng.randint(1, 2 * b)))
        shared = sum(length for _, length in pieces)
        out.append(Prompt(shared + rng.randint(0, 3 * b), pieces, "pieces"))
    return out


def _case(seed: int):
    rng = random.Random(seed)
    n = rng.randint(5, 45)
    b = rng.choice([4, 8, 16, 32])
    prompts = _prompts(rng, n, b)
    outs = [rng.randint(1, 120) for _ in range(n)]
    arrival = sorted(rng.uniform(0, 0.08) for _ in range(n)) if rng.random() < 0.6 else None
    config = dict(
        num_blocks=rng.randint(6, 80) * 32 // b + 2,
        block_size=b,
        max_num_seqs=rng.randint(1, 20),
        max_num_batched_tokens=rng.choice([8, 32, 128, 4096]),
        long_prefill_token_threshold=rng.choice([0, 0, 20]),
        enable_prefix_caching=rng.random() < 0.85,
        # a max_model_len that cuts some outputs short (prompts stay within it, as vLLM requires)
        max_model_len=rng.choice([1 << 40, 1 << 40, max(p.tokens for p in prompts) + rng.randint(1, 40)]),
    )
    cost = None
    if rng.random() < 0.85:
        # memory per step 1-5 ms; compute overtakes it from a few requests to tens of them
        cost = Roofline(
            rng.uniform(1e-3, 5e-3), rng.uniform(0, 2e-6), rng.uniform(1e-5, 1e-3), rng.uniform(0, 1e-7), 2e-7
        )
    return prompts, outs, arrival, config, cost


PER_REQUEST = ("num_cached_tokens", "num_preemptions", "first_token_step", "finish_step", "admit_step")
COUNTS = ("steps", "peak_blocks", "preemptions", "evictions", "hit_tokens", "queried_tokens", "free_blocks_at_end")
TIMES = ("admit_s", "first_token_s", "finish_s")
INTEGRALS = ("busy_s", "block_seconds", "entry_seconds", "token_seconds")


def _assert_same(fast, slow):
    for field in PER_REQUEST + COUNTS:
        assert getattr(fast, field) == getattr(slow, field), field
    for field in TIMES:
        assert np.allclose(getattr(fast, field), getattr(slow, field), rtol=1e-9, atol=1e-15, equal_nan=True), field
    for field in INTEGRALS:
        assert getattr(fast, field) == pytest.approx(getattr(slow, field), rel=1e-9, abs=1e-15), field


@pytest.mark.parametrize("seed", range(60))
def test_fast_path_equals_the_plain_loop(seed):
    prompts, outs, arrival, config, cost = _case(seed)
    fast = run_engine(EngineConfig(**config), prompts, outs, arrival, cost=cost)
    slow = run_engine(EngineConfig(**config, fast_path=False), prompts, outs, arrival, cost=cost)
    _assert_same(fast, slow)


def test_the_random_cases_exercise_what_they_should(monkeypatch):
    """Across the seeds: preemptions, prefix hits, chunked prefills, and decode jumps both in closed form
    (memory-bound) and step by step (compute-bound)."""
    from kvtool.simulate import scheduler

    jumps = {"closed": 0, "steps": 0}

    def counting(name, real):
        def wrapped(*args, **kwargs):
            jumps[name] += 1
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(scheduler, "decode_span", counting("closed", scheduler.decode_span))
    monkeypatch.setattr(scheduler.Engine, "_decode_steps", counting("steps", scheduler.Engine._decode_steps))
    preempted = hits = chunked = 0
    for seed in range(60):
        prompts, outs, arrival, config, cost = _case(seed)
        run = run_engine(EngineConfig(**config), prompts, outs, arrival, cost=cost)
        preempted += run.preemptions > 0
        hits += run.hit_tokens > 0
        chunked += any(p.tokens > config["max_num_batched_tokens"] for p in prompts)
    assert preempted >= 10 and hits >= 20 and chunked >= 10
    assert jumps["closed"] >= 100 and jumps["steps"] >= 100


def test_exported_events_are_the_same_on_both_paths():
    """--export-events: the fast path records jumps as spans of decode rows; the events are the same."""
    for seed in range(8):
        prompts, outs, arrival, config, cost = _case(seed)
        tables = []
        for fast_path in (True, False):
            run = run_engine(
                EngineConfig(**config, fast_path=fast_path), prompts, outs, arrival, cost, record_events=True
            )
            trace = ServeTrace(config["block_size"], [run], [np.arange(len(prompts))], None, None)
            table = events_table(trace).to_pydict()
            rows = zip(*(table[k] for k in ("ts", "event", "request_id", "num_blocks", "num_tokens")))
            # rows at the same time may come in another order: compare them sorted, times to rounding
            tables.append(sorted((float(f"{ts:.10g}"), *rest) for ts, *rest in rows))
        fast, slow = tables
        assert fast == slow


def _span_by_steps(openings, start: DecodeStart, rate, budget_s, free):
    """decode_span's definition, one step at a time."""
    step_s, entry_s = rate
    entries, blocks, tokens, n = start
    opened = 0
    elapsed = block_s = entry_sum = token_s = 0.0
    steps = 0
    for m in openings:
        if opened + m > free:
            break
        opened += m
        entries += m
        blocks += m
        tokens += n
        dt = step_s + entry_s * entries
        elapsed += dt
        block_s += blocks * dt
        entry_sum += entries * dt
        token_s += tokens * dt
        steps += 1
        if elapsed >= budget_s:
            break
    return steps, opened, elapsed, block_s, entry_sum, token_s


@settings(max_examples=300, deadline=None)
@given(
    openings=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    entries=st.integers(0, 500),
    extra_blocks=st.integers(-200, 200),
    tokens=st.integers(0, 10_000),
    n=st.integers(1, 50),
    step_ms=st.floats(0.0, 10.0),
    entry_us=st.floats(0.0, 5.0),
    budget_ms=st.one_of(st.just(math.inf), st.floats(0.001, 400.0)),
    free=st.integers(0, 120),
)
def test_decode_span_is_the_step_by_step_sum(
    openings, entries, extra_blocks, tokens, n, step_ms, entry_us, budget_ms, free
):
    start = DecodeStart(entries, max(entries + extra_blocks, 0), tokens, n)
    rate = (step_ms * 1e-3, entry_us * 1e-6)
    want = _span_by_steps(openings, start, rate, budget_ms * 1e-3, free)
    got = decode_span(list(openings), start, rate, budget_ms * 1e-3, free)
    assert (got.steps, got.opened) == want[:2]
    assert list(got[2:]) == pytest.approx(list(want[2:]), rel=1e-9, abs=1e-12)
