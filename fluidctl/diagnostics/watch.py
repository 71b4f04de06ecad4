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
from typing import Callable, Dict, Hashable, List, Optional, Sequence

from fluidctl.diagnostics import progress, triage
from fluidctl.agentproto import ProcessEnd
from fluidctl.diagnostics.failures import Failure, end_record, log_tail
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

    def explain(self, failure: Failure) -> None:
        """Fill in ``failure.explanation``/``kind``/``started`` (best effort, never raises).
        A failure explained already (by the node agent that saw it) or with a detail of its
        own (a lost connection) keeps what it has: this machine's kernel log says nothing
        about another node."""
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
                                   cgroup_limit=triage.memory_limit(self.cgroup))
            failure.explanation, failure.kind = found.text, found.kind
        except Exception as exc:        # triage must never hide the failure itself
            failure.explanation = f"(triage failed: {exc})"


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

    def merge(self, other: "StackDump") -> None:
        for name in ("texts", "frames", "why", "method"):
            getattr(self, name).update(getattr(other, name))
        self.notes += [n for n in other.notes if n not in self.notes]

    def to_json(self) -> dict:
        return {"texts": self.texts, "why": self.why, "method": self.method,
                "notes": self.notes}

    @classmethod
    def from_json(cls, data: dict) -> "StackDump":
        dump = cls(texts={int(k): v for k, v in data["texts"].items()},
                   why={int(k): v for k, v in data["why"].items()},
                   method={int(k): v for k, v in data["method"].items()},
                   notes=list(data["notes"]))
        from fluidctl.diagnostics import stacks
        for rank, text in dump.texts.items():
            parse = (stacks.parse_pyspy if dump.method.get(rank) == "py-spy"
                     else stacks.parse_faulthandler)
            dump.frames[rank] = stacks.main_stack(parse(text))
        for rank in dump.why:
            dump.frames.setdefault(rank, None)
        return dump

    def summary(self) -> List[str]:
        from fluidctl.diagnostics import stacks
        return stacks.summary(self.frames, self.why)


STACKS_DEADLINE = 30.0      # the most one round of stacks takes: late ranks are named instead


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
        try:
            return "faulthandler", stacks.faulthandler_dump(t.pid, diag.stack(t.rank)), note
        except stacks.DumpUnavailable as exc:
            return None, None, f"{note}; faulthandler: {exc}"

    if not targets:
        dump.notes.append("no rank of this job can be reached for its stack (the mpi and slurm "
                          "backends start their ranks themselves)")
        return dump
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
                dump.why[t.rank], dump.frames[t.rank] = note or "no stack", None
                continue
            dump.texts[t.rank], dump.method[t.rank] = text, method
            parse = stacks.parse_pyspy if method == "py-spy" else stacks.parse_faulthandler
            dump.frames[t.rank] = stacks.main_stack(parse(text))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return dump


def write_dump(root: Path, dump: StackDump, header: str, kind: str = "hang",
               hosts: Optional[Dict[int, str]] = None) -> Path:
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
    lines = [header] + [f"  {l}" for l in dump.summary()] + [f"  note: {n}" for n in dump.notes]
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


def local_activity(logs: Sequence[str], diag: DiagDir) -> Callable[[], Hashable]:
    def activity():
        sizes = []
        for log in logs:
            try:
                sizes.append(os.stat(log).st_size)
            except OSError:
                sizes.append(-1)
        return tuple(sizes), tuple(sorted(progress.read_all(diag).items()))
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
        self.checkpoint_signal = "TERM"     # what the ranks trap as a checkpoint request
        self.current: list = []         # a node agent: the handles of the running attempt

    @classmethod
    def for_job(cls, config, **kw) -> "Diagnostics":
        """This job's (a LaunchConfig): its --hang-timeout, LOG_DIR and --log-tail."""
        made = cls(hang_timeout=config.hang_timeout, log_root=config.layout.root,
                   tail_lines=config.log_tail, **kw)
        made.checkpoint_signal = config.checkpoint_signal
        return made

    def env(self) -> Dict[str, str]:
        from fluidctl import envs
        env = {envs.DIAG_DIR: str(self.diag.root)}
        if self.log_root is not None:       # the launcher's own ranks: its requests reach them
            from fluidctl.paths import LogLayout
            layout = LogLayout(Path(self.log_root).resolve())
            env[envs.CHECKPOINT_REQUEST] = str(layout.checkpoint_request)
            env[envs.CHECKPOINT_STATE] = str(layout.checkpoint_state)
            env[envs.CHECKPOINT_SIGNAL] = self.checkpoint_signal
        return env

    def targets(self, handles) -> List[Target]:
        return [Target(h.rank, h.pid, h.host, h.label) for h in handles
                if getattr(h, "rank", None) is not None and h.pid and h.poll() is None]

    def stacks(self, handles) -> StackDump:
        return take_stacks(self.targets(handles), self.diag)

    def hosts(self, handles) -> Dict[int, str]:
        return {t.rank: t.host for t in self.targets(handles)}

    def activity(self, logs: Sequence[str]) -> Callable[[], Hashable]:
        return local_activity(logs, self.diag)

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
    from fluidctl.paths import LogLayout
    try:
        LogLayout(root).job_state.unlink()
    except FileNotFoundError:
        pass
