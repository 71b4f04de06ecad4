"""``fluidctl pserver stop``: SIGTERM (the server checkpoints, then exits), wait, and remove
what it left (its log only when nothing in it went wrong)."""
from __future__ import annotations

import signal
import time
from typing import Optional

from fluidctl.errors import FluidctlError, UsageError
from fluidctl.pserverctl.records import records, remove_record


def run(port: Optional[int] = None, stop_all: bool = False, timeout: float = 30.0) -> None:
    """Stop the pserver on ``port``, or every one (``stop_all``); exit 1 naming the pids of
    those that did not exit within ``timeout`` seconds."""
    if (port is None) == (not stop_all):
        raise UsageError("say which pservers to stop", "pass --port P or --all")
    targets = records()
    if port is not None:
        targets = [r for r in targets if r.get("port") == port]
        if not targets:
            raise UsageError(f"no pserver on port {port}", "see fluidctl pserver status")
    from fluidctl.console import console
    out = console()
    failed = []
    for r in targets:
        if r["state"] == "dead":
            log = remove_record(r, clean=False)
            out.print(f"{r.get('endpoint')}: was not running (stale record removed"
                      + (f"; its log: {log})" if log else ")"), markup=False)
            continue
        if _terminate(r["pid"], timeout):
            log = remove_record(r, clean=True)
            out.print(f"{r.get('endpoint')}: stopped (pid {r['pid']})"
                      + (f"; it logged warnings or errors, its log is kept: {log}" if log
                         else ""), markup=False)
        else:
            failed.append(r)
    if failed:
        pids = " ".join(str(r["pid"]) for r in failed)
        raise FluidctlError(f"{len(failed)} pserver(s) did not exit within {timeout:.0f} s",
                            f"wait longer with --timeout, or kill -9 {pids}", exit_code=1)


def _terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, then whether it exited within ``timeout``. A daemon is no child of ours: once
    it exits it is its reaper's to collect (init, or a subreaper), which may take its time or
    never do it. A zombie has exited: it counts as stopped, as ``records.alive`` counts it."""
    import psutil
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while True:
            try:
                proc.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                return True
            except psutil.TimeoutExpired:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return True
                if time.monotonic() >= deadline:
                    return False
    except psutil.NoSuchProcess:
        return True
