"""The inputs of the prefix-outcome report (:mod:`kvtool.events.prefix_outcomes`): prompts, recorder rows, vLLM events.

- the prompts: JSON lines ``{"request_id", "prompt_token_ids", "num_cached_tokens"?}`` in submission order (what a
  driver knows; ``tests/support/vllm_prefix_driver.py`` writes them from vLLM's ``RequestOutput``);
- the recorder's rows (``kvtool record``): each request's first ``reuse`` row gives its hit; the block ids of every
  row, split by ``group_blocks`` on hybrid models, give the blocks each group holds over time; ``free_pool_blocks``
  gives vLLM's own usage gauge; the ``.meta.json`` beside the file gives the pool size and the KV-cache groups;
- vLLM's KV events: ``BlockStored`` carries each block's token ids and parent, so a prompt's blocks are found by
  content in every group, and ``BlockRemoved`` (with ``group_idx``) says which group lost them before the request
  came back.  Where the prompts give no ``num_cached_tokens``, the hit is the depth of the first block the request
  stored (vLLM stores only the blocks it computes).

A request's rows and events are replayed in Python: these files hold one row per block event of a few thousand
requests at most, which the prompts file must list one by one anyway.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.events.prefix_outcomes import (
    EVICTED,
    WINDOW,
    CacheGroup,
    GroupUtilization,
    PrefixReport,
    PromptRecord,
    RequestOutcome,
    cacheable_unit_tokens,
    classify,
    outcome_shares,
    reachable_prefixes,
    shared_prefixes,
    window_kept_boundary,
)

META_SUFFIX = ".meta.json"  # kvtool.vllm.recorder.writer.META_SUFFIX (not imported: that module runs inside vLLM)


def read_prompts(path: str | Path) -> tuple[PromptRecord, ...]:
    """The prompts file: one JSON object per line; a bad line -> InputFileError naming it."""
    path = Path(path)
    if not path.exists():
        raise InputFileError("prompts file not found", where=str(path))
    out: list[PromptRecord] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise InputFileError(f"not JSON ({err.msg})", where=where) from None
            if not isinstance(row, dict):
                raise InputFileError("a line must be a JSON object", where=where)
            rid, ids, cached = row.get("request_id"), row.get("prompt_token_ids"), row.get("num_cached_tokens")
            if not isinstance(rid, str) or not rid:
                raise InputFileError("field 'request_id' must be a non-empty string", where=where)
            if rid in seen:
                raise InputFileError(f"request '{rid}' is listed twice", where=where)
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise InputFileError("field 'prompt_token_ids' must be a non-empty list of integers", where=where)
            if cached is not None and (not isinstance(cached, int) or cached < 0):
                raise InputFileError("field 'num_cached_tokens' must be a non-negative integer", where=where)
            seen.add(rid)
            out.append(PromptRecord(rid, tuple(ids), cached))
    if not out:
        raise InputFileError("the prompts file lists no request", where=str(path))
    return tuple(out)


def read_meta(events_path: str | Path) -> dict[str, Any] | None:
    meta = Path(str(events_path) + META_SUFFIX)
    if not meta.exists():
        return None
    try:
        return json.loads(meta.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputFileError(f"the recorder's meta file is not JSON ({err.msg})", where=str(meta)) from None


def groups_of_meta(meta: dict[str, Any] | None, block_size: int) -> tuple[CacheGroup, ...]:
    """The KV-cache groups the recorder wrote: [kind, block size, window] (files before issue 28: [kind, size])."""
    rows = (meta or {}).get("groups") or []
    if not rows:
        return (CacheGroup(0, "unknown", block_size, None),)
    out = []
    for i, row in enumerate(rows):
        window = row[2] if len(row) > 2 else None
        out.append(CacheGroup(i, str(row[0]), int(row[1]), int(window) if window else None))
    return tuple(out)


def groups_of_events(events) -> tuple[CacheGroup, ...]:
    """The groups vLLM's BlockStored events name (``group_idx``, ``kv_cache_spec_kind``, window), in index order."""
    found: dict[int, CacheGroup] = {}
    for e in events:
        if e.type == "BlockStored" and e.block_size:
            g = e.group_idx or 0
            found.setdefault(g, CacheGroup(g, e.spec_kind or "unknown", e.block_size, e.sliding_window))
    return tuple(found[g] for g in sorted(found))


# ------------------------------------------------------------------------------------------ recorder rows


def _read_rows(path: Path) -> list[dict]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path) if path.suffix.lower() in (".parquet", ".pq") else pacsv.read_csv(path)
    except Exception as err:  # pyarrow's own errors: said in one line, naming the file
        raise InputFileError(f"cannot read the recorder's rows ({type(err).__name__})", where=str(path)) from None
    wanted = [
        c
        for c in ("ts", "event", "request_id", "num_tokens", "block_ids", "free_pool_blocks", "reason", "group_blocks")
        if c in table.column_names
    ]
    return table.select(wanted).to_pylist()


def _ids(text: Any) -> list[int]:
    if text is None:
        return []
    if isinstance(text, list):
        return [int(i) for i in text]
    return [int(i) for i in str(text).split()]


def _per_group(row: dict, n_groups: int) -> list[list[int]]:
    ids = _ids(row.get("block_ids"))
    if n_groups == 1:
        return [ids]
    counts = _ids(row.get("group_blocks")) or [len(ids)] + [0] * (n_groups - 1)
    out, at = [], 0
    for n in counts:
        out.append(ids[at : at + n])
        at += n
    return out


class _Holding:
    """The blocks each request holds per group, its tokens, and time-weighted sums of what the groups hold."""

    def __init__(self, groups: tuple[CacheGroup, ...], pool_blocks: int | None):
        self.groups = groups
        self.pool_blocks = pool_blocks
        self.held: dict[str, list[set[int]]] = {}
        self.tokens: dict[str, int] = defaultdict(int)
        self.blocks_s = [0.0] * len(groups)
        self.written_s = [0.0] * len(groups)
        self.usage_s = 0.0
        self.usage_peak: float | None = None
        self.duration_s = 0.0
        self.last_ts: float | None = None
        self.last_usage: float | None = None

    def advance(self, ts: float) -> None:
        if self.last_ts is not None and ts > self.last_ts:
            dt = ts - self.last_ts
            for g, group in enumerate(self.groups):
                distinct: set[int] = set()
                unfilled = 0
                for rid, per_group in self.held.items():
                    if per_group[g]:
                        distinct |= per_group[g]
                        size = group.block_size_tokens
                        unfilled += -self.tokens[rid] % size  # the request's last block: slots not yet written
                self.blocks_s[g] += len(distinct) * dt
                self.written_s[g] += (len(distinct) * group.block_size_tokens - unfilled) * dt
            if self.last_usage is not None:
                self.usage_s += self.last_usage * dt
            self.duration_s += dt
        self.last_ts = ts if self.last_ts is None else max(ts, self.last_ts)

    def apply(self, row: dict) -> None:
        rid, event = row["request_id"], row["event"]
        per_group = _per_group(row, len(self.groups))
        if event in ("allocate", "append", "reuse"):
            held = self.held.setdefault(rid, [set() for _ in self.groups])
            for g, ids in enumerate(per_group):
                held[g].update(ids)
            self.tokens[rid] += int(row.get("num_tokens") or 0)
        elif event == "free":
            if row.get("reason") == "window":
                for g, ids in enumerate(per_group):
                    if rid in self.held:
                        self.held[rid][g].difference_update(ids)
            else:
                self.held.pop(rid, None)
                self.tokens.pop(rid, None)
        free = row.get("free_pool_blocks")
        if free is not None and self.pool_blocks and self.pool_blocks > 1:
            usage = 1.0 - float(free) / (self.pool_blocks - 1)  # vLLM's BlockPool.get_usage (the null block aside)
            self.last_usage = usage
            self.usage_peak = usage if self.usage_peak is None else max(self.usage_peak, usage)

    def utilization(self) -> tuple[GroupUtilization, ...]:
        out = []
        for g, group in enumerate(self.groups):
            d = self.duration_s or 1.0
            blocks = self.blocks_s[g] / d
            slots = blocks * group.block_size_tokens
            written = self.written_s[g] / d
            out.append(GroupUtilization(group, blocks, slots, written, written / slots if slots > 0 else None))
        return tuple(out)


def _window_note(rows: list[dict], groups: tuple[CacheGroup, ...], source: str, before: int, group_names) -> str | None:
    """Which group's blocks of the earlier request left its window before row ``before`` (recorder rows)."""
    left: defaultdict[int, int] = defaultdict(int)
    for row in rows[:before]:
        if row["request_id"] == source and row["event"] == "free" and row.get("reason") == "window":
            for g, ids in enumerate(_per_group(row, len(groups))):
                if ids:
                    left[g] += len(ids)
    if not left:
        return None
    return "; ".join(
        f"{n} block{'s' if n != 1 else ''} of group {g} ({group_names(g)}) had left {source}'s window before it came"
        for g, n in sorted(left.items())
    )


def _name(groups: tuple[CacheGroup, ...]):
    def name(g: int) -> str:
        group = groups[g]
        return group.kind + (f", window {group.sliding_window_tokens}" if group.sliding_window_tokens else "")

    return name


def prefix_report_from_rows(path: str | Path, prompts: tuple[PromptRecord, ...]) -> PrefixReport:
    """Outcomes and per-group utilization from the recorder's rows (and its meta file) with the prompts."""
    path = Path(path)
    rows = _read_rows(path)
    meta = read_meta(path)
    block_size = int((meta or {}).get("block_size") or 16)
    groups = groups_of_meta(meta, block_size)
    unit = cacheable_unit_tokens(groups)
    holding = _Holding(groups, (meta or {}).get("num_blocks"))
    first_reuse: dict[str, int] = {}
    admitted_at: dict[str, int] = {}
    for index, row in enumerate(rows):
        holding.advance(float(row["ts"]))
        holding.apply(row)
        rid = row["request_id"]
        if row["event"] in ("reuse", "allocate") and rid not in admitted_at:
            admitted_at[rid] = index
        if row["event"] == "reuse" and rid not in first_reuse and admitted_at.get(rid) == index:
            first_reuse[rid] = int(row.get("num_tokens") or 0)
    notes = []
    missing = [p.request_id for p in prompts if p.request_id not in admitted_at]
    if missing:
        notes.append(f"{len(missing)} prompts have no row (not sampled, or never admitted): {', '.join(missing[:5])}")
    name = _name(groups)
    outcomes: list[RequestOutcome] = []
    for p, (shared, who), reach in zip(prompts, shared_prefixes(prompts), reachable_prefixes(prompts, groups)):
        if p.request_id not in admitted_at:
            continue
        hit = first_reuse.get(p.request_id, 0)
        r = classify(p.request_id, len(p.prompt_token_ids), shared, hit, unit, shared_with=who, reachable_tokens=reach)
        if (r.evicted_tokens or r.window_tokens) and who is not None:
            window = _window_note(rows, groups, who, admitted_at[p.request_id], name)
            r = _with_evidence(r, _kept_note(r, prompts, unit) if r.outcome == WINDOW else window)
        outcomes.append(r)
    return _report(
        path,
        unit,
        groups,
        outcomes,
        notes,
        utilization=holding.utilization(),
        vllm_usage_mean=holding.usage_s / holding.duration_s if holding.duration_s else None,
        vllm_usage_peak=holding.usage_peak,
    )


def _report(
    path: str | Path,
    unit: int,
    groups: tuple[CacheGroup, ...],
    outcomes: list[RequestOutcome],
    notes: list[str],
    utilization: tuple[GroupUtilization, ...] = (),
    vllm_usage_mean: float | None = None,
    vllm_usage_peak: float | None = None,
) -> PrefixReport:
    """One source's report: its requests' outcomes and their shares; the per-group utilization and vLLM's usage
    gauge only where the source has held blocks (the recorder's rows; vLLM's KV events have none)."""
    return PrefixReport(
        source=str(path),
        unit_tokens=unit,
        groups=groups,
        requests=tuple(outcomes),
        shares=outcome_shares(outcomes),
        utilization=utilization,
        vllm_usage_mean=vllm_usage_mean,
        vllm_usage_peak=vllm_usage_peak,
        notes=tuple(notes),
    )


def _kept_note(r: RequestOutcome, prompts: tuple[PromptRecord, ...], block: int) -> str | None:
    """A ``window`` outcome's cause: the one boundary the earlier prompt left the sliding-window group."""
    if r.outcome != WINDOW or r.shared_with is None:
        return None
    other = next(p for p in prompts if p.request_id == r.shared_with)
    kept = window_kept_boundary(len(other.prompt_token_ids), block)
    return (
        f"the sliding-window group kept {other.request_id}'s blocks only up to its last-block boundary, token "
        f"{kept} of {len(other.prompt_token_ids)}; a hit here would end at token {r.cacheable_tokens}"
    )


def _with_evidence(r: RequestOutcome, evidence: str | None) -> RequestOutcome:
    import dataclasses

    return dataclasses.replace(r, evidence=evidence) if evidence else r


# ------------------------------------------------------------------------------------------ vLLM's KV events


class _Content:
    """Each stored block's token prefix (parent chain + own tokens), per group; and when blocks were removed.

    Hashes do not depend on the group (vLLM hashes tokens, parent and extra keys), so a parent stored by any group
    places a block.  A sliding-window group stores blocks whose parent it never stored (it keeps only the blocks a
    later hit can end on): such a block is placed where a prompt holds its tokens at that depth.
    """

    def __init__(self, prompts: tuple[PromptRecord, ...]) -> None:
        self.prompts = prompts
        self.prefix_of: dict[Any, tuple[int, ...]] = {}  # hash -> the tokens from block 0 to its end
        self.key_of: dict[tuple[int, tuple[int, ...]], Any] = {}  # (group, token prefix) -> hash
        self.stored_at: dict[tuple, list[int]] = defaultdict(list)  # (group, hash) -> event indexes of BlockStored
        self.removed_at: dict[tuple, list[int]] = defaultdict(list)  # (group, hash) -> event indexes of BlockRemoved
        self.first_store: list[tuple[int, int, tuple[int, ...]]] = []  # (event index, depth, prefix) of chains
        self.unplaced = 0  # BlockStored events whose blocks no parent or prompt places

    def _dense_prefixes(self, events) -> None:
        """First pass: the prefix of every hash a dense store places (one block per hash, parent known or a root);
        a group-agnostic hash then places the same block in a sparse sliding-window store."""
        for e in events:
            if e.type != "BlockStored" or not e.token_ids or not e.block_size:
                continue
            size = e.block_size
            if len(e.token_ids) != len(e.block_hashes) * size:
                continue
            if e.parent_block_hash is None:
                prefix: tuple[int, ...] | None = ()
            else:
                prefix = self.prefix_of.get(e.parent_block_hash)
            if prefix is None:
                continue
            for k, h in enumerate(e.block_hashes):
                prefix = prefix + tuple(e.token_ids[k * size : (k + 1) * size])
                self.prefix_of.setdefault(h, prefix)

    def _start(self, parent: Any, tokens: tuple[int, ...]) -> tuple[int, ...] | None:
        if parent is not None and parent in self.prefix_of:
            return self.prefix_of[parent]
        if parent is None and any(p.prompt_token_ids[: len(tokens)] == tokens for p in self.prompts):
            return ()  # a root block (a sliding-window group's first kept block may come without its parent)
        for p in self.prompts:
            ids = p.prompt_token_ids
            size = len(tokens)
            for at in range(size, len(ids) - size + 1, size):
                if ids[at : at + size] == tokens:
                    return ids[:at]
        return None

    def replay(self, events) -> None:
        self._dense_prefixes(events)
        for index, e in enumerate(events):
            g = e.group_idx or 0
            if e.type == "BlockStored" and e.token_ids and e.block_size:
                size = e.block_size
                prefix = self._start(e.parent_block_hash, tuple(e.token_ids[:size]))
                if prefix is None:
                    self.unplaced += 1
                    continue
                depth = len(prefix) // size
                # A sliding-window group caching only some blocks of a range (vLLM 0.32's reachable_block_mask)
                # sends the token ids of the whole range and the hashes of its last blocks only, without a parent.
                skipped = max(0, len(e.token_ids) // size - len(e.block_hashes))
                prefix = prefix + tuple(e.token_ids[: skipped * size])
                for k, h in enumerate(e.block_hashes):
                    at = (skipped + k) * size
                    prefix = self.prefix_of.get(h) or prefix + tuple(e.token_ids[at : at + size])
                    self.prefix_of.setdefault(h, prefix)
                    self.key_of[(g, prefix)] = h
                    self.stored_at[(g, h)].append(index)
                self.first_store.append((index, depth, prefix))  # the whole chain the event stored
            elif e.type == "BlockRemoved":
                for h in e.block_hashes:
                    self.removed_at[(g, h)].append(index)


def prefix_report_from_events(path: str | Path, events, prompts: tuple[PromptRecord, ...]) -> PrefixReport:
    """Outcomes from vLLM's KV events with the prompts (no utilization: the events carry no held blocks).
    ``events``: the file's events with their token ids, as ``kvtool.vllm.events.wire.read_event_lines(path,
    keep_tokens=True)`` reads them (the caller reads them: this package does not import kvtool.vllm)."""
    path = Path(path)
    groups = groups_of_events(events)
    if not groups:
        raise InputFileError(
            "no BlockStored event names a block size: no block boundary to classify by", where=str(path)
        )
    unit = cacheable_unit_tokens(groups)
    content = _Content(prompts)
    content.replay(events)
    name = _name(groups)
    notes = []
    if not any(e.token_ids for e in events if e.type == "BlockStored"):
        notes.append("the BlockStored events carry no token ids: the blocks cannot be matched to the prompts")
    outcomes = []
    position = -1  # the event index where the previous request stored its first block
    for p, (shared, who), reach in zip(prompts, shared_prefixes(prompts), reachable_prefixes(prompts, groups)):
        ids = p.prompt_token_ids
        at, depth = _first_own_store(content, ids, position, unit)
        hit = p.num_cached_tokens if p.num_cached_tokens is not None else (depth * unit if depth is not None else 0)
        if at is not None:
            position = at
        r = classify(p.request_id, len(ids), shared, hit, unit, shared_with=who, reachable_tokens=reach)
        if r.evicted_tokens or r.window_tokens:
            notes_here = [_kept_note(r, prompts, unit), _removed_note(content, groups, ids, r, position, name)]
            r = _with_evidence(r, "; ".join(n for n in notes_here if n) or None)
        outcomes.append(r)
    if any(p.num_cached_tokens is None for p in prompts):
        notes.append("hits without num_cached_tokens are the depth of the first block the request stored")
    notes.append("vLLM's KV events carry no held blocks: per-group utilization needs the recorder's rows")
    return _report(path, unit, groups, outcomes, notes)


def _first_own_store(content: _Content, ids: tuple[int, ...], after: int, unit: int):
    """The first BlockStored after event ``after`` whose chain is this prompt's: (event index, depth in blocks)."""
    for index, depth, prefix in content.first_store:
        if index > after and len(prefix) <= len(ids) and ids[: len(prefix)] == prefix:
            return index, depth
    return None, None


def _removed_note(content: _Content, groups, ids, r: RequestOutcome, position: int, name) -> str | None:
    """Per group: the blocks the request's cacheable prefix spans beyond its hit, and what vLLM did with them
    before the request came (event ``position``): removed (BlockRemoved), still cached, or never stored."""
    parts = []
    for g, group in enumerate(groups):
        size = group.block_size_tokens
        removed: list[int] = []
        cached: list[int] = []
        never: list[int] = []
        for k in range(r.hit_tokens // size, r.cacheable_tokens // size):
            h = content.key_of.get((g, ids[: (k + 1) * size]))
            stores = [] if h is None else [i for i in content.stored_at[(g, h)] if position < 0 or i < position]
            if not stores:
                never.append(k)
                continue
            gone = [i for i in content.removed_at[(g, h)] if i > stores[0] and (position < 0 or i < position)]
            (removed if gone else cached).append(k)
        words = [
            f"block{'s' if len(ks) > 1 else ''} {_span(ks)} {what}"
            for ks, what in ((removed, "removed (BlockRemoved)"), (cached, "still cached"), (never, "never stored"))
            if ks
        ]
        if words:
            parts.append(f"group {g} ({name(g)}): {', '.join(words)}")
    return "; ".join(parts) if parts else None


def _span(ks: list[int]) -> str:
    return f"{ks[0]}-{ks[-1]}" if len(ks) > 1 and ks[-1] - ks[0] == len(ks) - 1 else ", ".join(map(str, ks))


__all__ = ["EVICTED", "prefix_report_from_events", "prefix_report_from_rows", "read_prompts"]
