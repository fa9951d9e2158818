"""kvtool's port of SGLang's radix cache against SGLang's own RadixCache on the same hand traces.

tests/data/sglang-radix/traces.json was recorded by tests/support/sglang_reference.py running sglang 0.5.23's
``RadixCache.create_simulated`` (CPU, torch 2.13) op by op; every answer and size is compared here.
"""

from __future__ import annotations

import json

import pytest

from kvtool.simulate.sglang.radix_cache import RadixCache
from tests.support import DATA

RECORD = json.loads((DATA / "sglang-radix" / "traces.json").read_text())


@pytest.mark.parametrize("name", sorted(RECORD["traces"]))
def test_port_answers_as_sglang(name):
    trace = RECORD["traces"][name]
    cache = RadixCache(trace["page_size"])
    locks = {}
    for step in trace["steps"]:
        op, arg = step["op"], step["arg"]
        if op == "insert":
            assert cache.insert(arg)[0] == step["prefix_len"], step
        elif op == "match":
            assert cache.match_prefix(arg)[0] == step["prefix_len"], step
        elif op == "lock":
            node = cache.match_prefix(arg)[1]
            locks[tuple(arg)] = node
            assert cache.inc_lock_ref(node) == step["delta"], step
        elif op == "unlock":
            assert cache.dec_lock_ref(locks.pop(tuple(arg))) == step["delta"], step
        elif op == "evict":
            assert cache.evict(arg)[0] == step["evicted"], step
        elif op == "reset":
            cache.reset()
        sizes = (cache.evictable_size, cache.protected_size, cache.total_size())
        assert sizes == (step["evictable_size"], step["protected_size"], step["total_size"]), step


def test_lru_eviction_order_by_hand():
    """page 1: [1,2,3,4], [1,2,5,6], [7,8,9] inserted in turn, then [1,2,3,4] matched: leaves by last access are
    [5,6] < [7,8,9] < [3,4] (radix_cache.py evict: heap on last_access_time over evictable leaves)."""
    cache = RadixCache(1)
    for tokens in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9]):
        cache.insert(tokens)
    cache.match_prefix([1, 2, 3, 4])
    assert cache.evict(1) == (2, [(5, 6)])
    assert cache.evict(4) == (5, [(7, 8, 9), (3, 4)])
    assert cache.evict(1) == (2, [(1, 2)])  # the parent, left a childless unlocked leaf, follows
    assert cache.total_size() == 0


def test_page_alignment_by_hand():
    """page 4: only whole pages enter and match (RadixKey.page_aligned; match rounds down to page_size)."""
    cache = RadixCache(4)
    assert cache.insert(list(range(1, 11)))[0] == 0
    assert cache.total_size() == 8  # tokens 9, 10 are a partial page
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 0])[0] == 4
    assert cache.match_prefix([1, 2, 3])[0] == 0
