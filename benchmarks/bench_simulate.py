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
        "--block-size",
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
    parser.add_argument("--against", type=Path, help="another checkout, run in turns with --root (serving runs)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    for name, argv in RUNS.items():
        if args.only not in name or (args.against is not None and "serve" not in name):
            continue
        times, cpus = [], []
        other_cpus: list[float] = []
        for _ in range(args.repeat):
            wall, cpu = _run(name, args.root, argv)
            times.append(wall)
            cpus.append(cpu)
            if args.against is not None:
                other_cpus.append(_run(name, args.against, _without_new_options(argv))[1])
        per = ""
        if "serve" in name:
            per = f"; {_us_per_request(argv, min(cpus)):.0f} us CPU per request and block size"
        print(
            f"{name}: wall best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s; "
            f"CPU (user + sys) best {min(cpus):.2f} s{per}"
        )
        if other_cpus:
            print(
                f"  against {args.against}: CPU best {min(other_cpus):.2f} s, "
                f"{_us_per_request(argv, min(other_cpus)):.0f} us per request and block size; "
                f"ratio {min(cpus) / min(other_cpus):.2f}x"
            )


def _run(name: str, root: Path, argv: list[str]) -> tuple[float, float]:
    """One fresh `python -m kvtool simulate ARGV --json` of the checkout at ``root``: (wall s, CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "simulate", *argv, "--json"],
        env=dict(os.environ, PYTHONPATH=str(root)),
        cwd=root,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{name} ({root}): exit {proc.returncode}: {proc.stderr.strip()}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _without_new_options(argv: list[str]) -> list[str]:
    """The command for a checkout from before the serving scheduler: without --shared-prefix and its value."""
    if "--shared-prefix" not in argv:
        return argv
    i = argv.index("--shared-prefix")
    return argv[:i] + argv[i + 2 :]


def _us_per_request(argv: list[str], cpu_s: float) -> float:
    count = int(argv[argv.index("--requests") + 1]) if "--requests" in argv else 19_366
    sizes = len(argv[argv.index("--block-size") + 1].split(",")) if "--block-size" in argv else 5
    return 1e6 * cpu_s / (count * sizes)


if __name__ == "__main__":
    main()
