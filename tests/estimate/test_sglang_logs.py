"""kvtool's SGLang pool against real SGLang start-up logs (tests/data/sglang-logs, each case citing its source).

Given the memory figures SGLang logs ("Load weight begin/end. avail mem=X GB", two decimals of GiB), the logged
``#tokens`` / ``max_total_num_tokens`` must lie between the counts at the ends of the figures' rounding intervals,
and the K-size line must read as logged; from scratch (the GPU profile and kvtool's weights), within 1 % at the
median over the cases with a named GPU.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from kvtool.estimate.sglang.pool import LoggedMemory, SglangRequest, _resolve, estimate_sglang, pool_shape

CASES_DIR = Path(__file__).resolve().parents[1] / "data" / "sglang-logs"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())
HALF_CENT = 0.005  # a figure printed to two decimals of GiB


def _case(name: str) -> dict:
    return yaml.safe_load((CASES_DIR / name / "case.yaml").read_text())


def _request(name: str, case: dict) -> SglangRequest:
    settings = case.get("settings") or {}
    mib = case.get("gpu_memory_mib")
    return SglangRequest(
        config=str(CASES_DIR / name / "config.json"),
        gpu=case.get("gpu"),
        gpu_memory=f"{mib}MiB" if mib else None,
        tp=case["tp"],
        sglang_version=case["sglang_version"],
        mem_fraction_static=settings.get("mem_fraction_static"),
        context_length=settings.get("context_length"),
        max_running_requests=settings.get("max_running_requests"),
        page_size=settings.get("page_size", 1),
    )


def _figures(logged: dict) -> tuple[float, float, float]:
    """Free memory before and after the weights, and the half-width of the before figure's interval (a figure
    derived as after + mem usage carries both roundings)."""
    after = logged["free_after_weights_gib"]
    if "free_before_weights_gib" in logged:
        return logged["free_before_weights_gib"], after, HALF_CENT
    return round(after + logged["weights_gib"], 2), after, 2 * HALF_CENT


def test_enough_cases() -> None:
    assert len(CASES) >= 12


def _has_figures(logged: dict) -> bool:
    """Whether the log keeps SGLang's memory figures (some cases keep only the pool's lines: from scratch only)."""
    return "free_after_weights_gib" in logged


@pytest.mark.parametrize("name", CASES)
def test_token_count_given_the_logged_memory(name: str) -> None:
    case = _case(name)
    logged = case["logged"]
    request = _request(name, case)
    if _has_figures(logged):
        before, after, width = _figures(logged)
        low = estimate_sglang(request, LoggedMemory(before + width, after - HALF_CENT)).max_total_num_tokens
        high = estimate_sglang(request, LoggedMemory(before - width, after + HALF_CENT)).max_total_num_tokens
        middle = estimate_sglang(request, LoggedMemory(before, after))
        assert low is not None and high is not None and middle.max_total_num_tokens is not None
        slack = int(case.get("tolerance", 0) * logged["tokens"])  # a case's documented gap (case.yaml says why)
        assert low - slack <= logged["tokens"] <= high + slack, (
            f"{name}: logged {logged['tokens']} outside [{low}, {high}]"
        )
    else:  # only the pool's lines are logged: the settings and the K-size line are still checked
        assert case.get("from_scratch"), f"{name}: a case without memory figures must be checked from scratch"
        middle = estimate_sglang(request)
    # the allocation line of the logged count: K size as SGLang prints it (get_kv_size_bytes, size + page_size slots),
    # or K + V where a source quotes only their sum
    shape = pool_shape(_spec(request), "auto", request.tp, middle.sglang_version)
    buffer = shape.buffer_gib(logged["tokens"], request.page_size)
    if "k_size_gib" in logged:
        assert f"{buffer:.2f}" == f"{logged['k_size_gib']:.2f}"
    if "kv_size_gib" in logged:
        assert f"{buffer * shape.tensors:.2f}" == f"{logged['kv_size_gib']:.2f}"
    if "mem_fraction_static" in logged:
        assert middle.mem_fraction_static == pytest.approx(logged["mem_fraction_static"])
    if "max_running_requests" in logged:
        assert _running(request, logged) == logged["max_running_requests"]
    if "chunked_prefill_size" in logged and middle.gpu_memory_mib is not None:  # a default by the GPU
        assert middle.chunked_prefill_size == logged["chunked_prefill_size"]
    if "context_len" in logged:
        assert middle.context_len == logged["context_len"]


def _spec(request: SglangRequest):  # noqa: ANN202 - a ModelSpec
    return _resolve(request).spec


def _running(request: SglangRequest, logged: dict) -> int | None:
    """max_running_requests of a pool of exactly the logged tokens (capped with --max-total-tokens)."""
    import dataclasses

    capped = dataclasses.replace(request, max_total_tokens=logged["tokens"])
    if not _has_figures(logged):  # no figures: memory ample enough that the cap decides
        return estimate_sglang(capped, LoggedMemory(10_000.0, 10_000.0)).max_running_requests
    before, after, _ = _figures(logged)
    return estimate_sglang(capped, LoggedMemory(before + 1.0, after + 1.0)).max_running_requests


def _from_scratch_errors() -> dict[str, float]:
    errors = {}
    for name in CASES:
        case = _case(name)
        if not case.get("from_scratch"):
            continue
        tokens = estimate_sglang(_request(name, case)).max_total_num_tokens
        assert tokens is not None
        errors[name] = tokens / case["logged"]["tokens"] - 1
    return errors


def test_from_scratch_within_one_percent_at_the_median() -> None:
    errors = _from_scratch_errors()
    assert len(errors) >= 3
    median = statistics.median(abs(e) for e in errors.values())
    assert median <= 0.01, {k: f"{v:+.2%}" for k, v in errors.items()}
