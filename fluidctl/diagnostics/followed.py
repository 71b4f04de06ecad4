"""A submitted job's diagnostics, as the machine that submitted it and follows it sees them.

A Slurm batch job runs its own fluidctl inside its allocation: that launcher reads the ranks'
pages, names stragglers and writes LOG_DIR/slurm-JOBID/stragglers.log (and .json), and its
own console is the batch output file. The follower on the login node says each line it
appends there, as it arrived, so ``fluidctl train --backend slurm`` shows the same straggler
line whether it runs the job itself or follows a submitted one.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Callable, Optional

from fluidctl.diagnostics.watch import Diagnostics

POLL = 0.5              # seconds between looks at the job's stragglers.log
_STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (.*)$")


class LogRelay(threading.Thread):
    """Says every complete line appended to ``path()`` (None until the job has a directory;
    another path after a restart's new submission, read from its start), without the time
    stamp the log puts first. Opened anew at each look: on NFS only an ``open`` sees what
    another machine appended (close-to-open consistency)."""

    def __init__(self, path: Callable[[], Optional[Path]], say: Callable[[str], None],
                 poll: float = POLL):
        super().__init__(name="fluidctl-relay", daemon=True)
        self.path, self.say, self.poll = path, say, poll
        self._halt = threading.Event()
        self._where: Optional[Path] = None
        self._offset = 0
        self._lock = threading.Lock()

    def look(self) -> None:
        with self._lock:
            where = self.path()
            if where is None:
                return
            if where != self._where:
                self._where, self._offset = where, 0
            try:
                with open(where, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except OSError:
                return
            whole = data[:data.rfind(b"\n") + 1]
            self._offset += len(whole)
            for line in whole.decode("utf-8", "replace").splitlines():
                stamped = _STAMPED.match(line)
                self.say(stamped.group(1) if stamped else line)

    def run(self) -> None:
        try:
            while not self._halt.wait(self.poll):
                self.look()
        except Exception as exc:        # never a traceback from here
            import sys
            print(f"fluidctl: following the job's reports stopped: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr)

    def stop(self) -> None:
        """Stop, after a last look (a line the job wrote just before it ended is said)."""
        self._halt.set()
        try:
            self.look()
        except Exception:
            pass


class FollowedDiagnostics(Diagnostics):
    """The follower's: no ranks of its own (no LOG_DIR reports: the job writes them); its
    straggler report is the job's, relayed from ``job_root()`` (the job's own log directory,
    None until it is submitted)."""

    def __init__(self, job_root: Callable[[], Optional[Path]], **kw):
        super().__init__(log_root=None, **kw)
        self.job_root = job_root

    def watch_stragglers(self, handles, say: Callable[[str], None], sink=None) -> LogRelay:
        from fluidctl.paths import LogLayout

        def path() -> Optional[Path]:
            root = self.job_root()
            return None if root is None else LogLayout(root).stragglers_log
        relay = LogRelay(path, say)
        relay.start()
        return relay
