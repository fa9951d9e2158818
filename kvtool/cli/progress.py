"""Progress on stderr, the one helper every command uses: bars only when stderr is a terminal.

stdout carries the answer, so progress never goes there.  Off a terminal (a pipe, a CI log) there are no bars;
a live count (``kvtool capture``) prints one plain line every ``NON_TTY_EVERY_S`` seconds instead, so a log still
shows that the command is alive.

    with StderrProgress(enabled=big_input, label="analyze", stages=STAGES) as progress:
        load(path, progress=progress.stage)         # one bar over named stages
    with StderrProgress(enabled=long_run) as progress:
        run(progress=progress.task)                 # one bar per labelled task: task(label, done, total)
    with StderrProgress() as progress:
        capture(on_progress=lambda n: progress.line(f"captured {n:,} events"))  # one live line
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

NON_TTY_EVERY_S = 10.0  # how often a live line is printed when stderr is not a terminal


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class StderrProgress:
    """Progress bars (rich, transient) and a live status line on stderr; bars only on a terminal.

    Args:
        enabled: False turns every bar off (small inputs); the live line of a non-terminal is off too.
        label: a prefix for the stage bar ("analyze" -> "analyze: sorting").
        stages: the named stages of :meth:`stage`, in order; the bar's total is their number.
    """

    def __init__(self, enabled: bool = True, *, label: str = "", stages: Sequence[str] = ()) -> None:
        self.enabled = enabled
        self.tty = enabled and stderr_is_terminal()
        self.label = label
        self.stages = tuple(stages)
        self._bar: Any = None  # rich.progress.Progress, started on first use
        self._tasks: dict[str, Any] = {}  # task label -> rich task id
        self._line: str | None = None  # the live line last written on the terminal
        self._next_line_s = time.monotonic() + NON_TTY_EVERY_S

    def __enter__(self) -> StderrProgress:
        if self.tty and self.stages:
            self._stage_task()  # the stage bar shows from the start ("starting", 0 done)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
        if self._line is not None:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._line = None

    @property
    def stage(self):
        """``stage(name)`` callback for one bar over ``stages``, or None off a terminal (callers skip the work)."""
        return self._stage if self.tty else None

    @property
    def task(self):
        """``task(label, done, total)`` callback for one bar per label, or None off a terminal."""
        return self._task if self.tty else None

    def _stage_task(self) -> Any:
        if "stages" not in self._tasks:
            self._tasks["stages"] = self._started().add_task("starting", total=len(self.stages))
        return self._tasks["stages"]

    def _stage(self, name: str) -> None:
        done = self.stages.index(name) if name in self.stages else 0
        self._started().update(self._stage_task(), completed=done, description=name)

    def _task(self, label: str, done: int, total: int) -> None:
        bar = self._started()
        if label not in self._tasks:
            self._tasks[label] = bar.add_task(label, total=total)
        bar.update(self._tasks[label], completed=done)

    def line(self, text: str) -> None:
        """A live status line: rewritten in place on a terminal, printed every NON_TTY_EVERY_S s elsewhere."""
        if not self.enabled:
            return
        if self.tty:
            if text != self._line:
                sys.stderr.write("\r" + text.ljust(len(self._line or "")))  # pad over a longer line
                sys.stderr.flush()
                self._line = text
        elif time.monotonic() >= self._next_line_s:
            sys.stderr.write(text + "\n")
            self._next_line_s = time.monotonic() + NON_TTY_EVERY_S

    def _started(self):
        if self._bar is None:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from kvtool.cli.output import stderr_console

            if self.stages:
                columns = (TextColumn(f"{self.label}: {{task.description:<14}}"), BarColumn(), TimeElapsedColumn())
                self._bar = Progress(*columns, console=stderr_console(), transient=True)
            else:
                self._bar = Progress(console=stderr_console(), transient=True)
            self._bar.__enter__()
        return self._bar
