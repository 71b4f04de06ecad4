"""No process outlives whoever started it: the Linux parent-death signal, set in the child.

``set_pdeathsig(signal.SIGTERM, parent)`` asks the kernel to send the signal when the thread
that forked us dies, then checks that ``parent`` is still our parent (it may have died between
the fork and the prctl, in which case we were already re-parented and the signal will never
come): the caller exits at once then. Used in ``preexec_fn`` of every worker and pserver the
launcher or a node agent starts, and by pservers themselves as a second line (they also poll
``os.getppid()`` each second: the watchdog for whatever re-parents). Light: ctypes only.
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Optional

PR_SET_PDEATHSIG = 1
_libc = None


def _prctl(option: int, arg: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_pdeathsig(signum: int = signal.SIGTERM, parent: Optional[int] = None) -> bool:
    """Ask for ``signum`` when our parent dies; False if ``parent`` is already gone (the
    caller should then stop: nobody is left to stop it)."""
    _prctl(PR_SET_PDEATHSIG, int(signum))
    return parent is None or os.getppid() == parent


def preexec(signum: int = signal.SIGTERM):
    """A ``preexec_fn`` for subprocess.Popen: the child gets ``signum`` when this process
    dies, and exits before exec if this process died already."""
    parent = os.getpid()

    def child() -> None:
        if not set_pdeathsig(signum, parent):
            os._exit(1)
    return child
