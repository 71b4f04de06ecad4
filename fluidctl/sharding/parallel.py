"""Running one task per shard on a thread per core, stopping the others at the first error or
Ctrl-C (the copies release the GIL, so threads are enough)."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


class _Stopped(Exception):
    """Another worker failed: stop copying."""


def _parallel(fn: Callable[[int, threading.Event], object], count: int) -> list:
    """``fn(i, stop)`` for every i < count, one thread per core, results in order. The first
    error (or Ctrl-C in the main thread) sets ``stop`` for the others and is raised."""
    stop = threading.Event()

    def guarded(i: int):
        if stop.is_set():
            raise _Stopped()
        try:
            return fn(i, stop)
        except BaseException:
            stop.set()
            raise

    pool = ThreadPoolExecutor(max(1, min(count, os.cpu_count() or 1)),
                              thread_name_prefix="shard-data")
    results, errors = [], []
    try:
        for future in [pool.submit(guarded, i) for i in range(count)]:
            try:
                results.append(future.result())
            except _Stopped:
                pass
            except Exception as exc:      # the first one is raised below
                errors.append(exc)
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        raise errors[0]
    return results
