"""Benchmark the fleet simulation (`kvtool simulate --serve --replicas N --router P`): CPU time per request.

Run from the repository root:  python benchmarks/bench_fleet.py [--quick]
In-process (the trace read once, outside the timing); CPU time of the simulation and its summary per run:

1. one replica through the fleet path against the single-engine loop (run_simulation), Mooncake's FAST'25
   conversation trace at block 16, the default pool: the ratio of their per-request costs (aim <= 1.5x);
2. that trace on 16 replicas, each of the five policies;
3. 1,000,000 requests (bootstrap of azure-2023-conv, Poisson at 300 requests/s) on 64 replicas, round-robin,
   --no-regret.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = Path("/work/shared/data/traces/mooncake-fast25-conversation.jsonl")
AZURE = ROOT / "tests" / "data" / "simulate" / "azure-2023-conv.csv"


def _cpu(fn):
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    from kvtool.simulate.fleet.routers import POLICIES
    from kvtool.simulate.fleet.run import FleetOptions, run_policies
    from kvtool.simulate.inputs import inputs_from, prepare
    from kvtool.simulate.run import run_simulation

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100,000 requests instead of 1,000,000 in run 3")
    args = ap.parse_args()

    reqs, options = prepare(inputs_from(dict(trace=MOONCAKE, serve=True, block_size="16")))
    n = reqs.count
    single, _ = _cpu(lambda: run_simulation(reqs, options, keep_traces=False))
    one, rep = _cpu(lambda: run_policies(reqs, options, FleetOptions(replicas="1")))
    print(
        f"1. mooncake conversation ({n:,} requests), one engine: {single / n * 1e6:,.0f} us/request; one replica "
        f"through the fleet: {one / n * 1e6:,.0f} us/request ({one / single:.2f}x)"
    )
    for policy in POLICIES:
        cpu, rep = _cpu(lambda p=policy: run_policies(reqs, options, FleetOptions(replicas="16", router=p)))
        r = rep.results[0]
        print(
            f"2. 16 replicas, {policy}: {cpu:.1f} s CPU, {cpu / n * 1e6:,.0f} us/request; hits "
            f"{r.prefix_hit_rate:.1%} (bound {r.infinite_cache_hit_rate:.1%}), regret {r.regret_rate:.1%}, "
            f"TTFT p99 {r.serve.ttft_p99_s:.2f} s"
        )
    count = 100_000 if args.quick else 1_000_000
    reqs, options = prepare(
        inputs_from(dict(trace=AZURE, serve=True, block_size="16", requests=count, seed=1, qps=300.0))
    )
    options = dataclasses.replace(options, qps=300.0)
    fleet = FleetOptions(replicas="64", router="round-robin", measure_regret=False)
    cpu, rep = _cpu(lambda: run_policies(reqs, options, fleet))
    r = rep.results[0]
    print(
        f"3. {count:,} requests on 64 replicas, round-robin: {cpu:.1f} s CPU, {cpu / count * 1e6:,.1f} us/request; "
        f"TTFT p99 {r.serve.ttft_p99_s:.3f} s, {r.serve.throughput_tokens_per_s:,.0f} output tok/s"
    )


if __name__ == "__main__":
    main()
