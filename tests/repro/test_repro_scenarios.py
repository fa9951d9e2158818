"""`kvtool repro` built-in scenarios: every buggy version detected, every fixed version clean, for several
seeds, with evidence checked against hand computations (not against earlier output)."""

from __future__ import annotations

import pytest
import torch  # a required dependency: a broken install fails here, it is not skipped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool.repro.checks import run_scenario
from kvtool.repro.engines import CAPACITY, D_MODEL, N_HEADS
from kvtool.repro.scenarios import SCENARIO_NAMES

SEEDS = (0, 1, 7)
D_HEAD = D_MODEL // N_HEADS
PROMPTS = (5, 8, 3)  # kvtool.repro.checks.PROMPT_LENGTHS, restated
DECODE = 4  # kvtool.repro.checks.DECODE_STEPS, restated
F32 = 4  # bytes per float32


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_buggy_detected_and_fixed_clean(name, seed):
    result = run_scenario(name, seed=seed, interleavings=20)
    assert result.buggy.detected, result.buggy
    assert not result.fixed.detected, result.fixed.findings
    assert result.passed
    fixed = result.fixed
    assert fixed.allclose and fixed.shapes_ok and not fixed.shared_storage
    assert fixed.interleaving_mismatches == 0
    assert fixed.greedy_divergence_step is None
    assert not result.buggy.allclose  # every built-in bug changes some request's logits
    assert result.buggy.max_abs_diff > 1e-3 > fixed.max_abs_diff


def _by_label(impl, request, label):
    return next(i for i in impl.cache_tensors if i.request == request and i.label == label)


def test_shared_instance_cache_shape_holds_every_request():
    r = run_scenario("shared-instance-cache", seed=0, interleavings=5)
    # Round robin over 3 requests, prompts 5+8+3 then 4 tokens each: the module's one cache holds 28 tokens,
    # while r0 has seen 5 + 4 = 9.
    head0 = _by_label(r.buggy, 0, "L0 k h0")
    assert head0.shape == (1, sum(PROMPTS) + 3 * DECODE, D_HEAD)
    assert head0.expected_shape == (1, PROMPTS[0] + DECODE, D_HEAD)
    assert _by_label(r.buggy, 1, "L0 k h0").data_ptr == head0.data_ptr  # the article's diagnosis: same memory
    assert r.buggy.greedy_divergence_step is not None
    assert _by_label(r.fixed, 0, "L0 k h0").shape == (1, PROMPTS[0] + DECODE, D_HEAD)


def test_head_views_same_storage_but_disjoint_only_when_fixed():
    r = run_scenario("head-view-inplace", seed=1, interleavings=5)
    b0, b1 = _by_label(r.buggy, 0, "L0 k h0"), _by_label(r.buggy, 0, "L0 k h1")
    assert b0.data_ptr == b1.data_ptr and "r0 L0 k h1" in b0.overlaps_with
    f0, f1 = _by_label(r.fixed, 0, "L0 k h0"), _by_label(r.fixed, 0, "L0 k h1")
    # One [H, CAPACITY, d_head] buffer: same allocation, heads CAPACITY * d_head floats apart, no overlap.
    assert f0.storage_ptr == f1.storage_ptr
    assert f1.data_ptr - f0.data_ptr == CAPACITY * D_HEAD * F32
    assert f0.overlaps_with == ()


def test_expand_rows_alias_and_repeat_rows_do_not():
    r = run_scenario("batch-expand-alias", seed=0, interleavings=5)
    assert len({_by_label(r.buggy, rid, "L0 k h0").data_ptr for rid in range(3)}) == 1  # stride-0 batch
    ptrs = [_by_label(r.fixed, rid, "L0 k h0").data_ptr for rid in range(3)]
    # repeat(): rows of one [3, H, CAPACITY, d_head] tensor, H * CAPACITY * d_head floats apart.
    assert [p - ptrs[0] for p in ptrs] == [i * N_HEADS * CAPACITY * D_HEAD * F32 for i in range(3)]


def test_prealloc_slots_packed_by_prompt_overlap():
    r = run_scenario("prealloc-slice", seed=0, interleavings=5)
    b0, b1 = _by_label(r.buggy, 0, "L0 k h0"), _by_label(r.buggy, 1, "L0 k h0")
    # Packed slots: r1 starts right after r0's 5 prompt tokens; r0 then grows to 9 tokens over r1's start.
    assert b1.data_ptr - b0.data_ptr == PROMPTS[0] * D_HEAD * F32
    assert b0.storage_ptr == b1.storage_ptr and "r1 L0 k h0" in b0.overlaps_with
    f0, f1 = _by_label(r.fixed, 0, "L0 k h0"), _by_label(r.fixed, 1, "L0 k h0")
    assert f1.data_ptr - f0.data_ptr == CAPACITY * D_HEAD * F32
    assert not r.fixed.shared_storage


def test_layer_index_is_caught_by_outputs_not_memory():
    r = run_scenario("layer-index", seed=0, interleavings=5)
    assert not r.buggy.shared_storage and r.buggy.shapes_ok  # swapped caches have the right shapes
    assert not r.buggy.allclose
    assert {i.label.split()[0] for i in r.fixed.cache_tensors} == {"L0", "L1"}


def test_padding_mask_spares_the_longest_request():
    r = run_scenario("padding-mask", seed=0, interleavings=5)
    diffs = r.buggy.request_max_abs_diff
    # Batched each step: r1 has the longest prompt (8), so its cache row has no padding and its logits are
    # right; r0 (5) and r2 (3) attend to padded slots.
    assert diffs[1] < 1e-5
    assert diffs[0] > 1e-3 and diffs[2] > 1e-3


def test_rope_unrotated_cache_is_also_detected():
    r = run_scenario("rope-offset", seed=3, interleavings=10, rope_mode="unrotated")
    assert r.buggy.detected and not r.fixed.detected


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_other_dtypes(dtype):
    for name in ("shared-instance-cache", "prealloc-slice"):
        r = run_scenario(name, seed=2, dtype=dtype, interleavings=10)
        assert r.passed, (name, r.fixed.findings)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_any_seed_fixed_clean_and_buggy_caught(seed):
    for name in SCENARIO_NAMES:
        r = run_scenario(name, seed=seed, interleavings=8)
        assert r.fixed.interleaving_mismatches == 0 and not r.fixed.detected, (name, seed, r.fixed.findings)
        assert r.buggy.detected, (name, seed)
