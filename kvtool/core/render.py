"""Rich tables that never cut a cell: every renderer builds its tables with :func:`new_table`.

rich fits a table that is wider than the terminal (or than 80 columns when stdout is a pipe) by shrinking its
columns and cutting what no longer fits with an ellipsis: ``131,…`` for 131,072.  A capacity figure with a digit
missing is wrong, not merely ugly, so a :class:`WholeTable` lays itself out in three steps, each keeping every
character:

1. it fits at its natural width: printed as rich would;
2. it fits once its text wraps between words: the widest column is narrowed first, as rich does, but no column
   below its longest word (a number such as ``17,179,869,184`` is one word, so it stays whole on one line), and no
   right-aligned column (figures: ``33.7 ms``, ``0 (0 req.)``) below its widest cell;
3. it does not fit even then: the columns are split into several tables printed one under the other, each
   repeating the key column(s) (the first, by default) so a row still reads across, the way pandas prints a wide
   frame.  Only a part of a key and one column still too wide wraps its figures between words, and a single word
   wider than the terminal folds, character by character.

Cells never overflow with an ellipsis or a crop: every column folds.  This is a renderer (imported by the CLI and
the other renderers only).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table

_UNBOUNDED = 1_000_000  # a width at which no table wraps: its natural measurement


class WholeTable(Table):
    """A rich ``Table`` that wraps its text columns or splits its columns rather than cut a cell."""

    def __init__(self, *headers: Any, key_columns: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("title_justify", "left")
        kwargs.setdefault("caption_justify", "left")
        super().__init__(*headers, **kwargs)
        self.key_columns = key_columns  # repeated in each part when the columns are split (step 3)

    def add_column(self, header: Any = "", footer: Any = "", **kwargs: Any) -> None:
        kwargs["overflow"] = "fold"  # never an ellipsis or a crop, whatever the caller asked
        super().add_column(header, footer, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        ranges, overhead = _layout(self, console, options, whole_figures=True)
        if sum(high for _, high in ranges) + overhead <= width or not self.columns:
            yield from Table.__rich_console__(self, console, options)
        elif sum(low for low, _ in ranges) + overhead <= width:
            yield from Table.__rich_console__(self._wrapped(ranges, overhead, width), console, options)
        elif len(self.columns) > self.key_columns + 1:
            for part in self._parts(console, options):
                yield from part.__rich_console__(console, options)
        else:  # a key and one column: figures may wrap between words, and a word longer than the line folds
            ranges, overhead = _layout(self, console, options, whole_figures=False)
            if sum(low for low, _ in ranges) + overhead <= width:
                yield from Table.__rich_console__(self._wrapped(ranges, overhead, width), console, options)
            else:
                yield from Table.__rich_console__(self._folded(), console, options)

    def _copy(self, columns: Iterable[Column]) -> WholeTable:
        table = copy.copy(self)
        table.columns = [copy.copy(column) for column in columns]
        for index, column in enumerate(table.columns):
            column._index = index
        return table

    def _wrapped(self, ranges: list[tuple[int, int]], overhead: int, width: int) -> WholeTable:
        """Step 2: as rich does, narrow the widest column first, but never below its longest word."""
        widths = [high for _, high in ranges]
        for _ in range(sum(widths) + overhead - width):
            # the widest that can still give a column; on a tie the later one (a label column stays whole)
            index = max((i for i, (low, _) in enumerate(ranges) if widths[i] > low), key=lambda i: (widths[i], i))
            widths[index] -= 1
        table = self._copy(self.columns)
        for column, width in zip(table.columns, widths):
            column.width = width
        return table

    def _parts(self, console: Console, options: ConsoleOptions) -> Iterator[WholeTable]:
        """Step 3: the key columns and a run of the others in each part, as few parts as fit, evenly filled."""
        keys = self.columns[: self.key_columns]
        fewest = len(self._groups(console, options, options.max_width))
        low, high = 1, options.max_width  # the narrowest line that still needs no more parts than the widest
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if len(self._groups(console, options, middle)) <= fewest else (middle + 1, high)
        groups = self._groups(console, options, low)
        for number, group in enumerate(groups):
            part = self._copy([*keys, *group])
            part.key_columns = len(keys)
            if number > 0:
                part.title = None
            if number < len(groups) - 1:
                part.caption = None
            yield part

    def _groups(self, console: Console, options: ConsoleOptions, width: int) -> list[list[Column]]:
        """The columns after the keys, in runs that fit ``width`` with the keys (at least one column a run)."""
        keys = self.columns[: self.key_columns]
        groups: list[list[Column]] = [[]]
        for column in self.columns[self.key_columns :]:
            candidate = self._copy([*keys, *groups[-1], column])
            if groups[-1] and _minimum(candidate, console, options) > width:
                groups.append([column])
            else:
                groups[-1].append(column)
        return groups

    def _folded(self) -> WholeTable:
        table = self._copy(self.columns)
        for column in table.columns:
            column.no_wrap = False
        return table


def new_table(*columns: str, key_columns: int = 1, **kwargs: Any) -> WholeTable:
    """The one table factory of kvtool's renderers: a :class:`WholeTable`, titles left-aligned.

    ``columns`` are plain headers (left-aligned); add right-aligned figures with ``add_column(name,
    justify="right")``.  ``key_columns``: how many leading columns name a row (repeated when the table is split).
    """
    return WholeTable(*columns, key_columns=key_columns, **kwargs)


def _content_range(
    table: Table, column: Column, console: Console, options: ConsoleOptions, whole_figures: bool
) -> tuple[int, int]:
    """The narrowest and widest (unwrapped) content of a column, header included, padding not.

    The narrowest is the longest word; with ``whole_figures``, the widest cell of a right-aligned column (a figure
    such as ``33.7 ms`` or ``0 (0 req.)`` stays on one line; its header may still wrap).
    """
    wide = options.update_width(_UNBOUNDED)
    low, high = 1, 1
    if table.show_header:
        measured = Measurement.get(console, wide, column.header)
        low, high = measured.minimum, measured.maximum
    figures = whole_figures and column.justify == "right"
    for cell in column.cells:
        measured = Measurement.get(console, wide, cell)
        low, high = max(low, measured.maximum if figures else measured.minimum), max(high, measured.maximum)
    if column.no_wrap:
        low = high
    if column.min_width is not None:
        low, high = max(low, column.min_width), max(high, column.min_width)
    if column.max_width is not None:
        high = max(low, min(high, column.max_width))
    return low, high


def _layout(
    table: Table, console: Console, options: ConsoleOptions, whole_figures: bool
) -> tuple[list[tuple[int, int]], int]:
    """Each column's content range, and the width of the borders and padding around them."""
    ranges = [_content_range(table, column, console, options, whole_figures) for column in table.columns]
    natural = Table.__rich_measure__(table, console, options.update_width(_UNBOUNDED))
    return ranges, natural.maximum - sum(high for _, high in ranges)


def _minimum(table: Table, console: Console, options: ConsoleOptions) -> int:
    """The narrowest the table can be with every column at least its longest word (no_wrap ones whole)."""
    ranges, overhead = _layout(table, console, options, whole_figures=True)
    return sum(low for low, _ in ranges) + overhead
