"""What an isolation run observed, as one JSON document: the plan, each probe's response, counters and KV events.

The verdicts (:mod:`kvtool.vllm.isolation.verdicts`) are computed from this record alone, so a recorded run
(``kvtool vllm isolation --record FILE``) can be judged again without an engine (``--replay FILE``); the test
fixtures under tests/data/isolation/ are such records from real vLLM runs.

A record never holds a secret: each tenant's API key is replaced by a label (``key#1``, ``key#2``, ... in the order
the keys first appear; equal keys get equal labels, so the verdicts, which tell partitions apart by their key,
come out the same), URLs are written without credentials, and the file is created readable by its owner only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.jsonable import to_jsonable
from kvtool.core.jsonfile import loads_bounded
from kvtool.core.redact import redact_url
from kvtool.vllm.isolation.multimodal import ImageSupport
from kvtool.vllm.isolation.plan import Partition, Plan, Probe, Trial

RECORD_FORMAT = "kvtool-isolation/1"
RECORD_FILE_MODE = 0o600  # the owner only: a record names the endpoint, the tenants and the served adapters
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
    cache_config: dict[str, str] | None = None  # the labels of vllm:cache_config_info (None: not in /metrics)
    metrics_status: int | None = None  # the HTTP status /metrics answered (None: older records)
    search_seconds: float | None = None  # wall time of the probes (search and minimization)
    engines: int | None = None  # engines /metrics showed behind the endpoint (None: no engine label; older records)
    kv_connector: str | None = None  # how the check told whether a KV connector serves a second tier (tier dimension)


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
    error: str | None = None  # the engine refused the request (HTTP 4xx, e.g. an empty salt); nothing was cached
    engine: str | None = None  # the engine that served it, when /metrics shows several (kvtool.vllm.isolation.routing)
    external_hits_before: float | None = None  # vllm:external_prefix_cache_hits_total (a KV connector's hits)
    external_hits_after: float | None = None


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
    images: ImageSupport | None = None  # whether the model takes images, and what showed it (None: not asked)


def keep_event(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in EVENT_FIELDS if k in row}


def relevant_events(rows: list[dict[str, Any]], sessions: set[str]) -> tuple[dict[str, Any], ...]:
    """The rows the verdicts read: BlockStored of the run's sessions, BlockRemoved trimmed to the hashes those
    published (the filler requests that make the pool evict remove thousands of others), AllBlocksCleared."""
    stored = [r for r in rows if r.get("type") == "BlockStored" and r.get("session_id") in sessions]
    published = {h for r in stored for h in (r.get("block_hashes") or [])}
    out = []
    for row in rows:
        kind = row.get("type")
        if kind == "BlockStored":
            if row.get("session_id") in sessions:
                out.append(keep_event(row))
        elif kind == "BlockRemoved":
            hashes = [h for h in (row.get("block_hashes") or []) if h in published]
            if hashes:
                out.append(dict(keep_event(row), block_hashes=hashes))
        else:
            out.append(keep_event(row))
    return tuple(out)


class _KeyLabels:
    """``key#1``, ``key#2``, ...: one label per distinct API key, in the order the keys first appear.

    A label says nothing about its key (a short hash of a weak key could be reversed by guessing), yet equal keys
    get equal labels, which is all the verdicts need to tell partitions apart."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}

    def partition(self, partition: Partition) -> Partition:
        if partition.api_key is None:
            return partition
        label = self.labels.setdefault(partition.api_key, f"key#{len(self.labels) + 1}")
        return dataclasses.replace(partition, api_key=label)

    def probe(self, probe: Probe) -> Probe:
        return dataclasses.replace(probe, partition=self.partition(probe.partition))

    def trial(self, trial: Trial) -> Trial:
        prime, control, victim = (self.probe(p) for p in trial.probes)
        fillers = tuple(self.probe(p) for p in trial.fillers)
        return dataclasses.replace(trial, probes=(prime, control, victim), fillers=fillers)


def redact_keys(record: IsolationRecord) -> IsolationRecord:
    """The record with every API key replaced by its label and the URLs without credentials (idempotent: a
    redacted record comes back unchanged)."""
    labels = _KeyLabels()
    plan = dataclasses.replace(record.plan, trials=tuple(labels.trial(t) for t in record.plan.trials))
    by_index = {p.index: p for p in plan.probes}
    results = tuple(dataclasses.replace(r, probe=by_index[r.probe.index]) for r in record.results)
    engine = record.engine
    events_endpoint = None if engine.events_endpoint is None else redact_url(engine.events_endpoint)
    engine = dataclasses.replace(engine, endpoint=redact_url(engine.endpoint), events_endpoint=events_endpoint)
    return dataclasses.replace(record, engine=engine, plan=plan, results=results)


def write_record(record: IsolationRecord, path: Path) -> None:
    """One JSON document, keys redacted, mode 0600; each result names its probe by index (the plan holds the
    probes)."""
    data = to_jsonable(redact_keys(record))
    for result in data["results"]:
        result["probe"] = result["probe"]["index"]
    text = json.dumps(data, separators=(",", ":")) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, RECORD_FILE_MODE)
        with open(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), RECORD_FILE_MODE)  # a file that existed keeps its mode through O_CREAT
            handle.write(text)
    except OSError as err:
        raise UsageError(f"cannot write the record: {err.strerror or err}", where=str(path)) from None


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
        fillers = tuple(_probe(p) for p in t.get("fillers", ()))
        trials.append(Trial(**dict(t, probes=probes, fillers=fillers)))
    return Plan(obj["block_size"], obj["full_blocks"], obj["partial_tokens"], obj["run_id"], tuple(trials),
                obj.get("budget_requests"), tuple(obj.get("not_covered", ())))  # fmt: skip


def _images(obj: Any) -> ImageSupport | None:
    if obj is None:
        return None
    return ImageSupport(**dict(obj, not_covered=tuple(obj.get("not_covered", ()))))


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
    record = IsolationRecord(
        RECORD_FORMAT,
        EngineInfo(**obj["engine"]),
        plan,
        results,
        events,
        tuple(SkippedDimension(**s) for s in obj.get("skipped", ())),
        _images(obj.get("images")),
    )
    return redact_keys(record)  # a record written before keys were redacted holds them in plaintext


def read_record(path: Path) -> IsolationRecord:
    """A record written by ``--record``; errors name the file."""
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":  # a gzipped record (the larger fixtures under tests/data/isolation/)
            import gzip

            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise InputFileError(
            f"cannot read the record: {getattr(err, 'strerror', None) or err}", where=str(path)
        ) from None
    try:
        return record_from_json(loads_bounded(text, str(path)))
    except (ValueError, KeyError, TypeError) as err:
        raise InputFileError(f"not an isolation record ({err})", where=str(path)) from None
