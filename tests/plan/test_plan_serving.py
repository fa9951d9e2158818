"""`kvtool plan --qps`: the serving simulation per fitting configuration, against `kvtool simulate --serve` run on
each one by one, against the roofline computed by hand, and its errors (one line, exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from kvtool.core.errors import EXIT_USAGE

TRACE = "tests/data/simulate/azure-2023-code-head20.csv"  # 20 Azure LLM inference trace rows, with timestamps
SAMPLED = ["--trace", TRACE, "--requests", "200", "--seed", "3", "--qps", "4"]  # plan and simulate read these alike
GRID = ["--gpu", "H100-80GB,L40S", "--tp", "1,2", "--kv-dtype", "auto,fp8,bfloat16", "--gpu-memory-utilization"]


def _plan(run_cli, *args: str) -> dict:
    result = run_cli("plan", "-m", "llama-3.1-8b", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_each_verdict_and_percentile_equals_simulate_serve_on_that_candidate(run_cli):
    data = _plan(run_cli, *SAMPLED, "--ttft-ms", "400", "--tpot-ms", "40", *GRID, "0.9,0.95")
    simulated = data["rows"] + data["missed"]
    assert data["fitting"] == len(simulated) == 2 * 2 * 3 * 2  # GPUs x tp x KV dtypes x utilizations: all fit
    assert data["rows"] and data["missed"]  # the target splits the grid (L40S at tp 1 misses it)
    # auto and bfloat16 are the same KV dtype on this bf16 model, and pools that hold the running requests' blocks
    # whatever happens (200 requests of at most 7,447 tokens: 200 x 466 + 1 = 93,201 blocks and fewer) run alike:
    # shared runs, each checked below against simulate on the row's own pool
    shared = sum(r["serving"]["shared_simulation"] for r in simulated)
    assert shared >= len(simulated) // 3 and data["simulations"] == len(simulated) - shared
    for row in simulated:
        args = ["--gpu", row["gpu"], "--tp", str(row["tp"]), "--kv-dtype", row["kv_dtype"]]
        if row["gpu_memory_utilization"] != 0.9:  # simulate has no --gpu-memory-utilization: the pool in tokens
            args += ["--kv-tokens", str(row["num_blocks"] * row["block_size"])]
        sim = run_cli("simulate", "--serve", "--model", "llama-3.1-8b", *SAMPLED, "--block-size", "16", *args, "--json")
        assert sim.exit_code == 0, sim.stderr
        served = json.loads(sim.stdout)["results"][0]
        s = row["serving"]
        assert served["pool_blocks"] == row["num_blocks"]  # plan's pool is the one simulate plans for the candidate
        assert s["ttft_ms"] == pytest.approx(served["ttft_p99_s"] * 1e3, rel=1e-12)
        assert s["tpot_ms"] == pytest.approx(served["tpot_p99_s"] * 1e3, rel=1e-12)
        assert s["ttft_p50_ms"] == pytest.approx(served["ttft_p50_s"] * 1e3, rel=1e-12)
        assert s["throughput_tokens_per_s"] == pytest.approx(served["throughput_tokens_per_s"], rel=1e-12)
        assert s["completed"] == served["completed"] == 200
        meets = served["ttft_p99_s"] * 1e3 <= 400 and served["tpot_p99_s"] * 1e3 <= 40
        assert s["meets_slo"] is meets
        assert s["ttft_headroom_ms"] == pytest.approx(400 - served["ttft_p99_s"] * 1e3, rel=1e-12)
    costs = [(r["num_gpus"], r["idle_kv_bytes"]) for r in data["rows"]]
    assert costs == sorted(costs)  # the cheapest configuration meeting the target first


def test_input_and_output_lengths_are_that_many_equal_requests(run_cli, tmp_path):
    trace = tmp_path / "fixed.csv"
    trace.write_text("prompt_tokens,output_tokens\n" + "1500,300\n" * 50)
    common = ["--qps", "6", "--ttft-ms", "300", "--gpu", "L40S", "--tp", "1"]
    given = _plan(run_cli, "--input-len", "1500", "--output-len", "300", "--requests", "50", *common)
    traced = _plan(run_cli, "--trace", str(trace), *common)
    assert given["workload"]["seq_len"] == 1800 and given["serving"]["requests"] == 50
    assert (given["rows"] + given["missed"])[0]["serving"] == (traced["rows"] + traced["missed"])[0]["serving"]


# Llama-3.1-8B (profiles/models/llama-3.1-8b.yaml; Hugging Face meta-llama/Llama-3.1-8B config.json): 32 layers, 32
# query heads, 8 KV heads, head_dim 128, bf16; 8,030,261,248 parameters (the checkpoint's safetensors total), so
# 16,060,522,496 bytes of weights.  H100-80GB (profiles/gpus/h100-80gb.yaml): 3,350 GB/s, 989.4 dense bf16 TFLOP/s.
# kvtool/simulate/costs.py: step = 1 ms + max(bytes / bandwidth, FLOPs / peak) + 0.17 us x block-table entries.
PARAMS, LAYERS, HEADS, HEAD_DIM, KV_HEADS = 8_030_261_248, 32, 32, 128, 8
BANDWIDTH, PEAK, OVERHEAD_S, ENTRY_S = 3350e9, 989.4e12, 1e-3, 0.17e-6
PROMPT, OUTPUT, BLOCK = 1990, 5, 16  # 1,990 + 5 tokens stay in ceil(1995 / 16) = 125 blocks throughout


def _step_s(tp: int, tokens: int, entries: int, pairs: float) -> float:
    kv_bytes_per_token = 2 * LAYERS * (KV_HEADS // tp) * HEAD_DIM * 2  # K and V, bf16
    memory = (2 * PARAMS / tp + kv_bytes_per_token * BLOCK * entries) / BANDWIDTH
    compute = (2 * PARAMS / tp * tokens + 4 * LAYERS * (HEADS // tp) * HEAD_DIM * pairs) / PEAK
    return OVERHEAD_S + max(memory, compute) + ENTRY_S * entries


def _one_at_a_time(run_cli, *args: str) -> dict:
    # 0.001 requests/s: ~1,000 s between arrivals, each request alone in the engine
    return _plan(
        run_cli, "--qps", "0.001", "--input-len", str(PROMPT), "--output-len", str(OUTPUT), "--requests", "5",
        "--gpu", "H100-80GB", *args,
    )  # fmt: skip


def test_one_request_at_a_time_is_one_prefill_step_then_one_decode_step_per_token(run_cli):
    data = _one_at_a_time(run_cli, "--tp", "1", "--ttft-ms", "1000", "--tpot-ms", "100")
    (row,) = data["rows"]
    entries = math.ceil(PROMPT / BLOCK)
    assert entries == math.ceil((PROMPT + OUTPUT - 1) / BLOCK) == 125
    # the prefill: 1,990 tokens in one step (max_num_batched_tokens 8,192), 1,990 x 1,991 / 2 query-key pairs;
    # compute-bound: 2 x 8.03e9 x 1,990 / 989.4e12 = 32.3 ms against 4.87 ms of reads
    ttft_s = _step_s(1, PROMPT, entries, PROMPT * (PROMPT + 1) / 2)
    # a decode: one token, memory-bound (the weights and 125 blocks read), the same each step
    tpot_s = _step_s(1, 1, entries, PROMPT + 1)
    assert ttft_s == pytest.approx(1e-3 + 2 * PARAMS * PROMPT / PEAK + 4 * 32 * 32 * 128 * 1_981_045 / PEAK + 21.25e-6)
    assert row["serving"]["ttft_ms"] == pytest.approx(ttft_s * 1e3, rel=1e-9)
    assert row["serving"]["tpot_ms"] == pytest.approx(tpot_s * 1e3, rel=1e-9)
    assert row["serving"]["ttft_p50_ms"] == pytest.approx(ttft_s * 1e3, rel=1e-9)


def test_more_gpus_never_worsen_ttft_one_request_at_a_time(run_cli):
    data = _one_at_a_time(run_cli, "--tp", "1,2,4,8", "--ttft-ms", "1000")
    by_tp = {r["tp"]: r["serving"]["ttft_ms"] for r in data["rows"]}
    assert sorted(by_tp) == [1, 2, 4, 8]
    assert by_tp[1] > by_tp[2] > by_tp[4] > by_tp[8]  # compute-bound prefill: FLOPs per GPU halve with tp
    assert by_tp[8] == pytest.approx(_step_s(8, PROMPT, 125, PROMPT * (PROMPT + 1) / 2) * 1e3, rel=1e-9)


def test_a_target_nobody_meets_is_an_empty_answer_that_says_why(run_cli):
    # 0.5 ms is below the 1 ms every engine step takes (costs.py's step overhead): no configuration can meet it
    data = _one_at_a_time(run_cli, "--tp", "1,2", "--ttft-ms", "0.5")
    assert data["rows"] == [] and len(data["missed"]) == 2
    assert data["warnings"][-1].startswith("no configuration meets TTFT p99 <= 0.5 ms: of 2 simulated, the closest")
    table = run_cli(
        "plan", "-m", "llama-3.1-8b", "--qps", "0.001", "--input-len", "100", "--output-len", "5", "--requests", "3",
        "--gpu", "H100-80GB", "--tp", "1", "--ttft-ms", "0.5",
    )  # fmt: skip
    assert table.exit_code == 0
    assert "0 meet the target" in table.stdout
    assert "Warning: no configuration meets TTFT p99 <= 0.5 ms" in table.stderr


def test_top_stops_the_scan_once_enough_configurations_meet_the_target(run_cli):
    full = _plan(run_cli, *SAMPLED, "--ttft-ms", "400", *GRID, "0.9")
    top = _plan(run_cli, *SAMPLED, "--ttft-ms", "400", *GRID, "0.9", "--top", "1")
    assert top["rows"] == full["rows"][:1]
    simulated = len(top["rows"]) + len(top["missed"])
    (skipped,) = top["not_simulated"]
    assert skipped["reason"].startswith("--top 1:") and skipped["candidates"] == top["fitting"] - simulated > 0


def test_a_timestamped_trace_needs_no_qps(run_cli):
    data = _plan(run_cli, "--trace", TRACE, "--ttft-ms", "1000", "--gpu", "H100-80GB", "--tp", "1")
    assert data["serving"]["arrivals"] == "from the trace's timestamps" and data["serving"]["qps"] is None


def test_pipeline_parallel_rows_are_counted_not_simulated(run_cli):
    data = _plan(run_cli, *SAMPLED, "--ttft-ms", "400", "--gpu", "H100-80GB", "--tp", "1", "--pp", "1,2")
    assert len(data["rows"] + data["missed"]) == 1
    assert [s["candidates"] for s in data["not_simulated"]] == [1]
    assert data["not_simulated"][0]["reason"].startswith("pp > 1")


LENGTHS = ["--input-len", "100", "--output-len", "10"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--qps", "5", *LENGTHS], "Error: --qps needs a target to judge the configurations by"),
        (["--ttft-ms", "300", *LENGTHS], "Error: a TTFT/TPOT target needs an arrival rate: --qps R"),
        (["--tpot-ms", "30", "-n", "4", *LENGTHS], "Error: a TTFT/TPOT target needs an arrival rate"),
        (["--qps", "5", "--ttft-ms", "300", "--seq-len", "1000"], "Error: --seq-len is the concurrency form's"),
        (["--qps", "5", "--ttft-ms", "300", "--trace", TRACE, "--percentile", "90"], "Error: --percentile is the"),
        (["--qps", "5", "--ttft-ms", "300", "--trace", TRACE, *LENGTHS], "Error: give the requests one way"),
        (["--qps", "5", "--ttft-ms", "300", "--input-len", "100"], "Error: --input-len and --output-len go together"),
        (["--qps", "5", "--ttft-ms", "300"], "Error: --qps needs the requests"),
        (["--qps", "0", "--ttft-ms", "300", *LENGTHS], "Error: --qps must be a positive number, not 0"),
        (["--qps", "5", "--ttft-ms", "-1", *LENGTHS], "Error: --ttft-ms must be a positive number of milliseconds"),
        (["--qps", "5", "--ttft-ms", "9", "--slo-percentile", "0", *LENGTHS], "Error: --slo-percentile must be in"),
        (["--qps", "5", "--ttft-ms", "9", "--requests", "0", *LENGTHS], "Error: --requests must be greater than"),
        (["--qps", "5", "--tpot-ms", "9", "--input-len", "9", "--output-len", "1"], "needs requests of 2 or more"),
        (["-n", "4", "--seq-len", "1024", "--requests", "50"], "Error: --requests applies to the requests-per-second"),
        (["-n", "4", "--seq-len", "1024", "--slo-percentile", "90"], "Error: --slo-percentile applies to the"),
    ],
)
def test_bad_serving_input_is_one_error_line_and_exit_2(run_cli, args, message):
    result = run_cli("plan", "-m", "llama-3.1-8b", "--gpu", "L40S", "--tp", "1", *args)
    assert result.exit_code == EXIT_USAGE, result.stdout
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("Error:")]) == 1
    if "--qps needs a target" in message or "arrival rate: --qps R" in message:
        assert "Tip: e.g. --qps 10" in result.stderr
