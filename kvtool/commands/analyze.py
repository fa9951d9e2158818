"""`kvtool analyze`: placeholder until its issue lands (replaced by the implementation)."""

from __future__ import annotations

import typer

from kvtool.errors import UsageError
from kvtool.output import handle_errors


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    @handle_errors
    def command() -> None:
        """Not implemented yet."""
        raise UsageError("'kvtool analyze' is not implemented yet")
