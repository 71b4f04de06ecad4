"""How a process ended, described for people: below the supervisor (which records failures)
and the console (which prints them), so neither imports the other.

``Failure`` is one process that did not succeed; ``describe_exit`` turns a Popen-style return
code into words; ``log_tail`` reads the end of a log for the report.
"""
from __future__ import annotations

import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional


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


def shell_exit_code(returncode: int) -> int:
    """What a shell reports: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


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
    kind: str = ""              # triage: oom | nccl | exception | signal | exit | hang
    started: Optional[float] = None     # when the job (attempt) started, for "N s after start"
    tail: List[str] = field(default_factory=list)   # log lines when the log is not here
    others: List[dict] = field(default_factory=list)    # every other process: label, host, state

    @property
    def exit_code(self) -> int:
        return shell_exit_code(self.returncode)

    @property
    def reason(self) -> str:
        return self.detail or describe_exit(self.returncode)


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
