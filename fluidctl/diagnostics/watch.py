"""The launcher's side of diagnostics: gathering what the engines need and writing results.

- ``Triage``: taken when an attempt starts (the memory cgroup's oom_kill count and the clock),
  it explains a failure afterwards (``fluidctl.diagnostics.triage``): OOM kill, signal, NCCL error class,
  Python exception, and the time since start.
- ``take_stacks`` / ``write_dump``: every rank's Python stack (``fluidctl.diagnostics.stacks``: py-spy,
  else the runtime's faulthandler signal), grouped, written to LOG_DIR/hang-<time>/ (or
  dump-<time>/ for ``fluidctl dump``) with summary.txt, atomically.
- ``Watchdog``: ``--hang-timeout``: calls ``on_hang`` once nothing changed for that long
  (log sizes and the runtime's progress counters).
- ``write_failure_json``: LOG_DIR/failure.json for tooling.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from fluidctl.diagnostics import progress, triage
from fluidctl.agentproto import ProcessEnd
from fluidctl.diagnostics.failures import Failure, FailureKind, end_record, log_tail
from fluidctl.paths import DiagDir, hang_dir, write_atomic

HANG_EXIT = 124             # the job was stopped because it hung (timeout(1)'s code)
HANG_REPORT_TIMEOUT = 120.0  # the most a finished job waits for its hang report (stacks)
TRIAGE_TAIL = 200           # log lines searched for a traceback or an NCCL error


# --- failure triage --------------------------------------------------------------------------

class Triage:
    """Started with the job: remembers when, and the memory cgroup's oom_kill count."""

    def __init__(self):
        self.started = time.time()
        self.uptime = triage.uptime()
        self.cgroup = triage.memory_cgroup()
        self.oom_before = triage.oom_kill_count(self.cgroup) or 0

    def explain(self, failure: Failure, peer_logs: Sequence[str] = ()) -> None:
        """Fill in ``failure.explanation``/``kind``/``started`` (best effort, never raises).
        A failure explained already (by the node agent that saw it) or with a detail of its
        own (a lost connection) keeps what it has: this machine's kernel log says nothing
        about another node. ``peer_logs``: the job's other logs here, whose collective
        fingerprints (torch's DETAIL check) complete a mismatch the failed rank names."""
        failure.started = failure.started or self.started
        if failure.explanation or failure.detail:
            return
        try:
            tail = log_tail(failure.log, TRIAGE_TAIL) if failure.log else []
            records: List[triage.OomRecord] = []
            kills = 0
            if triage.signal_of(failure.returncode) == "SIGKILL":
                text = triage.kernel_log() or ""
                records = [r for r in triage.oom_records(text)
                           if r.uptime is None or self.uptime is None
                           or r.uptime >= self.uptime - 1]
                kills = (triage.oom_kill_count(self.cgroup) or 0) - self.oom_before
            found = triage.explain(failure.returncode, tail, pid=failure.pid, oom=records,
                                   cgroup_oom_kills=kills,
                                   cgroup_limit=triage.memory_limit(self.cgroup),
                                   rank=trainer_rank(failure.label))
            failure.explanation, failure.kind = found.text, found.kind
            if found.kind in (FailureKind.MISMATCH, FailureKind.DESYNC) and peer_logs:
                from fluidctl.diagnostics import gloo     # on a failure, not at every launch
                lines = tail + [line for log in peer_logs if log != failure.log
                                for line in log_tail(log, TRIAGE_TAIL)]
                if len(gloo.fingerprints(lines)) > len(gloo.fingerprints(tail)):
                    whole = gloo.classify_log(lines, trainer_rank(failure.label))
                    failure.explanation, failure.kind = whole.sentence, FailureKind(whole.kind)
        except Exception as exc:        # triage must never hide the failure itself
            failure.explanation = f"(triage failed: {exc})"


def trainer_rank(label: str) -> Optional[int]:
    """The rank in a trainer's label ("trainer 3": 3); None for other processes."""
    kind, _, number = label.partition(" ")
    return int(number) if kind == "trainer" and number.isdigit() else None


def write_failure_json(path: Path, exit_code: int, failure: Optional[Failure],
                       ends: Sequence[ProcessEnd], tail_lines: int,
                       hang: Optional[dict] = None) -> None:
    record = {"exit_code": exit_code,
              "first_failure": failure.to_record(tail_lines) if failure else None,
              "processes": [end_record(e) for e in ends], "hang": hang}
    write_atomic(path, json.dumps(record, indent=2) + "\n")


# --- stacks ----------------------------------------------------------------------------------

@dataclass
class Target:
    rank: int
    pid: int
    host: str
    label: str


@dataclass
class StackDump:
    texts: Dict[int, str] = field(default_factory=dict)        # rank -> full dump text
    frames: Dict[int, Optional[list]] = field(default_factory=dict)
    why: Dict[int, str] = field(default_factory=dict)          # rank -> why no stack
    method: Dict[int, str] = field(default_factory=dict)       # rank -> py-spy | faulthandler
    notes: List[str] = field(default_factory=list)             # e.g. "py-spy is not installed"
    state: Dict[int, str] = field(default_factory=dict)        # rank -> /proc state | exited
    cpu: Dict[int, float] = field(default_factory=dict)        # rank -> cores while taken
    count: Dict[int, int] = field(default_factory=dict)        # rank -> collectives completed
    running: Dict[int, float] = field(default_factory=dict)    # rank -> share of samples in R
    collectives: Dict[int, list] = field(default_factory=dict)  # rank -> torch's last records
    signalled: Dict[int, bool] = field(default_factory=dict)   # rank -> sent the stack signal

    EVIDENCE = ("state", "cpu", "count", "running", "collectives", "signalled")

    def merge(self, other: "StackDump") -> None:
        for name in ("texts", "frames", "why", "method") + self.EVIDENCE:
            getattr(self, name).update(getattr(other, name))
        self.notes += [n for n in other.notes if n not in self.notes]

    def to_json(self) -> dict:
        return {"texts": self.texts, "why": self.why, "method": self.method,
                "notes": self.notes, **{name: getattr(self, name) for name in self.EVIDENCE}}

    @classmethod
    def from_json(cls, data: dict) -> "StackDump":
        dump = cls(texts={int(k): v for k, v in data["texts"].items()},
                   why={int(k): v for k, v in data["why"].items()},
                   method={int(k): v for k, v in data["method"].items()},
                   notes=list(data["notes"]),
                   **{name: {int(k): v for k, v in data.get(name, {}).items()}
                      for name in cls.EVIDENCE})
        from fluidctl.diagnostics import stacks
        for rank, text in dump.texts.items():
            parse = (stacks.parse_pyspy if dump.method.get(rank) == "py-spy"
                     else stacks.parse_faulthandler)
            dump.frames[rank] = stacks.main_stack(parse(text))
        for rank in dump.why:
            dump.frames.setdefault(rank, None)
        return dump

    def summary(self) -> List[str]:
        from fluidctl.diagnostics import collective_records as records, stacks
        return stacks.summary(self.frames, self.why) + records.lines(self.collectives)

    def evidence(self, hosts: Optional[Dict[int, str]] = None) -> list:
        """Every rank's ``classify.Evidence``."""
        from fluidctl.diagnostics.classify import Evidence
        hosts = hosts or {}
        return [Evidence(rank, hosts.get(rank, ""), self.frames.get(rank), self.why.get(rank, ""),
                         self.state.get(rank, ""), self.cpu.get(rank), self.count.get(rank),
                         self.running.get(rank), bool(self.signalled.get(rank)))
                for rank in sorted(set(self.frames) | set(self.why))]

    def verdict(self, hosts: Optional[Dict[int, str]] = None):
        """The hang's class and sentence (``classify.Verdict``), or None."""
        from fluidctl.diagnostics.classify import Verdict, classify
        found = classify(self.evidence(hosts))
        if found is None:
            from fluidctl.diagnostics import collective_records as records
            said = records.verdict(self.collectives)    # torch's records alone (no py-spy)
            if said is not None:
                return Verdict(*said)
        return found


PYSPY_HINT = ("a rank that does not use fluidctl.runtime has a stack only with py-spy: "
              "pip install 'fluidctl[debug]'")
STACKS_DEADLINE = 30.0      # the most one round of stacks takes: late ranks are named instead
CPU_WINDOW = 0.5            # the least time over which a rank's CPU use is measured
STATE_SAMPLES = 10          # samples of each rank's process state over that time


def take_stacks(targets: Sequence[Target], diag: Optional[DiagDir],
                deadline: float = STACKS_DEADLINE) -> StackDump:
    """Every target's stack, in parallel: py-spy, else the faulthandler signal. A stopped
    rank is named at once, without asking it; one that has not answered after ``deadline``
    seconds is named as such, and the stacks that came are returned. (stacks and
    concurrent.futures are imported here, on a hang, not by every launch.)"""
    from concurrent.futures import ThreadPoolExecutor, wait
    from fluidctl.diagnostics import stacks
    dump = StackDump()

    def one(t: Target):
        halted = stacks.stopped(t.pid)
        if halted:
            return None, None, f"did not answer: {halted}"
        try:
            return "py-spy", stacks.pyspy_dump(t.pid), None
        except stacks.DumpUnavailable as exc:
            note = str(exc)
        if diag is None:
            return None, None, note
        def signalled():                    # the signal may wake it (a C sleep) and end it
            dump.signalled[t.rank] = True
        try:
            return "faulthandler", stacks.faulthandler_dump(t.pid, diag.stack(t.rank),
                                                            signalled=signalled), note
        except stacks.DumpUnavailable as exc:
            return None, None, f"{note}\n{exc}"        # said once / per rank, below

    if not targets:
        dump.notes.append("no rank of this job can be reached for its stack (the mpi and slurm "
                          "backends start their ranks themselves)")
        return dump
    asked = None
    if diag is not None:
        counts = progress.read_all(diag)
        dump.count.update({t.rank: counts[t.rank] for t in targets if t.rank in counts})
        from fluidctl.diagnostics import collective_records as records
        asked = records.request(diag)       # torch ranks answer while the stacks are taken
    before = {t.rank: stacks.proc_state(t.pid) for t in targets}
    started = time.monotonic()
    pool = ThreadPoolExecutor(min(8, len(targets)))
    try:
        futures = [pool.submit(one, t) for t in targets]
        wait(futures, timeout=deadline)
        for t, future in zip(targets, futures):
            if future.done():
                try:
                    method, text, note = future.result()
                except Exception as exc:        # one rank's trouble is not everyone's
                    method, text, note = None, None, f"{type(exc).__name__}: {exc}"
            else:
                method, text, note = None, None, f"did not answer within {deadline:g}s"
            if note and method and note not in dump.notes:
                dump.notes.append(note)
            if text is None:
                once, _, mine = (note or "no stack").rpartition("\n")
                if once and PYSPY_HINT not in dump.notes:
                    dump.notes.append(PYSPY_HINT)       # one install hint, not one per rank
                dump.why[t.rank], dump.frames[t.rank] = mine, None
                continue
            dump.texts[t.rank], dump.method[t.rank] = text, method
            parse = stacks.parse_pyspy if method == "py-spy" else stacks.parse_faulthandler
            dump.frames[t.rank] = stacks.main_stack(parse(text))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    # CPU use over the time the stacks took, and how often each rank was running or
    # runnable (state R: a busy rank on a crowded machine gets little CPU but is always R),
    # sampled over at least CPU_WINDOW: a measurement, not a wait for anything
    gap = max(0.02, (CPU_WINDOW - (time.monotonic() - started)) / STATE_SAMPLES)
    states: Dict[int, List[str]] = {t.rank: [] for t in targets}
    for _ in range(STATE_SAMPLES):
        for t in targets:
            now = stacks.proc_state(t.pid)
            if now is not None:
                states[t.rank].append(now[0])
        time.sleep(gap)
    elapsed = time.monotonic() - started
    for t in targets:
        first, now = before[t.rank], stacks.proc_state(t.pid)
        if first is not None and now is None and dump.signalled.get(t.rank) \
                and first[0] != "R":
            # our stack signal woke it (a sleep in C returns early) and it ended, with or
            # without its stack written: its state when the hang was found is the evidence,
            # not the exit the signal caused (a rank that was running ended by itself)
            dump.state[t.rank] = first[0]
            continue
        if first is None or now is None:
            dump.state[t.rank] = "exited"
            dump.why.setdefault(t.rank, f"pid {t.pid} has exited")
            continue
        dump.state[t.rank] = first[0] if first[0] in "TtZ" else now[0]
        dump.cpu[t.rank] = round(max(0.0, now[1] - first[1]) / elapsed, 2)
        seen = states[t.rank]
        dump.running[t.rank] = round(seen.count("R") / len(seen), 2) if seen else 0.0
    if asked is not None:
        from fluidctl.diagnostics import collective_records as records
        dump.collectives.update(records.collect(
            diag, [t.rank for t in targets], asked, _flight_recorded(diag, targets)))
    return dump


def _flight_recorded(diag: DiagDir, targets: Sequence[Target]) -> List[int]:
    """The live ranks whose step marks come from torch's Flight Recorder: they answer."""
    from fluidctl.diagnostics import stacks, stragglers
    pages = diag.read_ranks("steps", stragglers.SLOTS * 8)
    return [t.rank for t in targets if t.rank in pages and stacks.stopped(t.pid) is None
            and memoryview(pages[t.rank]).cast("q")[stragglers.SOURCE]
            == stragglers.FLIGHT_RECORDER]


def write_dump(root: Path, dump: StackDump, header: str, kind: str = "hang",
               hosts: Optional[Dict[int, str]] = None, first: Sequence[str] = ()) -> Path:
    """LOG_DIR/<kind>-<time>/: rank-N.txt (every thread's stack) and summary.txt; written to
    a temporary name and renamed into place."""
    final = hang_dir(root, time.time(), kind)
    n = 1
    while final.exists():
        n += 1
        final = final.with_name(final.name.split(".")[0] + f".{n}")
    tmp = final.with_name("." + final.name + ".tmp")
    tmp.mkdir(parents=True)
    for rank in sorted(set(dump.texts) | set(dump.why)):
        where = f" on {hosts[rank]}" if hosts and rank in hosts else ""
        body = dump.texts.get(rank) or f"no stack: {dump.why.get(rank)}\n"
        method = dump.method.get(rank, "-")
        (tmp / f"rank-{rank}.txt").write_text(f"# rank {rank}{where}, taken with {method}\n"
                                              + body)
    lines = ([header] + [f"  {l}" for l in first] + [f"  {l}" for l in dump.summary()]
             + [f"  note: {n}" for n in dump.notes])
    (tmp / "summary.txt").write_text("\n".join(lines) + "\n")
    os.replace(tmp, final)
    return final


# --- the hang watchdog -----------------------------------------------------------------------

class Watchdog(threading.Thread):
    """Calls ``on_hang()`` once when ``activity()`` returned the same value for ``timeout``
    seconds. ``activity`` is cheap: log sizes and progress counters."""

    def __init__(self, timeout: float, activity: Callable[[], Hashable],
                 on_hang: Callable[[], None]):
        super().__init__(name="fluidctl-hang-watchdog", daemon=True)
        self.timeout, self.activity, self.on_hang = timeout, activity, on_hang
        self.poll = min(1.0, max(0.05, timeout / 10))
        self._halt = threading.Event()   # not _stop: that is Thread._stop, which os.fork calls

    def run(self) -> None:
        try:
            last, since = self.activity(), time.monotonic()
            while not self._halt.wait(self.poll):
                now_seen = self.activity()
                now = time.monotonic()
                if now_seen != last:
                    last, since = now_seen, now
                elif now - since >= self.timeout:
                    self.on_hang()
                    return
        except Exception as exc:     # never a traceback from here: say it, in one line
            import sys
            print(f"fluidctl: the hang watchdog stopped: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    def stop(self) -> None:
        self._halt.set()
        getattr(self.activity, "stop", lambda: None)()     # local_activity's stack sampler


SAMPLE_EVERY = (1.0, 0.25)  # stack samples: at least every 1 s, at most a quarter timeout
SAMPLE_TIMEOUT = 5.0        # the most one py-spy sample may take
CPU_MOVED = 0.05            # a rank that used this share of a core since its last sample
                            # computes (a rank blocked in a collective uses ~0.01)


class StackSampler:
    """Progress of ranks that report none (no fluidctl.runtime, or not yet in ``init()``):
    a thread of its own takes, every ``every`` seconds, a py-spy sample of each such rank's
    main thread, without pausing it; a stack that changed is progress (a rank waiting in a
    collective or a data loader shows the same stack sample after sample), and so is CPU
    time used since the last sample (CPU_MOVED of a core): a healthy loop that spends most
    of its time in a collective may be sampled in it every time, but it computes between.
    (So a torch rank that computes forever while the others wait keeps such a job active:
    scripts on fluidctl.runtime have their counters for that.) The watchdog
    reads the latest samples and never waits for py-spy. Without py-spy (missing, off or
    refused) only the CPU time is sampled: a rank still importing torch on a crowded machine
    computes, and is no hang, with or without py-spy."""

    def __init__(self, targets: Callable[[], List[Target]], every: float):
        self.targets, self.every = targets, every
        self.seen: Hashable = ()
        self.counted: frozenset = frozenset()
        self._halt = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __call__(self, counted) -> Hashable:
        self.counted = frozenset(counted)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fluidctl-stack-samples",
                                            daemon=True)
            self._thread.start()
        return self.seen

    def stop(self) -> None:
        self._halt.set()

    def _run(self) -> None:
        from fluidctl.diagnostics import stacks
        cpu: Dict[int, Tuple[float, float]] = {}        # rank -> (when, CPU seconds) sampled
        n, pyspy = 0, True
        while not self._halt.is_set():
            seen, n = [], n + 1
            for t in self.targets():
                if t.rank in self.counted or self._halt.is_set():
                    continue
                state, now = stacks.proc_state(t.pid), time.monotonic()
                if state is not None:
                    was = cpu.get(t.rank)
                    cpu[t.rank] = (now, state[1])
                    if was and state[1] - was[1] >= CPU_MOVED * (now - was[0]):
                        seen.append((t.rank, n))       # it computes: progress, whatever
                        continue                       # its stack (a loop mostly in a wait)
                if not pyspy:
                    continue
                try:
                    text = stacks.pyspy_dump(t.pid, SAMPLE_TIMEOUT, nonblocking=True)
                except stacks.DumpUnavailable as exc:   # missing, off or refused: for good
                    pyspy = "took over" in str(exc) or "failed:" in str(exc)
                    continue
                frames = stacks.main_stack(stacks.parse_pyspy(text))
                seen.append((t.rank, tuple((f.func, f.file, f.line) for f in frames)))
            self.seen = tuple(seen)
            self._halt.wait(self.every)


def marked(diag: DiagDir) -> tuple:
    """The newest collective each torch or Paddle rank reached (its step marks: the Flight
    Recorder's number, or its backward calls): a script without fluidctl.runtime makes
    progress when these move, with or without py-spy's stack samples."""
    from fluidctl.diagnostics import stragglers
    return tuple(sorted((rank, s.count) for rank, s in stragglers.read_all(diag).items()
                        if s.source != stragglers.RUNTIME))


def local_activity(logs: Sequence[str], diag: DiagDir,
                   sampler: Optional[StackSampler] = None) -> Callable[[], Hashable]:
    def activity():
        sizes = []
        for log in logs:
            try:
                sizes.append(os.stat(log).st_size)
            except OSError:
                sizes.append(-1)
        counts = progress.read_all(diag)
        samples = sampler(counts) if sampler else ()
        return tuple(sizes), tuple(sorted(counts.items())), marked(diag), samples
    activity.stop = sampler.stop if sampler else (lambda: None)      # type: ignore[attr-defined]
    return activity


# --- one job's diagnostics -------------------------------------------------------------------

class Diagnostics:
    """What ``run_supervised`` needs for one job on one supervising process (the launcher, or
    a node agent): the node's diagnostics directory handed to the ranks, failure triage, the
    hang timeout and where hang/dump directories and failure.json go (``log_root``; None on a
    node agent, whose launcher writes them). Subclassed for agents-based backends, whose ranks'
    stacks and progress come from the nodes."""

    def __init__(self, *, hang_timeout: Optional[float] = None,
                 log_root: Optional[Path] = None, tail_lines: int = 20,
                 diag: Optional[DiagDir] = None):
        self.hang_timeout = hang_timeout
        self.log_root = log_root
        self.tail_lines = tail_lines
        self.diag = diag or DiagDir.create()
        self.triage = Triage()
        self.current: list = []         # a node agent: the handles of the running attempt

    @classmethod
    def for_job(cls, config, **kw) -> "Diagnostics":
        """This job's (a LaunchConfig): its --hang-timeout, LOG_DIR and --log-tail."""
        return cls(hang_timeout=config.hang_timeout, log_root=config.layout.root,
                   tail_lines=config.log_tail, **kw)

    def supervised_by(self, supervisor) -> None:
        """The supervisor of the job (agent-based backends hand it to their launcher)."""

    def env(self) -> Dict[str, str]:
        """What the ranks need to report here (their checkpoint requests' environment is
        ``launch/requests.py``'s)."""
        return self.diag.env()

    def targets(self, handles) -> List[Target]:
        return [Target(h.rank, h.pid, h.host, h.label) for h in handles
                if getattr(h, "rank", None) is not None and h.pid and h.poll() is None]

    def stacks(self, handles) -> StackDump:
        """Every live rank's stack; a rank whose process ended meanwhile is named as such
        (it may be the peer the others wait for)."""
        dump = take_stacks(self.targets(handles), self.diag)
        for h in handles:
            rank, code = getattr(h, "rank", None), h.poll() if h.pid else None
            if rank is not None and code is not None and rank not in dump.frames:
                dump.why[rank], dump.frames[rank] = f"exited with code {code}", None
                dump.state[rank] = "exited"
        return dump

    def hosts(self, handles) -> Dict[int, str]:
        return {h.rank: h.host for h in handles if getattr(h, "rank", None) is not None}

    def activity(self, logs: Sequence[str], handles=None) -> Callable[[], Hashable]:
        """What the hang watchdog compares: log sizes, progress counters, and (given the
        supervisor's ``handles`` callable) stack samples of the ranks without a counter."""
        sampler = None
        if handles is not None and self.hang_timeout:
            every = max(SAMPLE_EVERY[0], self.hang_timeout * SAMPLE_EVERY[1])
            sampler = StackSampler(lambda: self.targets(handles()), every)
        return local_activity(logs, self.diag, sampler)

    def watch_stragglers(self, handles: Callable[[], list], say: Callable[[str], None],
                         sink=None):
        """The thread that names stragglers while the job runs (``stragglerwatch.watch``:
        the ranks' pages, or the agents' ``steps`` lines), emitting to the job's telemetry
        ``sink``; None where this process writes no LOG_DIR reports (a node agent). Stopped
        with ``stop()``."""
        from fluidctl.diagnostics import stragglerwatch
        return stragglerwatch.watch(self, handles, say, sink)

    def step_samples(self) -> dict:
        """Every rank's straggler sums: here, this node's diagnostics directory's pages
        (subclasses whose ranks run elsewhere read them from there)."""
        from fluidctl.diagnostics import stragglers
        return stragglers.read_all(self.diag)

    def usage(self) -> dict:
        """rank -> CPU%, RSS of ranks on other nodes, as their agents report them (here:
        none; ``fluidctl top`` reads this host's ranks itself)."""
        return {}

    def progress(self) -> int:
        """Collectives completed by this node's ranks (the agent's heartbeat carries it)."""
        return sum(progress.read_all(self.diag).values())

    def ends(self, result) -> List[ProcessEnd]:
        """Every process's final state."""
        return list(result.ends)

    def close(self) -> None:
        self.diag.remove()


def write_job_state(root: Path) -> None:
    """LOG_DIR/job.json while the job runs: the launcher's pid and host, for ``fluidctl dump``
    (LOG_DIR may be on a file system other machines see: a pid means nothing there)."""
    from fluidctl.paths import LogLayout
    from fluidctl import envs
    state = {"pid": os.getpid(), "host": os.uname().nodename, "started": time.time()}
    if os.environ.get(envs.SLURM_JOB_ID):        # where `fluidctl dump` can reach it from
        state["slurm_job_id"] = os.environ[envs.SLURM_JOB_ID]
    write_atomic(LogLayout(root).job_state, json.dumps(state) + "\n")


def clear_job_state(root: Path) -> None:
    """Remove LOG_DIR/job.json at the job's end; what cannot be removed (it was never
    written, or something else is in its place) stays: the job's end is not its to decide."""
    from fluidctl.paths import LogLayout
    try:
        LogLayout(root).job_state.unlink()
    except OSError:
        pass
