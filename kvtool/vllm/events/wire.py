"""vLLM KV-cache events: the wire format, decoding to JSON-lines rows, and reading event files.

Shared by ``kvtool capture`` (wire -> rows) and the analysis (rows -> :class:`VllmEvent`).
No vLLM import is needed: the format below is read from vLLM's own source,
``vllm/distributed/kv_events.py`` (``ZmqEventPublisher``, ``KVEventBatch``, ``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``) and ``vllm/config/kv_events.py`` (``KVEventsConfig``):

- The PUB socket sends three frames per batch: ``(topic, seq, payload)``; ``seq`` is an 8-byte
  big-endian integer counting batches from 0, ``payload`` a msgpack-encoded ``KVEventBatch``.
- A batch is ``[ts, [events...], data_parallel_rank]`` (msgspec ``array_like``) or, in versions
  without ``array_like`` on the batch, a map ``{"ts", "events", "data_parallel_rank"}``.
- Each event is a msgspec tagged struct: a map with ``"type"`` naming the class, or (older
  versions with ``array_like=True``) a positional array whose first element is the tag.
  Trailing fields that hold their default may be omitted (``omit_defaults``).
- Block hashes are ``ExternalBlockHash = bytes | int``: 64-bit ints by default, raw bytes
  (sha256) in some configurations.  Rows keep ints as ints and write bytes as hex strings.
- The replay ROUTER socket (always bound by vLLM) takes ``[identity, b"", start_seq (8 bytes)]``
  and answers with one ``[identity, b"", topic, seq, payload]`` per buffered batch with
  ``seq >= start_seq``, then the end marker ``[identity, b"", b"", (-1 as 8-byte signed
  big-endian), b""]`` (vLLM 0.32; earlier versions leave out the topic frame in both).

SGLang publishes the same frames and batch layout (``sglang/srt/disaggregation/kv_events.py``:
``ZmqEventPublisher``, ``KVEventBatch`` = ``[ts, events, attn_dp_rank]``, one publisher per attention-DP rank on
port + rank, replay ROUTER only when ``replay_endpoint`` is configured) with its own event fields
(:data:`SGLANG_FIELDS`): tagged maps in 0.5.23, positional arrays (tag first) in 0.4.10 and 0.5.10 (the
releases read).  Its rows carry
``"engine": "sglang"`` after ``dp_rank`` so the analysis knows whose events they are.

Nothing heavy is imported here; msgpack is imported inside :func:`decode_payload`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from kvtool.core.errors import InputFileError
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES, InflateCap, capped_binary
from kvtool.core.jsonfile import loads_bounded

BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"
EVENT_TYPES = (BLOCK_STORED, BLOCK_REMOVED, ALL_BLOCKS_CLEARED)

# Field order of the positional (array_like) event form, after the tag: the declaration order of
# the msgspec structs in vllm/distributed/kv_events.py (0.32 adds locality/ownership/session_id
# at the end, which is also the key order of the recorded files in tests/data/vllm-events/).
POSITIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    BLOCK_STORED: (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "locality",
        "ownership",
        "session_id",
    ),
    BLOCK_REMOVED: ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    ALL_BLOCKS_CLEARED: (),
}

# SGLang's event structs (sglang/srt/disaggregation/kv_events.py), fields in declaration order: 0.4.10 has
# BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id) and BlockRemoved(block_hashes);
# 0.5.10 adds medium to both; 0.5.23 adds cache_salt, session_id, lora_name to BlockStored (and sends maps).
SGLANG_FIELDS: dict[str, tuple[str, ...]] = {
    BLOCK_STORED: (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "cache_salt",
        "session_id",
        "lora_name",
    ),
    BLOCK_REMOVED: ("block_hashes", "medium"),
    ALL_BLOCKS_CLEARED: (),
}
ENGINES = ("vllm", "sglang")
ENGINE_FIELDS = {"vllm": POSITIONAL_FIELDS, "sglang": SGLANG_FIELDS}

# The replay end-of-sequence marker: ZmqEventPublisher.END_SEQ = (-1).to_bytes(8, "big", signed=True).
END_SEQ = -1
SEQ_BYTES = 8

# The first keys of every row, in this order; the event's own fields follow.
ROW_PREFIX = ("seq", "batch_ts", "dp_rank", "type")
MAX_ABS_BATCH_TS_S = 1e12  # as analyze's ts: about 31,700 years; epoch milliseconds or nanoseconds are caught


class MalformedFrame(ValueError):
    """A received message that is not a vLLM KV-event batch (the reason is the message)."""


@dataclasses.dataclass(frozen=True)
class DecodedBatch:
    """One decoded ``KVEventBatch``."""

    ts: float  # the publisher's time.time() when the batch was built
    dp_rank: int | None  # data_parallel_rank; None when the publisher left it out
    events: tuple[dict[str, Any], ...]  # each {"type": ..., field: value, ...}, hashes normalised


def decode_seq(frame: bytes, *, signed: bool = True) -> int:
    """An 8-byte big-endian sequence number (the end-of-replay marker decodes as -1)."""
    if len(frame) != SEQ_BYTES:
        raise MalformedFrame(f"sequence frame has {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=signed)


def encode_seq(seq: int) -> bytes:
    """The inverse of :func:`decode_seq` (used for replay requests)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def _plain(value: Any) -> Any:
    """msgpack values -> strict-JSON values: bytes become hex strings, tuples lists.

    Anything else (msgpack extension types, NaN or infinite floats) is not something vLLM
    sends and makes the frame malformed, so the writer never meets a value it cannot write.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedFrame(f"non-finite number {value} in an event")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if type(value) in (list, tuple):  # not isinstance: msgpack's ExtType is a namedtuple
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    raise MalformedFrame(f"unexpected {type(value).__name__} value in an event")


def normalize_event(obj: Any, fields: dict[str, tuple[str, ...]] = POSITIONAL_FIELDS) -> dict[str, Any]:
    """One wire event (tagged map or positional array) -> ``{"type": ..., fields...}``.

    Known types get every declared field, in declaration order: msgspec's ``omit_defaults``
    leaves out fields that hold their default (always None here), and they are written back as
    null so every row has the shape of the recorded files.  Fields this version does not know
    follow.  Unknown event types are kept (their fields as given, or as ``"fields"`` when
    positional) so nothing received is dropped; the analysis counts them as "other".
    ``fields``: the engine's declared fields per type (:data:`POSITIONAL_FIELDS` for vLLM, :data:`SGLANG_FIELDS`).
    """
    if isinstance(obj, dict):
        tag = obj.get("type")
        if not isinstance(tag, str):
            raise MalformedFrame("event map has no string 'type' tag")
        row: dict[str, Any] = {"type": tag}
        for name in fields.get(tag, ()):
            row[name] = _plain(obj.get(name))
        for key, value in obj.items():
            if key != "type" and key not in row:
                row[str(key)] = _plain(value)
        return row
    if isinstance(obj, (list, tuple)):
        if not obj or not isinstance(obj[0], str):
            raise MalformedFrame("positional event does not start with a string tag")
        tag, values = obj[0], list(obj[1:])
        names = fields.get(tag)
        row = {"type": tag}
        if names is None:
            row["fields"] = _plain(values)
            return row
        if len(values) > len(names):
            row.update(zip(names, _plain(values[: len(names)])))
            row["extra_fields"] = _plain(values[len(names) :])
            return row
        row.update(zip(names, _plain(values)))
        row.update((name, None) for name in names[len(values) :])  # omitted trailing defaults
        return row
    raise MalformedFrame(f"event is a {type(obj).__name__}, not a map or an array")


def decode_payload(payload: bytes, engine: str = "vllm") -> DecodedBatch:
    """A msgpack ``KVEventBatch`` payload -> :class:`DecodedBatch`; raises :class:`MalformedFrame`.

    ``engine``: "vllm" or "sglang" (whose batch names its rank ``attn_dp_rank``; its events have other fields)."""
    import msgpack

    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types
        raise MalformedFrame(f"payload is not msgpack ({type(err).__name__}: {err})") from None
    if isinstance(obj, dict):
        ts, events = obj.get("ts"), obj.get("events")
        dp_rank = obj.get("attn_dp_rank" if engine == "sglang" else "data_parallel_rank")
    elif isinstance(obj, (list, tuple)) and len(obj) in (2, 3):
        ts, events = obj[0], obj[1]
        dp_rank = obj[2] if len(obj) == 3 else None
    else:
        raise MalformedFrame("payload is not a [ts, events, dp_rank] batch")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise MalformedFrame("batch timestamp is not a finite number")
    if not isinstance(events, (list, tuple)):
        raise MalformedFrame("batch events is not an array")
    if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, int)):
        raise MalformedFrame("batch data_parallel_rank is not an integer")
    fields = ENGINE_FIELDS[engine]
    return DecodedBatch(float(ts), dp_rank, tuple(normalize_event(e, fields) for e in events))


def batch_rows(seq: int, batch: DecodedBatch, engine: str = "vllm") -> list[dict[str, Any]]:
    """The JSON-lines rows of one batch: ``seq``, ``batch_ts``, ``dp_rank`` (and ``engine`` for SGLang), then each
    event.  vLLM rows keep the shape of the recorded files (no engine key)."""
    head: dict[str, Any] = {"seq": seq, "batch_ts": batch.ts, "dp_rank": batch.dp_rank}
    if engine != "vllm":
        head["engine"] = engine
    return [{**head, **event} for event in batch.events]


def row_to_json(row: dict[str, Any]) -> str:
    return json.dumps(row, separators=(", ", ": "), allow_nan=False)


# ---------------------------------------------------------------------------------------------
# Reading event files (as captured, or recorded with vLLM's own decoder)
# ---------------------------------------------------------------------------------------------

Hash = int | str  # a 64-bit int, or the hex string of a bytes hash


@dataclasses.dataclass(frozen=True)
class VllmEvent:
    """One event row of a vLLM KV-event file, validated."""

    line: int  # 1-based line number in the file
    seq: int  # the batch's sequence number
    batch_ts: float  # the batch's timestamp (seconds since the epoch)
    dp_rank: int  # data-parallel rank (0 when the publisher left it out)
    type: str  # BlockStored, BlockRemoved, AllBlocksCleared, or another tag (kept, not analysed)
    block_hashes: tuple[Hash, ...] = ()
    parent_block_hash: Hash | None = None
    block_size: int | None = None  # tokens per block (BlockStored)
    num_tokens: int = 0  # len(token_ids) (BlockStored)
    medium: str | None = None  # "GPU", or an offload tier
    group_idx: int | None = None  # KV-cache group (hybrid models have several)
    session_id: str | None = None
    spec_kind: str | None = None  # kv_cache_spec_kind of a BlockStored (FullAttentionSpec, SlidingWindowSpec, ...)
    sliding_window: int | None = None  # kv_cache_spec_sliding_window of a BlockStored (tokens), when vLLM sent one
    token_ids: tuple[int, ...] | None = None  # a BlockStored's token ids, only when read with keep_tokens=True
    # what else entered each block's hash besides its tokens and parent (LoRA name, cache salt, multimodal keys:
    # vLLM's extra_keys, and lora_name), one canonical JSON text per block; only with keep_tokens=True
    block_extras: tuple[str, ...] | None = None
    engine: str = "vllm"  # whose events: the row's "engine" ("sglang" from kvtool capture --engine sglang)


def _is_hash(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _event_from_row(row: Any, line: int, where: str, keep_tokens: bool = False) -> VllmEvent:
    def field_error(name: str, what: str) -> InputFileError:
        return InputFileError(f"field '{name}' {what}", where=f"{where}, line {line}")

    if not isinstance(row, dict):
        raise InputFileError("line is not a JSON object", where=f"{where}, line {line}")
    for name in ("seq", "type"):
        if name not in row:
            raise field_error(name, "is missing")
    seq, kind = row["seq"], row["type"]
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise field_error("seq", "is not an integer")
    if not isinstance(kind, str):
        raise field_error("type", "is not a string")
    ts = row.get("batch_ts", row.get("ts"))
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise field_error("batch_ts", "is missing or not a number")
    if not -MAX_ABS_BATCH_TS_S <= ts <= MAX_ABS_BATCH_TS_S:  # NaN and +-inf too: they ended in numpy tracebacks
        raise field_error("batch_ts", f"is not a time in seconds (finite, at most {MAX_ABS_BATCH_TS_S:.0e}): {ts!r}")
    dp_rank = row.get("dp_rank")
    if dp_rank is None:
        dp_rank = 0
    elif isinstance(dp_rank, bool) or not isinstance(dp_rank, int):
        raise field_error("dp_rank", "is not an integer")
    engine = row.get("engine", "vllm")
    if engine not in ENGINES:
        raise field_error("engine", f"is not one of {', '.join(ENGINES)}: {engine!r}")
    if kind not in (BLOCK_STORED, BLOCK_REMOVED):
        return VllmEvent(line, seq, float(ts), dp_rank, kind, engine=engine)
    hashes = row.get("block_hashes")
    if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
        raise field_error("block_hashes", "is not a list of integer or hex-string hashes")
    medium = row.get("medium")
    group_idx = row.get("group_idx")
    if group_idx is not None and (isinstance(group_idx, bool) or not isinstance(group_idx, int)):
        raise field_error("group_idx", "is not an integer")
    if kind == BLOCK_REMOVED:
        return VllmEvent(
            line, seq, float(ts), dp_rank, kind, tuple(hashes), medium=medium, group_idx=group_idx, engine=engine
        )
    parent = row.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise field_error("parent_block_hash", "is not an integer or hex-string hash")
    block_size = row.get("block_size")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0):
        raise field_error("block_size", "is not a positive integer")
    token_ids = row.get("token_ids") or []
    if not isinstance(token_ids, list):
        raise field_error("token_ids", "is not a list")
    session_id = row.get("session_id")
    spec_kind = row.get("kv_cache_spec_kind")
    window = row.get("kv_cache_spec_sliding_window")
    if keep_tokens and not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
        raise field_error("token_ids", "is not a list of integers")
    return VllmEvent(
        line,
        seq,
        float(ts),
        dp_rank,
        kind,
        tuple(hashes),
        parent,
        block_size,
        len(token_ids),
        medium,
        group_idx,
        None if session_id is None else str(session_id),
        spec_kind=spec_kind if isinstance(spec_kind, str) else None,
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None,
        token_ids=tuple(token_ids) if keep_tokens else None,
        block_extras=_block_extras(row, len(hashes)) if keep_tokens else None,
        engine=engine,
    )


def _block_extras(row: dict[str, Any], blocks: int) -> tuple[str, ...]:
    """Each block's extra hash keys with the event's LoRA name, as canonical JSON (equal keys, equal text).

    vLLM publishes ``extra_keys`` as one entry per block (``vllm/v1/core/kv_cache_utils.py:
    to_event_extra_keys``); a list of another length is kept whole on every block, so nothing is dropped."""
    extra = row.get("extra_keys")
    lora = [row.get("lora_name"), row.get("lora_id")]
    if row.get("cache_salt") is not None:  # SGLang's BlockStored names its cache_salt apart (vLLM's is an extra key)
        lora.append(row["cache_salt"])
    per_block = extra if isinstance(extra, list) and len(extra) == blocks else [extra] * blocks
    return tuple(json.dumps([lora, keys], sort_keys=True, separators=(",", ":")) for keys in per_block)


def open_text(path: Path, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> TextIO:
    """Open an event file for reading as UTF-8 text (a leading byte order mark skipped); ``.gz`` files are
    decompressed, and refused once they inflate past ``max_input_bytes`` (kvtool.core.inflate)."""
    if str(path).endswith(".gz"):
        import gzip

        inflated = capped_binary(gzip.open(path, "rb"), InflateCap(str(path), max_input_bytes))
        return io.TextIOWrapper(inflated, encoding="utf-8-sig")
    return Path(path).open("r", encoding="utf-8-sig")


_BAD_GZIP = "not a valid gzip file (corrupt or truncated)"
# A last line without its newline that is not JSON: the writer stopped mid-line (a full disk, a killed capture).
# Its complete lines before it are read; the cut one is a rejected line, reported.
CUT_LAST_LINE = "the last line is cut short (no newline, not complete JSON: the writer stopped mid-line)"


@dataclasses.dataclass(frozen=True)
class EventFile:
    """The events of a JSON-lines vLLM KV-event file, and the lines rejected (only a cut last line is: any other
    bad line is an error naming it)."""

    events: tuple[VllmEvent, ...]
    rejected_lines: tuple[tuple[int, str], ...]  # (line number, reason)


def check_readable_head(path: Path, chars: int) -> None:
    """Raise InputFileError when the first ``chars`` characters cannot be read: a corrupt or truncated ``.gz`` or
    bytes that are not UTF-8 say so, rather than "not a vLLM KV-event file"."""
    import zlib

    try:
        with open_text(path) as handle:
            handle.read(chars)
    except UnicodeDecodeError:
        raise InputFileError("not a UTF-8 text file", where=str(path)) from None
    except (EOFError, zlib.error):
        raise InputFileError(_BAD_GZIP, where=str(path)) from None
    except OSError as err:  # gzip.BadGzipFile is one
        message = _BAD_GZIP if str(path).endswith(".gz") else f"cannot read the file: {err.strerror or err}"
        raise InputFileError(message, where=str(path)) from None


def iter_event_rows(
    path: Path,
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    rejected: list[tuple[int, str]] | None = None,
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for each non-blank line; bad JSON -> InputFileError, except a cut last line
    (no newline) when ``rejected`` is given: it is appended there as (line number, reason) instead.

    JSON nested deeper than kvtool.core.jsonfile.MAX_JSON_DEPTH is an InputFileError naming the line."""
    try:
        handle = open_text(path, max_input_bytes)
    except OSError as err:
        raise InputFileError(f"cannot read the file: {err.strerror or err}", where=str(path)) from None
    with handle:
        try:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    yield number, loads_bounded(text, f"{path}, line {number}")
                except json.JSONDecodeError as err:
                    if rejected is not None and not text.endswith("\n"):  # only the last line lacks one
                        rejected.append((number, CUT_LAST_LINE))
                        return
                    raise InputFileError(f"not valid JSON ({err.msg})", where=f"{path}, line {number}") from None
        except UnicodeDecodeError:
            raise InputFileError("not a UTF-8 text file", where=str(path)) from None
        except (OSError, EOFError) as err:  # a truncated or corrupt .gz
            message = _BAD_GZIP if str(path).endswith(".gz") else f"cannot read the file: {err}"
            raise InputFileError(message, where=str(path)) from None


def read_event_file(path: Path, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> tuple[VllmEvent, ...]:
    """Every event of a JSON-lines vLLM KV-event file, in file order; errors name the line and field."""
    return read_event_lines(path, max_input_bytes).events


def read_event_lines(
    path: Path, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES, keep_tokens: bool = False
) -> EventFile:
    """Every event of a JSON-lines vLLM KV-event file, in file order, and a cut last line as a rejected line
    (a capture stopped by a full disk keeps its complete lines); any other bad line is an error naming it.
    ``keep_tokens``: keep each BlockStored's token ids (the prefix-outcome report matches prompts by them)."""
    rejected: list[tuple[int, str]] = []
    rows = iter_event_rows(path, max_input_bytes, rejected)
    events = tuple(_event_from_row(row, number, str(path), keep_tokens) for number, row in rows)
    return EventFile(events, tuple(rejected))
