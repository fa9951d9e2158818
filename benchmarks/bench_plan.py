"""Time `kvtool plan`'s search over a 2,000-candidate grid (20 GPU profiles x tp 1-8 x 5 KV dtypes x 5
utilizations) for llama-3.1-70b, 64 requests of 16,384 tokens; prints the best of 5 runs."""

from __future__ import annotations

import time

from kvtool.estimate.profiles import list_gpus
from kvtool.estimate.request import EstimateRequest
from kvtool.plan.candidates import Workload, build_grid
from kvtool.plan.search import PlanRequest, plan_deployments


def main() -> None:
    gpus = tuple(g.name for g in list_gpus(()))
    kv = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16")
    grid = build_grid(gpus, (1, 2, 4, 8), (1,), kv, (0.8, 0.85, 0.9, 0.92, 0.95), (None,))
    request = PlanRequest(EstimateRequest(model="llama-3.1-70b"), Workload(64, 16384, "bench"), grid)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        result = plan_deployments(request)
        times.append(time.perf_counter() - start)
    print(f"kvtool plan: {len(grid.candidates):,} candidates, {result.fitting:,} fit, best of 5 {min(times):.3f} s")


if __name__ == "__main__":
    main()
