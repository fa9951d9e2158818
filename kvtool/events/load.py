"""Load a KV-cache events file (schema 1: CSV, CSV.gz or Parquet) into numpy columns.

The schema is documented in docs/events-schema.md.  Reading goes through pyarrow (typed, multi-threaded); every
check that decides whether a row is accepted is vectorised (pyarrow compute or numpy), and a row that fails one is
not dropped silently: it is counted in :class:`RejectedRows` with its row number and reason.

Row numbers: for CSV files, the line number in the file (the header is line 1; a value with an embedded newline is
not supported); for Parquet, the 1-based row index.

Public API (also for ``kvtool simulate``): :func:`load_events` -> :class:`EventTable`, and :func:`write_events`.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.threads import in_background

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

SCHEMA_VERSION = 1
EVENT_TYPES = ("allocate", "append", "reuse", "free")
ALLOCATE, APPEND, REUSE, FREE = 0, 1, 2, 3
REQUIRED_COLUMNS = ("ts", "event", "request_id", "num_blocks", "num_tokens")
OPTIONAL_COLUMNS = ("block_ids", "latency_ms", "source_request_id", "block_size", "free_pool_blocks")
DEFAULT_BLOCK_SIZE = 16
MAX_COUNT = 2**31 - 1  # larger block/token counts in one row are rejected (keeps int64 sums exact)
FIRST_REJECTED_SHOWN = 10

_SNIFF_BYTES = 1 << 16
_READ_BLOCK_BYTES = 8 << 20  # CSV parse blocks (pyarrow's default 1 MiB): fewer chunks to unify and join
_NUMBER_RE = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_BLOCK_ID_RE = r"^[0-9]{1,18}$"
_SCHEMA_TIP = (
    "an events file needs the columns ts, event, request_id, num_blocks, num_tokens (schema 1, docs/events-schema.md)"
)

# Reasons a row is rejected, in the order they are checked (a row reports its first reason).
_REASONS = (
    "wrong number of columns",
    "missing ts",
    "unparseable ts",
    "missing event",
    "unknown event type",
    "missing request_id",
    "missing num_blocks",
    "unparseable num_blocks",
    "negative num_blocks",
    "missing num_tokens",
    "unparseable num_tokens",
    "negative num_tokens",
    "unparseable block_ids",
    "unparseable latency_ms",
    "negative latency_ms",
    "unparseable block_size",
    "non-positive block_size",
    "unparseable free_pool_blocks",
    "negative free_pool_blocks",
)
_REASON_CODE = {name: i + 1 for i, name in enumerate(_REASONS)}


@dataclasses.dataclass(frozen=True)
class RejectedRows:
    """Rows excluded from the analysis, never dropped silently."""

    count: int
    by_reason: dict[str, int]
    first: tuple[tuple[int, str], ...]  # (row number, reason) of the first few rejected rows, in file order
    blank_rows: int  # rows with no value at all (blank lines): skipped, not rejected


@dataclasses.dataclass(frozen=True, eq=False)
class EventTable:
    """The accepted rows of an events file, as numpy columns in file order (one entry per accepted row)."""

    path: str
    columns_found: tuple[str, ...]  # header names as found (normalised: stripped, lower case)
    ts: np.ndarray  # float64 seconds
    event: np.ndarray  # int8: ALLOCATE, APPEND, REUSE or FREE
    request: np.ndarray  # int32 index into request_ids (first-appearance order)
    request_ids: tuple[str, ...]
    num_blocks: np.ndarray  # int32 (larger counts are rejected)
    num_tokens: np.ndarray  # int32; a blank num_tokens on a free row reads 0
    block_size: np.ndarray | None  # int64 tokens per block of each row (blank: the default); None without the column
    latency_ms: np.ndarray | None  # float64, NaN where blank; None without the column
    free_pool_blocks: np.ndarray | None  # float64, NaN where blank; None without the column
    source_request: np.ndarray | None  # int32 index into source_request_ids, -1 where blank
    source_request_ids: tuple[str, ...]
    block_id_rows: np.ndarray | None  # int64 row (index into the accepted rows) of each listed block id
    block_id_values: np.ndarray | None  # int64 block id, parallel to block_id_rows; None without the column
    rejected: RejectedRows
    default_block_size: int

    @property
    def events(self) -> int:
        return int(self.ts.shape[0])


def load_events(
    path: str | Path,
    default_block_size: int = DEFAULT_BLOCK_SIZE,
    progress: Callable[[str], None] | None = None,
) -> EventTable:
    """Read an events file (.csv, .csv.gz, .parquet; detected by content) into an :class:`EventTable`.

    Raises InputFileError (exit 3) for a missing, empty, binary or malformed file and for missing required
    columns; rows with bad values are rejected and counted, not raised.
    """
    if default_block_size <= 0:
        raise UsageError(f"--block-size must be a positive number of tokens, got {default_block_size}")
    import pyarrow as pa

    path = Path(path)
    kind, header = _sniff(path)
    note = progress or (lambda stage: None)
    note("reading")
    try:
        if kind == "parquet":
            table, bad_lines, blank_lines, columns_found = _read_parquet(path)
            first_row_number = 1
        else:
            table, bad_lines, blank_lines = _read_csv(path, header)
            columns_found = tuple(header)
            first_row_number = 2
    except (pa.ArrowException, OSError, EOFError) as err:
        raise InputFileError(f"cannot read the events file: {_first_line(err)}", where=str(path)) from None
    note("checking rows")
    try:
        holder = [table]  # _convert takes the only reference, so each column is freed once converted
        del table
        return _convert(path, holder, columns_found, bad_lines, blank_lines, first_row_number, default_block_size)
    except pa.ArrowException as err:
        raise InputFileError(f"cannot convert the events file: {_first_line(err)}", where=str(path)) from None
    finally:
        # Arrow's default pool (mimalloc) reads fastest but keeps freed buffers resident; hand them back to the
        # OS now that every column is converted, so the analysis that follows does not stack on top of them
        # (5M-event benchmark: a quarter less peak RSS and half the page faults of the system allocator).
        pa.default_memory_pool().release_unused()


def events_from_arrow(table, where: str = "<table>", default_block_size: int = DEFAULT_BLOCK_SIZE) -> EventTable:
    """Check an in-memory Arrow table in schema 1 (a pandas DataFrame through ``pyarrow.Table.from_pandas``) with
    the same rules as a file, into an :class:`EventTable`; ``where`` names it in errors and as its ``path``.

    Row numbers of rejected rows are 1-based row indices (as for Parquet).
    """
    if default_block_size <= 0:
        raise UsageError(f"--block-size must be a positive number of tokens, got {default_block_size}")
    import pyarrow as pa

    names = _normalise_names([str(n) for n in table.column_names])
    _check_columns(where, names)
    known = [i for i, name in enumerate(names) if name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)]
    selected = table.select(known).rename_columns([names[i] for i in known])
    if selected.num_rows == 0:
        raise InputFileError("the events table has no rows", where=where)
    try:
        return _convert(where, [selected], tuple(names), [], 0, 1, default_block_size)
    except pa.ArrowException as err:
        raise InputFileError(f"cannot convert the events table: {_first_line(err)}", where=where) from None


def write_events(path: str | Path, columns: dict) -> int:
    """Write events in schema 1 (CSV, ``.csv.gz`` or ``.parquet`` by the file name); return the row count.

    ``columns`` maps column names of the schema to equal-length sequences (numpy arrays or lists); the required
    columns must be there.  ``event`` values are the four type names; ``block_ids`` may be strings ("3 4 5") or
    sequences of ints; ``None`` or NaN in an optional column is written as a blank cell.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    unknown = [c for c in columns if c not in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if unknown or missing:
        raise UsageError(
            "events columns do not match schema 1: "
            + "; ".join(
                p
                for p in (
                    f"unknown {', '.join(unknown)}" if unknown else "",
                    f"missing {', '.join(missing)}" if missing else "",
                )
                if p
            )
        )
    arrays = {}
    for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS):
        if name not in columns:
            continue
        values = columns[name]
        if name == "block_ids":
            values = [v if v is None or isinstance(v, str) else " ".join(str(int(x)) for x in v) for v in values]
            arrays[name] = pa.array(values, pa.string())
        elif name in ("event", "request_id", "source_request_id"):
            arrays[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
        else:
            values = np.asarray(values, dtype=float if name in ("ts", "latency_ms", "free_pool_blocks") else object)
            if values.dtype == object:
                mask = np.array([v is None or (isinstance(v, float) and v != v) for v in values], dtype=bool)
                values = np.where(mask, 0, values).astype(np.int64)
            else:
                mask = np.isnan(values)
            arrays[name] = pa.array(values, mask=mask if mask.any() else None)
    table = pa.table(arrays)
    target = str(path)
    try:
        if target.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            pq.write_table(table, target)
        else:
            sink = pa.output_stream(target, compression="gzip" if target.lower().endswith(".gz") else None)
            with sink:
                pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
    except (OSError, pa.ArrowException) as err:
        raise UsageError(f"cannot write the events file: {err}", where=target) from None
    return table.num_rows


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# ---------------------------------------------------------------------------------------------------- sniffing


def _sniff(path: Path) -> tuple[str, list[str]]:
    """Return ("csv" | "parquet", normalised header names); raise InputFileError for unusable files."""
    where = str(path)
    if not path.exists():
        raise InputFileError("events file not found", where=where)
    if path.is_dir():
        raise InputFileError("expected an events file, got a directory", where=where)
    try:
        with path.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError as err:
        raise InputFileError(f"cannot read the events file: {err.strerror or err}", where=where) from None
    if not head:
        raise InputFileError("the events file is empty", where=where)
    if head[:4] == b"PAR1":
        return "parquet", []
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(_SNIFF_BYTES)
        except (OSError, EOFError, zlib.error) as err:
            raise InputFileError(f"not a valid gzip file: {_first_line(err)}", where=where) from None
        if not head:
            raise InputFileError("the events file is empty (after decompression)", where=where)
    if b"\x00" in head:
        raise InputFileError("not a CSV or Parquet events file (binary content)", where=where)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # a multi-byte character cut at the end of the sample is fine
            raise InputFileError(
                f"not a CSV or Parquet events file (invalid UTF-8 at byte {err.start})", where=where
            ) from None
        text = head[: err.start].decode("utf-8")
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise InputFileError("the events file is empty", where=where)
    first = text.lstrip("\r\n").splitlines()[0]
    try:
        names = next(csv.reader(io.StringIO(first)))
    except (csv.Error, StopIteration):
        names = [first]
    return "csv", _normalise_names(names)


def _normalise_names(names: list[str]) -> list[str]:
    """Strip and lower-case the header names; make duplicates unique (``x``, ``x_2``) so pyarrow accepts them."""
    seen: dict[str, int] = {}
    out = []
    for raw in names:
        name = raw.strip().lower()
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        else:
            seen[name] = 1
        out.append(name)
    return out


def _check_columns(path: str | Path, found: list[str] | tuple[str, ...]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in found]
    if missing:
        shown = ", ".join(found[:20]) + (" ..." if len(found) > 20 else "")
        raise InputFileError(
            f"missing required column(s) {', '.join(missing)}; columns found: {shown or '(none)'}",
            where=str(path),
            tip=_SCHEMA_TIP,
        )


# ---------------------------------------------------------------------------------------------------- reading


def _read_csv(path: Path, names: list[str]):
    """Read the known columns, typed; fall back to strings where a value does not parse."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    _check_columns(path, names)
    text = pa.dictionary(pa.int32(), pa.string())
    typed = {
        "ts": pa.float64(),
        "event": text,
        "request_id": text,
        "num_blocks": pa.int32(),  # a count above 2**31 - 1 fails here and is rejected by the text path
        "num_tokens": pa.int32(),
        "block_ids": pa.string(),
        "latency_ms": pa.float64(),
        "source_request_id": text,
        "block_size": pa.int32(),
        "free_pool_blocks": pa.float64(),
    }
    include = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in names]

    # The content decides, not the name: pyarrow would inflate any "*.gz" path (and fail on plain text in one)
    with path.open("rb") as fh:
        gzip_content = fh.read(2) == b"\x1f\x8b"

    def read(types: dict, threads: bool):
        bad: list[tuple[int | None, str]] = []

        def on_invalid(row) -> str:
            bad.append((row.number, row.text))
            return "skip"

        source = pa.input_stream(str(path), compression="gzip" if gzip_content else None)
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(
                column_names=names, skip_rows=1, use_threads=threads, block_size=_READ_BLOCK_BYTES
            ),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={k: v for k, v in types.items() if k in include},
                include_columns=include,
                strings_can_be_null=True,
                null_values=[""],
                quoted_strings_can_be_null=True,
            ),
        )
        return table, bad

    try:
        table, bad = read(typed, threads=True)
    except pa.ArrowInvalid as err:
        if "conversion error" not in str(err).lower():
            raise
        # a value that does not parse as a number: read the numeric columns as text and check them vectorised
        typed = {k: (pa.string() if v in (pa.float64(), pa.int32()) else v) for k, v in typed.items()}
        table, bad = read(typed, threads=True)
    if bad and any(number is None for number, _ in bad):
        table, bad = read(typed, threads=False)  # pyarrow only numbers malformed rows when single-threaded
    bad_lines = sorted(n for n, text in bad if n is not None and text.strip())
    blank_lines = sum(1 for _, text in bad if not text.strip())
    return table, bad_lines, blank_lines


def _read_parquet(path: Path):
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    names = _normalise_names(list(schema.names))
    _check_columns(path, names)
    wanted = [raw for raw, name in zip(schema.names, names) if name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)]
    table = pq.read_table(path, columns=wanted)
    table = table.rename_columns([_normalise_names([n])[0] for n in table.column_names])
    return table, [], 0, tuple(names)


# ---------------------------------------------------------------------------------------------------- converting


def _convert(path, holder, columns_found, bad_lines, blank_lines, first_row_number, default_block_size):
    import numpy as np

    table = holder.pop()
    if table.num_rows == 0 and not bad_lines:
        raise InputFileError("the events file has a header but no event rows", where=str(path))
    n = table.num_rows
    table = table.unify_dictionaries()
    reason = np.zeros(n, dtype=np.int8)  # 0 = accepted

    def flag(mask, name: str) -> None:
        # checks run in reverse priority, so a row keeps the first reason in _REASONS order
        reason[mask] = _REASON_CODE[name]

    def take(name: str):
        nonlocal table
        col = table.column(name)
        table = table.drop_columns([name])
        return col

    present = set(table.column_names)
    cols: dict[str, object] = {}
    block_ids_job = None
    if "block_ids" in present:  # the slowest column: split on another thread (pyarrow releases the GIL)
        block_ids_job = in_background(_block_ids, take("block_ids"))

    def optional_number(name: str, integer: bool = False, positive: bool = False):
        v, null, bad = _numbers(take(name), name, integer=integer)
        if positive:
            flag(~null & ~bad & (v <= 0), f"non-positive {name}")
        else:
            flag(~null & ~bad & (v < 0), f"negative {name}")
        flag(bad, f"unparseable {name}")
        return v, null

    # optional columns first (lowest priority reasons), then the required ones in reverse order
    if "free_pool_blocks" in present:
        cols["free_pool_blocks"] = optional_number("free_pool_blocks")[0]
    block_size = None
    if "block_size" in present:
        v, null = optional_number("block_size", integer=True, positive=True)
        block_size = np.where(null, default_block_size, v)
    if "latency_ms" in present:
        cols["latency_ms"] = optional_number("latency_ms")[0]
    event = None
    if "event" in present:
        event = _event_codes(take("event"))
    num_tokens, tok_null, tok_bad = _numbers(take("num_tokens"), "num_tokens", integer=True)
    flag(~tok_null & ~tok_bad & (num_tokens < 0), "negative num_tokens")
    flag(tok_bad, "unparseable num_tokens")
    flag(tok_null & (event != FREE), "missing num_tokens")
    num_blocks, blk_null, blk_bad = _numbers(take("num_blocks"), "num_blocks", integer=True)
    flag(~blk_null & ~blk_bad & (num_blocks < 0), "negative num_blocks")
    flag(blk_bad, "unparseable num_blocks")
    flag(blk_null, "missing num_blocks")
    request, request_dict = _dictionary_codes(take("request_id"))
    blank_id = np.array([v is None or not v.strip() for v in request_dict] + [True], dtype=bool)
    if blank_id[:-1].any():
        request = np.where(blank_id[request], -1, request).astype(np.int32)  # code -1 -> the last entry
    flag(request < 0, "missing request_id")
    flag(event == -1, "unknown event type")
    flag(event == -2, "missing event")
    source = None
    source_dict: list[str] = []
    if "source_request_id" in present:
        source, source_dict = _dictionary_codes(take("source_request_id"))
    ts, ts_null, ts_bad = _numbers(take("ts"), "ts")
    flag(ts_bad, "unparseable ts")
    flag(ts_null, "missing ts")

    if block_ids_job is not None:
        rows, ids, bad_rows = block_ids_job.result()
        code = _REASON_CODE["unparseable block_ids"]
        current = reason[bad_rows]
        reason[bad_rows] = np.where((current == 0) | (current > code), code, current)  # keep a higher priority
        cols["block_ids"] = (rows, ids)
    # blank rows: every read column empty (a blank line or a row of commas) - skipped, not rejected
    blank = ts_null & (event == -2) & (request < 0) & blk_null & tok_null
    reason[blank] = 0
    keep = ~blank & (reason == 0)
    n_blank = int(blank.sum()) + blank_lines

    rejected = _rejected(reason, keep | blank, bad_lines, first_row_number)
    if keep.all():
        sel = slice(None)
        index_map = None
    else:
        sel = keep
        index_map = np.cumsum(keep) - 1
    ts = ts[sel]
    event = event[sel]
    num_blocks = num_blocks[sel].astype(np.int32, copy=False)  # rejected above MAX_COUNT, so int32 is exact
    num_tokens = num_tokens[sel].astype(np.int32, copy=False)  # a blank (free) num_tokens is already 0
    block_size = None if block_size is None else block_size[sel]
    # request ids: the dictionary's order (first appearance per read block), only those of accepted rows
    request = request[sel]
    used = np.zeros(len(request_dict), dtype=bool)
    used[request] = True
    if used.all():
        request_ids = tuple(request_dict)
    else:
        remap = (np.cumsum(used) - 1).astype(np.int32)
        request = remap[request]
        request_ids = tuple(request_dict[i] for i in np.flatnonzero(used).tolist())
    block_id_rows = block_id_values = None
    if "block_ids" in cols:
        rows, ids = cols["block_ids"]
        if index_map is not None:
            ok = keep[rows]
            rows, ids = index_map[rows[ok]], ids[ok]
        block_id_rows, block_id_values = rows, ids
    latency = cols.get("latency_ms")
    pool = cols.get("free_pool_blocks")
    return EventTable(
        path=str(path),
        columns_found=tuple(columns_found),
        ts=ts,
        event=event,
        request=request,
        request_ids=request_ids,
        num_blocks=num_blocks,
        num_tokens=num_tokens,
        block_size=block_size,
        latency_ms=None if latency is None else latency[sel],
        free_pool_blocks=None if pool is None else pool[sel],
        source_request=None if source is None else source[sel],
        source_request_ids=tuple(source_dict),
        block_id_rows=block_id_rows,
        block_id_values=block_id_values,
        rejected=dataclasses.replace(rejected, blank_rows=n_blank),
        default_block_size=default_block_size,
    )


def _rejected(reason, accepted_or_blank, bad_lines, first_row_number) -> RejectedRows:
    """Count rejected rows by reason and name the first few by row number (vectorised)."""
    import numpy as np

    idx = np.flatnonzero(~accepted_or_blank)
    by_reason: dict[str, int] = {}
    if bad_lines:
        by_reason["wrong number of columns"] = len(bad_lines)
    if idx.size:
        counts = np.bincount(reason[idx], minlength=len(_REASONS) + 1)
        for code in np.flatnonzero(counts):
            by_reason[_REASONS[code - 1]] = by_reason.get(_REASONS[code - 1], 0) + int(counts[code])
    # table row i -> file row number, skipping the lines pyarrow dropped as malformed
    shown = idx[:FIRST_REJECTED_SHOWN]
    skipped = np.asarray(bad_lines, dtype=np.int64)
    if skipped.size:
        pivots = skipped - first_row_number - np.arange(skipped.size)
        numbers = shown + first_row_number + np.searchsorted(pivots, shown, side="right")
    else:
        numbers = shown + first_row_number
    first = [(int(num), _REASONS[reason[i] - 1]) for num, i in zip(numbers, shown)]
    first += [(int(line), "wrong number of columns") for line in bad_lines[:FIRST_REJECTED_SHOWN]]
    first.sort()
    return RejectedRows(
        count=int(idx.size) + len(bad_lines),
        by_reason=by_reason,
        first=tuple(first[:FIRST_REJECTED_SHOWN]),
        blank_rows=0,
    )


def _numbers(col, name: str, integer: bool = False):
    """A column as numpy values with (null, unparseable) masks.

    Typed columns convert directly from their Arrow buffers; text (the fallback read, or Parquet strings) is
    matched against an explicit number pattern first, so one bad cell marks one row instead of failing the
    file.  NaN reads as blank.  With ``integer``, values are int64 and a fractional or huge value is unparseable.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    matched = None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        text = pc.utf8_trim_whitespace(col)
        is_number = pc.match_substring_regex(text, _NUMBER_RE)
        blank = ~_valid_np(text) | (
            _fixed_np(pc.utf8_length(text), np.int64 if pa.types.is_large_string(typ) else np.int32) == 0
        )
        matched = _bool_np(is_number)
        col = pc.if_else(is_number, text, pa.nulls(1, typ)[0]).cast(pa.float64())
        typ = col.type
    elif pa.types.is_boolean(typ) or pa.types.is_null(typ):
        col = col.cast(pa.float64())
        typ = col.type
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise InputFileError(f"column {name} has type {typ}, expected numbers")
    if integer and pa.types.is_integer(typ):
        if typ == pa.int32():  # the typed CSV read: every value already fits
            values = _fixed_np(col, np.int32)
        else:
            values = _fixed_np(col.cast(pa.int64()) if typ != pa.int64() else col, np.int64)
        null = ~_valid_np(col)
        bad = values > MAX_COUNT
        if null.any() or bad.any():
            values[null | bad] = 0
        return values, null, bad
    if typ != pa.float64():
        col = col.cast(pa.float64())
    v = _fixed_np(col, np.float64)
    null = ~_valid_np(col)
    v[null] = np.nan
    if matched is None:
        null |= np.isnan(v)
        bad = np.isinf(v)
    else:
        null = blank
        bad = (~matched & ~blank) | np.isinf(v)
    if integer:
        bad |= ~null & ((v != np.floor(v)) | (np.abs(v) > MAX_COUNT))
        iv = np.where(null | bad, 0, v).astype(np.int64)
        return iv, null, bad
    return v, null, bad


# Arrow -> numpy through the buffers: pyarrow's own to_numpy() on arrays with nulls (and any Python scalar)
# imports pandas, which alone costs about 0.4 s.


def _chunks(arr):
    return arr.chunks if hasattr(arr, "chunks") else [arr]


def _fixed_np(arr, dtype):
    """Values of a fixed-width Arrow (chunked) array as a new numpy array; null slots hold arbitrary values."""
    import numpy as np

    dtype = np.dtype(dtype)
    parts = []
    for ch in _chunks(arr):
        if len(ch):
            buf = ch.buffers()[1]
            parts.append(np.frombuffer(buf, dtype=dtype, count=len(ch), offset=ch.offset * dtype.itemsize))
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _bits(buf, offset: int, length: int):
    import numpy as np

    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), count=offset + length, bitorder="little")[offset:].view(
        bool
    )


def _valid_np(arr):
    """Validity (not null) of each slot of an Arrow (chunked) array, as numpy bools."""
    import numpy as np

    parts = []
    for ch in _chunks(arr):
        if ch.null_count == 0:
            parts.append(np.ones(len(ch), dtype=bool))
        elif ch.null_count == len(ch) or ch.buffers()[0] is None:
            parts.append(np.zeros(len(ch), dtype=bool))
        else:
            parts.append(_bits(ch.buffers()[0], ch.offset, len(ch)))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _bool_np(mask):
    """A pyarrow boolean (chunked) array as numpy bools (null -> False)."""
    import numpy as np

    parts = []
    for ch in _chunks(mask):
        if len(ch):
            parts.append(_bits(ch.buffers()[1], ch.offset, len(ch)))
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    return values & _valid_np(mask)


def _dictionary_codes(col):
    """(int32 codes with -1 for null, dictionary values as a Python list) of a text column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type):
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = col.cast(pa.string())
        col = pa.chunked_array([pc.dictionary_encode(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))])
    chunks = col.chunks
    if not chunks:
        return np.zeros(0, dtype=np.int32), []
    dictionary = chunks[0].dictionary
    if any(not c.dictionary.equals(dictionary) for c in chunks[1:]):  # not unified (Parquet chunks)
        col = pc.dictionary_encode(col.cast(dictionary.type).combine_chunks())
        chunks, dictionary = [col], col.dictionary
    indices = pa.chunked_array([c.indices for c in chunks])
    if indices.type != pa.int32():
        indices = indices.cast(pa.int32())
    codes = _fixed_np(indices, np.int32)
    valid = _valid_np(indices)
    if not valid.all():
        codes[~valid] = -1
    return codes, dictionary.cast(pa.string()).to_pylist()


def _event_codes(col):
    """int8 event codes: 0..3 for the four types (case-insensitive, stripped), -1 unknown, -2 missing."""
    import numpy as np

    codes, dictionary = _dictionary_codes(col)
    kinds = {name: i for i, name in enumerate(EVENT_TYPES)}
    lut = [kinds.get(v.strip().lower(), -1) if v is not None and v.strip() else -2 for v in dictionary]
    lut = np.array(lut + [-2], dtype=np.int8)  # code -1 (null) -> the last entry: missing
    return lut[codes]


def _block_ids(col):
    """Split space-separated block ids: (row index, id) pairs of the parseable rows, and the unparseable rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = np.zeros(0, np.int64)
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):  # Parquet: a list of integers per row
        lists = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        flat = pc.list_flatten(lists)
        parents = _fixed_np(pc.list_parent_indices(lists), np.int64)
        try:
            values = flat.cast(pa.int64())
        except pa.ArrowInvalid:
            raise InputFileError(f"block_ids has type {typ}, expected integers") from None
        valid = _valid_np(values)
        vals = _fixed_np(values, np.int64)
        bad_rows = np.unique(parents[~valid | (vals < 0)])
        good = valid & (vals >= 0) & ~np.isin(parents, bad_rows)
        return parents[good], vals[good], bad_rows
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        col = col.cast(pa.string())
    if col.null_count == len(col):
        return empty, empty, empty
    lists = pc.split_pattern(col, " ")  # padding spaces give empty tokens: handled by the slow path
    lists = lists.combine_chunks() if lists.num_chunks != 1 else lists.chunk(0)
    flat = pc.list_flatten(lists)
    parents = _fixed_np(pc.list_parent_indices(lists), np.int64)
    try:  # fast path: every token is an integer
        vals = _fixed_np(flat.cast(pa.int64()), np.int64)
    except pa.ArrowInvalid:
        vals = None
    if vals is not None and not (vals < 0).any():
        return parents, vals, empty
    length_type = np.int64 if pa.types.is_large_string(flat.type) else np.int32
    nonempty = _fixed_np(pc.utf8_length(flat), length_type) > 0  # doubled spaces are not tokens
    ok_mask = pc.match_substring_regex(flat, _BLOCK_ID_RE)
    ok = _bool_np(ok_mask)
    bad_rows = np.unique(parents[nonempty & ~ok])
    vals = _fixed_np(flat.filter(ok_mask).cast(pa.int64()), np.int64)
    parents = parents[ok]
    if bad_rows.size:
        good = ~np.isin(parents, bad_rows)
        parents, vals = parents[good], vals[good]
    return parents, vals, bad_rows
