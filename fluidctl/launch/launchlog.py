"""fluidctl's own log, launch.log: a module of its own (standard library only), since every
launch makes one first, before the supervisor's modules are needed."""
from __future__ import annotations

import threading
import time
from typing import List, Optional


class LaunchLog:
    """fluidctl's own log (launch.log): what it started, when, and how each attempt ended.
    Without a path yet, lines are kept until ``attach`` (the log dir is only created once the
    job really starts, never by a dry run or a refused job)."""

    def __init__(self, path: Optional[str] = None):
        self._file = None
        self._pending: List[str] = []
        self._lock = threading.Lock()
        if path:
            self.attach(path)

    def attach(self, path: str) -> None:
        with self._lock:
            self._file = open(path, "a", encoding="utf-8")
            self._file.writelines(self._pending)
            self._file.flush()
            self._pending = []

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n"
        with self._lock:
            if self._file:
                self._file.write(line)
                self._file.flush()
            else:
                self._pending.append(line)

    def close(self) -> None:
        with self._lock:
            if self._file:
                self._file.close()
                self._file = None
