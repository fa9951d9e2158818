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
