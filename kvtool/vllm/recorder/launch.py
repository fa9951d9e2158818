"""``kvtool record``: run any command (``vllm serve ...``, a driver script) with kvtool's recorder enabled.

vLLM loads ``vllm.general_plugins`` entry points from the Python it runs in, which may not have kvtool installed
(and should not have to).  So the command gets, first on its ``PYTHONPATH``, a scratch folder holding a generated
``kvtool_record-<version>.dist-info`` (METADATA and entry_points.txt: the entry point ``kvtool_record =
kvtool.vllm.recorder.plugin:register``) and a link to this kvtool package; the recorder modules import only the standard
library.  If the command's Python has kvtool installed too, vLLM keys plugins by name and loads one of them.

kvtool record owns the process tree it starts: the command runs in a process group of its own, SIGINT and SIGTERM
go to the whole group, and when the command itself exits kvtool waits for every process left in the group (the
engine cores it started) to end, for ``grace_s`` seconds, then stops them (SIGTERM, then SIGKILL) and says so.  Only
then, with every writer closed, is a Parquet spool converted (the engine's Python may have no pyarrow, or the engine
was killed before it could) and the meta file rewritten from the file as it stands.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvtool.core.errors import UsageError
from kvtool.vllm.recorder.plugin import ENTRY_POINT, ENV_APPENDS, ENV_PATH, ENV_SAMPLE, SUFFIXES
from kvtool.vllm.recorder.recorder import APPENDS
from kvtool.vllm.recorder.writer import META_SUFFIX, SPOOL_SUFFIX, OutputPaths, kvtool_version, write_meta

KILLED = "engine killed before closing the recording; rows up to its last step"
GRACE_S = 30.0  # how long the engines may run on after the command exits before they are stopped
STOP_S = 10.0  # after SIGTERM, how long before SIGKILL
MIN_FREE_BYTES = 1 << 20  # an output folder with less free space is refused up front
LOW_FREE_BYTES = 1 << 30  # ... and one with less than this gets a warning


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    output: Path  # .csv or .parquet; .dpN is inserted per data-parallel rank when there are several
    command: tuple[str, ...]
    sample: float = 1.0
    appends: str = "all"
    grace_s: float = GRACE_S


@dataclasses.dataclass(frozen=True)
class RecordedFile:
    path: str
    dp_rank: int
    rows: int
    engine_steps: int
    recorder_s: float  # time spent in the recorder's code on the engine thread
    turned_off: str | None  # why the recorder stopped early (an error), None when it ran to the end
    spool_converted: bool  # the engine's Python had no pyarrow: its CSV spool was converted here
    partial_row_dropped: bool = False  # the spool ended in half a row (the engine stopped mid-write): not a row
    engine_rows: int | None = None  # the rows the engine's writer flushed, by its own count (None: it never closed)


@dataclasses.dataclass(frozen=True)
class RecordResult:
    command_exit_code: int
    duration_s: float
    files: tuple[RecordedFile, ...]  # one per engine (data-parallel rank) that ran
    stopped_processes: int = 0  # processes of the command still running after it exited, stopped by kvtool
    notes: tuple[str, ...] = ()  # what kvtool had to do or could not do (also printed on stderr)


def check_options(options: RecordOptions) -> None:
    if not options.command:
        raise UsageError("no command to run", tip="kvtool record -o events.parquet -- vllm serve MODEL ...")
    if not str(options.output).lower().endswith(SUFFIXES):
        raise UsageError(f"the output must end in .csv or .parquet, got {options.output}", where="--output")
    if not 0 < options.sample <= 1:
        raise UsageError(f"--sample must be a share in (0, 1], got {options.sample:g}", where="--sample")
    if options.appends not in APPENDS:
        raise UsageError(f"--appends must be one of {', '.join(APPENDS)}", where="--appends")
    if shutil.which(options.command[0]) is None:
        raise UsageError(f"command not found: {options.command[0]}", where="COMMAND")
    if options.grace_s < 0:
        raise UsageError(f"--grace must be zero or more seconds, got {options.grace_s:g}", where="--grace")
    check_output_folder(options.output.resolve().parent)


def check_output_folder(folder: Path) -> list[str]:
    """Refuse, before the run, an output folder that is missing, not writable or full; warn when space is low.

    A permission check (``os.access``) says yes to root on a read-only mount, so a file is really created.
    """
    if not folder.is_dir():
        raise UsageError(f"the output folder does not exist: {folder}", where="--output")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kvtool-record-probe-"):
            pass
    except OSError as err:
        raise UsageError(
            f"the output folder is not writable: {folder} ({err.strerror or err})",
            where="--output",
            tip="record into a folder you can write",
        ) from None
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise UsageError(
            f"the output folder's disk is full: {free:,} bytes free in {folder}",
            where="--output",
            tip="free some space or record elsewhere",
        )
    if free < LOW_FREE_BYTES:
        return [f"only {free / (1 << 20):,.0f} MiB free in {folder}: the recording stops when the disk is full"]
    return []


def write_plugin_dir(folder: Path) -> Path:
    """A folder that, put on PYTHONPATH, gives any Python kvtool's recorder as a vLLM general plugin."""
    package = Path(__file__).resolve().parents[2]  # kvtool/ (this file is kvtool/vllm/recorder/launch.py)
    (folder / "kvtool").symlink_to(package, target_is_directory=True)
    info = folder / f"kvtool_record-{kvtool_version()}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: kvtool-record\nVersion: {kvtool_version()}\n"
        "Summary: kvtool's KV-event recorder as a vLLM general plugin (generated by kvtool record)\n",
        encoding="utf-8",
    )
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{ENTRY_POINT} = kvtool.vllm.recorder.plugin:register\n", encoding="utf-8"
    )
    return folder


def child_environment(options: RecordOptions, plugin_dir: Path, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_dir), base.get("PYTHONPATH", "")) if p)
    env[ENV_PATH] = str(options.output.resolve())
    env[ENV_SAMPLE] = repr(options.sample)
    env[ENV_APPENDS] = options.appends
    allowed = base.get("VLLM_PLUGINS")
    if allowed is not None and ENTRY_POINT not in allowed.split(","):
        env["VLLM_PLUGINS"] = ",".join(p for p in (allowed, ENTRY_POINT) if p)
    return env


def run_record(options: RecordOptions, on_note: Callable[[str], None] = lambda _: None) -> RecordResult:
    """Run the command with the recorder; return what it wrote once every process of the command has ended.

    ``on_note`` hears, as they happen, what kvtool has to do (stop processes left running, a low disk).
    """
    check_options(options)
    notes = check_output_folder(options.output.resolve().parent)
    for note in notes:
        on_note(note)
    _remove_previous(options.output)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvtool-record-") as scratch:
        env = child_environment(options, write_plugin_dir(Path(scratch)), dict(os.environ))
        run = _run_process_tree(list(options.command), env, options.grace_s, on_note)
    notes.extend(run.notes)
    files = collect_outputs(options.output)
    for file in files:
        if file.partial_row_dropped:
            notes.append(f"{file.path}: the engine stopped in the middle of a row; that half row was dropped")
            on_note(notes[-1])
    return RecordResult(
        command_exit_code=run.exit_code,
        duration_s=time.monotonic() - started,
        files=files,
        stopped_processes=run.stopped,
        notes=tuple(notes),
    )


# the child leads a process group of its own (Python 3.11's process_group; before it, setpgrp in the child)
_NEW_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


@dataclasses.dataclass(frozen=True)
class _TreeRun:
    exit_code: int  # the command's own exit code (128 + N when a signal N killed it)
    stopped: int  # processes kvtool had to stop after the command exited
    notes: tuple[str, ...]


def _run_process_tree(command: list[str], env: dict[str, str], grace_s: float, on_note) -> _TreeRun:
    """Run ``command`` as the leader of a new process group; forward SIGINT/SIGTERM to the group; reap the group.

    The group outlives its leader: an engine core whose driver was killed is still in it, so it is found, waited
    for and, past ``grace_s``, stopped.
    """
    try:
        child = subprocess.Popen(command, env=env, **_NEW_GROUP)
    except OSError as err:
        raise UsageError(f"cannot run {command[0]}: {err.strerror or err}", where="COMMAND") from None
    group = child.pid
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, lambda num, _frame: _signal_group(group, num))
        except ValueError:  # not the main thread
            pass
    try:
        code = child.wait()
        notes: list[str] = []
        stopped = _stop_the_rest(group, grace_s, notes, on_note)
        return _TreeRun(exit_code=128 - code if code < 0 else code, stopped=stopped, notes=tuple(notes))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop_the_rest(group: int, grace_s: float, notes: list[str], on_note) -> int:
    """Wait up to ``grace_s`` for the group's other processes to end; then SIGTERM them, then SIGKILL."""
    if _wait_group(group, grace_s):
        return 0
    left = len(group_members(group))
    notes.append(
        f"{left} process(es) of the command still ran {grace_s:g} s after it exited (an engine whose driver was "
        "killed?): stopping them with SIGTERM"
    )
    on_note(notes[-1])
    _signal_group(group, signal.SIGTERM)
    if not _wait_group(group, STOP_S):
        notes.append(
            f"still running {STOP_S:g} s after SIGTERM: killed (SIGKILL); an engine that had not closed its recording "
            "by then is marked so in its file's result"
        )
        on_note(notes[-1])
        _signal_group(group, signal.SIGKILL)
        _wait_group(group, STOP_S)
    return left


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone (or its last members are not ours)
        pass


def _wait_group(group: int, timeout_s: float) -> bool:
    """True once no live process is left in the group (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while group_members(group):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def group_members(group: int) -> list[int]:
    """The live processes of a process group (zombies, which PID 1 of a container may never reap, are not live)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():  # not Linux: ask the kernel whether the group still exists
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [group]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _candidates(output: Path) -> list[Path]:
    """The output and its per-rank variants (``events.dp0.parquet`` ...)."""
    suffix = output.suffix
    stem = output.name[: -len(suffix)]
    return [output, *sorted(output.parent.glob(f"{stem}.dp*{suffix}"))]


def _remove_previous(output: Path) -> None:
    """Files of an earlier recording to the same name would be mistaken for this one's."""
    for path in _candidates(output):
        for stale in (path, path.with_name(path.name + META_SUFFIX), path.with_name(path.name + SPOOL_SUFFIX)):
            if stale.exists():
                try:
                    stale.unlink()
                except OSError as err:  # a folder of that name was an IsADirectoryError traceback
                    raise UsageError(
                        f"cannot replace {stale}: {err.strerror or err}",
                        where="--output",
                        tip="choose another output name, or move that folder away",
                    ) from None


def collect_outputs(output: Path) -> tuple[RecordedFile, ...]:
    """What the engines wrote, finished: called once every process of the command has ended.

    Per engine: a spool or CSV that ends in half a row (an engine killed mid-write) is cut back to its last whole
    row; a leftover Parquet spool is converted (kept, and said, when the disk is full); the meta file is rewritten
    with the row count of the file as it stands.  An engine that never closed its recording (killed: ``vllm serve``
    kills its engine core at shutdown) has a meta file still marked open, or none, and the result says so.
    """
    found = []
    for path in _candidates(output):
        paths = OutputPaths(
            target=path,
            spool=path.with_name(path.name + SPOOL_SUFFIX) if path.suffix.lower() == ".parquet" else path,
            meta=path.with_name(path.name + META_SUFFIX),
        )
        if paths.meta.exists():
            meta = json.loads(paths.meta.read_text(encoding="utf-8"))
        elif paths.spool.exists():
            meta = {"open": True}
        else:
            continue
        engine_rows = None if meta.get("open") else meta.get("rows")  # what the engine's writer says it flushed
        if meta.get("open"):
            meta["turned_off"] = KILLED
        partial = paths.spool.exists() and _drop_partial_row(paths.spool)
        converted = False
        final = paths.target
        if paths.spool != paths.target and paths.spool.exists():
            problem = _convert_spool(paths.spool, paths.target)
            if problem is None:
                meta.pop("spool", None)
                converted = True
            else:
                meta["spool"], final = str(paths.spool), paths.spool
                meta["turned_off"] = "; ".join(filter(None, (meta.get("turned_off"), problem)))
        meta["rows"] = count_rows(final) if final.exists() else 0
        meta["engine_rows"] = engine_rows
        meta["open"] = False
        write_meta(paths, meta)
        found.append(
            RecordedFile(
                path=str(final),
                dp_rank=int(meta.get("dp_rank", 0)),
                rows=int(meta["rows"]),
                engine_rows=engine_rows,
                engine_steps=int(meta.get("steps", 0)),
                recorder_s=float(meta.get("recorder_s", 0.0)),
                turned_off=meta.get("turned_off"),
                spool_converted=converted,
                partial_row_dropped=partial,
            )
        )
    return tuple(found)


def _drop_partial_row(path: Path) -> bool:
    """Cut a CSV that does not end in a newline back to its last whole row; True when something was cut."""
    size = path.stat().st_size
    if size == 0:
        return False
    with path.open("rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        chunk = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - chunk)
            handle.seek(start)
            at = handle.read(end - start).rfind(b"\n")
            if at >= 0:
                handle.truncate(start + at + 1)
                return True
            end = start
        handle.truncate(0)
        return True


def count_rows(path: Path) -> int:
    """Rows of a recorded file as it stands: Parquet from its footer, CSV by reading it (quoted newlines count once)."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    import csv

    with path.open(encoding="utf-8", newline="") as handle:
        return max(sum(1 for _ in csv.reader(handle)) - 1, 0)


def _convert_spool(spool: Path, target: Path) -> str | None:
    """Convert the spool to the Parquet target; None when done, else what stopped it (the spool is kept)."""
    from kvtool.vllm.recorder.writer import describe_write_error, spool_to_parquet

    try:
        spool_to_parquet(spool, target)
        return None
    except OSError as err:  # a full disk: the rows stay in the spool, which analyze reads as it is
        target.unlink(missing_ok=True)
        return f"{describe_write_error(target, err)}; the rows are in {spool} (CSV)"
    except Exception as err:  # pyarrow's own error on a damaged spool: name the file, keep it
        raise UsageError(f"cannot convert the recorded rows to Parquet: {err}", where=str(spool)) from None
