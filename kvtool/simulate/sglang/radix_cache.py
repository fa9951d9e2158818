"""SGLang's radix cache, ported: prefix matching at its page size, insert, lock references and LRU eviction.

Port of sglang 0.5.23 ``python/sglang/srt/mem_cache/radix_cache.py`` (``RadixCache``, ``TreeNode``, ``RadixKey``)
for plain token keys (no EAGLE bigrams, no extra_key / cache_salt namespaces, no priorities; LRU, SGLang's default
``--radix-eviction-policy``).  Sizes are counted in tokens, as SGLang's pool is.  Each step names the upstream
function it follows.  ``time.monotonic()`` becomes a counter that advances on every call, so equal traces give
equal LRU orders; the tests hold this port to what SGLang's own class answered on the same traces
(tests/data/sglang-radix/traces.json, recorded by tests/support/sglang_reference.py).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


class Node:
    """``TreeNode``: a run of tokens (its key), its children by first page, a lock count and an access time."""

    __slots__ = ("children", "parent", "key", "lock_ref", "last_access", "id")
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], parent: Node | None, now: int):
        self.children: dict[object, Node] = {}
        # None only for the root, which no walk to the root goes past
        self.parent: Node = parent  # type: ignore[assignment]
        self.key = key
        self.lock_ref = 0
        self.last_access = now  # TreeNode.__init__: last_access_time = time.monotonic()
        self.id = next(Node._ids)


class RadixCache:
    """The tree; ``evictable_size`` and ``protected_size`` are tokens in unlocked and locked nodes."""

    def __init__(self, page_size: int = 1):
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.page_size = page_size
        self._clock = itertools.count(1)
        self.reset()

    def _now(self) -> int:
        return next(self._clock)

    def reset(self) -> None:
        """``RadixCache.reset``: an empty root (locked), nothing evictable."""
        self.root = Node((), None, self._now())
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[Node] = set()

    # --- keys (RadixKey.page_aligned, child_key, match) ---------------------------------------------------------
    # A walk keeps the whole key and an offset into it (SGLang slices the key at each node; the answers are the same).
    def _aligned(self, tokens: Sequence[int]) -> tuple[int, ...]:
        p = self.page_size
        return tuple(tokens) if p == 1 else tuple(tokens[: len(tokens) // p * p])

    def _child_key(self, key: tuple[int, ...], start: int = 0) -> object:
        return key[start] if self.page_size == 1 else key[start : start + self.page_size]

    def _match_len(self, a: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
        """``RadixKey.match``: the common prefix of ``a`` and ``key[start:]``, rounded down to the page size.
        Found by comparing slices (equal prefixes are monotone in their length: a bisection finds the first
        difference), which is the token-by-token loop's answer at C speed."""
        n = min(len(a), len(key) - start)
        if a[:n] == key[start : start + n]:
            common = n
        else:
            lo, hi = 0, n  # a[:lo] matches, a[:hi] does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a[:mid] == key[start : start + mid]:
                    lo = mid
                else:
                    hi = mid
            common = lo
        return common // self.page_size * self.page_size

    # --- public API --------------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[int, Node]:
        """``RadixCache.match_prefix``: (cached prefix tokens, last node); splits a node the match ends inside."""
        key = self._aligned(tokens)
        if not key:
            return 0, self.root
        # _match_prefix_helper
        node = self.root
        access = self._now()
        node.last_access = access
        matched = 0
        while matched < len(key) and self._child_key(key, matched) in node.children:
            child = node.children[self._child_key(key, matched)]
            child.last_access = access
            prefix_len = self._match_len(child.key, key, matched)
            if prefix_len < len(child.key):
                node = self._split(child, prefix_len)
                matched += prefix_len
                break
            matched += prefix_len
            node = child
        return matched, node

    def insert(self, tokens: Sequence[int]) -> tuple[int, Node]:
        """``RadixCache.insert`` / ``_insert_helper``: (tokens already cached, last node); the new tail is one node."""
        key = self._aligned(tokens)
        node = self.root
        access = self._now()
        node.last_access = access
        if not key:
            return 0, node
        total = 0
        while total < len(key) and self._child_key(key, total) in node.children:
            node = node.children[self._child_key(key, total)]
            node.last_access = access
            prefix_len = self._match_len(node.key, key, total)
            total += prefix_len
            if prefix_len < len(node.key):
                node = self._split(node, prefix_len)
        if total < len(key):
            tail = key[total:]
            new = Node(tail, node, self._now())
            node.children[self._child_key(tail)] = new
            self.evictable_size += len(tail)
            self._update_leaf_status(node)
            self._update_leaf_status(new)
            node = new
        return total, node

    def evict(self, num_tokens: int) -> tuple[int, list[tuple[int, ...]]]:
        """``RadixCache.evict``: pop unlocked leaves, least recently used first, until ``num_tokens`` are freed
        (whole nodes: it may free more); a parent left childless and unlocked joins the heap.  Returns the tokens
        freed and the keys of the nodes removed (each one BlockRemoved in SGLang's events)."""
        heap = [(n.last_access, n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        evicted = 0
        removed: list[tuple[int, ...]] = []
        while evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            evicted += len(x.key)
            self._delete_leaf(x)
            removed.append(x.key)
            parent = x.parent
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return evicted, removed

    def inc_lock_ref(self, node: Node) -> int:
        """``inc_lock_ref``: lock the path to the root; returns the change of evictable tokens (<= 0)."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node: Node | None) -> int:
        """``dec_lock_ref``: the inverse; returns the change of evictable tokens (>= 0); None: nothing was locked."""
        if node is None:
            return 0
        delta = 0
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent
        return delta

    @property
    def size(self) -> int:
        """Tokens held by the tree, kept as SGLang keeps them: every node is either locked (protected) or not
        (evictable), so their sum is what :meth:`total_size` counts by walking the tree (the tests hold the two equal)."""
        return self.evictable_size + self.protected_size

    def total_size(self) -> int:
        """Tokens held by the tree (``total_size``), by walking it."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    # --- internals -----------------------------------------------------------------------------------------------
    def _split(self, child: Node, split_len: int) -> Node:
        """``_split_node``: a new node for ``child.key[:split_len]`` between child and its parent (same locks)."""
        new = Node(child.key[:split_len], child.parent, self._now())
        new.lock_ref = child.lock_ref
        parent = child.parent
        child.key = child.key[split_len:]
        new.children = {self._child_key(child.key): child}
        child.parent = new
        parent.children[self._child_key(new.key)] = new
        return new

    def _delete_leaf(self, node: Node) -> None:
        """``_delete_leaf``."""
        del node.parent.children[self._child_key(node.key)]
        self.evictable_size -= len(node.key)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node: Node) -> None:
        """``_update_leaf_status``: an unlocked node without children is an evictable leaf (the root never is)."""
        if node is self.root or node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)
