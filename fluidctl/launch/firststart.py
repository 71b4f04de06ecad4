"""The first attempt's processes, started before the supervisor's modules are loaded.

The supervisor, the console echo, the job's telemetry and the diagnostics are 10-25 ms of
imports and set-up. Where they load after the processes start, they overlap the processes'
own start-up (a Python interpreter each) instead of delaying it: a node agent starts its ranks
as soon as its plan arrives, and the launcher starts srun (Slurm) or sends the nodes their
plans (SSH) before its console echo and signal handlers exist. ``run.run_supervised`` takes
the handles (``first=``) and supervises from there.

What must precede any process is done here as well: fresh logs (a new job's are emptied),
this process as the subreaper of their orphans, and the lifeline watchdog that stops them if
this process is SIGKILLed. Until the supervisor's handlers are installed a few milliseconds
later, a stop signal ends this process by its default action, and the watchdog and the
processes' parent-death signal stop the job: nothing outlives it.
"""
from __future__ import annotations

import os
from typing import Callable, List, Sequence

from fluidctl.launch.logfiles import fresh_logs
from fluidctl.procs import lifeline, local


class FirstStart:
    """Attempt 0, started by ``start(0)`` once the logs are ready (emptied when ``fresh``),
    this process is a subreaper and the lifeline watchdog runs (``grace``: a service's time to
    stop if we die). ``start`` keeps the Launcher protocol: it returns every handle, or stops
    what it started and raises, and then the watchdog is stopped here."""

    def __init__(self, start: Callable[[int], List], logs: Sequence[str], *, grace: float,
                 fresh: bool = True):
        self.grace, self.fresh = grace, fresh
        # a kept log is echoed from where it ended before these processes wrote to it
        self.sizes = {} if fresh else {path: _size(path) for path in logs}
        self.taken = False          # by run_supervised, which stops them from then on
        prepare_attempts(logs, grace, fresh)
        try:
            self.handles = start(0)
        except BaseException:
            self.handles = []
            self.abandon()
            raise

    def take(self) -> List:
        """The handles, for the supervisor: stopping them is its job from now on."""
        self.taken = True
        return self.handles

    def abandon(self) -> None:
        """Stop what was started, where no supervisor took it over (an error in between)."""
        if self.taken:
            return
        self.taken = True
        for h in self.handles:
            try:
                h.kill()
            except Exception:       # noqa: BLE001 - the sweep below still stops it
                pass
        lifeline.stop_watchdog()
        local.sweep_descendants(self.grace)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def prepare_attempts(logs: Sequence[str], grace: float, fresh: bool) -> None:
    """What precedes the first process of a supervised job (see the module's docstring)."""
    if fresh:
        fresh_logs(logs)
    local.become_subreaper()
    lifeline.start_watchdog(grace)      # stops the job if we are SIGKILLed
