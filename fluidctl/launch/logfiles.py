"""The job's log files on disk, before and between attempts: a new job empties them, a
restart appends a header line to each, and an earlier (larger) job's logs are removed. Shared by
the launcher (``launch.execute``), ``run_supervised`` and the node agent; a leaf, so that the
first attempt can start before the supervisor's modules are loaded (``launch/firststart.py``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Sequence

if TYPE_CHECKING:
    from fluidctl.paths import LogLayout


def restart_header(attempt: int, max_restarts: int) -> str:
    """The line each log gets when the job starts again. ``attempt`` counts world changes
    (an elastic node rejoining) too, which --max-restarts does not count: past it the line
    says so, never "restart 2 of 1"."""
    what = (f"restart {attempt} of {max_restarts}" if attempt <= max_restarts else
            f"attempt {attempt} (a new world; --max-restarts {max_restarts} counts failures)")
    return f"===== fluidctl: {what}, {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n"


def fresh_logs(paths: Sequence[str]) -> None:
    """A new job starts with empty logs (restarts append to them instead)."""
    for path in paths:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")


def clear_stale(layout: "LogLayout", keep: Sequence[str]) -> List[Path]:
    """Remove what ``layout.stale_logs(keep)`` finds (an earlier, larger job's logs), and a
    host sub-directory that this leaves empty; returns what was removed."""
    removed = []
    for stale in layout.stale_logs(keep):
        try:
            stale.unlink()
        except FileNotFoundError:
            continue
        removed.append(stale)
    for where in {p.parent for p in removed} - {layout.root}:
        try:
            where.rmdir()
        except OSError:             # not empty: this job's, or something else's
            pass
    return removed


def append_header(paths: Sequence[str], attempt: int, max_restarts: int) -> None:
    for path in paths:
        with open(path, "a", encoding="utf-8") as f:
            f.write(restart_header(attempt, max_restarts))
