"""Rich tables for ``kvtool plan`` (``--json`` comes from the same dataclasses)."""

from __future__ import annotations

from kvtool.core.format import fmt_num
from kvtool.core.render import new_table
from kvtool.core.units import GIB
from kvtool.plan.result import PlanResult

LOGGED_ROWS = 3  # the cheapest rows whose vLLM start-up lines are shown under the table


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def render_plan(result: PlanResult, console) -> None:
    """The fitting configurations cheapest first, what vLLM would log for the cheapest, the longest contexts."""
    if result.serving is not None:
        render_serving_plan(result, console)
        return
    r, w = result, result.workload
    console.print(
        f"{r.model} on vLLM {r.vllm_version}: {w.concurrency:,} concurrent requests of {w.seq_len:,} tokens "
        f"({w.source}); {r.fitting:,} of {r.candidates:,} configurations fit"
    )
    if r.rows:
        console.print(_rows_table(r))
        for row in r.rows[:LOGGED_ROWS]:
            console.print(f"vLLM would log ({row.gpu} x{row.num_gpus}, tp {row.tp}, pp {row.pp}): {row.vllm_log}")
    if r.longest_context:
        console.print(_longest_table(r))
    if r.rows and len(r.rows) < r.fitting:
        console.print(f"Showing the {len(r.rows):,} cheapest of {r.fitting:,} (--top)", style="dim")
    _notes(r, console)


def _notes(r: PlanResult, console) -> None:
    if r.over_max_gpus:
        console.print(
            f"Note: {r.over_max_gpus:,} candidates need more than --max-gpus GPUs and were not tried", style="dim"
        )
    for refusal in r.refused:
        console.print(
            f"Note: tp {refusal.tp}, pp {refusal.pp} ({refusal.candidates:,} candidates) not tried: {refusal.reason}",
            style="dim",
        )


def _rows_table(r: PlanResult):
    table = new_table(
        "GPUs",
        "GPU",
        "TP",
        "PP",
        "KV dtype",
        "util",
        "quant",
        "KV budget/GPU",
        "blocks",
        "max conc.",
        "margin",
        "idle KV",
        "max-model-len auto",
        title="Configurations that hold the workload, cheapest first (GPUs, then idle KV memory)",
        key_columns=2,
    )
    for row in r.rows:
        table.add_row(
            str(row.num_gpus),
            row.gpu,
            str(row.tp),
            str(row.pp),
            row.kv_dtype,
            f"{row.gpu_memory_utilization:g}",
            row.quantization or "-",
            _gib(row.kv_budget_bytes),
            fmt_num(row.num_blocks),
            f"{row.max_concurrency:,.2f}x",
            f"+{row.margin_requests:,}",
            _gib(row.idle_kv_bytes),
            fmt_num(row.max_model_len_auto),
        )
    return table


def _longest_table(r: PlanResult):
    context = f" (the model's context: {r.model_context_tokens:,})" if r.model_context_tokens else ""
    table = new_table(
        "GPU",
        "TP",
        "PP",
        "max-model-len auto",
        "with",
        title=f"Longest context per GPU and parallelism{context}",
        key_columns=3,
    )
    for c in r.longest_context:
        length = "none fits" if c.max_model_len_auto == 0 else f"{c.max_model_len_auto:,}"
        if c.full_context:
            length += " (full)"
        settings = f"kv {c.kv_dtype}, util {c.gpu_memory_utilization:g}" + (
            f", {c.quantization}" if c.quantization else ""
        )
        table.add_row(c.gpu, str(c.tp), str(c.pp), length, settings if c.max_model_len_auto else "-")
    return table


def render_serving_plan(result: PlanResult, console) -> None:
    """``--qps``: the configurations meeting the target cheapest first, then those simulated that miss it."""
    r, w, s = result, result.workload, result.serving
    assert s is not None
    goal = _goal(s.target)
    console.print(
        f"{r.model} on vLLM {r.vllm_version}: {s.requests:,} requests ({s.source}), arrivals {s.arrivals}; target "
        f"{goal}"
    )
    simulated = len(r.rows) + len(r.missed)
    console.print(
        f"{r.fitting:,} of {r.candidates:,} configurations hold {w.concurrency:,} of the longest request "
        f"({w.seq_len:,} tokens) in memory; {simulated:,} simulated ({r.simulations:,} distinct runs, block size "
        f"{s.block_size}); {len(r.rows):,} meet the target"
    )
    if r.rows:
        console.print(
            _serving_table(r, r.rows, "Configurations that meet the target, cheapest first (GPUs, then idle KV)")
        )
    if r.missed:
        console.print(_serving_table(r, r.missed, "Simulated, missing the target (cheapest first)"))
    for skipped in r.not_simulated:
        console.print(
            f"Note: {skipped.candidates:,} fitting configurations not simulated: {skipped.reason}", style="dim"
        )
    _notes(r, console)


def _goal(target) -> str:
    p = f"p{target.percentile:g}"
    parts = [
        f"{name} {p} <= {value:g} ms"
        for name, value in (("TTFT", target.ttft_ms), ("TPOT", target.tpot_ms))
        if value is not None
    ]
    return " and ".join(parts)


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if x >= 10 else f"{x:,.3g}"


def _serving_table(r: PlanResult, rows, title: str):
    """One row per configuration; each figure at the target's percentile with its room (+) or miss (-) in ms."""
    s = r.serving
    assert s is not None
    p = f"p{s.target.percentile:g}"
    quant = any(row.quantization for row in rows)
    table = new_table(
        "GPUs",
        "GPU",
        "TP",
        "KV dtype",
        "util",
        *(("quant",) if quant else ()),
        "blocks",
        f"TTFT {p} ms (room)",
        f"TPOT {p} ms (room)",
        "tokens/s",
        "preempt.",
        title=title + "; room: the target less the figure",
        key_columns=2,
    )
    for row in rows:
        f = row.serving
        assert f is not None
        table.add_row(
            str(row.num_gpus),
            row.gpu,
            str(row.tp),
            row.kv_dtype,
            f"{row.gpu_memory_utilization:g}",
            *((row.quantization or "-",) if quant else ()),
            fmt_num(row.num_blocks),
            _with_room(f.ttft_ms, f.ttft_headroom_ms),
            _with_room(f.tpot_ms, f.tpot_headroom_ms),
            f"{f.throughput_tokens_per_s:,.0f}",
            fmt_num(f.preemptions) + ("" if f.completed == f.requests else f", {f.requests - f.completed:,} never ran"),
        )
    return table


def _with_room(value: float | None, room: float | None) -> str:
    if room is None:
        return _ms(value)
    return f"{_ms(value)} ({'+' if room >= 0 else '-'}{_ms(abs(room))})"
