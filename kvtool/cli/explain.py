"""`kvtool explain`: read a vLLM start-up log, reproduce its figures, answer what-ifs; calls kvtool.explain."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvtool.cli.options import JsonOpt, ProfilesOpt
from kvtool.cli.output import handle_errors
from kvtool.core.errors import InputFileError

_WHAT_IF = "What-ifs (each changes one setting of the log's engine)"

LogArg = Annotated[
    str,
    typer.Argument(
        metavar="LOG",
        help="A vLLM start-up log (vllm serve's or LLM()'s output; VLLM_LOGGING_LEVEL=DEBUG adds the profiling "
        "line), or - for stdin.",
        show_default=False,
    ),
]


def _read_log(path: str) -> tuple[str, str]:
    """The log's text and its name for messages; a missing or unreadable file is an input error (exit 3)."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    if not path.strip():
        raise InputFileError("LOG is empty", where="LOG", tip="give a log file, or - for stdin")
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace"), path
    except FileNotFoundError:
        raise InputFileError("no such file", where=path) from None
    except (IsADirectoryError, PermissionError, OSError) as err:
        raise InputFileError(f"cannot read the log: {err.strerror or err}", where=path) from None


def explain_command(
    log: LogArg,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="The model, when the log's id does not resolve here (as estimate's --model: a profile, a Hugging "
            "Face id in the local cache, a model folder).",
        ),
    ] = None,
    config: Annotated[
        Optional[str], typer.Option("--config", "-c", help="The model's config.json (or a folder holding one).")
    ] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="The GPU, when the log gives no device total.")] = None,
    gpu_memory: Annotated[
        Optional[str],
        typer.Option("--gpu-memory", help="The device total, when the log gives none (e.g. 79.19GiB)."),
    ] = None,
    vllm_version: Annotated[
        Optional[str],
        typer.Option("--vllm-version", help="Apply this release's rules instead of the logged version's."),
    ] = None,
    max_model_len: Annotated[
        Optional[int],
        typer.Option("--max-model-len", help="What if max_model_len were this.", rich_help_panel=_WHAT_IF),
    ] = None,
    gpu_memory_utilization: Annotated[
        Optional[float],
        typer.Option("--gpu-memory-utilization", help="What if the utilisation were this.", rich_help_panel=_WHAT_IF),
    ] = None,
    kv_dtype: Annotated[
        Optional[str],
        typer.Option("--kv-dtype", help="What if the KV cache were this dtype.", rich_help_panel=_WHAT_IF),
    ] = None,
    tp: Annotated[
        Optional[int],
        typer.Option("--tp", help="What if the tensor-parallel size were this.", rich_help_panel=_WHAT_IF),
    ] = None,
    max_num_seqs: Annotated[
        Optional[int], typer.Option("--max-num-seqs", help="What if max_num_seqs were this.", rich_help_panel=_WHAT_IF)
    ] = None,
    block_size: Annotated[
        Optional[int], typer.Option("--block-size", help="What if the block size were this.", rich_help_panel=_WHAT_IF)
    ] = None,
    json_output: JsonOpt = False,
    profiles: ProfilesOpt = None,
) -> None:
    """Explain a vLLM start-up log: each figure logged against kvtool's, term by term, and what-ifs on that machine.

    Without what-if options it shows an fp8 KV cache, a utilisation of 0.95 and half the context.

    Example: kvtool explain vllm.log --max-model-len 65536 --kv-dtype fp8
    """
    from kvtool.explain.explain import Given, explain_log

    asked: dict[str, Any] = {
        name: value
        for name, value in (
            ("max_model_len", max_model_len),
            ("gpu_memory_utilization", gpu_memory_utilization),
            ("kv_dtype", kv_dtype),
            ("tp", tp),
            ("max_num_seqs", max_num_seqs),
            ("block_size", block_size),
        )
        if value is not None
    }
    _check_what_ifs(asked)
    text, source = _read_log(log)
    given = Given(model, config, gpu, gpu_memory, vllm_version, tuple(profiles or ()))
    explanation = explain_log(text, source, given, asked or None)
    from kvtool.cli.output import print_answer
    from kvtool.explain.render import render_explanation

    print_answer(explanation, json_output, render_explanation, explanation.warnings)


def _check_what_ifs(asked: dict[str, Any]) -> None:
    from kvtool.core.errors import UsageError

    for name, value in asked.items():
        option = "--" + name.replace("_", "-")
        if name == "gpu_memory_utilization":
            if not 0 < value <= 1:
                raise UsageError(f"{option} must be in (0, 1], not {value}", where=option)
        elif name != "kv_dtype" and value <= 0:
            raise UsageError(f"{option} must be greater than zero, not {value}", where=option)


def register(app: typer.Typer) -> None:
    app.command("explain")(handle_errors(explain_command))
