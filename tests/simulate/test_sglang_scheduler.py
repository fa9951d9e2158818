"""The SGLang scheduler model on traces small enough to follow by hand (rules cited in scheduler.py's docstring)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.simulate.sglang.scheduler import SglangConfig, simulate_sglang

PROMPT = list(range(1, 11))  # 10 tokens, sent twice


def test_second_request_hits_the_first_ones_prompt_page1():
    """max_running_requests 1, pool 1000, page 1, two equal 10-token prompts, 2 outputs each:
    step 1 prefills A (first output sampled); step 2 decodes A (2 outputs: finished, its 12 tokens inserted);
    step 3 prefills B: the match key is the prompt minus its last token (Req._compute_max_prefix_len: input_len - 1),
    so 9 cached, 1 computed; step 4 decodes B, which finishes: its prompt is already cached, its 2 outputs are new
    (tree 12 + 2 = 14).  Peak: tree 12 + B's 3 own tokens = 15."""
    r = simulate_sglang([PROMPT, PROMPT], [2, 2], SglangConfig(pool_tokens=1000, page_size=1, max_running_requests=1))
    assert (r.steps, r.prefill_steps, r.finished_requests) == (4, 2, 2)
    assert (r.prompt_tokens, r.cached_prompt_tokens, r.computed_prompt_tokens) == (20, 9, 11)
    assert (r.final_tree_tokens, r.peak_used_tokens, r.evicted_tokens, r.retractions) == (14, 15, 0, 0)


def test_page4_matches_whole_pages_only():
    """The same at page 4: B's 9-token match key aligns down to 8 tokens (2 pages); A's 12 tokens are 3 whole
    pages; B's finish adds its third page [9, 10, o1, o2] (outputs differ from A's): tree 16."""
    r = simulate_sglang([PROMPT, PROMPT], [2, 2], SglangConfig(pool_tokens=1000, page_size=4, max_running_requests=1))
    assert (r.cached_prompt_tokens, r.computed_prompt_tokens, r.final_tree_tokens) == (8, 12, 16)


def test_one_prefill_batch_shares_nothing_within_it():
    """Admitted in one prefill batch, both requests match an empty tree (inserts come after the batch)."""
    r = simulate_sglang([PROMPT, PROMPT], [2, 2], SglangConfig(pool_tokens=1000))
    assert (r.prefill_steps, r.cached_prompt_tokens, r.steps) == (1, 0, 2)


def test_admission_stops_when_the_reservation_does_not_fit():
    """pool 30: A needs extend 10 + max_new 10 = 20 < 30 (check_prefill) and reserves 10 + page 1 + 10 = 21;
    B's 20 is not < 30 - 21 = 9, and while A decodes the budget stays below 20 (free 19 - k minus A's reservation
    (9 - k) * new_token_ratio), so B waits until A finishes (A prefill, 9 decodes, B prefill, 9 decodes).  Then A's
    20 tokens are in the tree: B's 10 prompt tokens fill the pool (peak 30) and its first output token evicts A's
    whole node (radix eviction frees whole leaves: 20 tokens)."""
    other = list(range(100, 110))
    r = simulate_sglang([PROMPT, other], [10, 10], SglangConfig(pool_tokens=30))
    assert (r.prefill_steps, r.steps, r.finished_requests) == (2, 20, 2)
    assert (r.evicted_tokens, r.peak_used_tokens, r.final_tree_tokens) == (20, 30, 20)


def test_chunked_prefill_cuts_a_long_prompt():
    """chunked_prefill_size 4 and a 10-token prompt: chunks of 4, 4, 2 over three prefill steps, each chunk
    inserted (checkpoint) so the request's own later chunks are not recomputed."""
    r = simulate_sglang([PROMPT], [1], SglangConfig(pool_tokens=1000, chunked_prefill_size=4))
    assert (r.prefill_steps, r.steps, r.computed_prompt_tokens) == (3, 3, 10)


def test_cli_engine_sglang_json(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_token_ids": PROMPT, "max_tokens": 2}) + "\n" for _ in range(2)))
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--engine",
            "sglang",
            "--kv-tokens",
            "1000",
            "--block-size",
            "1,4",
            "--max-num-seqs",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engine"] == "sglang"
    assert [(r["page_size"], r["cached_prompt_tokens"]) for r in data["results"]] == [(1, 9), (4, 8)]


def test_cli_engine_sglang_sizes_its_pool_as_estimate_does(tmp_path):
    """Without --kv-tokens the pool is SGLang's max_total_num_tokens for the model on the GPU (kvtool estimate
    --engine sglang; llama-2-7b on an H100 by default, as the serving simulation's default pair)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"prompt_token_ids": PROMPT, "max_tokens": 2}) + "\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--engine", "sglang", "--json"])
    assert result.exit_code == 0, result.output
    est = CliRunner().invoke(
        app, ["estimate", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--engine", "sglang", "--json"]
    )
    assert json.loads(result.stdout)["pool_tokens"] == json.loads(est.stdout)["max_total_num_tokens"]
