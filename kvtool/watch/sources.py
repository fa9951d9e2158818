"""Where the watcher's rows come from: the file the recorder's writer flushes, or a recorded file replayed.

Both hand :class:`~kvtool.watch.rows.Row` objects to the same :meth:`Watcher.add`, so a replay exercises the live
path.  The recorder (kvtool/vllm/recorder/writer.py) writes CSV and flushes after every batch of steps (at most
every ``WRITE_INTERVAL_S``); a ``.parquet`` target is spooled as ``<target>.spool.csv`` until the recording
closes.  Following a file reads only what was flushed, from its own process: the engine never waits for it.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.events.load import DEFAULT_BLOCK_SIZE, load_events
from kvtool.vllm.recorder.writer import META_SUFFIX, SPOOL_SUFFIX
from kvtool.watch.rows import LineParser, RowError, rows_of_table
from kvtool.watch.state import Watcher

READ_BYTES = 1 << 20  # read at most this much per poll (a backlog is caught up over a few polls)


def recording_meta(target: Path) -> dict:
    """The recorder's ``.meta.json`` beside ``target`` ({} when there is none yet, or it is being replaced)."""
    meta = target.with_name(target.name + META_SUFFIX)
    try:
        value = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class FileFollower:
    """Follow a recording as the writer flushes it (``tail -f`` of its CSV, or of a Parquet target's spool).

    A recording that has already closed (a Parquet target with no spool left) is read whole at once.
    ``finished`` is true once the recording's meta file says it closed and every flushed row has been read.
    """

    def __init__(self, target: Path, watcher: Watcher, *, from_start: bool = True):
        self.target = target
        self.watcher = watcher
        parquet = target.suffix.lower() == ".parquet"
        self.spool = target.with_name(target.name + SPOOL_SUFFIX) if parquet else target
        self.parquet = parquet
        self.from_start = from_start
        self._handle: Any = None
        self._parser: LineParser | None = None
        self._buffer = b""
        self._line = 1  # line number of the last line read (the header is line 1)
        self.finished = False
        self.closed_recording = False

    def clock(self) -> float:
        """Wall time while the recording is open; its last row's time once it has closed."""
        if self.finished and self.watcher.last_ts == self.watcher.last_ts:
            return self.watcher.last_ts
        return time.time()

    def poll(self) -> int:
        """Read what the writer flushed since the last poll; returns the rows read."""
        if self.finished:
            return 0
        meta = recording_meta(self.target)
        closed = meta.get("open") is False
        if self._handle is None:
            if not self._open(meta):
                if closed and self.parquet and self.target.exists():
                    return self._read_closed_parquet(meta)
                return 0
        added = self._read()
        if closed and not added:
            added += self._read()  # what was flushed before the meta file closed
            self.finished = True
            self.closed_recording = True
        return added

    def _open(self, meta: dict) -> bool:
        try:
            handle = self.spool.open("rb")
        except FileNotFoundError:
            return False
        except OSError as err:
            raise InputFileError(f"cannot read the recording: {err.strerror or err}", where=str(self.spool)) from None
        first = handle.readline()
        if not first.endswith(b"\n"):  # the header is not flushed yet
            handle.close()
            return False
        header = next(csv.reader([first.decode("utf-8", "replace")]))
        try:
            self._parser = LineParser(header)
        except RowError as err:
            handle.close()
            raise InputFileError(f"not an events file: {err}", where=str(self.spool)) from None
        self.watcher.set_columns(self._parser.columns, int(meta.get("block_size") or DEFAULT_BLOCK_SIZE))
        if not self.from_start:
            handle.seek(0, 2)
        self._handle = handle
        return True

    def _read(self) -> int:
        assert self._handle is not None and self._parser is not None
        data = self._handle.read(READ_BYTES)
        if not data:
            return 0
        data = self._buffer + data
        cut = data.rfind(b"\n") + 1
        self._buffer = data[cut:]  # a line the writer has not finished flushing
        if not cut:
            return 0
        text = data[: cut - 1].decode("utf-8", "replace")
        lines = text.split("\n")
        if '"' in text or "\r" in text:  # quoted fields (or CRLF): the csv module's reading
            records: Any = csv.reader(lines)
        else:  # the recorder's plain rows: what csv makes of them, at a fraction of its cost
            records = (line.split(",") for line in lines)
        parse, add, reject = self._parser.parse, self.watcher.add, self.watcher.reject
        added = 0
        for fields in records:
            self._line += 1
            if not fields or not any(fields):
                continue
            try:
                row = parse(fields)
            except RowError as err:
                reject(self._line, str(err))
                continue
            add(row)
            added += 1
        return added

    def _read_closed_parquet(self, meta: dict) -> int:
        table = load_events(self.target, default_block_size=int(meta.get("block_size") or DEFAULT_BLOCK_SIZE))
        self.watcher.set_columns(table.columns_found, table.default_block_size)
        added = 0
        for row in rows_of_table(table):
            self.watcher.add(row)
            added += 1
        self.finished = self.closed_recording = True
        return added


class Replay:
    """A recorded file played through the watcher at ``speed`` x its own pace (0: as fast as it reads).

    The clock is the trace's: the first row's ts plus the wall time since the replay started, times ``speed``.
    """

    def __init__(self, path: Path, watcher: Watcher, speed: float = 1.0):
        table = load_events(path)
        self.rows = list(rows_of_table(table))
        watcher.set_columns(table.columns_found, table.default_block_size)
        self.watcher = watcher
        self.speed = speed
        self.start_ts = min(r.ts for r in self.rows)
        self.end_ts = max(r.ts for r in self.rows)
        self.index = 0
        self._wall0: float | None = None

    @property
    def finished(self) -> bool:
        return self.index >= len(self.rows)

    def clock(self) -> float:
        if self._wall0 is None or self.speed <= 0:
            return self.end_ts if self.speed <= 0 and self._wall0 is not None else self.start_ts
        return min(self.start_ts + (time.perf_counter() - self._wall0) * self.speed, self.end_ts)

    def poll(self) -> int:
        if self._wall0 is None:
            self._wall0 = time.perf_counter()
        return self.play_until(None if self.speed <= 0 else self.clock())

    def play_until(self, ts: float | None) -> int:
        """Add the rows up to trace time ``ts`` (None: every row), in file order."""
        rows, add, i = self.rows, self.watcher.add, self.index
        while i < len(rows) and (ts is None or rows[i].ts <= ts):
            add(rows[i])
            i += 1
        added, self.index = i - self.index, i
        return added
