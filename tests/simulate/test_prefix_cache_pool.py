"""The block pool's free queue (kvtool/simulate/prefix_cache.py) against a block-by-block model of vLLM 0.32's
``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``): freed unhashed blocks go to the front, cached ones to
the back in the order they are freed (a request's blocks tail first), new blocks come off the front.  The pool
keeps counts and runs instead of blocks; a finished request's cached private blocks, which no lookup can hit any
more, are merged with the ones freed right before them.  The model names every block."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.simulate.prefix_cache import BlockPool

FREE = st.tuples(
    st.just("free"),
    st.integers(0, 3),  # a request that may come back (preempted) or, when finished, never does
    st.integers(0, 6),  # first cached private block index
    st.integers(0, 6),  # cached private blocks
    st.integers(0, 3),  # unhashed blocks
    st.booleans(),  # finished
)
CONSUME = st.tuples(st.just("consume"), st.integers(1, 12))


class QueueModel:
    def __init__(self, usable: int):
        self.plain = usable
        self.cached: list[tuple[int, int]] = []  # (request, block index), oldest first
        self.evictions = 0

    def free(self, request: int, lo: int, hi: int, unhashed: int) -> None:
        self.plain += unhashed
        self.cached.extend((request, i) for i in reversed(range(lo, hi)))  # tail first

    def consume(self, n: int) -> None:
        plain = min(n, self.plain)
        self.plain -= plain
        taken = n - plain
        del self.cached[:taken]
        self.evictions += taken


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(FREE, CONSUME), max_size=40))
def test_the_free_queue_takes_blocks_in_vllms_order(ops):
    pool, model = BlockPool(8), QueueModel(7)
    finished_ids = iter(range(100, 1000))  # a finished request never frees again: a fresh id each time
    for op in ops:
        if op[0] == "consume":
            n = min(op[1], model.plain + len(model.cached))
            pool.consume(n)
            model.consume(n)
        else:
            _, request, lo, size, unhashed, finished = op
            if finished:
                request = next(finished_ids)
            pool.free(request, [], lo, lo + size, unhashed, finished)
            model.free(request, lo, lo + size, unhashed)
        assert (pool.free_plain, pool.lru_blocks, pool.evictions) == (model.plain, len(model.cached), model.evictions)
        for request, runs in pool.runs.items():  # what a returning request can still hit, block by block
            held = sorted(i for run in runs for lo, hi in run.ranges for i in range(lo, hi))
            assert held == sorted(i for q, i in model.cached if q == request)
