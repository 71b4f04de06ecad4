"""Running a planned job's processes under supervision: shared by ``launch.execute`` (every
backend on the launching machine) and the node agent that remote nodes run.

``run_supervised`` owns the order of things: fresh logs, endpoints.log, launch.log, the console
echo, the supervisor, the sweep of leftover descendants, and the one failure report.
"""
from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from fluidctl import telemetry
from fluidctl.procs import lifeline
from fluidctl.procs import local
from fluidctl.backends.base import Handle
from fluidctl.diagnostics.failures import Failure
from fluidctl.diagnostics.dump import DUMP_REQUEST      # `fluidctl dump` asks for stacks
from fluidctl.launch.echo import LogEcho
from fluidctl.launch.firststart import FirstStart, prepare_attempts
from fluidctl.launch.logfiles import append_header
from fluidctl.launch.supervisor import LaunchLog, RunOptions, RunResult, Supervisor
from fluidctl.paths import LogLayout

if TYPE_CHECKING:
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.observe.watching import Watching

HEARTBEAT = 2.0


def failure_reporter(tail_lines: int, json_path: Optional[Path] = None) -> Callable:
    """The failure report printer; rich is imported only when a job actually failed.
    ``json_path``: where failure.json is written (named in the report)."""
    def report(failure) -> None:
        from fluidctl.console import print_failure
        written = json_path is not None and json_path.exists()     # not when the dir went
        print_failure(failure, tail_lines, str(json_path) if written else None)
    return report


def hang_reporter(lines: List[str], where: Optional[Path]) -> None:
    """Prints the hang autopsy (--hang-timeout) when it is taken."""
    from fluidctl.console import print_hang
    print_hang(lines, where)


@dataclass
class ConsoleOutput:
    """What the console shows of a supervised job: the logs it echoes (``sources``: (path,
    line prefix)) to ``out`` (stdout if None), a ``cr_mark`` written for a line's lone \\r (a
    node agent streaming to its launcher), ``report(failure)`` printing the failure, and
    ``on_hang(summary lines, dump dir)`` printing what the hang watchdog found."""
    sources: List[Tuple[str, str]] = field(default_factory=list)
    out: Optional[IO[str]] = None
    cr_mark: str = ""
    report: Optional[Callable[[Failure], None]] = None
    on_hang: Optional[Callable[[List[str], Optional[Path]], None]] = None


@dataclass
class RunWatchers:
    """What watches a supervised job besides its supervisor: ``heartbeat()`` (a line written
    every HEARTBEAT seconds, so a console that went away, such as a dropped SSH connection, is
    noticed even when the workers are silent; ``on_broken()`` is called then) and
    ``diagnostics`` (fluidctl/diagnostics/watch.py: failure triage, the ``--hang-timeout``
    watchdog, ``fluidctl dump`` requests (SIGURG), failure.json and job.json in its
    ``log_root``)."""
    heartbeat: Optional[Callable[[], str]] = None
    on_broken: Optional[Callable[[], None]] = None
    diagnostics: Optional["Diagnostics"] = None
    every: float = HEARTBEAT            # seconds between heartbeats
    watching: Optional["Watching"] = None   # live.json and the metrics endpoint (observe/)


def run_supervised(start: Callable[[int], List[Handle]], *, logs: Sequence[str],
                   launch_log: LaunchLog, options: RunOptions, shown: ConsoleOutput,
                   watchers: Optional[RunWatchers] = None, fresh: bool = True,
                   first: Optional[FirstStart] = None) -> RunResult:
    """Supervise attempts made by ``start`` with the console echo running; ``logs`` are
    truncated first and get a header before each restart; with ``fresh`` False (a node
    agent's restart) the logs are kept and only what is written from now on is echoed.
    ``first``: attempt 0, already started (``launch/firststart.py``; it says ``fresh``)."""
    watchers = watchers or RunWatchers()
    diagnostics = watchers.diagnostics
    if first is None:
        prepare_attempts(logs, options.grace_period, fresh)
    else:
        fresh = first.fresh
    if diagnostics:
        lifeline.remove_on_death(diagnostics.diag.root)     # and removes its /dev/shm dir
    echo = LogEcho(shown.sources, shown.out, watchers.on_broken, from_end=not fresh,
                   cr_mark=shown.cr_mark, sizes=first.sizes if first is not None else None)
    echo.start()
    beating = threading.Event()

    def before_restart(attempt: int) -> None:
        append_header(logs, attempt, options.max_restarts)

    straggler_watch = commits = None

    def start_watching() -> None:
        """The watchers of the running job (heartbeat, hangs, stragglers, live view,
        checkpoint commits): started right after the first attempt's processes, not before,
        since their threads' start-up (10-15 ms on a loaded node) would delay every rank's.
        What they watch is there from its start: logs, progress counters, commits."""
        nonlocal straggler_watch, commits
        if watchers.heartbeat:
            def beat():
                while not beating.wait(watchers.every):
                    echo.say(watchers.heartbeat())
            threading.Thread(target=beat, name="fluidctl-heartbeat", daemon=True).start()
        if watch:
            watch.start()
            straggler_watch = diagnostics.watch_stragglers(supervisor.handles, echo.say, sink)
            if watchers.watching is not None and diagnostics.log_root is not None:
                watchers.watching.attach(diagnostics, supervisor.handles)
        if options.checkpoint is not None:
            commits = options.checkpoint.watch_commits(sink.emit)

    watchers_started = False

    def start_then_watch(attempt: int) -> List[Handle]:
        nonlocal watchers_started
        # attempt 0's handles, when started already: the supervisor's from now on
        handles = first.take() if first is not None and not first.taken else start(attempt)
        if not watchers_started:
            watchers_started = True
            start_watching()
        return handles

    # the job's events (fluidctl/telemetry): LOG_DIR/events.jsonl, launch.log, the console
    sink = telemetry.for_job(diagnostics.log_root if diagnostics else None, launch_log,
                             echo.say)
    supervisor = Supervisor(start_then_watch, options, log=launch_log, say=echo.say,
                            before_restart=before_restart, sink=sink)
    if diagnostics:
        diagnostics.supervised_by(supervisor)   # an elastic launcher may change the world
    watch = (_Watch(supervisor, diagnostics, logs, launch_log, shown.on_hang, sink)
             if diagnostics else None)
    previous = telemetry.install(sink)      # the job's: an elastic launcher emits to it too
    try:
        result = supervisor.run(first.signals if first is not None else None)
        if watch:
            result = watch.settle(result)
    finally:
        telemetry.install(previous)
        beating.set()
        if straggler_watch:
            straggler_watch.stop()
        if watchers.watching is not None:
            watchers.watching.close()
        if commits:
            commits.stop()
        lifeline.stop_watchdog()
        if watch:
            watch.stop()
        left = local.sweep_descendants(options.grace_period)
        if left:
            launch_log(f"stopped {len(left)} leftover process(es): {left}")
        echo.finish()
    if diagnostics is not None:
        if result.failure is not None:
            diagnostics.triage.explain(result.failure, logs)
            result.failure.others = [e for e in diagnostics.ends(result)
                                     if e.label != result.failure.label]
        watch.finish(result)
    if result.failure is not None and shown.report is not None:
        shown.report(result.failure)
    launch_log(f"exit code {result.exit_code}")
    return result


class _FailedMeanwhile(Exception):
    """Ranks found silent for the hang timeout had failed by themselves when their stacks were
    asked for (a loaded machine ran them and the watchdog late): the message names them."""


def failed_by_themselves(handles, dump) -> str:
    """The ranks that exited with an error of their own (not woken by the stack signal)
    while the hang was being looked at, as "rank 2 (exit code 1)"; '' for none. Their
    failure is the job's story: the supervisor reports it, with its cause."""
    failed = []
    for h in handles:
        rank = getattr(h, "rank", None)
        if rank is None or dump.state.get(rank) != "exited" or dump.signalled.get(rank):
            continue
        code = h.poll() if getattr(h, "pid", None) else None
        if code not in (None, 0):
            failed.append(f"rank {rank} (exit code {code})")
    return ", ".join(failed)


class _Watch:
    """The diagnostics around one supervised job: the hang watchdog, ``fluidctl dump``
    requests (SIGURG to the launcher), job.json while it runs, failure.json at the end."""

    def __init__(self, supervisor: Supervisor, diagnostics: "Diagnostics", logs, launch_log,
                 on_hang, sink: telemetry.Sink):
        self.supervisor, self.d, self.logs = supervisor, diagnostics, logs
        self.launch_log, self.on_hang, self.sink = launch_log, on_hang, sink
        self.dog = None
        self._requests = threading.Event()
        self._done = threading.Event()
        self._hung_at = threading.Event()      # a hang was found: the job ends as one
        self._hang_taken = threading.Event()   # ... and its report is written
        self._previous = None
        self._activity = None

    def start(self) -> None:
        from fluidctl.diagnostics import watch as diagnose
        if self.d.hang_timeout:
            activity = self.d.activity(self.logs, self.supervisor.handles)
            self._activity = activity
            self.dog = diagnose.Watchdog(self.d.hang_timeout, activity,
                                         self._hung)
            self.dog.start()
        if self.d.log_root is not None:
            try:                    # a report of an earlier job in this log dir is stale now
                LogLayout(self.d.log_root).failure_json.unlink()
            except FileNotFoundError:
                pass
            try:
                self._previous = signal.signal(DUMP_REQUEST, lambda *_: self._requests.set())
            except ValueError:      # not the main thread: no fluidctl dump for this run
                self._previous = None
            else:
                threading.Thread(target=self._serve_dumps, name="fluidctl-dump",
                                 daemon=True).start()
                try:
                    diagnose.write_job_state(self.d.log_root)
                except OSError as exc:      # a full disk: the job runs on, its report says so
                    self.launch_log(f"could not write {LogLayout(self.d.log_root).job_state}: "
                                    f"{exc.strerror or exc} (fluidctl dump cannot find this "
                                    "job by its log dir)")

    def _dump(self, kind: str, header: str, why: str = ""):
        """Every rank's stack into LOG_DIR/<kind>-<time>/; for a hang, its class first
        (``classify``): the header becomes the sentence, ``why`` the line after it."""
        from fluidctl.diagnostics import watch as diagnose
        handles = self.supervisor.handles()
        dump = self.d.stacks(handles)
        if kind == "hang":
            failed = failed_by_themselves(handles, dump)
            if failed:
                raise _FailedMeanwhile(failed)
        hosts = self.d.hosts(handles)
        verdict = dump.verdict(hosts) if kind == "hang" else None
        if verdict is not None and verdict.hung:
            from fluidctl.diagnostics.classify import SECOND_LOOK, second_look
            if verdict.kind in SECOND_LOOK:     # ranks outside collectives: look again
                again = self.d.stacks(self.supervisor.handles())
                verdict = second_look(verdict, dump.evidence(hosts), again.evidence(hosts))
        first = [why] if why else []
        if verdict is not None:
            header = f"fluidctl: the job hung: {verdict.sentence}"
        elif why:
            header, first = f"{header}: {why}", []
        where = None
        if self.d.log_root is not None and (verdict is None or verdict.hung):
            where = diagnose.write_dump(self.d.log_root, dump, header, kind, hosts, first)
        return dump, where, verdict, header, first

    def _why(self) -> str:
        return (f"no rank wrote to its log and no collective completed for "
                f"{self.d.hang_timeout:g}s")

    def _hung(self) -> None:
        """The watchdog found a hang: take the stacks, report, abort with HANG_EXIT. Taking
        a stack may wake a rank (the faulthandler signal ends a sleeping C call early) and
        let the job end by itself meanwhile: ``settle`` turns that end into the hang it was.
        Never raises (the watchdog thread must not die with a traceback)."""
        from fluidctl.diagnostics import watch as diagnose
        ranks = [h for h in self.supervisor.handles() if getattr(h, "rank", None) is not None]
        if ranks and all(h.poll() is not None for h in ranks):
            # every rank ended by itself before anyone looked (a busy machine ran the
            # watchdog late): the job is over, not hung; the supervisor reports the ends
            self.launch_log(f"hang watchdog: {self._why()}, but every rank had already "
                            "ended: not a hang")
            return
        self._hung_at.set()
        why = self._why()
        header, first, verdict = "fluidctl: the job hung", [], None
        try:
            self.launch_log(f"hang: {why}; taking every rank's stack")
            try:
                dump, where, verdict, header, first = self._dump("hang", header, why)
                lines, notes = dump.summary(), list(dump.notes)
                evidence = [{"rank": e.rank, "host": e.host, "state": e.state, "cpu": e.cpu,
                             "running": e.running, "collectives_done": e.count}
                            for e in dump.evidence(
                                 self.d.hosts(self.supervisor.handles()))]
            except _FailedMeanwhile as failed:
                self.launch_log(f"hang watchdog: {why}, but {failed} failed by itself before "
                                "its stack was taken: the job failed, it did not hang")
                self._hung_at.clear()
                self._hang_taken.set()      # a settle() waiting for the report: none comes
                return
            except Exception as exc:             # no stacks: the hang is still reported
                where, lines, evidence = None, [], []
                header = f"{header}: {why}"
                notes = [f"the stacks could not be taken: {type(exc).__name__}: {exc}"]
                self.launch_log(f"hang: {notes[0]}")
            if verdict is not None and not verdict.hung and self._watch_on(verdict):
                return
            self.sink.emit(telemetry.Hang(
                why=why, dir=str(where) if where else None,
                verdict=verdict.kind if verdict else None,
                sentence=verdict.sentence if verdict else None,
                ranks=tuple(verdict.ranks) if verdict else (), summary=tuple(lines),
                notes=tuple(notes), evidence=tuple(evidence)))
            if self.on_hang:
                self.on_hang([header] + first + lines + [f"note: {n}" for n in notes], where)
        except Exception as exc:
            try:
                self.launch_log(f"hang report failed: {type(exc).__name__}: {exc}")
            except Exception:
                pass
        self._hang_taken.set()
        self.supervisor.abort(diagnose.HANG_EXIT, f"hung ({why})")

    def _watch_on(self, verdict) -> bool:
        """No rank waits for another (every one computes): not a hang. Watch on with a fresh
        watchdog, unless the job is ending (then the hang it was found to be stands)."""
        from fluidctl.diagnostics import watch as diagnose
        if self._done.is_set():
            return False
        self.launch_log(f"no progress for {self.d.hang_timeout:g}s, but {verdict.sentence}; "
                        "watching on")
        self._hung_at.clear()
        taken, self._hang_taken = self._hang_taken, threading.Event()
        taken.set()             # a settle() waiting for a report: there is none, no hang
        self.dog = diagnose.Watchdog(self.d.hang_timeout, self._activity, self._hung)
        self.dog.start()
        return True

    def settle(self, result: RunResult) -> RunResult:
        """A hang found ends as a hang (exit 124, its report), whatever the ranks did after
        their stacks were taken (exited 0, or failed because the signal woke them)."""
        from fluidctl.diagnostics import watch as diagnose
        if not self._hung_at.is_set() or result.exit_code == diagnose.HANG_EXIT:
            return result
        self._hang_taken.wait(diagnose.HANG_REPORT_TIMEOUT)
        if not self._hung_at.is_set():          # every rank was busy: no hang after all
            return result
        why = self._why()
        self.launch_log(f"the job ended while its hang was being reported; it hung ({why})")
        import dataclasses
        return dataclasses.replace(result, exit_code=diagnose.HANG_EXIT, failure=None,
                                   signal=None, aborted=f"hung ({why})")

    def _serve_dumps(self) -> None:
        while True:
            self._requests.wait()
            if self._done.is_set():
                return
            self._requests.clear()
            self.launch_log("fluidctl dump requested: taking every rank's stack")
            try:
                where = self._dump("dump", "fluidctl dump: the running job's stacks")[1]
                self.launch_log(f"stacks written to {where}")
            except Exception as exc:            # a failed dump must not end the job
                self.launch_log(f"fluidctl dump failed: {exc}")

    def stop(self) -> None:
        if self.dog:
            self.dog.stop()
        self._done.set()
        self._requests.set()
        if self._previous is not None:
            signal.signal(DUMP_REQUEST, self._previous)

    def finish(self, result: RunResult) -> None:
        from fluidctl.diagnostics import watch as diagnose
        if self.d.log_root is not None:
            diagnose.clear_job_state(self.d.log_root)
            hang = self.sink.last(telemetry.Hang.KIND)
            if result.exit_code != 0 and (result.failure is not None or hang):
                path = LogLayout(self.d.log_root).failure_json
                try:
                    diagnose.write_failure_json(path, result.exit_code, result.failure,
                                                self.d.ends(result), self.d.tail_lines,
                                                hang.failure_record() if hang else None)
                except OSError as exc:  # the log dir removed or full: the report still comes
                    self.launch_log(f"cannot write {path}: {exc.strerror or exc}")
                    print(f"warning: cannot write {path}: {exc.strerror or exc}",
                          file=sys.stderr, flush=True)
        self.d.close()
