"""The compiled loops of `kvtool analyze` (kvtool/events/_kernels.c) against their numpy versions.

The numpy steps are the reference (they are checked against plain-Python walks of the definitions in
test_analyze_properties.py, which run on the compiled path); here both paths analyse the same traces and every
figure must agree: integers exactly, floats to 1e-9 (the two sum in different orders).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtool.core.errors import InputFileError
from kvtool.events.analysis import Analysis, analyze_events
from kvtool.events.kernels import NO_KERNELS_ENV, compiled
from kvtool.events.load import EventTable, load_events
from kvtool.events.segments import radix_argsort
from tests.events.test_analyze_properties import SETTINGS, _csv, _write, block_traces, traces

DATA = Path(__file__).resolve().parent.parent / "data"


def test_the_kernels_are_built_by_the_install():
    # pip install -e . compiles kvtool/events/_kernels.c where a C compiler is at hand (CI has one); a missing
    # extension there means the install silently fell back to numpy, which must fail here, not pass slower.
    if os.environ.get(NO_KERNELS_ENV, "") not in ("", "0"):
        pytest.skip(f"{NO_KERNELS_ENV} is set: the numpy versions run by request")
    assert compiled() is not None


def _path(fn, numpy: bool):
    """fn() with the compiled loops switched off (numpy) or on, whatever the environment says."""
    before = os.environ.pop(NO_KERNELS_ENV, None)
    if numpy:
        os.environ[NO_KERNELS_ENV] = "1"
    try:
        return fn()
    finally:
        os.environ.pop(NO_KERNELS_ENV, None)
        if before is not None:
            os.environ[NO_KERNELS_ENV] = before


def _numpy_path(fn):
    return _path(fn, numpy=True)


def _compiled_path(fn):
    assert _path(compiled, numpy=False) is not None, "the compiled loops are not built"
    return _path(fn, numpy=False)


def _same(a, b, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert a.shape == b.shape, where
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=where)
        else:
            assert np.array_equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            _same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (where, a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _both(table: EventTable, **options) -> tuple[Analysis, Analysis]:
    return _compiled_path(lambda: analyze_events(table, **options)), _numpy_path(
        lambda: analyze_events(table, **options)
    )


def _table(text: str, block_size: int = 16) -> EventTable:
    path = _write(text)
    try:
        return load_events(path, default_block_size=block_size)
    finally:
        os.unlink(path)


@SETTINGS
@given(traces(), st.sampled_from([4, 16]), st.booleans())
def test_the_per_request_pass_agrees_on_random_traces(rows, block_size, free_pool):
    # unsorted files, equal timestamps, over-frees and re-used requests (traces() in test_analyze_properties.py);
    # free_pool: a free_pool_blocks column on every other row, so the capacity reads the pool curve per row
    text = _csv(rows)
    if free_pool:
        lines = text.splitlines()
        text = "\n".join(
            [lines[0] + ",free_pool_blocks"] + [f"{line},{'' if i % 2 else 3 * i}" for i, line in enumerate(lines[1:])]
        )
    # a low long-request threshold: some requests are long, so the long-request curve is compared too
    fast, reference = _both(_table(text + "\n", block_size), long_threshold_tokens=40)
    _same(fast, reference, "analysis")


@SETTINGS
@given(block_traces(), st.booleans())
def test_the_physical_pass_agrees_on_random_block_listings(rows, shuffled):
    # partial frees listing ids (explicit releases), shared prefixes, recycled ids; shuffled: a file out of order
    if shuffled:
        rows = rows[len(rows) // 2 :] + rows[: len(rows) // 2]
    text = "ts,event,request_id,num_blocks,num_tokens,block_size,block_ids\n" + "".join(
        f"{ts},{ev},{req},{nb},{'' if ev == 'free' else 1},{8 if i % 3 else 16},{' '.join(map(str, ids))}\n"
        for i, (ts, ev, req, nb, ids) in enumerate(rows)
    )
    fast, reference = _both(_table(text))
    _same(fast, reference, "analysis")


@pytest.mark.parametrize(
    "path",
    # hand-made fixtures (tests/data/analyze) and a real vLLM 0.32 engine's recordings (tests/data/vllm-record)
    [*sorted((DATA / "analyze").glob("*.csv")), *sorted((DATA / "vllm-record").glob("*.parquet"))],
    ids=lambda p: p.name,
)
def test_both_paths_agree_on_the_event_files_of_the_tests(path):
    fast, reference = _both(load_events(path))
    _same(fast, reference, path.name)


@SETTINGS
@given(st.lists(st.integers(0, 40), max_size=300), st.booleans())
def test_the_counting_sort_is_a_stable_sort(keys, with_prior_order):
    # small keys take the compiled counting sort inside radix_argsort; Python's sort is stable: the reference
    arr = np.array(keys, dtype=np.int64)
    prior = np.arange(arr.size)[::-1].copy() if with_prior_order else None
    got = _compiled_path(lambda: radix_argsort(arr, prior))
    base = list(range(arr.size))[::-1] if with_prior_order else list(range(arr.size))
    assert got.tolist() == sorted(base, key=lambda i: keys[i])


def test_a_key_out_of_range_is_an_error_not_a_write_out_of_bounds():
    kernels = _compiled_path(compiled)
    out = np.empty(3, dtype=np.int64)
    with pytest.raises(ValueError, match="outside"):
        kernels.counting_argsort(np.array([0, 5, 1], dtype=np.int64), 3, None, out)
    with pytest.raises(TypeError, match="bytes"):
        kernels.counting_argsort(np.array([0, 1, 1], dtype=np.int32), 3, None, out)
    with pytest.raises(ValueError, match="perm"):
        kernels.counting_argsort(np.array([0, 1, 1], dtype=np.int64), 3, np.array([0, 7, 1], dtype=np.int64), out)
    ids = np.empty(4, dtype=np.int64)
    with pytest.raises(ValueError, match="offsets outside the data"):  # an offset past the data buffer
        kernels.parse_block_ids(np.array([0, 99], dtype=np.int32), b"1 2", None, 0, 1, 0, ids, ids.copy(), ids.copy())


# Each value's expected (ids, unparseable): tokens of 1 to 18 ASCII digits separated by spaces, extra spaces
# skipped (docs/events-schema.md); anything else rejects the row, hex and signs included.
BLOCK_ID_CASES = [
    ("1 2 3", ([1, 2, 3], False)),
    ("  7   8 ", ([7, 8], False)),
    ("", ([], False)),
    (None, ([], False)),
    ("007", ([7], False)),
    ("123456789012345678", ([123456789012345678], False)),
    ("1234567890123456789", ([], True)),  # 19 digits
    ("0x1F", ([], True)),
    ("-0", ([], True)),
    ("+5", ([], True)),
    ("4 x 5", ([], True)),
    ("4\t5", ([], True)),
    ("٣", ([], True)),  # an Arabic-Indic digit is not an ASCII one
]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("sliced", [False, True])
def test_block_ids_parse_the_same_on_both_paths(wide, sliced):
    import pyarrow as pa

    from kvtool.events.load import _block_ids

    values = [v for v, _ in BLOCK_ID_CASES]
    typ = pa.large_string() if wide else pa.string()
    if sliced:  # chunks that are slices of larger arrays (offset > 0), as Parquet and concatenation give
        col = pa.chunked_array([pa.array(["9"] + values[:6], typ)[1:], pa.array(["9 9"] + values[6:], typ)[1:]])
    else:
        col = pa.chunked_array([pa.array(values, typ)])
    expected_rows = [i for i, (_, (ids, _)) in enumerate(BLOCK_ID_CASES) for _ in ids]
    expected_ids = [x for _, (ids, _) in BLOCK_ID_CASES for x in ids]
    expected_bad = [i for i, (_, (_, bad)) in enumerate(BLOCK_ID_CASES) if bad]
    for rows, ids, bad in (_compiled_path(lambda: _block_ids(col)), _numpy_path(lambda: _block_ids(col))):
        assert rows.tolist() == expected_rows
        assert ids.tolist() == expected_ids
        assert sorted(bad.tolist()) == expected_bad


def test_a_long_request_handing_its_blocks_to_a_short_one_moves_only_the_long_curve():
    # At t=2 the long request L frees 2 blocks and the short one S allocates 2: the pool's total stays 2 while
    # long requests' blocks go 2 -> 0, so the curves must have a point at t=2 (by hand: total 2, 2, 0; long 2, 2, 0).
    text = "ts,event,request_id,num_blocks,num_tokens\n1,allocate,L,2,30\n2,free,L,2,\n2,allocate,S,2,10\n3,free,S,2,\n"
    fast, reference = _both(_table(text, 16), long_threshold_tokens=20)
    _same(fast, reference, "analysis")
    timeline = fast.timeline
    assert timeline.time_s.tolist() == [1.0, 2.0, 3.0]
    assert timeline.blocks_in_use.tolist() == [2, 2, 0]
    assert timeline.long_blocks_in_use.tolist() == [2, 0, 0]


@SETTINGS
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.text(alphabet="0123456789 +-x\t٣\x00", max_size=30),
            st.lists(st.integers(0, 10**19), max_size=5).map(lambda ids: " ".join(map(str, ids))),
        ),
        max_size=40,
    ),
    st.booleans(),
)
def test_block_id_text_parses_the_same_on_both_paths(values, wide):
    # random text next to well-formed lists (ids up to 10**19: 19 and 20 digits are refused), nulls included
    import pyarrow as pa

    from kvtool.events.load import _block_ids

    col = pa.chunked_array([pa.array(values, pa.large_string() if wide else pa.string())])
    fast = _compiled_path(lambda: _block_ids(col))
    reference = _numpy_path(lambda: _block_ids(col))
    for got, expected in zip(fast, reference):
        assert sorted(got.tolist()) == sorted(expected.tolist())
    assert fast[0].tolist() == reference[0].tolist() and fast[1].tolist() == reference[1].tolist()


@pytest.mark.parametrize("wide", [False, True])
def test_block_id_lists_parse_the_same_on_both_paths(wide):
    # Parquet's list<int64> block ids: a null or negative id rejects its row; a null list lists nothing
    import pyarrow as pa

    from kvtool.events.load import _block_ids

    values = [[1, 2], None, [], [3, None], [-4, 5], [6], [2**40]]
    typ = pa.large_list(pa.int64()) if wide else pa.list_(pa.int64())
    col = pa.chunked_array([pa.array(values[:3], typ), pa.array([[9]] + values[3:], typ)[1:]])  # a sliced chunk
    for rows, ids, bad in (_compiled_path(lambda: _block_ids(col)), _numpy_path(lambda: _block_ids(col))):
        assert rows.tolist() == [0, 0, 5, 6]
        assert ids.tolist() == [1, 2, 6, 2**40]
        assert sorted(bad.tolist()) == [3, 4]


_EVENT_CELLS = [
    b"allocate",
    b"append",
    b"reuse",
    b"free",  # as written: matched by the compiled loop
    b"FREE",
    b" append ",
    b"Append",
    b"\tREUSE",
    b"   ",  # another case, spaces: the full rules
    b"evict",
    b"allocat",
    b"allocatee",
    b"appendix",
    b"",
    b"free\xff",
    b"\xe9v\xe9nement",
    b"\xc3\xa9vict",
]


@SETTINGS
@given(
    st.lists(
        st.one_of(
            st.sampled_from(_EVENT_CELLS),
            st.text(alphabet='abcdeFRE \t\x01é"', max_size=9).map(lambda t: t.replace('"', "").encode()),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_event_names_read_the_same_on_both_paths(tmp_path_factory, cells):
    # the compiled loop matches the four names as written and leaves every other value (another case, spaces,
    # unknown types, invalid UTF-8) to the rules of the dictionary path: the rows read, their event codes and the
    # rejected rows with their reasons must be the same on both paths
    path = tmp_path_factory.mktemp("events") / "e.csv"
    lines = [b"ts,event,request_id,num_blocks,num_tokens"]
    lines += [b"%d,%s,r%d,1,1" % (i, cell, i % 3) for i, cell in enumerate(cells)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast = _compiled_path(lambda: _table_or_refusal(path))
    reference = _numpy_path(lambda: _table_or_refusal(path))
    if isinstance(reference, str):  # every row rejected: the file is refused, with the same count and reasons
        assert fast == reference
        return
    assert not isinstance(fast, str), fast
    assert fast.event.tolist() == reference.event.tolist()
    assert fast.ts.tolist() == reference.ts.tolist()
    assert fast.rejected == reference.rejected


def _table_or_refusal(path):
    """The loaded table, or the one-line refusal of a file none of whose rows is accepted."""
    try:
        return load_events(path)
    except InputFileError as err:
        return err.one_line()
