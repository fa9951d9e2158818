"""The recorder's output side: rows formatted and written on a background thread, never on vLLM's hot path.

The engine-core thread hands over whole buffers of row tuples (one per engine step, or sooner when a buffer fills);
this thread formats them as CSV (schema 1 plus the optional columns of docs/events-schema.md), writes and flushes
them, and hands the emptied buffer back for reuse.  A Parquet target is spooled as CSV next to it
(``<target>.spool.csv``) and converted when the recording closes, so a killed engine still leaves every flushed
row behind.  Only the standard library is imported at module level: this runs inside the vLLM process, which may
not have pyarrow (the spool is then kept and ``kvtool record`` converts it).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Column order of a recorded file.  The first five are schema 1's required columns; the rest are optional ones.
COLUMNS = (
    "ts",
    "event",
    "request_id",
    "num_blocks",
    "num_tokens",
    "block_ids",
    "latency_ms",
    "source_request_id",
    "block_size",
    "free_pool_blocks",
    "reason",
    "step",
    "group_blocks",
)
SPOOL_SUFFIX = ".spool.csv"
META_SUFFIX = ".meta.json"
# vLLM appends "-" and 8 characters of a random uuid4 hex to every request id (InputProcessor.assign_request_id).
_RANDOM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_CLOSE = None  # the queue item that ends the writer thread
_LAST_FREE = ("finished", "aborted")  # free reasons after which a request writes no more rows
SPARE_BUFFERS = 8  # emptied buffers kept for reuse; a burst of steps between two writes allocates new ones
META_RESERVED_BYTES = 4096  # the open meta file is padded to this size, so the closing one fits on a full disk
WRITE_INTERVAL_S = 0.05  # the writer wakes at most this often (rows reach the file within this delay of their step)


@dataclasses.dataclass(frozen=True)
class OutputPaths:
    """Where one engine's rows go."""

    target: Path  # the file the user asked for (per data-parallel rank when there are several)
    spool: Path  # where rows are written as they come (== target for CSV)
    meta: Path  # the run's facts as JSON (vLLM version, pool size, rows, recorder time)


def output_paths(path: str | Path, dp_rank: int, dp_size: int) -> OutputPaths:
    """The files of one data-parallel rank: ``events.parquet`` -> ``events.dp1.parquet`` when dp_size > 1."""
    target = Path(path)
    if dp_size > 1:
        suffixes = "".join(target.suffixes[-2:]) if target.name.endswith(".csv.gz") else target.suffix
        stem = target.name[: len(target.name) - len(suffixes)] if suffixes else target.name
        target = target.with_name(f"{stem}.dp{dp_rank}{suffixes}")
    parquet = target.suffix.lower() == ".parquet"
    spool = target.with_name(target.name + SPOOL_SUFFIX) if parquet else target
    return OutputPaths(target=target, spool=spool, meta=target.with_name(target.name + META_SUFFIX))


def kvtool_version() -> str:
    """The version of the kvtool package this module belongs to (imported already, being its parent package)."""
    return str(getattr(sys.modules.get("kvtool"), "__version__", "unknown"))


def strip_request_id(request_id: str, randomized: bool) -> str:
    """The client's request id: vLLM's random suffix removed (when vLLM added one)."""
    return _RANDOM_SUFFIX.sub("", request_id) if randomized else request_id


class RowWriter:
    """A daemon thread that formats and writes the rows handed to it; buffers come back through ``spare``."""

    def __init__(self, paths: OutputPaths, block_size: int, randomized_ids: bool, hybrid: bool):
        self.paths = paths
        self.block_size = block_size
        self.randomized_ids = randomized_ids
        self.hybrid = hybrid
        self.rows_written = 0
        self.cpu_s = 0.0  # CPU time of this thread formatting and writing (it holds the GIL meanwhile)
        self.error: BaseException | None = None  # the first write error; the recorder turns itself off on it
        self.spare: queue.SimpleQueue = queue.SimpleQueue()  # emptied buffers, for reuse
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._ids: dict[str, str] = {}  # vLLM's request id -> the client's, for the requests in flight only
        paths.spool.parent.mkdir(parents=True, exist_ok=True)
        self._file = paths.spool.open("w", encoding="utf-8", newline="")
        self._csv = csv.writer(self._file)
        self._csv.writerow(COLUMNS if hybrid else COLUMNS[:-1])
        self._file.flush()
        self._thread = threading.Thread(target=self._run, name="kvtool-recorder-writer", daemon=True)
        self._thread.start()

    def put(self, rows: list, count: int) -> None:
        """Hand over ``rows[:count]`` (the engine thread does nothing more with the list)."""
        self._work.put((rows, count))

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, stop the thread and close the file."""
        self._work.put(_CLOSE)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        """Drain the queue, write, sleep a little: the engine thread loses the GIL to this one in few, short turns."""
        closing = False
        while not closing:
            batch = [self._work.get()]
            while True:
                try:
                    batch.append(self._work.get_nowait())
                except queue.Empty:
                    break
            for item in batch:
                if item is _CLOSE:
                    closing = True
                    continue
                rows, count = item
                if self.error is None:
                    try:
                        started = time.thread_time()
                        self._write(rows, count)
                        self.cpu_s += time.thread_time() - started
                    except Exception as err:  # a full disk, a file system gone away: the recorder stops, vLLM goes on
                        self.error = err
                if self.spare.qsize() < SPARE_BUFFERS:  # more would only keep old rows alive
                    self.spare.put(rows)
            if not closing:
                time.sleep(WRITE_INTERVAL_S)
        try:
            self._file.close()
        except OSError as err:
            self.error = self.error or err

    def _write(self, rows: list, count: int) -> None:
        strip, ids, block_size = self._strip, self._ids, self.block_size
        out = []
        for i in range(count):
            ts, event, rid, nblocks, ntok, block_ids, latency, source, pool, reason, step, groups = rows[i]
            name = ids.get(rid)
            if name is None:
                name = ids[rid] = strip(rid)
            record = [
                f"{ts:.6f}",
                event,
                name,
                nblocks,
                ntok,
                " ".join(map(str, block_ids)) if block_ids else "",
                "" if latency is None else f"{latency:.4f}",
                "" if source is None else strip(source),
                block_size,
                pool,
                reason or "",
                step,
            ]
            if self.hybrid:
                record.append(" ".join(map(str, groups)) if groups else "")
            out.append(record)
            if event == "free" and reason in _LAST_FREE:  # the request's last row: its id is not needed again
                del ids[rid]
        self._csv.writerows(out)
        self._file.flush()
        self.rows_written += count

    def _strip(self, request_id: str) -> str:
        return strip_request_id(request_id, self.randomized_ids)


def spool_to_parquet(spool: Path, target: Path) -> int:
    """Convert a spooled CSV to Parquet (needs pyarrow); remove the spool; return the row count."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    text = {name: pa.string() for name in ("event", "request_id", "block_ids", "source_request_id", "reason")}
    text["group_blocks"] = pa.string()
    table = pacsv.read_csv(
        spool,
        convert_options=pacsv.ConvertOptions(
            column_types={"ts": pa.float64(), "latency_ms": pa.float64(), **text},
            strings_can_be_null=True,
            null_values=[""],
        ),
    )
    pq.write_table(table, target)
    spool.unlink()
    return table.num_rows


def finish_output(paths: OutputPaths, meta: dict, say: Callable[[str], None]) -> None:
    """Convert a Parquet spool when pyarrow is here (else keep it and say how to convert), write the meta file."""
    if paths.spool != paths.target:
        try:
            spool_to_parquet(paths.spool, paths.target)
        except ImportError:
            meta["spool"] = str(paths.spool)
            say(
                f"pyarrow is not installed in this Python: the rows are in {paths.spool} (CSV); "
                "'kvtool record' converts it, or read it as it is"
            )
        except Exception as err:
            meta["spool"] = str(paths.spool)
            say(f"could not convert {paths.spool} to Parquet ({err}); the rows are in the CSV spool")
    write_meta(paths, meta)


def write_meta(paths: OutputPaths, meta: dict) -> None:
    """The meta file, replaced atomically (a reader never sees half of it).

    On a full disk the replacement cannot be written: the meta file is then rewritten in place, in the space the
    first (padded) meta file holds, and no ``.tmp`` is left behind.
    """
    text = json.dumps(meta, indent=2) + "\n"
    if meta.get("open"):  # JSON allows trailing white space: keep room for the closing meta
        text = text.ljust(META_RESERVED_BYTES - 1) + "\n"
    tmp = paths.meta.with_name(paths.meta.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, paths.meta)
    except OSError:
        tmp.unlink(missing_ok=True)
        if not paths.meta.exists() or len(text.encode("utf-8")) > paths.meta.stat().st_size:
            raise
        with paths.meta.open("r+", encoding="utf-8") as handle:  # blocks already allocated: no new space needed
            handle.write(text.ljust(paths.meta.stat().st_size - 1) + "\n")


def describe_write_error(path: Path, err: BaseException) -> str:
    """What stopped the writer, in words: a full disk is named as such."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full: writing {path} failed (no space left on device)"
    if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"writing {path} is not allowed: {err.strerror}"
    return f"writing {path} failed: {err}"
