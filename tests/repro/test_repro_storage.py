"""Memory-sharing detection, checked against numpy.shares_memory (an independent exact solver)."""

from __future__ import annotations

import numpy as np
import torch  # a required dependency: a broken install fails here, it is not skipped
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.repro.storage import overlap_pairs, shares_memory, span


def test_interleaved_head_views_span_overlapping_ranges_but_share_nothing():
    buf = torch.zeros(6, 4, 8)  # [S, H, d]: head h's view buf[:, h] interleaves with the others
    h0, h1 = buf[:, 0], buf[:, 1]
    assert span(h0).byte_start < span(h1).byte_end and span(h1).byte_start < span(h0).byte_end
    assert not shares_memory(h0, h1)
    assert not np.shares_memory(h0.numpy(), h1.numpy())


def test_expanded_rows_share_and_repeated_rows_do_not():
    base = torch.zeros(1, 4, 8)
    expanded, repeated = base.expand(3, -1, -1), base.repeat(3, 1, 1)
    assert expanded[0].data_ptr() == expanded[2].data_ptr()
    assert shares_memory(expanded[0], expanded[2])
    assert not shares_memory(repeated[0], repeated[2])
    assert overlap_pairs([expanded[0], expanded[1], repeated[0]]) == [(0, 1)]


def test_same_storage_different_data_ptr_overlap():
    pool = torch.zeros(4, 40, 8)
    a, b = pool[:, 0:9], pool[:, 5:12]  # data_ptr differs by 5 rows, ranges overlap
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert a.data_ptr() != b.data_ptr()
    assert shares_memory(a, b)
    assert not shares_memory(pool[:, 0:5], pool[:, 5:12])


def test_separate_tensors_and_empty_views():
    assert not shares_memory(torch.zeros(3), torch.zeros(3))
    t = torch.zeros(5)
    assert not shares_memory(t[2:2], t)


_slices = st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(1, 3))


@settings(max_examples=150, deadline=None)
@given(a=st.tuples(_slices, _slices), b=st.tuples(_slices, _slices), transpose=st.booleans())
def test_matches_numpy_shares_memory(a, b, transpose):
    base = torch.arange(6 * 7, dtype=torch.float32).reshape(6, 7)

    def view(spec):
        (r0, r1, rs), (c0, c1, cs) = spec
        v = base[min(r0, r1) : max(r0, r1) : rs, min(c0, c1) : max(c0, c1) : cs]
        return v.t() if transpose else v

    ta, tb = view(a), view(b)
    assert shares_memory(ta, tb) == np.shares_memory(ta.numpy(), tb.numpy())
