"""Running one task per shard on a thread per core, stopping the others at the first error or
Ctrl-C (the copies release the GIL, so threads are enough).

Plain ``_thread`` workers taking task indices in turn: concurrent.futures (with logging) and
threading (functools, collections) are start-up that a small shard-data run is spared."""
from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import Callable, List


class _Stopped(Exception):
    """Another worker failed: stop copying."""


class StopFlag:
    """Set by the first failure (or Ctrl-C); tasks poll ``is_set()`` between pieces of work
    (the one method of threading.Event they use)."""
    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def _parallel(fn: Callable[[int, StopFlag], object], count: int) -> list:
    """``fn(i, stop)`` for every i < count, one thread per core, results in order. The first
    error (or Ctrl-C in the main thread) sets ``stop`` for the others and is raised."""
    stop = StopFlag()
    results: List[object] = [None] * count
    errors: List[tuple] = []              # (index, exception): the lowest index is raised
    lock = _thread.allocate_lock()
    next_index = [0]
    workers = max(1, min(count, os.cpu_count() or 1))
    remaining = [workers]
    all_done = _thread.allocate_lock()    # held until the last worker ends
    all_done.acquire()

    def worker() -> None:
        try:
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= count or stop.is_set():
                    return
                try:
                    results[i] = fn(i, stop)
                except _Stopped:
                    return
                except BaseException as exc:      # noqa: B902 - handed to the main thread
                    stop.set()
                    with lock:
                        errors.append((i, exc))
                    return
        finally:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.release()

    for _ in range(workers):
        _thread.start_new_thread(worker, ())
    try:
        all_done.acquire()
    except BaseException:                     # Ctrl-C: stop the workers, wait for them
        stop.set()
        if remaining[0]:                      # else all_done was acquired before the signal
            all_done.acquire()
        raise
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return results
