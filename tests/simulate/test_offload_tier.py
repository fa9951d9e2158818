"""The CPU tier of vLLM 0.32's native offloading behind the simulator's prefix cache (kvtool/simulate/offload_tier.py).

Closed forms are counted by hand from vLLM 0.32.0's rules as the module docstring cites them (prepare_store's
eviction, LRUCachePolicy's recency set at insert and at the request's finish, tail first; the lookup after the GPU
hit, up to num_tokens).  The engines below take one request a step (max_num_seqs 1, one output token), so every
request is admitted, prefilled and finished in one step: request t's blocks are stored at step t and their recency is
refreshed at step t + 1, after request t + 1's stores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtool.simulate.offload_tier import CpuTier
from kvtool.simulate.scheduler import EngineConfig, Prompt, run_engine

DATA = Path(__file__).parent.parent / "data" / "simulate"
MOONCAKE = DATA / "mooncake-conversation-head40.jsonl"
MOONCAKE_400 = DATA / "mooncake-conversation-head400.jsonl"  # reuse at distances past a small GPU pool
B = 16  # block size


def _round_robin(k: int, blocks: int, rounds: int, tail: int = 1) -> list[Prompt]:
    """Request t carries shared prefix t mod k of ``blocks`` full blocks, then ``tail`` private tokens."""
    return [Prompt(blocks * B + tail, ((f"prefix{t % k}", blocks * B),)) for t in range(k * rounds)]


def _run(prompts, num_blocks, tier):
    config = EngineConfig(num_blocks=num_blocks, block_size=B, max_num_seqs=1)
    return run_engine(config, prompts, [1] * len(prompts), tier=tier)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_one_block_prefixes_round_robin_all_hit_once_the_tier_holds_them_all(k):
    # K prefixes of one block each, requested round robin; the GPU pool (3 blocks: 2 usable, what one request of
    # 17 tokens needs) keeps none of them from one request to the next, so every hit is the tier's.  With C >= K
    # blocks nothing is ever evicted: every request after the first round loads its block, (rounds - 1) x K x 16
    # tokens.  With C = 1 the tier holds only the previous request's block (each store evicts the one before),
    # another prefix: no hit; with C = 0 nothing is stored.
    rounds = 4
    prompts = _round_robin(k, 1, rounds)
    for capacity in (0, 1, k, k + 1, 10 * k):
        tier = CpuTier(capacity)
        run = _run(prompts, 3, tier)
        expected = [0] * k + [B] * (k * (rounds - 1)) if capacity >= k else [0] * (k * rounds)
        assert run.num_external_cached_tokens == expected, capacity
        assert run.cpu_hit_tokens == sum(expected)
        assert run.hit_tokens == 0  # no GPU hit at all
        if capacity >= k:
            assert tier.stored_blocks == k and tier.evicted_blocks == 0


def test_three_prefixes_in_two_cpu_blocks_hit_every_other_request_by_hand():
    # K = 3 one-block prefixes p0 p1 p2 round robin, C = 2 < K.  A plain LRU would never hit; in vLLM the finished
    # request's refresh (on_request_finished) comes after the next request's store (both in build_connector_meta),
    # so the block just stored is the one evicted next.  LRU after each step, oldest first:
    #   1 p0 miss, store                      -> p0
    #   2 p1 miss, store; refresh p0          -> p1 p0
    #   3 p2 miss, store evicting p1          -> p0 p2
    #   4 p0 HIT;  refresh p2                 -> p0 p2
    #   5 p1 miss, store evicting p0          -> p2 p1
    #   6 p2 HIT;  refresh p1                 -> p2 p1
    #   7 p0 miss, store evicting p2          -> p1 p0
    #   8 p1 HIT, and so on: every other request from the fourth on
    prompts = _round_robin(3, 1, 4)
    run = _run(prompts, 3, CpuTier(2))
    assert run.num_external_cached_tokens == [0, 0, 0, B, 0, B, 0, B, 0, B, 0, B]


def test_two_block_prefixes_in_three_cpu_blocks_hit_their_head_block_by_hand():
    # K = 2 prefixes (A: a0 a1, B: b0 b1) of two blocks, C = 3 < K x B.  A plain LRU would never hit; vLLM's
    # refresh at the finish goes tail to head, so the head block outlives the tail and is hit alone.  LRU after each
    # step (oldest first), by hand:
    #   1 A: miss; store a0 a1                                -> a0 a1
    #   2 B: miss; store b0 b1 evicting a0; refresh A (a1)    -> b0 b1 a1
    #   3 A: miss; store a0 evicting b0; refresh B (b1)       -> a1 a0 b1
    #   4 B: miss; store b0 evicting a1; refresh A (a0)       -> b1 b0 a0
    #   5 A: a0 hit, a1 miss: loads 1 block; store a1 evicting b1; refresh B (b0)   -> a0 a1 b0
    #   6 B: b0 hit: loads 1; store b1 evicting a0; refresh A (a1)                  -> b0 b1 a1
    #   7 A: miss; store a0 evicting b0; refresh B (b1)       -> a1 a0 b1 (as after step 3)
    #   8 B: as step 4: miss
    prompts = _round_robin(2, 2, 4)
    tier = CpuTier(3)
    run = _run(prompts, 4, tier)  # 3 usable GPU blocks: one request of 33 tokens
    assert run.num_external_cached_tokens == [0, 0, 0, 0, B, B, 0, 0]
    assert run.hit_tokens == 0
    assert tier.loaded_blocks == 2
    # stores: 2 + 2 + 1 + 1 + 1 + 1 + 1 + 1; each store past the first two evicted one block
    assert tier.stored_blocks == 10 and tier.evicted_blocks == 7


def test_a_repeated_block_aligned_prompt_hits_its_last_block_on_the_cpu_tier():
    # A prompt of exactly 4 blocks, twice, with a GPU pool large enough to keep it.  The GPU hit stops one token
    # short (get_computed_blocks: at most num_tokens - 1 tokens, so 3 blocks); the connector's lookup goes up to
    # num_tokens (no sliding-window group) and finds block 3 in the tier, so num_cached_tokens (prefill_stats:
    # local + external) is the whole prompt, 64 tokens, and the last token is computed again.
    prompts = [Prompt(4 * B, (("p", 4 * B),))] * 2
    plain = _run(prompts, 64, None)
    assert plain.num_cached_tokens == [0, 3 * B]
    tier = CpuTier(8)
    run = _run(prompts, 64, tier)
    assert run.num_cached_tokens == [0, 4 * B]
    assert run.num_external_cached_tokens == [0, B]
    assert run.hit_tokens == 3 * B and run.cpu_hit_tokens == B


def test_a_prompt_larger_than_the_tier_is_never_stored():
    # prepare_store returns None when the blocks to store exceed the tier (nothing to evict): 5 blocks offered at
    # once to a tier of 4, at every step and at the finish; nothing is stored and nothing hits.
    prompts = [Prompt(5 * B + 1, (("p", 5 * B),)), Prompt(B + 1, (("q", B),))] * 2
    tier = CpuTier(4)
    run = _run(prompts, 7, tier)
    assert tier.failed_offers >= 2
    # only q's block is stored; it is hit by the fourth request (the GPU pool of 6 usable blocks was taken by p)
    assert tier.stored_blocks == 1
    assert run.num_external_cached_tokens == [0, 0, 0, B]


def _mooncake(path=MOONCAKE_400):
    from kvtool.simulate.lengths import load_trace
    from kvtool.simulate.workloads import build_prompts

    reqs = load_trace(path)
    return build_prompts(reqs, 0, 0.0, 0), reqs.output_tokens.tolist(), reqs.arrival_s.tolist()


def test_a_tier_of_no_blocks_changes_nothing_on_the_mooncake_trace():
    # vLLM with num_chunks 0: every prepare_store returns None, every lookup misses; the run is the plain one,
    # request by request
    prompts, outputs, _ = _mooncake(MOONCAKE)
    config = EngineConfig(num_blocks=600, block_size=B, max_num_seqs=8)  # preempts, and leaves long requests out
    plain = run_engine(config, prompts, outputs)
    tiered = run_engine(config, prompts, outputs, tier=CpuTier(0))
    assert plain.preemptions > 0
    assert tiered.num_cached_tokens == plain.num_cached_tokens
    # -1 where a request never ran (too long for the 600-block pool), 0 elsewhere
    assert tiered.num_external_cached_tokens == [0 if c >= 0 else -1 for c in plain.num_cached_tokens]
    assert tiered.finish_step == plain.finish_step and tiered.num_preemptions == plain.num_preemptions
    assert tiered.admit_step == plain.admit_step and tiered.first_token_step == plain.first_token_step


def test_the_curve_does_not_fall_as_the_tier_grows_on_the_mooncake_trace():
    # a property of this trace under the model (LRU with vLLM's refresh has no inclusion guarantee in general):
    # prompt-token hits at first admission, GPU and CPU together, never fall as the tier grows, and a tier as
    # large as every prompt block of the trace leaves no block evicted
    prompts, outputs, arrival_s = _mooncake()
    config = EngineConfig(num_blocks=8000, block_size=B, max_num_seqs=16)
    total_blocks = sum(p.tokens // B for p in prompts)
    hits = []
    for capacity in (0, 16000, 64000, total_blocks):
        tier = CpuTier(capacity)
        run = run_engine(config, prompts, outputs, arrival_s, tier=tier)
        hits.append(sum(run.num_cached_tokens))
        if capacity == total_blocks:
            assert tier.evicted_blocks == 0
    assert hits == sorted(hits)
    assert hits[-1] > 3 * hits[0]  # the tier finds what the 8,000-block GPU pool lost


# ---------------------------------------------------------------------------------------------------- the command
def _json(run_cli, *args):
    result = run_cli("simulate", *map(str, args), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_cpu_blocks_are_kvtool_estimates_figure(run_cli):
    # Llama-2-7B: 32 layers x 2 (K, V) x 32 heads x 128 x 2 B = 524,288 B per token, so a 16-token block is
    # 8,388,608 B (a multiple of the 4 KiB page) and 8 GiB hold 8 x 2**30 / 2**23 = 1,024 blocks, 16,384 tokens;
    # at block 32 half the blocks and the same tokens
    out = _json(
        run_cli, "--trace", MOONCAKE, "--serve", "--kv-tokens", 200000, "--block-size", "16,32",
        "--kv-offloading-size", "0,8",
    )  # fmt: skip
    points = out["offload_curve"]["points"]
    got = [(p["block_size"], p["kv_offloading_size_gib"], p["cpu_kv_blocks"], p["cpu_kv_tokens"]) for p in points]
    assert got == [(16, 0.0, 0, 0), (16, 8.0, 1024, 16384), (32, 0.0, 0, 0), (32, 8.0, 512, 16384)]
    est = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "h100", "--kv-offloading-size", "8", "--json")
    assert json.loads(est.stdout)["cpu_kv_blocks"] == 1024
    for p in points:  # the JSON's hit figures add up
        assert p["gpu_hit_tokens"] + p["cpu_hit_tokens"] == round(p["hit_rate"] * p["prompt_tokens"])


def test_size_zero_of_the_curve_is_the_plain_simulation(run_cli):
    out = _json(run_cli, "--trace", MOONCAKE, "--serve", "--kv-tokens", 40000, "--block-size", 16,
                "--kv-offloading-size", 0)  # fmt: skip
    (point,) = out["offload_curve"]["points"]
    (plain,) = out["results"]
    assert point["cpu_hit_tokens"] == 0
    assert point["gpu_hit_tokens"] == plain["cached_prompt_tokens"]
    assert point["ttft_p50_change_s"] == 0 and point["ttft_p99_change_s"] == 0


def test_the_table_prints_the_curve_first(run_cli):
    result = run_cli("simulate", "--trace", str(MOONCAKE), "--serve", "--kv-tokens", "40000", "--block-size", "16",
                     "--kv-offloading-size", "0,4")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("Prefix hits against the CPU tier's size")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-offloading-size", "4"], "--kv-offloading-size applies to the serving simulation: add --serve"),
        (["--serve", "--kv-offloading-size", "4,x"], "--kv-offloading-size takes GiB as a number or a comma list"),
        (["--serve", "--kv-offloading-size", "-1"], "--kv-offloading-size must be 0 (no CPU tier) or more GiB"),
        (["--serve", "--no-prefix-cache", "--kv-offloading-size", "4"], "needs --prefix-cache"),
        (["--serve", "--split-pools", "4000", "--kv-offloading-size", "4"], "one CPU tier behind split pools"),
        (["--serve", "--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"], "does not model LMCache"),
        (["--serve", "--kv-offloading-size", "4", "--vllm-version", "0.11.0"], "has no --kv-offloading-size"),
        (["--serve", "--kv-offloading-size", "4", "--model", "gemma-2-9b"], "full-attention models only"),
        (["--serve", "--kv-offloading-size", "4", "--h2d-bandwidth-gb-s", "0"], "--h2d-bandwidth-gb-s must be"),
    ],
)
def test_what_is_not_modelled_is_refused_in_one_line(run_cli, args, message):
    result = run_cli("simulate", "--trace", str(MOONCAKE), "--kv-tokens", "200000", "--block-size", "16", *args)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
