"""What the supervisor needs from anything it watches: a local process, or a remote node's own
supervisor reached over SSH or mpirun.

A backend starts handles; it decides nothing about ranks or environment (the plan did that).
"""
from __future__ import annotations

from typing import Optional, Protocol

from fluidctl.failures import Failure


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
