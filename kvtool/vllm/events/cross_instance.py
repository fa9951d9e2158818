"""Reuse missed across the replicas of a fleet: prompt blocks computed on one vLLM instance while another held them.

Input: each instance's vLLM KV events (one JSON-lines file per instance, as ``kvtool capture`` writes them; an
instance whose file holds several data-parallel ranks is one instance per rank).  The replay merges every instance's
events in batch-timestamp order (each file's own order kept) and, at each ``BlockStored``:

- a block already cached on its own instance is a local hit (re-sent only in vLLM's "full" report mode): not work;
- any other block was computed there now.  It was *missed reuse* when another instance held the same block at that
  moment, together with every block before it in its prefix (a prefix-cache lookup there would have reached it),
  stored and not yet removed, cleared or lost to an engine restart.

"The same block" is matched by content where the events carry it: the block's token ids, its extra hash keys (LoRA,
cache salt, multimodal) and, through ``parent_block_hash``, the content of every block before it, so a match does
not depend on the instances computing equal hashes.  vLLM 0.32 (as since 0.29.0) computes equal hashes for equal
content across processes only under the same ``PYTHONHASHSEED``, or with none set and a cryptographic
``--prefix-caching-hash-algo`` (sha256, the default, or sha256_cbor; xxhash draws a random seed per process):
``vllm/v1/core/kv_cache_utils.py: resolve_none_hash_seed, init_none_hash, hash_block_tokens``; 0.10.0-0.28.0 drew
a random seed for every algorithm when PYTHONHASHSEED was unset.  The report measures
whether they did (``hashes``).  When some BlockStored carries no token ids, blocks are matched by hash instead.

The counts are a what-if of the first order: had the router sent that request to the instance holding the prefix,
those blocks would have been hits, if that instance had room, and every later eviction would have differed.

SGLang's events (``kvtool capture --engine sglang``; rows with ``"engine": "sglang"``) go through the same replay:
its "blocks" are radix-cache pages (``block_size`` is the page size), a ``BlockStored`` is a node new to the tree
(one per page in ``block_hashes``, ``parent_block_hash`` the page before), a ``BlockRemoved`` an evicted node, and
its hashes are unseeded SHA-256 chains (``srt/mem_cache/radix_cache.py``; equal content, equal hash on every
instance, a cache_salt or LoRA namespacing them).  The files of one report are all one engine's; the notes say what
SGLang's events cannot show (``SGLANG_NOTES`` below).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES
from kvtool.vllm.events.analysis import STARTED_BY_RESET, Stats, _stats, split_streams
from kvtool.vllm.events.wire import ALL_BLOCKS_CLEARED, BLOCK_REMOVED, BLOCK_STORED, VllmEvent, read_event_lines

MATCH_CONTENT = "content"
MATCH_HASH = "hash"
SKEW_SENSITIVE_S = 1.0  # a missed block the other instance had held for less than this could flip with clock skew
FIRST_TOKENS = 8  # token ids shown of a repeated prefix
DEFAULT_TOP = 10

HASHES_COMPARABLE = "comparable"  # every block content seen on two instances had the same hash on both
HASHES_DIFFER = "differ"  # none did: a router keyed on vLLM's hashes would find no shared prefix
HASHES_PARTLY = "partly comparable"
HASHES_UNKNOWN = "unknown"  # no content was stored on two instances, or blocks were matched by hash

NOTE_FULL_BLOCKS = (
    "vLLM stores (and reports) full blocks only: a prompt's last partial block is in no event, and the share's "
    "denominator is the tokens of the full blocks computed, which include full blocks of generated tokens."
)
NOTE_LOCAL_HITS = (
    "Hits on an instance's own cache are events only in vLLM's full report mode (kv_cache_report_mode 'full'); "
    "files in the default incremental mode show computed blocks only, so prompt tokens served from the local cache "
    "are in neither count."
)
NOTE_WHAT_IF = (
    "What-if of the first order: those blocks would have been hits had the router sent each request to the instance "
    "holding its prefix, if that instance had room; routing differently also changes every later eviction and load."
)
NOTE_CONTENT = (
    "Blocks are matched by content (token ids, extra hash keys and every block before them), not by vLLM's block "
    "hashes, which are equal across instances only under the same PYTHONHASHSEED, or none with sha256 or sha256_cbor "
    "hashing (vLLM 0.29.0 and later; before, only the same PYTHONHASHSEED: vllm/v1/core/kv_cache_utils.py: "
    "resolve_none_hash_seed, init_none_hash)."
)
# SGLang's events as its 0.5.23 source emits them (srt/mem_cache/radix_cache.py _insert_helper / evict,
# srt/managers/scheduler_output_processor_mixin.py: cache_unfinished_req after a prefill, cache_finished_req at the end)
SGLANG_NOTE_CONTENT = (
    "Pages are matched by content (token ids, LoRA and cache_salt, and every page before them); SGLang's page hashes "
    "are unseeded SHA-256 chains over the page tokens, equal on every instance for equal content, so a hash-keyed "
    "router (SGLang's own, llm-d, Dynamo) sees the same matches."
)
SGLANG_NOTE_PAGES = (
    "SGLang's blocks are radix-cache pages (block_size is its page size, 1 token by default: then each block is one "
    "token). Only whole pages enter the tree: a prompt's last partial page is in no event; the share's denominator "
    "is the tokens of the pages stored, which include generated tokens."
)
SGLANG_NOTE_NO_HITS = (
    "SGLang sends BlockStored only for pages new to its tree and nothing for a prefix-cache hit (it has no full "
    "report mode): prompt tokens served from an instance's own cache are in neither count."
)
SGLANG_NOTE_STORE_TIME = (
    "A page's BlockStored is sent when the page is cached: a prompt's pages after its prefill (cache_unfinished_req), "
    "generated tokens' at the request's finish (cache_finished_req). A page is judged missed at that time, so "
    "generated pages, stored a whole decode after they were computed, may count against a holder that stored them "
    "meanwhile."
)
ENGINE_KINDS = {"vllm": "vllm-cross-instance-reuse", "sglang": "sglang-cross-instance-reuse"}
NOTE_HASH = (
    "Some BlockStored events carry no token ids, so blocks are matched by vLLM's block hash: valid only when every "
    "instance hashes alike (the same PYTHONHASHSEED, or none with sha256 or sha256_cbor hashing from vLLM 0.29.0 on); "
    "with different seeds no block matches and the missed reuse reads 0."
)


@dataclasses.dataclass(frozen=True)
class HeldBy:
    """Blocks computed on one instance while another held them (a block two others held counts for each)."""

    instance: str
    blocks: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class InstanceReuse:
    instance: str  # the file's engine name (its instance=NAME folder or file name), "/dpN" per rank when several
    source: str  # the file
    computed_blocks: int  # blocks stored while not cached on this instance: work done here
    computed_tokens: int  # their tokens (the share's denominator)
    local_hit_blocks: int  # blocks re-sent while cached here (full report mode only)
    missed_blocks: int  # computed here while another instance held the block and its whole prefix
    missed_tokens: int
    missed_share: float | None  # missed_tokens / computed_tokens
    computed_elsewhere_before_blocks: int  # computed here after another instance had computed it (held or not)
    unmatched_blocks: int  # content unknown (its parent was stored before the file began): not matched
    held_by: tuple[HeldBy, ...]  # which instances held the missed blocks
    report_mode: str  # "full" when this file re-sent a cached block, else "incremental"
    missing_seqs: int  # batch sequence numbers absent inside this rank's streams (lost batches: counts are low)
    rejected_lines: int  # lines not read (a cut last line)


@dataclasses.dataclass(frozen=True)
class RepeatedPrefix:
    """A prefix computed again on an instance while another held it, grouped by its last missed block."""

    prefix_tokens: int  # tokens from the start of the prompt through the last missed block
    times: int  # how many times it was computed while held elsewhere
    missed_blocks: int  # blocks of it computed while held elsewhere, over all those times
    missed_tokens: int
    computed_on: tuple[str, ...]
    held_on: tuple[str, ...]
    first_token_ids: tuple[int, ...]  # the first FIRST_TOKENS tokens of the prefix (content matching only)


@dataclasses.dataclass(frozen=True)
class HashAgreement:
    """Whether vLLM's block hashes name equal content equally across instances (content matching only)."""

    verdict: str  # HASHES_COMPARABLE, HASHES_DIFFER, HASHES_PARTLY or HASHES_UNKNOWN
    shared_contents: int  # distinct block contents stored on two or more instances
    same_hash_contents: int  # of those, the ones every instance hashed alike
    missed_blocks_same_hash: int  # missed blocks whose hash equals the holder's: a hash-keyed router sees them


@dataclasses.dataclass(frozen=True)
class CrossInstanceReuse:
    kind: str  # "vllm-cross-instance-reuse", or "sglang-cross-instance-reuse" for SGLang's events
    matched_by: str  # MATCH_CONTENT or MATCH_HASH
    instances: tuple[InstanceReuse, ...]
    computed_blocks: int
    computed_tokens: int
    missed_blocks: int
    missed_tokens: int
    missed_share: float | None  # missed_tokens / computed_tokens over the fleet
    computed_elsewhere_before_blocks: int
    lead: Stats  # how long the holding instance had cached each missed block before it was computed again
    skew_sensitive_blocks: int  # missed blocks held for less than SKEW_SENSITIVE_S: clock skew could undo them
    hashes: HashAgreement
    top_prefixes: tuple[RepeatedPrefix, ...]
    notes: tuple[str, ...]
    engine: str = "vllm"  # whose events: "vllm" or "sglang"


@dataclasses.dataclass(frozen=True)
class InstanceEvents:
    """One instance's events, as read from its file."""

    instance: str
    source: str
    events: tuple[VllmEvent, ...]
    rejected_lines: tuple[tuple[int, str], ...] = ()  # (line, reason): a cut last line


def read_instances(paths: Sequence[str], max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> tuple[InstanceEvents, ...]:
    """Each file's events with their token ids, named as the fleet report names engines (an instance=NAME folder,
    else the file's path below the files' common folder)."""
    from kvtool.events.sources import pool_names

    out = []
    for path, name in zip(paths, pool_names(list(paths))):
        read = read_event_lines(Path(path), max_input_bytes, keep_tokens=True)
        out.append(InstanceEvents(name, str(path), read.events, read.rejected_lines))
    return tuple(out)


class _Unit:
    """One instance's cache (one engine rank) during the replay."""

    def __init__(self, name: str, source: str, missing_seqs: int = 0, rejected_lines: int = 0):
        self.name, self.source = name, source
        self.missing_seqs, self.rejected_lines = missing_seqs, rejected_lines
        self.cached: dict[tuple, int] = {}  # (medium, group, hash) -> content id
        self.content_of: dict[tuple, int] = {}  # (group, hash) -> content id, for parent links (kept after eviction)
        self.holding: Counter = Counter()  # (group, content) -> copies held (one per medium)
        self.held_since: dict[tuple, float] = {}  # (group, content) -> when the copy held now was stored
        self.hash_of: dict[tuple, object] = {}  # (group, content) -> this instance's hash of it
        self.computed = self.tokens = self.local_hits = self.missed = self.missed_tokens = 0
        self.elsewhere_before = self.unmatched = self.resent = 0
        self.held_by: Counter = Counter()
        self.held_by_tokens: Counter = Counter()

    def holds_chain(self, group, content: int | None, parents: dict[int, int | None]) -> bool:
        """This unit holds ``content`` and every block before it (None: the empty prefix, always held)."""
        while content is not None:
            if self.holding[(group, content)] <= 0:
                return False
            content = parents.get(content)
        return True

    def hold(self, key: tuple, content: int, t: float, block_hash) -> None:
        group = key[1]
        self.cached[key] = content
        if self.holding[(group, content)] == 0:
            self.held_since[(group, content)] = t
        self.holding[(group, content)] += 1
        self.hash_of.setdefault((group, content), block_hash)

    def drop(self, key: tuple) -> None:
        content = self.cached.pop(key, None)
        if content is None:
            return
        self.holding[(key[1], content)] -= 1
        if self.holding[(key[1], content)] <= 0:
            del self.holding[(key[1], content)]
            self.held_since.pop((key[1], content), None)

    def clear(self) -> None:
        for key in list(self.cached):
            self.drop(key)


class _Replay:
    """The fleet's caches as the merged events build them, and what was missed (see the module docstring)."""

    def __init__(self, units: list[_Unit], matched_by: str):
        self.units, self.matched_by = units, matched_by
        self.contents: dict[tuple, int] = {}  # (parent content, tokens or hash, extras) -> content id
        self.parents: dict[int, int | None] = {}
        self.depth: dict[int, int] = {}  # content -> blocks from the start of the prompt
        self.first_tokens: dict[int, tuple[int, ...]] = {}  # content -> the prompt's first tokens
        self.computed_on: dict[tuple, set[int]] = defaultdict(set)  # (group, content) -> units that computed it
        self.hashes_seen: dict[tuple, set] = defaultdict(set)  # (group, content) -> hashes over the units
        self.leads: list[float] = []
        self.same_hash_missed = 0
        self.prefixes: dict[tuple, dict] = {}

    def content_id(self, parent: int | None, body, extras: str) -> int:
        key = (parent, body, extras)
        found = self.contents.get(key)
        if found is None:
            found = self.contents[key] = len(self.contents)
            self.parents[found] = parent
            self.depth[found] = 1 + (self.depth[parent] if parent is not None else 0)
            if parent is None:
                self.first_tokens[found] = tuple(body[:FIRST_TOKENS]) if self.matched_by == MATCH_CONTENT else ()
            else:
                self.first_tokens[found] = self.first_tokens[parent]
        return found

    def stored(self, index: int, event: VllmEvent, t: float) -> None:
        unit = self.units[index]
        group, medium = event.group_idx, event.medium
        if event.parent_block_hash is None:
            parent: int | None = None
        else:
            parent = unit.content_of.get((group, event.parent_block_hash))
            if parent is None:  # stored before the file began: no content to match by
                unit.unmatched += sum(1 for h in event.block_hashes if (medium, group, h) not in unit.cached)
                return
        size = event.block_size or 0
        others = [(j, other) for j, other in enumerate(self.units) if j != index]
        # per other unit: does it hold everything before the block being looked at?
        reach = {j: other.holds_chain(group, parent, self.parents) for j, other in others}
        run_missed: list[tuple[int, set[int]]] = []
        for position, block_hash in enumerate(event.block_hashes):
            content = self.content_id(
                parent, self._body(event, position, size, block_hash), self._extras(event, position)
            )
            unit.content_of[(group, block_hash)] = content
            key = (medium, group, block_hash)
            for j, other in others:
                reach[j] = reach[j] and other.holding[(group, content)] > 0
            parent = content
            if key in unit.cached:  # a local hit, re-sent (full report mode)
                unit.local_hits += 1
                continue
            holders = {j for j, _ in others if reach[j]}
            self._computed(index, unit, group, content, block_hash, size, holders, t)
            if holders:
                run_missed.append((content, holders))
            unit.hold(key, content, t, block_hash)
        if run_missed:
            self._prefix(index, group, run_missed, size)

    def _body(self, event: VllmEvent, position: int, size: int, block_hash):
        if self.matched_by == MATCH_HASH:
            return ("hash", block_hash)
        tokens = event.token_ids or ()  # content matching is chosen only when every BlockStored has them
        return tokens[position * size : (position + 1) * size]

    def _extras(self, event: VllmEvent, position: int) -> str:
        if self.matched_by == MATCH_HASH or event.block_extras is None:
            return ""
        return event.block_extras[position]

    def _computed(self, index, unit: _Unit, group, content: int, block_hash, size: int, holders, t: float) -> None:
        unit.computed += 1
        unit.tokens += size
        if self.computed_on[(group, content)] - {index}:
            unit.elsewhere_before += 1
        self.computed_on[(group, content)].add(index)
        self.hashes_seen[(group, content)].add((index, block_hash))
        if not holders:
            return
        unit.missed += 1
        unit.missed_tokens += size
        for j in holders:
            unit.held_by[j] += 1
            unit.held_by_tokens[j] += size
        self.leads.append(max(t - self.units[j].held_since[(group, content)] for j in holders))
        if any(self.units[j].hash_of.get((group, content)) == block_hash for j in holders):
            self.same_hash_missed += 1

    def _prefix(self, index: int, group, run: list[tuple[int, set[int]]], size: int) -> None:
        last = run[-1][0]
        entry = self.prefixes.setdefault(
            (group, last), {"times": 0, "blocks": 0, "computed_on": set(), "held_on": set()}
        )
        entry["times"] += 1
        entry["blocks"] += len(run)
        entry["size"] = size
        entry["computed_on"].add(index)
        for _, holders in run:
            entry["held_on"] |= holders

    def removed(self, index: int, event: VllmEvent) -> None:
        unit = self.units[index]
        for block_hash in event.block_hashes:
            unit.drop((event.medium, event.group_idx, block_hash))

    def cleared(self, index: int) -> None:
        self.units[index].clear()


def _units_of(files: Sequence[InstanceEvents]) -> list[tuple[str, str, list[VllmEvent], int]]:
    """One replay unit per (file, data-parallel rank), with the file's rejected lines (on its first rank)."""
    out = []
    for f in files:
        ranks = sorted({e.dp_rank for e in f.events})
        for n, rank in enumerate(ranks):
            name = f.instance if len(ranks) == 1 else f"{f.instance}/dp{rank}"
            rejected = len(f.rejected_lines) if n == 0 else 0
            out.append((name, f.source, [e for e in f.events if e.dp_rank == rank], rejected))
    return out


def _merged(units: list[tuple[str, str, list[VllmEvent], int]]) -> Iterator[tuple[float, int, VllmEvent]]:
    """Every unit's events in batch-timestamp order; each unit's own order is kept (ties: the earlier unit)."""

    def stream(index: int, events: list[VllmEvent]) -> Iterator[tuple[float, int, VllmEvent]]:
        return ((e.batch_ts, index, e) for e in events)

    streams = [stream(i, events) for i, (_, _, events, _) in enumerate(units)]
    return heapq.merge(*streams, key=lambda item: item[0])


def choose_matching(files: Sequence[InstanceEvents]) -> str:
    """Content when every BlockStored carries its blocks' token ids (read with keep_tokens), else hash."""
    for f in files:
        for e in f.events:
            if e.type == BLOCK_STORED and (
                e.token_ids is None or e.block_size is None or len(e.token_ids) != len(e.block_hashes) * e.block_size
            ):
                return MATCH_HASH
    return MATCH_CONTENT


def analyze_cross_instance(files: Sequence[InstanceEvents], top: int = DEFAULT_TOP) -> CrossInstanceReuse:
    """Replay a fleet's vLLM (or SGLang) KV events and count the reuse missed across instances (see the module
    docstring).

    Raises UsageError for fewer than two instances or files of both engines, InputFileError for an instance with
    no events.
    """
    for f in files:
        if not f.events:
            raise InputFileError("the file holds no vLLM KV events", where=f.source)
    engine = _engine_of(files)
    plan = _units_of(files)
    if len(plan) < 2:
        raise UsageError(
            "cross-instance reuse needs the events of two or more instances",
            where=files[0].source if files else "EVENTS",
            tip="give one KV-event file per instance",
        )
    names = [name for name, _, _, _ in plan]
    duplicate = next((n for n, c in Counter(names).items() if c > 1), None)
    if duplicate is not None:
        raise UsageError(
            f"two files are both instance '{duplicate}'",
            where=", ".join(src for name, src, _, _ in plan if name == duplicate),
            tip="put each instance's file in its own instance=NAME/ folder or give the files distinct names",
        )
    matched_by = choose_matching(files)
    streams = [split_streams(tuple(events)) for _, _, events, _ in plan]
    units = [
        _Unit(name, source, sum(s.missing_seqs for s in streams[i]), rejected)
        for i, (name, source, _, rejected) in enumerate(plan)
    ]
    restarts = [{s.first_line for s in runs if s.started_by == STARTED_BY_RESET} for runs in streams]
    replay = _Replay(units, matched_by)
    t0 = min(events[0].batch_ts for _, _, events, _ in plan)
    for ts, index, event in _merged(plan):
        t = ts - t0
        if event.line in restarts[index]:
            replay.cleared(index)  # a new engine process starts with an empty cache
        if event.type == BLOCK_STORED:
            before = units[index].local_hits
            replay.stored(index, event, t)
            if event.block_hashes and units[index].local_hits - before == len(event.block_hashes):
                units[index].resent += 1
        elif event.type == BLOCK_REMOVED:
            replay.removed(index, event)
        elif event.type == ALL_BLOCKS_CLEARED:
            replay.cleared(index)
    return _result(replay, matched_by, top, engine)


def _engine_of(files: Sequence[InstanceEvents]) -> str:
    """The one engine whose events the files hold; vLLM's and SGLang's together are refused (their blocks are
    other units, blocks of 16 and pages of 1 by default, so no content would match across them)."""
    engines = {f.source: f.events[0].engine for f in files}
    for f in files:
        other = next((e for e in f.events if e.engine != f.events[0].engine), None)
        if other is not None:
            raise InputFileError(
                f"the file holds {f.events[0].engine}'s and {other.engine}'s events",
                where=f"{f.source}, line {other.line}",
            )
    if len(set(engines.values())) > 1:
        sglang = [src for src, e in engines.items() if e == "sglang"]
        raise UsageError(
            "the files hold vLLM's and SGLang's KV events: cross-instance reuse compares one engine's instances",
            where=", ".join(sglang),
            tip="analyze each engine's files apart",
        )
    return next(iter(engines.values()))


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _hash_agreement(replay: _Replay, matched_by: str) -> HashAgreement:
    shared = same = 0
    for seen in replay.hashes_seen.values():
        if len({unit for unit, _ in seen}) < 2:
            continue
        shared += 1
        same += len({h for _, h in seen}) == 1
    if matched_by == MATCH_HASH or shared == 0:
        verdict = HASHES_UNKNOWN
    elif same == shared:
        verdict = HASHES_COMPARABLE
    elif same == 0:
        verdict = HASHES_DIFFER
    else:
        verdict = HASHES_PARTLY
    return HashAgreement(verdict, shared, same, replay.same_hash_missed if matched_by == MATCH_CONTENT else 0)


def _result(replay: _Replay, matched_by: str, top: int, engine: str = "vllm") -> CrossInstanceReuse:
    units = replay.units
    instances = tuple(
        InstanceReuse(
            instance=u.name,
            source=u.source,
            computed_blocks=u.computed,
            computed_tokens=u.tokens,
            local_hit_blocks=u.local_hits,
            missed_blocks=u.missed,
            missed_tokens=u.missed_tokens,
            missed_share=_share(u.missed_tokens, u.tokens),
            computed_elsewhere_before_blocks=u.elsewhere_before,
            unmatched_blocks=u.unmatched,
            held_by=tuple(HeldBy(units[j].name, n, u.held_by_tokens[j]) for j, n in sorted(u.held_by.items())),
            report_mode="full" if u.resent else "incremental",
            missing_seqs=u.missing_seqs,
            rejected_lines=u.rejected_lines,
        )
        for u in units
    )
    prefixes = sorted(
        (
            RepeatedPrefix(
                prefix_tokens=replay.depth[content] * entry["size"],
                times=entry["times"],
                missed_blocks=entry["blocks"],
                missed_tokens=entry["blocks"] * entry["size"],
                computed_on=tuple(sorted(units[i].name for i in entry["computed_on"])),
                held_on=tuple(sorted(units[i].name for i in entry["held_on"])),
                first_token_ids=replay.first_tokens[content],
            )
            for (_, content), entry in replay.prefixes.items()
        ),
        key=lambda p: (-p.missed_tokens, -p.times, -p.prefix_tokens, p.first_token_ids),
    )
    computed = sum(i.computed_tokens for i in instances)
    missed = sum(i.missed_tokens for i in instances)
    if engine == "sglang":
        notes = [SGLANG_NOTE_CONTENT if matched_by == MATCH_CONTENT else NOTE_HASH, SGLANG_NOTE_PAGES]
        notes += [SGLANG_NOTE_NO_HITS, SGLANG_NOTE_STORE_TIME]
    else:
        notes = [NOTE_CONTENT if matched_by == MATCH_CONTENT else NOTE_HASH, NOTE_FULL_BLOCKS]
        incremental = [i.instance for i in instances if i.report_mode == "incremental"]
        if incremental:
            notes.append(f"{NOTE_LOCAL_HITS} Incremental here: {', '.join(incremental)}.")
    skew = sum(1 for lead in replay.leads if lead < SKEW_SENSITIVE_S)
    notes.append(
        "Instances are ordered by their own batch timestamps (each publisher's clock): "
        f"{skew:,} missed block{'s' if skew != 1 else ''} had been held elsewhere for less than "
        f"{SKEW_SENSITIVE_S:g} s, so clock skew between hosts could undo {'them' if skew != 1 else 'it'}."
    )
    unmatched = sum(i.unmatched_blocks for i in instances)
    if unmatched:
        notes.append(
            f"{unmatched:,} stored blocks continue a prefix stored before their file began (the capture started "
            "mid-run): their content is unknown, so they are neither computed nor missed here."
        )
    lossy = [f"{i.instance}: {i.missing_seqs:,}" for i in instances if i.missing_seqs]
    if lossy:
        notes.append(
            f"Batch sequence numbers are missing ({', '.join(lossy)}): those events were lost, counts are low."
        )
    cut = [i.instance for i in instances if i.rejected_lines]
    if cut:
        notes.append(f"The last line of {', '.join(cut)} was cut short and not read.")
    notes.append(NOTE_WHAT_IF)
    return CrossInstanceReuse(
        kind=ENGINE_KINDS[engine],
        matched_by=matched_by,
        instances=instances,
        computed_blocks=sum(i.computed_blocks for i in instances),
        computed_tokens=computed,
        missed_blocks=sum(i.missed_blocks for i in instances),
        missed_tokens=missed,
        missed_share=_share(missed, computed),
        computed_elsewhere_before_blocks=sum(i.computed_elsewhere_before_blocks for i in instances),
        lead=_stats(replay.leads),
        skew_sensitive_blocks=skew,
        hashes=_hash_agreement(replay, matched_by),
        top_prefixes=tuple(prefixes[:top]),
        notes=tuple(notes),
        engine=engine,
    )
