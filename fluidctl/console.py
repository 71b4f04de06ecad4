"""Console output through rich: plan tables and failure reports.

Printed through the one console factory, ``console()`` (it lives in ``fluidctl.tables``, the
leaf below this module, and is named here too). rich is imported on first use, so commands
can import this module at the top for free; training processes never pay for rich.
"""
from __future__ import annotations

import shlex
import time
from typing import List, Optional

from fluidctl.diagnostics.failures import Failure, describe_end, log_tail
from fluidctl.tables import console, print_table

__all__ = ["console", "print_failure", "print_hang", "print_plan_table"]


def print_plan_table(plan) -> None:
    """The plan: a row per process (plain columns off a terminal), then each distinct command
    once, on one line below the table, with the processes that run it: in a table cell a
    command wraps over many lines at 80 columns, and cannot be copied."""
    master = plan.master or "chosen by rank 0 at start"
    print_table(f"fluidctl plan: {plan.job.mode} mode over {plan.backend}, master {master}",
                ("rank", "role", "host", "endpoint", "devices", "log"),
                [(str(p.rank), p.role, p.host, p.endpoint or "-",
                  ",".join(p.devices) or "cpu", p.log) for p in plan.procs])
    commands = {}                   # command -> {role: [ranks]}, in the plan's order
    for p in plan.procs:
        commands.setdefault(shlex.join(p.argv), {}).setdefault(p.role, []).append(str(p.rank))
    lines = ["commands:"] + [
        "  " + "; ".join(f"{role} {','.join(ranks)}" for role, ranks in who.items())
        + f": {command}" for command, who in commands.items()]
    print("\n".join(lines), flush=True)


def print_failure(failure: Failure, tail_lines: int, report: Optional[str] = None) -> None:
    """The failure report: who failed first, where, when, why (triage), the end of its log,
    and every other process's final state in one line each."""
    err = console(stderr=True)
    when = time.strftime("%H:%M:%S", time.localtime(failure.when))
    pid = f"pid {failure.pid}, " if failure.pid else ""
    since = (f", {failure.when - failure.started:.1f}s after start" if failure.started
             else "")
    err.print(f"[bold red]fluidctl: {failure.label} failed on {failure.host}: "
              f"{failure.reason}[/] ({pid}at {when}{since})", markup=True)
    if failure.explanation:
        err.print(f"  why: {failure.explanation}", markup=False)
    if failure.log:
        err.print(f"  log: {failure.log}", markup=False)
    tail = log_tail(failure.log, tail_lines) if failure.log else failure.tail[-tail_lines:]
    if tail:
        err.print(f"  last {len(tail)} line(s) of its log:", markup=False)
        for line in tail:
            err.print(f"  | {line}", markup=False)
    if failure.others:
        err.print("  the other processes:", markup=False)
        for other in failure.others:
            err.print(f"    {other.label} on {other.host}: {describe_end(other)}", markup=False)
    if report:
        err.print(f"  report for tools: {report}", markup=False)
    full = _disk_full(failure.log)
    if full:
        err.print(f"  hint: the disk holding its log is full ({full}): its last output may be "
                  "missing and writing may be what failed; free space or use another "
                  "--log-dir", markup=False)


def _disk_full(path: str) -> str:
    """'' unless the file system of ``path`` has (almost) no room left: then what it has."""
    import os
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    return f"{free} bytes free" if free < 64 * 1024 else ""


def print_hang(lines: List[str], where) -> None:
    """The hang autopsy: why, then one line per group of ranks with the same stack."""
    err = console(stderr=True)
    err.print(f"[bold red]{lines[0]}[/]", markup=True, soft_wrap=True)   # one line: the sentence
    for line in lines[1:]:
        err.print(f"  {line}", markup=False)
    if where is not None:
        err.print(f"  every rank's full stack: {where}/", markup=False)
