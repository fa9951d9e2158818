"""`kvtool repro`: replay the KV-cache isolation bugs in real PyTorch, or check the user's own module.

Thin layer: parse options, call ``kvtool.repro.run.run_repro``, render.  torch is imported only inside
the command function (through the core modules), never by ``kvtool --help``; it is the ``repro`` extra, checked
first (``--list`` needs none).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

import typer

from kvtool.cli.options import JsonOpt
from kvtool.cli.output import handle_errors, print_json, stdout_console
from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED
from kvtool.core.extras import require
from kvtool.repro.defaults import MAX_INTERLEAVINGS, SCENARIO_INTERLEAVINGS, TARGET_INTERLEAVINGS

if TYPE_CHECKING:
    from kvtool.repro.results import TargetCheck


def register(app: typer.Typer) -> None:
    @app.command("repro")
    @handle_errors
    def command(
        names: Optional[list[str]] = typer.Argument(
            None, metavar="[NAME]...", help="Scenarios to run (default: all; see --list)."
        ),
        list_: bool = typer.Option(False, "--list", help="Name the scenarios, one line each, and exit."),
        target: Optional[str] = typer.Option(
            None,
            "--target",
            metavar="PACKAGE.MODULE:FACTORY | hf:DIR",
            help="Check your own decoder instead: a factory returning an nn.Module (forward(x, cache) -> "
            "(out, new_cache), or forward(ids, positions, cache) with kvtool_protocol = 'tokens', or a "
            "transformers PreTrainedModel), or hf:DIR, a local Hugging Face model folder (random weights from "
            "config.json alone).  See docs/repro.md.",
        ),
        hf_cache: Optional[str] = typer.Option(
            None,
            "--hf-cache",
            help="Cache of a transformers target: dynamic (DynamicCache, the default) or static (StaticCache).",
        ),
        d_model: Optional[int] = typer.Option(
            None, "--d-model", help="d_model of the --target module (default: its d_model attribute)."
        ),
        device: Optional[str] = typer.Option(
            None, "--device", help="cpu or cuda (default: cuda when available; a --target runs on cpu)."
        ),
        dtype: str = typer.Option("float32", "--dtype", help="float32, float64 or bfloat16 (sets the tolerances)."),
        seed: int = typer.Option(0, "--seed", help="Seed of weights, inputs and interleavings."),
        interleavings: Optional[int] = typer.Option(
            None,
            "--interleavings",
            metavar="N",
            help=f"Seeded random interleavings per implementation (default {SCENARIO_INTERLEAVINGS}; "
            f"{TARGET_INTERLEAVINGS} for a --target; at most {MAX_INTERLEAVINGS:,}).",
        ),
        verbose: bool = typer.Option(
            False,
            "--verbose",
            "-v",
            help="Every scenario's tables and findings, and the evidence of every target check (by default: the "
            "summary, and the evidence of what failed).",
        ),
        json_output: JsonOpt = False,
    ) -> None:
        """Replay KV-cache isolation bugs in PyTorch (buggy vs fixed), or check your own attention module."""
        if list_:
            from kvtool.repro.render import render_list
            from kvtool.repro.scenarios import SCENARIOS

            if json_output:
                print_json({"scenarios": list(SCENARIOS)})
            else:
                render_list(stdout_console())
            return
        require("torch", feature="kvtool repro")  # before anything else: torch is what every run needs
        if target is not None:
            _check_target(
                names or None, target, device, dtype, seed, interleavings, d_model, hf_cache, json_output, verbose
            )
            return
        from contextlib import nullcontext

        from kvtool.cli.output import stderr_console
        from kvtool.repro.run import run_repro

        # A transient status line on stderr while the tables are coming; none with --json.
        status = nullcontext() if json_output else stderr_console().status("kvtool repro: loading torch")
        with status as line:
            report = run_repro(
                names or None,
                device=device,
                dtype=dtype,
                seed=seed,
                interleavings=interleavings,
                d_model=d_model,
                hf_cache=hf_cache,
                progress=None if line is None else (lambda text: line.update(f"kvtool repro: {text}")),
            )
        if json_output:
            print_json(report)
        else:
            from kvtool.repro.render import render_report

            render_report(report, stdout_console(), verbose=verbose)
        if not report.passed:
            raise typer.Exit(EXIT_CHECK_FAILED)


def _check_target(names, target, device, dtype, seed, interleavings, d_model, hf_cache, json_, verbose) -> None:
    """--target: each check printed on stdout as it finishes (JSON at the end with --json); Ctrl-C keeps
    the finished checks and exits 130."""
    from kvtool.repro.run import run_repro

    console = stdout_console()
    on_check: Callable[[TargetCheck], None] | None = None
    if not json_:
        from kvtool.repro.render import render_check

        shown: list[str] = []

        def on_check(check) -> None:
            if not shown:  # the first line only once the target loaded (usage errors print nothing on stdout)
                console.print(f"kvtool repro --target {target}: checks as they finish", highlight=False, markup=False)
            shown.append(check.name)
            render_check(check, console, verbose=verbose)

    report = run_repro(
        names,
        device=device,
        dtype=dtype,
        seed=seed,
        interleavings=interleavings,
        target=target,
        d_model=d_model,
        hf_cache=hf_cache,
        on_check=on_check,
    )
    if json_:
        print_json(report)
    else:
        from kvtool.repro.render import render_report

        render_report(report, console, streamed=True, verbose=verbose)
    if report.target is not None and report.target.interrupted:
        sys.stderr.write("Error: interrupted\n")
        raise typer.Exit(EXIT_INTERRUPTED)
    if not report.passed:
        raise typer.Exit(EXIT_CHECK_FAILED)
