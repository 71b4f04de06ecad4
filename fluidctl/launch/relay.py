"""A running job's ``save`` requests, passed on to the nodes that do not read the launcher's
request file.

``fluidctl job checkpoint LOG_DIR`` writes ``save`` into the job's request file
(launch/requests.py). The ranks on this machine read that file themselves; a node agent's ranks
read their own node's file (the launcher's may be on another machine), so while the job runs,
``RequestRelay`` looks at the file twice a second and hands each new ``save`` to the launcher's
``relay_checkpoint`` (the ssh launcher sends it to every agent). A ``stop`` takes the launcher's
own way: SIGUSR1, the checkpoint signal to every rank.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

EVERY = 0.5         # seconds between looks at the request file


class RequestRelay:
    """While entered: each new ``save`` in ``path`` goes to ``relay('save')``."""

    def __init__(self, path: "os.PathLike[str]", relay: Callable[[str], None],
                 every: float = EVERY):
        self.path, self.relay, self.every = os.fspath(path), relay, every
        self._done = threading.Event()
        self._seen = self._stamp()          # a request older than the run is not ours
        self._thread: Optional[threading.Thread] = None

    def _stamp(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def check(self) -> bool:
        """Relay a ``save`` written since the last look; True when one was relayed."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        self._seen = stamp
        try:
            with open(self.path, "rb") as f:
                word = f.read(16).split(None, 1)
        except OSError:
            return False
        if not word or word[0] != b"save":
            return False                    # the launcher's own stop: its signal carries it
        self.relay("save")
        return True

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            try:
                self.check()
            except Exception:               # noqa: BLE001 - a relay never stops the job
                pass

    def __enter__(self) -> "RequestRelay":
        self._thread = threading.Thread(target=self._loop, name="fluidctl-request-relay",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.every)
