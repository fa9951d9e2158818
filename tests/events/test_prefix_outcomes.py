"""kvtool issue 28: each request's prefix-cache outcome, checked against hand counts of prompt and block boundaries.

The recorded runs (tests/data/vllm-record/prefix28/README.md) use blocks of 32 tokens; the sliding-window groups a
64-token window.  Hand counts (prompt n, shared prefix s with the earlier request, c = floor(min(s, n - 1) / 32) x 32,
vLLM's num_cached_tokens h, written by the driver from RequestOutput):

- hit-b: n = 148, s = 128 (S, 4 blocks), c = 128, h = 128 on all three models: hit;
- short: n = 100, s = 20 < 32: c = 0: shared but shorter than the cacheable unit;
- evict-b: n = 116, s = 96 (Q, 3 blocks), c = 96; h = 0 on Llama and Gemma 2 (8 fillers of 300 tokens = 80 block
  allocations through a 40- / 80-block pool evicted Q), h = 96 on the Mistral (its fillers' blocks are uncached and
  reused LIFO, vllm/v1/core/block_pool.py free_blocks, so Q's kept blocks survived);
- ws-b: n = 128, s = 127 (P; the last token differs), c = 96 (all but the last block).  Llama h = 96, Mistral h = 96,
  Gemma 2 h = 0: its sliding-window blocks 1-2 (the two a hit ending at 96 needs, cdiv(63, 32) = 2) were released as
  they left ws-a's window while ws-a ran, then evicted; its full-attention blocks 0-2 were still held by ws-a;
- sys-b: n = 261, s = 160 (T, 5 blocks), c = 160.  Llama h = 160; Mistral and Gemma 2 h = 0: sys-a (n = 261) left
  its sliding-window group only the blocks ending at floor(260 / 32) x 32 = 256, none ending at 160;
- hit-a, unshared, evict-a, ws-a, sys-a, fillers: first of their kind, s = 0; except wsfill-4, whose first token
  equals filler-6's (s = 1 < 32: too short).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.events.prefix_outcomes import (
    EVICTED,
    HIT,
    TOO_SHORT,
    UNSHARED,
    WINDOW,
    CacheGroup,
    cacheable_unit_tokens,
    classify,
    window_kept_boundary,
)
from kvtool.events.prefix_sources import prefix_report_from_events, prefix_report_from_rows, read_prompts
from kvtool.vllm.events.wire import read_event_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-record" / "prefix28"


def _events(model: str):
    """The recorded run's KV events with their token ids, as `kvtool analyze --prompts` reads them."""
    return read_event_lines(DATA / f"{model}.events.jsonl", keep_tokens=True).events


# request -> (prompt, shared, cacheable, hit, outcome) per model, from the hand counts above
COMMON = {
    "hit-a": (148, 0, 0, 0, UNSHARED),
    "hit-b": (148, 128, 128, 128, HIT),
    "unshared": (100, 0, 0, 0, UNSHARED),
    "short": (100, 20, 0, 0, TOO_SHORT),
    "evict-a": (116, 0, 0, 0, UNSHARED),
    "ws-a": (128, 0, 0, 0, UNSHARED),
    "sys-a": (261, 0, 0, 0, UNSHARED),
}
EXPECTED = {
    "llama": {
        **COMMON,
        "evict-b": (116, 96, 96, 0, EVICTED),
        "ws-b": (128, 127, 96, 96, HIT),
        "sys-b": (261, 160, 160, 160, HIT),
    },
    "mistral": {
        **COMMON,
        "evict-b": (116, 96, 96, 96, HIT),
        "ws-b": (128, 127, 96, 96, HIT),
        "sys-b": (261, 160, 160, 0, WINDOW),
    },
    "gemma2": {
        **COMMON,
        "evict-b": (116, 96, 96, 0, EVICTED),
        "ws-b": (128, 127, 96, 0, EVICTED),
        "sys-b": (261, 160, 160, 0, WINDOW),
    },
}


def _check(report, model):
    got = {r.request_id: r for r in report.requests}
    for rid, (n, s, c, h, outcome) in EXPECTED[model].items():
        r = got[rid]
        assert (r.prompt_tokens, r.shared_tokens, r.cacheable_tokens, r.hit_tokens, r.outcome) == (n, s, c, h, outcome)
    for rid, r in got.items():
        if "fill" in rid:
            assert r.outcome == (TOO_SHORT if rid == "wsfill-4" else UNSHARED), rid
    assert len(got) == 10 + 16  # ten named requests and 2 x 8 fillers


@pytest.mark.parametrize("model", ["llama", "mistral", "gemma2"])
def test_rows_classification_matches_the_hand_count(model):
    prompts = read_prompts(DATA / f"{model}.prompts.jsonl")
    report = prefix_report_from_rows(DATA / f"{model}.parquet", prompts)
    _check(report, model)
    # the hits the rows show are vLLM's own num_cached_tokens (RequestOutput, in the prompts file)
    assert {r.request_id: r.hit_tokens for r in report.requests} == {p.request_id: p.num_cached_tokens for p in prompts}


@pytest.mark.parametrize("model", ["llama", "mistral", "gemma2"])
def test_events_classification_matches_the_hand_count(model):
    prompts = read_prompts(DATA / f"{model}.prompts.jsonl")
    _check(prefix_report_from_events(DATA / f"{model}.events.jsonl", _events(model), prompts), model)


def test_events_without_num_cached_tokens_infer_the_hit_from_the_first_block_stored(tmp_path):
    # vLLM stores only the blocks it computes: hit-b's first stored block would be block 4 (128 / 32) - but it stores
    # none (20 prompt tokens + 8 generated < 32), so only requests that store a block are checked: evict-b (h = 0)
    rows = [json.loads(line) for line in (DATA / "llama.prompts.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("num_cached_tokens")
    bare = tmp_path / "p.jsonl"
    bare.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prefix_report_from_events(DATA / "llama.events.jsonl", _events("llama"), read_prompts(bare))
    got = {r.request_id: r for r in report.requests}
    assert got["evict-b"].outcome == EVICTED and got["sys-b"].hit_tokens == 160  # sys-b stores blocks 5-7 first


def test_the_hybrid_evidence_names_the_sliding_window_group():
    prompts = read_prompts(DATA / "gemma2.prompts.jsonl")
    report = prefix_report_from_events(DATA / "gemma2.events.jsonl", _events("gemma2"), prompts)
    ws_b = next(r for r in report.requests if r.request_id == "ws-b")
    assert "group 0 (sliding_window, window 64): blocks 1-2 removed" in ws_b.evidence
    assert "group 1 (full_attention): blocks 0-2 still cached" in ws_b.evidence


def test_utilization_per_group_and_the_gauge_from_the_rows():
    prompts = read_prompts(DATA / "gemma2.prompts.jsonl")
    report = prefix_report_from_rows(DATA / "gemma2.parquet", prompts)
    kinds = [u.group.kind for u in report.utilization]
    assert kinds == ["SlidingWindowSpec", "FullAttentionSpec"]  # the meta file's groups (vLLM's kv_cache_groups)
    sw, full = report.utilization
    assert sw.mean_blocks_held < full.mean_blocks_held  # the window releases blocks mid-request
    for u in report.utilization:
        assert 0 < u.effective_utilization <= 1
    assert 0 < report.vllm_usage_mean <= report.vllm_usage_peak <= 1


# ------------------------------------------------------------------------------------------ synthetic, one per outcome


@pytest.mark.parametrize(
    ("n", "s", "h", "reach", "outcome", "lost"),
    [
        # (hit, unshared, too short, window, evicted) tokens; each row adds up to n
        (148, 128, 128, None, HIT, (128, 20, 0, 0, 0)),  # 4 whole blocks shared and hit
        (100, 0, 0, None, UNSHARED, (0, 100, 0, 0, 0)),
        (100, 20, 0, None, TOO_SHORT, (0, 80, 20, 0, 0)),  # 20 < 32
        (64, 64, 0, None, EVICTED, (0, 0, 32, 0, 32)),  # identical prompt: min(64, 63) -> 1 block, 32 past it
        (116, 96, 0, None, EVICTED, (0, 20, 0, 0, 96)),
        (116, 96, 32, None, HIT, (32, 20, 0, 0, 64)),  # a partial hit: two blocks lost to eviction
        (261, 160, 0, 0, WINDOW, (0, 101, 0, 160, 0)),
    ],
)
def test_one_request_per_outcome(n, s, h, reach, outcome, lost):
    r = classify("r", n, s, h, 32, reachable_tokens=reach)
    assert r.outcome == outcome
    assert (r.hit_tokens, r.unshared_tokens, r.too_short_tokens, r.window_tokens, r.evicted_tokens) == lost
    assert sum(lost) == n


def test_the_cacheable_unit_and_the_kept_boundary():
    def g(i, b):
        return CacheGroup(i, "x", b, None)

    assert cacheable_unit_tokens([g(0, 32), g(1, 32)]) == 32
    assert cacheable_unit_tokens([g(0, 32), g(1, 48)]) == 96  # lcm
    assert window_kept_boundary(128, 32) == 96  # (128 - 1) // 32 x 32
    assert window_kept_boundary(261, 32) == 256


def test_cli_json_and_a_bad_prompts_file(tmp_path):
    runner = CliRunner()
    out = runner.invoke(
        app, ["analyze", str(DATA / "gemma2.parquet"), "--prompts", str(DATA / "gemma2.prompts.jsonl"), "--json"]
    )
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert {r["request_id"]: r["outcome"] for r in report["requests"]}["sys-b"] == WINDOW
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "prompt_token_ids": "x"}\n')
    out = runner.invoke(app, ["analyze", str(DATA / "gemma2.parquet"), "--prompts", str(bad)])
    assert out.exit_code == 3
    assert "field 'prompt_token_ids' must be a non-empty list of integers" in out.output
