"""What the library costs on top of the CLI's core: import time, and the DataFrames of load_events and analyze.

    python benchmarks/bench_api.py [--events 1000000] [--repeat 3]

The events file is bench_analyze.py's synthetic trace (seeded).  Figures, each the best of ``--repeat`` runs in
this process after one warm-up:

- ``import kvtool`` and ``import kvtool.api`` in a fresh interpreter (no numpy/pandas/torch loaded);
- the core loader (``kvtool.events.load.load_events`` -> numpy columns) against ``kvtool.api.load_events``
  (-> a pandas DataFrame, categorical text, Arrow-backed ``block_ids``);
- the core analysis (``analyze_events``) against ``kvtool.api.analyze`` on the same file (-> every table a
  DataFrame and the ``--json`` sections), and ``analyze`` of the loaded DataFrame (converted back through the
  loader's row checks).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def _best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _import_time(module: str, repeat: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True).stdout)
        for _ in range(repeat)
    ]
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from benchmarks.bench_analyze import generate
    from kvtool.api import analyze, load_events
    from kvtool.events.analysis import analyze_events
    from kvtool.events.load import load_events as load_table

    for module in ("kvtool", "kvtool.api"):
        print(f"import {module:<11} {_import_time(module, args.repeat) * 1e3:7.1f} ms")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "events.csv"
        generate(path, args.events)
        rows = len(load_table(path).ts)
        print(f"events file: {rows:,} accepted rows, {path.stat().st_size / 1e6:,.0f} MB")
        figures = {
            "core load_events (numpy)": lambda: load_table(path),
            "api load_events (DataFrame)": lambda: load_events(path),
            "core load + analyze_events": lambda: analyze_events(load_table(path)),
            "api analyze(path)": lambda: analyze(path),
        }
        frame = load_events(path)
        figures["api analyze(DataFrame)"] = lambda: analyze(frame)
        for name, fn in figures.items():
            print(f"{name:<30} {_best(fn, args.repeat):6.2f} s")


if __name__ == "__main__":
    main()
