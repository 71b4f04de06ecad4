"""``fluidctl top``: a job's snapshot as a live terminal view (rich's ``Live``), one frame
(``--once``) or JSON (``--json``).

A header (job, backend, world, attempt, uptime, steps/s, ETA where the script prints its
total, event counts) and one row per rank; with more ranks than the terminal has rows, one
row per node. Keys while it runs: ``s`` next sort key, ``r`` reverse, ``f`` only the ranks
that are flagged (a verdict, or not running), ``q`` quit. Over a pipe it prints a frame
every interval as plain text, and NO_COLOR is honoured (rich's Console).
"""
from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from fluidctl.observe.snapshot import Reader

SORT_KEYS = ("rank", "step", "p50", "p99", "cpu", "rss", "node")
HEADER_ROWS = 6         # terminal rows the header, the table's head and its border take


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"


def _clock(value: Optional[float]) -> str:
    if value is None:
        return "-"
    value = int(value)
    return f"{value // 3600}:{value % 3600 // 60:02d}:{value % 60:02d}"


def _bytes(value: Optional[float]) -> str:
    if value is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return "-"


def _shares(shares: Optional[dict]) -> str:
    if not shares:
        return "-"
    parts = [f"{shares[k] * 100:.0f}" if shares.get(k) is not None else "-"
             for k in ("data", "compute", "comm")]
    return "/".join(parts)


def sort_rows(rows: List[dict], key: str, reverse: bool = False) -> List[dict]:
    def value(row):
        if key == "node":
            return (str(row.get("host") or ""), row["rank"])
        v = row.get("rank" if key == "rank" else key)
        return (v is None, v if v is not None else 0)
    return sorted(rows, key=value, reverse=reverse)


def filter_rows(rows: List[dict], text: Optional[str], flagged: bool) -> List[dict]:
    """``text``: rows whose node, state or verdict contain it; ``flagged``: a verdict, or a
    rank that does not run."""
    out = rows
    if text:
        low = text.lower()
        out = [r for r in out if any(low in str(r.get(k) or "").lower()
                                     for k in ("host", "state", "verdict"))]
    if flagged:
        out = [r for r in out if r["verdict"] or r["state"] != "running"]
    return out


def fold(rows: List[dict]) -> List[dict]:
    """One row per node: its ranks, the slowest step, the worst times, CPU and RSS summed."""
    nodes: Dict[str, List[dict]] = {}
    for row in rows:
        nodes.setdefault(str(row.get("host") or "?"), []).append(row)
    out = []
    for host, group in nodes.items():
        ranks = sorted(r["rank"] for r in group)
        steps = [r["step"] for r in group if r["step"] is not None]
        states = sorted({r["state"] for r in group})

        def worst(key):
            values = [r[key] for r in group if r.get(key) is not None]
            return max(values) if values else None

        def total(key):
            values = [r[key] for r in group if r.get(key) is not None]
            return sum(values) if values else None
        out.append({"rank": ranks[0], "ranks": f"{ranks[0]}-{ranks[-1]} ({len(ranks)})",
                    "host": host, "state": ",".join(states),
                    "step": min(steps) if steps else None, "p50": worst("p50"),
                    "p99": worst("p99"), "shares": None, "cpu": total("cpu"),
                    "rss": total("rss"), "gpu_util": worst("gpu_util"),
                    "gpu_mem": total("gpu_mem"),
                    "verdict": "; ".join(sorted({r["verdict"] for r in group
                                                 if r["verdict"]})),
                    "last_line": group[0]["last_line"]})
    return out


def header(snap: dict) -> str:
    world = f"world {snap['world']}"
    progress = snap.get("progress")
    eta = f"ETA {_clock(snap['eta'])} ({progress[0]}/{progress[1]})" if progress else "ETA -"
    rate = snap.get("steps_per_s")
    ev = snap["events"]
    state = "running" if snap["running"] else "ended"
    return (f"job {snap['job']}  backend {snap.get('backend') or '-'}  {world}  attempt "
            f"{snap['attempt']}  up {_clock(snap.get('uptime'))}  "
            f"{'-' if rate is None else f'{rate:.2f}'} steps/s  {eta}  [{state}]\n"
            f"stragglers {ev['straggler']}  restarts {ev['restart']}  lost nodes "
            f"{ev['node_lost']}  checkpoints {ev['checkpoint']}  hangs {ev['hang']}"
            + (f"  metrics {snap['metrics']}" if snap.get("metrics") else ""))


def table(snap: dict, rows: List[dict], folded: bool, sort: str, reverse: bool,
          width: Optional[int] = None):
    """The rows as a rich Table; on a narrow terminal (``width``) the shares go, the GPU
    column only where a rank has one, and the last line takes what is left."""
    from rich import box
    from rich.table import Table
    gpus = any(r.get("gpu_util") is not None for r in rows)
    shares = width is None or width >= 100
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False,
                 caption=f"sort {sort}{' (reversed)' if reverse else ''}"
                         f"{', one row per node' if folded else ''}  keys: s sort, "
                         "r reverse, f flagged, q quit")
    grid.add_column("ranks" if folded else "rank", justify="right", no_wrap=True,
                    min_width=12 if folded else 4)
    grid.add_column("node", no_wrap=True, min_width=9, max_width=24, overflow="ellipsis")
    grid.add_column("state", no_wrap=True, min_width=7)
    grid.add_column("step", justify="right", no_wrap=True, min_width=6)
    for name in ("p50", "p99"):
        grid.add_column(name, justify="right", no_wrap=True, min_width=7)
    if shares:
        grid.add_column("d/c/comm%", justify="right", no_wrap=True, min_width=9)
    grid.add_column("cpu%", justify="right", no_wrap=True, min_width=4)
    grid.add_column("rss", justify="right", no_wrap=True, min_width=6)
    if gpus:
        grid.add_column("gpu", justify="right", no_wrap=True, min_width=10)
    grid.add_column("verdict", no_wrap=True, style="bold red", min_width=11)
    grid.add_column("last line", no_wrap=True, overflow="ellipsis", max_width=60)
    for row in rows:
        cells = [row["ranks"] if folded else str(row["rank"]), str(row.get("host") or "-"),
                 row["state"], "-" if row["step"] is None else str(row["step"]),
                 _seconds(row["p50"]), _seconds(row["p99"])]
        if shares:
            cells.append(_shares(row.get("shares")))
        cells += ["-" if row.get("cpu") is None else f"{row['cpu']:.0f}",
                  _bytes(row.get("rss"))]
        if gpus:
            cells.append("-" if row.get("gpu_util") is None
                         else f"{row['gpu_util']}% {_bytes(row.get('gpu_mem'))}")
        grid.add_row(*cells, row["verdict"] or "", row["last_line"])
    return grid


class View:
    """What is shown: sort key, order, filter; ``frame(snap, height)`` draws it."""

    def __init__(self, sort: str = "rank", reverse: bool = False,
                 text: Optional[str] = None, flagged: bool = False):
        self.sort, self.reverse, self.text, self.flagged = sort, reverse, text, flagged

    def rows(self, snap: dict, height: Optional[int]):
        rows = filter_rows(snap["ranks"], self.text, self.flagged)
        folded = height is not None and len(rows) > max(1, height - HEADER_ROWS)
        if folded:
            rows = fold(rows)
        return sort_rows(rows, self.sort, self.reverse), folded

    def frame(self, snap: dict, height: Optional[int], width: Optional[int] = None):
        from rich.console import Group
        from rich.text import Text
        rows, folded = self.rows(snap, height)
        return Group(Text(header(snap)),
                     table(snap, rows, folded, self.sort, self.reverse, width))

    def key(self, char: str) -> bool:
        """Apply a key; False for quit."""
        if char == "q":
            return False
        if char == "s":
            self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
        elif char == "r":
            self.reverse = not self.reverse
        elif char == "f":
            self.flagged = not self.flagged
        return True


def as_json(snap: dict, view: View) -> str:
    rows = sort_rows(filter_rows(snap["ranks"], view.text, view.flagged), view.sort,
                     view.reverse)
    return json.dumps({**{k: v for k, v in snap.items() if k != "histograms"}, "ranks": rows},
                      default=str)


class _Keys:
    """The terminal in cbreak mode while the view runs (keys without Enter), restored after."""

    def __init__(self):
        self.fd, self.saved = None, None
        if sys.stdin.isatty():
            import termios
            import tty
            self.fd = sys.stdin.fileno()
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)

    def read(self, timeout: float) -> str:
        """The keys typed within ``timeout`` seconds (waits that long without a terminal)."""
        if self.fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 32).decode(errors="ignore") if ready else ""

    def close(self) -> None:
        if self.saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def run(source, *, once: bool = False, json_out: bool = False, interval: float = 1.0,
        view: Optional[View] = None) -> int:
    """Show the job until it ends (or ``q``); exit code 0. ``source``: its log dir, or a
    reader of its own (``read()`` a snapshot: a Kubernetes job's pods)."""
    from fluidctl.tables import console
    view = view or View()
    reader = Reader(source) if isinstance(source, (str, Path)) else source
    first = reader.read()
    if getattr(reader, "procs", None) is not None and first["running"]:
        reader.procs.prime(r["pid"] for r in first["ranks"] if r.get("pid"))
        time.sleep(min(interval, 0.25))      # CPU% needs an interval
        first = reader.read()
    if once or not (first["running"] or first["starting"]):
        if json_out:
            print(as_json(first, view), flush=True)
        else:
            out = console()
            out.print(view.frame(first, *((out.size.height, out.size.width) if out.is_terminal
                                          else (None, None))))
        return 0
    if json_out:
        return _frames(reader, first, interval, lambda snap: print(as_json(snap, view),
                                                                   flush=True))
    out = console()
    if not out.is_terminal:
        return _frames(reader, first, interval,
                       lambda snap: (out.print(view.frame(snap, None)), out.print()))
    from rich.live import Live
    keys = _Keys()
    try:
        snap = first
        def frame():
            return view.frame(snap, out.size.height, out.size.width)
        with Live(frame(), console=out, auto_refresh=False, screen=False,
                  transient=False) as live:
            while snap["running"] or snap["starting"]:
                deadline = time.monotonic() + interval
                while time.monotonic() < deadline:
                    typed = keys.read(max(0.0, deadline - time.monotonic()))
                    if not all(view.key(c) for c in typed):
                        return 0
                    if typed:
                        live.update(frame(), refresh=True)
                snap = reader.read()
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        keys.close()
    return 0


def _frames(reader: Reader, snap: dict, interval: float, show) -> int:
    """``show(snap)`` every ``interval`` seconds until the job ends (a pipe, --json)."""
    try:
        while True:
            show(snap)
            if not (snap["running"] or snap["starting"]):
                return 0
            time.sleep(interval)
            snap = reader.read()
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
