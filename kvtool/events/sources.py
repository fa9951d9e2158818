"""Which events files ``kvtool analyze`` reads, and which of them make one engine's pool.

Arguments are files, directories (searched recursively), globs (``logs/*.csv``, ``fleet/**/*.parquet``) or fsspec
URLs (``s3://bucket/fleet/``, ``file:///data/*.csv``).  Files of one engine are one pool: a Hive partition in the
path (``instance=a/date=2026-11-30/part-0.parquet``; the keys in ``POOL_KEYS``) names the engine, so a rotating set
of files under ``instance=a/`` is analysed together; without one, each file is its own engine.  A file may also
hold several engines' rows with an ``instance`` or ``engine`` column (kvtool.events.fleet splits those).
"""

from __future__ import annotations

import dataclasses
import glob as globbing
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from kvtool.core.errors import InputFileError, UsageError

EVENT_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
POOL_KEYS = ("instance", "engine", "host", "rank", "dp_rank")  # Hive partition keys that tell engines apart
_GLOB_CHARS = set("*?[")


@dataclasses.dataclass(frozen=True)
class PoolFiles:
    """The files of one engine (one pool), analysed together as one unit of work."""

    name: str  # the engine: its Hive partition values ("a", "a/rank=1"), else the file's name
    paths: tuple[str, ...]  # local paths or fsspec URLs, in name order


def find_pool_files(arguments: Sequence[str]) -> tuple[PoolFiles, ...]:
    """Expand the arguments into files and group them into pools (see the module docstring), sorted by name."""
    paths: list[str] = []
    for argument in arguments:
        if argument == "":  # Path("") is the current folder: every events file below it was analysed
            raise UsageError(
                "an empty argument names no events file",
                where="EVENTS",
                tip="give files, a directory ('.' for the current one) or a glob",
            )
        found = _expand_url(argument) if _is_remote(argument) else _expand_local(argument)
        if not found:  # an input that is missing or empty (README "Exit codes": 3)
            raise InputFileError(
                "no events files found",
                where=argument,
                tip=f"give files, a directory with {', '.join(EVENT_SUFFIXES)} files, or a glob",
            )
        paths += found
    paths = list(dict.fromkeys(paths))  # a file named twice is read once
    groups: dict[str, list[str]] = {}
    for path, name in zip(paths, _pool_names(paths)):
        groups.setdefault(name, []).append(path)
    return tuple(PoolFiles(name, tuple(sorted(files))) for name, files in sorted(groups.items()))


def is_single_file(arguments: Sequence[str]) -> bool:
    """One argument naming one local file (or a missing path, reported by the loader): the in-process report."""
    if len(arguments) != 1:
        return False
    argument = arguments[0]
    if _is_remote(argument) or set(argument) & _GLOB_CHARS:
        return False
    return not Path(argument).is_dir()


def _is_remote(argument: str) -> bool:
    return "://" in argument


def _is_events_file(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.lower().endswith(EVENT_SUFFIXES) and not base.startswith((".", "_"))


def _expand_local(argument: str) -> list[str]:
    if set(argument) & _GLOB_CHARS:
        return sorted(p for p in globbing.glob(argument, recursive=True) if Path(p).is_file())
    path = Path(argument)
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*") if p.is_file() and _is_events_file(p.name))
    if not path.exists():
        raise InputFileError("events file not found", where=argument)
    return [argument]


def _expand_url(argument: str) -> list[str]:
    from kvtool.core.extras import require

    require("fsspec", feature="kvtool analyze on a URL", where=argument)
    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(argument)
        if set(root) & _GLOB_CHARS:
            found = [p for p in fs.glob(root) if fs.isfile(p)]
        elif fs.isdir(root):
            found = [p for p in fs.find(root) if _is_events_file(p)]
        elif fs.exists(root):
            found = [root]
        else:
            raise InputFileError("events file not found", where=argument)
    except (OSError, ValueError, ImportError) as err:
        raise InputFileError(f"cannot list the URL: {type(err).__name__}", where=argument) from None
    return sorted(fs.unstrip_protocol(p) for p in found)


def _pool_names(paths: list[str]) -> list[str]:
    """Each file's engine: its Hive pool partitions, else its path below the files' common folder, no suffix."""
    parts = [PurePosixPath(p.split("://", 1)[-1]).parts for p in paths]
    common = 0
    if len(parts) > 1:
        while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
            common += 1
    else:
        common = len(parts[0]) - 1 if parts else 0
    names = []
    for p in parts:
        hive = [seg.split("=", 1) for seg in p[:-1] if "=" in seg]
        keyed = [(k.lower(), v) for k, v in hive if k.lower() in POOL_KEYS]
        if keyed:
            names.append("/".join(v if k in ("instance", "engine") else f"{k}={v}" for k, v in keyed))
        else:
            names.append(_strip_suffix("/".join(p[common:])))
    return names


def _strip_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in EVENT_SUFFIXES:
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name
