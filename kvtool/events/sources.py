"""Which events files ``kvtool analyze`` reads, and which of them make one engine's pool.

Arguments are files, directories (searched recursively), globs (``logs/*.csv``, ``fleet/**/*.parquet``) or fsspec
URLs (``s3://bucket/fleet/``, ``file:///data/*.csv``).  Files of one engine are one pool: a Hive partition in the
path (``instance=a/date=2026-11-30/part-0.parquet``; the keys in ``POOL_KEYS``) names the engine, so a rotating set
of files under ``instance=a/`` is analysed together; without one, each file is its own engine.  A file may also
hold several engines' rows with an ``instance`` or ``engine`` column (kvtool.events.fleet splits those).

Local globs and directories are walked here, not by :mod:`glob` or ``Path.rglob``: the walk enters each real
directory once (a symlink into a folder already entered, a loop, is skipped), and each real file is kept once, under
the first path that reaches it in sorted order (a symlinked file is not a second pool).  ``glob.glob("**")`` follows
directory symlinks until the operating system refuses the path: one loop read a file 41 times, two never ended.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from kvtool.core.errors import InputFileError, UsageError

EVENT_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
POOL_KEYS = ("instance", "engine", "host", "rank", "dp_rank")  # Hive partition keys that tell engines apart
_GLOB_CHARS = set("*?[")
MAX_WALK_DEPTH = 64  # folders below a directory or a glob's fixed part: a bound beyond the loop check


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
    paths = _once_each(paths)  # a file named twice, or reached through a symlink, is read once
    groups: dict[str, list[str]] = {}
    for path, name in zip(paths, pool_names(paths)):
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
        return _glob_files(argument)
    path = Path(argument)
    if path.is_dir():
        return [p for p in _walk_files(argument) if _is_events_file(os.path.basename(p))]
    if not path.exists():
        raise InputFileError("events file not found", where=argument)
    return [argument]


def _once_each(paths: list[str]) -> list[str]:
    """The paths in order, each real local file once (the first path that names it); URLs as given, once each."""
    seen: set[str] = set()
    kept = []
    for path in paths:
        key = path if _is_remote(path) else os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            kept.append(path)
    return kept


def _subfolders(folder: str) -> list[str]:
    """Folders directly in ``folder`` (symlinks to folders too), sorted; an unreadable folder has none."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.is_dir())
    except OSError:
        return []


def _walk_folders(root: str, *, hidden: bool = True) -> Iterator[str]:
    """``root`` and every folder below it, each real folder once (so never round a symlink loop), depth-first in
    name order, at most MAX_WALK_DEPTH deep; ``hidden=False`` skips folders whose name starts with a dot (as glob's
    ``**`` does)."""
    entered: set[str] = set()
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        real = os.path.realpath(folder)
        if real in entered:
            continue
        entered.add(real)
        yield folder
        if depth < MAX_WALK_DEPTH:
            below = [f for f in _subfolders(folder) if hidden or not os.path.basename(f).startswith(".")]
            stack.extend((f, depth + 1) for f in reversed(below))


def _files_in(folder: str) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.is_file())
    except OSError:
        return []


def _walk_files(root: str) -> list[str]:
    """Every file below a directory, each real file once, sorted."""
    return _once_each(sorted(str(Path(f)) for folder in _walk_folders(root) for f in _files_in(folder)))


def _glob_files(pattern: str) -> list[str]:
    """The files a glob matches (``*``, ``?``, ``[..]`` in a name; ``**`` for any folders, none included), as
    :func:`glob.glob` with ``recursive=True`` names them, each real file once, sorted.  Names starting with a dot
    match only a part that starts with one, as in :mod:`glob`."""
    parts = pattern.split(os.sep)
    fixed = 0
    while fixed < len(parts) - 1 and not set(parts[fixed]) & _GLOB_CHARS:
        fixed += 1
    root = os.sep.join(parts[:fixed]) if fixed else ""
    if pattern.startswith(os.sep) and not root:
        root = os.sep
    return _once_each(sorted(_match(root, [p for p in parts[fixed:] if p], 0)))


def _match(folder: str, parts: list[str], depth: int) -> Iterator[str]:
    """Files below ``folder`` ("" for the current one) that match the glob ``parts``."""
    head, rest = parts[0], parts[1:]
    base = folder or os.curdir
    if head == "**":
        for below in _walk_folders(base, hidden=False):
            inner = (
                below if folder else os.path.relpath(below, base).removeprefix(os.curdir)
            )  # glob's "a/x", not "./a/x"
            if rest:
                yield from _match(inner, rest, depth + 1)
            else:
                files = (os.path.basename(f) for f in _files_in(below))
                yield from (os.path.join(inner, n) for n in files if not n.startswith("."))
        return
    if not set(head) & _GLOB_CHARS:
        candidates = [os.path.join(folder, head)]
    else:
        try:
            with os.scandir(base) as entries:
                names = sorted(e.name for e in entries)
        except OSError:
            return
        visible = [n for n in names if head.startswith(".") or not n.startswith(".")]
        candidates = [os.path.join(folder, n) for n in fnmatch.filter(visible, head)]
    for path in candidates:
        if not rest:
            if os.path.isfile(path):
                yield path
        elif os.path.isdir(path) and depth < MAX_WALK_DEPTH:
            yield from _match(path, rest, depth + 1)


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


def pool_names(paths: list[str]) -> list[str]:
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
