"""What a running rank tells the launcher about itself, cheaply, through files in the job's
diagnostics directory (``FLUIDCTL_DIAG_DIR``, one per node, laid out by ``paths.DiagDir``):

- ``progress.<rank>``: an 8-byte counter the runtime bumps after every completed collective
  (a store into a shared memory page: ``mmap`` of a file in /dev/shm when it can); the hang
  watchdog reads all counters with one ``pread`` each;
- ``stack.<rank>``: where the rank's faulthandler writes every thread's stack when it gets
  ``DUMP_SIGNAL`` (registered by ``fluidctl.runtime.init()``): the fallback when py-spy cannot
  be used.

Standard library only, imported by the runtime (training processes) and by the launcher.
"""
from __future__ import annotations

import mmap
import os
import signal
import struct
from pathlib import Path
from typing import Dict, Mapping, Optional

from fluidctl.envs import DIAG_DIR as DIAG_DIR_ENV
from fluidctl.paths import DiagDir

DUMP_SIGNAL = signal.SIGUSR2
_COUNTER = struct.Struct("<Q")


class Reporter:
    """The rank's side: a counter in shared memory and the faulthandler dump signal."""

    def __init__(self, diag: DiagDir, rank: int):
        self.count = 0
        fd = os.open(diag.progress(rank), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _COUNTER.size)
            self._map = mmap.mmap(fd, _COUNTER.size)
        finally:
            os.close(fd)
        self._stack = open(diag.stack(rank), "ab", buffering=0)
        import faulthandler
        faulthandler.register(DUMP_SIGNAL, file=self._stack, all_threads=True, chain=False)
        # SA_RESTART (faulthandler sets it too; this keeps it so whatever installed it): a
        # read, write or wait the signal lands in resumes instead of failing with EINTR. A
        # few calls are never restarted by the kernel (sleep/nanosleep, poll, select,
        # epoll_wait: signal(7)); they return early, which is why the launcher treats a
        # hang it found as a hang, whatever a rank does after its stack was taken.
        signal.siginterrupt(DUMP_SIGNAL, False)

    def bump(self) -> None:
        self.count += 1
        _COUNTER.pack_into(self._map, 0, self.count)

    def close(self) -> None:
        import faulthandler
        faulthandler.unregister(DUMP_SIGNAL)
        self._map.close()
        self._stack.close()


_reporter: Optional[Reporter] = None


def start(rank: int, environ: Optional[Mapping[str, str]] = None) -> Optional[Reporter]:
    """Called by ``fluidctl.runtime.init()``: report progress when the launcher asked for it
    (FLUIDCTL_DIAG_DIR set); never fails the job over it."""
    global _reporter
    environ = os.environ if environ is None else environ
    root = environ.get(DIAG_DIR_ENV)
    if _reporter is None and root:
        try:
            _reporter = Reporter(DiagDir(Path(root)), rank)
        except (OSError, ValueError, RuntimeError):
            _reporter = None
    return _reporter


def bump() -> None:
    if _reporter is not None:
        _reporter.bump()


def read_all(diag: DiagDir) -> Dict[int, int]:
    """Every rank's counter on this node: {rank: completed collectives}."""
    counts = {}
    try:
        names = os.listdir(diag.root)
    except OSError:
        return counts
    for name in names:
        rank = diag.rank_of_progress(name)
        if rank is None:
            continue
        try:
            fd = os.open(diag.root / name, os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.pread(fd, _COUNTER.size, 0)
        finally:
            os.close(fd)
        if len(data) == _COUNTER.size:
            counts[rank] = _COUNTER.unpack(data)[0]
    return counts
