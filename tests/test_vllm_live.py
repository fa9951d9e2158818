"""Optional: capture real vLLM KV events live (skipped unless vLLM is available).

Set VLLM_PYTHON to a Python that has vLLM (e.g. /work/vllm-venv/bin/python), or run the tests in
an environment where vLLM is importable.  The engine run is the one of
tests/data/vllm-events/RECORD.md, which vLLM 0.32.0 reproduces event for event.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import DATA, REPO_ROOT
from kvtool.vllm_analysis import analyze_vllm_events

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)
RECORDED = DATA / "vllm-events" / "live-capture-full-report.jsonl"

pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (set VLLM_PYTHON to use one)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(row):
    return row["seq"], row["type"], row.get("block_hashes"), row.get("parent_block_hash"), row.get("session_id")


def test_live_capture_reproduces_the_recorded_run(tmp_path):
    port, replay_port = free_port(), free_port()
    out = tmp_path / "live.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    capture = subprocess.Popen(
        [sys.executable, "-m", "kvtool", "capture", "--endpoint", f"tcp://127.0.0.1:{port}",
         "--replay-endpoint", f"tcp://*:{replay_port}", "-o", str(out), "--duration", "600", "--json"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # vLLM's ipc socket paths must stay under 107 characters: a short scratch folder, not tmp_path.
    scratch = Path(tempfile.mkdtemp(prefix="kvv"))
    for name in ("tmp", "rpc", "cache", "hf", "xdg", "inductor"):
        (scratch / name).mkdir()
    engine_env = dict(
        os.environ,
        VLLM_HOST_IP="127.0.0.1", VLLM_LOOPBACK_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(scratch / "tmp"),
        VLLM_RPC_BASE_PATH=str(scratch / "rpc"), VLLM_CACHE_ROOT=str(scratch / "cache"), HF_HOME=str(scratch / "hf"),
        XDG_CACHE_HOME=str(scratch / "xdg"), TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
    )
    try:
        engine = subprocess.run(
            [VLLM_PYTHON, str(REPO_ROOT / "tests" / "vllm_live_engine.py"), "--model-dir", str(tmp_path / "model"),
             "--endpoint", f"tcp://127.0.0.1:{port}", "--replay-endpoint", f"tcp://*:{replay_port}", "--kv-blocks", "40"],
            env=engine_env, capture_output=True, text=True, timeout=900,
        )
        assert engine.returncode == 0, engine.stderr[-3000:]
        capture.send_signal(signal.SIGTERM)
        stdout, stderr = capture.communicate(timeout=60)
    finally:
        if capture.poll() is None:
            capture.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    assert capture.returncode == 0, stderr
    summary = json.loads(stdout)
    assert (summary["malformed_frames"], summary["batches_unrecovered"]) == (0, 0)
    engine_summary = json.loads([line for line in engine.stdout.splitlines() if line.startswith("{")][-1])
    assert engine_summary["num_gpu_blocks"] == 40

    live = [json.loads(line) for line in out.read_text().splitlines()]
    recorded = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    assert [key(r) for r in live] == [key(r) for r in recorded]
    a = analyze_vllm_events(out)
    # vLLM keeps one of its 40 blocks as the null block: at most 39 can hold cached content.
    assert a.peak_cached_blocks <= engine_summary["num_gpu_blocks"] - 1


def test_gap_filled_from_vllms_real_replay_socket(tmp_path):
    """vLLM's own ZmqEventPublisher (msgspec encoding, ROUTER replay) with batches 2 and 3 lost."""
    port, replay_port = free_port(), free_port()
    out = tmp_path / "events.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    capture = subprocess.Popen(
        [sys.executable, "-m", "kvtool", "capture", "--endpoint", f"tcp://127.0.0.1:{port}",
         "--replay-endpoint", f"tcp://*:{replay_port}", "-o", str(out), "--duration", "120", "--max-events", "14",
         "--json"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        publisher = subprocess.run(
            [VLLM_PYTHON, str(REPO_ROOT / "tests" / "vllm_real_publisher.py"), "--endpoint", f"tcp://127.0.0.1:{port}",
             "--replay-endpoint", f"tcp://*:{replay_port}", "--batches", "6", "--lose", "2,3"],
            capture_output=True, text=True, timeout=300, env=dict(os.environ, VLLM_HOST_IP="127.0.0.1"),
        )
        assert publisher.returncode == 0, publisher.stderr[-3000:]
        stdout, stderr = capture.communicate(timeout=60)
    finally:
        if capture.poll() is None:
            capture.kill()
    assert capture.returncode == 0, stderr
    summary = json.loads(stdout)
    assert (summary["gaps"], summary["batches_missed"], summary["batches_recovered"], summary["batches_unrecovered"]) == (
        1, 2, 2, 0,
    )
    expected = json.loads(publisher.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "batch_ts"} for r in rows] == expected
