"""Tables that fit the console they are printed on, with nothing cut.

A `FittedTable` is laid out when rich renders it, at the console's width (a terminal's, or the fixed width of a
piped console): short columns keep their words whole (they wrap at spaces only; a `wrap=False` column, figures
with units, never wraps), and a cell of a `detail` column that would need a word wider than its share of the
width, or more than its `lines` lines, is replaced by a numbered marker ("[1]") whose full text is printed under
the table. `--json` never goes through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

DETAIL_LINES = 3  # a detail cell that would take more lines than this at its share of the width becomes a note
MARKER_WIDTH = 4  # "[12]"


def as_text(cell: str | Text) -> Text:
    """A cell as rich Text: a str is rich markup (escape user text with rich.markup.escape first)."""
    return cell if isinstance(cell, Text) else Text.from_markup(cell)


def longest_word(text: Text | str) -> int:
    plain = text.plain if isinstance(text, Text) else text
    return max((cell_len(word) for word in plain.split()), default=0)


def widest_line(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.split("\n")), default=0)


def _shrink(widths: dict[int, int], least: dict[int, int], room: int) -> None:
    """Narrow the widest columns, one column at a time, until they fit `room` or every one is at its least."""
    while sum(widths.values()) > room:
        shrinkable = [i for i in widths if widths[i] > least[i]]
        if not shrinkable:
            return
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1


@dataclass(frozen=True)
class _Column:
    header: str
    justify: str
    detail: bool
    wrap: bool
    lines: int


class FittedTable:
    """A rich Table built row by row, laid out at render time for the console's width (see the module doc)."""

    def __init__(self, title: str = "", caption: str = "") -> None:
        self.title, self.caption = title, caption
        self.columns: list[_Column] = []
        self.rows: list[tuple[list[Text], bool]] = []  # the cells, and whether a section line follows

    def add_column(self, header: str, *, justify: str = "left", detail: bool = False, wrap: bool = True,
                   lines: int = DETAIL_LINES) -> None:
        """`detail`: long free text, moved to a note past `lines` lines; `wrap=False`: cells never wrap (the header
        still may, at spaces)."""
        self.columns.append(_Column(header, justify, detail, wrap, lines))

    def add_row(self, *cells: str | Text) -> None:
        self.rows.append(([as_text(c) for c in cells], False))

    def add_section(self) -> None:
        if self.rows:
            self.rows[-1] = (self.rows[-1][0], True)

    def layout(self, width: int) -> tuple[Table, list[Text]]:
        """The rich Table for a console `width` columns wide, and the notes to print under it.

        Every column gets an explicit width no narrower than its longest word, so rich wraps cells at spaces only:
        short columns keep their natural width where the room allows (else they shrink, widest first, towards their
        longest word); detail columns share what is left, and a detail cell that does not fit there becomes a note.
        """
        count = len(self.columns)
        room = max(1, width - (3 * count + 1))  # a vertical line and a space of padding on each side per column
        details = [i for i, c in enumerate(self.columns) if c.detail]
        measure = {True: longest_word, False: widest_line}
        least = {i: max(MARKER_WIDTH, longest_word(c.header)) if c.detail else
                 max([longest_word(c.header), *(measure[c.wrap](row[i]) for row, _ in self.rows)])
                 for i, c in enumerate(self.columns)}
        widths = {i: max([cell_len(c.header), *(widest_line(row[i]) for row, _ in self.rows)])
                  for i, c in enumerate(self.columns) if not c.detail}
        _shrink(widths, least, room - sum(least[i] for i in details))
        spare = room - sum(widths.values())
        budget = max([spare // len(details), *(least[i] for i in details)]) if details else 0
        notes: list[Text] = []
        rows = []
        for cells, section in self.rows:
            row = list(cells)
            for i in details:
                if longest_word(row[i]) > budget or cell_len(row[i].plain) > budget * self.columns[i].lines:
                    notes.append(row[i])
                    row[i] = Text(f"[{len(notes)}]")
            rows.append((row, section))
        for i in details:
            kept = max([cell_len(self.columns[i].header), *(widest_line(row[i]) for row, _ in rows)])
            widths[i] = max(least[i], min(budget, kept))
        framing = max(longest_word(self.title), longest_word(self.caption)) + 4
        table = Table(title=self.title or None, caption=self.caption or None, min_width=min(width, framing))
        for i, column in enumerate(self.columns):
            table.add_column(column.header, justify=column.justify, overflow="fold",  # type: ignore[arg-type]
                             width=widths[i])
        for row, section in rows:
            table.add_row(*row, end_section=section)
        return table, notes

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, notes = self.layout(options.max_width)
        yield table
        for number, note in enumerate(notes, 1):
            yield Text.assemble((f"[{number}] ", "dim"), note)


__all__ = ["DETAIL_LINES", "FittedTable", "as_text", "longest_word"]
