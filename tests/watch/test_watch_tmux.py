"""kvtool watch --replay in a real terminal: tmux runs it on a 120x50 screen, capture-pane reads the screen.

Skipped only where tmux is not installed (``which tmux``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.support import DATA, REPO_ROOT

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")


def _screen(session: str) -> str:
    return subprocess.run([TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def test_the_live_view_draws_in_a_terminal(tmp_path):
    session = f"kvw-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "done"
    fixture = DATA / "vllm-record" / "recorded-48-blocks.parquet"
    # 12 s of trace at 6x: about 2 s of screen; the shell then waits so the last screen can be read
    command = (
        f"cd {REPO_ROOT} && PYTHONPATH={os.environ.get('PYTHONPATH', REPO_ROOT)} {sys.executable} -m kvtool watch "
        f"--replay {fixture} --speed 6 --refresh 0.25; echo $? > {done}; sleep 30"
    )
    subprocess.run([TMUX, "new-session", "-d", "-s", session, "-x", "120", "-y", "50", command], check=True)
    try:
        seen_live = ""
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            screen = _screen(session)
            if "top holders now" in screen and "since start" in screen:
                seen_live = seen_live or screen
            time.sleep(0.2)
        final = _screen(session)
    finally:
        subprocess.run([TMUX, "kill-session", "-t", session], capture_output=True)
    assert done.exists(), final
    assert seen_live, final  # a screen drawn while the replay ran
    assert "kvtool watch" in seen_live and "utilization" in seen_live
    # the real run's 14 preemptions in 12 s (tests/data/vllm-record/README.md) make a storm: printed and exit 5
    assert "ALERT" in final and "preemption_storm" in final
    assert done.read_text().strip() == "5"
    assert "pool in use" in final and "/ 47 blocks" in final  # 48 blocks, one of them vLLM's null block
