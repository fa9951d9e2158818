"""What an isolation run observed, as one JSON document: the plan, each probe's response, counters and KV events.

The verdicts (:mod:`kvtool.vllm.isolation.verdicts`) are computed from this record alone, so a recorded run
(``kvtool vllm isolation --record FILE``) can be judged again without an engine (``--replay FILE``); the test
fixtures under tests/data/isolation/ are such records from real vLLM runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.core.jsonable import to_jsonable
from kvtool.core.jsonfile import loads_bounded
from kvtool.vllm.isolation.plan import Partition, Plan, Probe, Trial

RECORD_FORMAT = "kvtool-isolation/1"
# KV-event fields kept in a record (token_ids are dropped: the verdicts never need them and they are large).
EVENT_FIELDS = ("seq", "batch_ts", "type", "block_hashes", "block_size", "lora_name", "extra_keys", "session_id")


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    mode: str  # "self-started" (kvtool ran vLLM) or "endpoint" (a running server)
    endpoint: str  # the HTTP base URL
    base_model: str  # the served base model name
    block_size: int
    version: str | None  # what /version answered, when it did
    events_endpoint: str | None  # the ZMQ KV-event endpoint captured, None when events were not captured
    note: str | None = None  # free text (the tests name the deliberately broken engines here)


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens
    prompt_tokens: int | None  # usage.prompt_tokens
    sent_at_s: float  # time.time() when sent (compared with KV-event batch timestamps)
    latency_s: float  # wall time of the request (max_tokens=1)
    queries_before: float | None  # vllm:prefix_cache_queries_total before the request (tokens)
    hits_before: float | None
    queries_after: float | None
    hits_after: float | None


@dataclasses.dataclass(frozen=True)
class SkippedDimension:
    dimension: str
    reason: str  # what the run lacked, and the option that provides it


@dataclasses.dataclass(frozen=True)
class IsolationRecord:
    format: str
    engine: EngineInfo
    plan: Plan
    results: tuple[ProbeResult, ...]
    events: tuple[dict[str, Any], ...] | None  # KV-event rows (EVENT_FIELDS), None when not captured
    skipped: tuple[SkippedDimension, ...]


def keep_event(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in EVENT_FIELDS if k in row}


def write_record(record: IsolationRecord, path: Path) -> None:
    """One JSON document; each result names its probe by index (the plan holds the probes)."""
    data = to_jsonable(record)
    for result in data["results"]:
        result["probe"] = result["probe"]["index"]
    Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")


def _partition(obj: dict[str, Any]) -> Partition:
    return Partition(**obj)


def _probe(obj: dict[str, Any]) -> Probe:
    fields = dict(obj, partition=_partition(obj["partition"]), block_seeds=tuple(obj["block_seeds"]))
    return Probe(**fields)


def _plan(obj: dict[str, Any]) -> Plan:
    trials = []
    for t in obj["trials"]:
        probes = tuple(_probe(p) for p in t["probes"])
        if len(probes) != 3:
            raise ValueError("a trial has three probes")
        trials.append(Trial(**dict(t, probes=probes)))
    return Plan(obj["block_size"], obj["full_blocks"], obj["partial_tokens"], obj["run_id"], tuple(trials))


def _index(probe: Any) -> int:
    return int(probe["index"] if isinstance(probe, dict) else probe)


def record_from_json(obj: Any) -> IsolationRecord:
    """Rebuild a record; raises ValueError, KeyError or TypeError on a malformed document."""
    if not isinstance(obj, dict) or obj.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    plan = _plan(obj["plan"])
    by_index = {p.index: p for p in plan.probes}
    results = tuple(ProbeResult(**dict(r, probe=by_index[_index(r["probe"])])) for r in obj["results"])
    events = None if obj.get("events") is None else tuple(dict(e) for e in obj["events"])
    return IsolationRecord(
        RECORD_FORMAT,
        EngineInfo(**obj["engine"]),
        plan,
        results,
        events,
        tuple(SkippedDimension(**s) for s in obj.get("skipped", ())),
    )


def read_record(path: Path) -> IsolationRecord:
    """A record written by ``--record``; errors name the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputFileError(f"cannot read the record: {err.strerror or err}", where=str(path)) from None
    try:
        return record_from_json(loads_bounded(text, str(path)))
    except (ValueError, KeyError, TypeError) as err:
        raise InputFileError(f"not an isolation record ({err})", where=str(path)) from None
