"""The launcher's half of checkpoint requests (the ranks' half is runtime/request.py).

A request is the file ``LogLayout.checkpoint_request`` (FLUIDCTL_CHECKPOINT_REQUEST in every
rank's environment), whose first word is ``stop`` (checkpoint, then end so that the job is
requeued or restarted and resumes) or ``save`` (checkpoint and go on). The supervisor writes
it on SIGTERM, SIGUSR1 (Slurm's warning signal, ``scancel --batch --signal=USR1``) or when the
time limit is near, before it forwards the checkpoint signal to the ranks; ``fluidctl job
checkpoint`` writes it for a running Slurm job. Each attempt starts without one.

After the ranks saved on a ``stop`` request and exited 0, the launcher exits REQUEUE_EXIT
(EX_TEMPFAIL, 75): the batch script then runs ``scontrol requeue``, and a person or a wrapper
knows that running the job again resumes it.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from fluidctl import envs, paths
from fluidctl.errors import REQUEUE_EXIT
from fluidctl.sigs import by_name

__all__ = ["REQUEUE_EXIT", "RequestChannel", "ask", "last_commit", "rank_env"]
STOP, SAVE = "stop", "save"
COMMIT_POLL = 1.0       # seconds between looks at the commit record (one stat each)


def ask(layout: paths.LogLayout, kind: str, why: str) -> Path:
    """Write the request file of the job whose log dir is ``layout``."""
    path = layout.checkpoint_request
    paths.write_atomic(path, f"{kind} {why} {time.time():.3f}\n", 0o644)
    return path


def rank_env(request: Path, state: Path, signal_name: str) -> Dict[str, str]:
    """What a rank needs to answer requests: the request file it reads, where rank 0 records
    a commit, the signal it traps. The one place this environment is made: the launcher's
    own ranks get their ``RequestChannel``'s, a node agent's ranks their node's file."""
    return {envs.CHECKPOINT_REQUEST: str(request), envs.CHECKPOINT_STATE: str(state),
            envs.CHECKPOINT_SIGNAL: signal_name}


def last_commit(layout: paths.LogLayout) -> Optional[dict]:
    """The job's last committed checkpoint as rank 0 recorded it (step, dir, time, stop)."""
    try:
        record = json.loads(layout.checkpoint_state.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def mark_requeue(why: str) -> None:
    """Leave the batch script's requeue file (FLUIDCTL_REQUEUE_FILE, when fluidctl's own batch
    script runs us): this launcher stopped the job on a checkpoint request. A rank's own exit
    75 (EX_TEMPFAIL, which tools return) is a failure and leaves none: no endless requeue."""
    path = os.environ.get(envs.REQUEUE_FILE)
    if path:
        try:
            paths.write_atomic(Path(path), f"checkpointed on request: {why}\n", 0o644)
        except OSError:
            pass            # the script then ends the job with 75 instead of requeueing it


class RequestChannel:
    """One job's requests, as its launcher sees them."""

    def __init__(self, log_root: Path, signal_name: str = "TERM"):
        self.layout = paths.LogLayout(Path(log_root))
        self.signal = by_name(signal_name)
        self.signal_name = signal_name
        self.since = time.time()
        self.asked = ""

    def rank_env(self) -> Dict[str, str]:
        """The environment of the ranks this launcher starts itself."""
        return rank_env(self.layout.checkpoint_request, self.layout.checkpoint_state,
                        self.signal_name)

    def clear(self) -> None:
        """A new attempt: no request yet, and an earlier commit no longer counts as this
        attempt's stop."""
        try:
            os.unlink(self.layout.checkpoint_request)
        except FileNotFoundError:
            pass
        self.since, self.asked = time.time(), ""

    def ask(self, why: str, kind: str = STOP) -> None:
        self.asked = why
        try:
            ask(self.layout, kind, why)
        except OSError:
            pass            # the forwarded signal still reaches the ranks

    def watch_commits(self, emit: Callable[[object], None],
                      every: float = COMMIT_POLL) -> "CommitWatch":
        """Each checkpoint rank 0 commits from now on, as a telemetry ``CheckpointCommit``."""
        watch = CommitWatch(self.layout, emit, every)
        watch.start()
        return watch

    def stopped(self) -> Optional[dict]:
        """The commit the ranks made before stopping on a request in this attempt, if any."""
        record = last_commit(self.layout)
        if record and record.get("stop") and float(record.get("time", 0)) >= self.since:
            return record
        return None


class CommitWatch(threading.Thread):
    """Emits ``CheckpointCommit`` for every new record rank 0 writes at
    ``LogLayout.checkpoint_state`` (the ranks write it anyway: nothing new for them); a last
    look when stopped, so a commit made just before the job ended is told too."""

    def __init__(self, layout: paths.LogLayout, emit: Callable[[object], None], every: float):
        super().__init__(name="fluidctl-commits", daemon=True)
        self.layout, self.emit, self.every = layout, emit, every
        self.since = time.time()
        self._seen = self._stamp()
        self._told: Optional[tuple] = None
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _stamp(self):
        try:
            st = os.stat(self.layout.checkpoint_state)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def look(self) -> None:
        with self._lock:
            stamp = self._stamp()
            if stamp is None or stamp == self._seen:
                return
            record = last_commit(self.layout)
            if not record:                  # caught half-written: the next look reads it
                return
            self._seen = stamp
            try:
                key = (float(record.get("time", 0)), int(record.get("step", -1)))
            except (TypeError, ValueError):
                return
            if key == self._told or key[0] < self.since - 1.0:     # an earlier job's
                return
            self._told = key
            from fluidctl.telemetry import CheckpointCommit
            try:
                seconds = float(record.get("seconds", 0.0))
            except (TypeError, ValueError):
                seconds = 0.0
            self.emit(CheckpointCommit(step=key[1], dir=str(record.get("dir", "")),
                                       committed=key[0], seconds=seconds,
                                       stop=bool(record.get("stop"))))

    def run(self) -> None:
        while not self._halt.wait(self.every):
            try:
                self.look()
            except Exception:       # noqa: BLE001 - never a traceback from here
                pass

    def stop(self) -> None:
        self._halt.set()
        try:
            self.look()
        except Exception:           # noqa: BLE001
            pass
