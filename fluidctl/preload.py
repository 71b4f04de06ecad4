"""Modules imported on a thread while this process waits on the network.

A node agent waits for the launcher's plan after its probe; the SSH launcher waits for its
connections and the nodes' probes. Both then need modules (the supervisor, the diagnostics:
tens of milliseconds of imports) that would otherwise load after the wait, on the path to
every rank. Imports hold the GIL: the switch interval is shortened meanwhile, so that the
main thread's own answers (the rendezvous check) wait at most half a millisecond for it. A
module that fails to import here fails again, with its own traceback, where it is imported
for use.
"""
from __future__ import annotations

import sys
import threading
from typing import Sequence


class Preload:
    def __init__(self, modules: Sequence[str]):
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        self._thread = threading.Thread(target=self._load, args=(tuple(modules),),
                                        daemon=True, name="fluidctl-preload")
        self._thread.start()

    @staticmethod
    def _load(modules) -> None:
        import importlib
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:
                return

    def join(self) -> None:
        """Wait for the imports; the switch interval is the process's own again."""
        self._thread.join()
        sys.setswitchinterval(self._switch)
