"""How a process ended, described for people: below the supervisor (which records failures)
and the console (which prints them), so neither imports the other.

``Failure`` is one process that did not succeed (``to_record``/``from_record``: the record an
agent sends and failure.json holds); ``describe_exit`` turns a Popen-style return code into
words, ``describe_end`` a process's final state (``ProcessEnd``); ``log_tail`` reads the end of a
log for the report.
"""
from __future__ import annotations

import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from fluidctl.agentproto import EndState, ProcessEnd, RecordError


def describe_exit(returncode: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a Popen-style return code."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    if returncode > 128:
        try:
            return f"exit code {returncode} ({signal.Signals(returncode - 128).name})"
        except ValueError:
            pass
    return f"exit code {returncode}"


def signal_of(returncode: int) -> Optional[str]:
    """The signal's name for a Popen-style return code (negative) or a shell's 128+N."""
    number = -returncode if returncode < 0 else (returncode - 128 if 128 < returncode < 160
                                                   else 0)
    if not number:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_end(end: ProcessEnd) -> str:
    """A process's final state in the words of the report and failure.json."""
    if end.state is EndState.FINISHED:
        return "finished"
    if end.state is EndState.FAILED:
        return f"failed: {describe_exit(end.returncode)}"
    return "still running; stopped by fluidctl" + (
        f" ({describe_exit(end.returncode)})" if end.returncode is not None else "")


def end_record(end: ProcessEnd) -> dict:
    """A process of failure.json's "processes": label, host, pid and the state in words."""
    return {"label": end.label, "host": end.host, "pid": end.pid, "state": describe_end(end)}


def shell_exit_code(returncode: int) -> int:
    """What a shell reports: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class FailureKind(str, Enum):
    """What kind of failure triage found (a str, so records and comparisons read plainly)."""
    NONE = ""                   # not explained (yet)
    OOM = "oom"
    NCCL = "nccl"
    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"
    HANG = "hang"
    IDLE = "idle"               # every rank waits outside any collective (a lock, a service)
    DESYNC = "desync"           # ranks in different collectives (the runtime's agreement)
    MISMATCH = "mismatch"       # shapes, dtypes, ops or roots differ in one collective
    FROZEN = "frozen node"      # a node's SSH connection died; its link is up, nothing answers
    PARTITION = "partition"     # a node's SSH connection died and a new one is not accepted
    SSHD_GONE = "sshd gone"     # ... and a new one is refused: the node is up, sshd is not
    REFUSED = "refused"         # Slurm refused to start the step
    CANCELLED = "cancelled"     # cancelled from outside (scancel): never restarted

    def __str__(self) -> str:
        return self.value


@dataclass
class Failure:
    """One process that did not succeed: enough to print a useful report."""
    label: str                  # "trainer 1", "pserver 0"
    host: str
    returncode: int             # Popen-style: negative for a signal
    log: str
    pid: Optional[int] = None
    when: float = field(default_factory=time.time)
    detail: str = ""            # e.g. "SSH connection lost"
    explanation: str = ""       # triage: why, in words (fluidctl/diagnostics/triage.py)
    kind: FailureKind = FailureKind.NONE        # triage's class of failure
    started: Optional[float] = None     # when the job (attempt) started, for "N s after start"
    tail: List[str] = field(default_factory=list)   # log lines when the log is not here
    others: List[ProcessEnd] = field(default_factory=list)     # every other process's end

    @property
    def exit_code(self) -> int:
        return shell_exit_code(self.returncode)

    @property
    def reason(self) -> str:
        return self.detail or describe_exit(self.returncode)

    def to_record(self, tail_lines: int = 0) -> dict:
        """The record a node agent sends and failure.json's "first_failure" holds, with
        ``tail_lines`` lines of the log (or of ``tail`` when the log is not here)."""
        since = self.when - self.started if self.started else None
        return {"label": self.label, "host": self.host, "pid": self.pid,
                "returncode": self.returncode, "exit_code": self.exit_code,
                "signal": signal_of(self.returncode) if self.returncode < 0 else None,
                "reason": self.reason, "kind": FailureKind(self.kind).value,
                "explanation": self.explanation, "when": self.when,
                "seconds_since_start": round(since, 3) if since else None,
                "log": self.log,
                "log_tail": log_tail(self.log, tail_lines) if self.log else list(self.tail)}

    @classmethod
    def from_record(cls, record) -> "Failure":
        """The Failure ``to_record`` wrote (``RecordError`` for anything else): ``detail`` is
        the reason where it is not the exit's own words, ``started`` comes back from the
        seconds since start."""
        if not isinstance(record, dict):
            raise RecordError(f"the failure record is {type(record).__name__}, not an object")
        try:
            returncode, when = int(record["returncode"]), float(record["when"])
            kind = FailureKind(record.get("kind") or "")
            since = record.get("seconds_since_start")
            pid = record.get("pid")
            if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
                raise TypeError(f"pid {pid!r}")
            reason = str(record.get("reason") or "")
            return cls(str(record["label"]), str(record["host"]), returncode,
                       str(record.get("log") or ""), pid, when,
                       "" if reason == describe_exit(returncode) else reason,
                       str(record.get("explanation") or ""), kind,
                       when - float(since) if since else None,
                       [str(line) for line in record.get("log_tail") or []])
        except KeyError as exc:
            raise RecordError(f"the failure record has no {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise RecordError(f"the failure record is malformed ({exc})") from None


def log_tail(path: str, lines: int) -> List[str]:
    """The last ``lines`` lines of a log file (reading only its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    return list(deque((l for l in text.splitlines() if l.strip()), maxlen=lines))
