"""Checks of a table's header shared by the events loader and the trace reader: a column named twice, and a header
that another separator would split (a semicolon CSV from a European spreadsheet, a TSV)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

# Separators a one-column header may really use, with the word a message names them by.
SEPARATORS = ((";", "semicolons"), ("\t", "tabs"), ("|", "'|'"))


def column_key(name: str) -> str:
    """How a header cell is matched: without a byte order mark or surrounding spaces, case-insensitive."""
    return name.lstrip("\ufeff").strip().lower()


def repeated_column(header: Sequence[str], known: Collection[str]) -> tuple[str, list[int]] | None:
    """The first column of ``known`` (keys, see column_key) named more than once: (its first spelling in the
    header, its 1-based positions); None when each appears at most once.  Columns not in ``known`` may repeat."""
    keys = [column_key(c) for c in header]
    for key in dict.fromkeys(keys):
        if key in known and keys.count(key) > 1:
            spelled = header[keys.index(key)].lstrip("\ufeff").strip()
            return spelled, [i + 1 for i, k in enumerate(keys) if k == key]
    return None


def other_separator(header: Sequence[str], accepts: Callable[[list[str]], bool]) -> str | None:
    """For a one-column header: the word for the separator that splits it into a header ``accepts``, else None."""
    if len(header) != 1:
        return None
    for separator, word in SEPARATORS:
        if accepts(header[0].split(separator)):
            return word
    return None
