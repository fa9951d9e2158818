"""kvtool record under faults: signals to the driver, the engine and kvtool itself, a full disk, a read-only folder.

The process tree is tests/support/record_fault_engine.py: a driver that starts an engine process which records through
the plugin's own open_recording, writer thread and close (only vLLM's scheduler hooks are absent).  In every case the
final file must hold every row the engine wrote before it stopped, with no gap, and the meta file must agree with it.
Each engine step writes ROWS rows, so "every row up to step k" is a closed form: rows == k x ROWS, steps 1..k.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.support import REPO_ROOT

ENGINE = REPO_ROOT / "tests" / "support" / "record_fault_engine.py"
ROWS = 50


def _start(tmp_path: Path, output: Path, steps: int, step_s: float = 0.02, grace: float = 30.0) -> subprocess.Popen:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "kvtool", "record", "-o", str(output), "--grace", str(grace), "--json", "--"]
    command += [sys.executable, str(ENGINE), "driver", str(state), str(steps), str(ROWS), str(step_s)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_step(tmp_path: Path, step: int, timeout_s: float = 60.0) -> int:
    """Wait until the engine has handed over ``step`` steps; then let its writer flush them (50 ms interval)."""
    path = tmp_path / "state" / "steps"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text and int(text) >= step:
            time.sleep(0.3)  # the writer flushes within 50 ms of a hand-over
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"the engine did not reach step {step}")


def _pid(tmp_path: Path, name: str) -> int:
    return int((tmp_path / "state" / f"{name}.pid").read_text())


def _driver_pid(kvtool_pid: int) -> int:
    """The direct child of kvtool record: the driver."""
    out = subprocess.run(["pgrep", "-P", str(kvtool_pid)], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def _alive(pid: int) -> bool:
    """A process that runs (a zombie, which this sandbox's PID 1 may never reap, has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _rows(path: Path):
    table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    return table.column("step").to_pylist()


def _assert_whole_steps(path: Path, at_least: int) -> int:
    """Steps 1..k each with ROWS rows, k >= at_least; the meta file's row count is the file's. Returns k."""
    steps = _rows(path)
    k = max(steps) if steps else 0
    assert k >= at_least
    assert sorted(steps) == [s for s in range(1, k + 1) for _ in range(ROWS)]
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    assert meta["rows"] == len(steps) == k * ROWS
    assert meta["open"] is False
    assert not list(path.parent.glob("*.tmp"))
    return k


def _finish(proc: subprocess.Popen, timeout_s: float = 90.0) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=timeout_s)
    assert "Traceback" not in err, err
    return proc.returncode, json.loads(out) if out.strip() else {}, err


def test_sigterm_to_the_driver_waits_for_the_orphaned_engine(tmp_path):
    # before: kvtool returned when the driver died and converted the spool while the engine still wrote (51 % lost)
    output = tmp_path / "e.parquet"
    proc = _start(tmp_path, output, steps=60)
    _wait_for_step(tmp_path, 5)
    os.kill(_driver_pid(proc.pid), signal.SIGTERM)
    code, result, _ = _finish(proc)
    assert code == 128 + signal.SIGTERM  # the command's own exit, as a shell reports it
    assert _assert_whole_steps(output, at_least=60) == 60  # the engine ran to its end and closed its recording
    assert result["files"][0]["rows"] == result["files"][0]["engine_rows"] == 60 * ROWS
    assert result["stopped_processes"] == 0


def test_sigkill_to_the_driver_stops_the_engine_after_the_grace_period(tmp_path):
    output = tmp_path / "e.parquet"
    proc = _start(tmp_path, output, steps=10**6, grace=1.0)
    _wait_for_step(tmp_path, 5)
    os.kill(_driver_pid(proc.pid), signal.SIGKILL)
    code, result, err = _finish(proc)
    assert code == 128 + signal.SIGKILL
    last = int((tmp_path / "state" / "steps").read_text())
    # SIGTERM let it close: every step it handed over is in (one more when the signal came before it noted it)
    assert _assert_whole_steps(output, at_least=last) - last in (0, 1)
    assert result["stopped_processes"] == 1
    assert "still ran 1 s after it exited" in err
    assert not _alive(_pid(tmp_path, "engine"))  # nothing left spinning


def test_sigkill_to_the_engine_keeps_every_flushed_row(tmp_path):
    output = tmp_path / "e.parquet"
    proc = _start(tmp_path, output, steps=10**6)
    reached = _wait_for_step(tmp_path, 5)
    os.kill(_pid(tmp_path, "engine"), signal.SIGKILL)
    code, result, _ = _finish(proc)
    assert code == 128 + signal.SIGKILL  # the driver passes on its engine's exit
    _assert_whole_steps(output, at_least=reached)
    assert result["files"][0]["turned_off"].startswith("engine killed before closing the recording")
    assert result["files"][0]["spool_converted"] is True


def test_sigterm_to_kvtool_goes_to_the_whole_tree(tmp_path):
    output = tmp_path / "e.parquet"
    proc = _start(tmp_path, output, steps=10**6)
    _wait_for_step(tmp_path, 5)
    proc.send_signal(signal.SIGTERM)
    code, result, _ = _finish(proc)
    assert code == 128 + signal.SIGTERM
    last = int((tmp_path / "state" / "steps").read_text())
    assert _assert_whole_steps(output, at_least=last) - last in (0, 1)
    assert result["files"][0]["turned_off"] is None  # the engine closed its own recording


def test_sigkill_to_kvtool_leaves_the_engine_to_close_its_own_file(tmp_path):
    output = tmp_path / "e.parquet"
    proc = _start(tmp_path, output, steps=40)
    _wait_for_step(tmp_path, 3)
    proc.kill()
    proc.communicate(timeout=30)
    engine = _pid(tmp_path, "engine")
    deadline = time.monotonic() + 60
    while _alive(engine) and time.monotonic() < deadline:  # it runs on in its own process group, ends by itself
        time.sleep(0.05)
    time.sleep(0.2)
    # its Python has pyarrow (it is this one): it converted its spool at close and wrote the meta itself
    assert _assert_whole_steps(output, at_least=40) == 40


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs (root only: these machines and CI run as root); yields a function (size, read_only)."""
    mounted: list[Path] = []

    def mount(size: str, read_only: bool = False) -> Path:
        folder = tmp_path / f"mnt{len(mounted)}"
        folder.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_full_disk_is_named_and_the_meta_agrees_with_the_file(tmp_path, tmpfs):
    folder = tmpfs("2m")
    output = folder / "e.parquet"
    proc = _start(tmp_path, output, steps=1000, step_s=0.002)  # 50,000 rows of about 70 bytes: 3.5 MB > 2 MiB
    code, result, err = _finish(proc)
    assert code == 0
    file = result["files"][0]
    assert "the disk is full" in file["turned_off"]
    assert "the disk is full" in err  # said on stderr by the engine too
    final = Path(file["path"])  # the spool when the Parquet could not be written, else the Parquet
    steps = _rows(final)
    meta = json.loads(output.with_name(output.name + ".meta.json").read_text())
    assert meta["rows"] == len(steps) == file["rows"] > 0
    assert sorted(set(steps)) == list(range(1, max(steps) + 1))  # no gap, whatever the disk cut
    assert not list(folder.glob("*.tmp"))


def test_a_read_only_folder_is_refused_before_the_command_runs(tmp_path, tmpfs):
    folder = tmpfs("1m", read_only=True)
    proc = _start(tmp_path, folder / "e.parquet", steps=5)
    code, _, err = _finish(proc)
    assert code == 2
    assert err.startswith("Error: the output folder is not writable: ")
    assert "Read-only file system" in err
    assert not (tmp_path / "state" / "engine.pid").exists()  # nothing ran unrecorded
