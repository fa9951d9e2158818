"""The recorder's writer, the plugin's switches and `kvtool record` (no vLLM needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvtool.events.load import load_events
from kvtool.vllm.recorder.launch import RecordOptions, child_environment, collect_outputs, write_plugin_dir
from kvtool.vllm.recorder.plugin import options_from_env
from kvtool.vllm.recorder.writer import RowWriter, output_paths, spool_to_parquet, strip_request_id
from tests.support import REPO_ROOT

ROWS = [
    # ts, event, request id (vLLM's form), blocks, tokens, ids, latency, source, pool, reason, step, groups
    (10.0, "allocate", "req-1-0a1b2c3d", 3, 40, [7, 8, 9], 0.2, None, 20, None, 1, None),
    (10.1, "reuse", "req-2-deadbeef", 2, 32, [7, 8], None, "req-1-0a1b2c3d", 20, None, 2, None),
    (10.1, "allocate", "req-2-deadbeef", 1, 5, [10], 0.3, None, 19, None, 2, None),
    (10.2, "append", "req-1-0a1b2c3d", 0, 1, [], None, None, 19, None, 3, None),
    (10.9, "free", "req-1-0a1b2c3d", 3, 0, [7, 8, 9], 800.0, None, 20, "finished", 4, None),
    (11.0, "free", "req-2-deadbeef", 3, 0, [7, 8, 10], None, None, 23, "preempted", 5, None),
]


def write(tmp_path: Path, name: str, rows=ROWS, hybrid=False):
    paths = output_paths(tmp_path / name, dp_rank=0, dp_size=1)
    writer = RowWriter(paths, block_size=16, randomized_ids=True, hybrid=hybrid)
    buffer = list(rows) + [None] * 4  # a preallocated buffer is longer than what it holds
    writer.put(buffer, len(rows))
    writer.close()
    assert writer.error is None and writer.rows_written == len(rows)
    return paths


def test_written_rows_load_as_schema_1_with_the_random_suffix_stripped(tmp_path):
    paths = write(tmp_path, "events.csv")
    text = paths.target.read_text().splitlines()
    assert text[0] == (
        "ts,event,request_id,num_blocks,num_tokens,block_ids,latency_ms,source_request_id,block_size,"
        "free_pool_blocks,reason,step"
    )
    assert text[2] == "10.100000,reuse,req-2,2,32,7 8,,req-1,16,20,,2"
    table = load_events(paths.target)
    assert table.rejected.count == 0 and table.events == 6
    assert table.request_ids == ("req-1", "req-2")
    assert table.source_request_ids == ("req-1",)
    assert table.latency_ms[4] == 800.0 and table.block_size.tolist() == [16] * 6


def test_parquet_goes_through_a_csv_spool(tmp_path):
    paths = write(tmp_path, "events.parquet")
    assert paths.spool.name == "events.parquet.spool.csv" and paths.spool.exists()
    assert spool_to_parquet(paths.spool, paths.target) == 6
    assert not paths.spool.exists()
    assert paths.target.read_bytes()[:4] == b"PAR1"
    table = load_events(paths.target)
    assert table.events == 6 and table.rejected.count == 0
    assert table.block_id_values.tolist() == [7, 8, 9, 7, 8, 10, 7, 8, 9, 7, 8, 10]


def test_hybrid_rows_carry_per_group_counts(tmp_path):
    rows = [(1.0, "allocate", "a", 4, 8, [1, 2, 3, 4], 0.1, None, 5, None, 1, (2, 2))]
    paths = write(tmp_path, "h.csv", rows, hybrid=True)
    header, row = paths.target.read_text().splitlines()
    assert header.endswith(",group_blocks") and row.endswith(",2 2")


def test_one_file_per_data_parallel_rank():
    assert output_paths("/x/events.parquet", 0, 1).target == Path("/x/events.parquet")
    assert output_paths("/x/events.parquet", 1, 2).target == Path("/x/events.dp1.parquet")
    assert output_paths("/x/events.csv", 3, 4).meta == Path("/x/events.dp3.csv.meta.json")


def test_request_ids_lose_only_vllms_suffix():
    assert strip_request_id("chatcmpl-42-1f2e3d4c", True) == "chatcmpl-42"
    assert strip_request_id("chatcmpl-42-1f2e3d4c", False) == "chatcmpl-42-1f2e3d4c"
    assert strip_request_id("req-7", True) == "req-7"


def test_the_plugin_is_inert_without_kvtool_record():
    assert options_from_env({}) is None
    assert options_from_env({"KVTOOL_RECORD": "  "}) is None
    options = options_from_env({"KVTOOL_RECORD": "e.csv", "KVTOOL_RECORD_SAMPLE": "0.01"})
    assert options.sample == 0.01 and options.path.endswith("/e.csv") and options.appends == "all"
    with pytest.raises(ValueError, match=r"\.csv or \.parquet"):
        options_from_env({"KVTOOL_RECORD": "e.json"})
    with pytest.raises(ValueError, match="KVTOOL_RECORD_APPENDS"):
        options_from_env({"KVTOOL_RECORD": "e.csv", "KVTOOL_RECORD_APPENDS": "some"})


def test_register_without_vllm_says_so_and_returns(monkeypatch):
    code = (
        "import os, sys\n"
        "sys.modules['vllm'] = None  # as if vLLM were absent\n"
        "os.environ['KVTOOL_RECORD'] = 'e.csv'\n"
        "from kvtool.vllm.recorder.plugin import register\n"
        "register(); register()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stderr.count("kvtool recorder: cannot import vLLM's scheduler") == 1


def test_the_generated_entry_point_is_what_vllm_discovers(tmp_path):
    """vLLM's load_plugins_by_group reads importlib.metadata.entry_points(group='vllm.general_plugins')."""
    folder = write_plugin_dir(tmp_path)
    env = child_environment(RecordOptions(tmp_path / "e.parquet", ("x",)), folder, {"VLLM_PLUGINS": "other"})
    assert env["VLLM_PLUGINS"] == "other,kvtool_record" and env["KVTOOL_RECORD"].endswith("e.parquet")
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = entry_points(group='vllm.general_plugins')\n"
        "(ep,) = [e for e in eps if e.name == 'kvtool_record' and e.dist.name == 'kvtool-record']\n"
        "print(ep.value, ep.load().__module__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(folder)!r})\n" + code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.split() == ["kvtool.vllm.recorder.plugin:register", "kvtool.vllm.recorder.plugin"], proc.stderr


def test_record_runs_the_command_and_returns_its_exit_code(run_cli, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        "import os, sys\n"
        "from importlib.metadata import entry_points\n"
        "names = [e.name for e in entry_points(group='vllm.general_plugins')]\n"
        "open(sys.argv[1], 'w').write(os.environ['KVTOOL_RECORD'] + ' ' + ' '.join(names))\n"
        "sys.exit(3)\n"
    )
    seen = tmp_path / "seen.txt"
    result = run_cli("record", "-o", tmp_path / "e.parquet", "--json", "--", sys.executable, script, seen)
    assert result.exit_code == 3
    assert json.loads(result.stdout)["files"] == []
    assert "nothing was recorded" in result.stderr
    target, names = seen.read_text().split(" ", 1)
    assert target == str((tmp_path / "e.parquet").resolve()) and "kvtool_record" in names.split()


def test_record_refuses_bad_options(run_cli, tmp_path):
    assert run_cli("record", "-o", tmp_path / "e.json", "--", "true").exit_code == 2
    result = run_cli("record", "-o", tmp_path / "e.csv", "--sample", "0", "--", "true")
    assert result.exit_code == 2 and "--sample must be a share in (0, 1]" in result.stderr
    result = run_cli("record", "-o", tmp_path / "e.csv", "--", "no-such-command-kvtool")
    assert result.exit_code == 2 and "command not found: no-such-command-kvtool" in result.stderr
    result = run_cli("record", "-o", tmp_path / "e.csv")
    assert result.exit_code == 2 and "no command to run" in result.stderr


def test_a_spool_left_by_a_python_without_pyarrow_is_converted(tmp_path):
    paths = write(tmp_path, "e.parquet")
    meta = {"dp_rank": 0, "rows": 6, "steps": 5, "recorder_s": 0.001, "turned_off": None, "spool": str(paths.spool)}
    paths.meta.write_text(json.dumps(meta))
    (found,) = collect_outputs(tmp_path / "e.parquet")
    assert found.spool_converted and found.rows == 6 and found.engine_steps == 5
    assert load_events(found.path).events == 6 and "spool" not in json.loads(paths.meta.read_text())


def test_a_spool_without_meta_is_an_engine_that_was_killed(tmp_path):
    write(tmp_path, "e.parquet")  # rows flushed, but the engine never closed the recording
    (found,) = collect_outputs(tmp_path / "e.parquet")
    assert found.rows == 6 and found.spool_converted and "killed before closing" in found.turned_off


def test_a_csv_left_open_by_a_killed_engine_is_counted(tmp_path):
    paths = write(tmp_path, "e.csv")
    paths.meta.write_text(json.dumps({"open": True, "dp_rank": 0, "num_blocks": 48}))
    (found,) = collect_outputs(tmp_path / "e.csv")
    assert found.rows == 6 and not found.spool_converted and "killed" in found.turned_off
    assert json.loads(paths.meta.read_text())["num_blocks"] == 48


def fake_vllm_package(root: Path, version: str) -> Path:
    """A stand-in ``vllm`` package with the two classes the plugin wraps (the version is what is tested)."""
    for pkg in ("vllm", "vllm/v1", "vllm/v1/core", "vllm/v1/core/sched", "vllm/v1/engine"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (root / "vllm/v1/core/sched/scheduler.py").write_text("class Scheduler:\n    def __init__(self): pass\n")
    (root / "vllm/v1/engine/core.py").write_text("class EngineCore:\n    def shutdown(self): pass\n")
    return root


@pytest.mark.parametrize(
    ("version", "force", "wrapped", "message"),
    [
        ("0.32.0", "", True, None),
        ("0.31.1", "", False, "vLLM 0.31.1 is not a supported version"),
        ("0.33.0", "1", True, None),
    ],
)
def test_the_plugin_checks_the_vllm_version(tmp_path, version, force, wrapped, message):
    root = fake_vllm_package(tmp_path, version)
    code = (
        "from kvtool.vllm.recorder.plugin import register\n"
        "register()\n"
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "from vllm.v1.engine.core import EngineCore\n"
        "print(getattr(Scheduler.__init__, '_kvtool_recorder', False), "
        "getattr(EngineCore.shutdown, '_kvtool_recorder', False))\n"
    )
    env = {"PYTHONPATH": f"{root}:{REPO_ROOT}", "KVTOOL_RECORD": str(tmp_path / "e.csv"), "KVTOOL_RECORD_FORCE": force}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(wrapped), str(wrapped)]
    if message:
        assert message in proc.stderr and "KVTOOL_RECORD_FORCE=1" in proc.stderr
    else:
        assert proc.stderr == ""


def test_a_command_killed_by_a_signal_exits_like_a_shell_says(run_cli, tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert run_cli("record", "-o", tmp_path / "e.csv", "--", sys.executable, script).exit_code == 128 + 15


def test_an_output_name_held_by_a_folder_is_one_line(run_cli, tmp_path):
    # record clears files of an earlier run under the output's name: a folder there was an IsADirectoryError
    # traceback
    (tmp_path / "e.parquet").mkdir()
    result = run_cli("record", "-o", tmp_path / "e.parquet", "--", "true")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"Error: cannot replace {tmp_path / 'e.parquet'}: Is a directory (--output)\n"
        "Tip: choose another output name, or move that folder away\n"
    )
