"""Options that several commands share, declared once as ``Annotated`` aliases (huggingface_hub's _cli_utils).

Every command binds ``--json`` to the parameter ``json_output``:

    def command(..., json_output: JsonOpt = False) -> None:
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

JSON_HELP = "Print one JSON object on stdout and nothing else (no tables)."
PROFILES_HELP = "Extra profile directory (models/*.yaml, gpus/*.yaml); repeatable. Also KVTOOL_PROFILES."


def json_option(rich_help_panel: str | None = None) -> Any:
    """The ``--json`` flag, optionally in a help panel of its own (``kvtool simulate`` groups its options)."""
    return typer.Option("--json", help=JSON_HELP, rich_help_panel=rich_help_panel)


JsonOpt = Annotated[bool, json_option()]
ProfilesOpt = Annotated[Optional[list[str]], typer.Option("--profiles", help=PROFILES_HELP, show_default=False)]
