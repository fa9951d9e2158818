"""`kvtool simulate` on the command line: trace formats, options, JSON, plots and errors with exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtool.simulate.lengths import load_trace
from tests.support import DATA

SIM = DATA / "simulate"
# The first 20 rows of the Azure code trace (tests/data/simulate/README.md), in every accepted layout.
HEAD20_PROMPT = [4808, 3180, 110, 7433, 34, 374, 6985, 34, 1145, 201]


@pytest.mark.parametrize(
    "name,fmt,has_arrival",
    [
        ("azure-2023-code-head20.csv", "azure", True),
        ("vidur-head20.csv", "vidur", True),
        ("generic-head20.csv", "generic", True),
        ("generic-no-arrival-head20.csv", "generic", False),
        ("llmservingsim-head20.jsonl", "llmservingsim", True),
    ],
)
def test_each_trace_format_is_recognised(name, fmt, has_arrival):
    reqs = load_trace(SIM / name)
    assert reqs.source.startswith(f"{fmt} trace")
    assert reqs.count == 20
    assert reqs.prompt_tokens[:10].tolist() == HEAD20_PROMPT
    assert reqs.output_tokens[:2].tolist() == [10, 8]
    if has_arrival:
        # 18:17:03.97996 -> 18:17:04.03196 is 52 ms
        assert reqs.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    else:
        assert reqs.arrival_s is None


def test_length_only_trace_keeps_the_total_length():
    reqs = load_trace(SIM / "length-head20.csv")
    assert reqs.source.startswith("length trace")
    assert reqs.lengths[:2].tolist() == [4818, 3188]
    assert (reqs.output_tokens >= 1).all()


def test_sampling_with_replacement_is_seeded(run_cli):
    a = run_cli("simulate", "--trace", SIM / "azure-2023-code-head20.csv", "--requests", "500", "--seed", "3", "--json")
    b = run_cli("simulate", "--trace", SIM / "azure-2023-code-head20.csv", "--requests", "500", "--seed", "3", "--json")
    c = run_cli("simulate", "--trace", SIM / "azure-2023-code-head20.csv", "--requests", "500", "--seed", "4", "--json")
    assert a.exit_code == 0 and a.stdout == b.stdout
    assert json.loads(a.stdout)["requests"] == 500
    assert a.stdout != c.stdout


def test_table_output_and_recommendations(run_cli):
    res = run_cli(
        "simulate",
        "--dist",
        "lognormal",
        "--mean",
        "800",
        "--p99",
        "4000",
        "--requests",
        "2000",
        "--kv-tokens",
        "50000",
        "--shared-prefix",
        "100",
        "--serve",
        "--qps",
        "20",
    )
    assert res.exit_code == 0, res.stderr
    for text in (
        "Static comparison",
        "Contiguous baseline",
        "Shared prefix of 100 tokens",
        "Requests that fit at once in 50,000 KV tokens",
        "Serving: the block pool",
        "Recommendation (pick)",
        "Recommendation (trade-off)",
        "Poisson at 20 requests/s",
    ):
        assert text in res.stdout
    assert "rule: highest output throughput" in " ".join(res.stdout.split())
    # the answer first: the pick is the line right after the title, before any table that backs it
    lines = res.stdout.splitlines()
    pick = next(i for i, line in enumerate(lines) if line.startswith("Recommendation (pick)"))
    first_figures = next(i for i, line in enumerate(lines) if "requests; final length" in line)
    assert lines[0].startswith("kvtool simulate") and pick <= 2 and pick < first_figures


def test_json_has_the_specified_fields(run_cli, tmp_path):
    res = run_cli(
        "simulate",
        "--dist",
        "uniform",
        "--min",
        "10",
        "--max",
        "3000",
        "--requests",
        "300",
        "--serve",
        "--block-size",
        "16,32",
        "--json",
        "--plot",
        tmp_path / "plots",
    )
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""
    out = json.loads(res.stdout)
    assert [r["block_size"] for r in out["results"]] == [16, 32]
    for r in out["results"]:
        for key in ("internal_fragmentation", "mean_table_entries", "preemptions", "peak_blocks", "utilization"):
            assert key in r
        assert 0 <= r["internal_fragmentation"] < 1
        assert 0 < r["utilization"] <= 1
    # the default pool is stated when no budget is given
    assert out["serve_setup"]["pool_is_default"] is True
    assert "default" in out["serve_setup"]["pool_text"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "blocks_in_use_over_time.png",
        "fragmentation_vs_block_size.png",
    ]
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in out["plots"])


def test_fixed_length_distribution_shows_no_fragmentation_at_multiples(run_cli):
    res = run_cli("simulate", "--dist", "fixed", "--length", "1024", "--requests", "50", "--json")
    out = json.loads(res.stdout)
    assert all(r["internal_fragmentation"] == 0 for r in out["results"])


def _err(res):
    lines = res.stderr.strip().splitlines()
    assert lines and lines[0].startswith("Error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def test_unrecognised_trace_names_columns_and_formats(run_cli, tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("time,prompt,completion\n1,2,3\n")
    res = run_cli("simulate", "--trace", bad)
    assert res.exit_code == 3
    line = _err(res)
    assert "'time', 'prompt', 'completion'" in line
    assert "ContextTokens" in line and "arrived_at" in line and "input_toks" in line and "length" in line


@pytest.mark.parametrize(
    "content,needle",
    [
        ("prompt_tokens,output_tokens\n10,5\n-3,4\n", "line 3"),
        ("prompt_tokens,output_tokens\n10,5\n0,0\n", "must be positive"),
        ("length\n5\n0\n", "line 3"),
        ("prompt_tokens,output_tokens\n10,abc\n", "not a number"),
        ("prompt_tokens,output_tokens\n10,2.5\n", "whole number"),
        ("prompt_tokens,output_tokens\n", "no rows"),
        ("", "empty"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "date and time"),
        # 1e20 and 9e18 tokens overflowed int64: a negative length after a RuntimeWarning (the first stderr line)
        ("prompt_tokens,output_tokens\n1e20,5\n", "too large: '1e20' tokens (at most 1,000,000,000)"),
        ("prompt_tokens,output_tokens\n9e18,9e18\n", "too large"),
    ],
)
def test_bad_trace_contents(run_cli, tmp_path, content, needle):
    path = tmp_path / "t.csv"
    path.write_text(content)
    res = run_cli("simulate", "--trace", path)
    assert res.exit_code == 3
    assert needle in _err(res)


def test_missing_and_binary_files(run_cli, tmp_path):
    res = run_cli("simulate", "--trace", tmp_path / "nope.csv")
    assert res.exit_code == 3 and "not found" in _err(res)
    binary = tmp_path / "b.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    res = run_cli("simulate", "--trace", binary)
    assert res.exit_code == 3 and "binary" in _err(res)
    jl = tmp_path / "b.jsonl"
    jl.write_text('{"input_toks": 1, "output_toks": 2, "arrival_time_ns": 0}\n{oops\n')
    res = run_cli("simulate", "--trace", jl)
    assert res.exit_code == 3 and "line 2" in _err(res)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--block-size", "16,0"], "positive integers"),
        (["--block-size", "16,x"], "positive integers"),
        (["--block-size", "-8"], "positive integers"),
        (["--requests", "0"], "--requests"),
        (["--kv-tokens", "-5"], "--kv-tokens"),
        (["--qps", "3"], "add --serve"),
        (["--serve", "--prefix-variant-share", "0.5"], "--shared-prefix"),
        (["--slo-ttft-ms", "500"], "add --serve"),
        (["--serve", "--qps", "0"], "--qps"),
    ],
)
def test_usage_errors(run_cli, args, needle):
    res = run_cli("simulate", "--dist", "fixed", "--length", "100", *args)
    assert res.exit_code == 2
    assert needle in _err(res)


def test_source_errors(run_cli):
    assert run_cli("simulate").exit_code == 2
    res = run_cli("simulate", "--dist", "lognormal", "--mean", "100")
    assert res.exit_code == 2 and "--p99" in _err(res)
    res = run_cli("simulate", "--dist", "lognormal", "--mean", "100", "--p99", "90")
    assert res.exit_code == 2 and "mean < p99" in _err(res)
    res = run_cli("simulate", "--dist", "pareto")
    assert res.exit_code == 2 and "unknown distribution" in _err(res)
    res = run_cli("simulate", "--dist", "uniform", "--min", "50", "--max", "10")
    assert res.exit_code == 2 and "above --max" in _err(res)
    res = run_cli("simulate", "--dist", "fixed", "--length", "10", "--trace", SIM / "length-head20.csv")
    assert res.exit_code == 2 and "exactly one" in _err(res)


def test_help_names_the_command():
    from tests.support import run_subprocess

    res = run_subprocess("simulate", "--help")
    assert res.returncode == 0
    assert "--block-size" in res.stdout and "--serve" in res.stdout


def test_unsorted_trace_is_sorted_by_arrival(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n10,1,5\n20,2,1\n30,3,3\n")
    reqs = load_trace(path)
    assert reqs.prompt_tokens.tolist() == [20, 30, 10]
    assert np.allclose(reqs.arrival_s, [0, 2, 4])


def test_model_and_gpu_pool_comes_from_the_estimate_planner(run_cli):
    est = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--json")
    assert est.exit_code == 0, est.stderr
    est = json.loads(est.stdout)
    # Llama-2-7B: 2 (K and V) x 32 layers x 32 KV heads x 128 dims x 2 bytes = 524,288 bytes per token (the seed
    # article's formula); vLLM's pool is floor(budget / (16 x 524,288)) blocks of 16 tokens, one the null block.
    assert est["bytes_per_token"] == 2 * 32 * 32 * 128 * 2
    blocks = est["kv_budget_bytes"] // (16 * 524_288)
    assert blocks == est["num_blocks"]
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "1000",
        "--requests",
        "1000",
        "--model",
        "llama-2-7b",
        "--gpu",
        "h100-80gb",
        "--serve",
        "--block-size",
        "16",
        "--json",
    )
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["kv_tokens"] == est["kv_budget_bytes"] // 524_288  # the static comparison's budget in tokens
    assert out["results"][0]["pool_blocks"] == blocks
    assert out["serve_setup"]["pool_tokens"] == (blocks - 1) * 16  # the null block is never handed out
    # 1,000-token requests take 63 blocks of 16: floor(blocks / 63) fit at once
    assert out["results"][0]["fit_at_once_p50"] == blocks // 63
    # the default --serve pool is the same plan, stated as the default
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "1000",
        "--requests",
        "10",
        "--serve",
        "--block-size",
        "16",
        "--json",
    )
    setup = json.loads(res.stdout)["serve_setup"]
    assert setup["pool_is_default"] and setup["pool_tokens"] == (blocks - 1) * 16
    assert "llama-2-7b on h100-80gb" in setup["pool_text"]


def test_model_alone_uses_the_default_gpu_and_unknown_names_are_errors(run_cli):
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "1000",
        "--requests",
        "5",
        "--model",
        "llama-2-7b",
        "--serve",
        "--json",
    )
    assert res.exit_code == 0, res.stderr
    assert "llama-2-7b on h100-80gb" in json.loads(res.stdout)["serve_setup"]["pool_text"]
    res = run_cli("simulate", "--dist", "fixed", "--length", "1000", "--model", "nope", "--gpu", "h100-80gb", "--serve")
    assert res.exit_code == 2 and "nope" in _err(res)


def test_a_model_too_big_for_one_gpu_says_so(run_cli):
    # Llama-3.1-70B in BF16 (~141 GB of weights) on one 80 GB H100: no room for any KV cache (it used to say
    # "--kv-tokens must be a positive integer, got 0").
    res = run_cli(
        "simulate", "--dist", "fixed", "--length", "1000", "--model", "llama-3.1-70b", "--gpu", "h100", "--serve"
    )
    assert res.exit_code == 2
    err = _err(res)
    assert "weights" in err and "leave no room for a KV cache" in err
    assert res.stderr.splitlines()[1].startswith("Tip: --tp 4 fits")


def test_simulate_does_not_import_pandas_or_torch():
    from tests.support import heavy_modules_loaded_by

    codes, _, heavy = heavy_modules_loaded_by(
        ["simulate", "--trace", str(SIM / "generic-head20.csv"), "--serve", "--json"], modules=("torch", "pandas")
    )
    assert codes == [0]
    assert heavy == []


def test_quoted_header_and_byte_order_mark(tmp_path):
    quoted = tmp_path / "q.csv"
    quoted.write_text('"prompt_tokens","output_tokens"\n"10",5\n20,"6"\n')
    assert load_trace(quoted).lengths.tolist() == [15, 26]
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n")
    assert load_trace(bom).source.startswith("azure trace")


@pytest.mark.parametrize("value", ["true", "[1]", '{"a": 1}'])
def test_json_values_that_are_not_numbers_are_errors(run_cli, tmp_path, value):
    # a list used to reach numpy as a 2-D array and end in a traceback; true was read as 1 token
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"input_toks": {value}, "output_toks": 3, "arrival_time_ns": 1}}\n')
    res = run_cli("simulate", "--trace", path)
    assert res.exit_code == 3
    line = _err(res)
    assert "'input_toks' is not a number" in line and "record 1" in line


@pytest.mark.parametrize(
    "args,where",
    [
        (["--dist", "zipf", "--alpha", "1", "--min", "1", "--max", "1e10"], "--max"),  # was a MemoryError
        (["--dist", "zipf", "--alpha", "1", "--min", "1", "--max", "100000000"], "--min/--max"),  # 1e8 lengths
        (["--dist", "uniform", "--min", "1", "--max", "1e30"], "--max"),  # was a numpy ValueError
        (["--dist", "fixed", "--length", "1e30"], "--length"),  # was an OverflowError
        (["--dist", "fixed", "--length", "100", "--requests", "100000000000"], "--requests"),  # was a MemoryError
        (["--dist", "fixed", "--length", "100", "--kv-tokens", str(10**23)], "--kv-tokens"),  # was an OverflowError
        (["--dist", "fixed", "--length", "100", "--shared-prefix", str(10**23)], "--shared-prefix"),
        (["--dist", "fixed", "--length", "100", "--block-size", str(10**23)], "--block-size"),
    ],
)
def test_out_of_range_parameters_are_usage_errors(run_cli, args, where):
    res = run_cli("simulate", *args)
    assert res.exit_code == 2
    assert _err(res).endswith(f"({where})")


def test_fixed_length_claim_shows_its_overstatement_of_p1(run_cli, tmp_path):
    # Lengths 16, 16, 16, 80 tokens at b = 16: 1, 1, 1, 5 blocks; --kv-tokens 96 = 6 blocks.  Cyclic windows:
    # from 0: 1+1+1 = 3 (+5 > 6) -> 3; from 1: 1+1 (+5) -> 2; from 2: 1+5 = 6 -> 2; from 3: 5+1 = 6 -> 2.
    # p1 of [3, 2, 2, 2] = 2.  Mean length 128/4 = 32 = 2 blocks: a fixed-length test claims 6 // 2 = 3,
    # +50% over p1.
    path = tmp_path / "t.csv"
    path.write_text("prompt_tokens,output_tokens\n15,1\n15,1\n15,1\n79,1\n")
    res = run_cli("simulate", "--trace", path, "--block-size", "16", "--kv-tokens", "96")
    assert res.exit_code == 0, res.stderr
    assert "3 (+50% vs p1)" in res.stdout


def test_fixed_distribution_says_how_it_misleads(run_cli):
    res = run_cli("simulate", "--dist", "fixed", "--length", "2048", "--requests", "100")
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "Every request is 2,048 tokens long: a fixed length has no spread" in text
    assert "(b-1)/2 slots per request" in text
    res = run_cli("simulate", "--dist", "uniform", "--min", "1", "--max", "4096", "--requests", "100")
    assert "no spread" not in res.stdout


def test_recommendations_state_how_ties_are_broken(run_cli):
    # 2,048 tokens is a multiple of 16 and 128: both waste 0 slots, and with 100,000 KV tokens both fit
    # floor(6250 / 128) = floor(781 / 16) = 48 requests (100,000 // 16 = 6,250 blocks of 16; // 128 = 781 of 128).
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "2048",
        "--requests",
        "100",
        "--block-size",
        "16,128",
        "--kv-tokens",
        "100000",
        "--json",
    )
    recs = json.loads(res.stdout)["recommendations"]
    assert recs[0]["objective"] == "pick" and recs[0]["block_size"] == 128
    assert "48 requests fit at once (p1)" in recs[0]["reason"]
    assert "ties to the larger block" in recs[0]["reason"]
    assert [r["objective"] for r in recs[1:]] == ["trade-off"] and recs[1]["block_size"] == 16
    # 10 requests in a large pool, all at once: the rule is stated with its tie-breakers
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "1000",
        "--requests",
        "10",
        "--block-size",
        "16,32",
        "--serve",
        "--json",
    )
    recs = json.loads(res.stdout)["recommendations"]
    assert recs[0]["objective"] == "pick"
    assert "highest output throughput with no TTFT target" in recs[0]["reason"]
    assert "the lowest TPOT p50" in recs[0]["reason"] and "the smaller block" in recs[0]["reason"]


def test_slo_ttft_target_decides(run_cli):
    # An impossible TTFT target: no block size meets it, and the pick says so (lowest TTFT p99 instead).
    args = ["--dist", "fixed", "--length", "1000", "--requests", "50", "--block-size", "16,32", "--serve", "--json"]
    res = run_cli("simulate", *args, "--slo-ttft-ms", "0.001")
    rec = json.loads(res.stdout)["recommendations"][0]
    assert "no block size meets TTFT p99 <= 0.001 ms" in rec["reason"]
    res = run_cli("simulate", *args, "--slo-ttft-ms", "100000")
    assert "TTFT p99 <= 100000 ms" in json.loads(res.stdout)["recommendations"][0]["reason"]


def test_a_pool_too_small_for_any_request_is_a_usage_error(run_cli):
    # It printed "Recommendation (pick): block size 16 ... 0 requests fit at once" and exited 0.  Hand computation:
    # 1,000-token requests in a 100-token pool at block size 16: 100 // 16 = 6 blocks, 5 usable beside vLLM's null
    # block, and ceil(1000 / 16) = 63 needed; the least budget that holds one is (63 + 1) x 16 = 1,024 tokens.
    args = ["--dist", "fixed", "--length", "1000", "--requests", "10", "--block-size", "16", "--kv-tokens", "100"]
    res = run_cli("simulate", *args, "--serve")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == (
        "Error: the KV pool cannot hold one request: 6 blocks of 16 tokens, 5 usable (block 0 is vLLM's null "
        "block), and the shortest request (1,000 tokens) needs 63; block size 16 does not (--kv-tokens)\n"
        "Tip: give --kv-tokens 1,024 or more (what the shortest request needs at its best block size), or shorter "
        "requests\n"
    )


@pytest.mark.parametrize(
    "kv_tokens, serve, refused",
    [
        # the static comparison has no null block: 1,000 // 8 = 125 blocks hold ceil(1000 / 8) = 125
        ("1000", [], False),
        ("999", [], True),  # 124 blocks
        ("1000", ["--serve"], True),  # 124 usable
        ("1008", ["--serve"], False),  # 126 blocks, 125 usable
    ],
)
def test_the_pool_check_holds_at_the_boundary(run_cli, kv_tokens, serve, refused):
    args = ["--dist", "fixed", "--length", "1000", "--requests", "5", "--block-size", "8", "--kv-tokens", kv_tokens]
    res = run_cli("simulate", *args, *serve, "--json")
    assert res.exit_code == (2 if refused else 0), res.stderr
    if not refused:
        assert json.loads(res.stdout)["results"][0]["fit_at_once_p1"] == 1  # exactly one request fits


def test_the_pool_check_of_the_static_comparison_names_the_smallest_budget(run_cli):
    # 100 tokens: 12 blocks of 8 (125 needed) and 6 of 16 (63 needed); the least budget is min(125 x 8, 63 x 16)
    res = run_cli("simulate", "--dist", "fixed", "--length", "1000", "--block-size", "8,16", "--kv-tokens", "100")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "Error: the KV pool cannot hold one request: 6 blocks of 16 tokens, and the shortest request (1,000 tokens) "
        "needs 63; no block size compared (8, 16) holds it (--kv-tokens)",
        "Tip: give --kv-tokens 1,000 or more (what the shortest request needs at its best block size), or shorter "
        "requests",
    ]


def test_static_budget_names_where_it_came_from(run_cli):
    # --model/--gpu: the static table says whose plan the budget is, not just a token count
    res = run_cli(
        "simulate",
        "--dist",
        "fixed",
        "--length",
        "1000",
        "--requests",
        "100",
        "--model",
        "llama-2-7b",
        "--gpu",
        "h100-80gb",
        "--block-size",
        "16",
    )
    assert res.exit_code == 0, res.stderr
    assert "tokens (kvtool estimate's plan for llama-2-7b on h100-80gb" in " ".join(res.stdout.split())
    res = run_cli(
        "simulate", "--dist", "fixed", "--length", "1000", "--requests", "100", "--kv-tokens", "5000", "--json"
    )
    assert json.loads(res.stdout)["kv_tokens_text"] == "--kv-tokens"


def test_export_events_to_a_folder_is_a_usage_error(run_cli, tmp_path):
    # it used to write NAME-b16.csv files beside the folder (or fail only after the simulation with one size)
    res = run_cli(
        "simulate", "--dist", "fixed", "--length", "100", "--requests", "5", "--serve", "--export-events", tmp_path
    )
    assert res.exit_code == 2
    assert "not a folder" in _err(res)
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}-b*.csv"))


def test_static_waste_column_names_its_unit(run_cli):
    # uniform 1..4096 at b = 8: (b - 1)/2 = 3.5 empty slots per request on average (closed form)
    res = run_cli(
        "simulate", "--dist", "uniform", "--min", "1", "--max", "4096", "--requests", "20000", "--block-size", "8"
    )
    assert res.exit_code == 0, res.stderr
    assert "empty slots/req" in res.stdout
    row = next(line for line in res.stdout.splitlines() if line.startswith("│     8 │"))
    assert float(row.split("│")[4]) == pytest.approx(3.5, abs=0.1)


def test_azure_2024_timestamps_with_a_utc_offset(run_cli, tmp_path):
    # The Azure LLM inference trace 2024 writes TIMESTAMP as '2024-05-10 00:00:00.009930+00:00'.  numpy reads the
    # offset (converting to UTC) but used to print a UserWarning on stderr, breaking --json's clean stderr.
    # By hand: the second row is 1.5 s after the first; the third, 2024-05-10 01:00:00.509930+01:00, is
    # 00:00:00.509930 UTC, 0.5 s after the first.
    path = tmp_path / "az24.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,10\n"
        "2024-05-10 00:00:01.509930+00:00,200,20\n"
        "2024-05-10 01:00:00.509930+01:00,300,30\n"
    )
    res = run_cli("simulate", "--trace", path, "--serve", "--block-size", "16", "--json")
    assert res.exit_code == 0
    assert res.stderr == ""
    json.loads(res.stdout)
    reqs = load_trace(path)
    # sorted by arrival: 0, 0.5 (the +01:00 row), 1.5
    assert reqs.arrival_s.tolist() == pytest.approx([0.0, 0.5, 1.5])
    assert reqs.prompt_tokens.tolist() == [100, 300, 200]


def test_the_output_share_default_is_stated(run_cli):
    # --dist and `length` traces split each length with --output-share (default 0.15): the source line says so
    res = run_cli("simulate", "--dist", "fixed", "--length", "1000", "--requests", "10", "--json")
    assert "output = 0.15 of each length" in json.loads(res.stdout)["source"]
    res = run_cli("simulate", "--trace", SIM / "length-head20.csv", "--output-share", "0.3", "--json")
    assert "output = 0.3 of each length" in json.loads(res.stdout)["source"]
    res = run_cli("simulate", "--trace", SIM / "generic-head20.csv", "--json")
    assert "output-share" not in json.loads(res.stdout)["source"]  # the trace gives both parts


def test_help_states_the_serving_defaults(run_cli):
    # the pool and the arrivals --serve uses when nothing is given are stated in --help, not only in the output
    res = run_cli("simulate", "--help")
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "default llama-2-7b" in text and "default h100-80gb" in text
    assert "default: the trace's timestamps, else all at t=0" in text


def test_every_simulate_input_is_an_option_of_the_command_and_the_api():
    # inputs_from() maps arguments by name: a renamed option would silently fall back to its default
    import dataclasses
    import inspect

    from kvtool.api._simulate import simulate
    from kvtool.cli import build_app
    from kvtool.simulate.inputs import SimulateInputs

    fields = {f.name for f in dataclasses.fields(SimulateInputs)}
    command = next(c for c in build_app("simulate").registered_commands if c.name == "simulate").callback
    assert fields <= set(inspect.signature(command).parameters)
    assert fields <= set(inspect.signature(simulate).parameters) | {"trace"}


@pytest.mark.parametrize(
    "args,line",
    [
        # numpy's generators take no negative seed: a ValueError traceback
        (["--seed", "-1"], "Error: --seed must be 0 or more, got -1 (--seed)"),
        # an infinite step time ended in an IndexError traceback
        (
            ["--serve", "--step-overhead-ms", "inf"],
            "Error: --step-overhead-ms must be a finite number, 0 or more, got inf (--step-overhead-ms)",
        ),
        (
            ["--serve", "--table-entry-us", "inf"],
            "Error: --table-entry-us must be a finite number, 0 or more, got inf (--table-entry-us)",
        ),
        # was taken as 0 (off) without a word
        (
            ["--serve", "--long-prefill-token-threshold", "-5"],
            "Error: --long-prefill-token-threshold must be 0 (off) or more tokens, got -5 (--long-prefill-token-threshold)",
        ),
    ],
)
def test_bad_seed_costs_and_threshold_are_one_usage_line(run_cli, args, line):
    res = run_cli(
        "simulate", "--dist", "fixed", "--length", "100", "--requests", "5", "--kv-tokens", "4000", *args, "--json"
    )
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == line + "\n"


AZURE_HEAD = (SIM / "azure-2023-code-head20.csv").read_text().splitlines()


@pytest.mark.parametrize(
    "text,message,where",
    [
        # pyarrow's KeyError ('Field "ContextTokens" exists 2 times in schema') was a traceback
        (
            AZURE_HEAD[0] + ",ContextTokens\n" + "\n".join(line + ",1" for line in AZURE_HEAD[1:]) + "\n",
            "column 'ContextTokens' appears 2 times in the header (columns 2, 4)",
            "",
        ),
        # pyarrow's "CSV parse error: Expected 3 columns, got 2: ..." named no line
        (
            "\n".join(AZURE_HEAD[:4] + ["2023-11-16 18:17:04.1206440,7433"] + AZURE_HEAD[5:]) + "\n",
            "the row has 2 fields, the header 3",
            ", line 5",
        ),
    ],
    ids=["duplicate-column", "short-row"],
)
def test_duplicate_columns_and_ragged_rows_name_the_column_or_line(run_cli, tmp_path, text, message, where):
    path = tmp_path / "azure.csv"
    path.write_text(text)
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr.splitlines()[0] == f"Error: {message} ({path}{where})"
    assert "Traceback" not in res.stderr


def test_json_lines_trace_with_a_byte_order_mark(run_cli, tmp_path):
    # the BOM hid the leading "{": the file was read as a CSV and refused with pyarrow's parse error
    path = tmp_path / "mooncake.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (SIM / "mooncake-conversation-head40.jsonl").read_bytes())
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["requests"] == 40


@pytest.mark.parametrize("stamp", ["0", "-5", "2023"])
def test_azure_timestamps_that_are_not_dates_are_refused(run_cli, tmp_path, stamp):
    # numpy parses "0" and "-5" as years counted from 1970 and "2023" as a year: arrival seconds in TIMESTAMP
    # gave requests years apart (span_s 63,158,400 for 0, 1, 2) without a word
    path = tmp_path / "azure.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,100,10\n{stamp},200,20\n")
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: 'TIMESTAMP' is not a date and time: '{stamp}' ({path}, line 3)\n"
        "Tip: an Azure TIMESTAMP is a date and time (2023-11-16 18:17:03.98); arrival seconds go in a generic trace: "
        "prompt_tokens,output_tokens,arrival_s\n"
    )


@pytest.mark.parametrize(
    "args,line",
    [
        # --length looked like a cap on the trace's lengths and did nothing
        (
            ["--trace", SIM / "azure-2023-code-head20.csv", "--length", "100"],
            "Error: --length is a parameter of --dist fixed, not of --trace: it would be ignored (--length)",
        ),
        (
            ["--dist", "fixed", "--length", "100", "--mean", "5"],
            "Error: --mean is a parameter of --dist lognormal, not of --dist fixed: it would be ignored (--mean)",
        ),
        (
            ["--from-events", DATA / "analyze" / "basic.csv", "--min", "3"],
            "Error: --min is a parameter of --dist uniform and --dist zipf, not of --from-events: it would be ignored "
            "(--min)",
        ),
    ],
    ids=["trace-length", "fixed-mean", "events-min"],
)
def test_a_parameter_the_source_does_not_read_is_a_usage_error(run_cli, args, line):
    res = run_cli("simulate", *args, "--json")
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == line + "\n"


@pytest.mark.parametrize("flag", ["--gpu", "--model", "--config"])
def test_an_empty_model_or_gpu_is_a_usage_error(run_cli, flag):
    # --gpu '' fell back to the default H100 without a word
    res = run_cli("simulate", "--dist", "fixed", "--length", "100", "--requests", "5", "--serve", flag, "", "--json")
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr.splitlines()[0] == f"Error: {flag} is empty ({flag})"
    assert res.stderr.splitlines()[1].startswith("Tip: ")


def test_a_few_blank_arrivals_are_an_error_not_an_offline_batch(run_cli, tmp_path):
    # one blank arrival_s dropped every arrival: the trace ran as an offline batch, all at t=0, without a word
    path = tmp_path / "generic.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n5,5,0\n5,5,\n5,5,2\n")
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: 'arrival_s' is empty ({path}, line 3)\nTip: give every row an arrival time, or none (all at t=0)\n"
    )
    path.write_text("prompt_tokens,output_tokens,arrival_s\n5,5,\n5,5,\n")  # none at all: an offline batch
    assert load_trace(path).arrival_s is None


def test_a_semicolon_trace_says_so(run_cli, tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(line.replace(",", ";") for line in AZURE_HEAD) + "\n")
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr.splitlines()[0].startswith("Error: unrecognised trace format: columns found 'TIMESTAMP;")
    assert res.stderr.splitlines()[1] == "Tip: the header is separated by semicolons: a CSV trace is comma-separated"


def test_a_gzip_trace_says_it_is_compressed(run_cli, tmp_path):
    # it was "not a text CSV file (binary content)"
    import gzip

    path = tmp_path / "azure.csv.gz"
    path.write_bytes(gzip.compress((SIM / "azure-2023-code-head20.csv").read_bytes()))
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: the trace is gzip-compressed; traces are read as plain CSV or JSON lines ({path})\n"
        f"Tip: decompress it first: gunzip -k {path}\n"
    )


def test_export_events_below_a_file_names_the_file(run_cli, tmp_path):
    # it said "the folder for the events file does not exist"
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    target = blocker / "events.csv"
    res = run_cli("simulate", "--dist", "fixed", "--length", "10", "--serve", "--export-events", target, "--json")
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == f"Error: {blocker} is a file, not a folder (--export-events {target})\n"


def test_arrivals_too_far_apart_are_an_error(run_cli, tmp_path):
    # 1e308 and -1e308 overflowed the arrival subtraction: a RuntimeWarning on stderr, then (with --serve) an
    # IndexError traceback
    path = tmp_path / "vidur.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1e308,5,5\n-1e308,5,5\n")
    res = run_cli("simulate", "--trace", path, "--serve", "--kv-tokens", "10000", "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert (
        res.stderr == f"Error: 'arrived_at' is out of range: '1e308' (at most 1e+12 s from time 0) ({path}, line 3)\n"
    )


def test_from_events_with_only_bad_rows_names_the_file_and_the_rejections(run_cli, tmp_path):
    # it named only the file's base name and not that every row had been rejected
    path = tmp_path / "events.csv"
    path.write_text("ts,event,request_id,num_blocks,num_tokens\nx,allocate,A,1,5\n0,evict,A,1,5\n")
    res = run_cli("simulate", "--from-events", path, "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    assert res.stderr == (
        "Error: no event row is accepted: 2 rows rejected (1 unparseable ts, 1 unknown event type; first: row 2, "
        f"row 3) ({path})\nTip: docs/events-schema.md#rejected-rows says what each reason means\n"
    )


def test_errors_name_a_column_as_the_file_spells_it(run_cli, tmp_path):
    # it said 'contexttokens' for the Azure trace's ContextTokens
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,1e300,10\n")
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3 and res.stdout == ""
    assert res.stderr == (
        f"Error: 'ContextTokens' is too large: '1e300' tokens (at most 1,000,000,000) ({path}, line 2)\n"
    )


def test_serve_refuses_prompts_of_max_model_len_and_counts_generated_tokens(run_cli, tmp_path):
    # max_model_len 500: prompts 600, 1000 and 500 are refused at input by vLLM 0.32 (InputProcessor.
    # _validate_model_input: a prompt of max_model_len tokens or more); 100+10, 300+10, 50+5 run whole; 499+30
    # stops after 1 token (check_stop at num_tokens >= 500).  Generated tokens: 10 + 10 + 5 + 1 = 26.
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_tokens,output_tokens\n100,10\n300,10\n600,5\n1000,20\n50,5\n500,3\n499,30\n")
    args = ("simulate", "--trace", trace, "--serve", "--max-model-len", "500", "--block-size", "16")
    r = json.loads(run_cli(*args, "--json").stdout)["results"][0]
    assert (r["requests"], r["completed"], r["refused_too_long"], r["never_fit"]) == (7, 4, 3, 0)
    assert r["throughput_tokens_per_s"] == pytest.approx(26 / r["span_s"])
    assert "3 of 7 requests refused: a prompt of --max-model-len tokens or more" in run_cli(*args).stdout
