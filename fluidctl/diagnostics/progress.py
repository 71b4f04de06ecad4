"""What a running rank tells the launcher about itself, cheaply, through files in the job's
diagnostics directory (``FLUIDCTL_DIAG_DIR``, one per node, laid out by ``paths.DiagDir``):

- ``progress.<rank>``: an 8-byte counter the runtime bumps after every completed collective
  (a store into a shared memory page: ``mmap`` of a file in /dev/shm when it can; on a
  network file system a copy written every half second, ``pages``); the hang watchdog reads
  all counters with one ``pread`` each;
- ``stack.<rank>``: where the rank's faulthandler writes every thread's stack when it gets
  ``DUMP_SIGNAL`` (registered by ``fluidctl.runtime.init()``): the fallback when py-spy cannot
  be used.

Standard library only, imported by the runtime (training processes) and by the launcher.
"""
from __future__ import annotations

import itertools
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


def map_shared(path: Path, size: int) -> mmap.mmap:
    """``size`` bytes of the file at ``path`` (made, zero-filled) that the launcher reads:
    mapped shared, or on a network file system a copy published every half second
    (``fluidctl.diagnostics.pages``)."""
    from fluidctl.diagnostics import pages
    return pages.map_shared(path, size)


def diag_of(environ: Optional[Mapping[str, str]]) -> Optional[DiagDir]:
    """The diagnostics directory the launcher gave the rank (FLUIDCTL_DIAG_DIR), if any."""
    root = (os.environ if environ is None else environ).get(DIAG_DIR_ENV)
    return DiagDir(Path(root)) if root else None


class Reporter:
    """The rank's side: a counter in shared memory and the faulthandler dump signal."""

    def __init__(self, diag: DiagDir, rank: int):
        self.count = 0
        self._ticks = itertools.count(1)
        self._map = map_shared(diag.progress(rank), _COUNTER.size)
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
        # next() on a count is atomic: the GPU watchdog thread bumps beside the main thread
        self.count = count = next(self._ticks)
        _COUNTER.pack_into(self._map, 0, count)

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
    diag = diag_of(environ)
    if _reporter is None and diag is not None:
        try:
            _reporter = Reporter(diag, rank)
        except (OSError, ValueError, RuntimeError):
            _reporter = None
    return _reporter


def bump() -> None:
    if _reporter is not None:
        _reporter.bump()


def read_all(diag: DiagDir) -> Dict[int, int]:
    """Every rank's counter on this node: {rank: completed collectives}."""
    return {rank: _COUNTER.unpack(data)[0]
            for rank, data in diag.read_ranks("progress", _COUNTER.size).items()}
