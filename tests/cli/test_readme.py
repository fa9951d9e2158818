"""The README's install and test commands: the first gives a working estimate with the base install, and the Test
section is exactly what CI (.ci/run) runs, so a newcomer's first steps work."""

from __future__ import annotations

import re

from tests.support import REPO_ROOT


def _commands_after(text: str, heading: str) -> list[str]:
    """The lines of the first ```bash block under the README heading ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"no bash block under '## {heading}'"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _ci_commands() -> list[str]:
    lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pip install"))
    return [line.strip() for line in lines[start:] if line.strip() and not line.lstrip().startswith("#")]


def test_the_first_install_command_is_the_base_install_then_estimate():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert _commands_after(readme, "Install") == [
        "pip install kvtool            # from a clone: pip install -e .",
        "kvtool estimate --model llama-3.1-8b --gpu L4",
    ]


def test_readme_test_commands_are_what_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    checks = _commands_after(readme, "Test")
    assert checks[0] == 'pip install "torch==2.13.0+cpu" -e ".[dev]"'  # the CPU-only wheel named: never CUDA
    assert checks == _ci_commands()
