"""The thin command-line layer: one typer app, one command module per capability.

Command modules parse options, call one core function and hand the result to a renderer.
Nothing heavy is imported here: ``kvtool --help`` and ``kvtool estimate`` never load torch or pandas.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from kvtool import __version__

# Command name -> the module whose register(app) adds it.  Only the module of the command being run is
# imported (see build_app), so `kvtool estimate` pays for no other command's imports.
COMMAND_MODULES: dict[str, str] = {
    "estimate": "kvtool.cli.estimate",
    "models": "kvtool.cli.estimate",
    "repro": "kvtool.cli.repro",
    "analyze": "kvtool.cli.analyze",
    "simulate": "kvtool.cli.simulate",
    "capture": "kvtool.cli.capture",
    "vllm": "kvtool.cli.vllm_isolation",
    "record": "kvtool.cli.record",
    "explain": "kvtool.cli.explain",
    "plan": "kvtool.cli.plan",
    "watch": "kvtool.cli.watch",
}


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvtool {__version__}")
        raise typer.Exit()


def main(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Diagnose and plan the KV cache of LLM inference."""


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with just the module that provides command ``only``."""
    from importlib import import_module

    new_app = typer.Typer(
        name="kvtool",
        help="Diagnose and plan the KV cache of LLM inference.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    new_app.callback()(main)
    modules = [COMMAND_MODULES[only]] if only in COMMAND_MODULES else list(dict.fromkeys(COMMAND_MODULES.values()))
    for name in modules:
        import_module(name).register(new_app)
    return new_app


def _command_named(args: Sequence[str]) -> str | None:
    """The command word of an argument list (the first argument that is not an option), if any."""
    for arg in args:
        if not arg.startswith("-"):
            return arg
    return None


def __getattr__(name: str):
    # `kvtool.cli.app`: the full app (for typer's CliRunner and tools that import it), built on first use.
    if name == "app":
        globals()["app"] = full = build_app()
        return full
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code, with usage errors as one ``Error:`` line.

    This is the console-script entry point (``kvtool``) and what ``python -m kvtool`` calls.
    """
    from typer._click import exceptions  # typer >= 0.26 carries its own click (pyproject)

    from kvtool.cli.output import report_error
    from kvtool.core.errors import EXIT_INTERRUPTED, KvtoolError

    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(build_app(_command_named(args)))
    try:
        result = command.main(args=args, prog_name="kvtool", standalone_mode=False)
    except exceptions.UsageError as err:
        return _usage_error(err)
    except KvtoolError as err:  # raised while the options are parsed (path_option's empty path)
        return report_error(err)
    except exceptions.ClickException as err:
        sys.stderr.write(f"Error: {' '.join(err.format_message().split())}\n")
        return err.exit_code
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("Error: interrupted\n")
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else 0


def _usage_error(err) -> int:
    """A bad command line: one ``Error:`` line and a ``Tip:`` naming the command's --help (the bare ``kvtool``
    prints the help on stdout instead)."""
    from kvtool.core.errors import EXIT_USAGE

    if type(err).__name__ == "NoArgsIsHelpError":
        sys.stdout.write(err.format_message() + "\n")
        return EXIT_USAGE
    path = err.ctx.command_path if err.ctx is not None else "kvtool"
    sys.stderr.write(f"Error: {' '.join(err.format_message().split())}\n")
    sys.stderr.write(f"Tip: run '{path} --help' for the options.\n")
    return EXIT_USAGE


# Commands that end without the interpreter's teardown (see _exit_without_teardown).
NO_TEARDOWN = ("analyze", "estimate")


def main_entry() -> None:
    code = run()
    if _command_named(sys.argv[1:]) in NO_TEARDOWN:
        _exit_without_teardown(code)
    sys.exit(code)


def _exit_without_teardown(code: int) -> None:
    """End the process once the output is flushed, skipping the interpreter's teardown: ``kvtool analyze``
    leaves hundreds of MB of arrays and many modules whose freeing one by one took about 0.02 s of its 0.65 s
    (5M-event benchmark); ``kvtool estimate``, a start-up-bound command, spent about 5 % of its instructions
    freeing the ~260 modules it loaded (callgrind).  Neither needs an exit handler: they write only to stdout and
    stderr, and analyze's files are closed and written."""
    import os

    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout has gone (as handle_errors: not an error of ours)
        pass
    sys.stderr.flush()
    os._exit(code)
