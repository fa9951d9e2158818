"""vLLM 0.32's block pool with automatic prefix caching, as the serving simulation needs it.

Modelled on ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py`` (vllm 0.32.0, full-attention models where the
hash block size equals the block size):

- Block 0 is the null block: taken out of the free queue at start-up, never handed to a request, so a pool of N
  blocks has N - 1 usable ones (``BlockPool.__init__``).
- Block hashes are chained over full blocks of token ids: block i's key is (key of block i - 1, its tokens)
  (``hash_block_tokens``).  Only full blocks get a key; a prefix hit covers whole blocks only, and at most
  ``num_tokens - 1`` tokens (the last token is always recomputed for its logits: ``get_computed_blocks``).
- The free queue holds unhashed blocks (reused first) ahead of cached blocks (reused last, in LRU order):
  ``free_blocks`` prepends the first and appends the second, so every unhashed free block precedes every cached
  one, and only their count and the cached blocks' order matter.  A request frees its blocks in reverse, so its tail
  blocks are evicted before its head.  Taking a block from the queue evicts its hash (``get_new_blocks``); a hit on a
  cached free block takes it out of the queue (``touch``).
- Duplicate keys are kept (two requests that computed the same block each hold a copy); a lookup returns the copy
  cached first (``BlockHashToBlockMap.get_one_block``).

Two kinds of blocks, for speed.  *Shareable* blocks (full prompt blocks whose content other prompts may have: token
ids, Mooncake hash ids, a system prompt) get an id, a reference count and an interned key.  *Private* blocks (a
request's own tokens: its private prompt tail and its outputs, which no other prompt can match) are only counted:
while freed and cached they sit in the LRU queue as one *run* per freeing (block indices of one request, evicted from
the highest index down, as the reverse-order free puts them), and only their own request, resumed after a
preemption, can hit them.  Both kinds behave exactly as vLLM's blocks do.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence


class BlockKeys:
    """Interned chained block keys: ``key(parent, content)`` is the same int for the same chain of contents."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}

    def key(self, parent: int, content: Hashable) -> int:
        ids = self._ids
        k = (parent, content)
        found = ids.get(k)
        if found is None:
            found = len(ids) + 1
            ids[k] = found
        return found

    def chain(self, contents: Sequence[Hashable]) -> list[int]:
        """Keys of consecutive full blocks whose contents are given (the first block's parent is the root, 0)."""
        parent = 0
        out = []
        for content in contents:
            parent = self.key(parent, content)
            out.append(parent)
        return out


class Run:
    """Cached free private blocks of one request from one freeing: index ranges [lo, hi), ascending."""

    __slots__ = ("request", "ranges")

    def __init__(self, request: int, lo: int, hi: int):
        self.request = request
        self.ranges = [[lo, hi]]

    def size(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def covering(self, i: int) -> int:
        """The end of the range holding index i, or -1."""
        for lo, hi in self.ranges:
            if lo <= i < hi:
                return hi
        return -1

    def remove(self, i: int, j: int) -> int:
        """Take indices [i, j) (inside one range) out; returns how many were taken."""
        out = []
        for lo, hi in self.ranges:
            if lo <= i < hi:
                if lo < i:
                    out.append([lo, i])
                if j < hi:
                    out.append([j, hi])
            else:
                out.append([lo, hi])
        self.ranges = out
        return j - i


class Unreachable:
    """Cached free private blocks that no lookup can hit any more (their request finished): only their number and
    their place in the LRU matter, so the ones freed one after another, with nothing between them, make one
    entry."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


class BlockPool:
    """The free queue, the cached blocks and the reference counts (``vllm/v1/core/block_pool.py``)."""

    __slots__ = ("free_plain", "lru", "lru_blocks", "ref", "key_of", "cached", "runs", "next_id", "evictions")

    def __init__(self, num_blocks: int):
        self.free_plain = num_blocks - 1  # unhashed free blocks (the null block is never free)
        # LRU of cached free blocks, oldest first: a shareable block id (int), a Run or an Unreachable.
        self.lru: collections.OrderedDict[object, None] = collections.OrderedDict()
        self.lru_blocks = 0
        self.ref: dict[int, int] = {}  # shareable block id -> references
        self.key_of: dict[int, int] = {}  # shareable block id -> key (cached blocks only)
        self.cached: dict[int, dict[int, None]] = {}  # key -> shareable blocks holding it, first cached first
        self.runs: dict[int, list[Run]] = {}  # request -> its runs in the LRU, oldest first
        self.next_id = 1
        self.evictions = 0  # cached blocks taken back for new data

    def num_free(self) -> int:
        return self.free_plain + self.lru_blocks

    # ------------------------------------------------------------------ taking free blocks
    def consume(self, n: int) -> None:
        """Take n blocks off the free queue: unhashed ones first, then the least recently used cached ones."""
        plain = self.free_plain
        if n <= plain:
            self.free_plain = plain - n
            return
        self.free_plain = 0
        n -= plain
        self.lru_blocks -= n
        self.evictions += n
        head = next(iter(self.lru))
        if head.__class__ is Unreachable and n < head.size:  # type: ignore[attr-defined]  # the common case
            head.size -= n  # type: ignore[attr-defined]
            return
        self._evict(n)

    def _evict(self, n: int) -> None:
        """Take n cached blocks off the LRU's head (counted as evictions by the caller)."""
        lru = self.lru
        while n:
            entry = next(iter(lru))
            if entry.__class__ is Unreachable:
                size = entry.size  # type: ignore[attr-defined]
                if n < size:
                    entry.size = size - n  # type: ignore[attr-defined]
                    return
                n -= size
                del lru[entry]
            elif entry.__class__ is Run:
                ranges = entry.ranges  # type: ignore[attr-defined]
                last = ranges[-1]
                size = last[1] - last[0]
                if n < size:  # the run's highest blocks go first
                    last[1] -= n
                    return
                n -= size
                ranges.pop()
                if not ranges:
                    del lru[entry]
                    self.runs[entry.request].remove(entry)  # type: ignore[attr-defined]
            else:
                del lru[entry]
                self._forget(entry)  # type: ignore[arg-type]  # a shareable block id
                n -= 1

    def _forget(self, block: int) -> None:
        key = self.key_of.pop(block, 0)
        if key:
            holders = self.cached[key]
            del holders[block]
            if not holders:
                del self.cached[key]
        self.ref.pop(block, None)

    def new_ids(self, n: int, out: list[int]) -> None:
        """n new shareable blocks (taken off the free queue) appended to ``out``."""
        self.consume(n)
        for _ in range(n):
            b = self.next_id
            self.next_id += 1
            self.ref[b] = 1
            out.append(b)

    # ------------------------------------------------------------------ hits
    def lookup(self, key: int) -> int:
        """The first cached shareable block holding ``key``, or -1."""
        holders = self.cached.get(key)
        return next(iter(holders)) if holders else -1

    def private_hits(self, request: int, start: int, limit: int) -> list[tuple[Run, int, int]]:
        """The request's cached private blocks from index ``start`` on, consecutive, below ``limit``: (run, i, j)."""
        runs = self.runs.get(request)
        out: list[tuple[Run, int, int]] = []
        i = start
        while runs and i < limit:
            for run in runs:  # the oldest copy first, as vLLM's lookup
                hi = run.covering(i)
                if hi >= 0:
                    j = min(hi, limit)
                    out.append((run, i, j))
                    i = j
                    break
            else:
                break
        return out

    def touch(self, blocks: Sequence[int], private: Sequence[tuple[Run, int, int]] = ()) -> None:
        """A prefix hit: one more reference each; cached free blocks leave the free queue."""
        ref = self.ref
        for b in blocks:
            if ref[b] == 0:
                del self.lru[b]
                self.lru_blocks -= 1
            ref[b] += 1
        for run, i, j in private:
            self.lru_blocks -= run.remove(i, j)
            if not run.ranges:
                del self.lru[run]
                self.runs[run.request].remove(run)

    def set_key(self, block: int, key: int) -> None:
        """A shareable block became full: it is cached under ``key`` (``cache_full_blocks``)."""
        self.key_of[block] = key
        holders = self.cached.get(key)
        if holders is None:
            self.cached[key] = {block: None}
        else:
            holders[block] = None

    # ------------------------------------------------------------------ freeing
    def free(
        self, request: int, blocks: Sequence[int], private_lo: int, private_hi: int, unhashed: int, finished: bool
    ) -> int:
        """A request's blocks back, tail first: ``unhashed`` trailing blocks (private or not) to the plain pool; cached
        private blocks [private_lo, private_hi) as one run (unreachable when the request ``finished``: no lookup of
        its own will come); then its shareable blocks, last first.  Returns the blocks no longer referenced by
        anyone."""
        self.free_plain += unhashed
        freed = unhashed
        if private_hi > private_lo:
            size = private_hi - private_lo
            lru = self.lru
            if not finished:
                run = Run(request, private_lo, private_hi)
                lru[run] = None
                self.runs.setdefault(request, []).append(run)
            else:
                last = next(reversed(lru), None) if lru else None
                if last.__class__ is Unreachable:
                    last.size += size  # type: ignore[union-attr]
                else:
                    lru[Unreachable(size)] = None
            self.lru_blocks += size
            freed += size
        ref = self.ref
        for b in reversed(blocks):
            r = ref[b] - 1
            if r == 0:
                freed += 1
                if b in self.key_of:
                    ref[b] = 0
                    self.lru[b] = None
                    self.lru_blocks += 1
                else:
                    del ref[b]
                    self.free_plain += 1
            else:
                ref[b] = r
        return freed
