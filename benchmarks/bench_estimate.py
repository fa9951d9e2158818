"""Start-up: `kvtool estimate --model llama-2-7b` against a hello-world typer app printing a one-row rich table.

Both run in this interpreter and environment (same typer, click, rich, site-packages), alternately, so a busy
machine slows both alike.  The target (issues 9 and 24): estimate within 1.5x of the hello-world app.

The children run without PYTHONDONTWRITEBYTECODE (the script drops it from their environment, whatever the shell
sets), so Python caches kvtool's bytecode as on a user's machine, where pip compiled site-packages at install; with
it set, every run would recompile every kvtool module and charge kvtool ~3x its real import time.  The first round
of runs writes the .pyc files (and warms the file cache) and is not counted.

Also timed: `kvtool estimate --model llama-3.1-8b --gpu H100` (a GPU named by an alias).  The built-in profiles are
read from wherever ``kvtool.profiles`` resolves (an editable install of another checkout maps it to that checkout's
profiles/, parsed.json included).

Run from the repository root:  python benchmarks/bench_estimate.py [--runs N]
Prints the medians (ms) and the ratio; the README "Performance" section quotes it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.5

BASELINE = "hello-world typer app + one-row rich table"
ESTIMATE = "kvtool estimate --model llama-2-7b"
ESTIMATE_GPU = "kvtool estimate --model llama-3.1-8b --gpu H100"  # a GPU by its alias (h100-80gb.yaml)
COMMANDS = {
    BASELINE: [sys.executable, str(ROOT / "benchmarks" / "hello_typer.py")],
    "kvtool --help": [sys.executable, "-m", "kvtool", "--help"],
    ESTIMATE: [sys.executable, "-m", "kvtool", "estimate", "--model", "llama-2-7b"],
    ESTIMATE_GPU: [sys.executable, "-m", "kvtool", "estimate", "--model", "llama-3.1-8b", "--gpu", "H100"],
}


@dataclass(frozen=True)
class Timing:
    wall_ms: float  # median wall-clock time
    cpu_ms: float  # median user + system CPU time of the child (steadier than wall time on a busy machine)


def one_run(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def measure(runs: int, env: dict) -> dict[str, Timing]:
    """Medians per command; the commands take turns, and the first round (it writes the .pyc files, cold file
    cache) is dropped."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(runs + 1):
        for name, cmd in COMMANDS.items():
            samples[name].append(one_run(cmd, env))
    return {
        name: Timing(statistics.median(w for w, _ in runs_[1:]), statistics.median(c for _, c in runs_[1:]))
        for name, runs_ in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # Bytecode cached, as on a user's machine (module docstring): the dropped first round writes the .pyc files.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    timings = measure(args.runs, env)
    base = timings[BASELINE]
    from importlib.metadata import version

    print(
        f"python {sys.version.split()[0]}, typer {version('typer')}, rich {version('rich')}; medians of {args.runs} runs"
    )
    print(f"{'command':<44} {'wall ms':>8} {'CPU ms':>8}  ratio (wall, CPU)")
    for name, t in timings.items():
        print(
            f"{name:<44} {t.wall_ms:8.0f} {t.cpu_ms:8.0f}  {t.wall_ms / base.wall_ms:.2f}x {t.cpu_ms / base.cpu_ms:.2f}x"
        )
    for label, name in (("estimate", ESTIMATE), ("estimate --gpu", ESTIMATE_GPU)):
        est = timings[name]
        print(
            f"{label} / hello-world: {est.wall_ms / base.wall_ms:.2f}x wall, {est.cpu_ms / base.cpu_ms:.2f}x CPU "
            f"(target <= {TARGET_RATIO}x)"
        )


if __name__ == "__main__":
    main()
