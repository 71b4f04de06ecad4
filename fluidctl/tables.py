"""Summary tables that cost nothing to print off a terminal.

On a terminal: a rich table (``fluidctl.console``). Elsewhere (scripts, CI logs, pipes): the
same title and cells as plain columns separated by " | ", without importing rich, which is a
good part of a quick command's start-up (``cluster sync`` with nothing to send, ``shard-data``
of a small file). Standard library only.

``console()`` is the one console factory for every command (``fluidctl.console`` prints its
reports through it too). Colour is off when the stream is not a terminal or NO_COLOR is set
(rich honours both).
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Sequence
    from rich.console import Console


_consoles: dict = {}


def console(stderr: bool = False) -> "Console":
    """The console for stdout (or stderr), made once."""
    out = _consoles.get(stderr)
    if out is None:
        from rich.console import Console
        out = Console(stderr=stderr, highlight=False)
        if not out.is_terminal:     # a pipe or a file: don't squeeze tables into 80 columns
            out = Console(stderr=stderr, highlight=False, width=200)
        _consoles[stderr] = out
    return out


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                justify: Sequence[str] = ()) -> None:
    """``justify``: "left"/"right" per column (default left)."""
    if sys.stdout.isatty():
        from rich.table import Table
        table = Table(title=title)
        for i, column in enumerate(columns):
            table.add_column(column, overflow="fold",
                             justify=justify[i] if i < len(justify) else "left")
        for row in rows:
            table.add_row(*row)
        console().print(table)
        return
    widths = [max(len(c) for c in cells) for cells in zip(columns, *rows)]
    lines = [title]
    for cells in (columns, *rows):
        padded = [c.rjust(w) if i < len(justify) and justify[i] == "right" else c.ljust(w)
                  for i, (c, w) in enumerate(zip(cells, widths))]
        lines.append(" | ".join(padded).rstrip())
    print("\n".join(lines), flush=True)
