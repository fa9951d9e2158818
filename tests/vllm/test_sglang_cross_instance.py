"""`kvtool analyze` on several SGLang KV-event files: the reuse missed across instances (kvtool.vllm.events.
cross_instance), on batches SGLang's own RadixCache encoded (tests/data/sglang-events, README there), one trace per
instance with its clock shifted, the counts worked by hand from the traces (tests/support/sglang_reference.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.core.errors import EXIT_USAGE
from kvtool.vllm.events.cross_instance import (
    HASHES_COMPARABLE,
    MATCH_CONTENT,
    SGLANG_NOTE_NO_HITS,
    analyze_cross_instance,
    read_instances,
)
from kvtool.vllm.events.wire import batch_rows, decode_payload, row_to_json
from tests.support import DATA

FRAMES = DATA / "sglang-events"


def _write(tmp_path, instance: str, trace: str, shift_s: float):
    """The trace's batches as `kvtool capture --engine sglang` writes them, its clock shifted by ``shift_s``."""
    rows = []
    for line in (FRAMES / f"{trace}.frames.jsonl").read_text().splitlines():
        frame = json.loads(line)
        rows += batch_rows(frame["seq"], decode_payload(bytes.fromhex(frame["payload_hex"]), "sglang"), "sglang")
    for row in rows:
        row["batch_ts"] += shift_s
    folder = tmp_path / f"instance={instance}"
    folder.mkdir()
    path = folder / "events.jsonl"
    path.write_text("".join(row_to_json(r) + "\n" for r in rows))
    return str(path)


def test_same_trace_later_on_another_instance(tmp_path):
    """a and b both run page1-branches (page 1), b 10 s later: inserts [1,2,3], [1,2,4,5], [1,2,4,5,6,7],
    [8,9,10,11,12] store 3 + 2 + 2 + 5 = 12 one-token pages on each; a never evicts, so every page b stores, a holds
    with its whole prefix: b 12 of 12 missed, a 0 of 12 (it went first).  Fleet 12 of 24 tokens, 50 %."""
    files = [_write(tmp_path, "a", "page1-branches", 0.0), _write(tmp_path, "b", "page1-branches", 10.0)]
    result = analyze_cross_instance(read_instances(files))
    a, b = result.instances
    assert (result.kind, result.engine, result.matched_by) == ("sglang-cross-instance-reuse", "sglang", MATCH_CONTENT)
    assert (a.computed_blocks, a.missed_blocks, b.computed_blocks, b.missed_blocks) == (12, 0, 12, 12)
    assert result.missed_share == pytest.approx(0.5)
    assert b.held_by[0].instance == "a" and b.held_by[0].blocks == 12
    # SGLang's hashes are unseeded SHA-256 chains: equal pages, equal hashes on both instances
    assert result.hashes.verdict == HASHES_COMPARABLE
    assert (result.hashes.shared_contents, result.hashes.same_hash_contents) == (12, 12)
    assert SGLANG_NOTE_NO_HITS in result.notes and not any("PYTHONHASHSEED" in n for n in result.notes)


def test_evictions_on_the_holder_end_the_missed_reuse(tmp_path):
    """a runs page1-lru-evict at t = 0..6 s: stores [1,2,3,4] (t 1), [5,6] under [1,2] (t 2), [7,8,9] (t 3); evicts
    [5,6] (t 4), [7,8,9] (t 5), [3,4,1,2] (t 6).  b runs page1-branches 3.5 s later: reset (t 3.5), [1,2,3] (t 4.5):
    a holds 1, 2, 3 in that order: 3 missed; [4,5] after [1,2] (t 5.5): a's 4 follows 3, and its [5,6] is gone: 0;
    [6,7] (t 6.5) and [8..12] (t 7.5): a is empty: 0.  b: 3 of 12 missed; a: 9 computed, none missed (b stored
    nothing before a's stores).  Fleet 3 of 21.  Pages b computed after a had (held or not): 1, 2, 3 = 3."""
    files = [_write(tmp_path, "a", "page1-lru-evict", 0.0), _write(tmp_path, "b", "page1-branches", 3.5)]
    result = analyze_cross_instance(read_instances(files))
    a, b = result.instances
    assert (a.computed_blocks, a.missed_blocks) == (9, 0)
    assert (b.computed_blocks, b.missed_blocks, b.missed_tokens) == (12, 3, 3)
    assert result.missed_share == pytest.approx(3 / 21)
    assert result.computed_elsewhere_before_blocks == 3
    assert [(p.prefix_tokens, p.missed_tokens) for p in result.top_prefixes] == [(3, 3)]


def test_page2_trace_counts_tokens_per_page(tmp_path):
    """page2-evict-split on both, b 20 s later (page 2): a stores [1..6] (3 pages), (7,8) under (3,4), (10,11), and
    after evicting (5,6), (10,11) and (7,8), (5,6) again (recomputed on a, b not started: not missed), then reset;
    so a holds nothing when b starts, and b misses nothing.  Each page is 2 tokens: a computed 6 pages, 12 tokens."""
    files = [_write(tmp_path, "a", "page2-evict-split", 0.0), _write(tmp_path, "b", "page2-evict-split", 20.0)]
    result = analyze_cross_instance(read_instances(files))
    a, b = result.instances
    assert (a.computed_blocks, a.computed_tokens, a.missed_blocks) == (6, 12, 0)
    assert (b.computed_blocks, b.missed_blocks) == (6, 0)
    assert result.computed_elsewhere_before_blocks == 6  # b computed every page a had computed before


def test_cli_json_and_a_mix_of_engines_refused(tmp_path):
    files = [_write(tmp_path, "a", "page1-branches", 0.0), _write(tmp_path, "b", "page1-branches", 10.0)]
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", *files, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["kind"], data["missed_tokens"], data["computed_tokens"]) == ("sglang-cross-instance-reuse", 12, 24)
    table = runner.invoke(app, ["analyze", *files])
    assert "Reuse missed across instances of SGLang" in table.stdout and "SGLang page hashes" in table.stdout
    vllm = str(DATA / "vllm-events" / "fleet-same-seed" / "instance=a" / "events.jsonl")
    mixed = runner.invoke(app, ["analyze", files[0], vllm])
    assert mixed.exit_code == EXIT_USAGE, mixed.output
    assert "vLLM's and SGLang's KV events" in mixed.output and "Traceback" not in mixed.output


def test_cache_salt_keeps_equal_tokens_apart(tmp_path):
    """Two instances store the same page 1 tokens [1, 2, 3], b under a cache_salt: SGLang namespaces salted pages
    (their hashes differ), so b's pages are not a's and nothing is missed."""
    base = {"dp_rank": 0, "engine": "sglang", "type": "BlockStored", "parent_block_hash": None, "token_ids": [1, 2, 3],
            "block_size": 1, "lora_id": None, "medium": "GPU", "session_id": None, "lora_name": None}  # fmt: skip
    paths = []
    for name, ts, salt, hashes in (("a", 1.0, None, [11, 12, 13]), ("b", 2.0, "tenant-b", [21, 22, 23])):
        folder = tmp_path / f"instance={name}"
        folder.mkdir()
        row = dict(base, seq=0, batch_ts=ts, cache_salt=salt, block_hashes=hashes)
        (folder / "events.jsonl").write_text(json.dumps(row) + "\n")
        paths.append(str(folder / "events.jsonl"))
    result = analyze_cross_instance(read_instances(paths))
    assert result.missed_blocks == 0
    same = dict(base, seq=0, batch_ts=3.0, cache_salt=None, block_hashes=[11, 12, 13])
    (tmp_path / "instance=b" / "events.jsonl").write_text(json.dumps(same) + "\n")
    assert analyze_cross_instance(read_instances(paths)).missed_blocks == 3
