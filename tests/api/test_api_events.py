"""kvtool.api.load_events and kvtool.api.analyze against `kvtool analyze --json` on the same files.

Expected figures are either the CLI's own ``--json`` on the same input (the API must be the same code path), or
hand computations cited in the comments (tests/data/analyze/README.md: the files are hand-written).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool.api import AnalyzeResult, FleetResult, analyze, load_events
from kvtool.core.errors import InputFileError, UsageError
from tests.support import DATA

D = DATA / "analyze"
FILES = ["basic.csv", "leak_preempt.csv", "overfree_equal_ts.csv", "reuse.csv", "bad_rows.csv"]


def _cli_json(run_cli, *args) -> dict:
    result = run_cli("analyze", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", FILES)
def test_analyze_path_equals_the_cli_json(run_cli, name):
    expected = _cli_json(run_cli, D / name, "--long-threshold", "20", "--top", "3")
    result = analyze(D / name, long_threshold=20, top=3)
    assert isinstance(result, AnalyzeResult)
    assert result.to_dict() == expected
    assert result.summary == expected["summary"]
    for section in ("pool", "prefix_reuse", "long_requests", "anomalies", "culprits"):
        assert getattr(result, section) == expected[section]


@pytest.mark.parametrize("name", FILES)
def test_a_loaded_dataframe_analyses_like_its_file(run_cli, name):
    """load_events -> analyze(DataFrame) is the same analysis as the file's, rejected rows included."""
    expected = _cli_json(run_cli, D / name, "--block-size", "4", "--pool-blocks", "10")
    frame = load_events(D / name, block_size=4)
    assert len(frame) == expected["summary"]["events"]
    assert frame.attrs["rejected_rows"][str(D / name)]["count"] == expected["anomalies"]["rejected_rows"]
    assert analyze(frame, pool_blocks=10).to_dict() == expected  # block size 4 comes with the frame


def test_requests_dataframe_is_the_json_requests(run_cli):
    expected = _cli_json(run_cli, D / "basic.csv")
    frame = analyze(D / "basic.csv").requests
    as_records = [
        {k: None if v != v else (v.item() if hasattr(v, "item") else v) for k, v in row.items()}  # NaN -> null
        for row in frame.to_dict(orient="records")
    ]
    assert as_records == expected["requests"]
    assert frame["leaked"].dtype == bool and frame["peak_blocks"].dtype == np.int64


def test_tables_agree_with_the_figures_they_explain():
    """Each DataFrame is the population behind a JSON figure: recompute the figure from it in pandas."""
    result = analyze(D / "reuse.csv", pool_blocks=8)
    tl = result.pool_timeline
    # time-weighted mean over the trace = block-seconds / duration (docs/analyze.md, Pool)
    mean = (tl.blocks_in_use * tl.duration_s).sum() / tl.duration_s.sum()
    assert mean == pytest.approx(result.summary["mean_blocks_in_use"])
    assert tl.blocks_in_use.max() == result.pool["peak_blocks_in_use"]
    matches = result.prefix_matches
    assert (matches.match_tokens > 0).mean() == pytest.approx(result.prefix_reuse["hit_share"])
    assert matches.match_tokens.sum() == result.prefix_reuse["reused_tokens"]
    assert matches.prompt_tokens.sum() == result.prefix_reuse["prompt_tokens"]
    physical = result.physical_timeline
    assert physical is not None and physical.physical_blocks_in_use.max() == result.pool["peak_physical_blocks_in_use"]


def test_free_latency_names_the_late_request():
    # basic.csv: A frees 3 blocks 800 ms late at t=4, B frees 1 block 10 ms late (README of tests/data/analyze)
    result = analyze(D / "basic.csv")
    late = result.free_latency.sort_values("latency_ms", ascending=False)
    assert late.request_id.tolist() == ["A", "B"]
    assert late.latency_ms.tolist() == [800.0, 10.0]
    assert late.late_block_seconds.iloc[0] == pytest.approx(3 * 0.8)  # 3 blocks x 0.8 s
    assert late.late_block_seconds.sum() == pytest.approx(result.pool["late_free_block_seconds"])
    assert np.percentile(late.latency_ms, 50) == result.summary["free_latency_ms_p50"]  # [10, 800]: 405


def test_hand_built_dataframe():
    # one request: 2 blocks for 1 s, 3 blocks for 1 s -> holding 2 s, 5 block-seconds; tokens 20 then 21 in
    # slots of 32 then 48: utilization (20 + 21) / (32 + 48) = 0.5125
    events = pd.DataFrame(
        {
            "ts": [0.0, 1.0, 2.0],
            "event": ["allocate", "append", "free"],
            "request_id": ["a", "a", "a"],
            "num_blocks": [2, 1, 3],
            "num_tokens": [20, 1, None],
            "extra": ["ignored", "like", "a file's"],
        }
    )
    result = analyze(events)
    row = result.requests.iloc[0]
    assert (row.holding_time_s, row.block_seconds, row.peak_blocks) == (2.0, 5.0, 3)
    assert row.utilization == pytest.approx(41 / 80)
    assert result.to_dict()["file"] == "<DataFrame>"


def test_dataframe_rows_are_checked_like_a_files():
    events = pd.DataFrame(
        {
            "ts": [0.0, float("nan"), 1.0],
            "event": ["allocate", "allocate", "evict"],
            "request_id": ["a", "b", "a"],
            "num_blocks": [1, 1, 1],
            "num_tokens": [1, 1, 1],
        }
    )
    anomalies = analyze(events).anomalies
    assert anomalies["rejected_rows"] == 2
    # 1-based row indices, as for Parquet (docs/events-schema.md)
    assert anomalies["first_rejected"] == [
        {"row": 2, "reason": "missing ts"},
        {"row": 3, "reason": "unknown event type"},
    ]


def test_errors_are_the_clis():
    with pytest.raises(InputFileError) as err:
        analyze(pd.DataFrame({"ts": [0.0], "event": ["free"]}))
    assert "missing required column(s) request_id, num_blocks, num_tokens" in err.value.one_line()
    with pytest.raises(InputFileError, match="events file not found"):
        load_events(D / "nope.csv")
    with pytest.raises(UsageError, match="--long-share-alert must be a fraction"):
        analyze(D / "basic.csv", long_share_alert=2)
    with pytest.raises(UsageError, match="workers and scheduler apply to several files"):
        analyze(D / "basic.csv", workers=2)  # type: ignore[call-overload]


def test_several_files_are_a_fleet_like_the_clis(run_cli):
    files = [D / "basic.csv", D / "leak_preempt.csv", D / "reuse.csv"]
    expected = _cli_json(run_cli, *files, "--top", "2")
    result = analyze(files, top=2)
    assert isinstance(result, FleetResult)
    assert result.to_dict() == expected
    assert result.summary == expected["fleet"]
    assert result.late_freed == expected["late_freed"]
    # one pool per file (named after it): the rows carry their pool; a pool's table is its file's alone
    alone = analyze(D / "reuse.csv").requests
    pool = result.requests[result.requests.instance == "reuse"].drop(columns="instance").reset_index(drop=True)
    assert pool.request_id.tolist() == alone.request_id.tolist()
    assert pool.holding_time_s.tolist() == alone.holding_time_s.tolist()
    assert sorted(result.health.instance) == sorted(result.requests.instance.unique())
    # each pool's prefix matches and timeline are its file's own
    alone_reuse = analyze(D / "reuse.csv")
    matches = result.prefix_matches[result.prefix_matches.instance == "reuse"].drop(columns="instance")
    assert matches.reset_index(drop=True).equals(alone_reuse.prefix_matches)
    timeline = result.pool_timeline[result.pool_timeline.instance == "reuse"].drop(columns="instance")
    assert timeline.reset_index(drop=True).equals(alone_reuse.pool_timeline)  # 6 steps: nothing thinned


def test_load_events_schema_and_several_files(tmp_path):
    frame = load_events([D / "basic.csv", D / "reuse.csv"])
    assert list(frame.columns[:5]) == ["ts", "event", "request_id", "num_blocks", "num_tokens"]
    assert isinstance(frame.request_id.dtype, pd.CategoricalDtype)
    assert frame.file.value_counts().to_dict() == {
        str(D / "basic.csv"): len(load_events(D / "basic.csv")),
        str(D / "reuse.csv"): len(load_events(D / "reuse.csv")),
    }
    # block_ids as lists of ints (reuse.csv line 2: "1 2 3"); blank where the file has none
    ids = frame.loc[frame.file == str(D / "reuse.csv"), "block_ids"].tolist()
    assert list(ids[0]) == [1, 2, 3]
    assert frame.loc[frame.file == str(D / "basic.csv"), "block_ids"].isna().all()


def test_parquet_round_trip_keeps_block_ids(tmp_path, run_cli):
    frame = load_events(D / "reuse.csv", block_size=4)
    path = tmp_path / "reuse.parquet"
    frame.to_parquet(path)
    expected = _cli_json(run_cli, D / "reuse.csv", "--block-size", "4")
    got = analyze(path, block_size=4).to_dict()
    assert {k: v for k, v in got.items() if k != "file"} == {k: v for k, v in expected.items() if k != "file"}


def test_nan_is_null_in_summary():
    # a free in the same instant as its allocate: the slot-seconds are 0, utilization undefined -> None
    events = pd.DataFrame(
        {"ts": [1.0, 1.0], "event": ["allocate", "free"], "request_id": ["a", "a"], "num_blocks": [1, 1]}
        | {"num_tokens": [1, None]}
    )
    result = analyze(events)
    assert result.summary["utilization"] is None
    assert math.isnan(result.requests.utilization.iloc[0])


_ROWS = st.lists(
    st.tuples(
        st.floats(0, 100, allow_nan=False).map(lambda t: round(t, 3)),
        st.sampled_from(["allocate", "append", "reuse", "free"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 5),
        st.integers(0, 80),
        st.one_of(st.none(), st.floats(0, 1000, allow_nan=False).map(lambda x: round(x, 1))),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS)
def test_a_dataframe_analyses_like_the_same_rows_in_a_file(tmp_path, rows):
    """Invariant: the DataFrame path and the file path are one analysis (same rows -> same --json but 'file')."""
    ts, event, rid, blocks, tokens, latency = (list(c) for c in zip(*rows))
    frame = pd.DataFrame(
        {"ts": ts, "event": event, "request_id": rid, "num_blocks": blocks, "num_tokens": tokens, "latency_ms": latency}
    )
    path = tmp_path / "events.csv"
    frame.to_csv(path, index=False)
    from_file = analyze(path, long_threshold=40).to_dict()
    from_frame = analyze(frame, long_threshold=40).to_dict()
    assert from_frame.pop("file") == "<DataFrame>"
    from_file.pop("file")
    assert from_frame == from_file


def test_load_events_takes_a_glob_like_the_cli():
    frame = load_events(str(D / "*.csv"))
    # every hand-written file of tests/data/analyze, each row with its file
    assert sorted(frame.file.cat.categories) == sorted(str(p) for p in D.glob("*.csv"))
    assert len(frame) == sum(len(load_events(p)) for p in D.glob("*.csv"))
    assert set(frame.attrs["rejected_rows"]) == {str(p) for p in D.glob("*.csv")}


def test_files_with_different_optional_columns_concatenate():
    # reuse.csv has block_ids, block_size and source_request_id; basic.csv has none of them but latency_ms
    frame = load_events([D / "reuse.csv", D / "basic.csv"])
    basic = frame.file == str(D / "basic.csv")
    assert frame.loc[basic, "source_request_id"].isna().all() and frame.loc[basic, "block_ids"].isna().all()
    assert frame.loc[~basic, "latency_ms"].isna().all() and frame.loc[basic, "latency_ms"].notna().any()
    assert isinstance(frame.source_request_id.dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("empty", [[], ()])
def test_no_events_given_is_refused_by_analyze_as_by_load_events(empty):
    # analyze([]) returned an empty FleetResult where load_events([]) and the CLI (EVENTS is required) refuse
    for function, where in ((load_events, "load_events"), (analyze, "analyze")):
        with pytest.raises(UsageError) as err:
            function(empty)
        assert (err.value.one_line(), err.value.tip) == (
            f"no events files given ({where})",
            "give a file, a directory or a glob",
        )


def test_a_frame_of_rows_none_accepted_is_refused_as_its_file_would_be():
    events = pd.DataFrame(
        {"ts": ["x"], "event": ["allocate"], "request_id": ["a"], "num_blocks": [1], "num_tokens": [1]}
    )
    with pytest.raises(InputFileError, match=r"no event row is accepted: 1 row rejected \(1 unparseable ts"):
        analyze(events)


def test_load_events_reads_urls_as_analyze_does():
    # Path("memory://fleet/a.csv") is "memory:/fleet/a.csv": load_events said "events file not found" for a URL
    # that analyze([...]) read
    import fsspec

    memory = fsspec.filesystem("memory")
    for name in ("a.csv", "b.csv"):
        memory.pipe(f"/api-urls/{name}", (D / "basic.csv").read_bytes())
    one = load_events("memory://api-urls/a.csv")
    assert len(one) == len(load_events(D / "basic.csv"))
    both = load_events(["memory://api-urls/"])
    # fsspec names the files it lists with a root slash: memory:///api-urls/a.csv
    assert sorted(both.file.cat.categories) == ["memory:///api-urls/a.csv", "memory:///api-urls/b.csv"]
    assert len(both) == 2 * len(one)
