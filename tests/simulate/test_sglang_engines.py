"""SGLang's simulation timed by the shared roofline, and `kvtool simulate --engine vllm,sglang` side by side.

References: the roofline's closed form worked by hand for a one-request trace (kvtool/simulate/costs.py's formula,
step_overhead + max(memory, compute) + entries x entry cost), hand traces whose hits follow from the two engines'
rules (vLLM: whole blocks of the prompt, at most prompt - 1 tokens, vllm/v1/core/kv_cache_manager.py
get_computed_blocks; SGLang: the radix match of prompt[:-1] rounded down to whole pages, sglang
srt/managers/schedule_batch.py Req.init_next_round_input and mem_cache/radix_cache.py RadixKey.match), and
invariants (hypothesis).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.simulate.costs import Hardware, RooflineCost, attended_pairs
from kvtool.simulate.sglang.radix_cache import RadixCache
from kvtool.simulate.sglang.scheduler import SglangConfig, SglangEngine, simulate_sglang

# A GPU and model with round figures: weights 1 GB at 1 TB/s (1 ms a step), KV 100 kB per token (0.1 us to read
# one), 1e9 parameters at 100 TFLOP/s (20 us per token), 2 layers x 4 heads x 8 dims (2.56e-12 s per attended pair),
# 1 ms fixed per step, no per-entry kernel term.
HW = Hardware(
    model="round",
    gpu="round",
    tp=1,
    kv_dtype="float16",
    weights_bytes_per_gpu=10**9,
    params_per_gpu=1e9,
    kv_bytes_per_token_per_gpu=10**5,
    num_layers=2,
    attention_heads_per_gpu=4,
    head_dim=8,
    bandwidth_bytes_per_s=1e12,
    peak_flops_per_s=1e14,
    step_overhead_ms=1.0,
    table_entry_us=0.0,
    kv_budget_bytes_per_gpu=10**10,
    max_num_batched_tokens=8192,
    max_num_seqs=256,
    batch_defaults=None,  # type: ignore[arg-type]
    sources=(),
)
PROMPT = list(range(1, 101))  # 100 tokens


def test_attended_pairs_closed_form():
    """Causal attention: a chunk of n after c tokens attends sum_{i=1..n} (c + i) = n c + n (n + 1) / 2 pairs."""
    for c, n in ((0, 1), (0, 100), (99, 1), (37, 12)):
        assert attended_pairs(c, n) == sum(c + i for i in range(1, n + 1))


def test_one_request_step_times_by_hand_page1():
    """One 100-token prompt, 3 outputs, page 1: prefill then two decodes.

    prefill: 100 tokens, 100 entries, 100 x 101 / 2 = 5,050 pairs.  memory 1 ms + 100 x 0.1 us = 1.01 ms; compute
      100 x 20 us + 5,050 x 2.56e-12 s (12.928 ns) = 2.000012928 ms: compute-bound, 3.000012928 ms.
    decode 1: 1 token after 100, 101 entries, 101 pairs: memory 1 ms + 10.1 us = 1.0101 ms > compute 20.0003 us:
      1 + 1.0101 = 2.0101 ms.   decode 2: 102 entries: 2.0102 ms.
    TTFT = 3.000012928 ms, TPOT = (2.0101 + 2.0102) / 2 = 2.01015 ms, span = 7.020312928 ms, 3 outputs / span."""
    r = simulate_sglang([PROMPT], [3], SglangConfig(pool_tokens=1000), cost=RooflineCost(HW, 1))
    t1, t2, t3 = 3.000012928e-3, 2.0101e-3, 2.0102e-3
    assert r.ttft_p50_s == pytest.approx(t1, rel=1e-12)
    assert r.tpot_p50_s == pytest.approx((t2 + t3) / 2, rel=1e-12)
    assert r.span_s == pytest.approx(t1 + t2 + t3, rel=1e-12)
    assert r.busy_s == pytest.approx(t1 + t2 + t3, rel=1e-12)
    assert r.throughput_tokens_per_s == pytest.approx(3 / (t1 + t2 + t3), rel=1e-12)
    assert r.queue_delay_p50_s == 0.0


def test_one_request_step_times_by_hand_page16():
    """The same at page 16: KV is read in whole pages.  prefill ceil(100/16) = 7 pages (memory 1 + 7 x 16 x 0.1 us
    = 1.0112 ms, still compute-bound: 3.000012928 ms); decodes ceil(101/16) = ceil(102/16) = 7 pages: 2.0112 ms each."""
    r = simulate_sglang([PROMPT], [3], SglangConfig(pool_tokens=1000, page_size=16), cost=RooflineCost(HW, 16))
    assert r.ttft_p50_s == pytest.approx(3.000012928e-3, rel=1e-12)
    assert r.tpot_p50_s == pytest.approx(2.0112e-3, rel=1e-12)


def test_idle_engine_waits_for_the_next_arrival():
    """The same prompt again at t = 1 s, long after the first finished (7.02 ms): it waits for no one, its match is
    the prompt less its last token (99 tokens), so its prefill is 1 token after 99 with 100 entries and 100 pairs:
    memory 1 ms + 10 us beats compute 20 us: 2.01 ms, its TTFT.  Span 1 s + 2.01 + 2.0101 + 2.0102 ms."""
    r = simulate_sglang(
        [PROMPT, PROMPT], [3, 3], SglangConfig(pool_tokens=1000), arrival_s=[0.0, 1.0], cost=RooflineCost(HW, 1)
    )
    assert r.first_cached_prompt_tokens == 99
    assert r.ttft_p50_s == pytest.approx((3.000012928e-3 + 2.01e-3) / 2, rel=1e-12)  # median of two
    assert r.span_s == pytest.approx(1.0 + 2.01e-3 + 2.0101e-3 + 2.0102e-3, rel=1e-12)
    assert r.busy_s == pytest.approx(
        3.000012928e-3 + 2.0101e-3 + 2.0102e-3 + 2.01e-3 + 2.0101e-3 + 2.0102e-3, rel=1e-12
    )


def test_prefill_batch_holds_only_the_admitted_chunks():
    """SGLang runs prefill and decode batches apart (no mixed chunk by default): a request arriving while another
    decodes gets a prefill step of its own, and the decoder waits one step.  A (100 tokens, 3 outputs) at 0; B
    (another 100 tokens, 1 output) at 4 ms, after A's prefill (3.000012928 ms) and during A's first decode (ends
    5.010112928 ms).  Then B's prefill (3.000012928 ms: 100 tokens, none cached) ends at 8.010125856 ms: B's TTFT
    is 8.010125856 - 4 = 4.010125856 ms; A's second decode follows (2.0102 ms)."""
    other = list(range(1000, 1100))
    r = simulate_sglang(
        [PROMPT, other], [3, 1], SglangConfig(pool_tokens=1000), arrival_s=[0.0, 4e-3], cost=RooflineCost(HW, 1)
    )
    a_ttft, b_ttft = 3.000012928e-3, 8.010125856e-3 - 4e-3
    assert r.ttft_p50_s == pytest.approx((a_ttft + b_ttft) / 2, rel=1e-12)
    assert r.span_s == pytest.approx(8.010125856e-3 + 2.0102e-3, rel=1e-12)
    assert (r.steps, r.prefill_steps) == (4, 2)


def _token_trace(tmp_path, rows):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_vllm_block16_and_sglang_page1_hits_differ_as_their_units_predict(tmp_path):
    """Four requests, each a 40-token shared prefix [1..40] then 10 tokens of its own, 2 outputs, 10 s apart (each
    runs alone; both pools 10,000 tokens).  The first finds nothing.  Each later one:
    - vLLM, block 16: the first request's full blocks [1..16], [17..32] match; [33..48] holds 8 of its own tokens,
      so 32 tokens (at most prompt - 1 = 49);
    - SGLang, page 1: its radix match on prompt[:-1] stops at the first own token: 40 tokens;
    - SGLang, page 16: the 40 common tokens rounded down to whole pages: 32, as vLLM's block 16.
    Totals 3 x 32 = 96, 3 x 40 = 120 and 96: the page-1 engine hits 3 x (40 - 32) = 24 tokens more."""
    rows = [
        {"prompt_token_ids": list(range(1, 41)) + [1000 * (i + 1) + k for k in range(10)], "max_tokens": 2,
         "arrival_s": 10.0 * i}
        for i in range(4)
    ]  # fmt: skip
    result = CliRunner().invoke(
        app,
        [
            "simulate", "--trace", str(_token_trace(tmp_path, rows)), "--engine", "vllm,sglang", "--kv-tokens",
            "10000", "--block-size", "16", "--page-size", "1,16", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = {(r["engine"], r["unit_tokens"]): r for r in json.loads(result.stdout)["runs"]}
    assert set(runs) == {("vllm", 16), ("sglang", 1), ("sglang", 16)}
    hits = {k: r["cached_prompt_tokens"] for k, r in runs.items()}
    assert hits == {("vllm", 16): 96, ("sglang", 1): 120, ("sglang", 16): 96}
    assert hits[("sglang", 1)] - hits[("vllm", 16)] == 3 * (40 - 32)
    assert runs[("sglang", 1)]["prefix_hit_rate"] == pytest.approx(120 / 200)
    assert runs[("vllm", 16)]["prefix_hit_rate"] == pytest.approx(96 / 200)
    # vLLM's usable pool: 10,000 // 16 = 625 blocks less the null block, x 16; SGLang's: 10,000 in whole pages
    assert {k: r["pool_tokens"] for k, r in runs.items()} == {
        ("vllm", 16): 9984,
        ("sglang", 1): 10000,
        ("sglang", 16): 10000,
    }
    for r in runs.values():
        assert r["completed"] == 4 and r["preemptions"] == 0
        assert r["ttft_p50_s"] > 0 and r["tpot_p50_s"] > 0 and r["throughput_tokens_per_s"] > 0


def test_side_by_side_table_and_sizing(tmp_path):
    """Without --kv-tokens each engine's pool is kvtool estimate's for the model on the GPU: vLLM's KV budget in
    blocks (kvtool estimate --json kv_cache_tokens, less the null block), SGLang's max_total_num_tokens (kvtool
    estimate --engine sglang --json); max running requests and chunk sizes are each engine's default there."""
    runner = CliRunner()
    base = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb"]
    sim = runner.invoke(app, ["simulate", "--dist", "fixed", "--length", "600", "--requests", "20", *base,
                              "--engine", "vllm,sglang", "--json"])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    runs = {r["engine"]: r for r in json.loads(sim.stdout)["runs"]}
    est = json.loads(runner.invoke(app, ["estimate", *base, "--engine", "vllm,sglang", "--json"]).stdout)
    sg, vl = est["sglang"], est["vllm"]
    assert runs["sglang"]["pool_tokens"] == sg["max_total_num_tokens"]
    assert runs["sglang"]["max_running_requests"] == sg["max_running_requests"]
    assert runs["sglang"]["batch_tokens"] == sg["chunked_prefill_size"]
    assert runs["vllm"]["unit_tokens"] == 16
    assert runs["vllm"]["pool_tokens"] == vl["kv_cache_tokens"] // 16 * 16 - 16
    assert runs["vllm"]["max_running_requests"] == vl["max_num_seqs"]
    table = runner.invoke(app, ["simulate", "--dist", "fixed", "--length", "600", "--requests", "20", *base,
                                "--engine", "vllm,sglang"])  # fmt: skip
    assert table.exit_code == 0, table.output
    for text in ("vLLM block 16", "SGLang page 1", "prefix hit", "TTFT p99", "TPOT p50", "preemptions / retractions"):
        assert text in table.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page-size", "4"], "--page-size is SGLang's"),
        (["--engine", "sglang", "--plot", "."], "--plot runs vLLM's simulation only"),
        (["--engine", "vllm,sglang", "--replicas", "2"], "--replicas runs vLLM's simulation only"),
        (["--engine", "sglang", "--no-prefix-cache"], "always runs the radix cache"),
        (["--engine", "tgi"], "--engine takes vllm, sglang or vllm,sglang"),
        (["--engine", "sglang", "--page-size", "0"], "page sizes must be positive integers"),
        (["--engine", "sglang", "--schedule-policy", "random"], "--schedule-policy must be one of fcfs, lpm"),
    ],
)
def test_engine_option_errors(argv, message):
    result = CliRunner().invoke(app, ["simulate", "--dist", "fixed", "--length", "100", "--requests", "3", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_api_engines_equal_the_cli(tmp_path):
    import kvtool.api

    rows = [{"prompt_token_ids": list(range(1, 41)) + [1000 * (i + 1)], "max_tokens": 3} for i in range(3)]
    trace = _token_trace(tmp_path, rows)
    cli = CliRunner().invoke(
        app, ["simulate", "--trace", str(trace), "--engine", "vllm,sglang", "--kv-tokens", "4096", "--json"]
    )
    result = kvtool.api.simulate(trace, engine="vllm,sglang", kv_tokens=4096)
    assert result.to_dict() == json.loads(cli.stdout)
    assert list(result.table.index) == [("vllm", 16), ("sglang", 1)]
    alone = kvtool.api.simulate(trace, engine="sglang", kv_tokens=4096, page_size=[1, 4])
    assert list(alone.table.index) == [1, 4]


# --------------------------------------------------------------------------------------------------- invariants
@given(
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=10), min_size=1, max_size=8),
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=10), min_size=1, max_size=8),
    st.sampled_from([1, 2, 4]),
)
def test_radix_size_and_match_len_agree_with_walks(inserts, matches, page):
    """The kept size equals the tree walked (total_size); the sliced match length equals the token loop's."""
    cache = RadixCache(page)
    locked = []
    for tokens in inserts:
        cache.insert(tokens)
        assert cache.size == cache.total_size()
    for tokens in matches:
        n, node = cache.match_prefix(tokens)
        assert n % page == 0 and n <= len(tokens)
        if len(locked) < 3:
            cache.inc_lock_ref(node)
            locked.append(node)
        assert cache.size == cache.total_size()
    cache.evict(5)
    assert cache.size == cache.total_size()
    for node in locked:
        cache.dec_lock_ref(node)
    cache.evict(10**6)
    assert cache.size == cache.total_size() == 0
    for a in inserts:
        for b in matches:
            key = tuple(b)
            loop = 0
            for x, y in zip(a, key):
                if x != y:
                    break
                loop += 1
            assert cache._match_len(tuple(a), key, 0) == loop // page * page


class _PerRequestDecode(SglangEngine):
    """The decode allocation request by request, as ``_alloc(req, 1)`` does it: the reference of the bulk one."""

    def _alloc_decode(self) -> None:
        for _ in self.running:
            short = 1 - self.available()
            if short > 0:
                self.evicted += self.tree.evict(short)[0]
            self.owned_tokens += 1
            self.peak = max(self.peak, self.used())


_workload = st.lists(
    st.tuples(st.lists(st.integers(1, 3), min_size=1, max_size=24), st.integers(1, 12)), min_size=1, max_size=10
)


@settings(max_examples=150, deadline=None)
@given(_workload, st.sampled_from([1, 2, 4]), st.integers(40, 200), st.integers(1, 4), st.sampled_from([4, 8, None]))
def test_engine_invariants(work, page, pool, running, chunk):
    """On any small workload: every request finishes; the pool is never overfull; hits are whole pages and at most
    prompt - 1 tokens each; the step-time model does not change an offline batch's decisions; latencies are
    ordered; the bulk decode allocation is the request-by-request one."""
    prompts = [w[0] for w in work]
    max_new = [w[1] for w in work]
    if any(len(p) + m > pool for p, m in zip(prompts, max_new)):
        return
    config = SglangConfig(
        pool_tokens=pool, page_size=page, max_running_requests=running, chunked_prefill_size=chunk and chunk * page
    )
    try:
        plain = simulate_sglang(prompts, max_new, config)
    except ValueError:  # an empty engine that cannot admit its head request: refused, not looped
        return
    timed = simulate_sglang(prompts, max_new, config, cost=RooflineCost(HW, page))
    reference = _PerRequestDecode(config).run(prompts, max_new)
    counts = ("steps", "prefill_steps", "cached_prompt_tokens", "evicted_tokens", "retractions", "peak_used_tokens")
    for name in counts:
        assert getattr(plain, name) == getattr(timed, name) == getattr(reference, name), name
    assert plain.finished_requests == len(prompts)
    assert plain.peak_used_tokens <= pool
    assert plain.first_cached_prompt_tokens % page == 0
    assert plain.first_cached_prompt_tokens <= sum(len(p) - 1 for p in prompts)
    assert plain.ttft_p50_s is None  # no cost, no times
    assert timed.ttft_p50_s is not None and timed.ttft_p50_s > 0
    assert timed.ttft_p99_s >= timed.ttft_p50_s
    assert timed.span_s == pytest.approx(timed.busy_s)  # all arrive at 0: the engine never idles
    if timed.tpot_p50_s is not None:
        assert timed.tpot_p50_s > 0 and math.isfinite(timed.tpot_p50_s)


@settings(max_examples=60, deadline=None)
@given(_workload, st.lists(st.floats(0, 0.05), min_size=10, max_size=10))
def test_arrivals_only_delay(work, gaps):
    """With arrivals, no request is admitted before it arrives; time in steps never exceeds the span."""
    prompts = [w[0] for w in work]
    max_new = [w[1] for w in work]
    arrivals = sorted(gaps[: len(prompts)])
    engine = SglangEngine(SglangConfig(pool_tokens=400), RooflineCost(HW, 1))
    r = engine.run(prompts, max_new, arrivals)
    assert r.finished_requests == len(prompts)
    for i, t in enumerate(arrivals):
        assert engine.admit_s[i] >= t
        assert engine.first_token_s[i] > engine.admit_s[i]
        assert engine.finish_s[i] >= engine.first_token_s[i]
    assert r.busy_s <= r.span_s + 1e-12 + arrivals[0]
    assert r.queue_delay_p50_s >= 0
