"""Every table of every command keeps every digit at 60, 80 and 100 columns and with no terminal (issue 24).

rich used to fit a wide table by cutting cells with an ellipsis (``131,…`` for 131,072 in estimate --compare,
``17,1…``, ``0.1…``).  The reference for each command is the same command rendered at 1,000 columns, where
nothing wraps: a narrower render may wrap a cell, fold a header or split the table into parts that repeat the key
column, but it may not lose a character, nor break a number over two lines.  Three checks at each width:

- no ``…`` anywhere;
- every character of the wide render (spaces and box drawing aside) is still there, as often or more (a split table
  repeats its key column, hence "or more");
- every number of the wide render (``17,179,869,184``, ``0.19x``'s ``0.19``) is still one word, as often or more.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest
from rich.console import Console

from tests.support import REPO_ROOT

WIDTHS = (60, 80, 100, None)  # None: no COLUMNS and no terminal, as in a pipe (rich's default then)
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing: its count changes with the number of parts
NUMBER = re.compile(r"\d(?:[\d,.]*\d)?")

# Data paths are relative to the repository root (the test runs there), so a path is no word longer than 60.
COMMANDS = {
    "estimate": ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4"],
    "estimate -v": ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "-s", "8192", "-b", "4", "-v"],
    "estimate --compare": ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "-s", "131072", "--compare"],
    "estimate sweep": ["estimate", "--model", "llama-3.1-8b", "--gpu", "H100", "-s", "4096,131072", "-b", "1,64"],
    "estimate without a GPU": ["estimate", "--model", "llama-3.1-8b", "-s", "8192", "--compare"],
    "estimate tp pp": [
        "estimate",
        "--model",
        "qwen2.5-72b",
        "--gpu",
        "H100",
        "--tp",
        "2",
        "--pp",
        "2",
        "-s",
        "4096",
        "-v",
    ],
    "models": ["models"],
    "repro --list": ["repro", "--list"],
    "analyze": ["analyze", "tests/data/analyze/leak_preempt.csv"],
    "analyze rejected rows": ["analyze", "tests/data/analyze/bad_rows.csv"],
    "analyze fleet": ["analyze", "tests/data/analyze/basic.csv", "tests/data/analyze/reuse.csv"],
    "analyze vLLM events": ["analyze", "tests/data/vllm-events/small-cache-evictions-full-report.jsonl"],
    "simulate": ["simulate", "--trace", "tests/data/simulate/azure-2023-code-head20.csv", "--kv-tokens", "20000"],
    "simulate --serve": [
        "simulate",
        "--trace",
        "tests/data/simulate/azure-2023-conv.csv",
        "--requests",
        "200",
        "--kv-tokens",
        "40000",
        "--serve",
    ],
    "vllm isolation --replay": ["vllm", "isolation", "--replay", "tests/data/isolation/vllm-0.32-real.json"],
}


def _non_space(text: str) -> Counter[str]:
    return Counter(ch for ch in BOX.sub("", text) if not ch.isspace())


def assert_nothing_lost(wide: str, narrow: str, where: str) -> None:
    assert "…" not in narrow, f"{where}: an ellipsis cut a cell:\n{narrow}"
    lost = _non_space(wide) - _non_space(narrow)
    assert not lost, f"{where}: characters lost {dict(lost)}:\n{narrow}"
    broken = Counter(NUMBER.findall(wide)) - Counter(NUMBER.findall(narrow))
    assert not broken, f"{where}: numbers cut or broken over two lines {dict(broken)}:\n{narrow}"


def _cli_output(run_cli, monkeypatch, args: list[str], width: int | None) -> str:
    if width is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(width))
    result = run_cli(*args)
    assert result.exit_code in (0, 1), result.stderr  # 1: a finding (a leak, checks failed), still a report
    return result.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_keeps_every_digit_at_any_width(name, run_cli, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("LINES", raising=False)
    args = COMMANDS[name]
    wide = _cli_output(run_cli, monkeypatch, args, 1000)
    assert wide.strip()
    for width in WIDTHS:
        narrow = _cli_output(run_cli, monkeypatch, args, width)
        assert_nothing_lost(wide, narrow, f"{name} at {width or 'no terminal'} columns")


def _render(draw, width: int) -> str:
    out = io.StringIO()
    draw(Console(file=out, width=width, color_system=None, soft_wrap=False))
    return out.getvalue()


def _repro_report():
    from tests.repro.test_repro_render import _report

    return _report()


def _draw_repro(console) -> None:
    from kvtool.repro.render import render_report

    render_report(_repro_report(), console)


def _draw_capture(console) -> None:
    from kvtool.vllm.events.capture import CaptureResult
    from kvtool.vllm.events.render import capture_table

    result = CaptureResult(
        "captures/prefix-cache-run-2026-12-01.jsonl", "tcp://127.0.0.1:5557", "connect", 1_398_211, 52_004,
        1, 52_006, 1, 2, 1, 1, 0, None, 3, ("not a msgpack array", "unknown event tag 'Foo'"),
        "captures/prefix-cache-run-2026-12-01.jsonl.malformed", 3_611.25, "signal",
    )  # fmt: skip
    console.print(capture_table(result))


def _draw_record(console) -> None:
    from kvtool.vllm.events.render import record_table
    from kvtool.vllm.recorder.launch import RecordedFile, RecordResult

    files = (
        RecordedFile("runs/llama-3.1-8b-h100/events.dp0.parquet", 0, 17_179_869, 1_398_211, 12.5, None, False),
        RecordedFile("runs/llama-3.1-8b-h100/events.dp1.parquet", 1, 16_060_522, 1_398_207, 11.9, "disk full", True),
    )
    console.print(record_table(RecordResult(0, 3_611.25, files)))


RENDERERS = {"repro": _draw_repro, "capture": _draw_capture, "record": _draw_record}


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_renderer_keeps_every_digit_at_any_width(name):
    # repro's run takes seconds and prints heap addresses, capture and record need an engine: their renderers get
    # fixed results (repro's is the golden file's hand-built report)
    wide = _render(RENDERERS[name], 1000)
    for width in (60, 80, 100):
        assert_nothing_lost(wide, _render(RENDERERS[name], width), f"{name} at {width} columns")
