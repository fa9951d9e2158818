"""What a vLLM KV-cache event file can honestly show about the prefix cache.

Input: JSON lines, one event per line with its batch's ``seq``, ``batch_ts`` and ``dp_rank``
(as written by ``kvtool capture``, or recorded with vLLM's own decoder).  The analysis replays the
events against a model of vLLM's prefix cache, keyed by (dp_rank, medium, group_idx, hash):

- ``BlockStored`` of a hash not cached: a block computed and cached now.  If the hash had been
  evicted before, the block was computed again (eviction churn: recomputed work).
- ``BlockStored`` of a hash already cached: only vLLM's "full" report mode sends these (a prefix-
  cache hit at scheduling time), so they are the hit evidence.
- ``BlockRemoved``: the block was evicted to make room; its lifetime ends.
- ``AllBlocksCleared``: every cached block of that rank ends ("cleared", not evicted).
- Parent links give each block its depth in its prefix chain (depth x block_size = prefix tokens).

These events carry no request id, so the time a *request* holds its KV blocks cannot be derived
from them; block lifetimes here are how long a block's content stayed in the prefix cache.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from pathlib import Path

from kvtool.core.errors import InputFileError
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES
from kvtool.core.jsonfile import loads_bounded
from kvtool.vllm.events.wire import (
    ALL_BLOCKS_CLEARED,
    BLOCK_REMOVED,
    BLOCK_STORED,
    EVENT_TYPES,
    VllmEvent,
    check_readable_head,
    open_text,
    read_event_lines,
)

MAX_TIMELINE_POINTS = 500  # the stored-over-time series is thinned to at most this many points
HISTOGRAM_BINS = 20  # bins of the evicted-lifetime histogram
SNIFF_BYTES = 1 << 20  # looks_like_vllm_events reads at most the first line of this many bytes

NOTE_NO_REQUESTS = (
    "vLLM's KV events carry no request id: the time a request holds its KV blocks (per-request holding "
    "time) cannot be derived from them. Block lifetimes here are how long a block's content stayed in "
    "the prefix cache; BlockRemoved fires when a cached block is evicted for reuse, not when a request ends."
)
NOTE_VLLM_LIFETIME = (
    "vLLM's own vllm:kv_block_lifetime_seconds (--kv-cache-metrics) is a different clock: it follows a 1 % "
    "sample of blocks (--kv-cache-metrics-sample) from the moment the block pool hands a block out to the moment "
    "it hands the same block out again (evicting its cached content), so it includes the time the block waited "
    "free in the queue, and it records nothing while prefix caching is off (vllm/v1/core/kv_cache_metrics.py, "
    "block_pool.py). The lifetimes here run from BlockStored (block full and cached) to BlockRemoved. kvtool "
    "analyze on an events file with block_ids measures residency (a request attaching a block until it frees "
    "it) and turnover (free until the id is reallocated): vLLM's lifetime is about residency plus turnover."
)
NOTE_INCREMENTAL = (
    "No BlockStored re-sent a cached block, so the file looks like vLLM's default incremental report mode, "
    "which does not report prefix-cache hits; run requests with SamplingParams(extra_args="
    "{'kv_cache_report_mode': 'full'}) for hit evidence."
)
# SGLang's events, as its source emits them (sglang 0.5.23: srt/mem_cache/events.py KVCacheEventRecorder,
# srt/mem_cache/radix_cache.py RadixCache._insert_helper / evict / reset, srt/disaggregation/kv_events.py).
SGLANG_NOTES = (
    "SGLang's KV events carry no request id (its BlockStored may carry a session_id, for attribution): the time a "
    "request holds its KV cannot be derived from them. Lifetimes here run from the radix-tree insert of a page "
    "(BlockStored) to its eviction (BlockRemoved): how long a prefix stayed cached.",
    "SGLang's 'blocks' are pages of the radix cache: block_size is its page size, 1 token by default, so with the "
    "default each block is one token and counts, depths and lifetimes are per token. Only page-aligned prefixes "
    "enter the tree (RadixKey.page_aligned): the tail of a prompt shorter than a page is never a BlockStored.",
    "SGLang sends BlockStored only for pages new to the tree (RadixCache._insert_helper: record_store on a new "
    "node); a prefix-cache hit sends nothing, so the events hold no hit evidence (SGLang has no full report mode). "
    "A page stored again after its removal is recomputed work (churn).",
    "Inserts happen when a prefill chunk is cached (cache_unfinished_req/checkpoint) and when a request finishes "
    "(cache_finished_req), not per decode step; a store can lag the compute by a request's whole decode.",
    "BlockRemoved is one event per evicted radix node (all its pages), fired by RadixCache.evict (LRU over unlocked "
    "leaves by default) when the token pool runs short; AllBlocksCleared is RadixCache.reset (start-up, "
    "flush_cache). medium is GPU, or CPU_PINNED / DISK / EXTERNAL for HiCache tiers.",
    "SGLang's block hashes are SHA-256 chains over page tokens (first 8 bytes as int64), not seeded per process: "
    "equal prefixes have equal hashes on every instance (with cache_salt / LoRA they are namespaced).",
)
NOTE_FULL = (
    "Hit evidence counts blocks re-sent while cached (full report mode): one per scheduling of a request, "
    "so a request that is scheduled again (after preemption) is counted again."
)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of a set of durations in seconds (all None when count is 0)."""

    count: int
    min_s: float | None
    median_s: float | None
    mean_s: float | None
    p90_s: float | None
    max_s: float | None


@dataclasses.dataclass(frozen=True)
class EventCounts:
    block_stored_events: int
    block_removed_events: int
    all_blocks_cleared_events: int
    other_events: int  # events of a type this analysis does not know (kept, not analysed)
    batches: int  # batches over all streams (one engine run's (dp_rank, seq) pairs each)
    first_seq: int
    last_seq: int
    missing_seqs: int  # sequence numbers absent between the first and last of each stream (lost batches)
    dp_ranks: tuple[int, ...]
    duration_s: float  # last batch_ts - first batch_ts
    sequence_resets: int  # engine restarts seen: a rank's sequence numbers went back (each starts a new stream)


@dataclasses.dataclass(frozen=True)
class Stream:
    """One engine run inside a file: one rank's batches from its first sequence number until it goes back.

    vLLM's publisher numbers batches from 0 in each engine process (``ZmqEventPublisher``), so a capture that
    spans a restart holds several runs of one rank; each has its own sequence numbers and so its own gaps.
    """

    index: int  # 1-based, in the order the streams begin in the file
    dp_rank: int
    started_by: str  # "file start", or "sequence reset" (the rank's seq went back: the engine restarted)
    first_line: int  # the file line of its first event
    first_seq: int
    last_seq: int
    batches: int  # distinct sequence numbers in the stream
    missing_seqs: int  # last_seq - first_seq + 1 - batches: batches lost inside this stream
    start_t_s: float  # its first batch, seconds since the file's first batch
    end_t_s: float  # its last batch, likewise


@dataclasses.dataclass(frozen=True)
class CachePoint:
    """The prefix cache after one batch."""

    t_s: float  # seconds since the first batch
    seq: int
    cached_blocks: int  # blocks in the prefix cache now (by this file's events)
    stored_blocks_total: int  # blocks computed and cached so far
    removed_blocks_total: int  # blocks evicted so far


@dataclasses.dataclass(frozen=True)
class Lifetimes:
    """Stored -> removed times of cached blocks."""

    evicted: Stats  # ended by BlockRemoved
    cleared: Stats  # ended by AllBlocksCleared
    still_cached: Stats  # age at the end of the file of blocks never removed (censored lifetimes)
    restarted: Stats  # ended by an engine restart (a new stream of the rank: a new process starts with no cache)
    removed_unknown_blocks: int  # BlockRemoved of a hash not cached by this file (stored before the capture)
    evicted_histogram: tuple[tuple[float, float, int], ...]  # (from_s, to_s, blocks) of evicted lifetimes


@dataclasses.dataclass(frozen=True)
class Churn:
    computed_blocks: int  # blocks stored while not cached (first-time + recomputed)
    first_time_blocks: int  # hash never stored before in this file
    recomputed_blocks: int  # stored again after an eviction: work done twice
    recomputed_hashes: int  # distinct hashes among them
    recomputed_tokens: int | None  # recomputed_blocks x block_size
    recomputed_fraction: float | None  # recomputed_blocks / computed_blocks
    restored_after_clear_blocks: int  # stored again after an AllBlocksCleared or an engine restart (not churn)


@dataclasses.dataclass(frozen=True)
class Chains:
    root_blocks: int  # distinct blocks with no parent (the first block of a prompt)
    max_depth_blocks: int  # longest prefix chain seen, in blocks
    max_prefix_tokens: int | None  # max_depth_blocks x block_size
    mean_depth_blocks: float | None  # over distinct blocks with a known depth
    depth_histogram: tuple[tuple[int, int], ...]  # (depth in blocks, distinct blocks at that depth)
    branch_blocks: int  # blocks with two or more distinct children: shared prefixes that fork
    max_children: int  # the largest fan-out of one block
    unknown_parent_events: int  # BlockStored whose parent was stored before the file began


@dataclasses.dataclass(frozen=True)
class Hits:
    report_mode: str  # "full" when any BlockStored re-sent a cached block, else "incremental"
    resent_events: int  # BlockStored events whose blocks were all cached already
    hit_blocks: int  # blocks re-sent while cached
    hit_tokens: int | None  # hit_blocks x block_size
    hit_fraction: float | None  # hit_blocks / (hit_blocks + computed_blocks); None in incremental mode


@dataclasses.dataclass(frozen=True)
class SessionSummary:
    session_id: str
    store_events: int
    computed_blocks: int
    hit_blocks: int  # only in full report mode
    recomputed_blocks: int
    first_t_s: float
    last_t_s: float


@dataclasses.dataclass(frozen=True)
class VllmAnalysis:
    source: str
    kind: str  # always "vllm-kv-events": tells this result from the CSV analysis
    block_size: int | None  # tokens per block (None when no BlockStored gave one)
    counts: EventCounts
    peak_cached_blocks: int
    final_cached_blocks: int  # cached at the end of the file (0 after a final AllBlocksCleared)
    distinct_blocks: int  # distinct hashes stored
    timeline: tuple[CachePoint, ...]  # at most MAX_TIMELINE_POINTS, first and last always kept
    lifetimes: Lifetimes
    churn: Churn
    chains: Chains
    hits: Hits
    sessions: tuple[SessionSummary, ...]  # empty when no event carried a session_id
    streams: tuple[Stream, ...]  # one per engine run (a rank, until its sequence numbers reset)
    notes: tuple[str, ...]
    # lines not read, as (line number, reason): a cut last line (a capture stopped by a full disk); reported
    rejected_lines: tuple[tuple[int, str], ...] = ()
    engine: str = "vllm"  # whose events: "vllm", or "sglang" (rows written by kvtool capture --engine sglang)


def looks_like_vllm_events(path: Path) -> bool:
    """True when the first non-blank line is a JSON object with ``seq`` and a vLLM event ``type``."""
    try:
        with open_text(Path(path)) as handle:
            read = 0
            for number, text in enumerate(handle, start=1):
                read += len(text)
                if text.strip():
                    row = loads_bounded(text, f"{path}, line {number}")
                    return isinstance(row, dict) and "seq" in row and row.get("type") in EVENT_TYPES
                if read > SNIFF_BYTES:
                    return False
    except (OSError, EOFError, UnicodeDecodeError, ValueError):
        return False
    return False


def _stats(values: list[float]) -> Stats:
    if not values:
        return Stats(0, None, None, None, None, None)
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return Stats(
        count=len(values),
        min_s=float(arr.min()),
        median_s=float(np.median(arr)),
        mean_s=float(arr.mean()),
        p90_s=float(np.percentile(arr, 90)),
        max_s=float(arr.max()),
    )


def _histogram(values: list[float]) -> tuple[tuple[float, float, int], ...]:
    if not values:
        return ()
    import numpy as np

    counts, edges = np.histogram(np.asarray(values, dtype=float), bins=HISTOGRAM_BINS)
    return tuple((float(edges[i]), float(edges[i + 1]), int(n)) for i, n in enumerate(counts))


def _thin(points: list[CachePoint]) -> tuple[CachePoint, ...]:
    if len(points) <= MAX_TIMELINE_POINTS:
        return tuple(points)
    step = (len(points) - 1) / (MAX_TIMELINE_POINTS - 1)
    return tuple(points[round(i * step)] for i in range(MAX_TIMELINE_POINTS))


STARTED_AT_FILE_START = "file start"
STARTED_BY_RESET = "sequence reset"


class _OpenStream:
    """A stream while the events are read: its rank, where it began, and the sequence numbers seen."""

    def __init__(self, index: int, event: VllmEvent, started_by: str):
        self.index, self.dp_rank, self.started_by, self.first_line = index, event.dp_rank, started_by, event.line
        self.seqs: set[int] = set()
        self.last_seq, self.last_ts = event.seq, event.batch_ts
        self.first_ts = event.batch_ts

    def restarts_at(self, event: VllmEvent) -> bool:
        """The rank's engine started again: its sequence number went back, or one repeats with another time."""
        return event.seq < self.last_seq or (event.seq == self.last_seq and event.batch_ts != self.last_ts)

    def add(self, event: VllmEvent) -> None:
        self.seqs.add(event.seq)
        self.last_seq, self.last_ts = event.seq, event.batch_ts

    def close(self, t0: float) -> Stream:
        first, last = min(self.seqs), max(self.seqs)
        return Stream(
            index=self.index,
            dp_rank=self.dp_rank,
            started_by=self.started_by,
            first_line=self.first_line,
            first_seq=first,
            last_seq=last,
            batches=len(self.seqs),
            missing_seqs=last - first + 1 - len(self.seqs),
            start_t_s=self.first_ts - t0,
            end_t_s=self.last_ts - t0,
        )


def split_streams(events: tuple[VllmEvent, ...]) -> tuple[Stream, ...]:
    """The engine runs of a file, in the order they begin (see :class:`Stream`).

    Ranks are streams of their own (each rank's publisher counts its own batches); within a rank, a sequence
    number lower than the last one (or the same one with another batch time) is a restart, not a gap: capture
    writes batches recovered from the replay socket in order, before the batch that revealed the gap.
    """
    t0 = events[0].batch_ts
    current: dict[int, _OpenStream] = {}
    done: list[_OpenStream] = []
    for event in events:
        stream = current.get(event.dp_rank)
        if stream is None or stream.restarts_at(event):
            if stream is not None:
                done.append(stream)
            started_by = STARTED_AT_FILE_START if stream is None else STARTED_BY_RESET
            stream = current[event.dp_rank] = _OpenStream(0, event, started_by)  # numbered below
        stream.add(event)
    every = sorted([*done, *current.values()], key=lambda s: s.first_line)
    return tuple(dataclasses.replace(s.close(t0), index=i) for i, s in enumerate(every, start=1))


class _CacheReplay:
    """The prefix cache as the events build it, keyed by (dp_rank, medium, group_idx, hash), and what they did."""

    def __init__(self, t0: float, restart_lines: frozenset[int] = frozenset()):
        self.t0 = t0
        self.restart_lines = restart_lines  # first lines of streams that began with a sequence reset
        self.restarted_s: list[float] = []
        self.cached: dict[tuple, float] = {}  # key -> time stored
        self.evicted_keys: set[tuple] = set()
        self.cleared_keys: set[tuple] = set()
        self.stored_keys: set[tuple] = set()
        self.recomputed_keys: set[tuple] = set()
        self.depth: dict[tuple, int] = {}  # (dp_rank, hash) -> depth in blocks
        self.children: dict[tuple, set] = defaultdict(set)
        self.evicted_s: list[float] = []
        self.cleared_s: list[float] = []
        self.type_counts: Counter = Counter()
        self.sessions: dict[str, dict] = {}
        self.timeline: list[CachePoint] = []
        self.peak = self.stored_total = self.removed_total = self.removed_unknown = 0
        self.first_time = self.recomputed = self.after_clear = self.hits = self.resent = self.unknown_parent = 0

    def replay(self, events: tuple[VllmEvent, ...]) -> None:
        for index, event in enumerate(events):
            t = event.batch_ts - self.t0
            self.type_counts[event.type] += 1
            if event.line in self.restart_lines:
                self.restarted(event, t)
            if event.type == BLOCK_STORED:
                self.stored(event, t)
            elif event.type == BLOCK_REMOVED:
                self.removed(event, t)
            elif event.type == ALL_BLOCKS_CLEARED:
                self.cleared(event, t)
            following = events[index + 1] if index + 1 < len(events) else None
            if following is None or (following.seq, following.dp_rank, following.batch_ts) != (
                event.seq,
                event.dp_rank,
                event.batch_ts,
            ):
                self.close_batch(event)

    def _session(self, event: VllmEvent, t: float) -> dict | None:
        if event.session_id is None:
            return None
        session = self.sessions.setdefault(
            event.session_id,
            {"store_events": 0, "computed": 0, "hits": 0, "recomputed": 0, "first": t, "last": t},
        )
        session["store_events"] += 1
        session["last"] = t
        return session

    def _chain(self, event: VllmEvent) -> None:
        """Depths (from the parent's) and parent -> child links of the stored blocks."""
        parent = event.parent_block_hash
        level: int | None = 0
        if parent is not None:
            level = self.depth.get((event.dp_rank, parent))
            if level is None:
                self.unknown_parent += 1
        previous = parent
        for block_hash in event.block_hashes:
            if level is not None:
                level += 1
                self.depth.setdefault((event.dp_rank, block_hash), level)
            if previous is not None:
                self.children[(event.dp_rank, previous)].add(block_hash)
            previous = block_hash

    def stored(self, event: VllmEvent, t: float) -> None:
        """``BlockStored``: a block computed now, or (already cached) hit evidence in full report mode."""
        session = self._session(event, t)
        self._chain(event)
        event_hits = 0
        for block_hash in event.block_hashes:
            key = (event.dp_rank, event.medium, event.group_idx, block_hash)
            if key in self.cached:
                event_hits += 1
                continue
            if key in self.evicted_keys:
                self.recomputed += 1
                self.recomputed_keys.add(key)
                if session is not None:
                    session["recomputed"] += 1
            elif key in self.cleared_keys:
                self.after_clear += 1
            elif key not in self.stored_keys:
                self.first_time += 1
            self.cached[key] = t
            self.stored_keys.add(key)
            self.stored_total += 1
            if session is not None:
                session["computed"] += 1
        self.hits += event_hits
        if session is not None:
            session["hits"] += event_hits
        if event.block_hashes and event_hits == len(event.block_hashes):
            self.resent += 1
        self.peak = max(self.peak, len(self.cached))

    def removed(self, event: VllmEvent, t: float) -> None:
        """``BlockRemoved``: evicted to make room; the block's lifetime ends."""
        for block_hash in event.block_hashes:
            key = (event.dp_rank, event.medium, event.group_idx, block_hash)
            stored_at = self.cached.pop(key, None)
            if stored_at is None:
                self.removed_unknown += 1
                continue
            self.evicted_s.append(t - stored_at)
            self.evicted_keys.add(key)
            self.removed_total += 1

    def cleared(self, event: VllmEvent, t: float) -> None:
        """``AllBlocksCleared``: every cached block of that rank ends."""
        for key in [k for k in self.cached if k[0] == event.dp_rank]:
            self.cleared_s.append(t - self.cached.pop(key))
            self.cleared_keys.add(key)

    def restarted(self, event: VllmEvent, t: float) -> None:
        """A new engine run of the rank: its old cache is gone (like a clear), and what it evicted is not churn."""
        for key in [k for k in self.cached if k[0] == event.dp_rank]:
            self.restarted_s.append(t - self.cached.pop(key))
            self.cleared_keys.add(key)
        for key in [k for k in self.evicted_keys if k[0] == event.dp_rank]:
            self.evicted_keys.discard(key)
            self.cleared_keys.add(key)

    def close_batch(self, event: VllmEvent) -> None:
        point = CachePoint(event.batch_ts - self.t0, event.seq, len(self.cached), self.stored_total, self.removed_total)
        timeline = self.timeline
        if timeline and (timeline[-1].seq, timeline[-1].t_s) == (point.seq, point.t_s):
            timeline[-1] = point
        else:
            timeline.append(point)

    @property
    def computed(self) -> int:
        return self.first_time + self.recomputed + self.after_clear


def _notes(replay: _CacheReplay, streams: tuple[Stream, ...], engine: str = "vllm") -> tuple[str, ...]:
    if engine == "sglang":
        notes = list(SGLANG_NOTES)
    else:
        notes = [NOTE_NO_REQUESTS, NOTE_FULL if replay.hits > 0 else NOTE_INCREMENTAL, NOTE_VLLM_LIFETIME]
    resets = [s for s in streams if s.started_by == STARTED_BY_RESET]
    if resets:
        notes.append(
            f"The engine restarted {len(resets):,} time{'s' if len(resets) != 1 else ''} (sequence numbers went back, "
            f"at line{'s' if len(resets) != 1 else ''} {', '.join(f'{s.first_line:,}' for s in resets)}): "
            f"{len(streams):,} streams, each with its own sequence numbers and gaps."
        )
    lossy = [s for s in streams if s.missing_seqs]
    if lossy:
        missing = sum(s.missing_seqs for s in lossy)
        where = ", ".join(f"stream {s.index}: {s.missing_seqs:,}" for s in lossy)
        numbers = "number is" if missing == 1 else "numbers are"
        notes.append(
            f"{missing:,} batch sequence {numbers} missing ({where}): those events were lost, so counts are low."
        )
    if replay.removed_unknown or replay.unknown_parent:
        notes.append(
            f"{replay.removed_unknown:,} removed blocks and {replay.unknown_parent:,} parent links refer to blocks "
            "stored before the file begins (the capture started mid-run); they are left out of lifetimes and depths."
        )
    other = replay.type_counts.keys() - set(EVENT_TYPES)
    if other:
        notes.append(f"Events of other types were counted but not analysed: {', '.join(sorted(other))}.")
    return tuple(notes)


def _counts(
    events: tuple[VllmEvent, ...], replay: _CacheReplay, streams: tuple[Stream, ...], duration_s: float
) -> EventCounts:
    types = replay.type_counts
    return EventCounts(
        block_stored_events=types[BLOCK_STORED],
        block_removed_events=types[BLOCK_REMOVED],
        all_blocks_cleared_events=types[ALL_BLOCKS_CLEARED],
        other_events=sum(n for k, n in types.items() if k not in EVENT_TYPES),
        batches=sum(s.batches for s in streams),
        first_seq=min(e.seq for e in events),
        last_seq=max(e.seq for e in events),
        missing_seqs=sum(s.missing_seqs for s in streams),
        dp_ranks=tuple(sorted({e.dp_rank for e in events})),
        duration_s=duration_s,
        sequence_resets=sum(1 for s in streams if s.started_by == STARTED_BY_RESET),
    )


def _chains(replay: _CacheReplay, block_size: int | None) -> Chains:
    known_depths = Counter(replay.depth.values())
    max_depth = max(known_depths) if known_depths else 0
    mean_depth = sum(d * n for d, n in known_depths.items()) / sum(known_depths.values()) if known_depths else None
    return Chains(
        root_blocks=known_depths.get(1, 0),
        max_depth_blocks=max_depth,
        max_prefix_tokens=None if block_size is None else max_depth * block_size,
        mean_depth_blocks=mean_depth,
        depth_histogram=tuple(sorted(known_depths.items())),
        branch_blocks=sum(1 for kids in replay.children.values() if len(kids) >= 2),
        max_children=max((len(kids) for kids in replay.children.values()), default=0),
        unknown_parent_events=replay.unknown_parent,
    )


def _churn(replay: _CacheReplay, block_size: int | None) -> Churn:
    computed = replay.computed
    return Churn(
        computed_blocks=computed,
        first_time_blocks=replay.first_time,
        recomputed_blocks=replay.recomputed,
        recomputed_hashes=len(replay.recomputed_keys),
        recomputed_tokens=None if block_size is None else replay.recomputed * block_size,
        recomputed_fraction=replay.recomputed / computed if computed else None,
        restored_after_clear_blocks=replay.after_clear,
    )


def _hits(replay: _CacheReplay, block_size: int | None) -> Hits:
    hits, computed = replay.hits, replay.computed
    full_mode = hits > 0
    return Hits(
        report_mode="full" if full_mode else "incremental",
        resent_events=replay.resent,
        hit_blocks=hits,
        hit_tokens=None if block_size is None else hits * block_size,
        hit_fraction=hits / (hits + computed) if full_mode and hits + computed else None,
    )


def analyze_kv_events(events: tuple[VllmEvent, ...], source: str = "") -> VllmAnalysis:
    """Replay vLLM KV-cache events against a model of the prefix cache (see the module docstring)."""
    if not events:
        raise InputFileError("the file holds no vLLM KV events", where=source or None)
    engines = sorted({e.engine for e in events})
    if len(engines) > 1:
        other = next(e for e in events if e.engine != events[0].engine)
        raise InputFileError(
            f"the file mixes {' and '.join(engines)} events (line {other.line:,} is {other.engine}, line "
            f"{events[0].line:,} {events[0].engine}): analyse each engine's "
            "capture on its own",
            where=source or None,
        )
    engine = engines[0]
    t0 = events[0].batch_ts
    sizes = Counter(e.block_size for e in events if e.type == BLOCK_STORED and e.block_size)
    block_size = sizes.most_common(1)[0][0] if sizes else None
    streams = split_streams(events)
    replay = _CacheReplay(t0, frozenset(s.first_line for s in streams if s.started_by == STARTED_BY_RESET))
    replay.replay(events)
    t_end = events[-1].batch_ts - t0
    return VllmAnalysis(
        source=source,
        kind="vllm-kv-events",
        block_size=block_size,
        counts=_counts(events, replay, streams, t_end),
        peak_cached_blocks=replay.peak,
        final_cached_blocks=len(replay.cached),
        distinct_blocks=len(replay.stored_keys),
        timeline=_thin(replay.timeline),
        lifetimes=Lifetimes(
            evicted=_stats(replay.evicted_s),
            cleared=_stats(replay.cleared_s),
            still_cached=_stats([t_end - s for s in replay.cached.values()]),
            restarted=_stats(replay.restarted_s),
            removed_unknown_blocks=replay.removed_unknown,
            evicted_histogram=_histogram(replay.evicted_s),
        ),
        churn=_churn(replay, block_size),
        chains=_chains(replay, block_size),
        hits=_hits(replay, block_size),
        sessions=tuple(
            SessionSummary(sid, s["store_events"], s["computed"], s["hits"], s["recomputed"], s["first"], s["last"])
            for sid, s in sorted(replay.sessions.items())
        ),
        streams=streams,
        notes=_notes(replay, streams, engine),
        engine=engine,
    )


def analyze_vllm_events(path: Path, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> VllmAnalysis:
    """Read and analyse a vLLM KV-event file; a file that is not one -> InputFileError (exit 3).  A ``.gz``
    inflating past ``max_input_bytes`` is refused; a cut last line is a rejected line (with a note)."""
    path = Path(path)
    if not path.exists():
        raise InputFileError("no such file", where=str(path))
    if not looks_like_vllm_events(path):
        check_readable_head(path, SNIFF_BYTES)  # a truncated .gz is not "not a vLLM file"
        raise InputFileError(
            "not a vLLM KV-event file: its first line is not a JSON object with 'seq' and a 'type' of "
            + ", ".join(EVENT_TYPES),
            where=str(path),
            tip="record one with 'kvtool capture --endpoint tcp://127.0.0.1:5557 -o events.jsonl'",
        )
    read = read_event_lines(path, max_input_bytes)
    analysis = analyze_kv_events(read.events, str(path))
    if not read.rejected_lines:
        return analysis
    cut = "; ".join(f"line {number:,}: {reason}" for number, reason in read.rejected_lines)
    return dataclasses.replace(analysis, rejected_lines=read.rejected_lines, notes=(*analysis.notes, f"rejected {cut}"))
