"""Bad input is handled per row wherever the row structure survives (issue 14), and a fuzz test of that promise.

Every case names the row it breaks and checks that exactly that row is rejected, with its reason, while the other
rows are analysed; no message of pyarrow reaches the user, and no numpy warning leaks.  The expected counts are
read off the hand-written files below (one bad row each), not from the program's output.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool.core.errors import InputFileError
from kvtool.events.analysis import analyze_events
from kvtool.events.load import load_events

HEADER = b"ts,event,request_id,num_blocks,num_tokens,block_ids,latency_ms\n"
GOOD = [
    b"0.0,allocate,a,2,20,1 2,0.5\n",
    b"0.5,allocate,b,1,10,3,0.4\n",
    b"1.0,append,a,1,5,4,\n",
    b"2.0,free,a,3,,1 2 4,800\n",
    b"3.0,free,b,1,,3,10\n",
]


def _file(tmp_path, body: bytes, name: str = "e.csv"):
    path = tmp_path / name
    path.write_bytes(body)
    return path


def _with_row(bad: bytes, at: int = 2) -> bytes:
    rows = list(GOOD)
    rows.insert(at, bad)
    return HEADER + b"".join(rows)


@pytest.mark.parametrize(
    "bad_row, reason",
    [
        (b"0.7,allocate,c\xff\xfe,1,10,5,\n", "invalid UTF-8"),  # a request id with invalid bytes
        (b"0.7,alloc\xc3ate,c,1,10,5,\n", "invalid UTF-8"),  # a truncated multi-byte character
        (b"0.7\xff,allocate,c,1,10,5,\n", "invalid UTF-8"),  # a number with a bad byte: bytes first
        (b"0.7,allocate,c,1,10\n", "wrong number of columns"),  # a dropped field
        (b"0.7,allocate,c,1,10,5,,extra\n", "wrong number of columns"),
        (b"1e308,allocate,c,1,10,5,\n", "ts out of range"),
        (b"-1.7e308,allocate,c,1,10,5,\n", "ts out of range"),
        (b"0.7,allocate,c,1,10,5,1e300\n", "latency_ms out of range"),
        (b"0.7,allocate,c,99999999999,10,5,\n", "unparseable num_blocks"),  # above 2**31 - 1
        (b"0.7,allocate,c,1,-3,5,\n", "negative num_tokens"),
        (b"0.7,allocate,c,-1,10,5,\n", "negative num_blocks"),
        (b"0.7,allocate,c,1,10,5,-0.5\n", "negative latency_ms"),  # beside the blank latencies of other rows
        (b"0.7,allocate,c,1,10,-4,\n", "unparseable block_ids"),
        (b"1000000000000.5,allocate,c,1,10,5,\n", "ts out of range"),  # just above 1e12 s
    ],
)
def test_one_bad_row_is_rejected_and_the_rest_analysed(tmp_path, bad_row, reason):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy or pyarrow warning may leak (1e308 timestamps included)
        table = load_events(_file(tmp_path, _with_row(bad_row)))
        a = analyze_events(table)
    # the bad row is line 4: header (1), two good rows (2, 3), then it
    assert table.rejected.first == ((4, reason),)
    assert a.summary.events == len(GOOD) and a.summary.rejected_rows == 1
    # request a: 2 blocks on [0, 1), 3 on [1, 2) -> 5 block-seconds (hand computation, as in test_analyze.py)
    assert a.requests.block_seconds[a.requests.request_ids.index("a")] == pytest.approx(5.0)


def test_invalid_bytes_beyond_the_sniffed_head_reject_one_row(tmp_path):
    body = HEADER + b"".join(GOOD) + b"0.1,allocate,z,1,1,,\n" * 5000 + b"4,free,\xff\xfe,1,,,\n"
    table = load_events(_file(tmp_path, body))
    assert table.rejected.count == 1 and table.rejected.by_reason == {"invalid UTF-8": 1}
    assert table.events == len(GOOD) + 5000


def test_crlf_reads_like_lf(tmp_path):
    lf = load_events(_file(tmp_path, HEADER + b"".join(GOOD), "lf.csv"))
    crlf = load_events(_file(tmp_path, (HEADER + b"".join(GOOD)).replace(b"\n", b"\r\n"), "crlf.csv"))
    assert crlf.events == lf.events == len(GOOD) and crlf.rejected.count == 0
    assert np.array_equal(crlf.ts, lf.ts) and crlf.request_ids == lf.request_ids


def test_an_unclosed_quote_does_not_swallow_the_rows_after_it(tmp_path):
    # With quoting, pyarrow reads everything after the quote as one value (one "row" with the wrong field count,
    # four rows lost).  Read again line by line, the row has its 7 fields (request id '"c') and nothing is lost.
    table = load_events(_file(tmp_path, _with_row(b'0.7,allocate,"c,1,10,5,\n')))
    assert table.events == len(GOOD) + 1 and table.rejected.count == 0
    assert '"c' in table.request_ids


@pytest.mark.parametrize(
    "body, message",
    [
        (b"", "the events file is empty: it has no events"),
        (HEADER.rstrip(b"\n"), "the events file has a header but no event rows: it has no events"),
        (gzip.compress(b""), "the events file is empty (after decompression): it has no events"),
    ],
)
def test_empty_files_say_they_have_no_events(tmp_path, body, message):
    with pytest.raises(InputFileError) as err:
        load_events(_file(tmp_path, body))
    assert err.value.message == message


def test_a_header_without_newline_never_shows_pyarrows_message(tmp_path, run_cli):
    # pyarrow says "Could not skip initial 1 rows from CSV file, either file is too short or header is larger
    # than block size" for this file; the user sees kvtool's sentence
    result = run_cli("analyze", _file(tmp_path, b"ts,event,request_id,num_blocks,num_tokens"))
    assert result.exit_code == 3
    assert "no event rows" in result.stderr and "block size" not in result.stderr and "CSV file" not in result.stderr


def test_an_empty_capture_says_it_has_no_events(tmp_path, run_cli):
    for name, body in (("capture.jsonl", b""), ("capture.jsonl.gz", gzip.compress(b"\n"))):
        result = run_cli("analyze", _file(tmp_path, body, name))
        assert result.exit_code == 3, result.stderr
        assert result.stderr.startswith("Error: the events file is empty: it has no events"), result.stderr


def test_corrupt_parquet_message_is_kvtools(tmp_path):
    with pytest.raises(InputFileError) as err:
        load_events(_file(tmp_path, b"PAR1" + b"\x00" * 64, "e.parquet"))
    assert "thrift" not in err.value.message.lower() and "magic" not in err.value.message.lower()


def _parquet(tmp_path, **columns):
    """basic.csv's request A in Parquet, with some columns replaced (pyarrow arrays)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = {
        "ts": pa.array([0.0, 1.0, 4.0]),
        "event": pa.array(["allocate", "append", "free"]),
        "request_id": pa.array(["A", "A", "A"]),
        "num_blocks": pa.array([2, 0, 2]),
        "num_tokens": pa.array([20, 1, None]),
        **columns,
    }
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table(table), path)
    return path


def test_a_parquet_column_of_the_wrong_type_names_the_file(tmp_path, run_cli):
    # the error named the column but not the file, and gave no tip
    import datetime

    import pyarrow as pa

    stamps = [datetime.datetime(2026, 11, 30, 0, 0, s) for s in (0, 1, 4)]
    path = _parquet(tmp_path, ts=pa.array(stamps, type=pa.timestamp("us")))
    result = run_cli("analyze", path, "--json")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: column ts has type timestamp[us], expected numbers ({path})\n"
        "Tip: store ts as an integer or floating-point column (docs/events-schema.md)\n"
    )


def test_parquet_integers_out_of_range_reject_their_rows_not_the_file(tmp_path, run_cli):
    # int64 epoch nanoseconds (above 2**53) and a uint64 count above int64 failed pyarrow's casts: the whole file
    # was refused as "not a CSV or Parquet events file the reader can parse"
    import pyarrow as pa

    ns = pa.array([1_700_000_000_000_000_000, 1, 4], type=pa.int64())
    blocks = pa.array([2, 2**64 - 1, 2], type=pa.uint64())
    result = run_cli("analyze", _parquet(tmp_path, ts=ns, num_blocks=blocks), "--json")
    assert result.exit_code == 0, result.stderr
    anomalies = json.loads(result.stdout)["anomalies"]
    assert anomalies["rejected_by_reason"] == {"ts out of range": 1, "unparseable num_blocks": 1}
    assert [r["row"] for r in anomalies["first_rejected"]] == [1, 2]


@pytest.mark.parametrize("second", ["ts", " TS "])
def test_a_schema_column_named_twice_is_refused(tmp_path, run_cli, second):
    # the CSV reader renamed the second one ts_2 and read the first without a word
    rows = [row.rstrip(b"\n") + b",99\n" for row in GOOD]
    path = _file(tmp_path, HEADER.rstrip(b"\n") + b"," + second.encode() + b"\n" + b"".join(rows))
    result = run_cli("analyze", path, "--json")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: column ts appears 2 times in the header (columns 1, 8) ({path})\nTip: keep one column of that name\n"
    )


def test_a_parquet_schema_column_named_twice_is_refused_in_kvtools_words(tmp_path, run_cli):
    # pyarrow's read failed: "the content is not a CSV or Parquet events file the reader can parse"
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        [
            pa.array([0.0, 4.0]),
            pa.array(["allocate", "free"]),
            pa.array(["A", "A"]),
            pa.array([1, 1]),
            pa.array([5, None]),
        ]
        + [pa.array([2, 2])],
        names=["ts", "event", "request_id", "num_blocks", "num_tokens", "num_blocks"],
    )
    path = tmp_path / "e.parquet"
    pq.write_table(table, path)
    result = run_cli("analyze", path)
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == (
        f"Error: column num_blocks appears 2 times in the header (columns 4, 6) ({path})"
    )


def test_an_unknown_column_may_repeat(tmp_path, run_cli):
    rows = [row.rstrip(b"\n") + b",x,y\n" for row in GOOD]
    result = run_cli("analyze", _file(tmp_path, HEADER.rstrip(b"\n") + b",note,note\n" + b"".join(rows)), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["events"] == len(GOOD)


def test_a_gzip_file_cut_mid_stream_says_so(tmp_path, run_cli):
    # pyarrow's "Truncated compressed stream" became "the content is not a CSV or Parquet events file ..."
    rows = [f"{i * 0.01:.2f},allocate,r{i},1,{i % 16 + 1},{i},0.{i % 10}\n".encode() for i in range(20_000)]
    packed = gzip.compress(HEADER + b"".join(rows))
    path = _file(tmp_path, packed[: len(packed) // 2], "e.csv.gz")
    result = run_cli("analyze", path, "--json")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert (
        result.stderr == f"Error: cannot read the events file: not a valid gzip file (corrupt or truncated) ({path})\n"
    )


# ---------------------------------------------------------------------------------------------------- fuzz


def _base_rows(seed: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ev = ("allocate", "append", "reuse", "free")[i % 4]
        rid = f"r{rng.integers(0, 6)}"
        nb, nt = int(rng.integers(0, 4)), int(rng.integers(0, 40))
        ids = " ".join(str(x) for x in rng.integers(0, 50, size=nb))
        lat = f"{rng.exponential(5):.3f}" if ev == "free" else ""
        rows.append(f"{i * 0.01:.2f},{ev},{rid},{nb},{'' if ev == 'free' else nt},{ids},{lat}\n".encode())
    return rows


# bytes a flip may write: anything but the double quote (a quote that happens to close on a later line makes one
# value of several lines, which no CSV reader can tell from a real multi-line value; see docs/events-schema.md)
FLIP_BYTES = st.integers(0, 255).filter(lambda b: b != ord('"'))
ODD_VALUES = st.sampled_from(
    [b"", b"nan", b"inf", b"-0", b"1e308", b"-1e309", b"9" * 30, b"0x10", b" 3 ", b"\xff", b"\xe2\x82", b"NULL"]
)


@st.composite
def mutated_files(draw):
    rows = _base_rows(draw(st.integers(0, 2**16)), draw(st.integers(1, 40)))
    body = bytearray(b"".join(rows))
    kind = draw(st.sampled_from(["flip", "drop_column", "truncate", "odd_value", "crlf"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            body[draw(st.integers(0, len(body) - 1))] = draw(FLIP_BYTES)
    elif kind == "drop_column":  # one field dropped from some rows
        out = []
        for row in rows:
            fields = row.rstrip(b"\n").split(b",")
            if draw(st.booleans()):
                del fields[draw(st.integers(0, len(fields) - 1))]
            out.append(b",".join(fields) + b"\n")
        body = bytearray(b"".join(out))
    elif kind == "truncate":
        body = body[: draw(st.integers(0, len(body)))]
    elif kind == "odd_value":
        out = []
        for row in rows:
            fields = row.rstrip(b"\n").split(b",")
            fields[draw(st.integers(0, len(fields) - 1))] = draw(ODD_VALUES)
            out.append(b",".join(fields) + b"\n")
        body = bytearray(b"".join(out))
    else:
        body = bytearray(bytes(body).replace(b"\n", b"\r\n"))
    return HEADER + bytes(body)


def _data_lines(data: bytes) -> int:
    """Rows after the header, splitting lines as a CSV reader does (\\r\\n, \\n or a lone \\r)."""
    body = data[len(HEADER) :]
    if not body:
        return 0
    lines = re.split(rb"\r\n|\n|\r", body)
    return len(lines) - (1 if lines[-1] == b"" else 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=mutated_files())
def test_fuzz_every_data_row_is_an_event_or_a_rejected_row(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "e.csv"
    path.write_bytes(data)
    expected = _data_lines(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = load_events(path)
            analyze_events(table)
    except InputFileError as err:
        # only a file left without any event row, or without any accepted row, may be refused as a whole
        refused = ("no event rows", "no events", "no event row is accepted")
        assert expected == 0 or any(words in err.message for words in refused), err.message
        return
    accounted = table.events + table.rejected.count + table.rejected.blank_rows
    assert accounted == expected, (table.events, table.rejected, expected)


@pytest.mark.parametrize("separator, word", [(b";", "semicolons"), (b"\t", "tabs")])
def test_a_header_with_another_separator_says_so(tmp_path, run_cli, separator, word):
    # the tip only repeated the required columns, which the header already lists
    body = (HEADER + b"".join(GOOD)).replace(b",", separator)
    path = _file(tmp_path, body)
    result = run_cli("analyze", path, "--json")
    assert result.exit_code == 3
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Error: missing required column(s) ts, event")
    assert (
        lines[1] == f"Tip: the header is separated by {word}: an events file is comma-separated (docs/events-schema.md)"
    )


def test_nan_reads_as_blank_whatever_the_other_rows_hold(tmp_path):
    # "nan" in latency_ms was blank when the column parsed as numbers, but "unparseable" when another row's "x" sent
    # the column through the text check: the same row accepted or rejected depending on a different row
    alone = _with_row(b"2.5,free,c,0,,,nan\n")
    with_junk = _with_row(b"2.5,free,c,0,,,nan\n") + b"3.5,free,d,0,,,x\n"
    for body, rejected in ((alone, {}), (with_junk, {"unparseable latency_ms": 1})):
        table = load_events(_file(tmp_path, body))
        assert dict(table.rejected.by_reason) == rejected
        assert table.events == len(GOOD) + 1


@pytest.mark.parametrize(
    "cells, reason",
    [
        ("0,3", "non-positive block_size"),
        ("16,-1", "negative free_pool_blocks"),
        ("16,-0.5", "negative free_pool_blocks"),
    ],
)
def test_optional_counts_out_of_range_reject_their_row(tmp_path, cells, reason):
    # the third row's block_size / free_pool_blocks is out of range; blanks in the others are allowed
    body = "ts,event,request_id,num_blocks,num_tokens,block_size,free_pool_blocks\n"
    body += f"0,allocate,a,1,4,16,\n1,allocate,b,1,4,,7\n2,allocate,c,1,4,{cells}\n3,free,a,1,,16,8\n"
    table = load_events(_file(tmp_path, body.encode()))
    assert table.rejected.first == ((4, reason),) and table.events == 3


@pytest.mark.parametrize(
    "body, message, tip",
    [
        # every row invalid UTF-8 (a Latin-1 export): it exited 0 with 0 accepted rows and a report of dashes
        (
            b"ts,event,request_id,num_blocks,num_tokens\n0,allocate,caf\xe9,1,5\n1,free,caf\xe9,1,\n",
            "no event row is accepted: 2 rows rejected (2 invalid UTF-8; first: row 2, row 3)",
            "the file is not UTF-8 text: convert it (iconv -f latin1 -t utf-8 FILE) or write it as UTF-8; "
            "docs/events-schema.md#rejected-rows says what each reason means",
        ),
        # two reasons, the more frequent first
        (
            b"ts,event,request_id,num_blocks,num_tokens\nx,allocate,a,1,5\n0,evict,a,1,5\ny,free,a,1,\n",
            "no event row is accepted: 3 rows rejected (2 unparseable ts, 1 unknown event type; "
            "first: row 2, row 3, row 4)",
            "docs/events-schema.md#rejected-rows says what each reason means",
        ),
        # a header and blank lines: no event row at all (it exited 0 too)
        (
            b"ts,event,request_id,num_blocks,num_tokens\n\n,,,,\n",
            "the events file has a header but no event rows: it has no events",
            None,
        ),
    ],
)
def test_a_file_with_no_accepted_row_is_refused_with_its_rejections(tmp_path, run_cli, body, message, tip):
    path = _file(tmp_path, body)
    with pytest.raises(InputFileError) as err:
        load_events(path)
    assert (err.value.message, err.value.tip) == (message, tip)
    result = run_cli("analyze", path)
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == f"Error: {message} ({path})\n" + (f"Tip: {tip}\n" if tip else "")


def test_a_dataframe_with_no_accepted_row_is_refused_like_a_file():
    import pyarrow as pa

    from kvtool.events.load import events_from_arrow

    table = pa.table({"ts": ["x"], "event": ["allocate"], "request_id": ["a"], "num_blocks": [1], "num_tokens": [1]})
    with pytest.raises(InputFileError, match=r"no event row is accepted: 1 row rejected \(1 unpars"):
        events_from_arrow(table, where="frame")
