"""Checkpoint requests that every rank honours at the same step: ``ctx.checkpoint_requested()``.

A request reaches the ranks two ways, and either is enough:

* the request file (FLUIDCTL_CHECKPOINT_REQUEST, ``paths.LogLayout.checkpoint_request``), which
  the launcher creates on SIGTERM, SIGUSR1, Slurm's warning signal or a near time limit, and
  ``fluidctl job checkpoint`` creates for a running job; its first word is ``stop`` (checkpoint,
  then end the job so that it is requeued) or ``save`` (checkpoint and go on);
* a signal trapped here: the one the launcher forwards (FLUIDCTL_CHECKPOINT_SIGNAL, SIGTERM by
  default) and SIGUSR1 (``scancel --signal=USR1`` reaches the ranks straight from Slurm).

Ranks see a request at different moments, so each keeps only a local flag; they *agree* on it
with a two-number max-allreduce (the flag, and the time since the last agreement) at call
numbers all ranks know in advance: every call at first, then every K calls, K chosen from the
agreed time so that agreements are about ``AGREE_PERIOD`` apart. Every rank computes the same K
from the same reduced numbers, so all of them reduce at the same calls and all return True at
the same one. Between agreements a call is one integer comparison; the file is stat'ed only
at agreements. The agreement is a collective, so every rank must call
``checkpoint_requested`` the same number of times (once per step).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Mapping, Optional

from fluidctl import envs
from fluidctl.sigs import by_name

NONE, SAVE, STOP = 0, 1, 2
AGREE_PERIOD = 0.05           # seconds between agreements, once the step time is known
MAX_EVERY = 1 << 20


def read_kind(path: str) -> int:
    """The kind of request a request file holds (a file that vanished meanwhile: none)."""
    try:
        with open(path, "rb") as f:
            word = f.read(16).split(None, 1)
    except OSError:
        return NONE
    return SAVE if word and word[0] == b"save" else STOP


class Requests:
    """One rank's view of checkpoint requests, and the agreement between ranks."""

    def __init__(self, comm, world_size: int, environ: Optional[Mapping[str, str]] = None):
        environ = os.environ if environ is None else environ
        self.comm, self.world_size = comm, world_size
        self.path = environ.get(envs.CHECKPOINT_REQUEST) or None
        self.signals = {signal.SIGUSR1}
        try:
            self.signals.add(by_name(environ.get(envs.CHECKPOINT_SIGNAL) or "TERM"))
        except ValueError:
            self.signals.add(signal.SIGTERM)
        self.local = NONE             # set by the signal handler
        self.calls = 0
        self.every = 1
        self.next_agreement = 1
        self.last = time.monotonic_ns()
        # a ``save`` in a request file counts on rank 0 only: each node has its own copy of
        # the file (relayed), and a node whose copy came after the agreement would start a
        # second save; a ``stop`` (or a signal) counts on every rank
        self.rank = getattr(comm, "rank", 0) if comm is not None else 0
        self.seen = None              # the request file last honoured (the launcher removes
                                      # an earlier attempt's before it starts the ranks)
        self.kind = NONE              # the last agreed request
        self.step: Optional[int] = None       # the call number it was agreed at
        self.installed = False
        self._buf = None

    # --- local sources --------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        self.local = STOP

    def install(self, which=None) -> None:
        """Trap the request signals (main thread only; elsewhere the file still works)."""
        for sig in (self.signals if which is None else which):
            try:
                signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                return
        if which is None:
            self.installed = True

    def _file_key(self):
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _file_kind(self) -> int:
        key = self._file_key()
        if key is None or key == self.seen:
            return NONE
        kind = read_kind(self.path)
        return NONE if kind == SAVE and self.rank != 0 else kind

    # --- the agreement --------------------------------------------------------------------
    def poll(self) -> bool:
        """True on every rank at the same call when some rank saw a request."""
        self.calls += 1
        if self.calls < self.next_agreement:
            return False
        return self._agree()

    def _agree(self) -> bool:
        if not self.installed:
            self.install()
        now = time.monotonic_ns()
        kind = max(self.local, self._file_kind())
        elapsed = now - self.last
        if self.world_size > 1 and self.comm is not None:
            if self._buf is None:
                import numpy
                self._buf = numpy.zeros(2, dtype=numpy.int64)
            self._buf[0], self._buf[1] = kind, elapsed
            self.comm.allreduce(self._buf, "max")
            kind, elapsed = int(self._buf[0]), int(self._buf[1])
        self.last = time.monotonic_ns()
        # the same numbers on every rank, so the same next agreement
        wanted = int(self.every * AGREE_PERIOD * 1e9 / max(elapsed, 1))
        self.every = max(1, min(wanted, self.every * 2, MAX_EVERY))
        self.next_agreement = self.calls + self.every
        if kind == NONE:
            return False
        self.kind, self.step, self.local = kind, self.calls, NONE
        self.seen = self._file_key()
        if kind == STOP:
            # the job ends after this checkpoint: the launcher's signal may still be on its
            # way (the file was seen first) and must not kill the exit; a second request goes
            # to the launcher, which kills at once
            for sig in self.signals:
                try:
                    signal.signal(sig, signal.SIG_IGN)
                except (ValueError, OSError):
                    break
        return True
