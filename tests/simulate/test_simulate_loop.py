"""`kvtool simulate` and `kvtool analyze` close a loop: the exported events, analysed, give the simulator's own
figures; and `--from-events` recovers request lengths from an events file."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kvtool.simulate.lengths import load_event_lengths, load_trace, sample_requests
from tests.support import DATA

CONV = DATA / "simulate" / "azure-2023-conv.csv"


def test_analyze_on_exported_events_reproduces_the_simulation(run_cli, tmp_path):
    events = tmp_path / "ev.csv"
    args = [
        "--trace",
        CONV,
        "--requests",
        "400",
        "--seed",
        "2",
        "--qps",
        "30",
        "--serve",
        "--kv-tokens",
        "12000",
        "--block-size",
        "16",
    ]
    sim = run_cli("simulate", *args, "--export-events", events, "--json")
    assert sim.exit_code == 0, sim.stderr
    sim = json.loads(sim.stdout)["results"][0]
    assert sim["preemptions"] > 0
    ana = run_cli("analyze", events, "--json")
    assert ana.exit_code == 0, ana.stderr
    ana = json.loads(ana.stdout)
    summary = ana["summary"]
    # pool figures (no prefix cache, so analyze's per-request block count is the physical one)
    assert summary["requests"] == 400 and summary["rejected_rows"] == 0 and summary["leaked_requests"] == 0
    assert summary["preemptions"] == sim["preemptions"]
    assert summary["peak_blocks_in_use"] == sim["peak_blocks"] <= sim["pool_blocks"]
    assert summary["mean_blocks_in_use"] == pytest.approx(sim["mean_blocks"], rel=1e-9)
    assert summary["utilization"] == pytest.approx(sim["utilization"], rel=1e-9)
    assert summary["duration_s"] == pytest.approx(sim["span_s"], rel=1e-12)
    # per request: preemptions as the simulation counted them
    assert sum(r["preemptions"] for r in ana["requests"]) == sim["preemptions"]


def test_from_events_recovers_the_simulated_lengths(run_cli, tmp_path):
    # The simulator holds prompt + max(output, 1) - 1 tokens at the end (vLLM never writes the last token's KV),
    # so the recovered final lengths are prompt + max(output, 1) - 1 (a prefill chunked within the token budget
    # starts with a shorter allocate, so only the final lengths are compared).
    events = tmp_path / "ev.csv"
    res = run_cli(
        "simulate",
        "--trace",
        CONV,
        "--requests",
        "300",
        "--seed",
        "5",
        "--qps",
        "40",
        "--serve",
        "--kv-tokens",
        "15000",
        "--block-size",
        "32",
        "--export-events",
        events,
        "--json",
    )
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["results"][0]["preemptions"] > 0
    got = load_event_lengths(events)
    reqs = sample_requests(load_trace(CONV), 300, seed=5)
    want = sorted((reqs.prompt_tokens + np.maximum(reqs.output_tokens, 1) - 1).tolist())
    assert sorted(got.lengths.tolist()) == want
    assert got.source == "events file ev.csv (300 requests)"


def test_from_events_on_hand_written_files(run_cli):
    # tests/data/analyze/basic.csv: A allocates 20 tokens at 0 and appends 10 + 5 (L 35, prompt 20); B allocates 16
    # at 1 (L 16).  With b = 16: A holds 3 blocks (13 slots empty), B 1 block (full): 13 / 64 empty.
    res = run_cli("simulate", "--from-events", DATA / "analyze" / "basic.csv", "--block-size", "16", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["requests"] == 2
    assert out["mean_length_tokens"] == (35 + 16) / 2
    assert out["results"][0]["internal_fragmentation"] == pytest.approx(13 / 64)
    # leak_preempt.csv: P holds 64 tokens, is freed, and comes back with 50 + 1: its length is the most it held,
    # 64; L allocates 17 and appends 3 and is never freed: 20.
    got = load_event_lengths(DATA / "analyze" / "leak_preempt.csv")
    assert sorted(got.lengths.tolist()) == [20, 64]
    assert sorted(got.prompt_tokens.tolist()) == [17, 64]


def test_from_events_errors(run_cli, tmp_path):
    res = run_cli("simulate", "--from-events", tmp_path / "none.csv")
    assert res.exit_code == 3 and res.stderr.startswith("Error: ")
    res = run_cli("simulate", "--from-events", DATA / "simulate" / "generic-head20.csv")
    assert res.exit_code == 3 and "columns found" in res.stderr
    res = run_cli("simulate", "--from-events", DATA / "analyze" / "basic.csv", "--trace", CONV)
    assert res.exit_code == 2 and "exactly one" in res.stderr


@pytest.mark.parametrize("name,magic", [("ev.csv.gz", b"\x1f\x8b"), ("ev.parquet", b"PAR1")])
def test_exported_events_take_the_format_their_name_says(run_cli, tmp_path, name, magic):
    # --export-events ev.csv.gz used to write plain CSV under a .gz name (analyze then failed to inflate it);
    # the gzip magic is 1f 8b (RFC 1952) and a Parquet file starts with 'PAR1' (the Parquet format spec).
    args = ["--trace", DATA / "simulate" / "generic-head20.csv", "--serve", "--block-size", "16"]
    assert run_cli("simulate", *args, "--export-events", tmp_path / "ev.csv").exit_code == 0
    assert run_cli("simulate", *args, "--export-events", tmp_path / name).exit_code == 0
    assert (tmp_path / name).read_bytes()[: len(magic)] == magic
    plain = json.loads(run_cli("analyze", tmp_path / "ev.csv", "--json").stdout)
    other = run_cli("analyze", tmp_path / name, "--json")
    assert other.exit_code == 0, other.stderr
    other = json.loads(other.stdout)
    assert other["summary"]["events"] == plain["summary"]["events"] > 0
    assert other["requests"] == plain["requests"]


def test_events_files_given_to_the_wrong_option_get_a_tip(run_cli):
    # an analyze events file given as --trace: the error says to use --from-events
    res = run_cli("simulate", "--trace", DATA / "analyze" / "basic.csv")
    assert res.exit_code == 3
    lines = res.stderr.splitlines()
    assert lines[0].startswith("Error: unrecognised trace format: columns found 'ts', 'event', 'request_id'")
    assert lines[1] == "Tip: this looks like an events file of `kvtool analyze`'s schema: give it with --from-events"
    # vLLM's KV events (no request ids) given as --from-events: one line saying why, not the JSON line as a header
    res = run_cli("simulate", "--from-events", DATA / "vllm-events" / "prefix-cache-1gib-block32.jsonl")
    assert res.exit_code == 3
    assert res.stderr.splitlines()[0].startswith("Error: vLLM's KV events carry no request ids")
    assert "block_hashes" not in res.stderr


def test_exported_events_carry_reuse_rows_for_prefix_hits(run_cli, tmp_path):
    # 200 requests sharing a 256-token system prompt, one at a time (max_num_seqs 1) so every later request hits
    # its 16 full blocks of 16: the export has a reuse row for each hit, and analyze reads the file cleanly.
    events = tmp_path / "ev.csv"
    args = ["--dist", "fixed", "--length", "600", "--requests", "200", "--serve", "--shared-prefix", "256"]
    res = run_cli("simulate", *args, "--max-num-seqs", "1", "--block-size", "16", "--export-events", events, "--json")
    assert res.exit_code == 0, res.stderr
    sim = json.loads(res.stdout)["results"][0]
    assert sim["cached_prompt_tokens"] == 199 * 256
    rows = list(csv.DictReader(events.open()))
    reuse = [r for r in rows if r["event"] == "reuse"]
    assert len(reuse) == 199 and {(r["num_blocks"], r["num_tokens"]) for r in reuse} == {("16", "256")}
    ana = run_cli("analyze", events, "--json")
    assert ana.exit_code == 0, ana.stderr
    summary = json.loads(ana.stdout)["summary"]
    assert summary["rejected_rows"] == 0 and summary["leaked_requests"] == 0 and summary["requests"] == 200
