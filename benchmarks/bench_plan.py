"""Time `kvtool plan`'s search over a 2,000-candidate grid (20 GPU profiles x tp 1-8 x 5 KV dtypes x 5
utilizations) for llama-3.1-70b: 64 requests of 16,384 tokens (best of 5 runs); and with ``--qps``: 300 requests of
2,000 + 200 tokens at 2 requests/s against TTFT p99 <= 2 s and TPOT p99 <= 50 ms, every fitting configuration
simulated, then ``--top 5`` (the scan stops once five meet the target), best of 3 each.

    python benchmarks/bench_plan.py [--qps-only]
"""

from __future__ import annotations

import sys
import time

from kvtool.estimate.profiles import list_gpus
from kvtool.estimate.request import EstimateRequest
from kvtool.plan.candidates import Workload, build_grid
from kvtool.plan.search import PlanRequest, plan_deployments
from kvtool.plan.workload import ServingOptions, serving_workload_from


def _best(request: PlanRequest, runs: int):
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = plan_deployments(request)
        times.append(time.perf_counter() - start)
    return result, min(times)


def main() -> None:
    gpus = tuple(g.name for g in list_gpus(()))
    kv = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16")
    grid = build_grid(gpus, (1, 2, 4, 8), (1,), kv, (0.8, 0.85, 0.9, 0.92, 0.95), (None,))
    base = EstimateRequest(model="llama-3.1-70b")
    if "--qps-only" not in sys.argv:
        result, best = _best(PlanRequest(base, Workload(64, 16384, "bench"), grid), 5)
        print(f"kvtool plan: {len(grid.candidates):,} candidates, {result.fitting:,} fit, best of 5 {best:.3f} s")
    serving = ServingOptions(qps=2.0, ttft_ms=2000.0, tpot_ms=50.0, requests=300)
    workload, ask = serving_workload_from(base, serving, None, input_len=2000, output_len=200)
    for top in (None, 5):
        result, best = _best(PlanRequest(base, workload, grid, top, ask), 3)
        simulated = len(result.rows) + len(result.missed)
        print(
            f"kvtool plan --qps 2{'' if top is None else f' --top {top}'}: {len(grid.candidates):,} candidates, "
            f"{result.fitting:,} fit in memory, {simulated:,} simulated in {result.simulations:,} engine runs, "
            f"{len(result.rows):,} meet the target shown, best of 3 {best:.2f} s"
        )


if __name__ == "__main__":
    main()
