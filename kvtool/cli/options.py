"""Options that several commands share, declared once as ``Annotated`` aliases (huggingface_hub's _cli_utils).

Every command binds ``--json`` to the parameter ``json_output``:

    def command(..., json_output: JsonOpt = False) -> None:
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvtool.core.errors import UsageError

JSON_HELP = "Print one JSON object on stdout and nothing else (no tables)."
PROFILES_HELP = "Extra profile directory (models/*.yaml, gpus/*.yaml); repeatable. Also KVTOOL_PROFILES."


def json_option(rich_help_panel: str | None = None) -> Any:
    """The ``--json`` flag, optionally in a help panel of its own (``kvtool simulate`` groups its options)."""
    return typer.Option("--json", help=JSON_HELP, rich_help_panel=rich_help_panel)


JsonOpt = Annotated[bool, json_option()]


def workers_option(what: str, rich_help_panel: str | None = None) -> Any:
    """``--workers N``: ``what`` ("Several files: run them", "--sweep: run the points") on a local Dask cluster
    (kvtool.core.dask_map; analyze and simulate --sweep)."""
    return typer.Option(
        None,
        "--workers",
        help=f"{what} on a local Dask cluster of N worker processes.",
        rich_help_panel=rich_help_panel,
    )


def scheduler_option(what: str, rich_help_panel: str | None = None) -> Any:
    """``--scheduler ADDRESS``: ``what`` on an existing Dask cluster."""
    return typer.Option(
        None,
        "--scheduler",
        help=f"{what} on the Dask cluster at this address (tcp://host:8786).",
        rich_help_panel=rich_help_panel,
    )


ProfilesOpt = Annotated[Optional[list[str]], typer.Option("--profiles", help=PROFILES_HELP, show_default=False)]


def path_option(default: Any, *names: str, empty_tip: str, needs: tuple[str, str] | None = None, **kwargs: Any) -> Any:
    """A ``Path`` option that refuses an empty value with a usage error naming the option (exit 2).

    typer turns ``''`` into ``Path('.')``, the current folder, before the command sees it: ``--plot ''`` wrote its
    charts into the current folder, ``capture -o ''`` ended in a traceback. typer's ``parser`` receives the raw
    string, so the check is made there. ``empty_tip`` says what to give instead; the other arguments are
    ``typer.Option``'s. The error is a :class:`UsageError`, which ``kvtool.cli.run`` reports as the commands do.

    ``needs``: (an optional module, the feature) that a given value needs, checked as the option is parsed, before
    any work (``--plot`` needs matplotlib: a missing one was a traceback after the whole analysis); see
    ``kvtool.core.extras.require``.
    """
    option = names[0]

    def path(value: str | Path) -> Path:  # its name is the metavar --help shows: PATH, as for a plain Path option
        if isinstance(value, Path):
            return value
        if value == "":
            raise UsageError(f"{option} is empty", where=option, tip=empty_tip)
        if needs is not None:
            from kvtool.core.extras import require

            require(needs[0], feature=needs[1])
        return Path(value)

    return typer.Option(default, *names, parser=path, **kwargs)
