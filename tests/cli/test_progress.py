"""The one progress helper: bars and live lines on stderr only, bars only on a terminal."""

from __future__ import annotations

import io
import sys

import kvtool.cli.progress as progress_module
from kvtool.cli.capture import capture_line
from kvtool.cli.progress import StderrProgress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_count_on_a_terminal_is_rewritten_in_place(monkeypatch):
    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    with StderrProgress() as progress:
        progress.line(capture_line(0, 0, 0, 0))
        progress.line(capture_line(0, 0, 0, 0))  # unchanged text: nothing written
        progress.line(capture_line(1234, 56, 2, 1))
        progress.line(capture_line(1234, 57, 0, 0))  # shorter: padded over the longer line
    longest = "captured 1,234 events in 56 batches, 2 batches missed, 1 malformed frames"
    assert fake.getvalue() == (
        "\rcaptured 0 events in 0 batches"
        "\r" + longest + "\r" + "captured 1,234 events in 57 batches".ljust(len(longest)) + "\n"
    )


def test_live_count_off_a_terminal_is_one_plain_line_every_ten_seconds(monkeypatch):
    fake = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", fake)
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    with StderrProgress() as progress:
        progress.line("captured 1 events in 1 batches")  # t = 0 s: too early
        clock[0] += progress_module.NON_TTY_EVERY_S
        progress.line("captured 2 events in 2 batches")  # t = 10 s: printed
        clock[0] += 1
        progress.line("captured 3 events in 3 batches")  # t = 11 s: too early again
    assert progress_module.NON_TTY_EVERY_S == 10.0
    assert fake.getvalue() == "captured 2 events in 2 batches\n"


def test_no_bars_off_a_terminal(monkeypatch):
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    with StderrProgress(label="analyze", stages=("reading", "sorting")) as progress:
        assert progress.stage is None and progress.task is None  # callers skip the progress work
    assert fake.getvalue() == ""


def test_no_bars_when_disabled_even_on_a_terminal(monkeypatch):
    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    with StderrProgress(enabled=False, stages=("reading",)) as progress:
        assert progress.stage is None and progress.task is None
        progress.line("not shown")
    assert fake.getvalue() == ""


def test_bars_on_a_terminal_go_to_stderr_only(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with StderrProgress(label="analyze", stages=("reading", "sorting")) as progress:
        assert progress.stage is not None and progress.task is not None
        progress.stage("reading")
        progress.stage("sorting")
        progress.task("serve block 16", 5, 10)
        progress.task("serve block 16", 10, 10)
    assert capsys.readouterr().out == ""
