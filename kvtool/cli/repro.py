"""`kvtool repro`: replay the KV-cache isolation bugs in real PyTorch, or check the user's own module.

Thin layer: parse options, call ``kvtool.repro.run.run_repro``, render.  torch is imported only inside
the command function (through the core modules), never by ``kvtool --help``.
"""

from __future__ import annotations

from typing import Optional

import typer

from kvtool.cli.options import JsonOpt
from kvtool.cli.output import handle_errors, print_json, stdout_console
from kvtool.core.errors import EXIT_CHECK_FAILED


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
            metavar="PACKAGE.MODULE:FACTORY",
            help="Check your own module instead: the factory returns an nn.Module with "
            "forward(x, cache=None) -> (out, new_cache).",
        ),
        d_model: Optional[int] = typer.Option(
            None, "--d-model", help="d_model of the --target module (default: its d_model attribute)."
        ),
        device: Optional[str] = typer.Option(
            None, "--device", help="cpu or cuda (default: cuda when available; a --target runs on cpu)."
        ),
        dtype: str = typer.Option("float32", "--dtype", help="float32, float64 or bfloat16 (sets the tolerances)."),
        seed: int = typer.Option(0, "--seed", help="Seed of weights, inputs and interleavings."),
        interleavings: int = typer.Option(
            200, "--interleavings", metavar="N", help="Seeded random interleavings per implementation."
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
                target=target,
                d_model=d_model,
                progress=None if line is None else (lambda text: line.update(f"kvtool repro: {text}")),
            )
        if json_output:
            print_json(report)
        else:
            from kvtool.repro.render import render_report

            render_report(report, stdout_console())
        if not report.passed:
            raise typer.Exit(EXIT_CHECK_FAILED)
