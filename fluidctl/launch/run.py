"""Running a planned job's processes under supervision: shared by ``launch.execute`` (every
backend on the launching machine) and the node agent that remote nodes run.

``run_supervised`` owns the order of things: fresh logs, endpoints.log, launch.log, the console
echo, the supervisor, the sweep of leftover descendants, and the one failure report.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from fluidctl import lifeline
from fluidctl.backends import local
from fluidctl.backends.base import Handle
from fluidctl.launch.echo import LogEcho
from fluidctl.planning.plan import Plan
from fluidctl.launch.supervisor import LaunchLog, RunOptions, RunResult, Supervisor
from fluidctl.paths import LogLayout

HEARTBEAT = 2.0


def failure_reporter(tail_lines: int) -> Callable:
    """The failure report printer; rich is imported only when a job actually failed."""
    def report(failure) -> None:
        from fluidctl.console import print_failure
        print_failure(failure, tail_lines)
    return report


def restart_header(attempt: int, max_restarts: int) -> str:
    return (f"===== fluidctl: restart {attempt} of {max_restarts}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")


def fresh_logs(paths: Sequence[str]) -> None:
    """A new job starts with empty logs (restarts append to them instead)."""
    for path in paths:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")


def append_header(paths: Sequence[str], attempt: int, max_restarts: int) -> None:
    for path in paths:
        with open(path, "a", encoding="utf-8") as f:
            f.write(restart_header(attempt, max_restarts))


def write_endpoints(layout: LogLayout, the_plan: Plan) -> None:
    lines = [f"master {the_plan.master}"]
    lines += [f"{p.role} {p.rank} {p.host} {p.endpoint}" for p in the_plan.procs]
    tmp = layout.endpoints.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, layout.endpoints)


def run_supervised(start: Callable[[int], List[Handle]], *, logs: Sequence[str],
                   launch_log: LaunchLog, options: RunOptions,
                   sources: List[Tuple[str, str]], out=None,
                   report: Optional[Callable] = None,
                   on_broken: Optional[Callable[[], None]] = None,
                   heartbeat: Optional[str] = None, fresh: bool = True) -> RunResult:
    """Supervise attempts made by ``start`` with the console echo running; ``logs`` are
    truncated first and get a header before each restart; ``report(failure)`` prints the
    failure; with ``fresh`` False (a node agent's restart) the logs are kept and only what is
    written from now on is echoed. ``heartbeat`` (a line) is written every HEARTBEAT seconds so that a console which
    went away (a dropped SSH connection) is noticed even when the workers are silent;
    ``on_broken`` is then called."""
    if fresh:
        fresh_logs(logs)
    local.become_subreaper()
    lifeline.start_watchdog()           # kills the job's process groups if we are SIGKILLed
    echo = LogEcho(sources, out, on_broken, from_end=not fresh)
    echo.start()
    beating = threading.Event()
    if heartbeat:
        def beat():
            while not beating.wait(HEARTBEAT):
                echo.say(heartbeat)
        threading.Thread(target=beat, name="fluidctl-heartbeat", daemon=True).start()

    def before_restart(attempt: int) -> None:
        append_header(logs, attempt, options.max_restarts)

    supervisor = Supervisor(start, options, log=launch_log, say=echo.say,
                            before_restart=before_restart)
    try:
        result = supervisor.run()
    finally:
        beating.set()
        lifeline.stop_watchdog()
        left = local.sweep_descendants(options.grace_period)
        if left:
            launch_log(f"stopped {len(left)} leftover process(es): {left}")
        echo.finish()
    if result.failure is not None and report is not None:
        report(result.failure)
    launch_log(f"exit code {result.exit_code}")
    return result
