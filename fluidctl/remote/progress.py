"""What a command working on many nodes at once shows while it works (cluster setup, check and
sync, shard-data --to-hosts): a long step is never silent, and a node that does not answer is
named while it is waited for, before its timeout.

On a terminal, when the work is bytes to copy, one rich bar per node whose text is the node's
last step; otherwise (a pipe, a file, or work that is not a copy) one plain stderr line per
node per step as it happens (``node1: connected (0.1 s)``), whole lines even from many threads.
Standard library only until a bar is drawn: ``cluster sync`` imports this on its start-up path
(``_thread``, not threading; no typing).
"""
from __future__ import annotations

import _thread
import sys
import time


class NodeProgress:
    """``say(host, text)`` reports a node's step; the first one marks the node as answered.
    Used as a context manager: with ``timeout``, every few seconds each node that has not
    answered yet is named (``waiting for node2 (4 s of 10 s)``); with ``totals``
    ({host: bytes}) on a terminal, a bar per node that ``advancer(host)`` moves."""

    def __init__(self, hosts, timeout=None, totals=None):
        self.started = time.monotonic()
        self.timeout = timeout
        self._lock = _thread.allocate_lock()
        self._silent = list(hosts)          # in hostfile order: not answered yet
        self._done = None                   # held while the watcher runs
        self.bar = None
        if totals is not None and sys.stderr.isatty():
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TransferSpeedColumn)
            from fluidctl.console import console
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), console=console(stderr=True),
                                transient=True)
            self._tasks = {name: self.bar.add_task(name, total=total or 1)
                           for name, total in totals.items()}

    def __call__(self, host: str, text: str) -> None:
        self.say(host, text)

    def say(self, host: str, text: str) -> None:
        self.answered(host)
        self._show(host, f"{host}: {text}")

    def answered(self, host: str, text: str = "") -> None:
        """The node answered (or failed): no longer waited for. Says nothing, for a command
        whose output is the nodes' own (``cluster exec``)."""
        with self._lock:
            if host in self._silent:
                self._silent.remove(host)

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f} s"

    def advancer(self, host: str):
        """A callable(bytes) that moves the node's bar (None off a terminal)."""
        if self.bar is None:
            return None
        return lambda n: self.bar.advance(self._tasks[host], n)

    def _show(self, host: str, line: str) -> None:
        if self.bar is not None:
            self.bar.update(self._tasks[host], description=line)
            return
        with self._lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def _watch(self) -> None:
        step = max(1.0, min(5.0, self.timeout / 4))
        while not self._done.acquire(timeout=step):
            with self._lock:
                silent = list(self._silent)
            waited = time.monotonic() - self.started
            for host in silent:
                self._show(host, f"waiting for {host} ({waited:.0f} s of {self.timeout:g} s)")
        self._done.release()

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        if self.timeout:
            self._done = _thread.allocate_lock()
            self._done.acquire()
            self._stopped = _thread.allocate_lock()
            self._stopped.acquire()

            def run():
                try:
                    self._watch()
                finally:
                    self._stopped.release()
            _thread.start_new_thread(run, ())
        return self

    def __exit__(self, *exc):
        if self._done is not None:
            self._done.release()            # wakes the watcher; wait until it has stopped
            self._stopped.acquire()
            self._done = None
        if self.bar is not None:
            self.bar.__exit__(*exc)
