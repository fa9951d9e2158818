"""Shared output plumbing: stdout/stderr consoles, JSON from dataclasses, and error reporting.

stdout carries the answer (rich tables or ``--json``); stderr carries progress, warnings and errors.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from kvtool.core.errors import EXIT_INTERRUPTED, KvtoolError
from kvtool.core.jsonable import to_jsonable

F = TypeVar("F", bound=Callable[..., Any])


def stdout_console(*, highlight: bool = True):
    """The console of the answer; ``highlight=False`` skips rich's regex highlighter (for text whose numbers are
    formatted already)."""
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here, which reads as "checks failed" (README exit codes) when a table is piped into
            # `head`; stop writing and let handle_errors end the command as --json output does (exit 0)
            import os

            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise BrokenPipeError

    return _StdoutConsole(soft_wrap=False, highlight=highlight)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def print_json(value: Any) -> None:
    """Print one JSON object on stdout and nothing else."""
    import json  # here, not at the top: a table answer does not pay for the import

    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def print_answer(
    result: Any, json_output: bool, render: Callable[[Any, Any], None], warnings: tuple[str, ...] | list[str]
) -> None:
    """A command's answer: one JSON object (which carries the warnings), or ``render(result, console)`` on stdout
    (numbers formatted already, so without rich's regex highlighter) and each warning on stderr."""
    if json_output:
        print_json(result)
        return
    render(result, stdout_console(highlight=False))
    for warning in warnings:
        warn(warning)


def warn(message: str) -> None:
    """A one-line warning on stderr."""
    sys.stderr.write(f"Warning: {' '.join(message.split())}\n")


def report_error(err: KvtoolError) -> int:
    sys.stderr.write(f"Error: {err.one_line()}\n")
    if err.tip:
        sys.stderr.write(f"Tip: {' '.join(err.tip.split())}\n")
    return err.exit_code


def handle_errors(func: F) -> F:
    """Decorator for CLI commands: KvtoolError -> one-line error and its exit code."""
    import typer

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except KvtoolError as err:
            raise typer.Exit(report_error(err)) from None
        except KeyboardInterrupt:
            sys.stderr.write("Error: interrupted\n")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None

    return wrapper  # type: ignore[return-value]
