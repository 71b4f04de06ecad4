"""The node agent: the per-node supervisor that the SSH and Fabric backends
(``fluidctl.backends.ssh``; the line protocol is ``fluidctl.agentproto``) start on each remote
node as ``python -m fluidctl.node.agent --ports N`` (users never type it; no click, so it
starts fast).

One SSH exec per node does everything, because on real clusters every exec pays for a login
shell: the agent first reports on its node (Python and fluidctl versions, free disk, GPUs and
as many free ports as asked) in one ``probe`` line, then reads its share of the plan as one JSON
line on stdin (so the job token never shows in ``ps``), starts that node's processes with the
same code as the local launcher, each writing LOG_DIR/<host>/workerlog.N (serverlog.N), and
streams every line of every log back on stdout, tagged with the process it came from, unless
that LOG_DIR is the launcher's own (its shared marker is there: a shared file system), where
the files already are the logs. It exits with the first failing process's code after a
``failure`` record. If the launcher goes away (stdin closes, stdout breaks, or an elastic
job's beats stop) it stops its processes, at the latest ``GONE_MARGIN`` seconds past the grace
period: nothing is left on the node.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from fluidctl import __version__

from fluidctl.agentproto import (BEAT_COMMAND, BEAT_MISSES, BEAT_TAG, CHECKPOINT_COMMAND,
                                 CR_MARK, DOCTOR_TAG, DUMP_COMMAND, ENDS_TAG, FAILURE_TAG, MARK,
                                 PROBE_TAG, SAY_TAG, STACKS_TAG, STEPS_TAG, STOP_COMMAND, USAGE_TAG, Ends,
                                 NodeShare, Probe, RecordError, tag_for)
from fluidctl.errors import UsageError
from fluidctl.sigs import GRACE_PERIOD

GONE_MARGIN = 10.0      # seconds past the grace period an agent whose launcher is gone may take
GONE_EXIT = 1           # its exit code when it had to leave at once


def emit(tag: str, text: str) -> None:
    sys.stdout.write(f"{MARK}{tag}|{text}\n")
    sys.stdout.flush()


def probe(ports: int) -> Probe:
    """What the launcher needs to know about this node before it plans."""
    from fluidctl.planning import devices
    from fluidctl.net import free_ports
    from fluidctl.node import doctor
    free = free_ports(ports, "")
    gpus = devices.discover_gpus(os.environ)       # ids as this node's CUDA_VISIBLE_DEVICES
    return Probe(sys.version.split()[0], __version__, sys.executable,
                 shutil.disk_usage(".").free, os.getcwd(), list(gpus), list(free),
                 doctor.interfaces())


def shares_log_dir(layout, nonce: str) -> bool:
    """True when the launcher's shared marker named ``nonce`` is in our LOG_DIR: it is the
    directory the launcher writes to (paths.LogLayout.shared_marker)."""
    if not nonce or not nonce.isalnum():
        return False
    return layout.shared_marker(nonce).exists()


class _Heard:
    """When the launcher last wrote to our stdin (any line: a beat, a dump request), and where
    the agent's own notes go (stderr until the node's launch log exists).

    Stdin is read by a thread of its own from the agent's start (``listen``): a beat counts
    when it arrives, whatever the main thread is doing meanwhile (importing the supervisor,
    starting the ranks: seconds on a node busy with a hundred such agents). The other lines
    wait in ``next_line`` for whoever handles them; "" once stdin is closed."""
    def __init__(self):
        self.at = time.monotonic()
        self.log = lambda message: print(message, file=sys.stderr, flush=True)
        self.running = threading.Event()    # set once the run beats by itself
        self.grace = GRACE_PERIOD           # the plan's, once it came
        self._lines = None
        self._gone = threading.Lock()

    def listen(self) -> None:
        if self._lines is not None:
            return
        import queue
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="launcher-lines").start()

    def _read(self) -> None:
        try:
            for line in iter(sys.stdin.readline, ""):
                self.at = time.monotonic()
                if line.strip() != BEAT_COMMAND:
                    self._lines.put(line)
        except (OSError, ValueError):
            pass
        self._lines.put("")

    def next_line(self) -> str:
        return self._lines.get()

    def launcher_gone(self, why: str) -> None:
        """Stop this node's processes: SIGTERM to ourselves (the supervisor stops the ranks
        within the grace period, as for Ctrl-C), and a deadline for that. An agent whose
        stdout nobody drains (its SSH connection stalled: a link down, a frozen or vanished
        launcher) blocks in its next write, the supervisor's stop included, and would keep
        its ranks running for good: ``GONE_MARGIN`` seconds past the grace period it exits
        at once, and its lifeline watchdog (procs/lifeline.py) kills what it started. Logged
        last: the log may be what blocks."""
        if not self._gone.acquire(blocking=False):
            return                          # already stopping
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = self.grace + GONE_MARGIN

        def backstop():
            time.sleep(deadline)
            try:
                print(f"fluidctl node agent: still running {deadline:g}s after the launcher "
                      "went: exiting now (the lifeline stops the ranks)", file=sys.stderr,
                      flush=True)
            finally:
                os._exit(GONE_EXIT)
        threading.Thread(target=backstop, daemon=True, name="launcher-gone").start()
        self.log(why)


def _serve_stdin(launch_log, diagnostics, heard: "_Heard", checkpoint=None) -> None:
    """Answer the launcher's "dump" lines, pass its checkpoint requests to ``checkpoint`` (the
    signal's name); stop the node's processes when stdin closes."""
    for line in iter(heard.next_line, ""):
        words = line.split()
        if words[:1] == [CHECKPOINT_COMMAND] and len(words) == 2 and checkpoint is not None:
            checkpoint(words[1])
            continue
        if line.strip() == STOP_COMMAND:        # the launcher stops the job (elastic jobs)
            launch_log("stop requested by the launcher")
            os.kill(os.getpid(), signal.SIGTERM)
            continue
        if line.strip() == DUMP_COMMAND and diagnostics is not None:
            launch_log("stacks requested by the launcher")
            try:
                dump = diagnostics.stacks(diagnostics.current)
                emit(STACKS_TAG, json.dumps(dump.to_json()))
            except Exception as exc:        # the launcher must get an answer
                emit(STACKS_TAG, json.dumps({"texts": {}, "why": {}, "method": {},
                                             "notes": [f"node agent: {exc}"]}))
    heard.launcher_gone("stdin closed: the launcher is gone; stopping this node's processes")


def _watch_launcher(heard: _Heard, every: float) -> None:
    """An elastic job's launcher beats on our stdin every ``every`` seconds: BEAT_MISSES beats
    missed in a row (its link is down, it froze) and this node stops its processes, as when
    stdin closes: nothing is left running on a node cut off from its job."""
    quiet = threading.Event()
    while not quiet.wait(every):
        silent = time.monotonic() - heard.at
        if silent > every * BEAT_MISSES:
            heard.launcher_gone(f"no heartbeat from the launcher for {silent:.1f}s: it is gone "
                                "or cut off; stopping this node's processes")
            return


def _beat_until_run(heard: _Heard, every: float) -> None:
    """Beat to the launcher until the node's run beats itself (run.RunWatchers), so that a
    standby agent that waits for a plan is watched like a running one."""
    while not heard.running.wait(every):
        try:
            emit(BEAT_TAG, "0")
        except (OSError, ValueError):       # the launcher is gone
            return


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ports = int(argv[argv.index("--ports") + 1]) if "--ports" in argv else 0
    # --beat S: an elastic job's launcher beats on stdin from the start (a standby agent waits
    # for a plan that may never come; cut off from its launcher, it must still end)
    beat = float(argv[argv.index("--beat") + 1]) if "--beat" in argv else 0.0
    heard = _Heard()
    heard.listen()                      # before anything slow: beats count as they come
    if beat:
        threading.Thread(target=_watch_launcher, args=(heard, beat), daemon=True,
                         name="launcher-beats").start()
        threading.Thread(target=_beat_until_run, args=(heard, beat), daemon=True,
                         name="agent-beats").start()
    try:
        node_agent(ports, heard, watching=bool(beat))
    except UsageError as exc:
        print(exc.one_line(), file=sys.stderr)
        sys.exit(exc.exit_code)


def _read_share(heard: Optional[_Heard] = None) -> NodeShare:
    """Answer the launcher's rendezvous checks until its plan for this node comes; exit
    quietly on an empty line (the launcher decided not to run: a dry run, a bad node)."""
    not_by_hand = "the node agent is started by fluidctl train; do not run it by hand"
    held = None                           # node 0: the master port, listening until the plan
    if heard is None:
        heard = _Heard()
        heard.listen()
    while True:
        line = heard.next_line()
        if not line.strip():
            sys.exit(0)
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"unreadable node plan: {exc}", not_by_hand)
        if not (isinstance(record, dict) and "doctor" in record):
            break
        from fluidctl.node import doctor
        problems, held = doctor.node_checks(record["doctor"])
        emit(DOCTOR_TAG, json.dumps(problems))
    if held is not None:
        held.close()
    try:
        return NodeShare.from_record(record)
    except RecordError as exc:
        raise UsageError(str(exc), not_by_hand) from None


def _check_scripts(procs, host: str) -> None:
    """A training script the plan names by path must be here: otherwise one line naming this
    node and the path (not start_procs' FileNotFoundError traceback on every node)."""
    for p in procs:
        if p.role != "trainer" or not p.argv:
            continue
        python = p.argv[1:2] == ["-u"] and len(p.argv) > 2
        script = p.argv[2] if python else p.argv[0]
        # a program without '/' is looked up on PATH; a script given to python is a path
        if (not python and "/" not in script) or script.startswith("-") \
                or os.path.exists(script):
            continue
        raise UsageError(f"SCRIPT {script} does not exist on {host} (in {os.getcwd()})",
                         "copy it there, e.g. fluidctl cluster sync --hostfile HOSTS ., or "
                         "pass --remote-dir with the directory that holds it")


# What the node's run imports once its plan has come: loaded on a thread of its own
# (fluidctl/preload.py) from the probe on, while the launcher plans and the main thread
# answers its rendezvous check. First what starting the ranks needs (START_MODULES, 15 ms),
# then the supervisor and the diagnostics (10 ms), which may still be loading when the ranks
# start (launch/firststart.py).
START_MODULES = ("fluidctl.paths", "fluidctl.planning.plan", "fluidctl.procs.local",
                 "fluidctl.diagnostics.inject", "fluidctl.runtime.nodejoin",
                 "fluidctl.launch.launchlog", "fluidctl.launch.logfiles",
                 "fluidctl.launch.firststart", "fluidctl.launch.requests")
RUN_MODULES = START_MODULES + (
    "fluidctl.launch.run", "fluidctl.diagnostics.watch", "fluidctl.launch.supervisor",
    "fluidctl.diagnostics.stragglerwatch", "fluidctl.observe.usage")


def node_agent(ports: int, heard: _Heard = None, watching: bool = False) -> None:
    """Run this node's share of a job (started by fluidctl over SSH). The probe goes out first:
    the launcher plans while the supervisor, the planner and the diagnostics load here, and
    its rendezvous check is answered meanwhile. The ranks start as soon as the plan has come;
    their supervisor is set up while they start."""
    emit(PROBE_TAG, probe(ports).to_wire())
    from fluidctl.preload import Preload
    preload = Preload(RUN_MODULES)
    heard = heard or _Heard()
    heard.listen()
    share = _read_share(heard)
    from fluidctl.procs.local import start_procs
    from fluidctl.planning.plan import ProcSpec
    from fluidctl.launch.firststart import FirstStart
    from fluidctl.launch.launchlog import LaunchLog
    from fluidctl.launch.logfiles import append_header, clear_stale
    from fluidctl.paths import DiagDir, LogLayout
    try:
        procs = [ProcSpec(**p) for p in share.procs]
    except TypeError as exc:
        raise UsageError(f"the node plan's processes are not this version's ({exc})",
                         "install the same fluidctl version on every node") from None
    _check_scripts(procs, share.host)
    layout = LogLayout(Path(share.log_dir), share.host)     # LOG_DIR/<host>/, as there
    layout.create()
    logs = [str(layout.for_role(p.role, p.rank)) for p in procs]
    launch_log = LaunchLog(str(layout.node_launch(share.host)))
    attempt = share.attempt
    launch_log(f"node agent for {share.host}: attempt {attempt}, "
               + ", ".join(p.label for p in procs))
    shared = shares_log_dir(layout, share.marker)
    if shared:          # the launcher's own files: it empties them, it writes restart headers
        launch_log(f"{layout.dir.resolve()} is the launcher's (its marker is here): the "
                   "ranks write their logs there, nothing is streamed")
        emit(SAY_TAG, f"LOG_DIR is shared with the launcher: {len(logs)} log(s) in "
                      f"{layout.dir} written by the ranks there, not streamed")
    elif attempt:
        append_header(logs, attempt, share.max_restarts)
    else:
        for stale in clear_stale(layout, logs):
            launch_log(f"removed {stale}: an earlier job's log, not this job's")
    diag = DiagDir.create()         # this node's ranks' progress counters and stacks
    # checkpoint requests: this node's request file (the launcher's may be on another
    # machine), created when the launcher asks, before the signal goes to the ranks
    request = (layout.dir / "checkpoint.request").resolve()
    from fluidctl.launch import requests
    rank_env = requests.rank_env(request, layout.checkpoint_state.resolve(),
                                 share.checkpoint_signal)

    def start(_attempt):
        try:
            os.unlink(request)          # an earlier attempt's request is not this one's
        except FileNotFoundError:
            pass
        return start_procs(procs, attempt, logs, extra_env={**diag.env(), **rank_env})

    first = None
    try:
        first = FirstStart(start, logs, grace=share.grace, fresh=not attempt and not shared)
        _supervise(first, start, procs, logs, layout, launch_log, share, diag, request,
                   heard, watching, shared, preload)
    except BaseException:
        if first is not None:
            first.abandon()     # unless the supervisor had taken the ranks over
        diag.remove()
        raise


def _supervise(first, start, procs, logs, layout, launch_log, share, diag, request, heard,
               watching: bool, shared: bool, preload) -> None:
    """The started ranks' supervision, once the supervisor's modules are in: the launcher's
    commands, the heartbeat, the straggler and usage publishers, the records at the end."""
    preload.join()
    from fluidctl.launch import run
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.launch.supervisor import RunOptions
    diagnostics = Diagnostics(diag=diag)        # triage, stacks, progress
    diagnostics.current = first.handles

    def checkpoint(name: str) -> None:
        from fluidctl import paths
        from fluidctl.sigs import by_name
        if name == "save":          # checkpoint and go on: the ranks read the file
            launch_log(f"checkpoint requested by the launcher: {request} (save and go on)")
            try:
                paths.write_atomic(request, f"save launcher {time.time():.3f}\n", 0o644)
            except OSError as exc:
                launch_log(f"could not write {request}: {exc}")
            return
        try:
            sig = by_name(name)
        except ValueError:
            launch_log(f"checkpoint request with an unknown signal {name!r}: ignored")
            return
        launch_log(f"checkpoint requested by the launcher: {request}, SIG{name} to the ranks")
        try:
            paths.write_atomic(request, f"stop launcher {time.time():.3f}\n", 0o644)
        except OSError as exc:      # the signal still reaches the ranks
            launch_log(f"could not write {request}: {exc}")
        for h in list(diagnostics.current):
            if h.poll() is None:
                h.send_signal(sig)

    heard.log, heard.grace = launch_log, share.grace
    heard.running.set()
    threading.Thread(target=_serve_stdin, args=(launch_log, diagnostics, heard, checkpoint),
                     daemon=True).start()
    if share.beat and not watching:
        threading.Thread(target=_watch_launcher, args=(heard, share.beat),
                         daemon=True, name="launcher-beats").start()

    halt = threading.Event()

    def publish() -> None:
        """The ranks' straggler sums and CPU/memory, for the launcher (``fluidctl top``):
        threads started after the ranks, whose start-up they would delay."""
        from fluidctl.diagnostics import stragglerwatch
        from fluidctl.observe import usage
        threading.Thread(target=stragglerwatch.publish, daemon=True, name="fluidctl-steps",
                         args=(diagnostics.diag, lambda text: emit(STEPS_TAG, text),
                               halt)).start()
        threading.Thread(target=usage.publish, daemon=True, name="fluidctl-usage",
                         args=(lambda: list(diagnostics.current),
                               lambda text: emit(USAGE_TAG, text), halt)).start()

    def lost():
        heard.launcher_gone("stdout broke: the launcher is gone; stopping this node's processes")

    shown = run.ConsoleOutput(
        sources=[] if shared else [(log, f"{MARK}{tag_for(p.role, p.rank)}|")
                                   for p, log in zip(procs, logs)],
        cr_mark=CR_MARK,
        report=lambda failure: emit(FAILURE_TAG, json.dumps(failure.to_record())))
    watchers = run.RunWatchers(heartbeat=lambda: f"{MARK}{BEAT_TAG}|{diagnostics.progress()}",
                               on_broken=lost, diagnostics=diagnostics,
                               every=share.beat or run.HEARTBEAT)

    def start_again(attempt: int):
        diagnostics.current = start(attempt)
        return diagnostics.current

    publish()
    try:
        # a slow stop is said once by the launcher, naming the nodes: not once per node
        result = run.run_supervised(start_again, logs=logs, launch_log=launch_log,
                                    options=RunOptions(share.grace, 0, stop_notice=False),
                                    shown=shown, watchers=watchers, first=first)
    finally:
        halt.set()
    try:
        emit(ENDS_TAG, Ends(result.ends).to_wire())
    except (BrokenPipeError, ValueError):   # the launcher is gone
        pass
    launch_log.close()
    leave(result.exit_code)


def leave(code: int) -> None:
    """Exit at once (``os._exit``) with what the agent wrote flushed: its records go out by
    ``emit`` (flushed), its launch log is closed, its diagnostics directory removed, and
    nothing in an agent registers with atexit. The interpreter's teardown took 7 ms (on the
    path to the launcher's end, which waits for every agent's) and runs while the agent's
    daemon threads still do: with gc.freeze before it, an agent stopped by an elastic restart
    died of SIGSEGV there in 3 of 11 runs of the 100-node test."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
