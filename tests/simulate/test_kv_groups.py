"""The group kinds of kvtool.simulate.kv_groups against vLLM 0.32's own worked examples (the docstrings of
vllm/v1/core/single_type_kv_cache_manager.py, /work/vllm-src/0.32.0), and `kvtool simulate --serve` on models whose
layers it does and does not simulate."""

from __future__ import annotations

import json

from kvtool.estimate.kinds import CHUNKED, SLIDING
from kvtool.simulate.kv_groups import NULL, ChunkedKind, GroupSpec, SlidingKind


def _sliding(window: int, block: int) -> SlidingKind:
    return SlidingKind(GroupSpec(SLIDING, 1, window, None), block)


def _chunked(chunk: int, block: int) -> ChunkedKind:
    return ChunkedKind(GroupSpec(CHUNKED, 1, chunk, None), block)


def test_sliding_skipped_tokens_docstring():
    # SlidingWindowManager.get_num_skipped_tokens: "sliding_window=4, num_computed_tokens=7 ... == 4"
    assert _sliding(4, 1).skipped_tokens(7) == 4
    assert _sliding(4, 1).skipped_tokens(3) == 0


def test_sliding_hit_docstring():
    # find_longest_cache_hit's docstring: block size 4 and sliding window 8 -> ([NULL, NULL, 7, 8]): the run of
    # cdiv(8 - 1, 4) = 2 cached blocks found from the right, the blocks before it null.
    cached = [[1], [2], [7], [8], None, None]
    assert _sliding(8, 4).longest_hit(cached, 24) == [[NULL], [NULL], [7], [8]]
    # no run of two anywhere: the leading cached run is the hit ("the first num_contiguous_blocks is a cache hit")
    assert _sliding(8, 4).longest_hit([[5], None, [6], None], 16) == [[5]]
    # max_length caps the blocks looked at (max_length // block)
    assert _sliding(8, 4).longest_hit(cached, 11) == [[1], [2]]


def test_sliding_cache_mask_keeps_the_replay_boundary_tail():
    # reachable_block_mask, retention interval 0: the cdiv(window - 1, block) blocks ending at (prompt - 1) // block;
    # window 64, block 32, a prompt of 301 tokens: boundary 300 -> block 9 -> blocks 7 and 8
    mask = _sliding(64, 32).cache_mask(0, 12, 301, 0)
    assert [i for i, keep in enumerate(mask) if keep] == [7, 8]
    # a shared-prefix junction at 128 tokens adds blocks 2 and 3
    mask = _sliding(64, 32).cache_mask(0, 12, 301, 128)
    assert [i for i, keep in enumerate(mask) if keep] == [2, 3, 7, 8]


def test_chunked_docstrings():
    # ChunkedLocalAttentionManager.get_num_skipped_tokens: chunk 8: 13 -> 8, 8 -> 8
    kind = _chunked(8, 4)
    assert kind.skipped_tokens(13) == 8 and kind.skipped_tokens(8) == 8
    # find_longest_cache_hit example 1: chunk 8, block 4, max length 15: blocks 0-1 null, block 3 hit -> 3 entries
    cached = [None, None, [3], [4]]
    assert kind.longest_hit(cached, 15) == [[NULL], [NULL], [3]]
    # ... "otherwise, we return [null, null]"
    assert kind.longest_hit([None, None, None, None], 15) == [[NULL], [NULL]]
    # example 2: max length 16: the 4 blocks before the window are null
    assert kind.longest_hit([None] * 4, 16) == [[NULL]] * 4


def test_serve_names_the_groups_and_their_hits(run_cli):
    """Mistral-7B v0.1 (profiles/models: sliding_window 4096 on every layer) runs as one sliding-window group;
    Gemma-2-9B (21 sliding + 21 global layers) as two groups of 21 layers, sliding first (layer 0 slides)."""
    trace = "tests/data/simulate/azure-2023-code-head20.csv"
    for model, groups in (
        ("mistral-7b-v0.1", ["sliding window 4096 (32 layers)"]),
        ("gemma-2-9b", ["sliding window 4096 (21 layers)", "full attention (21 layers)"]),
    ):
        res = run_cli("simulate", "--serve", "--model", model, "--gpu", "h100", "--trace", trace, "--json")
        assert res.exit_code == 0, res.stderr
        row = json.loads(res.stdout)["results"][0]
        assert row["kv_groups"] == groups
        assert len(row["group_hit_tokens"]) == len(groups)
        assert row["utilization"] is None  # not defined when a group holds only its window


def test_serve_state_layers_need_vllms_block(run_cli):
    """Qwen3-Next's Gated DeltaNet layers are state groups: simulated only at the block vLLM gives a hybrid
    (vllm 0.32 Platform._align_hybrid_block_size, through kvtool.estimate.hybrid_block.attention_block_size)."""
    res = run_cli(
        "simulate", "--serve", "--model", "qwen3-next-80b", "--gpu", "h100", "--tp", "4", "--dist", "fixed",
        "--length", "100", "--block-size", "16",
    )  # fmt: skip
    assert res.exit_code == 2
    first = res.stderr.strip().splitlines()[0]
    assert first.startswith("Error: vLLM raises a hybrid model's attention block to"), res.stderr
    assert "Traceback" not in res.stderr


def test_state_kind_rules_from_vllm_source():
    """MambaManager in 'align' mode (vllm 0.32.0 vllm/v1/core/single_type_kv_cache_manager.py), block 64, by hand:
    allocate_new_blocks grows the table to cdiv(tokens, 64) with nulls and one new block; remove_skipped_blocks
    (get_num_skipped_tokens = computed - 1) frees the blocks before the state and then last_state_block_idx;
    find_longest_cache_hit takes the rightmost cached state; reachable_block_mask (retention 0) keeps only the block
    ending at (prompt - 1) // 64 x 64; get_num_blocks_to_allocate caps new blocks at 1 and refuses (num_gpu_blocks
    + 1) a hit on a state cached in the same step."""
    from kvtool.estimate.kinds import MAMBA
    from kvtool.simulate.kv_groups import NULL, GroupSpec, MambaKind

    k = MambaKind(GroupSpec(MAMBA, 2, None, 1), 64)
    t: list[int] = []
    assert k.allocate(1, t, 128) == 1 and t == [NULL]  # 128 tokens: [null, new]
    t.append(7)
    assert k.blocks_needed(t, True, 192, [], 128, False, {}, {}, 40) == 1
    assert k.allocate(1, t, 192) == 1 and k.last_state[1] == 1
    t.append(8)  # [null, 7, 8]
    assert k.remove_skipped(1, t, 192) == [[7]] and t == [NULL, NULL, 8]  # 191 // 64 = 2 blocks skipped
    assert k.cache_mask(0, 4, 213, 0) == [False, False, True, False]  # (213 - 1) // 64 x 64 = 192: block 2
    hit = k.longest_hit([[5], None, [6], None], 256)
    assert hit == [[NULL], [NULL], [6]]  # 192 tokens: the rightmost cached state
    assert k.blocks_needed([], False, 300, [NULL, NULL, 6], 192, False, {6: 0}, {6: 99}, 40) == 1 + 1
    k.cached(99)
    assert k.blocks_needed([], False, 300, [NULL, NULL, 6], 192, False, {6: 0}, {6: 99}, 40) == 41


def test_state_kind_registers_the_prompts_last_state_again():
    """MambaManager._cache_partial_tail_block (vllm 0.32.0 single_type_kv_cache_manager.py, align mode, hash block
    = block 64, no checkpoint): a cache_blocks call whose cacheable tokens are the prompt's last boundary
    (prompt - 1) // 64 x 64 puts the state block there in cached_blocks_this_step again while the table holds it.
    The case is hybrid-b's first steps as vLLM ran them (record_vllm_parity.py --trace 4 hybrid-b): r0 (213 tokens)
    at 192 -> 213 re-adds its state at 192 (table [null, null, 4, 1]); at 213 -> 214 the block is nulled, nothing;
    r1 (492 tokens) at 192 -> 256: 256 is not its boundary (448), nothing."""
    from kvtool.estimate.kinds import MAMBA
    from kvtool.simulate.kv_groups import NULL, GroupSpec, MambaKind

    k = MambaKind(GroupSpec(MAMBA, 2, None, 1), 64)
    assert k.tail_block([NULL, NULL, 4, 1], 192, 213) == 2
    assert k.tail_block([NULL, NULL, NULL, 1], 192, 213) == -1
    assert k.tail_block([NULL, NULL, 4, 7], 256, 492) == -1
    assert k.tail_block([NULL, NULL, 4], 192, 193) == 2  # boundary (193 - 1) // 64 x 64 = 192
    assert k.tail_block([NULL, NULL, 4], 192, 192) == -1  # boundary 191 // 64 x 64 = 128
