"""What the supervisor needs from anything it watches: a local process, or a remote node's own
supervisor reached over SSH or mpirun.

A backend starts handles; it decides nothing about ranks or environment (the plan did that).
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol


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

    @property
    def exit_code(self) -> int:
        return shell_exit_code(self.returncode)

    @property
    def reason(self) -> str:
        return self.detail or describe_exit(self.returncode)


class Handle(Protocol):
    label: str
    host: str
    log: str
    pid: Optional[int]
    service: bool       # a pserver: serves the trainers; its end (even exit 0) fails the job

    def fileno(self) -> int:
        """A descriptor that becomes readable when the handle may have ended."""

    def poll(self) -> Optional[int]:
        """The Popen-style return code once ended, else None (reaps)."""

    def terminate(self) -> None:
        """Ask the whole process tree to stop (SIGTERM)."""

    def kill(self) -> None:
        """Stop the whole process tree now (SIGKILL)."""

    def failure(self) -> Failure:
        """Details of a non-zero end (call after poll() returned non-zero)."""

    def close(self) -> None:
        """Release descriptors once ended."""
