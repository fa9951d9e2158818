"""Wall time of the default `kvtool repro` run (README "Performance").

Runs ``python -m kvtool repro --json`` in a fresh interpreter REPEAT times (torch import included, as a user
sees it) and the core per scenario in-process, then prints the figures.  Run from the repository root:

    python benchmarks/bench_repro.py [REPEAT]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli_wall_s(args: list[str], extra_path: Path | None = None) -> tuple[float, dict]:
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvtool", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"kvtool {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sys.path.insert(0, str(ROOT))
    import torch

    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, python {sys.version.split()[0]}")
    walls = []
    for _ in range(repeat):
        wall, report = cli_wall_s(["repro", "--json"])
        walls.append(wall)
    print(
        f"kvtool repro (7 scenarios x buggy/fixed, {report['interleavings']} interleavings each, "
        f"device {report['device']}): median {statistics.median(walls):.1f} s wall over {repeat} runs "
        f"(min {min(walls):.1f}, max {max(walls):.1f}); core {report['elapsed_s']:.1f} s"
    )

    from kvtool.repro.checks import run_scenario
    from kvtool.repro.scenarios import SCENARIO_NAMES

    torch.set_num_threads(1)
    for name in SCENARIO_NAMES:
        start = time.perf_counter()
        run_scenario(name)
        print(f"  {name:<22} {time.perf_counter() - start:5.2f} s")

    target_dir = ROOT / "tests" / "data" / "repro"
    wall, report = cli_wall_s(["repro", "--target", "repro_targets:correct", "--json"], extra_path=target_dir)
    print(f"kvtool repro --target (d_model 16, 200 interleavings): {wall:.1f} s wall, core {report['elapsed_s']:.2f} s")


if __name__ == "__main__":
    main()
