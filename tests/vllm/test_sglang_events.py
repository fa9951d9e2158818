"""SGLang's KV events: decoded from frames SGLang's own code encoded, captured over ZMQ, analysed.

The frames in tests/data/sglang-events/ were made by SGLang 0.5.23's RadixCache (KV events on) driven through the
hand traces of tests/support/sglang_reference.py, each batch encoded as its ZmqEventPublisher does, with SGLang's
own typed decode of the payload beside it ("sglang_decoded"); *.positional.* re-encodes one trace with 0.5.10's
array_like classes (see tests/data/sglang-events/README.md).
"""

from __future__ import annotations

import json

import pytest

from kvtool.vllm.events.analysis import SGLANG_NOTES, analyze_vllm_events
from kvtool.vllm.events.capture import CaptureOptions
from kvtool.vllm.events.wire import SGLANG_FIELDS, batch_rows, decode_payload, read_event_file, row_to_json
from tests.support import DATA
from tests.vllm.test_vllm_capture import FakeVllmPublisher, free_port, start_capture

FRAMES = DATA / "sglang-events"
TRACES = ("page1-branches", "page4-alignment", "page1-lru-evict", "page2-evict-split")


def frames(name: str) -> list[dict]:
    return [json.loads(line) for line in (FRAMES / f"{name}.frames.jsonl").read_text().splitlines()]


def write_rows(name: str, path) -> None:
    rows = []
    for frame in frames(name):
        rows += batch_rows(frame["seq"], decode_payload(bytes.fromhex(frame["payload_hex"]), "sglang"), "sglang")
    path.write_text("".join(row_to_json(r) + "\n" for r in rows))


@pytest.mark.parametrize("name", [*TRACES, "page2-evict-split.positional"])
def test_decode_agrees_with_sglangs_own_decoder(name):
    for frame in frames(name):
        batch = decode_payload(bytes.fromhex(frame["payload_hex"]), "sglang")
        ts, events, rank = frame["sglang_decoded"]
        assert (batch.ts, batch.dp_rank) == (ts, rank)
        assert len(batch.events) == len(events)
        for ours, theirs in zip(batch.events, events):
            if isinstance(theirs, list):  # array_like (0.5.10): tag, then the declared fields in order
                theirs = {"type": theirs[0], **dict(zip(SGLANG_FIELDS[theirs[0]], theirs[1:]))}
            # msgspec's to_builtins leaves out fields at their default (None); every declared one is a row key
            assert {k: v for k, v in ours.items() if v is not None} == {
                k: v for k, v in theirs.items() if v is not None
            }
            assert set(ours) == {"type", *SGLANG_FIELDS[ours["type"]]}


def test_page2_trace_events_by_hand():
    """page_size 2 (tests/support/sglang_reference.py TRACES["page2-evict-split"]); radix_cache.py 0.5.23:
    insert [1..6] -> one new node, record_store emits one BlockStored per page, coalesced into one event with 3
    hashes (events.py enqueue); insert [1,2,3,4,7,8,9] -> page-aligned to [1..4,7,8] (RadixKey.page_aligned),
    splits the node (no event) and stores page (7,8) whose parent is page (3,4); evict 1 pops the LRU leaf (5,6)
    (last touched by the second insert) and removes its node: 1 hash; evict 4 pops (10,11) then (7,8): 2 hashes,
    coalesced; re-inserting [1..6] stores (5,6) again with its same hash; reset -> AllBlocksCleared."""
    rows = []
    for frame in frames("page2-evict-split"):
        rows += batch_rows(frame["seq"], decode_payload(bytes.fromhex(frame["payload_hex"]), "sglang"), "sglang")
    kinds = [(r["seq"], r["type"], len(r.get("block_hashes") or [])) for r in rows]
    assert kinds == [
        (0, "AllBlocksCleared", 0),
        (1, "BlockStored", 3),
        (2, "BlockStored", 1),
        (3, "BlockStored", 1),
        (4, "BlockRemoved", 1),
        (5, "BlockRemoved", 2),
        (6, "BlockStored", 1),
        (7, "AllBlocksCleared", 0),
    ]
    first, seven_eight, ten_eleven, removed_56, removed_2, again_56 = rows[1:7]
    assert first["token_ids"] == [1, 2, 3, 4, 5, 6] and first["block_size"] == 2 and first["parent_block_hash"] is None
    page12, page34, page56 = first["block_hashes"]
    assert seven_eight["token_ids"] == [7, 8] and seven_eight["parent_block_hash"] == page34
    assert ten_eleven["parent_block_hash"] is None
    assert removed_56["block_hashes"] == [page56]
    assert removed_2["block_hashes"] == [ten_eleven["block_hashes"][0], seven_eight["block_hashes"][0]]
    assert again_56["block_hashes"] == [page56] and again_56["parent_block_hash"] == page34
    assert all(r["engine"] == "sglang" and r["dp_rank"] == 0 for r in rows)
    assert first["medium"] == "GPU" and "cache_salt" in first and "group_idx" not in first


def test_capture_engine_sglang_over_zmq(tmp_path):
    """SGLang's frames sent by a publisher speaking its wire protocol (the same three frames as vLLM's) are
    written as the same rows the decoder gives, with "engine": "sglang"."""
    sent = frames("page2-evict-split")
    expected = tmp_path / "expected.jsonl"
    write_rows("page2-evict-split", expected)
    total = len(expected.read_text().splitlines())
    port = free_port()
    out = tmp_path / "captured.jsonl"
    options = CaptureOptions(
        endpoint=f"tcp://127.0.0.1:{port}", output=out, max_events=total, duration_s=30, engine="sglang"
    )
    thread, stop, box = start_capture(options)
    pub = FakeVllmPublisher(options.endpoint)
    try:
        pub.wait_subscribed()
        for frame in sent:
            pub.publish(frame["seq"], bytes.fromhex(frame["payload_hex"]))
        thread.join(30)
    finally:
        stop.set()
        pub.close()
    assert "error" not in box, box.get("error")
    assert box["result"].events_written == total
    assert out.read_text() == expected.read_text()
    assert {e.engine for e in read_event_file(out)} == {"sglang"}


def test_analyze_sglang_events(tmp_path):
    """Counts of the page2 trace by hand (see test_page2_trace_events_by_hand): 4 BlockStored events of 6 blocks,
    5 distinct pages, 1 stored again after its removal (recomputed), 2 BlockRemoved of 3 blocks, 2 clears; peak 5
    pages cached (before the first eviction); no hit evidence."""
    path = tmp_path / "sglang.jsonl"
    write_rows("page2-evict-split", path)
    analysis = analyze_vllm_events(path)
    assert analysis.engine == "sglang"
    assert analysis.block_size == 2
    counts = analysis.counts
    assert (counts.block_stored_events, counts.block_removed_events, counts.all_blocks_cleared_events) == (4, 2, 2)
    assert analysis.distinct_blocks == 5
    assert analysis.peak_cached_blocks == 5
    assert analysis.churn.recomputed_blocks == 1
    assert analysis.hits.hit_blocks == 0
    assert analysis.notes[: len(SGLANG_NOTES)] == SGLANG_NOTES
    assert analysis.chains.max_depth_blocks == 3  # (1,2) -> (3,4) -> (5,6) or (7,8)


def test_analyze_cli_names_sglang(tmp_path):
    from typer.testing import CliRunner

    from kvtool.cli import app

    path = tmp_path / "sglang.jsonl"
    write_rows("page1-lru-evict", path)
    result = CliRunner().invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engine"] == "sglang" and data["block_size"] == 1
    # page1-lru-evict: stores of [1,2,3,4] (4 pages), [5,6] (2), [7,8,9] (3); evictions of 2 + 3 + 4 tokens
    assert data["distinct_blocks"] == 9
    text = CliRunner().invoke(app, ["analyze", str(path)]).stdout
    assert "SGLang KV-cache events" in text


def test_mixed_engines_refused(tmp_path):
    from kvtool.core.errors import InputFileError

    path = tmp_path / "mixed.jsonl"
    write_rows("page1-branches", path)
    vllm_line = (DATA / "vllm-events" / "prefix-cache-1gib-block32.jsonl").read_text().splitlines()[0]
    path.write_text(path.read_text() + vllm_line + "\n")
    with pytest.raises(InputFileError, match="mixes sglang and vllm"):
        analyze_vllm_events(path)
