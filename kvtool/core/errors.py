"""The one exception family for everything a user can cause, and the documented exit codes.

Core code raises these; only the CLI layer turns them into a one-line ``Error:`` on stderr
(plus an optional ``Tip:`` line) and an exit code.  A traceback is a bug.
"""

from __future__ import annotations

# Documented exit codes (README "Exit codes").  Keep this the single source.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # the command ran, and what it checked failed (repro verdicts, analyze --strict)
EXIT_USAGE = 2  # bad options or values: unknown model, zero/negative sizes, unknown scenario
EXIT_INPUT = 3  # an input file is missing, unreadable, or not in an accepted format
EXIT_INCONCLUSIVE = 4  # the command ran and could not decide either way (vllm isolation: a control did not share)
EXIT_ALERT = 5  # kvtool watch: an alert fired (--once: fires now, or fired during a --replay)
# a command needs an optional extra that is not installed (torch for repro, matplotlib for --plot, ...): the
# install is incomplete, not the command line; 69 is sysexits.h's EX_UNAVAILABLE ("a support program ... does
# not exist"), away from the small codes a command's own outcomes take
EXIT_MISSING_EXTRA = 69
EXIT_INTERRUPTED = 130  # Ctrl-C


class KvtoolError(Exception):
    """Base class: a problem the user can fix.  ``where`` names the file, row or field."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, where: str | None = None, tip: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.tip = tip

    def one_line(self) -> str:
        text = self.message
        if self.where:
            text = f"{text} ({self.where})"
        return " ".join(text.split())  # always exactly one line


class UsageError(KvtoolError):
    """An option or value is wrong (exit 2)."""

    exit_code = EXIT_USAGE


class InputFileError(KvtoolError):
    """An input file is missing, unreadable or malformed (exit 3)."""

    exit_code = EXIT_INPUT


class MissingExtraError(KvtoolError):
    """A feature needs an optional extra that is not installed or does not import (exit 69); see core/extras.py."""

    exit_code = EXIT_MISSING_EXTRA


class CheckFailed(KvtoolError):
    """The command ran and its checks failed (exit 1); used by --strict modes."""

    exit_code = EXIT_CHECK_FAILED
