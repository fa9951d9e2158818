"""The built-in profiles parsed ahead of time, as JSON: what ``kvtool estimate`` reads instead of importing PyYAML.

Importing PyYAML compiles, in pure Python, a regular expression over most of Unicode (yaml/reader.py's
``NON_PRINTABLE``): 88M instructions (callgrind), more than a tenth of an estimate, to read two small files.
``profiles/parsed.json`` holds, for each built-in profile, its text and what PyYAML's safe loader makes of it.  A
profile whose text is not the one recorded there (edited since, or any user profile) is parsed by PyYAML as before,
so the file can go stale (an estimate is then slower) but never gives other values than the YAML.

    python -m kvtool.estimate.parsed_profiles           # rewrite profiles/parsed.json from the YAML files
    python -m kvtool.estimate.parsed_profiles --check   # exit 1 when it is out of date (tests/estimate does this)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

FILE_NAME = "parsed.json"
SOURCE_ROOT = Path(__file__).resolve().parents[2] / "profiles"  # the repository's profiles/, shipped as kvtool.profiles
FORMAT = 1
KINDS = ("gpus", "models")


def cached(file: Path, text: str, root: Path) -> dict | None:
    """What PyYAML makes of ``text``, the content of ``file``, when ``file`` is one of the built-in profiles under
    ``root`` recorded there with exactly this text; None otherwise (the caller parses the YAML)."""
    if file.parent.parent != root or file.parent.name not in KINDS:
        return None
    entry = _entries(root / FILE_NAME).get(f"{file.parent.name}/{file.name}")
    if entry is None or entry[0] != text:
        return None
    return json.loads(entry[1])  # a fresh dict each time, as a parse would give


@functools.lru_cache(maxsize=4)
def _entries(path: Path) -> dict[str, list[str]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict) or value.get("format") != FORMAT or not isinstance(value.get("profiles"), dict):
        return {}
    return value["profiles"]


def build(root: Path) -> str:
    """The text of ``parsed.json`` for the profiles under ``root`` (``root/gpus/*.yaml``, ``root/models/*.yaml``):
    each file's text and its safe-loaded value as JSON, for every file whose value JSON carries exactly."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # kvtool.estimate.profiles._read_yaml's loader
    profiles: dict[str, list[str]] = {}
    for kind in KINDS:
        for file in sorted((root / kind).glob("*.yaml")):
            text = file.read_text(encoding="utf-8")
            try:
                data = yaml.load(text, Loader=loader)
            except yaml.YAMLError:
                continue  # the loader reports it, from the YAML
            encoded = json.dumps(data, sort_keys=True, ensure_ascii=False, allow_nan=False, default=_not_json)
            if isinstance(data, dict) and _same(json.loads(encoded), data):
                profiles[f"{kind}/{file.name}"] = [text, encoded]
    return json.dumps({"format": FORMAT, "profiles": profiles}, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _not_json(value: Any) -> str:
    return f"<{type(value).__name__}>"  # a date or bytes: the roundtrip check below leaves the file out


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (JSON would turn an int key or a tuple into something else)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the YAML profiles")
    args = parser.parse_args(argv)
    root = SOURCE_ROOT
    target = root / FILE_NAME
    text = build(root)
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target} is out of date: run 'python -m kvtool.estimate.parsed_profiles'")
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target} ({len(json.loads(text)['profiles'])} profiles)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
