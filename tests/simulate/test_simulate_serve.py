"""The simulated vLLM scheduler against scenarios worked out by hand from vLLM 0.32's scheduler source
(vllm/v1/core/sched/scheduler.py, kv_cache_manager.py, block_pool.py) and the roofline cost by hand; the fast path
against the plain step-by-step loop is in test_decode_group.py."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import UsageError
from kvtool.simulate.costs import CostOverrides, RooflineCost, pool_blocks, resolve_hardware
from kvtool.simulate.lengths import load_trace
from kvtool.simulate.scheduler import EngineConfig, Prompt, run_engine
from kvtool.simulate.workloads import build_prompts


class OneMs:
    """Every step takes exactly 1 ms."""

    def time_s(self, tokens, requests, entries, pairs):
        return 1e-3

    def decode_coefficients(self, requests):
        return (1e-3, 0.0, 0.0, 0.0, 0.0, 0.0)


def engine(num_blocks, b, **kw):
    return EngineConfig(num_blocks=num_blocks, block_size=b, **kw)


def test_one_request_by_hand():
    # Prompt 40, 3 outputs, b 16: step 1 prefills all 40 tokens (3 blocks) and samples output 1; steps 2 and 3
    # decode; it finishes at step 3 holding 42 tokens of KV (3 blocks).
    run = run_engine(engine(10, 16), [Prompt(40)], [3], cost=OneMs())
    assert run.first_token_step == [1] and run.finish_step == [3]
    assert run.finish_s == [pytest.approx(0.003)] and run.first_token_s == [pytest.approx(0.001)]
    assert run.peak_blocks == 3 and run.preemptions == 0 and run.num_cached_tokens == [0]


def test_chunked_prefill_within_the_token_budget():
    # max_num_batched_tokens 32: a 100-token prompt is prefilled in chunks of 32, 32, 32, 4 (steps 1-4); the
    # first token comes out of step 4, the second out of step 5.
    run = run_engine(engine(20, 16, max_num_batched_tokens=32), [Prompt(100)], [2])
    assert run.first_token_step == [4] and run.finish_step == [5]


def test_decodes_share_the_budget_with_a_prefill_chunk():
    # Budget 8: A (prompt 4) prefills at step 1; B (prompt 20) gets the 4 tokens left at step 1.  Step 2: A's
    # decode takes 1, B gets 7 (11 of 20); step 3: A 1, B 7 (18); step 4: A 1, B the last 2 -> B's first token.
    run = run_engine(engine(20, 16, max_num_batched_tokens=8), [Prompt(4), Prompt(20)], [10, 2])
    assert run.first_token_step == [1, 4]


def test_long_prefill_threshold_caps_chunks_only_with_company():
    # long_prefill_token_threshold 16: alone, a 64-token prompt takes the whole budget (vLLM drops the cap when
    # only one request is running or waiting): first token at step 1.  With a second request waiting, chunks of 16.
    alone = run_engine(engine(20, 16, long_prefill_token_threshold=16), [Prompt(64)], [1])
    assert alone.first_token_step == [1]
    pair = run_engine(engine(40, 16, long_prefill_token_threshold=16), [Prompt(64), Prompt(64)], [1, 1])
    assert pair.first_token_step == [4, 4]


def test_preemption_of_the_newest_request_by_hand():
    # 5 blocks (one is the null block) of 4 tokens; A and B: prompt 4, 9 outputs; 1 ms steps.  Step 1 prefills
    # both (1 block each); step 2 gives each its 2nd block; steps 3-5 fill them (8 tokens).  Step 6: A needs a
    # 3rd block, none is free: B (last admitted) is preempted; its 2 cached blocks go to the LRU end and A takes
    # B's block 1 (tail first).  B waits: it needs ceil(9/4) = 3 blocks less its cached block 0, plus that block
    # taken off the free queue: 3 > 1 free until A finishes at step 9.  Step 10: B resumes with a 4-token hit
    # (its own block 0), recomputes tokens 4-8 and samples output 6; outputs 7-9 at steps 11-13.
    a_b = [Prompt(4), Prompt(4)]
    run = run_engine(engine(5, 4), a_b, [9, 9], cost=OneMs())
    assert run.finish_step == [9, 13]
    assert run.num_preemptions == [0, 1] and run.preemptions == 1
    assert run.num_cached_tokens == [0, 0]  # the first admission's hit; the resumption's 4 tokens do not count
    assert run.hit_tokens == 4
    assert run.finish_s == [pytest.approx(0.009), pytest.approx(0.013)]


def test_prefix_hits_cover_full_blocks_and_never_the_last_token():
    # b 16, max_num_seqs 1 (one after another, so the cache is warm): 64 shared tokens + private tails.  The
    # second prompt hits the 4 full shared blocks: 64 tokens.  A prompt of exactly the 64 shared tokens hits
    # only 48: vLLM recomputes the last token, so at most num_tokens - 1 = 63 tokens, 3 full blocks.
    shared = [("system", 64)]
    prompts = [Prompt(100, shared), Prompt(80, shared), Prompt(64, shared)]
    run = run_engine(engine(40, 16, max_num_seqs=1), prompts, [2, 2, 2])
    assert run.num_cached_tokens == [0, 64, 48]


def test_a_variant_last_token_breaks_the_match_from_its_block_on():
    # A 128-token system prompt, b 32: the plain prompts hit 128 tokens (4 blocks); a variant whose last system
    # token differs (a trailing whitespace) shares blocks 0-2 only: 96 tokens.
    plain = [("system", 128)]
    variant = [("system", 127), ("system-ws", 1)]
    prompts = [Prompt(300, plain), Prompt(300, plain), Prompt(300, variant)]
    run = run_engine(engine(60, 32, max_num_seqs=1), prompts, [2, 2, 2])
    assert run.num_cached_tokens == [0, 128, 96]


def test_freed_blocks_stay_cached_until_evicted_lru():
    # 7 usable blocks of 16, one request at a time, one output each.  A (48 shared tokens + 1) holds 4 blocks and
    # frees them tail first: its partial block 3 (no hash) to the front of the free queue, its full blocks 2, 1, 0
    # to the LRU end.  B (96 private tokens) needs 6 blocks: the 4 unhashed ones, then the 2 oldest cached, A's
    # blocks 2 and 1.  C (48 shared + 1) hits only A's block 0: 16 tokens, and takes its 3 other blocks from B's
    # freed (cached) blocks: 5 evictions in all.
    shared = [("s", 48)]
    prompts = [Prompt(49, shared), Prompt(96), Prompt(49, shared)]
    run = run_engine(engine(8, 16, max_num_seqs=1), prompts, [1, 1, 1])
    assert run.num_cached_tokens == [0, 0, 16]
    assert run.evictions == 5


def test_requests_that_can_never_fit_are_left_out():
    run = run_engine(engine(4, 16), [Prompt(100), Prompt(10)], [1, 1])  # 3 usable blocks = 48 tokens
    assert run.finish_step == [-1, 1]


def test_prompts_of_max_model_len_or_more_are_refused():
    # vLLM 0.32's InputProcessor._validate_model_input refuses a prompt longer than max_model_len, and one of exactly
    # max_model_len ("plus the number of requested output tokens (at least 1) is longer than the maximum model
    # length"): such requests never reach the scheduler.  A prompt of max_model_len - 1 runs and stops after one
    # token (check_stop: num_tokens >= max_model_len).
    run = run_engine(engine(100, 16, max_model_len=64), [Prompt(70), Prompt(64), Prompt(63), Prompt(10)], [5] * 4)
    assert run.finish_step == [-1, -1, 1, 5]
    assert run.admit_s[0] != run.admit_s[0] and run.admit_s[1] != run.admit_s[1]  # nan: never admitted


def test_arrivals_join_at_the_next_step_boundary():
    # 1 ms steps: B arrives at 2.5 ms while A decodes; it is admitted at the step starting at 3 ms.
    run = run_engine(engine(20, 16), [Prompt(10), Prompt(10)], [10, 1], [0.0, 0.0025], cost=OneMs())
    assert run.admit_s == [0.0, pytest.approx(0.003)]
    assert run.first_token_s[1] == pytest.approx(0.004)


# --------------------------------------------------------------------------- costs


def test_roofline_step_time_by_hand():
    # Llama-2-7B FP16 on an H100-80GB through estimate's resolution: 6,738,415,616 parameters, 13,476,831,232
    # weight bytes (2 bytes each), 524,288 KV bytes per token (2 x 32 layers x 32 heads x 128 x 2 B).  H100 SXM
    # datasheet: 3,350 GB/s, 989.4 TFLOP/s dense FP16 (profiles/gpus/h100-80gb.yaml).  One decode with 100 tokens of context at block 16 (7 entries):
    # memory (13,476,831,232 + 524,288 x 16 x 7) / 3.35e12 s; compute 2 x 6.738e9 / 989e12 (smaller);
    # plus 1 ms overhead and 7 x 0.17 us.
    hw = resolve_hardware(model="llama-2-7b", config=None, gpu="h100")
    assert hw.weights_bytes_per_gpu == 13_476_831_232 and hw.kv_bytes_per_token_per_gpu == 524_288
    cost = RooflineCost(hw, 16)
    want = 1e-3 + (13_476_831_232 + 524_288 * 16 * 7) / 3.35e12 + 7 * 0.17e-6
    assert cost.time_s(1, 1, 7, 100.5) == pytest.approx(want, rel=1e-12)
    # a big prefill is compute-bound: 8,192 tokens
    flops = 2 * 6_738_415_616 * 8192 + 4 * 32 * 32 * 128 * (8192 * 8193 / 2)
    assert cost.time_s(8192, 1, 512, 8192 * 8193 / 2) == pytest.approx(1e-3 + flops / 989.4e12 + 512 * 0.17e-6)


def test_overrides_replace_every_constant():
    hw = resolve_hardware(model="llama-2-7b", config=None, gpu="h100", overrides=CostOverrides(1000.0, 100.0, 0.0, 0.0))
    assert hw.bandwidth_bytes_per_s == 1e12 and hw.peak_flops_per_s == 1e14
    assert RooflineCost(hw, 16).time_s(1, 1, 0, 1) == pytest.approx(13_476_831_232 / 1e12)
    assert any("--bandwidth-gb-s" in s for s in hw.sources)


def test_pool_is_estimates_plan():
    # The serving pool is kvtool estimate's plan (one code path), for each block size.
    from kvtool.estimate.estimator import EstimateRequest, estimate

    hw = resolve_hardware(model="llama-2-7b", config=None, gpu="h100")
    for b in (16, 32):
        assert pool_blocks(hw, b) == estimate(EstimateRequest(model="llama-2-7b", gpu="h100", block_size=b)).num_blocks


def test_weights_that_do_not_fit_say_so():
    # Llama-3.1-70B in BF16 is ~141 GB: no KV room on one 80 GB GPU; estimate's suggestion (tp 4) is the tip.
    with pytest.raises(UsageError) as err:
        resolve_hardware(model="llama-3.1-70b", config=None, gpu="h100")
    assert "leave no room for a KV cache" in str(err.value) and err.value.tip.startswith("--tp 4 fits")
    assert pool_blocks(resolve_hardware(model="llama-3.1-70b", config=None, gpu="h100", tp=4), 16) > 0


# --------------------------------------------------------------------------- workloads


def test_mooncake_and_token_prompts_are_read(tmp_path):
    mc = tmp_path / "mc.jsonl"
    mc.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
                {"timestamp": 500, "input_length": 700, "output_length": 9, "hash_ids": [1, 4]},
            )
        )
    )
    reqs = load_trace(mc)
    assert reqs.prompt_tokens.tolist() == [1100, 700] and reqs.arrival_s.tolist() == [0.0, 0.5]
    prompts = build_prompts(reqs)
    # b 512: the second prompt's first block is hash id 1, shared; b 256: two blocks of it.
    run = run_engine(engine(40, 256, max_num_seqs=1), prompts, [5, 9])
    assert run.num_cached_tokens == [0, 512]
    tok = tmp_path / "tok.jsonl"
    tok.write_text(
        '{"prompt_token_ids": [1, 2, 3, 4, 5], "max_tokens": 3}\n{"prompt_token_ids": [1, 2, 3, 4, 6], "max_tokens": 2}\n'
    )
    reqs = load_trace(tok)
    run = run_engine(engine(40, 2, max_num_seqs=1), build_prompts(reqs), reqs.output_tokens.tolist())
    assert run.num_cached_tokens == [0, 4]


def test_synthetic_system_prompt_and_variants():
    import numpy as np

    from kvtool.simulate.lengths import RequestSet

    reqs = RequestSet(np.array([300, 50, 300]), np.array([1, 1, 1]), None, "test")
    prompts = build_prompts(reqs, shared_prefix_tokens=100)
    assert [p.shared for p in prompts] == [[("system", 100)], [("system", 50)], [("system", 100)]]
    prompts = build_prompts(reqs, shared_prefix_tokens=100, variant_share=1.0)
    assert prompts[0].shared == [("system", 99), (("system-variant", 0), 1)]
    assert prompts[1].shared == [("system", 50)]  # shorter than the system prompt: no variant token
