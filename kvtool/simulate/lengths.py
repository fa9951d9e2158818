"""Request-length distributions for `kvtool simulate`: real traces, parametric draws, and bootstrap sampling.

A :class:`RequestSet` holds one row per request: prompt tokens, output tokens and (when known) the arrival time in
seconds from the first request.  Traces are recognised by their columns (see :data:`TRACE_FORMATS`); parametric
distributions describe the final length L = prompt + output and are split with ``output_share``.

numpy and pyarrow are imported inside the functions, never at module import.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.header import other_separator, repeated_column
from kvtool.core.jsonfile import loads_bounded
from kvtool.simulate.limits import MAX_ARRIVAL_S, MAX_REQUEST_TOKENS

# The default share of output tokens in a request's final length, used when a source gives only a total length
# (a `length` trace column or a parametric distribution): 0.15, the generated share of the Azure LLM inference
# trace 2023 (conversation): 4,088,665 of 26,450,535 tokens = 0.1546.
DEFAULT_OUTPUT_SHARE = 0.15

# Requests drawn from a parametric distribution when --requests is not given.
DEFAULT_PARAMETRIC_REQUESTS = 10_000

# The most requests --requests may ask for (a billion: the arrays alone take tens of GB).
MAX_REQUESTS = 1_000_000_000

# The most distinct lengths --dist zipf tabulates (its CDF is built over every length in --min..--max: 80 MB).
MAX_ZIPF_SUPPORT = 10_000_000

# z-score of the 99th percentile of a standard normal (for the lognormal's mean/p99 parametrisation).
_Z99 = 2.3263478740408408


@dataclasses.dataclass(frozen=True)
class TraceFormat:
    """One accepted trace layout, recognised by its column names (compared case-insensitively)."""

    name: str
    prompt_column: str | None  # None: the file gives only a total `length`
    output_column: str | None
    length_column: str | None
    arrival_column: str | None  # None: no arrival times
    arrival_unit: str  # "datetime", "s" or "ns"
    arrival_required: bool


TRACE_FORMATS: tuple[TraceFormat, ...] = (
    TraceFormat("azure", "contexttokens", "generatedtokens", None, "timestamp", "datetime", True),
    TraceFormat("vidur", "num_prefill_tokens", "num_decode_tokens", None, "arrived_at", "s", True),
    TraceFormat("generic", "prompt_tokens", "output_tokens", None, "arrival_s", "s", False),
    TraceFormat("length", None, None, "length", "arrival_s", "s", False),
    TraceFormat("llmservingsim", "input_toks", "output_toks", None, "arrival_time_ns", "ns", True),
)

ACCEPTED_FORMATS_TEXT = (
    "Azure 'TIMESTAMP,ContextTokens,GeneratedTokens'; Vidur 'arrived_at,num_prefill_tokens,num_decode_tokens'; "
    "generic 'prompt_tokens,output_tokens[,arrival_s]' or 'length[,arrival_s]'; "
    "JSON lines with 'input_toks,output_toks,arrival_time_ns'"
)


@dataclasses.dataclass(frozen=True)
class RequestSet:
    """Requests to simulate.  Arrays are numpy int64 (tokens) and float64 (seconds)."""

    prompt_tokens: Any  # numpy int64 array, >= 0
    output_tokens: Any  # numpy int64 array, >= 0; prompt + output >= 1
    arrival_s: Any | None  # numpy float64 array, seconds from the first request, sorted; None when unknown
    source: str  # human-readable description: "azure trace x.csv (19,366 rows)", "lognormal mean=..."
    # Per request, what the prefix cache may share: ("tokens", ids) or ("pieces", [(piece id, tokens), ...]);
    # None: lengths only (kvtool.simulate.workloads).
    shared: list[tuple[str, Any]] | None = None
    # Per request, the conversation it belongs to (a trace's 'session_id'; None where a row has none), for a
    # fleet's session-affinity router (kvtool.simulate.fleet); None: the trace has no session ids.
    sessions: list[Any] | None = None

    @property
    def count(self) -> int:
        return int(len(self.prompt_tokens))

    @property
    def lengths(self):
        """Final lengths L = prompt + output tokens."""
        return self.prompt_tokens + self.output_tokens


def _check_lengths(prompt, output, where_rows, path: str) -> None:
    """Reject negative counts and zero total lengths, naming the first bad row."""
    import numpy as np

    bad = np.flatnonzero((prompt < 0) | (output < 0) | (prompt + output <= 0))
    if len(bad):
        i = int(bad[0])
        raise InputFileError(
            f"request length must be positive (prompt {int(prompt[i])}, output {int(output[i])} tokens)",
            where=f"{path}, {where_rows(i)}",
        )


def _floats(values: list[Any], column: str, path: str, where_rows) -> Any:
    """Strings (or numbers) to a float64 array; a value that is not a number is an error naming its row."""
    import numpy as np

    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        for i, v in enumerate(values):
            try:
                float(v)
            except (TypeError, ValueError):
                raise InputFileError(
                    f"'{column}' is not a number: {str(v)[:40]!r}", where=f"{path}, {where_rows(i)}"
                ) from None
        raise InputFileError(f"'{column}' is not numeric", where=path) from None


def _to_int_tokens(values: list[Any], column: str, path: str, where_rows) -> Any:
    """Strings (or numbers) to an int64 array; a non-integer or non-numeric value is an error naming its row."""
    import numpy as np

    arr = _floats(values, column, path, where_rows)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
    if len(bad):
        i = int(bad[0])
        raise InputFileError(
            f"'{column}' must be a whole number of tokens, got {values[i]!r}", where=f"{path}, {where_rows(i)}"
        )
    bad = np.flatnonzero(np.abs(arr) > MAX_REQUEST_TOKENS)
    if len(bad):
        i = int(bad[0])
        raise InputFileError(
            f"'{column}' is too large: {values[i]!r} tokens (at most {MAX_REQUEST_TOKENS:,})",
            where=f"{path}, {where_rows(i)}",
        )
    return arr.astype(np.int64)


def _arrivals(values: list[str], unit: str, column: str, path: str, where_rows):
    """Arrival column to float seconds from the earliest arrival, sorted order left to the caller."""
    import numpy as np

    if unit == "datetime":
        import warnings

        _require_dates(values, column, path, where_rows)
        try:
            # numpy converts a UTC offset ("+00:00", "Z": the Azure 2024 traces) to UTC, which is what arrival
            # differences need, but warns about it on stderr; the warning is not the user's concern.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                stamps = np.asarray(values, dtype="datetime64[ns]")
        except ValueError:
            for i, v in enumerate(values):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        np.datetime64(v, "ns")
                except ValueError:
                    raise InputFileError(
                        f"'{column}' is not a date and time: {str(v)[:40]!r}", where=f"{path}, {where_rows(i)}"
                    ) from None
            raise InputFileError(f"'{column}' is not a date and time", where=path) from None
        if np.isnat(stamps).any():
            i = int(np.flatnonzero(np.isnat(stamps))[0])
            raise InputFileError(f"'{column}' is empty", where=f"{path}, {where_rows(i)}")
        ns = (stamps - stamps.min()).astype(np.int64)
        return ns.astype(np.float64) / 1e9
    arr = _floats(values, column, path, where_rows)
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise InputFileError(f"'{column}' is not a finite number", where=f"{path}, {where_rows(i)}")
    if unit == "ns":
        arr = arr / 1e9
    far = np.flatnonzero(np.abs(arr) > MAX_ARRIVAL_S)  # 1e308 and -1e308 overflowed the subtraction below
    if len(far):
        i = int(far[0])
        raise InputFileError(
            f"'{column}' is out of range: {str(values[i])[:40]!r} (at most {MAX_ARRIVAL_S:.0e} s from time 0)",
            where=f"{path}, {where_rows(i)}",
        )
    return arr - arr.min()


# A date and time starts with a full date: numpy also parses "2023" (a year), "-5" and "0" (years counted from
# 1970 in some unit), so an Azure trace with arrival seconds in TIMESTAMP was read as years apart, without a word.
_DATE_RE = r"^\s*\d{4}-\d{1,2}-\d{1,2}"
_DATE_TIP = (
    "an Azure TIMESTAMP is a date and time (2023-11-16 18:17:03.98); arrival seconds go in a generic trace: "
    "prompt_tokens,output_tokens,arrival_s"
)


def _require_dates(values: list[Any], column: str, path: str, where_rows) -> None:
    """Every value starts with a date (YYYY-MM-DD); the first one that does not is an error naming its row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        texts = pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # JSON numbers
        texts = pa.array([None if v is None else str(v) for v in values], pa.string())
    dated = pc.fill_null(pc.match_substring_regex(texts, _DATE_RE), True)  # blanks: reported as empty later
    if not pc.all(dated).as_py():
        i = int(np.flatnonzero(~dated.to_numpy(zero_copy_only=False))[0])
        raise InputFileError(
            f"'{column}' is not a date and time: {str(values[i])[:40]!r}",
            where=f"{path}, {where_rows(i)}",
            tip=_DATE_TIP,
        )


def _match_format(columns: list[str]) -> TraceFormat | None:
    names = {c.strip().lower() for c in columns}
    for fmt in TRACE_FORMATS:
        wanted = [c for c in (fmt.prompt_column, fmt.output_column, fmt.length_column) if c]
        if fmt.arrival_required and fmt.arrival_column is not None:
            wanted.append(fmt.arrival_column)
        if all(c in names for c in wanted):
            return fmt
    return None


def _unrecognised(path: str, columns: list[str]) -> InputFileError:
    shown = ", ".join(repr(c) for c in columns[:12]) or "none"
    names = {c.strip().lower() for c in columns}
    tip = None
    if {"ts", "event", "request_id"} <= names:
        tip = "this looks like an events file of `kvtool analyze`'s schema: give it with --from-events"
    elif (word := other_separator(columns, lambda parts: _match_format(parts) is not None)) is not None:
        tip = f"the header is separated by {word}: a CSV trace is comma-separated"
    return InputFileError(
        f"unrecognised trace format: columns found {shown}; accepted: {ACCEPTED_FORMATS_TEXT}", where=path, tip=tip
    )


def _read_csv_columns(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Header and string columns of a CSV file (pyarrow; every value kept as text for exact error rows)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with open(path, "rb") as fh:
        head = fh.read(65536)
    if head[:2] == b"\x1f\x8b":  # was "binary content", which a .csv.gz is not to its owner
        raise InputFileError(
            "the trace is gzip-compressed; traces are read as plain CSV or JSON lines",
            where=str(path),
            tip=f"decompress it first: gunzip -k {path}",
        )
    if b"\x00" in head:
        raise InputFileError("not a text CSV file (binary content)", where=str(path))
    try:
        first_line = head.decode("utf-8-sig").splitlines()[0] if head.strip() else ""
    except UnicodeDecodeError:
        raise InputFileError("not a UTF-8 text file", where=str(path)) from None
    if not first_line.strip():
        raise InputFileError("empty trace file (no header row)", where=str(path))
    header = [c.strip() for c in next(csv.reader([first_line]))]
    _refuse_duplicate_columns(header, path)
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=1 << 24),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in header}),
        )
    except (pa.ArrowInvalid, OSError) as err:
        raise _unreadable_csv(path, len(header), err) from None
    columns: dict[str, list[str]] = {}
    for i, name in enumerate(table.column_names):  # by position: an unknown column may be named twice
        columns.setdefault(name.strip().lstrip("\ufeff").lower(), table.column(i).to_pylist())
    return header, columns


_TRACE_COLUMNS = frozenset(
    c
    for f in TRACE_FORMATS
    for c in (f.prompt_column, f.output_column, f.length_column, f.arrival_column)
    if c is not None
)


def _refuse_duplicate_columns(header: list[str], path: Path) -> None:
    """A column a trace format reads, named twice (case-insensitively): which one holds the data is ambiguous.

    It used to end in pyarrow's KeyError (a traceback) or, differing only in case, take one silently."""
    repeated = repeated_column(header, _TRACE_COLUMNS)
    if repeated is not None:
        spelled, at = repeated
        raise InputFileError(
            f"column '{spelled}' appears {len(at)} times in the header (columns {', '.join(map(str, at))})",
            where=str(path),
            tip="keep one column of that name",
        )


def _unreadable_csv(path: Path, columns: int, err: BaseException) -> InputFileError:
    """pyarrow's parse error in kvtool's words, naming the first line whose field count differs from the header."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if row and len(row) != columns:
                return InputFileError(
                    f"the row has {len(row)} fields, the header {columns}", where=f"{path}, line {lineno}"
                )
    return InputFileError(f"cannot read the CSV: {str(err).splitlines()[0]}", where=str(path))


def _read_json_lines(path: Path) -> tuple[list[str], dict[str, list[Any]]]:
    columns: dict[str, list[Any]] = {}
    order: list[str] = []
    rows = 0
    with open(path, encoding="utf-8-sig", errors="strict") as fh:  # -sig: a byte order mark is not the data
        try:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = loads_bounded(line, f"{path}, line {lineno}")
                except json.JSONDecodeError:
                    raise InputFileError("not valid JSON", where=f"{path}, line {lineno}") from None
                if not isinstance(obj, dict):
                    raise InputFileError("each JSON line must be an object", where=f"{path}, line {lineno}")
                for key in obj:
                    if key.lower() not in columns:
                        columns[key.lower()] = [None] * rows
                        order.append(key)
                for key in columns:
                    columns[key].append(None)
                for key, value in obj.items():
                    columns[key.lower()][-1] = value
                rows += 1
        except UnicodeDecodeError:
            raise InputFileError("not a UTF-8 text file", where=str(path)) from None
    return order, columns


def _check_json_scalars(values: list[Any], column: str, path: str, where_rows) -> None:
    """A JSON value used as a number must be a number or a string (true, a list or an object is an error)."""
    for i, v in enumerate(values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            raise InputFileError(f"'{column}' is not a number: {json.dumps(v)[:40]}", where=f"{path}, {where_rows(i)}")


def load_trace(path: str | Path, output_share: float = DEFAULT_OUTPUT_SHARE) -> RequestSet:
    """Read a trace file, recognising its format by its columns.

    Rows keep their file order (sorted by arrival when arrivals are given and unsorted).  A `length`-only trace is
    split into prompt and output with ``output_share``.
    """
    import numpy as np

    path = Path(path)
    if not path.exists():
        raise InputFileError("trace file not found", where=str(path))
    if path.is_dir():
        raise InputFileError("trace path is a directory, not a file", where=str(path))
    try:
        with open(path, "rb") as fh:
            start = fh.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    except OSError as err:
        raise InputFileError(f"cannot read the trace: {err.strerror}", where=str(path)) from None
    if not start:
        raise InputFileError("empty trace file", where=str(path))
    json_lines = start.startswith(b"{")
    try:
        header, cols = _read_json_lines(path) if json_lines else _read_csv_columns(path)
    except OSError as err:
        raise InputFileError(f"cannot read the trace: {err}", where=str(path)) from None
    if json_lines:
        from kvtool.simulate.workloads import is_prefix_trace, prefix_trace_requests

        if is_prefix_trace(cols):
            t = prefix_trace_requests(cols, path)
            return RequestSet(
                t.prompt_tokens, t.output_tokens, t.arrival_s, t.source, shared=t.shared, sessions=t.sessions
            )
    fmt = _match_format(header)
    if fmt is None:
        raise _unrecognised(str(path), header)
    n = len(next(iter(cols.values()))) if cols else 0
    if n == 0:
        raise InputFileError("the trace has a header but no rows", where=str(path))

    # messages name a column as the file spells it (ContextTokens, not contexttokens)
    spelled = {name.lstrip("\ufeff").strip().lower(): name.lstrip("\ufeff").strip() for name in reversed(header)}

    def shown(column: str) -> str:
        return spelled.get(column, column)

    # CSV row numbers count the header as row 1, so data row i is file line i + 2.
    def where_rows(i: int) -> str:
        return f"line {i + 2}" if not json_lines else f"record {i + 1}"

    if json_lines:
        for c in (fmt.prompt_column, fmt.output_column, fmt.length_column, fmt.arrival_column):
            if c is not None and c in cols:
                _check_json_scalars(cols[c], shown(c), str(path), where_rows)
    for c in (fmt.prompt_column, fmt.output_column, fmt.length_column):
        if c is not None:
            missing = [i for i, v in enumerate(cols[c]) if v is None or v == ""]
            if missing:
                raise InputFileError(f"'{shown(c)}' is empty", where=f"{path}, {where_rows(missing[0])}")
    if fmt.length_column:
        lengths = _to_int_tokens(cols[fmt.length_column], shown(fmt.length_column), str(path), where_rows)
        bad = np.flatnonzero(lengths <= 0)
        if len(bad):
            i = int(bad[0])
            raise InputFileError(
                f"request length must be positive, got {int(lengths[i])}", where=f"{path}, {where_rows(i)}"
            )
        prompt, output = split_lengths(lengths, output_share)
    else:
        assert fmt.prompt_column is not None and fmt.output_column is not None  # every format names both or length
        prompt = _to_int_tokens(cols[fmt.prompt_column], shown(fmt.prompt_column), str(path), where_rows)
        output = _to_int_tokens(cols[fmt.output_column], shown(fmt.output_column), str(path), where_rows)
        _check_lengths(prompt, output, where_rows, str(path))
    arrival = None
    if fmt.arrival_column is not None and fmt.arrival_column in cols:
        values = cols[fmt.arrival_column]
        blank = [v is None or v == "" for v in values]
        if not any(blank):
            arrival = _arrivals(values, fmt.arrival_unit, shown(fmt.arrival_column), str(path), where_rows)
        elif fmt.arrival_required or not all(blank):  # a few blanks used to drop every arrival without a word
            i = blank.index(True)
            raise InputFileError(
                f"'{shown(fmt.arrival_column)}' is empty",
                where=f"{path}, {where_rows(i)}",
                tip=None if fmt.arrival_required else "give every row an arrival time, or none (all at t=0)",
            )
    if arrival is not None and np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        prompt, output, arrival = prompt[order], output[order], arrival[order]
    split = f"; output = {output_share:g} of each length (--output-share)" if fmt.length_column else ""
    return RequestSet(prompt, output, arrival, f"{fmt.name} trace {path.name} ({n:,} rows{split})")


def split_lengths(lengths, output_share: float):
    """Split final lengths into prompt and output: output = round(L x share), at least 1 when L > 1."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    output = np.rint(lengths * output_share).astype(np.int64)
    output = np.clip(output, np.minimum(1, lengths - 1), lengths - 1)
    return lengths - output, output


def lognormal_sigma(mean: float, p99: float) -> float:
    """The sigma of a lognormal with the given mean and 99th percentile.

    mean = exp(mu + s^2/2) and p99 = exp(mu + z s) give s^2/2 - z s + ln(p99/mean) = 0, so
    s = z - sqrt(z^2 - 2 ln(p99/mean)) (the smaller root, the one that keeps p99 above the mean).
    """
    ratio = math.log(p99 / mean)
    disc = _Z99 * _Z99 - 2.0 * ratio
    if p99 <= mean or disc < 0:
        raise UsageError(
            f"a lognormal needs mean < p99 <= {math.exp(_Z99 * _Z99 / 2):.2f} x mean (got mean {mean:g}, p99 {p99:g})",
            where="--mean/--p99",
        )
    return _Z99 - math.sqrt(disc)


def parametric_lengths(
    dist: str, count: int, seed: int, *, mean=None, p99=None, min_tokens=None, max_tokens=None, length=None, alpha=None
):
    """Draw ``count`` final lengths from a named distribution; returns (int64 array, description)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if dist == "lognormal":
        if mean is None or p99 is None:
            raise UsageError("--dist lognormal needs --mean and --p99 (tokens)", where="--dist")
        _tokens(mean, "--mean")
        _tokens(p99, "--p99")
        sigma = lognormal_sigma(mean, p99)
        mu = math.log(mean) - sigma * sigma / 2
        values = np.maximum(1, np.rint(rng.lognormal(mu, sigma, count))).astype(np.int64)
        return values, f"lognormal mean={mean:g} p99={p99:g} tokens (mu={mu:.4f}, sigma={sigma:.4f})"
    if dist == "uniform":
        if min_tokens is None or max_tokens is None:
            raise UsageError("--dist uniform needs --min and --max (tokens)", where="--dist")
        _bounds(min_tokens, max_tokens)
        values = rng.integers(int(min_tokens), int(max_tokens) + 1, count, dtype=np.int64)
        return values, f"uniform {int(min_tokens)}..{int(max_tokens)} tokens"
    if dist == "fixed":
        if length is None:
            raise UsageError("--dist fixed needs --length (tokens)", where="--dist")
        _tokens(length, "--length")
        if length != int(length):
            raise UsageError(f"--length must be a whole number of tokens, got {length:g}", where="--length")
        return np.full(count, int(length), dtype=np.int64), f"fixed {int(length)} tokens"
    if dist == "zipf":
        if min_tokens is None or max_tokens is None or alpha is None:
            raise UsageError("--dist zipf needs --alpha, --min and --max (tokens)", where="--dist")
        _bounds(min_tokens, max_tokens)
        _positive(alpha, "--alpha")
        if max_tokens - min_tokens + 1 > MAX_ZIPF_SUPPORT:
            raise UsageError(
                f"--dist zipf tabulates every length in --min..--max: at most {MAX_ZIPF_SUPPORT:,} "
                f"lengths, got {int(max_tokens - min_tokens + 1):,}",
                where="--min/--max",
            )
        support = np.arange(int(min_tokens), int(max_tokens) + 1, dtype=np.int64)
        weights = support.astype(np.float64) ** -float(alpha)
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        values = support[np.minimum(np.searchsorted(cdf, rng.random(count), side="right"), len(support) - 1)]
        return values, f"zipf alpha={alpha:g} over {int(min_tokens)}..{int(max_tokens)} tokens"
    raise UsageError(f"unknown distribution {dist!r}; use lognormal, uniform, fixed or zipf", where="--dist")


def _positive(value: float, option: str) -> None:
    if not value > 0 or not math.isfinite(value):
        raise UsageError(f"{option} must be a positive number, got {value:g}", where=option)


def _tokens(value: float, option: str) -> None:
    """A positive token count no longer than MAX_REQUEST_TOKENS."""
    _positive(value, option)
    if value > MAX_REQUEST_TOKENS:
        raise UsageError(f"{option} is too large: {value:g} tokens (at most {MAX_REQUEST_TOKENS:,})", where=option)


def _bounds(lo: float, hi: float) -> None:
    for v, opt in ((lo, "--min"), (hi, "--max")):
        _tokens(v, opt)
        if v != int(v):
            raise UsageError(f"{opt} must be a whole number of tokens, got {v:g}", where=opt)
    if lo > hi:
        raise UsageError(f"--min ({lo:g}) is above --max ({hi:g})", where="--min/--max")


def parametric_requests(
    dist: str, count: int, seed: int, output_share: float = DEFAULT_OUTPUT_SHARE, **params
) -> RequestSet:
    """A parametric distribution of final lengths, split into prompt/output with ``output_share``."""
    lengths, text = parametric_lengths(dist, count, seed, **params)
    prompt, output = split_lengths(lengths, output_share)
    return RequestSet(
        prompt,
        output,
        None,
        f"{text}, {count:,} requests (seed {seed}; output = {output_share:g} of each length, --output-share)",
    )


def sample_requests(requests: RequestSet, count: int, seed: int) -> RequestSet:
    """Bootstrap: ``count`` requests drawn with replacement.

    Lengths are drawn as (prompt, output) pairs.  When the source has arrival times, inter-arrival gaps are drawn
    with replacement from the source's gaps (so the mean rate and the burstiness of single gaps are kept).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, requests.count, count)
    arrival = None
    if requests.arrival_s is not None and requests.count > 1:
        gaps = np.diff(requests.arrival_s)
        arrival = np.concatenate([[0.0], np.cumsum(gaps[rng.integers(0, len(gaps), count - 1)])])
    return RequestSet(
        requests.prompt_tokens[idx],
        requests.output_tokens[idx],
        arrival,
        f"{count:,} requests sampled with replacement from {requests.source} (seed {seed})",
        shared=None if requests.shared is None else [requests.shared[i] for i in idx.tolist()],
        sessions=None if requests.sessions is None else [requests.sessions[i] for i in idx.tolist()],
    )


def poisson_arrivals(count: int, qps: float, seed: int):
    """Arrival times (s) of a Poisson process at ``qps`` requests per second, the first at 0."""
    import numpy as np

    _positive(qps, "--qps")
    rng = np.random.default_rng([seed, 1])
    gaps = rng.exponential(1.0 / qps, max(count - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def lengths_from_events(ts, request, is_append, is_free, num_tokens, num_blocks, source: str, note: str = ""):
    """Recover request lengths from KV-cache events (analyze's schema): one request per request id.

    Rows are taken per request in time order (ties in file order).  A request's life runs from its first
    allocate/reuse until a free brings its blocks back to 0 (a preemption starts a new life, recomputing what it
    held).  Final length L = the most tokens held in any life (allocate + append + reuse tokens of that life);
    prompt = the allocate and reuse tokens at the request's first timestamp; output = L - prompt.  Arrival = the
    request's first event (its admission: queueing before it is not in the file).  Requests that never hold a
    token are skipped and counted in the source text.
    """
    import numpy as np

    ts = np.asarray(ts, dtype=np.float64)
    request = np.asarray(request, dtype=np.int64)
    n = len(ts)
    if n == 0:
        raise InputFileError("the events file has no accepted rows", where=source)
    order = np.lexsort((np.arange(n), ts, request))
    r, t = request[order], ts[order]
    free = np.asarray(is_free, dtype=bool)[order]
    append = np.asarray(is_append, dtype=bool)[order]
    tok = np.where(free, 0, np.asarray(num_tokens, dtype=np.int64)[order])
    signed = np.where(free, -1, 1) * np.asarray(num_blocks, dtype=np.int64)[order]
    idx = np.arange(n)
    group_start = np.concatenate([[True], r[1:] != r[:-1]])
    starts = np.flatnonzero(group_start)
    first_of = np.maximum.accumulate(np.where(group_start, idx, 0))
    cum_b = np.cumsum(signed)
    held_b = cum_b - np.where(first_of > 0, cum_b[first_of - 1], 0)
    prev_emptied = np.concatenate([[False], free[:-1] & (held_b[:-1] <= 0)])
    life_start = group_start | prev_emptied
    life_first = np.maximum.accumulate(np.where(life_start, idx, 0))
    cum_t = np.cumsum(tok)
    in_life = cum_t - cum_t[life_first] + tok[life_first]
    final = np.maximum.reduceat(in_life, starts)
    first_ts = t[starts]
    at_first = (t == first_ts[np.searchsorted(starts, idx, side="right") - 1]) & ~append & ~free
    prompt = np.add.reduceat(np.where(at_first, tok, 0), starts)
    keep = final > 0
    skipped = int((~keep).sum())
    if not keep.any():
        raise InputFileError("no request in the events file holds any token", where=source)
    prompt, final, arrival = prompt[keep], final[keep], first_ts[keep]
    prompt = np.minimum(prompt, final)
    arrival = arrival - arrival.min()
    by_arrival = np.argsort(arrival, kind="stable")
    notes = [f"{int(keep.sum()):,} requests"] + ([f"{skipped:,} without tokens skipped"] if skipped else [])
    text = f"events file {source} ({'; '.join(notes + ([note] if note else []))})"
    return RequestSet(prompt[by_arrival], (final - prompt)[by_arrival], arrival[by_arrival], text)


def load_event_lengths(path: str | Path) -> RequestSet:
    """Request lengths from an events file, read with `kvtool analyze`'s loader (kvtool.events.load)."""
    from kvtool.events import load as events_csv
    from kvtool.vllm.events.analysis import looks_like_vllm_events

    if Path(path).is_file() and looks_like_vllm_events(Path(path)):
        raise InputFileError(
            "vLLM's KV events carry no request ids: request lengths cannot be recovered from them",
            where=str(path),
            tip="give a request trace with --trace, or an events file of "
            "`kvtool analyze`'s schema (docs/events-schema.md)",
        )
    table = events_csv.load_events(path)
    rejected = f"{table.rejected.count:,} rows rejected by the events loader" if table.rejected.count else ""
    try:
        return lengths_from_events(
            table.ts,
            table.request,
            table.event == events_csv.APPEND,
            table.event == events_csv.FREE,
            table.num_tokens,
            table.num_blocks,
            Path(path).name,
            rejected,
        )
    except InputFileError as err:  # named the file's base name only, and not the rows rejected
        err.where = str(path)
        if rejected:
            err.message = f"{err.message} ({rejected})"
            err.tip = f"kvtool analyze {path} lists the rejected rows and why"
        raise
