"""Rich tables for ``kvtool explain`` (JSON comes from the same dataclasses)."""

from __future__ import annotations

from kvtool.core.format import MISSING, fmt_num, fmt_pct
from kvtool.core.units import GIB
from kvtool.explain.explain import Explanation
from kvtool.explain.reproduce import DIFFERS, Term
from kvtool.explain.whatif import WhatIf


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return MISSING
    if unit == "bytes":
        return f"{value / GIB:,.2f} GiB"
    if unit == "x":
        return f"{value:,.2f}x"
    return f"{value:,.0f}"


def _difference(term: Term) -> str:
    if term.difference is None:
        return MISSING
    if term.unit == "bytes":
        text = f"{term.difference / GIB:+,.3f} GiB"
    elif term.unit == "x":
        text = f"{term.difference:+,.2f}x"
    else:
        text = f"{term.difference:+,.0f}"
    share = term.relative_difference
    return text if share is None else f"{text} ({fmt_pct(share, 2)})"


def _terms_table(title: str, terms: tuple[Term, ...]):
    from kvtool.core.render import new_table

    table = new_table(title=title, show_header=True, header_style="bold")
    for column in ("figure", "logged", "line", "kvtool", "status", "difference", "how"):
        table.add_column(column)
    for t in terms:
        style = "bold red" if t.status == DIFFERS else None
        table.add_row(
            t.name,
            _value(t.logged, t.unit),
            fmt_num(t.line),
            _value(t.modelled, t.unit),
            t.status if t.checked or t.logged is None else f"{t.status}, not checked",
            _difference(t),
            t.how,
            style=style,
        )
    return table


def _what_if_table(rows: tuple[WhatIf, ...]):
    from kvtool.core.render import new_table

    table = new_table(
        title="What-ifs on the same machine, calibrated on the log", show_header=True, header_style="bold"
    )
    for column in ("setting", "logged", "what-if", "KV budget", "change", "tokens", "concurrency", "how"):
        table.add_column(column)
    for w in rows:
        table.add_row(
            w.setting,
            fmt_num(w.logged_value, "") if w.logged_value is not None else MISSING,
            str(w.value),
            _value(w.kv_budget_bytes, "bytes"),
            MISSING if w.budget_change_bytes is None else f"{w.budget_change_bytes / GIB:+,.2f} GiB",
            fmt_num(w.kv_cache_tokens),
            _value(w.max_concurrency, "x"),
            w.note,
        )
    return table


def render_explanation(e: Explanation, console) -> None:
    """The settings, the budget's terms, the KV figures, the suggestion line, the ranks, the what-ifs."""
    gpu = MISSING if e.gpu_memory_bytes is None else f"{e.gpu_memory_bytes / GIB:,.2f} GiB ({e.gpu_memory_source})"
    console.print(
        f"{e.source}: vLLM rules of {e.vllm_version} ({e.version_source}); model {e.model or MISSING}; "
        f"TP {e.tp}, PP {e.pp}; max_model_len {fmt_num(e.max_model_len)}; "
        f"gpu_memory_utilization {e.gpu_memory_utilization}; KV dtype {e.kv_dtype}; device total {gpu}"
    )
    rank = "" if e.explained_rank == "-" else f" (rank {e.explained_rank}, the smallest KV memory)"
    console.print(_terms_table(f"Budget terms per GPU{rank}", e.terms))
    console.print(_terms_table("KV cache figures", e.figures))
    if e.suggestion:
        console.print(_terms_table("The --kv-cache-memory suggestion, recomputed", e.suggestion))
    if len(e.ranks) > 1:
        _ranks(e, console)
    if e.what_ifs:
        console.print(_what_if_table(e.what_ifs))
    for note in e.notes:
        console.print(f"Note: {note}", style="dim")


def _ranks(e: Explanation, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(title="Per rank, as logged", show_header=True, header_style="bold")
    for column in ("rank", "available KV", "weights", "CUDA graphs", ""):
        table.add_column(column)
    for r in e.ranks:
        table.add_row(
            r.rank,
            _value(r.available_kv_bytes, "bytes"),
            _value(r.weights_bytes, "bytes"),
            _value(r.cudagraph_bytes, "bytes"),
            "explained" if r.explained else "",
        )
    console.print(table)
