"""kvtool record --serve-metrics: the figures of the recording being written, scraped while the engine runs.

The engine is tests/support/record_fault_engine.py (the real recorder and writer thread, without vLLM): 5 allocate
rows of one block and 16 tokens per step, every 0.05 s, 80 steps.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support import REPO_ROOT

ENGINE = REPO_ROOT / "tests" / "support" / "record_fault_engine.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_are_served_while_the_recording_is_written(tmp_path):
    port = _free_port()
    state = tmp_path / "state"
    state.mkdir()
    command = [sys.executable, "-m", "kvtool", "record", "-o", str(tmp_path / "run.csv")]
    command += ["--serve-metrics", f"127.0.0.1:{port}", "--", sys.executable, str(ENGINE), "driver", str(state)]
    command += ["80", "5", "0.05"]
    proc = subprocess.Popen(
        command,
        env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO_ROOT))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
            if samples.get("kvtool_rows", 0) > 0:
                seen = samples
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert seen, err
    # every row allocates one block and nothing is freed: blocks held = rows read, 16 tokens in each
    assert seen["kvtool_held_blocks"] == seen["kvtool_rows"]
    assert seen["kvtool_held_tokens"] == 16 * seen["kvtool_rows"]
    assert seen["kvtool_utilization_now_ratio"] == 1.0
