"""Rich tables of kvtool.estimate.sglang's results (the JSON is the same dataclasses, kvtool.cli.output)."""

from __future__ import annotations

from typing import Any

from kvtool.core.units import GIB
from kvtool.estimate.sglang.compare import EngineComparison
from kvtool.estimate.sglang.pool import SglangEstimate


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GiB"


def render_sglang(r: SglangEstimate, console: Any, *, verbose: bool = False) -> None:
    """SGLang's pool: the inputs of profile_max_num_token, the pool, and what SGLang would log."""
    from rich.table import Table

    table = Table(title=f"SGLang {r.sglang_version}: {r.model}" + (f" on {r.gpu}" if r.gpu else ""), show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row(
        "attention", f"{r.attention}, {r.num_layers} layers, {r.kv_heads_per_gpu} KV heads/GPU x {r.elements_per_head}"
    )
    table.add_row("KV dtype", r.kv_dtype)
    table.add_row("cell per token (one GPU)", f"{r.cell_bytes_per_token:,} bytes")
    table.add_row("TP", str(r.tp))
    table.add_row("mem_fraction_static", f"{r.mem_fraction_static:.3f}")
    if r.total_gpu_memory_gib is not None:
        table.add_row("free before weights", _gib(r.total_gpu_memory_gib))
        if r.weights_bytes_per_gpu is not None:
            table.add_row("weights per GPU", _gib(r.weights_bytes_per_gpu / GIB))
        table.add_row("free after weights", _gib(r.available_gpu_memory_gib))
        table.add_row("headroom (1 - mem_fraction_static)", _gib(r.headroom_gib))
        table.add_row("KV pool memory (rest_memory)", _gib(r.rest_memory_gib))
        table.add_row("max_total_num_tokens", f"{r.max_total_num_tokens:,}")
        table.add_row("max_running_requests", f"{r.max_running_requests:,}")
    else:
        table.add_row("pool", "give --gpu or --gpu-memory for SGLang's pool")
    table.add_row("context_len", f"{r.context_len:,}")
    table.add_row("chunked_prefill_size", f"{r.chunked_prefill_size:,}")
    table.add_row("page_size", str(r.page_size))
    console.print(table)
    if verbose:
        for line in r.log_lines:
            console.print(f"SGLang would log: {line}")
        for note in r.notes:
            console.print(f"note: {note}")


def render_comparison(c: EngineComparison, console: Any) -> None:
    """vLLM and SGLang side by side."""
    from rich.table import Table

    table = Table(title=f"{c.sglang.model}: vLLM and SGLang" + (f" on {c.sglang.gpu}" if c.sglang.gpu else ""))
    table.add_column("")
    table.add_column("vLLM", justify="right")
    table.add_column("SGLang", justify="right")
    for row in c.rows:
        table.add_row(row.what, row.vllm or "-", row.sglang or "-")
    console.print(table)
    if c.sglang_over_vllm_tokens is not None:
        console.print(f"SGLang's pool holds {c.sglang_over_vllm_tokens:.2f}x vLLM's tokens")
