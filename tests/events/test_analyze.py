"""`kvtool analyze` core: hand-computed figures on small traces (tests/data/analyze/).

Every expected number below is worked out by hand in the comments from the definitions in docs/analyze.md
(b = blocks held, n = tokens held = min(running tokens, b x block_size), intervals from one event of the request
to its next event, leaks to the end of the trace).  None is copied from the program's output.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from kvtool.core.errors import InputFileError
from kvtool.events.analysis import analyze_events
from kvtool.events.load import load_events
from tests.support import DATA

D = DATA / "analyze"


def run(path, **kw):
    return analyze_events(load_events(path, default_block_size=kw.pop("block_size", 16)), **kw)


def by_id(analysis, request_id):
    i = analysis.requests.request_ids.index(request_id)
    return {
        name: analysis.requests.column(name)[i]
        for name in (
            "holding_time_s",
            "block_seconds",
            "utilization",
            "peak_blocks",
            "peak_tokens",
            "wasted_slot_seconds",
            "preemptions",
            "leaked",
            "leaked_blocks",
            "over_frees",
            "free_latency_ms_max",
            "tokens",
            "prompt_tokens",
            "reused_tokens",
            "reused_blocks",
        )
    }


def test_basic_holding_time_utilization_and_pool():
    a = run(D / "basic.csv")
    # A: b = 2 on [0,1), 2 on [1,2), 3 on [2,4), 0 after the free at 4.
    #    n = min(running tokens, 16 b): 20 (cap 32), 30 (cap 32), 35 (cap 48).
    #    holding = 4 s; block-seconds = 2*1 + 2*1 + 3*2 = 10; slot-seconds = 16*10 = 160;
    #    token-seconds = 20*1 + 30*1 + 35*2 = 120; utilization = 120/160 = 0.75; wasted = 160 - 120 = 40.
    ra = by_id(a, "A")
    assert ra["holding_time_s"] == pytest.approx(4.0)
    assert ra["block_seconds"] == pytest.approx(10.0)
    assert ra["utilization"] == pytest.approx(0.75)
    assert ra["wasted_slot_seconds"] == pytest.approx(40.0)
    assert ra["peak_blocks"] == 3 and ra["peak_tokens"] == 35 and ra["tokens"] == 35
    assert ra["free_latency_ms_max"] == 800
    # B: 1 block, 16 tokens on [1,3): holding 2 s, block-seconds 2, utilization 32/32 = 1.
    rb = by_id(a, "B")
    assert rb["holding_time_s"] == pytest.approx(2.0)
    assert rb["block_seconds"] == pytest.approx(2.0)
    assert rb["utilization"] == pytest.approx(1.0)
    s = a.summary
    assert (s.requests, s.events, s.rejected_rows, s.leaked_requests) == (2, 6, 0, 0)
    # pool utilization is a ratio of integrals: (120 + 32) / (160 + 32) = 152/192 (not the mean 0.875)
    assert s.utilization == pytest.approx(152 / 192)
    # blocks in use: 2 at t0, 3 at t1 (A 2 + B 1), 4 at t2, 3 at t3, 0 at t4 -> peak 4 at 2 s;
    # mean = (10 + 2) block-seconds / 4 s = 3.0
    assert s.peak_blocks_in_use == 4 and a.pool.peak_at_s == 2.0
    assert s.mean_blocks_in_use == pytest.approx(3.0)
    # free latency sample [10, 800], linear interpolation: p50 = 10 + 0.5*790 = 405,
    # p95 = 10 + 0.95*790 = 760.5, p99 = 10 + 0.99*790 = 792.1, max 800
    assert s.free_latency_ms_p50 == pytest.approx(405.0)
    assert s.free_latency_ms_p95 == pytest.approx(760.5)
    assert s.free_latency_ms_p99 == pytest.approx(792.1)
    assert s.free_latency_ms_max == 800
    # late-free block-seconds: 3 blocks x 0.8 s + 1 block x 0.01 s = 2.41
    assert a.pool.late_free_block_seconds == pytest.approx(2.41)
    # allocated 2 + 1 + 1 = 4 blocks, freed 3 + 1 = 4
    assert (a.pool.blocks_allocated, a.pool.blocks_freed) == (4, 4)
    # culprits: only A wastes slots (40 slot-seconds); B is fully used
    assert [c.request_id for c in a.culprits] == ["A"]
    assert a.culprits[0].wasted_slot_seconds == pytest.approx(40.0)


def test_preemption_and_leak():
    a = run(D / "leak_preempt.csv")
    # trace end = 6 s (largest ts).
    # P: [0,2) b=4 n=64; freed to 0 at 2; allocate again at 3 (a preemption): the token sum restarts, n=50;
    #    [3,5) b=4 n=50; [5,6) b=5 n=51 (cap 80); freed at 6.
    #    holding = 2 + 2 + 1 = 5 s; block-seconds = 8 + 8 + 5 = 21; slots = 336;
    #    tokens = 64*2 + 50*2 + 51*1 = 279; utilization = 279/336.
    p = by_id(a, "P")
    assert p["holding_time_s"] == pytest.approx(5.0)
    assert p["block_seconds"] == pytest.approx(21.0)
    assert p["utilization"] == pytest.approx(279 / 336)
    assert p["preemptions"] == 1 and not p["leaked"]
    # L: never freed -> leaked with 2 blocks, measured to the end of the trace (6 s):
    #    [0,1) b=2 n=17, [1,6) b=2 n=20: holding 6 s, block-seconds 12, tokens 17 + 100 = 117, slots 192.
    lk = by_id(a, "L")
    assert lk["leaked"] and lk["leaked_blocks"] == 2
    assert lk["holding_time_s"] == pytest.approx(6.0)
    assert lk["block_seconds"] == pytest.approx(12.0)
    assert lk["utilization"] == pytest.approx(117 / 192)
    assert a.summary.leaked_requests == 1 and a.summary.leaked_blocks == 2
    assert a.summary.preemptions == 1
    assert a.anomalies.first_leaked_request_ids == ("L",)
    assert a.anomalies.count == 1  # a preemption is not an anomaly; the leak is


def test_equal_timestamps_apply_in_file_order_and_over_free_is_clamped():
    a = run(D / "overfree_equal_ts.csv")
    # X: [0,1) b=1 n=16; at t=1 the free (first in the file) brings b to 0, then the allocate raises it to 2
    #    with n=20 (a preemption); [1,3) b=2 n=20.  holding 3 s; block-seconds 1 + 4 = 5; tokens 16 + 40 = 56;
    #    slots 80 -> utilization 0.7.  (In the other order b would be 1 on [1,3) after a clamped free.)
    x = by_id(a, "X")
    assert x["holding_time_s"] == pytest.approx(3.0)
    assert x["block_seconds"] == pytest.approx(5.0)
    assert x["utilization"] == pytest.approx(0.7)
    assert x["preemptions"] == 1 and x["over_frees"] == 0
    # Y: [0,1) b=2 n=32; the free of 3 blocks at 1 is clamped at 0 (1 block over-freed); [2,3) b=1 n=10.
    #    An unclamped running sum would give b = 2, -1, 0, -1 and miss the second interval.
    #    holding 2 s; block-seconds 3; tokens 32 + 10 = 42; slots 48 -> 0.875.
    y = by_id(a, "Y")
    assert y["holding_time_s"] == pytest.approx(2.0)
    assert y["block_seconds"] == pytest.approx(3.0)
    assert y["utilization"] == pytest.approx(0.875)
    assert y["over_frees"] == 1 and y["preemptions"] == 1
    assert (a.anomalies.over_frees, a.anomalies.over_freed_blocks, a.anomalies.over_free_requests) == (1, 1, 1)
    # every request freed: allocated 1 + 2 + 2 + 1 = 6 = freed 1 + 2 + 2 (clamped from 3) + 1
    assert a.pool.blocks_allocated == a.pool.blocks_freed == 6
    assert a.summary.leaked_requests == 0


def test_reuse_physical_blocks_turnover_and_diagnosis():
    a = run(D / "reuse.csv")  # block_size 4 on every row
    # per-request counting: R1 3 blocks [0,2), R2 3 blocks [1,3), R3 2 blocks [4,5)
    # -> in use 3, 6, 3, 0, 2: peak 6 at 1 s; block-seconds 6 + 6 + 2 = 14 over 5 s -> mean 2.8
    assert a.summary.peak_blocks_in_use == 6 and a.pool.peak_at_s == 1.0
    assert a.summary.mean_blocks_in_use == pytest.approx(2.8)
    # physical ids: {1,2,3} from 0, id 4 from 1, id 3 freed at 2, ids 1,2,4 freed at 3, ids 3,4 again 4..5
    # -> unique in use 3, 4, 3, 0, 2, 0: peak 4; integral 3+4+3+0+2 = 12 over 5 s -> mean 2.4
    p = a.pool
    assert p.has_block_ids and p.unique_physical_blocks == 4
    assert p.peak_physical_blocks_in_use == 4
    assert p.mean_physical_blocks_in_use == pytest.approx(2.4)
    # turnover: id 3 back in the pool 2 -> 4 (2 s), id 4 3 -> 4 (1 s): 2 reallocations, p50 1.5, p95 1.95
    assert p.reallocations == 2
    assert p.turnover_time_s_p50 == pytest.approx(1.5)
    assert p.turnover_time_s_p95 == pytest.approx(1.95)
    # utilizations with block_size 4: R1 10/12; R2 (reuse 8 then allocate 3 at the same ts) 11/12; R3 6/8
    assert by_id(a, "R1")["utilization"] == pytest.approx(10 / 12)
    assert by_id(a, "R2")["utilization"] == pytest.approx(11 / 12)
    assert by_id(a, "R3")["utilization"] == pytest.approx(6 / 8)
    assert by_id(a, "R2")["reused_blocks"] == 2 and by_id(a, "R2")["reused_tokens"] == 8
    pr = a.prefix_reuse
    # prompts: R1 10, R2 8 + 3 = 11, R3 6 -> 27 tokens, 8 reused; hits 1 of 3
    assert (pr.requests_with_prompt, pr.requests_with_hit, pr.prompt_tokens, pr.reused_tokens) == (3, 1, 27, 8)
    assert pr.reused_token_share == pytest.approx(8 / 27)
    # 2 of 3 requests match at most one block (0 tokens) -> prompts differ early;
    # the one hit is 8 tokens = 2 blocks of 4, 100 % of hits -> block alignment
    assert pr.short_match_requests == 2
    assert pr.diagnosis == ("prompts_differ_early", "block_alignment")
    assert pr.most_common_hit_tokens == 8


def test_rejected_rows_are_counted_with_line_numbers():
    a = run(D / "bad_rows.csv")
    an = a.anomalies
    # lines (header = 1): 3 bad ts, 4 unknown event, 5 no request_id, 6 negative blocks, 7 fractional blocks,
    # 8 blank (skipped), 9 seven fields, 10 latency "abc", 12 append without num_tokens -> 8 rejected
    assert an.rejected_rows == 8
    assert an.blank_rows == 1
    assert [row for row, _ in an.first_rejected] == [3, 4, 5, 6, 7, 9, 10, 12]
    assert dict(an.first_rejected) == {
        3: "unparseable ts",
        4: "unknown event type",
        5: "missing request_id",
        6: "negative num_blocks",
        7: "unparseable num_blocks",
        9: "wrong number of columns",
        10: "unparseable latency_ms",
        12: "missing num_tokens",
    }
    # accepted: line 2 (allocate A) and line 11 (" Free " - case and spaces ignored): A holds 1 block 0..2 s
    assert a.summary.events == 2 and a.summary.requests == 1  # B appears only in a rejected row
    assert by_id(a, "A")["holding_time_s"] == pytest.approx(2.0)
    assert a.summary.free_latency_ms_max == 3.5


def test_block_size_option_and_blank_block_size(tmp_path):
    # one request, 1 block, 5 tokens for 1 s: utilization 5/16 with the default, 5/8 with --block-size 8
    f = tmp_path / "e.csv"
    f.write_text("ts,event,request_id,num_blocks,num_tokens,block_size\n0,allocate,a,1,5,\n1,free,a,1,,\n")
    assert run(f).requests.utilization[0] == pytest.approx(5 / 16)
    assert run(f, block_size=8).requests.utilization[0] == pytest.approx(5 / 8)


def test_gzip_and_parquet_give_the_same_answer(tmp_path):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    gz = tmp_path / "basic.csv.gz"
    gz.write_bytes(gzip.compress((D / "basic.csv").read_bytes()))
    hidden_gz = tmp_path / "basic-gzip.csv"  # gzip content under a .csv name is detected too
    hidden_gz.write_bytes(gz.read_bytes())
    pqf = tmp_path / "basic.parquet"
    pq.write_table(pacsv.read_csv(D / "basic.csv"), pqf)
    ref = run(D / "basic.csv")
    for path in (gz, hidden_gz, pqf):
        other = run(path)
        assert other.summary.utilization == pytest.approx(ref.summary.utilization)
        np.testing.assert_allclose(other.requests.block_seconds, ref.requests.block_seconds)


def test_parquet_string_columns_are_checked(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "ts": ["0", "1", "oops"],
            "event": ["allocate", "free", "append"],
            "request_id": [1, 1, 1],  # integer ids are read as text
            "num_blocks": [1, 1, 0],
            "num_tokens": [3, None, 1],
        }
    )
    pq.write_table(table, tmp_path / "e.parquet")
    a = run(tmp_path / "e.parquet")
    assert a.summary.events == 2 and a.requests.request_ids == ("1",)
    assert a.anomalies.first_rejected == ((3, "unparseable ts"),)  # Parquet rows are numbered from 1


def test_trace_with_every_row_rejected_is_refused_with_the_rejections(tmp_path):
    # it was analysed: 0 events, a report of dashes and exit 0 (issue 24); an analysis of no row is no answer
    f = tmp_path / "e.csv"
    f.write_text("ts,event,request_id,num_blocks,num_tokens\nx,allocate,a,1,1\n")
    with pytest.raises(InputFileError) as err:
        run(f)
    assert err.value.one_line() == f"no event row is accepted: 1 row rejected (1 unparseable ts; first: row 2) ({f})"


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "the events file is empty: it has no events"),
        (b"\n\n  \n", "the events file is empty: it has no events"),
        (
            b"ts,event,request_id,num_blocks,num_tokens\n",
            "the events file has a header but no event rows: it has no events",
        ),
        (b"PK\x03\x04\x00\x00binary\x00stuff", "not a CSV or Parquet events file (binary content)"),
        (
            b"ts,event,id\n1,allocate,a\n",
            "missing required column(s) request_id, num_blocks, num_tokens; columns found: ts, event, id",
        ),
    ],
)
def test_unusable_files_raise_input_file_error(tmp_path, content, message):
    f = tmp_path / "e.csv"
    f.write_bytes(content)
    with pytest.raises(InputFileError) as err:
        load_events(f)
    assert err.value.message == message
    assert err.value.where == str(f)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputFileError, match="events file not found"):
        load_events(tmp_path / "nope.csv")
    with pytest.raises(InputFileError, match="directory"):
        load_events(tmp_path)


def test_header_names_are_case_and_space_insensitive(tmp_path):
    f = tmp_path / "e.csv"
    f.write_text(" TS ,Event,request_id,NUM_BLOCKS,num_tokens,extra\n0,allocate,a,1,16,x\n2,free,a,1,,y\n")
    a = run(f)
    assert a.requests.utilization[0] == pytest.approx(1.0)
    assert a.requests.holding_time_s[0] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("e.parquet", b"PAR1 this is not parquet PAR1", "cannot read the events file"),
        (
            "e.csv.gz",
            gzip.compress(b"ts,event,request_id,num_blocks,num_tokens\n0,allocate,a,1,1\n")[:30],
            "not a valid gzip file",
        ),
    ],
)
def test_corrupt_parquet_and_gzip_are_input_errors(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(InputFileError, match=message):
        load_events(f)


@pytest.mark.parametrize("name", ["out.csv", "out.csv.gz", "out.parquet"])
def test_write_events_round_trip(tmp_path, name):
    from kvtool.events.load import write_events

    rows = write_events(
        tmp_path / name,
        {
            "ts": [0.0, 1.0, 2.0],
            "event": ["allocate", "append", "free"],
            "request_id": ["a", "a", "a"],
            "num_blocks": [2, 1, 3],
            "num_tokens": [20, 5, None],
            "block_ids": [[1, 2], "3", [1, 2, 3]],
            "latency_ms": [None, None, 800.0],
        },
    )
    assert rows == 3
    a = run(tmp_path / name)
    # b = 2 on [0,1), 3 on [1,2): 5 block-seconds; n = 20 then 25: (20 + 25) / (16 * 5) = 45/80
    assert a.summary.rejected_rows == 0 and a.summary.events == 3
    assert a.requests.block_seconds[0] == pytest.approx(5.0)
    assert a.requests.utilization[0] == pytest.approx(45 / 80)
    assert a.pool.unique_physical_blocks == 3 and a.summary.free_latency_ms_max == 800


def test_write_events_rejects_unknown_columns(tmp_path):
    from kvtool.core.errors import UsageError
    from kvtool.events.load import write_events

    with pytest.raises(UsageError, match="unknown colour; missing num_tokens"):
        write_events(
            tmp_path / "x.csv", {"ts": [0], "event": ["free"], "request_id": ["a"], "num_blocks": [1], "colour": [1]}
        )


def test_reuse_sources():
    # reuse.csv: R2 reuses 2 blocks from R1 (source_request_id) -> one source, R1 with 2 blocks
    a = run(D / "reuse.csv")
    assert a.prefix_reuse.distinct_sources == 1
    assert a.prefix_reuse.top_sources == (("R1", 2),)
    assert run(D / "basic.csv").prefix_reuse.distinct_sources is None  # no source_request_id column


def test_capacity_from_free_pool_blocks_and_long_share(tmp_path):
    f = tmp_path / "e.csv"
    f.write_text(
        "ts,event,request_id,num_blocks,num_tokens,free_pool_blocks\n"
        "0,allocate,L,7,100,3\n1,allocate,S,2,20,1\n2,free,L,7,,8\n3,free,S,2,,10\n"
    )
    a = run(f, long_threshold_tokens=50)
    # capacity = blocks in use + free pool blocks at each row: 7+3, 9+1, 2+8, 0+10 -> 10; minimum free pool 1
    assert a.pool.capacity_blocks == 10 and a.pool.free_pool_blocks_min == 1
    lr = a.long_requests
    # L (100 tokens > 50) holds 7 of 10 blocks on [0, 2): 0.7 > 0.6 for 2 s, from t = 0; S is short
    assert lr.basis == "capacity" and lr.long_requests == 1
    assert lr.peak_share == pytest.approx(0.7)
    assert lr.time_above_alert_s == pytest.approx(2.0)
    assert lr.first_alert_at_s == 0.0 and lr.alert


def test_an_end_of_trace_instant_is_not_a_peak(tmp_path):
    # L (60 tokens > --long-threshold 50) and S hold 4 blocks each on [0, 2); S frees at 2 s, the end of the trace.
    # The long share is 4/8 = 0.5 for 2 s; at the instant 2 s it is 4/4 = 1.0 but lasts no time: the peak is 0.5
    # at 0 s, and 0.5 never passes the 0.6 alert.  Blocks in use: 8 on [0, 2), then 4 at the end -> peak 8 at 0 s.
    f = tmp_path / "e.csv"
    f.write_text("ts,event,request_id,num_blocks,num_tokens\n0,allocate,L,4,60\n0,allocate,S,4,10\n2,free,S,4,\n")
    a = run(f, long_threshold_tokens=50)
    assert (a.long_requests.peak_share, a.long_requests.peak_share_at_s) == (0.5, 0.0)
    assert a.long_requests.alert is False and a.long_requests.time_above_alert_s == 0.0
    assert (a.pool.peak_blocks_in_use, a.pool.peak_at_s) == (8, 0.0)


def test_late_frees_are_named_with_their_cost():
    # basic.csv: A frees 3 blocks 800 ms late (3 x 0.8 = 2.4 block-seconds), B 1 block 10 ms late (0.01).
    # Threshold 100 ms: only A is late; its share of all frees' waiting is 2.4 / 2.41.
    late = run(D / "basic.csv").late_frees
    assert (late.threshold_ms, late.requests) == (100.0, 1)
    assert late.top[0].request_id == "A" and late.top[0].free_latency_ms == 800.0
    assert late.top[0].late_free_block_seconds == pytest.approx(2.4)
    assert late.share_of_late_free_block_seconds == pytest.approx(2.4 / 2.41)
    assert run(D / "basic.csv", late_free_ms=5).late_frees.requests == 2  # 10 ms is late against 5 ms


def test_a_request_seen_only_in_rejected_rows_is_not_a_request(tmp_path):
    # r9's one row is rejected (negative num_blocks): the accepted rows hold one request, r1, coded 0
    f = tmp_path / "e.csv"
    f.write_text("ts,event,request_id,num_blocks,num_tokens\n0,allocate,r1,1,4\n1,allocate,r9,-1,4\n2,free,r1,1,\n")
    table = load_events(f)
    assert table.request_ids == ("r1",) and table.request.tolist() == [0, 0]
    assert table.rejected.by_reason == {"negative num_blocks": 1}
    assert run(f).summary.requests == 1
