"""The serving simulation against scenarios worked out by hand, conservation, determinism and the events export."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import numpy as np
import pytest

from kvtool.simulate.export import events_table, export_paths, request_figures
from kvtool.simulate.serving import CostModel, ServeConfig, simulate_serving
from tests.support import DATA

# Every step takes exactly 1 ms: no per-token, per-slot or per-entry cost.
ONE_MS = CostModel(step_overhead_ms=1.0, token_us=0.0, kv_token_us=0.0, table_entry_us=0.0)


def run(prompt, output, arrival, b, pool_tokens, **kw):
    config = ServeConfig(pool_tokens=pool_tokens, cost=kw.pop("cost", ONE_MS), **kw)
    return simulate_serving(np.array(prompt), np.array(output), np.array(arrival, dtype=float), b, config)


def test_one_request_by_hand():
    # Prompt 20, output 5, b = 16, 1 ms steps.  Step 0 prefills 20 tokens (2 blocks) and emits token 1 (TTFT 1 ms);
    # steps 1-4 write tokens 21..24 (still 2 blocks); done at 5 ms holding 24 = 20 + 5 - 1 tokens.
    result, trace = run([20], [5], [0.0], 16, 1600)
    assert result.completed == 1 and result.preemptions == 0
    assert result.ttft_p50_s == pytest.approx(0.001)
    assert result.queue_delay_p50_s == 0.0
    assert result.span_s == pytest.approx(0.005)
    assert result.peak_blocks == 2
    # tokens held per step 20, 21, 22, 23, 24 for 1 ms each; blocks 2 throughout
    assert result.utilization == pytest.approx((20 + 21 + 22 + 23 + 24) / (16 * 2 * 5))
    assert result.mean_blocks == pytest.approx(2.0)
    assert result.tpot_p50_s == pytest.approx(0.001)


def test_preemption_of_the_newest_request_by_hand():
    # Pool of 4 blocks of 4 tokens; A and B arrive at 0 with prompt 4, output 9; 1 ms steps.
    # Step 0: both prefilled (1 block each).  Step 1: tokens 5 -> 2 blocks each (4 in use).  Steps 2-4: 6, 7, 8.
    # Boundary 5: both need a 3rd block; the pool is full, so B (the newest) is preempted after emitting 5 tokens
    # and frees 2 blocks; A takes one.  A runs alone through step 8 (12 tokens, 3 blocks) and finishes at 9 ms.
    # Boundary 9: B is recomputed (4 + 5 = 9 tokens, 3 blocks) and runs steps 9-12: done at 13 ms.
    result, trace = run([4, 4], [9, 9], [0.0, 0.0], 4, 16)
    assert result.preemptions == 1 and result.preempted_requests == 1
    assert result.completed == 2
    assert result.peak_blocks == 4
    assert result.span_s == pytest.approx(0.013)
    assert trace.completion_s.tolist() == pytest.approx([0.009, 0.013])
    # block-ms: A 1 + 2x4 + 3x4 = 21; B 1 + 2x4 = 9, then 3x4 = 12: 42 over 13 ms
    assert result.mean_blocks == pytest.approx(42 / 13)
    # token-ms: A 4..12 = 72; B 4..8 = 30 and 9..12 = 42: 144
    assert result.utilization == pytest.approx(144 / (4 * 42))
    assert result.ttft_p50_s == pytest.approx(0.001)
    figs = request_figures(trace, 2)
    assert figs.holding_time_s.tolist() == pytest.approx([0.009, 0.005 + 0.004])
    assert figs.block_seconds.tolist() == pytest.approx([0.021, 0.021])
    assert figs.preemptions.tolist() == [0, 1]


def test_max_num_seqs_runs_requests_one_after_another():
    # max_num_seqs 1: three requests of output 3 run back to back, 3 steps each: done at 3, 6, 9 ms.
    result, trace = run([10, 10, 10], [3, 3, 3], [0, 0, 0], 16, 1600, max_num_seqs=1)
    assert trace.completion_s.tolist() == pytest.approx([0.003, 0.006, 0.009])
    assert result.queue_delay_p99_s == pytest.approx(np.percentile([0, 0.003, 0.006], 99))


def test_cost_model_step_time():
    # One request, prompt 100, output 2, b = 16: step 0 computes 100 tokens with 7 blocks in use; step 1 computes
    # 1 token with 7 blocks (101 tokens).  Step = 2 ms + 10 us x tokens + (1 us + 16 x 0.5 us) x blocks.
    cost = CostModel(step_overhead_ms=2.0, token_us=10.0, kv_token_us=0.5, table_entry_us=1.0)
    result, _ = run([100], [2], [0.0], 16, 1600, cost=cost)
    first = 2e-3 + 100 * 10e-6 + 7 * 9e-6
    second = 2e-3 + 1 * 10e-6 + 7 * 9e-6
    assert result.ttft_p50_s == pytest.approx(first)
    assert result.span_s == pytest.approx(first + second)


def test_arrivals_wait_for_their_step_boundary():
    # B arrives at 2.5 ms while A decodes in 1 ms steps: B is admitted at the 3 ms boundary (queue 0.5 ms).
    result, trace = run([10, 10], [10, 2], [0.0, 0.0025], 16, 1600)
    figs = request_figures(trace, 2)
    assert result.queue_delay_p99_s == pytest.approx(np.percentile([0, 0.0005], 99))
    assert trace.completion_s[1] == pytest.approx(0.005)
    assert figs.holding_time_s[1] == pytest.approx(0.002)


def test_prefix_cache_stores_full_prefix_blocks_once():
    # Two prompts of 40 tokens sharing a 32-token prefix, b = 16: 2 shared blocks stored once + 1 own each = 4.
    result, _ = run([40, 40], [1, 1], [0, 0], 16, 1600, shared_prefix_tokens=32, prefix_cache=True)
    assert result.peak_blocks == 4
    without, _ = run([40, 40], [1, 1], [0, 0], 16, 1600)
    assert without.peak_blocks == 6


def test_never_fitting_requests_are_counted_and_the_rest_complete():
    result, _ = run([10, 5000, 20], [5, 5, 5], [0, 0, 0], 16, 1600)
    assert result.never_fit == 1
    assert result.completed == 2


def test_split_pools_divide_the_capacity():
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 3000, 300)
    result, _ = run(
        prompt, rng.integers(1, 200, 300), np.sort(rng.uniform(0, 5, 300)), 16, 40_000, split_threshold_tokens=1000
    )
    assert [p.name for p in result.pools] == ["short", "long"]
    assert sum(p.pool_blocks for p in result.pools) == result.pool_blocks
    assert sum(p.requests for p in result.pools) == 300
    assert result.completed == 300
    assert all(p.peak_blocks <= p.pool_blocks for p in result.pools)


def _integrate_events(path):
    """A reference reading of the exported events with analyze's definitions, written for this test."""
    per = defaultdict(list)
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            per[row["request_id"]].append(row)
    out = {}
    for rid, rows in per.items():
        blocks = tokens = 0
        last_t = None
        hold = block_s = token_s = 0.0
        allocated = freed = peak = 0
        for row in rows:  # already in time order
            t = float(row["ts"])
            if last_t is not None and blocks > 0:
                hold += t - last_t
                block_s += blocks * (t - last_t)
                token_s += tokens * (t - last_t)
            last_t = t
            n = int(row["num_blocks"])
            if row["event"] == "free":
                blocks -= n
                freed += n
                if blocks == 0:
                    tokens = 0
            else:
                blocks += n
                allocated += n
                tokens += int(row["num_tokens"])
            peak = max(peak, blocks)
        out[rid] = dict(
            hold=hold,
            block_s=block_s,
            util=token_s / (int(rows[0]["block_size"]) * block_s),
            allocated=allocated,
            freed=freed,
            end_blocks=blocks,
            peak=peak,
        )
    return out


def test_exported_events_reproduce_the_per_request_figures(run_cli, tmp_path):
    events = tmp_path / "ev.csv"
    args = [
        "--trace",
        DATA / "simulate" / "azure-2023-conv.csv",
        "--requests",
        "300",
        "--seed",
        "2",
        "--qps",
        "30",
        "--serve",
        "--kv-tokens",
        "12000",
        "--block-sizes",
        "16,64",
        "--shared-prefix",
        "64",
        "--prefix-cache",
    ]
    res = run_cli("simulate", *args, "--export-events", events, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    paths = export_paths(events, [16, 64])
    assert [r["exported_events"] for r in out["results"]] == [str(paths[16]), str(paths[64])]
    assert sum(r["preemptions"] for r in out["results"]) > 0  # the tight pool forces some
    from kvtool.simulate.lengths import load_trace, sample_requests
    from kvtool.simulate.run import SimulateOptions, run_simulation

    reqs = sample_requests(load_trace(DATA / "simulate" / "azure-2023-conv.csv"), 300, seed=2)
    _, traces = run_simulation(
        reqs,
        SimulateOptions(
            block_sizes=[16, 64],
            serve=True,
            kv_tokens=12000,
            qps=30,
            seed=2,
            shared_prefix_tokens=64,
            prefix_cache=True,
        ),
    )
    for b in (16, 64):
        got = _integrate_events(paths[b])
        figs = request_figures(traces[b], reqs.count)
        assert len(got) == reqs.count
        for i in range(reqs.count):
            g = got[f"r{i}"]
            # conservation: every allocated or reused block is freed by the end
            assert g["allocated"] == g["freed"] and g["end_blocks"] == 0
            assert g["hold"] == pytest.approx(figs.holding_time_s[i], rel=1e-9)
            assert g["block_s"] == pytest.approx(figs.block_seconds[i], rel=1e-9)
            assert g["util"] == pytest.approx(figs.utilization[i], rel=1e-9)
            assert g["peak"] == figs.peak_blocks[i]


def test_pool_integrals_equal_the_sum_of_requests():
    # Without a prefix cache the physical pool is the sum of the requests: time-weighted blocks x span equals the
    # sum of per-request block-seconds.
    rng = np.random.default_rng(5)
    n = 400
    result, trace = run(
        rng.integers(1, 2000, n), rng.integers(1, 300, n), np.sort(rng.uniform(0, 20, n)), 32, 30_000, cost=CostModel()
    )
    figs = request_figures(trace, n)
    assert result.preemptions > 0
    assert result.mean_blocks * result.span_s == pytest.approx(np.nansum(figs.block_seconds), rel=1e-9)
    assert 0 < result.utilization <= 1
    assert result.peak_blocks <= result.pool_blocks


def test_conservation_and_determinism_on_the_azure_trace():
    from kvtool.simulate.lengths import load_trace, sample_requests

    reqs = sample_requests(load_trace(DATA / "simulate" / "azure-2023-conv.csv"), 3000, seed=1)
    config = ServeConfig(pool_tokens=40_000)
    a, ta = simulate_serving(reqs.prompt_tokens, reqs.output_tokens, reqs.arrival_s, 16, config)
    b, _ = simulate_serving(reqs.prompt_tokens, reqs.output_tokens, reqs.arrival_s, 16, config)
    assert a == b
    assert a.completed == 3000 and a.preemptions > 0
    table = events_table(ta).to_pydict()
    ev = np.array(table["event"])
    nb = np.array(table["num_blocks"])
    assert nb[ev != "free"].sum() == nb[ev == "free"].sum()
    assert (np.diff(np.array(table["ts"])) >= 0).all()
    # replaying the events in file order (frees first at equal times) gives the simulator's peak, never above
    # the pool: a free at the end of a step and the next step's allocations share one timestamp
    in_use = np.cumsum(np.where(ev == "free", -nb, nb))
    assert in_use.max() == a.peak_blocks <= a.pool_blocks
    # every request's last event is its free
    last = {}
    for e, r in zip(table["event"], table["request_id"]):
        last[r] = e
    assert set(last.values()) == {"free"}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 80), st.floats(0, 0.2)), min_size=1, max_size=25),
    b=st.sampled_from([1, 2, 4, 8, 16, 32]),
    pool=st.integers(1, 2000),
    max_seqs=st.integers(1, 8),
    prefix=st.integers(0, 64),
    split=st.one_of(st.none(), st.integers(1, 300)),
)
def test_invariants_on_random_workloads(data, b, pool, max_seqs, prefix, split):
    prompt = np.array([d[0] for d in data])
    output = np.array([d[1] for d in data])
    arrival = np.sort(np.array([d[2] for d in data]))
    cost = CostModel(step_overhead_ms=1.0, token_us=1.0, kv_token_us=0.01, table_entry_us=0.01, refresh_steps=4)
    result, trace = run(
        prompt,
        output,
        arrival,
        b,
        pool,
        cost=cost,
        max_num_seqs=max_seqs,
        shared_prefix_tokens=prefix,
        prefix_cache=prefix > 0,
        split_threshold_tokens=split,
    )
    assert result.completed + result.never_fit == len(data)
    assert result.peak_blocks <= result.pool_blocks
    if result.completed:
        assert 0 < result.utilization <= 1 + 1e-12
    table = events_table(trace).to_pydict()
    ev = np.array(table["event"], dtype=object)
    nb = np.array(table["num_blocks"], dtype=np.int64)
    assert (nb >= 0).all()
    assert nb[ev != "free"].sum() == nb[ev == "free"].sum()
    figs = request_figures(trace, len(data))
    ran = ~np.isnan(figs.block_seconds)
    assert (figs.block_seconds[ran] >= 0).all()
    assert (figs.utilization[ran & (figs.block_seconds > 0)] <= 1 + 1e-12).all()
    # a request's peak blocks are its final tokens' blocks: ceil((prompt + max(output, 1) - 1) / b)
    final = -(-(prompt + np.maximum(output, 1) - 1) // b)
    assert (figs.peak_blocks[ran] == final[ran]).all()


def test_progress_is_reported_per_block_size():
    from kvtool.simulate.lengths import load_trace, sample_requests
    from kvtool.simulate.run import SimulateOptions, run_simulation

    reqs = sample_requests(load_trace(DATA / "simulate" / "azure-2023-conv.csv"), 5000, seed=0)
    calls = []
    run_simulation(
        reqs,
        SimulateOptions(block_sizes=[16, 32], serve=True),
        lambda label, done, total: calls.append((label, done, total)),
    )
    assert {c[0] for c in calls} == {"serve block 16", "serve block 32"}
    assert ("serve block 32", 5000, 5000) in calls
    assert all(0 <= done <= total for _, done, total in calls)


def test_unsorted_arrivals_are_served_in_time_order():
    # C arrives first, then A, then B; max_num_seqs 1 and 2 ms of work each: C 0-2, A 2-4, B 4-6 ms.
    result, trace = run([10, 10, 10], [2, 2, 2], [0.001, 0.002, 0.0], 16, 1600, max_num_seqs=1)
    assert trace.completion_s.tolist() == pytest.approx([0.004, 0.006, 0.002])


def _step_by_step(prompt, output, arrival, b, caps, pool_of, max_seqs, overhead_s, token_s, prefix=0):
    """A token-by-token reference of the same scheduling rules, written for this test (one step per loop).

    Pools: request r lives in pool pool_of[r] of caps[pool] blocks, with its own FCFS queue; the newest running
    request of an overflowing pool is preempted; admissions go to the pool whose queue head arrived first.  With a
    prefix cache, request r shares sh[r] = floor(min(prefix, prompt)/b) full blocks, stored once per pool: a pool
    holds its requests' own blocks plus the most shared blocks of any of them.
    """
    from collections import deque

    def blocks(x):
        return -(-x // b)

    sh = [min(prefix, p) // b for p in prompt]

    def in_use(rs):
        return sum(blocks(tok[r]) - sh[r] for r in rs) + max((sh[r] for r in rs), default=0)

    n = len(prompt)
    out = [max(o, 1) for o in output]
    order = sorted(
        (i for i in range(n) if blocks(prompt[i] + out[i] - 1) <= caps[pool_of[i]]), key=lambda i: (arrival[i], i)
    )
    pools = range(len(caps))
    waiting, running = [deque() for _ in pools], [[] for _ in pools]
    tok, emitted = {}, [0] * n
    ttft, done = [np.nan] * n, [np.nan] * n
    t, ai, preemptions, peak = arrival[order[0]], 0, 0, 0
    while True:
        while ai < len(order) and arrival[order[ai]] <= t:
            waiting[pool_of[order[ai]]].append(order[ai])
            ai += 1
        preempted = False
        for p in pools:
            for r in running[p]:
                tok[r] += 1  # the next token of every decoding request
            while in_use(running[p]) > caps[p]:
                v = running[p].pop()  # the newest in this pool
                preemptions += 1
                preempted = True
                waiting[p].appendleft(v)
        decoding = sum(len(rs) for rs in running)
        prefill, new, admitted = 0, [], 0
        open_pools = [p for p in pools if waiting[p]]
        while not preempted and open_pools and decoding + admitted < max_seqs:
            p = min(open_pools, key=lambda q: arrival[waiting[q][0]])
            h = waiting[p][0]
            x = prompt[h] + emitted[h]
            cached = max((sh[r] for r in running[p]), default=0)
            tok[h] = x
            if in_use(running[p] + [h]) > caps[p]:
                open_pools.remove(p)
                continue
            waiting[p].popleft()
            running[p].append(h)
            admitted += 1
            prefill += x - min(sh[h], cached) * b
            if emitted[h] == 0:
                new.append(h)
            if not waiting[p]:
                open_pools.remove(p)
        if not decoding + admitted:
            if ai == len(order):
                break
            t = max(t, arrival[order[ai]])
            continue
        peak = max(peak, sum(in_use(running[p]) for p in pools))
        t += overhead_s + token_s * (prefill + decoding)
        for r in new:
            ttft[r] = t
        for p in pools:
            for r in running[p]:
                emitted[r] += 1
            for r in [r for r in running[p] if emitted[r] == out[r]]:
                running[p].remove(r)
                done[r] = t
    return np.array(ttft), np.array(done), preemptions, peak


@pytest.mark.parametrize(
    "seed,b,pool_blocks,max_seqs,prefix,split",
    [
        (0, 16, 300, 256, 0, None),
        (1, 8, 500, 16, 0, None),
        (2, 32, 100, 64, 0, None),
        (3, 4, 2000, 8, 0, None),
        (4, 128, 40, 256, 0, None),
        (5, 16, 200, 256, 100, None),
        (6, 8, 300, 32, 300, None),
        (7, 32, 60, 256, 64, None),
        (8, 16, 300, 256, 0, 400),
        (9, 8, 400, 24, 50, 300),
    ],
)
def test_event_jumping_matches_a_step_by_step_reference(seed, b, pool_blocks, max_seqs, prefix, split):
    # With no per-block cost the step time is exact between events, so jumping from event to event must give the
    # same first-token and completion times, preemptions and peak as stepping token by token.  (This test found
    # recomputed prefills being charged one decode token too many.)
    rng = np.random.default_rng(seed)
    n = 150
    prompt = rng.integers(1, 600, n).tolist()
    output = rng.integers(0, 150, n).tolist()
    arrival = np.round(np.sort(rng.uniform(0, 2, n)), 3).tolist()
    cost = CostModel(step_overhead_ms=2.0, token_us=20.0, kv_token_us=0.0, table_entry_us=0.0, refresh_steps=7)
    result, trace = run(
        prompt,
        output,
        arrival,
        b,
        pool_blocks * b,
        cost=cost,
        max_num_seqs=max_seqs,
        shared_prefix_tokens=prefix,
        prefix_cache=prefix > 0,
        split_threshold_tokens=split,
    )
    lengths = [p + o for p, o in zip(prompt, output)]
    if split is None:
        caps, pool_of = [pool_blocks], [0] * n
    else:  # capacity in proportion to each class's tokens (docs/simulate.md)
        pool_of = [int(x > split) for x in lengths]
        long_blocks = round(pool_blocks * sum(x for x in lengths if x > split) / sum(lengths))
        caps = [pool_blocks - long_blocks, long_blocks]
        assert [p.pool_blocks for p in result.pools] == caps
    ttft, done, preemptions, peak = _step_by_step(
        prompt, output, arrival, b, caps, pool_of, max_seqs, 2e-3, 20e-6, prefix
    )
    assert result.preemptions == preemptions
    assert result.peak_blocks == peak
    assert np.allclose(trace.completion_s, done, equal_nan=True, rtol=1e-12, atol=1e-9)
    assert np.allclose(trace.first_token_s, ttft, equal_nan=True, rtol=1e-12, atol=1e-9)
    assert result.ttft_p99_s == pytest.approx(np.nanpercentile(np.asarray(ttft) - np.asarray(arrival), 99))
