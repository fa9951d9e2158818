"""Benchmark `kvtool simulate`: whole-process wall time of the runs the README quotes.

Run from the repository root:  python benchmarks/bench_simulate.py [--only serve] [--root OTHER_CHECKOUT]
Each command runs in a fresh interpreter (python -m kvtool ...), best of --repeat runs, so the figures include
start-up, imports, reading the trace and printing the JSON.  Serving runs also print the CPU time per request and
block size (the per-request cost).  ``--root`` runs another checkout's kvtool (e.g. an older main, for a
before/after); its options must exist there.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "simulate" / "azure-2023-conv.csv"

RUNS = {
    "static, 1,000,000 sampled requests x 5 block sizes": [
        "--trace",
        str(TRACE),
        "--requests",
        "1000000",
        "--seed",
        "1",
        "--kv-tokens",
        "113000",
    ],
    "static, lognormal 1,000,000 requests x 5 block sizes": [
        "--dist",
        "lognormal",
        "--mean",
        "1366",
        "--p99",
        "4259",
        "--requests",
        "1000000",
    ],
    "serve, whole azure-2023-conv (19,366 requests) x 5 block sizes": ["--trace", str(TRACE), "--serve"],
    "serve, 100,000-request bootstrap x 5 block sizes": [
        "--trace",
        str(TRACE),
        "--requests",
        "100000",
        "--seed",
        "1",
        "--serve",
        "--block-sizes",
        "8,16,32,64,128",
    ],
    "serve, 100,000-request bootstrap x 5 block sizes, 1,000-token shared system prompt": [
        "--trace",
        str(TRACE),
        "--requests",
        "100000",
        "--seed",
        "1",
        "--serve",
        "--shared-prefix",
        "1000",
    ],
    "serve, 100,000-request bootstrap, 40,000-token pool (preemptions)": [
        "--trace",
        str(TRACE),
        "--requests",
        "100000",
        "--seed",
        "1",
        "--serve",
        "--kv-tokens",
        "40000",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run only the runs whose name contains this")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose kvtool runs")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(args.root))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    for name, argv in RUNS.items():
        if args.only not in name:
            continue
        times, cpus = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "kvtool", "simulate", *argv, "--json"],
                env=env,
                cwd=args.root,
                capture_output=True,
                text=True,
            )
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if proc.returncode != 0:
                sys.exit(f"{name}: exit {proc.returncode}: {proc.stderr.strip()}")
        per = ""
        if "serve" in name:
            count = int(argv[argv.index("--requests") + 1]) if "--requests" in argv else 19_366
            sizes = len(argv[argv.index("--block-sizes") + 1].split(",")) if "--block-sizes" in argv else 5
            per = f"; {1e6 * min(cpus) / (count * sizes):.0f} us CPU per request and block size"
        print(
            f"{name}: wall best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s; "
            f"CPU (user + sys) best {min(cpus):.2f} s{per}"
        )


if __name__ == "__main__":
    main()
