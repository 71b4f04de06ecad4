"""Supervision of a started job: watch, fail fast, restart, forward signals.

The pattern is torch elastic's process context. ``run()`` starts every handle of an attempt,
waits (on pidfds or channel descriptors, not by sleeping) until all trainers succeeded or one
handle failed, and then stops the rest: SIGTERM to every process tree, SIGKILL to what is still
there after the grace period. The *first observed* failure is the one reported. SIGINT, SIGTERM
and SIGHUP to fluidctl stop the job the same way (exit 128+N); a second one (Ctrl-C, or a
second SIGTERM from a scheduler that lost patience) kills at once.

Checkpoint requests (``RunOptions.checkpoint``, launch/requests.py): SIGTERM first writes the
request file the ranks poll, then stops the job as above. SIGUSR1 (Slurm's warning signal) or
``request()`` (a near time limit) writes it and forwards the checkpoint signal (SIGTERM by
default) instead; the ranks have the whole grace period to save. When every trainer then
exited 0 (or the ranks stopped on a request themselves, as ``scancel --signal=USR1`` to the
ranks makes them), fluidctl exits REQUEUE_EXIT (75). A second signal while stopping kills at
once: the checkpoint being written stays partial and the previous one is resumed.
"""
from __future__ import annotations

import os
import selectors
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from fluidctl.agentproto import EndState, ProcessEnd
from fluidctl.diagnostics.failures import Failure, FailureKind
from fluidctl.launch.launchlog import LaunchLog  # noqa: F401 (imported from here too)
from fluidctl.launch.requests import REQUEUE_EXIT
from fluidctl import telemetry
from fluidctl.sigs import GRACE_PERIOD, REQUEST_SIGNALS, STOP_SIGNALS, supervised_signals
from fluidctl.telemetry import Restart

if TYPE_CHECKING:
    from fluidctl.backends.base import Handle
    from fluidctl.launch.requests import RequestChannel

KILL_WAIT = 10.0        # after SIGKILL, how long to wait for the kernel to reap
STOP_NOTICE = 5.0       # a stop that takes longer is said on the console, with how to cut it
                        # short: a silent grace period reads as a hung fluidctl


# The codes of a process that our SIGTERM, SIGINT (a node agent's "at once", a Slurm job's stop)
# or SIGKILL ended (as a local child, or as a shell or node agent reports it): any other code is
# the process's own (it failed or finished by itself while fluidctl was stopping the job).
_STOPPED_CODES = frozenset(code for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
                           for code in (-sig, 128 + sig))


@dataclass
class RunOptions:
    grace_period: float = GRACE_PERIOD
    max_restarts: int = 0
    checkpoint: Optional["RequestChannel"] = None   # the job's checkpoint requests
    request_at: Optional[float] = None      # time.time() of a request (a time limit near)
    stop_notice: bool = True    # say a slow stop (a node agent's launcher says it for its node)


@dataclass
class RunResult:
    exit_code: int
    failure: Optional[Failure] = None
    signal: Optional[int] = None
    attempts: int = 1
    ends: List[ProcessEnd] = field(default_factory=list)     # every process's final state
    aborted: str = ""           # why fluidctl stopped the job itself (a hang)


class Supervisor:
    """``start(attempt)`` returns the handles of one attempt; ``say`` prints a console line."""

    def __init__(self, start: Callable[[int], List[Handle]], options: RunOptions,
                 log: Callable[[str], None] = lambda m: None,
                 say: Callable[[str], None] = lambda m: None,
                 before_restart: Callable[[int], None] = lambda attempt: None,
                 sink: Optional[telemetry.Sink] = None):
        self.start, self.options, self.log, self.say = start, options, log, say
        self.before_restart = before_restart
        # restarts are events (fluidctl/telemetry): the job's sink, else launch.log and say
        self.sink = sink if sink is not None else telemetry.Sink(
            [telemetry.LaunchLogLines(log), telemetry.ConsoleLines(say)])
        self._signal: Optional[int] = None
        self._request: Optional[str] = None         # why a checkpoint was requested
        self._request_by_signal = False
        self._kill_now = False
        self._killed_at_once = False
        self._abort: Optional[tuple] = None
        self._regroup: Optional[str] = None         # why the world changes (a node rejoins)
        self._regroups = 0                          # attempts that were world changes
        self._abort_lock = threading.Lock()
        self._closed = False
        self._ends: Dict[str, ProcessEnd] = {}
        self._stopping = False
        self._handles: List[Handle] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    # --- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        # a USR1 after a request of the timer's own (Slurm's warning, the same time limit) is
        # the same request, not a second one
        second = (signum in REQUEST_SIGNALS and self._request_by_signal) or (
            self._stopping and signum in STOP_SIGNALS) or (
            self._stopping and signum in REQUEST_SIGNALS and self._request is None)
        if second and (signum in STOP_SIGNALS or signum in REQUEST_SIGNALS):
            # a second Ctrl-C, TERM or USR1 (a scheduler that lost patience): at once, by the
            # main loop (_wait_all): killing here could interrupt an import (psutil) half-way
            self.log(f"second {signal.Signals(signum).name}: killing every process now")
            self._kill_now = self._killed_at_once = True
        elif signum in REQUEST_SIGNALS:
            if self._request is None:
                self._request = f"SIG{signal.Signals(signum).name[3:]}"
            self._request_by_signal = True
        elif self._signal is None:
            self._signal = signum
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass

    def request(self, why: str) -> None:
        """Ask for a checkpoint from another thread (the time limit is near)."""
        self._from_thread("_request", why)

    def _from_thread(self, name: str, value) -> None:
        """Set ``name`` to ``value`` unless set already, and wake the main loop (another
        thread's request)."""
        with self._abort_lock:
            if self._closed or getattr(self, name) is not None:
                return
            setattr(self, name, value)
            try:
                os.write(self._wake_w, b"w")
            except OSError:
                pass

    def abort(self, exit_code: int, why: str) -> None:
        """Stop the job from another thread (the hang watchdog): no restart, ``exit_code``."""
        with self._abort_lock:
            if self._closed:        # the run is over: its wake-up pipe may be gone
                return
            if self._abort is None:
                self._abort = (exit_code, why)
            try:
                os.write(self._wake_w, b"a")
            except OSError:
                pass

    def regroup(self, why: str) -> None:
        """Start the next attempt in a new world, from another thread (an elastic job's node
        rejoins): the running one is stopped as for a restart, without counting against
        --max-restarts, which counts failures."""
        self._from_thread("_regroup", why)

    def handles(self) -> List[Handle]:
        """The handles of the running attempt."""
        return list(self._handles)

    def _ended(self, h: Handle, code: Optional[int], stopped: bool = False) -> None:
        state = (EndState.STOPPED if stopped else EndState.FINISHED if code == 0
                 else EndState.FAILED)
        self._ends[h.label] = ProcessEnd(h.label, h.host, h.pid, state, code)

    def _result(self, code: int, **kw) -> RunResult:
        return RunResult(code, ends=list(self._ends.values()), **kw)

    def _install(self):
        wanted = supervised_signals(self.options.checkpoint is not None)
        return {sig: signal.signal(sig, self._on_signal) for sig in wanted}

    # --- the run ---------------------------------------------------------------------------
    def run(self, early=None) -> RunResult:
        """``early``: the signals kept since a first start that came before this supervisor
        (launch/firststart.py ``EarlySignals``): acted on now, as if they came after, and
        the handlers from before them are what is restored at the end."""
        previous = self._install()
        if early is not None:
            previous.update(early.originals)
            for signum in early.take():
                self._on_signal(signum, None)
        timer = None
        if self.options.checkpoint is not None and self.options.request_at is not None:
            left = max(0.0, self.options.request_at - time.time())
            timer = threading.Timer(left, self.request, ("the time limit is near",))
            timer.daemon = True
            timer.start()
        try:
            return self._run()
        finally:
            if timer is not None:
                timer.cancel()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with self._abort_lock:
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _run(self) -> RunResult:
        attempt = 0
        while True:
            if attempt:
                self.before_restart(attempt)
            self._stopping = False
            self._ends = {}
            channel = self.options.checkpoint
            if channel is not None:
                channel.clear()
            # start() returns every handle of the attempt, or stops what it started and
            # raises (the Launcher protocol); nothing is ours to stop then
            self._handles = self.start(attempt)
            self.log(f"attempt {attempt}: started " + ", ".join(
                f"{h.label} pid {h.pid} on {h.host}" for h in self._handles))
            failure = self._watch()
            if self._abort is not None:
                code, why = self._abort
                self.log(f"stopping the job: {why}")
                self._stop(self._handles)
                return self._result(code, attempts=attempt + 1, aborted=why)
            if self._request is not None and self._signal is None:
                return self._checkpoint_stop(attempt)
            if self._signal is not None:
                first = None
                if channel is not None and self._signal == signal.SIGTERM:
                    channel.ask("SIGTERM")      # before the ranks get it: they save first
                    first = channel.signal
                self.log(f"received {signal.Signals(self._signal).name}: stopping the job")
                if not all(getattr(h, "detaches", False) for h in self._handles):
                    self.say(f"fluidctl: {signal.Signals(self._signal).name} received, "
                             "stopping all processes")     # else each handle says it leaves
                self._stop(self._handles, first)
                return self._result(128 + self._signal, signal=self._signal,
                                    attempts=attempt + 1)
            if self._regroup is not None and failure is None:
                why, self._regroup = self._regroup, None
                self._stop(self._handles)
                attempt += 1
                self._regroups += 1
                self.say(f"fluidctl: {why}: restarting the job in a new world (attempt "
                         f"{attempt}; not a failure, --max-restarts is not used)")
                continue
            self._stop(self._handles)
            if failure is None:
                self.log(f"attempt {attempt}: all trainers finished")
                stopped = channel.stopped() if channel is not None else None
                if stopped:
                    self.say(f"fluidctl: the ranks stopped on a checkpoint request after "
                             f"committing step {stopped.get('step')} ({stopped.get('dir')}); "
                             f"exit {REQUEUE_EXIT}: run the job again (requeue) to resume")
                    return self._result(REQUEUE_EXIT, attempts=attempt + 1)
                return self._result(0, attempts=attempt + 1)
            self.log(f"attempt {attempt}: {failure.label} on {failure.host} failed: "
                     f"{failure.reason} (log {failure.log})")
            if attempt - self._regroups >= self.options.max_restarts or \
                    failure.kind == FailureKind.CANCELLED:
                # a job cancelled from outside (scancel) is over: only failures restart
                return self._result(failure.exit_code or 1, failure=failure,
                                    attempts=attempt + 1)
            attempt += 1
            self.sink.emit(Restart(attempt=attempt - self._regroups,    # rejoins are free
                                   of=self.options.max_restarts,
                                   label=failure.label, host=failure.host,
                                   reason=failure.reason))

    def _checkpoint_stop(self, attempt: int) -> RunResult:
        """A checkpoint request: the request file, then the checkpoint signal to every rank,
        the grace period to save, SIGKILL after it; REQUEUE_EXIT if every trainer exited 0."""
        channel, why = self.options.checkpoint, self._request
        channel.ask(why)
        name = signal.Signals(channel.signal).name
        self.log(f"checkpoint requested ({why}): {name} to every rank, "
                 f"{self.options.grace_period:g}s to save")
        self.say(f"fluidctl: checkpoint requested ({why}): {name} to every rank, "
                 f"{self.options.grace_period:g}s grace period to save and exit")
        handles = self._handles
        self._stop(handles, channel.signal)
        trainers = [h for h in handles if not h.service]
        done = channel.stopped()
        where = f" after committing step {done.get('step')}" if done else ""
        if trainers and all(h.poll() == 0 for h in trainers):
            self.say(f"fluidctl: every rank exited on the checkpoint request{where}; exit "
                     f"{REQUEUE_EXIT}: run the job again (requeue) to resume")
            return self._result(REQUEUE_EXIT, attempts=attempt + 1)
        if not self._killed_at_once:
            # the signal came before a rank could take it (still starting), or a rank did not
            # save in time: the job still stops to be run again, from its newest complete
            # checkpoint (a partial one is never loaded)
            self.log("checkpoint request: not every trainer exited 0 within the grace period")
            self.say(f"fluidctl: not every rank exited 0 on the checkpoint request{where}; "
                     f"exit {REQUEUE_EXIT}: run the job again (requeue) to resume from its "
                     "newest complete checkpoint")
            return self._result(REQUEUE_EXIT, attempts=attempt + 1)
        sig = REQUEST_SIGNALS[0] if self._request_by_signal else signal.SIGTERM
        return self._result(128 + sig, signal=sig, attempts=attempt + 1)

    def _watch(self) -> Optional[Failure]:
        """Block until every trainer succeeded (None), one handle failed, or a signal came."""
        handles = self._handles
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        for h in handles:
            if h.fileno() >= 0:
                selector.register(h.fileno(), selectors.EVENT_READ)
        all_waitable = all(h.fileno() >= 0 for h in handles)
        live = list(handles)
        try:
            while True:
                for h in list(live):
                    code = h.poll()
                    if code is None:
                        continue
                    live.remove(h)
                    if h.fileno() >= 0:
                        selector.unregister(h.fileno())
                    self.log(f"{h.label} (pid {h.pid}) ended with code {code}")
                    self._ended(h, code)
                    if code != 0:
                        return h.failure()
                    if h.service:
                        fail = h.failure()
                        fail.detail = "exited before the trainers finished"
                        return fail
                if not any(not h.service for h in live):
                    return None
                if self._signal is not None or self._abort is not None or \
                        self._request is not None or self._regroup is not None:
                    return None
                for key, _ in selector.select(timeout=1.0 if all_waitable else 0.05):
                    if key.fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 64)
                        except BlockingIOError:
                            pass
        finally:
            selector.close()

    def _stop(self, handles: List[Handle], first: Optional[int] = None) -> None:
        """TERM every live tree (or send the checkpoint signal ``first`` to its processes),
        wait up to the grace period, KILL the rest, reap all."""
        self._stopping = True
        stopped = [h for h in handles if h.poll() is None]
        for h in stopped:
            send = getattr(h, "send_signal", None)
            if first is not None and send is not None:
                send(first)
            else:
                h.terminate()
        if stopped:
            self.log(f"sent {signal.Signals(first or signal.SIGTERM).name} to "
                     + ", ".join(h.label for h in stopped))
        live = self._wait_all(stopped, self.options.grace_period,
                              notice=self._still_stopping if self.options.stop_notice else None)
        if live:
            names = ", ".join(h.label for h in live)
            self.log(f"grace period of {self.options.grace_period:g}s over: SIGKILL to {names}")
            self.say(f"fluidctl: {names} still running after the "
                     f"{self.options.grace_period:g}s grace period: SIGKILL (a checkpoint being "
                     "written is lost; --grace-period gives more time)")
            for h in live:
                h.kill()
            live = self._wait_all(live, KILL_WAIT)
        for h in stopped:
            self.log(f"{h.label} (pid {h.pid}) stopped with code {h.poll()}")
            code = h.poll()
            own_end = code is not None and code not in _STOPPED_CODES   # not fluidctl's signal
            self._ended(h, code, stopped=not own_end)
        for h in handles:
            code = h.poll()
            if code is not None and h.label not in self._ends:     # ended on its own meanwhile
                self._ended(h, code)
            if code is not None:
                h.close()

    def _still_stopping(self, live: List[Handle]) -> None:
        from fluidctl.errors import first_few
        names = first_few(h.label for h in live)
        again = "a second Ctrl-C" if self._signal is not None else "Ctrl-C"
        self.say(f"fluidctl: {names} still stopping after {STOP_NOTICE:g}s: SIGKILL at "
                 f"{self.options.grace_period:g}s (--grace-period), or now on {again}")

    def _wait_all(self, live: List[Handle], timeout: float,
                  notice: Optional[Callable[[List[Handle]], None]] = None) -> List[Handle]:
        """Wait up to ``timeout`` for ``live`` to end (a second signal kills them at once);
        those still running. ``notice(live)`` once, if some still run after STOP_NOTICE."""
        started = time.monotonic()
        deadline = started + timeout
        notice_at = started + STOP_NOTICE if notice is not None and timeout > STOP_NOTICE \
            else float("inf")
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._wake_r, selectors.EVENT_READ)
            for h in live:
                if h.fileno() >= 0:
                    selector.register(h.fileno(), selectors.EVENT_READ)
            while True:
                live = [h for h in live if h.poll() is None]
                if self._kill_now:
                    for h in live:
                        h.kill()
                    if live:
                        deadline = time.monotonic() + KILL_WAIT
                    self._kill_now, notice_at = False, float("inf")
                now = time.monotonic()
                left = deadline - now
                if not live or left <= 0:
                    return live
                if now >= notice_at:
                    notice(live)
                    notice_at = float("inf")
                left = min(left, notice_at - now)
                # a second Ctrl-C during the grace period kills at once: it wakes us here
                waitable = all(h.fileno() >= 0 for h in live)
                for key, _ in selector.select(timeout=min(left, 0.5 if waitable else 0.02)):
                    if key.fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 64)
                        except BlockingIOError:
                            pass
        finally:
            selector.close()

