"""KV_Catch inside vLLM: per-request KV-block events recorded where vLLM's scheduler makes them happen.

:func:`install` wraps, on one ``Scheduler`` instance and its ``KVCacheManager`` (never on the classes), the calls
through which a request's KV blocks change hands (vLLM 0.32, ``vllm/v1/core``):

- ``KVCacheManager.allocate_slots`` -> ``reuse`` (the prefix-cache blocks attached at admission: only when the
  admission succeeds, unlike ``get_computed_blocks``, which is a lookup that also runs for admissions that fail)
  then ``allocate`` (the new blocks) for a request holding no block before the call; ``append`` for a running one;
- ``KVCacheManager.free`` / ``pop_blocks_for_free`` -> ``free``, with its reason: ``preempted`` (inside
  ``Scheduler._preempt_request``), ``finished`` or ``aborted`` (after ``Scheduler._free_request``, whose entry is
  when the scheduler learns the request is finished; the delay to the free is ``latency_ms``), ``other``;
- a sliding-window manager's ``remove_skipped_blocks`` -> ``free`` with reason ``window`` (blocks that left the
  attention window mid-request, caught as they reach ``BlockPool.free_blocks``);
- ``Scheduler.schedule`` -> a new engine step: the rows of the previous one go to the writer thread.

The null block (``is_null``) never appears in a row.  Hybrid models keep one block list per KV-cache group; a row
lists the ids of every group and, in ``group_blocks``, how many of them belong to each group.  Rows are tuples put
in a preallocated list; the writer thread (:mod:`kvtool.vllm.recorder.writer`) formats and writes them.  Any error in
the recorder turns it off, says so once, and leaves vLLM running as if it had never been there.

Only the standard library is imported: this module runs inside the vLLM engine-core process.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

ALLOCATE, APPEND, REUSE, FREE = "allocate", "append", "reuse", "free"
FINISHED, PREEMPTED, ABORTED, WINDOW, OTHER = "finished", "preempted", "aborted", "window", "other"
APPENDS = ("all", "blocks")  # record every append, or only appends that add blocks
BUFFER_ROWS = 4096  # rows per preallocated buffer; a full buffer is handed over before the step ends


@dataclasses.dataclass(frozen=True)
class RecorderOptions:
    path: str  # KVTOOL_RECORD: the .csv or .parquet file (one per data-parallel rank when there are several)
    sample: float = 1.0  # KVTOOL_RECORD_SAMPLE: share of requests recorded, chosen by a hash of the request id
    appends: str = "all"  # KVTOOL_RECORD_APPENDS: "all", or "blocks" (only appends that add blocks)


def sampled(request_id: str, rate: float) -> bool:
    """Whether a request is recorded: crc32 of its client id (no random suffix) below ``rate`` x 2^32.

    A hash, not a random draw: every data-parallel rank and every run makes the same choice for the same id.
    """
    return rate >= 1.0 or zlib.crc32(request_id.encode("utf-8")) < rate * 4294967296.0


def say(message: str) -> None:
    """One line on stderr, prefixed: the recorder's only way to speak inside vLLM."""
    sys.stderr.write(f"kvtool recorder: {message}\n")
    sys.stderr.flush()


class Recorder:
    """The rows of one engine (one scheduler): buffer, bookkeeping and the off switch."""

    def __init__(
        self,
        options: RecorderOptions,
        sink: Callable[[list, int], None],
        *,
        spare: Any = None,
        client_id: Callable[[str], str] = str,
        clock: Callable[[], float] = time.time,
        groups: int = 1,
        sink_error: Callable[[], BaseException | None] = lambda: None,
    ):
        self.on = True
        self.closed = False
        self.off_reason: str | None = None
        self.options = options
        self.blocks_only = options.appends == "blocks"
        self.sink = sink  # takes (rows, count): the writer thread's queue
        self.sink_error = sink_error  # the writer's first error, checked once per step
        self.spare = spare  # emptied buffers coming back from the writer (a queue), or None
        self.client_id = client_id
        self.clock = clock
        self.groups = groups
        self.step = 0
        self.cost_ns = 0  # time spent in the recorder's own code on the engine thread
        self.rows: list[Any] = [None] * BUFFER_ROWS  # the preallocated buffer
        self.count = 0
        self.row_total = 0
        self.preempting = False
        self.finishing: dict[str, tuple[float, str]] = {}  # request id -> (perf_counter when finished, reason)
        self.owner: dict[int, str] = {}  # block id -> the request that last allocated it
        self._sampled: dict[str, bool] = {}
        self.window_request: str | None = None  # set while a sliding-window manager releases blocks
        self.window_released: list[int] = []

    # ------------------------------------------------------------------------------------------ state

    def fail(self, err: BaseException, where: str) -> None:
        """Turn the recorder off for good and say so once; vLLM continues untouched."""
        if self.on:
            self.on = False
            self.off_reason = f"{where}: {type(err).__name__}: {err}"
            say(f"turned off after an error in {where} ({type(err).__name__}: {err}); vLLM continues unrecorded")

    def is_sampled(self, request_id: str) -> bool:
        keep = self._sampled.get(request_id)
        if keep is None:
            keep = self._sampled[request_id] = sampled(self.client_id(request_id), self.options.sample)
        return keep

    def add(self, row: tuple) -> None:
        if self.count == BUFFER_ROWS:
            self.hand_over()
        self.rows[self.count] = row
        self.count += 1

    def hand_over(self) -> None:
        """Give the buffer to the writer thread and continue in an empty one (reused when one came back)."""
        if not self.count:
            return
        self.sink(self.rows, self.count)
        self.row_total += self.count
        rows = None
        if self.spare is not None and not self.spare.empty():
            rows = self.spare.get_nowait()
        self.rows = rows if rows is not None else [None] * BUFFER_ROWS
        self.count = 0

    def new_step(self) -> None:
        """``schedule()`` starts an engine step; rows written since the last step's end go with this step."""
        self.step += 1

    def end_step(self) -> None:
        """``update_from_output()`` ended the step: hand its rows to the writer (the per-step flush)."""
        error = self.sink_error()
        if error is not None:
            self.fail(error, "the writer thread")
            return
        self.hand_over()

    # ------------------------------------------------------------------------------------------ events

    def appended(self, rid: str, new_groups: Any, num_new_tokens: int, pool: Any) -> None:
        """A running request's ``allocate_slots`` succeeded: the new blocks (often none) and the tokens."""
        if self.groups == 1:
            group = new_groups[0]
            ids = [b.block_id for b in group if not b.is_null] if group else []
            per_group = None
        else:
            per_group = [[b.block_id for b in group if not b.is_null] for group in new_groups]
            ids = [i for g in per_group for i in g]
        owner = self.owner
        for block_id in ids:
            owner[block_id] = rid
        if (ids or not self.blocks_only) and self.is_sampled(rid):
            groups = None if per_group is None else tuple(map(len, per_group))
            free = pool.get_num_free_blocks()
            self.add(
                (self.clock(), APPEND, rid, len(ids), num_new_tokens, ids, None, None, free, None, self.step, groups)
            )

    def admitted(self, call: AllocateCall, after: list, pool_blocks: int) -> None:
        """A request holding no block was admitted: its prefix-cache hit (reuse) and its new blocks (allocate)."""
        rid = call.request_id
        new = [[b.block_id for b in group if not b.is_null] for group in call.result.blocks]
        for ids in new:
            for block_id in ids:
                self.owner[block_id] = rid
        if not self.is_sampled(rid):
            return
        now = self.clock()
        hits, external = self._attached(call, after, new)
        if hits is not None:
            ids, groups = _flatten(hits, self.groups)
            source = self._source(hits)
            tokens = call.num_new_computed_tokens
            self.add((now, REUSE, rid, len(ids), tokens, ids, None, source, pool_blocks, None, self.step, groups))
        ids, groups = _flatten([e + n for e, n in zip(external, new)], self.groups)
        latency_ms = call.elapsed_ns / 1e6
        tokens = call.num_new_tokens + call.num_external_tokens
        self.add((now, ALLOCATE, rid, len(ids), tokens, ids, latency_ms, None, pool_blocks, None, self.step, groups))

    def _attached(self, call: AllocateCall, after: list[list], new: list[list]):
        """Per group, the prefix-cache hit ids and the blocks allocated for external (connector) tokens.

        After an admission a group's list is [hits (some may be the null block), external blocks, new blocks].
        """
        hits: list[list[int]] = []
        external: list[list[int]] = []
        offered = call.hit_blocks
        for g, blocks in enumerate(after):
            span = blocks[call.before[g] : len(blocks) - len(call.result.blocks[g])]
            n_hit = min(len(offered[g]), len(span)) if offered is not None else 0
            hits.append([b.block_id for b in span[:n_hit] if not b.is_null])
            external.append([b.block_id for b in span[n_hit:] if not b.is_null])
        if call.num_new_computed_tokens <= 0 or not any(hits):
            return None, external
        return hits, external

    def _source(self, hits: list[list[int]]) -> str | None:
        """The request that allocated the deepest hit block.

        A prefix hit is common to every group and ends at the same token in each, so the last hit block of the
        first group with one is the deepest.
        """
        for ids in hits:
            if ids:
                return self.owner.get(ids[-1])
        return None

    def finished(self, request: Any, aborted_status: Any) -> None:
        """``Scheduler._free_request`` entered: the request is finished; its free follows (now or later)."""
        reason = ABORTED if request.status == aborted_status else FINISHED
        self.finishing[request.request_id] = (time.perf_counter(), reason)

    def freed(self, request_id: str, blocks: list[list] | None, pool_blocks: int) -> None:
        """A free of the request's blocks (``blocks``: its lists before the free; None when not sampled)."""
        finish = self.finishing.pop(request_id, None)
        if finish is not None:
            self._sampled.pop(request_id, None)  # the request is gone: forget its sampling decision
        if blocks is None:
            return
        ids, groups = _flatten([[b.block_id for b in group if not b.is_null] for group in blocks], self.groups)
        if not ids:
            return
        if self.preempting:
            reason, latency = PREEMPTED, None
        elif finish is not None:
            reason, latency = finish[1], (time.perf_counter() - finish[0]) * 1e3
        else:
            reason, latency = OTHER, None
        row = (self.clock(), FREE, request_id, len(ids), 0, ids, latency, None, pool_blocks, reason, self.step, groups)
        self.add(row)

    def window_freed(self, request_id: str, group: int, ids: list[int], pool_blocks: int) -> None:
        per_group: list[list[int]] = [[] for _ in range(self.groups)]
        per_group[group] = ids
        flat, groups = _flatten(per_group, self.groups)
        self.add(
            (self.clock(), FREE, request_id, len(flat), 0, flat, None, None, pool_blocks, WINDOW, self.step, groups)
        )


@dataclasses.dataclass
class AllocateCall:
    """One ``allocate_slots`` call as the recorder sees it."""

    request_id: str
    num_new_tokens: int
    num_new_computed_tokens: int
    num_external_tokens: int
    hit_blocks: Any  # per group, the prefix-cache blocks offered (new_computed_blocks.blocks), or None
    before: list[int]  # per group, how many blocks the request held before the call
    result: Any = None  # KVCacheBlocks of the new blocks (None: no room, nothing happened)
    elapsed_ns: int = 0


def _flatten(per_group: list[list[int]], groups: int) -> tuple[list[int], tuple[int, ...] | None]:
    if groups == 1:
        return per_group[0], None
    flat = [i for ids in per_group for i in ids]
    return flat, tuple(len(ids) for ids in per_group)
