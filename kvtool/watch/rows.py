"""The watcher's copy of the event rows: appended one at a time, handed to ``kvtool.events.analysis`` as tables.

A row is what one line of an events file holds (docs/events-schema.md), already parsed: :class:`Row`.  The store
keeps every accepted row in columns (Python lists while they arrive, numpy arrays once a snapshot asks for them)
and builds :class:`~kvtool.events.load.EventTable` objects from them: the whole run (what ``kvtool analyze`` reads
from the same file) and a window (the rows since a time, with each request's holding at that time as one opening
row: :mod:`kvtool.watch.state`).  Nothing here computes a figure: analysis.py does, on those tables.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

from kvtool.events.load import (
    DEFAULT_BLOCK_SIZE,
    EVENT_TYPES,
    MAX_ABS_TS_S,
    MAX_COUNT,
    MAX_LATENCY_MS,
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    EventTable,
    RejectedRows,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

EVENT_CODE = {name: code for code, name in enumerate(EVENT_TYPES)}
FREE_CODE = EVENT_CODE["free"]
FIRST_REJECTED_KEPT = 10
nan = float("nan")


class Row(NamedTuple):
    """One parsed event row (the columns analysis reads)."""

    ts: float
    event: int  # kvtool.events.load.ALLOCATE, APPEND, REUSE or FREE
    request_id: str
    num_blocks: int
    num_tokens: int
    block_ids: tuple[int, ...] | None  # None: the row has no block_ids value
    latency_ms: float  # NaN where blank
    source_request_id: str | None
    block_size: int | None  # None where blank (the default applies)
    free_pool_blocks: float  # NaN where blank


class RowError(ValueError):
    """A line that is not an accepted row; the message is its reason (load.py's words where it has one)."""


class LineParser:
    """Lines of an events CSV (the recorder's columns or any schema-1 header) -> :class:`Row`.

    The watcher's hot path: the column positions are looked up once and a plain run of ASCII digits is read as an
    integer without going through ``float``; the checks and their order (so the reason given for a bad line) are
    load.py's.
    """

    def __init__(self, header: list[str]):
        names = [h.strip().lower() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise RowError(f"the header has no {', '.join(missing)} column (schema 1: {', '.join(REQUIRED_COLUMNS)})")
        self.columns = tuple(names)
        self.width = len(names)
        self.at = {name: names.index(name) for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if name in names}
        at = self.at
        self._ts, self._event, self._request = at["ts"], at["event"], at["request_id"]
        self._blocks, self._tokens = at["num_blocks"], at["num_tokens"]
        self._ids = at.get("block_ids", -1)
        self._latency = at.get("latency_ms", -1)
        self._source = at.get("source_request_id", -1)
        self._size = at.get("block_size", -1)
        self._pool = at.get("free_pool_blocks", -1)

    def parse(self, fields: list[str]) -> Row:
        if len(fields) != self.width:
            raise RowError("wrong number of columns")
        try:
            ts = float(fields[self._ts])
        except ValueError:
            raise RowError("unparseable ts") from None
        if not abs(ts) <= MAX_ABS_TS_S:
            raise RowError("ts out of range")
        event = EVENT_CODE.get(fields[self._event].strip().lower())
        if event is None:
            raise RowError("unknown event type")
        request_id = fields[self._request].strip()
        if not request_id:
            raise RowError("missing request_id")
        num_blocks = _count(fields[self._blocks].strip(), "num_blocks", blank_ok=False)
        num_tokens = _count(fields[self._tokens].strip(), "num_tokens", blank_ok=event == FREE_CODE)
        block_ids = None
        if self._ids >= 0:
            text = fields[self._ids].strip()
            if text:
                try:
                    block_ids = tuple(map(int, text.split()))
                except ValueError:
                    raise RowError("unparseable block_ids") from None
        latency = nan if self._latency < 0 else _number(fields[self._latency].strip(), "latency_ms", MAX_LATENCY_MS)
        block_size = None
        if self._size >= 0:
            size_text = fields[self._size].strip()
            if size_text:
                block_size = _count(size_text, "block_size", blank_ok=False)
                if block_size <= 0:
                    raise RowError("non-positive block_size")
        source = fields[self._source].strip() or None if self._source >= 0 else None
        pool = nan if self._pool < 0 else _number(fields[self._pool].strip(), "free_pool_blocks", math.inf)
        return Row(ts, event, request_id, num_blocks, num_tokens, block_ids, latency, source, block_size, pool)


def _count(text: str, name: str, *, blank_ok: bool) -> int:
    if text.isdigit() and text.isascii():  # the recorder's rows: plain digits
        whole = int(text)
        if whole > MAX_COUNT:
            raise RowError(f"unparseable {name}")
        return whole
    if not text:
        if blank_ok:
            return 0
        raise RowError(f"missing {name}")
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"unparseable {name}") from None
    if value < 0:
        raise RowError(f"negative {name}")
    if value != int(value) or value > MAX_COUNT:
        raise RowError(f"unparseable {name}")
    return int(value)


def _number(text: str, name: str, limit: float) -> float:
    if not text:
        return nan
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"unparseable {name}") from None
    if value < 0:
        raise RowError(f"negative {name}")
    if not value <= limit:
        raise RowError(f"{name} out of range")
    return value


@dataclasses.dataclass
class _Arrays:
    """The rows as numpy columns (file order), valid for ``count`` rows."""

    count: int
    ts: np.ndarray
    event: np.ndarray
    request: np.ndarray
    num_blocks: np.ndarray
    num_tokens: np.ndarray
    block_size: np.ndarray  # 0 where blank
    latency_ms: np.ndarray
    free_pool_blocks: np.ndarray
    source_request: np.ndarray  # -1 where blank
    id_rows: np.ndarray
    id_values: np.ndarray


class RowStore:
    """Every accepted row of one engine, in arrival order, with request ids interned (first-appearance order)."""

    def __init__(self, columns: tuple[str, ...] = (), default_block_size: int = DEFAULT_BLOCK_SIZE):
        self.columns = columns  # the header the rows came with (which optional columns the file has)
        self.default_block_size = default_block_size
        self.request_ids: list[str] = []
        self.request_code: dict[str, int] = {}
        self.source_ids: list[str] = []
        self.source_code: dict[str, int] = {}
        self.rejected = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.first_rejected: list[tuple[int, str]] = []
        self._pending: list[list] = [[] for _ in range(9)]
        self._pending_ids: tuple[list[int], list[int]] = ([], [])
        self._arrays: _Arrays | None = None
        self.count = 0

    def add(self, row: Row) -> int:
        """Append one row; returns the request's code (index into ``request_ids``)."""
        code = self.request_code.get(row.request_id)
        if code is None:
            code = self.request_code[row.request_id] = len(self.request_ids)
            self.request_ids.append(row.request_id)
        source = -1
        if row.source_request_id is not None:
            source = self.source_code.get(row.source_request_id, -1)
            if source < 0:
                source = self.source_code[row.source_request_id] = len(self.source_ids)
                self.source_ids.append(row.source_request_id)
        p = self._pending
        p[0].append(row.ts)
        p[1].append(row.event)
        p[2].append(code)
        p[3].append(row.num_blocks)
        p[4].append(row.num_tokens)
        p[5].append(row.block_size or 0)
        p[6].append(row.latency_ms)
        p[7].append(row.free_pool_blocks)
        p[8].append(source)
        if row.block_ids:
            self._pending_ids[0].extend([self.count] * len(row.block_ids))
            self._pending_ids[1].extend(row.block_ids)
        self.count += 1
        return code

    def reject(self, line_number: int, reason: str) -> None:
        """A line that was not accepted: counted with its reason, never dropped silently."""
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
        if len(self.first_rejected) < FIRST_REJECTED_KEPT:
            self.first_rejected.append((line_number, reason))

    def arrays(self) -> _Arrays:
        """The rows so far as numpy columns (the rows added since the last call converted and appended)."""
        import numpy as np

        if self._arrays is not None and self._arrays.count == self.count:
            return self._arrays
        p = self._pending
        dtypes = (np.float64, np.int8, np.int32, np.int32, np.int32, np.int64, np.float64, np.float64, np.int32)
        new = [np.asarray(values, dtype=dtype) for values, dtype in zip(p, dtypes)]
        new_ids = (np.asarray(self._pending_ids[0], np.int64), np.asarray(self._pending_ids[1], np.int64))
        self._pending = [[] for _ in range(9)]
        self._pending_ids = ([], [])
        old = self._arrays
        if old is not None:
            olds = [old.ts, old.event, old.request, old.num_blocks, old.num_tokens, old.block_size, old.latency_ms]
            olds += [old.free_pool_blocks, old.source_request]
            new = [np.concatenate((a, b)) for a, b in zip(olds, new)]
            new_ids = (np.concatenate((old.id_rows, new_ids[0])), np.concatenate((old.id_values, new_ids[1])))
        ts, event, request, blocks, tokens, size, latency, pool, source = new
        self._arrays = _Arrays(
            self.count, ts, event, request, blocks, tokens, size, latency, pool, source, new_ids[0], new_ids[1]
        )
        return self._arrays

    def has(self, column: str) -> bool:
        return column in self.columns

    def table(self, where: str) -> EventTable:
        """Every row so far as the EventTable ``load_events`` makes of the same file."""
        import numpy as np

        a = self.arrays()
        block_size = None
        if self.has("block_size"):
            block_size = np.where(a.block_size > 0, a.block_size, self.default_block_size)
        return EventTable(
            path=where,
            columns_found=self.columns,
            ts=a.ts,
            event=a.event,
            request=a.request,
            request_ids=tuple(self.request_ids),
            num_blocks=a.num_blocks,
            num_tokens=a.num_tokens,
            block_size=block_size,
            latency_ms=a.latency_ms if self.has("latency_ms") else None,
            free_pool_blocks=a.free_pool_blocks if self.has("free_pool_blocks") else None,
            source_request=a.source_request if self.has("source_request_id") else None,
            source_request_ids=tuple(self.source_ids),
            block_id_rows=a.id_rows if self.has("block_ids") else None,
            block_id_values=a.id_values if self.has("block_ids") else None,
            rejected=self.rejected_rows(),
            default_block_size=self.default_block_size,
        )

    def rejected_rows(self) -> RejectedRows:
        return RejectedRows(self.rejected, dict(self.rejected_by_reason), tuple(self.first_rejected), 0)


def rows_of_table(table: EventTable):
    """The rows of an EventTable (a file ``load_events`` read) in file order, as :class:`Row` (``--replay``)."""
    import numpy as np

    n = table.events
    ids_of_row: dict[int, tuple[int, ...]] = {}
    rows, values = table.block_id_rows, table.block_id_values
    if rows is not None and values is not None and rows.size:
        cuts = np.flatnonzero(np.diff(rows)) + 1
        for chunk_rows, chunk in zip(np.split(rows, cuts), np.split(values, cuts)):
            ids_of_row[int(chunk_rows[0])] = tuple(chunk.tolist())
    ts, ev, req = table.ts.tolist(), table.event.tolist(), table.request.tolist()
    nb, nt = table.num_blocks.tolist(), table.num_tokens.tolist()
    lat = table.latency_ms.tolist() if table.latency_ms is not None else [nan] * n
    fp = table.free_pool_blocks.tolist() if table.free_pool_blocks is not None else [nan] * n
    bs = table.block_size.tolist() if table.block_size is not None else [None] * n
    src = table.source_request.tolist() if table.source_request is not None else [-1] * n
    names, sources = table.request_ids, table.source_request_ids
    for i in range(n):
        yield Row(
            ts[i],
            ev[i],
            names[req[i]],
            nb[i],
            nt[i],
            ids_of_row.get(i),
            lat[i],
            sources[src[i]] if src[i] >= 0 else None,
            bs[i],
            fp[i],
        )
