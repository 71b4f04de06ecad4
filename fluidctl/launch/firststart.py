"""The first attempt's processes, started before the supervisor's modules are loaded.

The supervisor, the console echo, the job's telemetry and the diagnostics are 10-25 ms of
imports and set-up. Where they load after the processes start, they overlap the processes'
own start-up (a Python interpreter each) instead of delaying it: a node agent starts its ranks
as soon as its plan arrives, and the launcher starts srun (Slurm) or sends the nodes their
plans (SSH) before its console echo and signal handlers exist. ``run.run_supervised`` takes
the handles (``first=``) and supervises from there.

What must precede any process is done here as well: fresh logs (a new job's are emptied),
this process as the subreaper of their orphans, the lifeline watchdog that stops them if
this process is SIGKILLed, and handlers that keep the stop signals (and a checkpoint request)
until the supervisor's own are installed, which then acts on them (``EarlySignals``): a
Ctrl-C as the ranks start stops the job as one a minute later would.
"""
from __future__ import annotations

import os
from typing import Callable, List, Sequence

from fluidctl.launch.logfiles import fresh_logs
from fluidctl.procs import lifeline, local
from fluidctl.sigs import signal, supervised_signals


class FirstStart:
    """Attempt 0, started by ``start(0)`` once the logs are ready (emptied when ``fresh``),
    this process is a subreaper and the lifeline watchdog runs (``grace``: a service's time to
    stop if we die). ``start`` keeps the Launcher protocol: it returns every handle, or stops
    what it started and raises, and then the watchdog is stopped here."""

    def __init__(self, start: Callable[[int], List], logs: Sequence[str], *, grace: float,
                 fresh: bool = True, checkpoint: bool = False):
        self.grace, self.fresh = grace, fresh
        # a kept log is echoed from where it ended before these processes wrote to it
        self.sizes = {} if fresh else {path: _size(path) for path in logs}
        self.taken = False          # by run_supervised, which stops them from then on
        self.handles: List = []
        self.signals = EarlySignals(supervised_signals(checkpoint))
        try:
            prepare_attempts(logs, grace, fresh)
            self.handles = start(0)
        except BaseException:
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
        self.signals.restore()
        for h in self.handles:
            try:
                h.kill()
            except Exception:       # noqa: BLE001 - the sweep below still stops it
                pass
        lifeline.stop_watchdog()
        local.sweep_descendants(self.grace)


class EarlySignals:
    """Handlers that only keep the signals they get, from before the first start until the
    supervisor installs its own; ``take`` hands the supervisor what came meanwhile (it acts
    on them, in order) and ``originals`` are the handlers to restore at its end."""

    def __init__(self, signums: Sequence[int]):
        self.pending: List[int] = []
        self.originals = {signum: signal(signum, self._keep) for signum in signums}

    def _keep(self, signum, _frame) -> None:
        self.pending.append(signum)

    def take(self) -> List[int]:
        pending, self.pending = self.pending, []
        return pending

    def restore(self) -> None:
        for signum, handler in self.originals.items():
            signal(signum, handler)


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
