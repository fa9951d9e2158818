"""Load a KV-cache events file (schema 1: CSV, CSV.gz or Parquet) into numpy columns.

The schema is documented in docs/events-schema.md.  Reading goes through pyarrow (typed, multi-threaded); every
check that decides whether a row is accepted is vectorised (pyarrow compute or numpy), and a row that fails one is
not dropped silently: it is counted in :class:`RejectedRows` with its row number and reason.

Row numbers: for CSV files, the line number in the file (the header is line 1; a value with an embedded newline is
not supported); for Parquet, the 1-based row index.  Bad input is handled per row wherever the row structure
survives: invalid UTF-8 bytes, a wrong number of fields, unparseable or out-of-range values each reject one row
with its reason; a double quote that never closes (which would swallow the rest of the file into one value) makes
the file be read again without quoting, line by line.

Paths may be local or fsspec URLs (``s3://...``, ``file://...``; fsspec is imported only for those).

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
from typing import TYPE_CHECKING, Any

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.header import column_key, other_separator, repeated_column
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES, InflateCap, read_capped
from kvtool.core.threads import in_background
from kvtool.events.kernels import compiled

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

SCHEMA_VERSION = 1
EVENT_TYPES = ("allocate", "append", "reuse", "free")
ALLOCATE, APPEND, REUSE, FREE = 0, 1, 2, 3
REQUIRED_COLUMNS = ("ts", "event", "request_id", "num_blocks", "num_tokens")
OPTIONAL_COLUMNS = ("block_ids", "latency_ms", "source_request_id", "block_size", "free_pool_blocks")
# The engine (pool) a row belongs to, for files that hold several engines' events (kvtool analyze, fleet).
INSTANCE_COLUMNS = ("instance", "engine")
DEFAULT_BLOCK_SIZE = 16
MAX_COUNT = 2**31 - 1  # larger block/token counts in one row are rejected (keeps int64 sums exact)
FIRST_REJECTED_SHOWN = 10
MAX_ABS_TS_S = 1e12  # larger |ts| is rejected: ~31,700 years; epoch milliseconds or nanoseconds land here
MAX_LATENCY_MS = 1e12  # larger latency_ms is rejected (keeps blocks x latency sums finite)

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
    "invalid UTF-8",
    "missing ts",
    "unparseable ts",
    "ts out of range",
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
    "latency_ms out of range",
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
    instance: np.ndarray | None = None  # int32 index into instance_ids, -1 where blank; None without the column
    instance_ids: tuple[str, ...] = ()

    @property
    def events(self) -> int:
        return int(self.ts.shape[0])


def load_events(
    path: str | Path,
    default_block_size: int = DEFAULT_BLOCK_SIZE,
    progress: Callable[[str], None] | None = None,
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
) -> EventTable:
    """Read an events file (.csv, .csv.gz, .parquet; detected by content) into an :class:`EventTable`.

    ``path`` is a local path or an fsspec URL.  A gzip-compressed CSV that inflates past ``max_input_bytes`` is
    refused while it inflates (kvtool.core.inflate).  Raises InputFileError (exit 3) for a missing, empty, binary or
    malformed file and for missing required columns; rows with bad values are rejected and counted, not raised.
    No message of the reading library reaches the user as is: each known failure is said in kvtool's words.
    """
    _check_default_block_size(default_block_size)
    import pyarrow as pa

    source = EventSource.of(path)
    kind, header = _sniff(source)
    note = progress or (lambda stage: None)
    note("reading")
    try:
        if kind == "parquet":
            read = _read_parquet(source)
        else:
            read = _read_csv(source, header, max_input_bytes)
    except (pa.ArrowException, OSError, EOFError) as err:
        if "could not skip initial" in str(err).lower():  # pyarrow's words for a header without a newline
            raise InputFileError(_HEADER_ONLY, where=source.name) from None
        if "straddling" in str(err).lower():  # a row longer than a block, or an unclosed quote: which one?
            _refuse_a_line_longer_than_a_block(source, max_input_bytes)
        raise InputFileError(_plain_reason("cannot read the events file", err), where=source.name) from None
    note("checking rows")
    try:
        return _convert(source.name, read, default_block_size)
    except InputFileError as err:
        if err.where is None:  # a column check knows the column, not the file
            err.where = source.name
        raise
    except pa.ArrowException as err:
        raise InputFileError(_plain_reason("cannot convert the events file", err), where=source.name) from None
    finally:
        # Arrow's default pool (mimalloc) reads fastest but keeps freed buffers resident; hand them back to the
        # OS now that every column is converted, so the analysis that follows does not stack on top of them
        # (5M-event benchmark: a quarter less peak RSS and half the page faults of the system allocator).
        release_arrow_pages()


def release_arrow_pages() -> None:
    """Hand the pages Arrow's pool keeps after a free back to the system: mimalloc's and jemalloc's, never glibc's
    heap (the system pool), which a fleet keeps on purpose for the next file (kvtool.core.memory.arrow_on_the_heap);
    trimming it there would fault every page of the next read in again."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    if pool.backend_name != "system":
        pool.release_unused()


def _check_default_block_size(value: int) -> None:
    """The block size of rows without one: positive, and no larger than a row's own block_size may be (a larger
    one overflowed int64 in the analysis: an OverflowError traceback)."""
    if value <= 0:
        raise UsageError(f"--block-size must be a positive number of tokens, got {value}", where="--block-size")
    if value > MAX_COUNT:
        raise UsageError(
            f"--block-size is too large: {value:,} tokens (at most {MAX_COUNT:,})",
            where="--block-size",
        )


@dataclasses.dataclass(frozen=True)
class EventSource:
    """Where an events file is: a local path, or an fsspec URL (``s3://bucket/key``, ``file:///abs/path``)."""

    name: str  # as the user gave it (messages name it)
    local: Path | None  # None for a remote URL

    @classmethod
    def of(cls, path: str | Path) -> EventSource:
        text = str(path)
        if isinstance(path, Path) or "://" not in text:
            return cls(text, Path(path))
        if text.startswith("file://"):
            return cls(text, Path(text[len("file://") :]))
        return cls(text, None)

    def arrow_file(self):
        """A pyarrow input file: native for a local path (no GIL, no copies), wrapped for a URL."""
        import pyarrow as pa

        if self.local is not None:
            return pa.OSFile(str(self.local), "rb")
        return pa.PythonFile(self.open(), mode="r")

    def open(self):
        """A binary file object (local, or through fsspec for a URL)."""
        if self.local is not None:
            return self.local.open("rb")
        from kvtool.core.extras import require

        fsspec = require("fsspec", feature="kvtool analyze on a URL", where=self.name)
        try:
            return fsspec.open(self.name, "rb").open()
        except (OSError, ValueError, ImportError) as err:
            raise InputFileError(f"cannot open the URL: {_first_line(err)}", where=self.name) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


_HEADER_ONLY = "the events file has a header but no event rows: it has no events"

# pyarrow's messages, said in kvtool's words (the raw text never reaches the user)
_ARROW_MESSAGES = (
    ("straddling", "a value spans more than one line (an unclosed double quote?)"),
    ("empty csv", "the events file is empty: it has no events"),
    ("parquet magic bytes not found", "not a valid Parquet file (its footer is missing: truncated?)"),
    ("invalid utf8", "invalid UTF-8 bytes where text was expected"),
    ("couldn't deserialize thrift", "not a valid Parquet file (corrupt metadata)"),
    ("no such file", "the file disappeared while being read"),
    ("truncated compressed stream", "not a valid gzip file (corrupt or truncated)"),
)


def _refuse_a_line_longer_than_a_block(source: EventSource, max_input_bytes: int) -> None:
    """Raise InputFileError naming the first line longer than the CSV reader's block, if there is one: pyarrow
    says "straddling" for it as for an unclosed quote, and a 100 MB field was called "an unclosed double quote"
    (there was none).  Streams the (inflated, capped) content in 1 MiB pieces: memory stays bounded."""
    import numpy as np

    from kvtool.core.format import fmt_bytes

    with source.open() as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    with source.open() as raw:
        fh = gzip.open(raw, "rb") if gzipped else raw
        cap = InflateCap(source.name, max_input_bytes)
        line, line_start, at = 1, 0, 0
        while piece := fh.read(1 << 20):
            cap.count(len(piece))
            ends = np.flatnonzero(np.frombuffer(piece, dtype=np.uint8) == 10) + at
            starts = np.concatenate(([line_start], ends[:-1] + 1)) if ends.size else np.array([line_start])
            lengths = (ends if ends.size else np.array([at + len(piece)])) - starts
            long = np.flatnonzero(lengths > _READ_BLOCK_BYTES)
            if long.size:
                raise InputFileError(
                    f"line {line + int(long[0]):,} is longer than the CSV reader's block of "
                    f"{fmt_bytes(_READ_BLOCK_BYTES)} (at least {fmt_bytes(int(lengths[long[0]]))}): no value of an "
                    "events file is that large, and no option raises the block",
                    where=source.name,
                )
            if ends.size:
                line, line_start = line + ends.size, int(ends[-1]) + 1
            at += len(piece)


def _plain_reason(what: str, err: BaseException) -> str:
    """A pyarrow/OS error as one plain sentence: a known cause in kvtool's words, else only the error's kind."""
    raw = str(err).lower()
    for needle, said in _ARROW_MESSAGES:
        if needle in raw:
            return f"{what}: {said}"
    if isinstance(err, OSError) and getattr(err, "strerror", None):
        return f"{what}: {err.strerror}"
    return f"{what}: the content is not a CSV or Parquet events file the reader can parse"


# ---------------------------------------------------------------------------------------------------- sniffing


def _sniff(source: EventSource) -> tuple[str, list[str]]:
    """Return ("csv" | "parquet", normalised header names); raise InputFileError for unusable files."""
    head = _head_bytes(source)
    if head[:4] == b"PAR1":
        return "parquet", []
    if head[:2] == b"\x1f\x8b":
        head = _gunzipped_head(source)
    if _looks_binary(head):
        raise InputFileError("not a CSV or Parquet events file (binary content)", where=source.name)
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")  # a bad byte rejects its row, not the file
    if not text.strip():
        raise InputFileError("the events file is empty: it has no events", where=source.name)
    if text.lstrip().startswith("{"):  # its "columns found" were a whole JSON line
        raise InputFileError(
            "not a CSV or Parquet events file: it is JSON lines",
            where=source.name,
            tip="vLLM's KV events (.jsonl) are analysed one file at a time: kvtool analyze FILE.jsonl",
        )
    first = text.lstrip("\r\n").splitlines()[0]
    try:
        names = next(csv.reader(io.StringIO(first)))
    except (csv.Error, StopIteration):
        names = [first]
    _refuse_duplicate_columns(source.name, names)
    return "csv", _normalise_names(names)


def _head_bytes(source: EventSource) -> bytes:
    where = source.name
    if source.local is not None:
        if not source.local.exists():
            raise InputFileError("events file not found", where=where)
        if source.local.is_dir():
            raise InputFileError("expected an events file, got a directory", where=where)
    try:
        with source.open() as fh:
            head = fh.read(_SNIFF_BYTES)
    except FileNotFoundError:
        raise InputFileError("events file not found", where=where) from None
    except OSError as err:
        raise InputFileError(f"cannot read the events file: {err.strerror or err}", where=where) from None
    if not head:
        raise InputFileError("the events file is empty: it has no events", where=where)
    return head


def _gunzipped_head(source: EventSource) -> bytes:
    try:
        with source.open() as raw, gzip.open(raw, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        raise InputFileError("not a valid gzip file (corrupt or truncated)", where=source.name) from None
    if not head.strip():
        raise InputFileError("the events file is empty (after decompression): it has no events", where=source.name)
    return head


def _looks_binary(head: bytes) -> bool:
    """Binary content: an archive's magic bytes, a control byte in the first line, or more than 5 % control bytes
    without a comma-separated first line.  Stray bytes in the rows of a file whose header is text only reject
    their rows, however short the file."""
    if head[:4] in (b"PK\x03\x04", b"\x7fELF") or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
        return True

    def control(data: bytes) -> int:
        return sum(data.count(bytes([c])) for c in (*range(0, 9), 11, 12, *range(14, 32)))

    first_line = head.split(b"\n", 1)[0]
    if control(first_line):
        return True
    return b"," not in first_line and control(head) > max(1, len(head) // 20)


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


def _refuse_duplicate_columns(where: str, raw_names: list[str]) -> None:
    """A column of the schema named twice (after stripping and lower-casing): which one holds the data is ambiguous.
    A CSV used to take the first silently and a Parquet file was refused in pyarrow's words; columns the schema does
    not name may repeat (they are ignored)."""
    repeated = repeated_column(raw_names, (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *INSTANCE_COLUMNS))
    if repeated is not None:
        spelled, at = repeated
        raise InputFileError(
            f"column {column_key(spelled)} appears {len(at)} times in the header (columns {', '.join(map(str, at))})",
            where=where,
            tip="keep one column of that name",
        )


def _check_columns(where: str, found: list[str] | tuple[str, ...]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in found]
    if missing:
        shown = ", ".join(found[:20]) + (" ..." if len(found) > 20 else "")
        raise InputFileError(
            f"missing required column(s) {', '.join(missing)}; columns found: {shown or '(none)'}",
            where=where,
            tip=_separator_tip(found) or _SCHEMA_TIP,
        )


def _separator_tip(found: list[str] | tuple[str, ...]) -> str | None:
    """A one-column header that another separator would split into the schema's columns: say so, rather than only
    listing the columns."""
    word = other_separator(found, lambda parts: set(REQUIRED_COLUMNS) <= {c.strip() for c in parts})
    return (
        None
        if word is None
        else f"the header is separated by {word}: an events file is comma-separated (docs/events-schema.md)"
    )


# ---------------------------------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class _Read:
    """What a reader returns: the known columns (Arrow) and the lines it could not take as rows."""

    table: Any  # pyarrow.Table
    columns_found: tuple[str, ...]
    bad_lines: list[int]  # line numbers of rows with a wrong number of fields
    blank_lines: int
    first_row_number: int  # the row number of the table's first row (2 for CSV: the header is line 1)
    invalid_utf8_lines: tuple[int, ...] = ()  # lines whose invalid bytes were replaced before reading


_TEXT_COLUMNS = ("event", "request_id", "source_request_id", *INSTANCE_COLUMNS)


def _read_csv(source: EventSource, names: list[str], max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> _Read:
    """Read the known columns, typed; fall back to strings where a value does not parse."""
    import pyarrow as pa

    _check_columns(source.name, names)
    reader = _CsvReader(source, names, max_input_bytes)
    invalid_lines: tuple[int, ...] = ()
    try:
        table, bad = reader.read_all()
    except pa.ArrowException:
        # A row with both a wrong field count and invalid UTF-8 stops pyarrow (it decodes the row's text for the
        # handler).  Read a copy with the bad bytes replaced, and reject the lines that had them.
        content, invalid_lines = _replace_invalid_utf8(source, reader.gzip_content, max_input_bytes)
        if not invalid_lines:
            raise
        reader.cleaned = content
        table, bad = reader.read_all()
    bad_lines = sorted(n for n, text in bad if n is not None and text.strip())
    blank_lines = sum(1 for _, text in bad if not text.strip())
    return _Read(table, tuple(names), bad_lines, blank_lines, 2, invalid_lines)


class _CsvReader:
    """pyarrow's CSV reader with kvtool's options: known columns typed, malformed rows collected, not fatal."""

    def __init__(self, source: EventSource, names: list[str], max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES):
        import pyarrow as pa

        self.source = source
        self.max_input_bytes = max_input_bytes
        self.names = names
        self.include = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *INSTANCE_COLUMNS) if c in names]
        text = pa.dictionary(pa.int32(), pa.string())
        self.types = {
            "ts": pa.float64(),
            "num_blocks": pa.int32(),  # a count above 2**31 - 1 fails here and is rejected by the text path
            "num_tokens": pa.int32(),
            "block_ids": pa.string(),
            "latency_ms": pa.float64(),
            "block_size": pa.int32(),
            "free_pool_blocks": pa.float64(),
            **{name: text for name in _TEXT_COLUMNS},
            # event as plain text where the compiled loop matches its four names (cheaper than a dictionary)
            **({"event": pa.string()} if compiled() is not None else {}),
        }
        with source.open() as fh:  # the content decides, not the name: pyarrow would inflate any "*.gz" path
            self.gzip_content = fh.read(2) == b"\x1f\x8b"
        self.cleaned: bytes | None = None  # the content with invalid UTF-8 replaced (see _read_csv)

    def read_all(self):
        """(table, malformed rows as (line number, text)), after the fallbacks each failure needs."""
        import pyarrow as pa

        types = self.types
        try:
            table, bad = self.read(types, threads=True)
        except pa.ArrowInvalid as err:
            if "conversion error" not in str(err).lower():
                raise
            # a value that does not parse as a number: read the numeric columns as text and check them vectorised
            types = {k: (pa.string() if v in (pa.float64(), pa.int32()) else v) for k, v in types.items()}
            table, bad = self.read(types, threads=True)
        if bad and any(number is None for number, _ in bad):
            table, bad = self.read(types, threads=False)  # pyarrow only numbers malformed rows single-threaded
        if any("\n" in text.rstrip("\r\n") for _, text in bad):
            # a double quote that never closed swallowed the lines after it into one "row": read line by line
            table, bad = self.read(types, threads=False, quoting=False)
        return table, bad

    def read(self, types: dict, threads: bool, quoting: bool = True):
        import sys

        import pyarrow as pa
        import pyarrow.csv as pacsv

        bad: list[tuple[int | None, str]] = []

        def on_invalid(row) -> str:
            bad.append((row.number, row.text))
            return "skip"

        previous_hook = sys.unraisablehook
        # pyarrow decodes a malformed row's text for the handler; invalid UTF-8 there raises inside its callback,
        # which Python would print to stderr as "Exception ignored": the read then fails and is retried cleaned
        sys.unraisablehook = lambda u: None if isinstance(u.exc_value, UnicodeDecodeError) else previous_hook(u)
        raw = pa.BufferReader(self.cleaned) if self.cleaned is not None else self.source.arrow_file()
        stream = raw
        if self.gzip_content and self.cleaned is None:  # inflated under the cap: a bomb stops there, not in memory
            cap = InflateCap(self.source.name, self.max_input_bytes)
            stream = pa.TransformInputStream(pa.CompressedInputStream(raw, "gzip"), cap)
        try:
            table = pacsv.read_csv(
                stream,
                read_options=pacsv.ReadOptions(
                    column_names=self.names, skip_rows=1, use_threads=threads, block_size=_READ_BLOCK_BYTES
                ),
                parse_options=pacsv.ParseOptions(
                    invalid_row_handler=on_invalid, ignore_empty_lines=False, quote_char='"' if quoting else False
                ),
                convert_options=pacsv.ConvertOptions(
                    column_types={k: v for k, v in types.items() if k in self.include},
                    include_columns=self.include,
                    strings_can_be_null=True,
                    null_values=[""],
                    quoted_strings_can_be_null=True,
                    check_utf8=False,  # invalid bytes reject their rows (_invalid_utf8_rows), not the file
                ),
            )
        finally:
            raw.close()
            sys.unraisablehook = previous_hook
        return table, bad


def _replace_invalid_utf8(
    source: EventSource, gzip_content: bool, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
) -> tuple[bytes, tuple[int, ...]]:
    """The whole content with each line's invalid UTF-8 replaced (U+FFFD), and those lines' numbers (1-based)."""
    with source.open() as fh:
        if gzip_content:
            with gzip.open(fh, "rb") as inflated:
                data = read_capped(inflated, InflateCap(source.name, max_input_bytes))
        else:
            data = fh.read()
    try:
        data.decode("utf-8")
        return data, ()
    except UnicodeDecodeError:
        pass
    lines = data.split(b"\n")
    invalid = []
    for i, line in enumerate(lines):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            invalid.append(i + 1)
            lines[i] = line.decode("utf-8", errors="replace").encode("utf-8")
    return b"\n".join(lines), tuple(invalid)


def _digits_and_spaces_only(col) -> bool:
    """Whether every byte of the values of a string (chunked) array is an ASCII digit or a space."""
    import numpy as np
    import pyarrow as pa

    for ch in _chunks(col):
        if not len(ch) or ch.buffers()[2] is None:
            continue
        wide = pa.types.is_large_string(ch.type)
        offsets = np.frombuffer(ch.buffers()[1], dtype=np.int64 if wide else np.int32)
        lo, hi = int(offsets[ch.offset]), int(offsets[ch.offset + len(ch)])
        data = np.frombuffer(ch.buffers()[2], dtype=np.uint8)[lo:hi]
        if not bool((((data - 48) <= 9) | (data == 32)).all()):  # uint8: bytes below '0' wrap above 9
            return False
    return True


def _shrunk(arr, size: int):
    """The first ``size`` items of an array sized for the most there could be, its tail handed back (realloc, no
    copy): a view would keep the whole allocation, and its pages where malloc reused touched memory."""
    arr.resize(size, refcheck=False)  # no view of arr outlives the compiled calls that filled it
    return arr


def _offsets_np(arr):
    """The offsets buffer of an Arrow string or list array, as numpy (int64 for the large types)."""
    import numpy as np
    import pyarrow as pa

    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_list(arr.type)
    return np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)


def _nulls_bitmap(arr):
    """An Arrow array's validity bitmap, or None when it has no null (its bitmap, if any, is all ones)."""
    return None if arr.null_count == 0 else arr.buffers()[0]


def _ids_by_chunk(kernel, chunks, offsets, most: int, n_rows: int, leading):
    """(rows, ids, unparseable rows) of a block-id column, filled chunk by chunk by a compiled reader:
    ``kernel(*leading(chunk, its offsets), chunk offset, length, first row, the free tails of the outputs)`` ->
    (ids, unparseable rows).  The outputs are sized for ``most`` ids, then shrunk to what was written."""
    import numpy as np

    rows, ids = np.empty(most, dtype=np.int64), np.empty(most, dtype=np.int64)
    bad_rows = np.empty(n_rows, dtype=np.int64)
    at = bad_at = base = 0
    for ch, o in zip(chunks, offsets):
        n_ids, n_bad = kernel(*leading(ch, o), ch.offset, len(ch), base, rows[at:], ids[at:], bad_rows[bad_at:])
        at, bad_at, base = at + n_ids, bad_at + n_bad, base + len(ch)
    return _shrunk(rows, at), _shrunk(ids, at), _shrunk(bad_rows, bad_at)


def _block_ids_compiled(kernels, col):
    """_block_ids of a string column by the compiled parser, one pass over each chunk.  A value holds at most one
    id more than it has spaces: the outputs are sized by a count of the spaces (most rows list none), not for the
    most ids the bytes could hold, whose untouched tail the heap would hand to later arrays."""
    import numpy as np

    chunks = [ch for ch in _chunks(col) if len(ch)]
    offsets = [_offsets_np(ch) for ch in chunks]
    most = 1
    for ch, o in zip(chunks, offsets):
        lo, hi = int(o[ch.offset]), int(o[ch.offset + len(ch)])
        data = ch.buffers()[2]
        text = np.frombuffer(data, dtype=np.uint8)[lo:hi] if data is not None else np.zeros(0, np.uint8)
        most += int(np.count_nonzero(text == ord(" "))) + len(ch) - ch.null_count

    def leading(ch, o):
        data = ch.buffers()[2]
        return o, b"" if data is None else data, _nulls_bitmap(ch)

    return _ids_by_chunk(kernels.parse_block_ids, chunks, offsets, most, len(col), leading)


def _list_block_ids_compiled(kernels, col):
    """_block_ids of a list<int64> column (Parquet) by the compiled loop: a null or negative id rejects its row."""
    import numpy as np

    chunks = [ch for ch in _chunks(col) if len(ch)]
    offsets = [_offsets_np(ch) for ch in chunks]
    most = sum(int(o[ch.offset + len(ch)] - o[ch.offset]) for ch, o in zip(chunks, offsets))

    def leading(ch, o):
        child = ch.values
        data = child.buffers()[1]
        values = np.frombuffer(data, dtype=np.int64)[child.offset :] if data is not None else np.zeros(0, np.int64)
        return o, values, _nulls_bitmap(child), child.offset, _nulls_bitmap(ch)

    return _ids_by_chunk(kernels.list_block_ids, chunks, offsets, most, len(col), leading)


def _read_parquet(source: EventSource) -> _Read:
    import pyarrow.parquet as pq

    with source.arrow_file() as fh:
        parquet = pq.ParquetFile(fh)
        schema = parquet.schema_arrow
        _refuse_duplicate_columns(source.name, list(schema.names))
        names = _normalise_names(list(schema.names))
        _check_columns(source.name, names)
        known = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *INSTANCE_COLUMNS)
        wanted = [raw for raw, name in zip(schema.names, names) if name in known]
        # text columns decoded straight to dictionaries (Parquet stores them so): no re-encoding of 5M strings
        text = [raw for raw, name in zip(schema.names, names) if name in _TEXT_COLUMNS]
        table = pq.read_table(source.local if source.local is not None else fh, columns=wanted, read_dictionary=text)
    table = table.rename_columns([_normalise_names([n])[0] for n in table.column_names])
    return _Read(table, tuple(names), [], 0, first_row_number=1)


def events_from_arrow(table, where: str = "<table>", default_block_size: int = DEFAULT_BLOCK_SIZE) -> EventTable:
    """Check an in-memory Arrow table in schema 1 (a pandas DataFrame through ``pyarrow.Table.from_pandas``) with
    the same rules as a file, into an :class:`EventTable`; ``where`` names it in errors and as its ``path``.

    Row numbers of rejected rows are 1-based row indices (as for Parquet).
    """
    _check_default_block_size(default_block_size)
    import pyarrow as pa

    _refuse_duplicate_columns(where, [str(n) for n in table.column_names])
    names = _normalise_names([str(n) for n in table.column_names])
    _check_columns(where, names)
    wanted = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *INSTANCE_COLUMNS)
    known = [i for i, name in enumerate(names) if name in wanted]
    selected = table.select(known).rename_columns([names[i] for i in known])
    if selected.num_rows == 0:
        raise InputFileError("the events table has no rows: it has no events", where=where)
    try:
        return _convert(where, _Read(selected, tuple(names), [], 0, first_row_number=1), default_block_size)
    except InputFileError as err:
        if err.where is None:
            err.where = where
        raise
    except pa.ArrowException as err:
        raise InputFileError(_plain_reason("cannot convert the events table", err), where=where) from None


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


# ---------------------------------------------------------------------------------------------------- converting
#
# The Arrow table becomes numpy columns in named steps.  Each column is taken off the table once converted (so its
# memory goes), and every check records a reason per row in _RowChecks; the rows without one are kept.


class _RowChecks:
    """The reason each row is rejected (0: accepted).

    Checks run in reverse priority, so a later (higher priority) check overwrites an earlier reason and a row
    keeps the first reason in ``_REASONS`` order; ``flag_unless_earlier`` is for a check that runs out of order.
    """

    def __init__(self, n: int):
        import numpy as np

        self.reason = np.zeros(n, dtype=np.int8)

    def flag(self, mask, name: str) -> None:
        self.reason[mask] = _REASON_CODE[name]

    def merge_lower(self, other: _RowChecks) -> None:
        """Add the reasons of checks made apart (on rows of the same table): a row keeps its higher priority one."""
        import numpy as np

        if other.reason.any():
            mine, theirs = self.reason, other.reason
            self.reason = np.where((mine == 0) | ((theirs > 0) & (theirs < mine)), theirs, mine)

    def flag_unless_earlier(self, rows, name: str) -> None:
        import numpy as np

        code = _REASON_CODE[name]
        current = self.reason[rows]
        self.reason[rows] = np.where((current == 0) | (current > code), code, current)


class _Columns:
    """The table being converted; ``take`` hands a column over and drops it from the table."""

    def __init__(self, table):
        self.table = table

    def has(self, name: str) -> bool:
        return name in self.table.column_names

    def take(self, name: str):
        release_arrow_pages()  # the columns taken before are converted and gone: hand their memory back
        col = self.table.column(name)
        self.table = self.table.drop_columns([name])
        return col


@dataclasses.dataclass(frozen=True, eq=False)
class _OptionalValues:
    free_pool_blocks: np.ndarray | None
    block_size: np.ndarray | None  # blanks hold the default block size
    latency_ms: np.ndarray | None


@dataclasses.dataclass(frozen=True, eq=False)
class _RequiredValues:
    ts: np.ndarray | None  # None while it is converted on the other thread
    event: np.ndarray
    request: np.ndarray
    request_dict: list[str]
    num_blocks: np.ndarray
    num_tokens: np.ndarray
    all_blank: np.ndarray  # every required value empty (a blank line, or a row of commas)


@dataclasses.dataclass(frozen=True, eq=False)
class _Codes:
    """A text column as int32 codes into its distinct values (-1 where blank)."""

    codes: np.ndarray | None
    values: tuple[str, ...]


def _convert(where: str, read: _Read, default_block_size: int) -> EventTable:
    """Check every row, reject the bad ones with their reasons, and build the EventTable of the accepted rows."""
    table = read.table
    object.__setattr__(read, "table", None)  # the only reference is now `columns`: each column frees when taken
    if table.num_rows == 0 and not read.bad_lines:
        raise InputFileError(_HEADER_ONLY, where=where)
    checks = _RowChecks(table.num_rows)
    columns = _Columns(table.unify_dictionaries())
    del table
    # block_ids and the optional columns are converted on another thread (numpy, pyarrow and the compiled loops
    # release the GIL) while this one converts the other required columns; each row keeps its highest-priority
    # reason when the two threads' checks are merged.  Where the compiled loops read the block ids, that thread
    # has time to spare and takes ts too; elsewhere it needs pyarrow.compute, imported here first (not there,
    # against this thread for the GIL).  It starts first: it has the longer way to go.
    quick = _compiled_block_ids(columns.table.column("block_ids") if columns.has("block_ids") else None)
    names = ("block_ids", *_OPTIONAL_NUMBERS) + (("ts",) if quick else ())
    along = tuple(name for name in names if columns.has(name))
    invalid_utf8 = _invalid_utf8_rows(columns, along)  # numbers read as text (one did not parse), before they go
    later_columns = {name: columns.take(name) for name in along}
    if not quick:
        import pyarrow.compute  # noqa: F401
    later = in_background(_later_columns, later_columns, checks.reason.size, default_block_size)
    del later_columns
    event, in_event = _event_codes_compiled(columns)  # (None, None) where _required_values reads event
    for rows in (in_event, _invalid_utf8_rows(columns, tuple(columns.table.column_names))):
        if rows is not None:
            invalid_utf8 = rows if invalid_utf8 is None else invalid_utf8 | rows
    if read.invalid_utf8_lines:
        lines = _rows_of_lines(read.invalid_utf8_lines, read.bad_lines, read.first_row_number, checks.reason.size)
        invalid_utf8 = lines if invalid_utf8 is None else invalid_utf8 | lines
    instance = _text_codes(columns, INSTANCE_COLUMNS)
    source = _text_codes(columns, ("source_request_id",))
    required = _required_values(columns, checks, event)
    # the request ids in use if every row is accepted (the usual case), found while the other thread still works
    every_row = _used_codes(required.request, tuple(required.request_dict))
    if not later.done():
        # idle until the other thread is done: import pyarrow.compute now, which the JSON writer needs later
        import pyarrow.compute  # noqa: F401
    optional, optional_checks, block_ids_found, ts_found = later.result()
    checks.merge_lower(optional_checks)
    if ts_found is not None:
        ts, ts_null = ts_found
        required = dataclasses.replace(required, ts=ts, all_blank=required.all_blank & ts_null)
    block_ids = None
    if block_ids_found is not None:
        rows, ids, bad_rows = block_ids_found
        checks.flag_unless_earlier(bad_rows, "unparseable block_ids")
        block_ids = (rows, ids)
    if invalid_utf8 is not None:
        checks.flag(invalid_utf8, "invalid UTF-8")  # the highest priority after the field count
    # blank rows: every read column empty (a blank line or a row of commas) - skipped, not rejected
    blank = required.all_blank if invalid_utf8 is None else required.all_blank & ~invalid_utf8
    checks.reason[blank] = 0
    keep = ~blank & (checks.reason == 0)
    rejected = _rejected(checks.reason, keep | blank, read.bad_lines, read.first_row_number)
    rejected = dataclasses.replace(rejected, blank_rows=int(blank.sum()) + read.blank_lines)
    if not keep.any():
        raise _nothing_accepted(where, rejected)
    return _assemble(
        where, read, keep, required, every_row, optional, source, instance, block_ids, rejected, default_block_size
    )


def _nothing_accepted(where: str, rejected: RejectedRows) -> InputFileError:
    """The error for a file none of whose rows is accepted: an analysis of nothing is no answer (exit 3)."""
    if not rejected.count:  # a header and blank lines
        return InputFileError(_HEADER_ONLY, where=where)
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(rejected.by_reason.items(), key=lambda kv: -kv[1]))
    first = ", ".join(f"row {row}" for row, _ in rejected.first[:3])
    rows = "row" if rejected.count == 1 else "rows"
    tip = "docs/events-schema.md#rejected-rows says what each reason means"
    if set(rejected.by_reason) == {"invalid UTF-8"}:
        tip = "the file is not UTF-8 text: convert it (iconv -f latin1 -t utf-8 FILE) or write it as UTF-8; " + tip
    return InputFileError(
        f"no event row is accepted: {rejected.count:,} {rows} rejected ({reasons}; first: {first})",
        where=where,
        tip=tip,
    )


def _rows_of_lines(lines, bad_lines, first_row_number: int, n: int):
    """A mask of the table rows read from ``lines`` (the lines pyarrow skipped are not table rows)."""
    import numpy as np

    lines = np.asarray(lines, dtype=np.int64)
    skipped = np.asarray(bad_lines, dtype=np.int64)
    lines = lines[~np.isin(lines, skipped)]
    rows = lines - first_row_number - np.searchsorted(skipped, lines)
    mask = np.zeros(n, dtype=bool)
    mask[rows[(rows >= 0) & (rows < n)]] = True
    return mask


def _invalid_utf8_rows(columns: _Columns, names: tuple[str, ...]):
    """Rows with invalid UTF-8 in the text cells of the columns ``names`` (None when there are none); such cells
    are set to null.

    The CSV is read without UTF-8 validation, so one bad byte costs its row, not the file.  Dictionary columns are
    checked through their (few) distinct values; block_ids needs no check (a bad byte fails its integer parse).
    """
    import numpy as np
    import pyarrow as pa

    bad = None
    for name in names:
        if name == "block_ids":
            continue
        col = columns.table.column(name)
        typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            continue
        mask = _invalid_utf8_mask(col)
        if mask is None:
            continue
        bad = mask if bad is None else bad | mask
        if not pa.types.is_dictionary(col.type):
            import pyarrow.compute as pc

            cleaned = pc.if_else(pa.array(~mask), col.cast(pa.binary()), pa.scalar(None, pa.binary()))
            index = columns.table.column_names.index(name)
            columns.table = columns.table.set_column(index, name, cleaned.cast(typ))
    if bad is None or not bad.any():
        return None
    return np.asarray(bad, dtype=bool)


def _invalid_utf8_mask(col):
    """Per-row mask of invalid UTF-8 in a string or dictionary (chunked) column; None when all are valid."""
    import numpy as np
    import pyarrow as pa

    parts = []
    found = False
    for ch in _chunks(col):
        if pa.types.is_dictionary(ch.type):
            values = _utf8_validity(ch.dictionary)
            if values is None:
                parts.append(np.zeros(len(ch), bool))
                continue
            codes = _fixed_np(ch.indices.cast(pa.int32()), np.int32)
            rows = ~values[np.maximum(codes, 0)] & _valid_np(ch.indices)
        else:
            values = _utf8_validity(ch)
            rows = np.zeros(len(ch), bool) if values is None else ~values
        found |= bool(rows.any())
        parts.append(rows)
    if not found:
        return None
    return np.concatenate(parts) if parts else None


def _utf8_validity(arr):
    """None when every value of a string array is valid UTF-8, else a per-value bool array (True: valid)."""
    import numpy as np
    import pyarrow as pa

    try:
        arr.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    out = np.ones(len(arr), dtype=bool)
    for i, value in enumerate(arr.view(pa.binary()).to_pylist() if hasattr(arr, "view") else []):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                out[i] = False
    return out


_OPTIONAL_NUMBERS = ("free_pool_blocks", "block_size", "latency_ms")


def _compiled_block_ids(col) -> bool:
    """Whether _block_ids parses this column (None: absent) with the compiled parser alone."""
    import pyarrow as pa

    typ = None if col is None else col.type
    if typ is None:
        return True
    if compiled() is None:
        return False
    lists = (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and typ.value_type == pa.int64()
    return lists or pa.types.is_string(typ) or pa.types.is_large_string(typ)


def _later_columns(later: dict, n: int, default_block_size: int):
    """The columns converted beside the others: (optional values, their row checks, block ids or None, and
    (ts, its missing mask) when ts came along)."""
    checks = _RowChecks(n)
    block_ids = _block_ids(later.pop("block_ids")) if "block_ids" in later else None
    ts = _ts_values(later.pop("ts"), checks) if "ts" in later else None
    return _optional_values(later, checks, default_block_size), checks, block_ids, ts


def _optional_values(columns: dict, checks: _RowChecks, default_block_size: int) -> _OptionalValues:
    """free_pool_blocks, block_size and latency_ms: checked (lowest priority reasons), blanks kept as blank."""
    import numpy as np

    def number(name: str, integer: bool = False, positive: bool = False):
        v, null, bad = _numbers(columns.pop(name), name, integer=integer)
        if positive:
            checks.flag(~null & ~bad & (v <= 0), f"non-positive {name}")
        elif _below(v, 0):
            checks.flag(~null & ~bad & (v < 0), f"negative {name}")
        checks.flag(bad, f"unparseable {name}")
        return v, null

    free_pool = number("free_pool_blocks")[0] if "free_pool_blocks" in columns else None
    block_size = None
    if "block_size" in columns:
        v, null = number("block_size", integer=True, positive=True)
        block_size = np.where(null, default_block_size, v)
    latency = None
    if "latency_ms" in columns:
        v, null, bad = _numbers(columns.pop("latency_ms"), "latency_ms")
        if _above(v, MAX_LATENCY_MS):
            checks.flag(~null & ~bad & (v > MAX_LATENCY_MS), "latency_ms out of range")
        if _below(v, 0):
            checks.flag(~null & ~bad & (v < 0), "negative latency_ms")
        checks.flag(bad, "unparseable latency_ms")
        latency = v
    return _OptionalValues(free_pool, block_size, latency)


def _required_values(columns: _Columns, checks: _RowChecks, event=None) -> _RequiredValues:
    """The five required columns, checked in reverse priority (num_tokens first, ts last; ts may have been taken
    to be converted on the other thread; ``event``: its codes when already read)."""
    if event is None:
        event = _event_codes(columns.take("event"))
    num_tokens, tok_null, tok_bad = _numbers(columns.take("num_tokens"), "num_tokens", integer=True)
    if _below(num_tokens, 0):  # missing and unparseable values hold 0: a value below 0 is a negative one
        checks.flag(~tok_null & ~tok_bad & (num_tokens < 0), "negative num_tokens")
    checks.flag(tok_bad, "unparseable num_tokens")
    checks.flag(tok_null & (event != FREE), "missing num_tokens")
    num_blocks, blk_null, blk_bad = _numbers(columns.take("num_blocks"), "num_blocks", integer=True)
    if _below(num_blocks, 0):
        checks.flag(~blk_null & ~blk_bad & (num_blocks < 0), "negative num_blocks")
    checks.flag(blk_bad, "unparseable num_blocks")
    checks.flag(blk_null, "missing num_blocks")
    request = _text_codes(columns, ("request_id",))
    assert request.codes is not None  # a required column
    checks.flag(request.codes < 0, "missing request_id")
    checks.flag(event == -1, "unknown event type")
    checks.flag(event == -2, "missing event")
    ts, ts_null = _ts_values(columns.take("ts"), checks) if columns.has("ts") else (None, None)
    all_blank = (event == -2) & (request.codes < 0) & blk_null & tok_null  # and ts_null (converted apart)
    if ts_null is not None:
        all_blank &= ts_null
    return _RequiredValues(ts, event, request.codes, list(request.values), num_blocks, num_tokens, all_blank)


def _below(values, limit) -> bool:
    """Whether some value may be below ``limit``: False only when none is (NaN ignored), found by one reduction
    instead of the masks of a check that would flag nothing."""
    import numpy as np

    low = np.fmin.reduce(values) if values.size else limit
    return not low >= limit  # NaN (every value NaN): maybe


def _above(values, limit) -> bool:
    """Whether some value may be above ``limit`` (see _below)."""
    import numpy as np

    high = np.fmax.reduce(values) if values.size else limit
    return not high <= limit


def _ts_values(col, checks: _RowChecks):
    """ts as float64 seconds (NaN where missing) and its missing mask, checked."""
    import numpy as np

    ts, ts_null, ts_bad = _numbers(col, "ts")
    if _below(ts, -MAX_ABS_TS_S) or _above(ts, MAX_ABS_TS_S):
        with np.errstate(invalid="ignore"):
            checks.flag(~ts_null & ~ts_bad & (np.abs(ts) > MAX_ABS_TS_S), "ts out of range")
    checks.flag(ts_bad, "unparseable ts")
    checks.flag(ts_null, "missing ts")
    return ts, ts_null


def _text_codes(columns: _Columns, names: tuple[str, ...]) -> _Codes:
    """The first of ``names`` present, as codes (blank or whitespace-only values -> -1); empty when absent."""
    import numpy as np

    name = next((n for n in names if columns.has(n)), None)
    if name is None:
        return _Codes(None, ())
    codes, values = _dictionary_codes(columns.take(name))
    blank = np.array([v is None or not v.strip() for v in values] + [True], dtype=bool)
    if blank[:-1].any():
        codes = np.where(blank[codes], -1, codes).astype(np.int32)  # code -1 -> the last entry
    return _Codes(codes, tuple(values))


def _used_codes(codes, values: tuple[str, ...]):
    """Renumber codes (>= 0, or -1 kept) to the values actually used, in the dictionary's order."""
    import numpy as np

    used = np.zeros(len(values) + 1, dtype=bool)
    used[codes] = True  # -1 marks the extra last slot
    used = used[:-1]
    if used.all():
        return codes, tuple(values)
    remap = np.r_[(np.cumsum(used) - 1).astype(np.int32), np.int32(-1)]
    return remap[codes].astype(np.int32), tuple(values[i] for i in np.flatnonzero(used).tolist())


def _assemble(
    where: str,
    read: _Read,
    keep,
    required: _RequiredValues,
    every_row: tuple[Any, tuple[str, ...]],
    optional: _OptionalValues,
    source: _Codes,
    instance: _Codes,
    block_ids,
    rejected: RejectedRows,
    default_block_size: int,
) -> EventTable:
    """The accepted rows as an EventTable (ids renumbered to those of accepted rows, block ids re-indexed;
    ``every_row``: the request codes and ids renumbered as if every row were accepted)."""
    import numpy as np

    every = bool(keep.all())
    sel: Any = slice(None) if every else keep
    request, request_ids = every_row if every else _used_codes(required.request[sel], tuple(required.request_dict))
    block_id_rows = block_id_values = None
    if block_ids is not None:
        rows, ids = block_ids
        if not keep.all():
            index_map = np.cumsum(keep) - 1
            ok = keep[rows]
            rows, ids = index_map[rows[ok]], ids[ok]
        block_id_rows, block_id_values = rows, ids
    inst_codes, inst_ids = (None, ()) if instance.codes is None else _used_codes(instance.codes[sel], instance.values)

    def rows_of(values):
        return None if values is None else values[sel]

    assert required.ts is not None  # converted by now, on one thread or the other
    return EventTable(
        path=where,
        columns_found=read.columns_found,
        ts=required.ts[sel],
        event=required.event[sel],
        request=request,
        request_ids=request_ids,
        num_blocks=required.num_blocks[sel].astype(np.int32, copy=False),  # above MAX_COUNT was rejected
        num_tokens=required.num_tokens[sel].astype(np.int32, copy=False),  # a blank (free) num_tokens is 0
        block_size=rows_of(optional.block_size),
        latency_ms=rows_of(optional.latency_ms),
        free_pool_blocks=rows_of(optional.free_pool_blocks),
        source_request=rows_of(source.codes),
        source_request_ids=source.values,
        block_id_rows=block_id_rows,
        block_id_values=block_id_values,
        rejected=rejected,
        default_block_size=default_block_size,
        instance=inst_codes,
        instance_ids=inst_ids,
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

    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    matched = None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        import pyarrow.compute as pc

        text = pc.utf8_trim_whitespace(col)
        is_number = pc.match_substring_regex(text, _NUMBER_RE)
        blank = ~_valid_np(text) | (
            _fixed_np(pc.utf8_length(text), np.int64 if pa.types.is_large_string(typ) else np.int32) == 0
        )
        matched = _bool_np(is_number)
        # "nan" reads as blank on the typed read (pyarrow parses it as NaN): the same here, or whether a row with
        # nan is accepted would depend on whether another row of the file sent the column through this text check
        blank |= _bool_np(pc.fill_null(pc.match_substring_regex(text, r"(?i)^[+-]?nan$"), False))
        col = pc.if_else(is_number, text, pa.nulls(1, typ)[0]).cast(pa.float64())
        typ = col.type
    elif pa.types.is_boolean(typ) or pa.types.is_null(typ):
        col = col.cast(pa.float64())
        typ = col.type
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise InputFileError(
            f"column {name} has type {typ}, expected numbers",
            tip=f"store {name} as an integer or floating-point column (docs/events-schema.md)",
        )
    if integer and pa.types.is_integer(typ):
        if typ == pa.int32():  # the typed CSV read: every value already fits
            values = _fixed_np(col, np.int32)
        else:
            if typ == pa.uint64():  # above int64's range the cast fails: clamp, so such a row is rejected alone
                import pyarrow.compute as pc

                col = pc.min_element_wise(col, pa.scalar(MAX_COUNT + 1, pa.uint64()), skip_nulls=False)
            values = _fixed_np(col.cast(pa.int64()) if typ != pa.int64() else col, np.int64)
        null = ~_valid_np(col)
        # an int32 never exceeds MAX_COUNT (2**31 - 1): no pass over the values for it
        bad = np.zeros(values.size, dtype=bool) if values.dtype == np.int32 else values > MAX_COUNT
        if null.any() or bad.any():
            values[null | bad] = 0
        return values, null, bad
    if typ != pa.float64():
        # unsafe: an integer above 2**53 (epoch nanoseconds in an int64 ts) loses digits instead of failing the
        # whole file; such values are out of range and rejected row by row anyway
        col = col.cast(pa.float64(), safe=False)
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

    if not pa.types.is_dictionary(col.type):
        import pyarrow.compute as pc

        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = col.cast(pa.string())
        col = pa.chunked_array([pc.dictionary_encode(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))])
    chunks = col.chunks
    if not chunks:
        return np.zeros(0, dtype=np.int32), []
    dictionary = chunks[0].dictionary
    if any(not c.dictionary.equals(dictionary) for c in chunks[1:]):  # not unified (Parquet chunks)
        import pyarrow.compute as pc

        col = pc.dictionary_encode(col.cast(dictionary.type).combine_chunks())
        chunks, dictionary = [col], col.dictionary
    indices = pa.chunked_array([c.indices for c in chunks])
    if indices.type != pa.int32():
        indices = indices.cast(pa.int32())
    codes = _fixed_np(indices, np.int32)
    valid = _valid_np(indices)
    if not valid.all():
        codes[~valid] = -1
    # decoded here (not by pyarrow) so that a value with invalid UTF-8 (its rows rejected) cannot raise
    raw = dictionary.view(pa.large_binary() if pa.types.is_large_string(dictionary.type) else pa.binary())
    values = [None if v is None else v.decode("utf-8", errors="replace") for v in raw.to_pylist()]
    return codes, values


def arrow_from_numpy(arrow_type, values, valid=None):
    """An Arrow array over a numpy array's memory (booleans packed to bits); ``valid`` False -> null.  Built from
    its buffers: ``pyarrow.array`` of a numpy array imports pandas (0.2 s) where it is installed."""
    import numpy as np
    import pyarrow as pa

    data = np.packbits(values, bitorder="little") if values.dtype == bool else np.ascontiguousarray(values)
    bitmap = None if valid is None or valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(arrow_type, len(values), [bitmap, pa.py_buffer(data)])


def _event_codes_compiled(columns: _Columns):
    """(int8 event codes, rows with invalid UTF-8 or None) of a string event column by the compiled loop, which
    matches the four names as written; the few other values (another case, spaces, unknown types, invalid bytes)
    follow _event_codes' rules, applied to those rows alone.  (None, None) without the compiled loops or when the
    column was read as a dictionary (Parquet); the column is then left in place."""
    import numpy as np
    import pyarrow as pa

    kernels = compiled()
    if kernels is None or not columns.has("event"):
        return None, None
    col = columns.table.column("event")
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None, None
    columns.take("event")
    codes = np.empty(len(col), dtype=np.int8)
    other = at = 0
    for ch in (ch for ch in col.chunks if len(ch)):
        data = ch.buffers()[2] or b""
        other += kernels.event_codes(
            _offsets_np(ch), data, _nulls_bitmap(ch), ch.offset, len(ch), _EVENT_NAMES, codes[at : at + len(ch)]
        )
        at += len(ch)
    if not other:
        return codes, None
    import pyarrow.compute as pc

    rows = np.flatnonzero(codes == -3)
    others = col.take(arrow_from_numpy(pa.int64(), rows))
    others = pa.chunked_array([pc.dictionary_encode(others.combine_chunks())])
    codes[rows] = _event_codes(others)
    bad = _invalid_utf8_mask(others)
    if bad is None:
        return codes, None
    invalid = np.zeros(len(col), dtype=bool)
    invalid[rows] = bad
    return codes, invalid


_EVENT_NAMES = tuple(name.encode("ascii") for name in EVENT_TYPES)


def _event_codes(col):
    """int8 event codes: 0..3 for the four types (case-insensitive, stripped), -1 unknown, -2 missing."""
    import numpy as np

    codes, dictionary = _dictionary_codes(col)
    kinds = {name: i for i, name in enumerate(EVENT_TYPES)}
    found = [kinds.get(v.strip().lower(), -1) if v is not None and v.strip() else -2 for v in dictionary]
    lut = np.array(found + [-2], dtype=np.int8)  # code -1 (null) -> the last entry: missing
    return lut[codes]


def _block_ids(col):
    """Split space-separated block ids: (row index, id) pairs of the parseable rows, and the unparseable rows."""
    import numpy as np
    import pyarrow as pa

    empty = np.zeros(0, np.int64)
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):  # Parquet: a list of integers per row
        kernels = compiled()
        if kernels is not None and typ.value_type == pa.int64():
            return _list_block_ids_compiled(kernels, col)
        import pyarrow.compute as pc

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
    kernels = compiled()
    if kernels is not None:
        return _block_ids_compiled(kernels, col)
    import pyarrow.compute as pc

    lists = pc.split_pattern(col, " ")  # padding spaces give empty tokens: handled by the slow path
    lists = lists.combine_chunks() if lists.num_chunks != 1 else lists.chunk(0)
    flat = pc.list_flatten(lists)
    parents = _fixed_np(pc.list_parent_indices(lists), np.int64)
    try:  # fast path: every token is an integer of at most 18 digits (Arrow's cast also takes "0x1F" and "-0")
        vals = _fixed_np(flat.cast(pa.int64()), np.int64) if _digits_and_spaces_only(col) else None
    except pa.ArrowInvalid:
        vals = None
    if vals is not None and not (vals >= 10**18).any():
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
