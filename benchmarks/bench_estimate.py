"""Median wall time of `kvtool estimate --model llama-2-7b` next to `python -c "import typer, rich.console, rich.table"`.

Run from the repository root:  python benchmarks/bench_estimate.py [--runs N]
Prints both medians (ms) and their ratio; the README "Performance" section quotes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def median_wall_ms(cmd: list[str], runs: int, env: dict) -> float:
    times = []
    for _ in range(runs + 1):  # the first run warms the file cache and is dropped
        start = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    baseline = median_wall_ms([sys.executable, "-c", "import typer, rich.console, rich.table"], args.runs, env)
    helped = median_wall_ms([sys.executable, "-m", "kvtool", "--help"], args.runs, env)
    estimate = median_wall_ms([sys.executable, "-m", "kvtool", "estimate", "--model", "llama-2-7b"], args.runs, env)
    print(f"python -c 'import typer, rich.console, rich.table': median {baseline:.0f} ms ({args.runs} runs)")
    print(f"kvtool --help (the CLI's floor, for context):      median {helped:.0f} ms ({helped / baseline:.2f}x)")
    print(f"kvtool estimate --model llama-2-7b:                median {estimate:.0f} ms ({estimate / baseline:.2f}x)")
    print(f"ratio estimate / import: {estimate / baseline:.2f}x")


if __name__ == "__main__":
    main()
