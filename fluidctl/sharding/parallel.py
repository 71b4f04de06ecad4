"""Running one task per shard on a thread per core, stopping the others at the first error or
Ctrl-C (the copies release the GIL, so threads are enough).

Plain threads taking shard indices in turn, not concurrent.futures: its import (with logging)
is a fifth of a small shard-data run's start-up."""
from __future__ import annotations

import os
import threading
from typing import Callable, List


class _Stopped(Exception):
    """Another worker failed: stop copying."""


def _parallel(fn: Callable[[int, threading.Event], object], count: int) -> list:
    """``fn(i, stop)`` for every i < count, one thread per core, results in order. The first
    error (or Ctrl-C in the main thread) sets ``stop`` for the others and is raised."""
    stop = threading.Event()
    results: List[object] = [None] * count
    errors: List[tuple] = []              # (index, exception): the lowest index is raised
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
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

    threads = [threading.Thread(target=worker, name=f"shard-data-{k}", daemon=True)
               for k in range(max(1, min(count, os.cpu_count() or 1)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:                     # Ctrl-C: stop the workers, wait for them
        stop.set()
        for thread in threads:
            thread.join()
        raise
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return results
