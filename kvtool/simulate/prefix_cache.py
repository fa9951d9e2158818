"""vLLM 0.32's block pool with automatic prefix caching, as the serving simulation needs it.

Modelled on ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py`` (vllm 0.32.0, full-attention models where the
hash block size equals the block size):

- Block 0 is the null block: taken out of the free queue at start-up, never handed to a request, so a pool of N
  blocks has N - 1 usable ones (``BlockPool.__init__``).
- Block hashes are chained over full blocks of token ids: block i's key is (key of block i - 1, its tokens)
  (``hash_block_tokens``).  Only full blocks get a key; a prefix hit covers whole blocks only, and at most
  ``num_tokens - 1`` tokens (the last token is always recomputed for its logits: ``get_computed_blocks``).
- The free queue holds unhashed blocks (reused first, LIFO) ahead of cached blocks (reused last, in LRU order):
  ``free_blocks`` prepends the first and appends the second, so every unhashed free block precedes every cached
  one and only their counts and the cached blocks' order matter.  A request frees its blocks in reverse, so its tail
  blocks are evicted before its head.  Taking a block from the queue evicts its hash (``get_new_blocks``); a hit on a
  cached free block takes it out of the queue (``touch``).
- Duplicate keys are kept (two requests that computed the same block each hold a copy); a lookup returns the oldest
  (``BlockHashToBlockMap.get_one_block``).

Keys are interned to small ints: ``BlockKeys`` maps (parent key, block content) to an int, so chains compare in O(1).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence

NULL_BLOCK = 0


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


class BlockPool:
    """Blocks, reference counts, the free queue and the hash -> block map (``vllm/v1/core/block_pool.py``)."""

    __slots__ = ("num_blocks", "ref", "key_of", "free_plain", "free_cached", "cached", "evictions")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.key_of: list[int] = [0] * num_blocks  # 0: no hash
        # Unhashed free blocks: a stack (vLLM prepends freed unhashed blocks and pops from the front).
        self.free_plain: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))
        self.free_cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU: oldest first
        self.cached: dict[int, dict[int, None]] = {}  # key -> blocks holding it, oldest first
        self.evictions = 0  # cached blocks taken back for new data

    def num_free(self) -> int:
        return len(self.free_plain) + len(self.free_cached)

    def lookup(self, key: int) -> int:
        """A block holding ``key``, or -1."""
        blocks = self.cached.get(key)
        return next(iter(blocks)) if blocks else -1

    def take(self, n: int, out: list[int]) -> None:
        """Append n new blocks to ``out`` (the caller checked ``num_free() >= n``)."""
        plain = self.free_plain
        ref = self.ref
        while n and plain:
            b = plain.pop()
            ref[b] = 1
            out.append(b)
            n -= 1
        if n:
            free_cached = self.free_cached
            key_of = self.key_of
            cached = self.cached
            for _ in range(n):
                b, _none = free_cached.popitem(last=False)
                k = key_of[b]
                holders = cached[k]
                del holders[b]
                if not holders:
                    del cached[k]
                key_of[b] = 0
                ref[b] = 1
                out.append(b)
            self.evictions += n

    def touch(self, blocks: Sequence[int]) -> None:
        """A prefix hit: one more reference each; cached free blocks leave the free queue."""
        ref = self.ref
        for b in blocks:
            if ref[b] == 0:
                del self.free_cached[b]
            ref[b] += 1

    def set_key(self, block: int, key: int) -> None:
        """A block became full: it is cached under ``key`` (``cache_full_blocks``)."""
        self.key_of[block] = key
        holders = self.cached.get(key)
        if holders is None:
            self.cached[key] = {block: None}
        else:
            holders[block] = None

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block, in reverse order (tail first, as vLLM's ``free``)."""
        ref = self.ref
        key_of = self.key_of
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if key_of[b]:
                    self.free_cached[b] = None
                else:
                    self.free_plain.append(b)
