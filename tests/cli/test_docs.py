"""docs/cli.md is generated from --help and must not drift from it (simonw/llm's cog --check, without cog)."""

from __future__ import annotations

from kvtool.cli import COMMAND_MODULES
from kvtool.cli.docs import DEFAULT_OUTPUT, WIDTH, render


def test_docs_cli_md_matches_the_help_texts():
    expected = render()
    current = DEFAULT_OUTPUT.read_text(encoding="utf-8")
    assert current == expected, "docs/cli.md is out of date: run 'python -m kvtool.cli.docs'"


def test_every_command_has_a_section_at_the_fixed_width():
    text = DEFAULT_OUTPUT.read_text(encoding="utf-8")
    for command in COMMAND_MODULES:
        assert f"## `kvtool {command}`" in text
    box_lines = [line for line in text.splitlines() if line.startswith(("╭", "│", "╰"))]
    assert box_lines and all(len(line) == WIDTH for line in box_lines)
    assert "\x1b[" not in text  # no colour codes
