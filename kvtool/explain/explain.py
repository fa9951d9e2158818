"""``kvtool explain``: one start-up log in, one frozen :class:`Explanation` out (never prints, never exits).

read the log           parse.parse_startup_log     -> StartupLog (figures by rank, each with its line)
its settings           settings.log_settings       -> LogSettings (version, engine args, device total)
kvtool's figures       reproduce.model_log         -> Modelled (estimate() from scratch, given the budget)
term by term           reproduce.budget_terms / kv_figures / suggestion_figures -> Term rows
what-ifs               whatif.answer_what_if       -> WhatIf rows (calibrated on the logged terms)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.units import GIB
from kvtool.explain.parse import StartupLog, parse_startup_log
from kvtool.explain.reproduce import (
    Term,
    budget_terms,
    filled_rank,
    graphs_subtracted,
    kv_figures,
    logged_terms,
    method_notes,
    model_log,
    suggestion_figures,
    with_set_budget,
)
from kvtool.explain.settings import Given, LogSettings, log_settings
from kvtool.explain.whatif import Calibration, WhatIf, answer_what_if, default_what_ifs


@dataclasses.dataclass(frozen=True)
class RankRow:
    """One rank's own figures (vLLM prints them per worker), in bytes."""

    rank: str
    available_kv_bytes: int | None
    weights_bytes: int | None
    cudagraph_bytes: int | None  # the estimate where logged, else the captured pool
    explained: bool  # the rank whose figures set the pool (the smallest available KV memory)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """A start-up log explained: its settings, each figure logged against kvtool's, and what-ifs."""

    source: str
    vllm_version: str  # the release whose rules were applied
    logged_version: str | None
    version_source: str
    model: str | None
    tp: int
    pp: int
    max_model_len: int | None
    gpu_memory_utilization: float
    kv_dtype: str
    block_size: int
    gpu_memory_bytes: int | None
    gpu_memory_source: str | None
    non_default_args: dict[str, Any]
    explained_rank: str
    cudagraph_subtracted: bool  # whether the budget lost the CUDA-graph estimate
    terms: tuple[Term, ...]  # the budget's terms (weights, activation, non-torch, CUDA graphs)
    figures: tuple[Term, ...]  # available KV memory, token count, concurrency
    suggestion: tuple[Term, ...]  # the --kv-cache-memory suggestion line recomputed (empty when not logged)
    ranks: tuple[RankRow, ...]
    what_ifs: tuple[WhatIf, ...]
    notes: tuple[str, ...]  # how kvtool modelled its terms, in words
    warnings: tuple[str, ...]


def _rank_rows(log: StartupLog) -> tuple[RankRow, ...]:
    chosen = log.explained_rank.rank

    def b(figure) -> int | None:
        return None if figure is None else round(figure.value * GIB)

    return tuple(
        RankRow(
            r.rank,
            b(r.available_kv_gib),
            b(r.weights_gib),
            b(r.cudagraph_estimate_gib or r.cudagraph_pool_estimate_gib or r.cudagraph_captured_gib),
            r.rank == chosen,
        )
        for r in log.ranks
    )


def explain_log(text: str, source: str, given: Given, what_ifs: dict[str, Any] | None = None) -> Explanation:
    """Explain the start-up log ``text`` (read from ``source``); ``what_ifs`` maps a setting (whatif.WHAT_IF_FIELDS)
    to its what-if value; None asks for the default what-ifs."""
    log = parse_startup_log(text, source)
    settings = log_settings(log, given)
    rank = filled_rank(log)
    terms = with_set_budget(logged_terms(rank), settings, log)
    modelled = model_log(settings, terms.available[0], terms.available[2])
    settings = modelled.settings
    subtracted = graphs_subtracted(log, modelled.scratch)
    calibration = Calibration(terms, modelled.scratch, subtracted)
    asked = default_what_ifs(settings) if what_ifs is None else what_ifs
    answers = tuple(answer_what_if(settings, calibration, k, v) for k, v in asked.items())
    return Explanation(
        source=source,
        vllm_version=settings.vllm_version,
        logged_version=log.version,
        version_source=settings.version_source,
        model=settings.model or settings.config,
        tp=settings.tp,
        pp=settings.pp,
        max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        kv_dtype=settings.kv_dtype,
        block_size=settings.block_size,
        gpu_memory_bytes=settings.gpu_memory_bytes,
        gpu_memory_source=settings.gpu_memory_source,
        non_default_args=log.args,
        explained_rank=rank.rank,
        cudagraph_subtracted=subtracted,
        terms=budget_terms(terms, modelled.scratch, subtracted),
        figures=kv_figures(log, terms, settings, modelled, subtracted),
        suggestion=suggestion_figures(rank.suggestion),
        ranks=_rank_rows(log),
        what_ifs=answers,
        notes=method_notes(modelled.scratch),
        warnings=settings.warnings + modelled.warnings,
    )


__all__ = ["Explanation", "Given", "LogSettings", "RankRow", "explain_log"]
