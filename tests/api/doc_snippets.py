"""Run the Python snippets of a Markdown page and check (or rewrite) the output shown under each.

A page is a sequence of fenced blocks.  Every ```` ```python ```` block runs, in order, in one namespace; when the
next block is a ```` ```text ```` block, it is the output that snippet prints (compared with trailing spaces
stripped).  ``python -m tests.api.doc_snippets docs/diagnoses.md --write`` rewrites the ```text blocks with what
the snippets print now; the test suite checks them (tests/api/test_docs.py), so a page cannot drift from the code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import sys
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Snippet:
    code: str
    expected: str | None  # the ```text block that follows, None when there is none
    output_span: tuple[int, int] | None  # where that block's body is in the page


def snippets(text: str) -> list[Snippet]:
    blocks = list(_FENCE.finditer(text))
    found = []
    for i, block in enumerate(blocks):
        if block.group(1) != "python":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        is_output = after is not None and after.group(1) == "text" and not text[block.end() : after.start()].strip()
        found.append(
            Snippet(
                code=block.group(2),
                expected=after.group(2) if is_output and after is not None else None,
                output_span=(after.start(2), after.end(2)) if is_output and after is not None else None,
            )
        )
    return found


def _clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def run(path: Path, namespace: dict | None = None) -> list[tuple[Snippet, str]]:
    """Run every snippet of the page (in ``namespace``, where given); return each with what it printed."""
    namespace = {"__name__": "__doc_snippets__"} if namespace is None else namespace
    results = []
    for number, snippet in enumerate(snippets(path.read_text()), 1):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(snippet.code, f"{path.name} snippet {number}", "exec"), namespace)  # noqa: S102
        results.append((snippet, _clean(out.getvalue()) if out.getvalue() else ""))
    return results


def write(path: Path) -> None:
    """Rewrite the output blocks with what the snippets print now."""
    text = path.read_text()
    pieces, last = [], 0
    for snippet, got in run(path):
        if snippet.output_span is None:
            continue
        start, end = snippet.output_span
        pieces += [text[last:start], got]
        last = end
    path.write_text("".join(pieces) + text[last:])


if __name__ == "__main__":
    for name in sys.argv[1:]:
        if name != "--write":
            (write if "--write" in sys.argv else run)(Path(name))
