"""Summary tables that cost nothing to print off a terminal.

On a terminal: a rich table (``fluidctl.console``). Elsewhere (scripts, CI logs, pipes): the
same title and cells as plain columns separated by " | ", without importing rich, which is a
good part of a quick command's start-up (``cluster sync`` with nothing to send, ``shard-data``
of a small file). Standard library only.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Sequence


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                justify: Sequence[str] = ()) -> None:
    """``justify``: "left"/"right" per column (default left)."""
    if sys.stdout.isatty():
        from rich.table import Table
        from fluidctl.console import console
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
