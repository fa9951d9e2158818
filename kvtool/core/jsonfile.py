"""Reading JSON with bounds, errors in kvtool's words: :func:`loads_bounded` for any JSON text (each line of a
JSON-lines file too), and :func:`read_json_object` for a file that must hold one object (a Hugging Face config.json).

Python's json parser recurses once per level of nesting: a line of 100,000 ``[`` ended in a RecursionError
traceback in every reader (analyze's vLLM events, ``estimate --config``, ``simulate --trace``, ``vllm isolation
--replay``).  Every reader of JSON a user gives parses it through :func:`loads_bounded`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError

# Deeper nesting is refused: kvtool's JSON (configs, events, traces, records) nests fewer than 10 levels, and 200
# keeps the parser's recursion far below Python's limit (1,000 frames) wherever it is called from.
MAX_JSON_DEPTH = 200
# an escape (skipped whole), a quote or a bracket; compiled on first use (`kvtool estimate` never needs it)
_STRUCTURE = r'\\.|["\[\]{}]'


def loads_bounded(text: str | bytes, where: str) -> Any:
    """``json.loads(text)``, with nesting deeper than MAX_JSON_DEPTH refused as an InputFileError (exit 3) naming
    ``where`` (the file, and the line for JSON lines); invalid JSON raises json.JSONDecodeError as json does, for
    the caller to word."""
    import json  # here, not at import: `kvtool estimate --model NAME` reads no JSON

    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if _nesting_depth(text) > MAX_JSON_DEPTH:
        raise _too_deep(where)
    try:
        return json.loads(text)
    except RecursionError:  # a caller already deep in its own stack: the same answer
        raise _too_deep(where) from None


def _too_deep(where: str) -> InputFileError:
    return InputFileError(
        f"JSON nested deeper than {MAX_JSON_DEPTH} levels: refused (no kvtool input nests that deep)", where=where
    )


def _nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects outside strings.  Text with fewer brackets than the limit cannot
    nest deeper: counted in C, so ordinary lines never reach the scan."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0
    import re

    depth = deepest = 0
    in_string = False
    for match in re.finditer(_STRUCTURE, text, re.DOTALL):
        token = match.group()
        if token == '"':
            in_string = not in_string
        elif in_string or len(token) == 2:  # inside a string, or an escape
            continue
        elif token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def read_json_object(file: Path) -> dict[str, Any]:
    """The object in ``file``; an unreadable, empty, non-JSON or non-object file is an InputFileError (exit 3).

    json's own "Expecting value at line 1 column 1" does not say that a file is empty, and transformers words the
    same failures as an OSError, so both estimate and repro read config.json through here."""
    import json  # here: `kvtool estimate --model NAME` reads a YAML profile and never pays for the import

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(f"cannot read: {err}", where=str(file)) from None
    if not text.strip():
        raise InputFileError("the file is empty", where=str(file), tip="a config.json holds one JSON object")
    try:
        data = loads_bounded(text, str(file))
    except json.JSONDecodeError as err:
        raise InputFileError(
            f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}", where=str(file)
        ) from None
    if not isinstance(data, dict):
        raise InputFileError("config.json must hold a JSON object", where=str(file))
    return data
