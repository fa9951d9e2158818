"""Reading a JSON file that must hold one object (a Hugging Face config.json), with errors in kvtool's words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError


def read_json_object(file: Path) -> dict[str, Any]:
    """The object in ``file``; an unreadable, empty, non-JSON or non-object file is an InputFileError (exit 3).

    json's own "Expecting value at line 1 column 1" does not say that a file is empty, and transformers words the
    same failures as an OSError, so both estimate and repro read config.json through here."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(f"cannot read: {err}", where=str(file)) from None
    if not text.strip():
        raise InputFileError("the file is empty", where=str(file), tip="a config.json holds one JSON object")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputFileError(
            f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}", where=str(file)
        ) from None
    if not isinstance(data, dict):
        raise InputFileError("config.json must hold a JSON object", where=str(file))
    return data
