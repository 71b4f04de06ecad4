"""State of the CuPy/NCCL double that real CuPy keeps in the driver: device memory (host memory
here, registered by address so NCCL calls can be checked and served by pointer), the current
device and stream per thread, streams that run queued work in order, and the bookkeeping the
tests read (host waits). Nothing in fluidctl may import this module (a contract test checks)."""
import bisect
import os
import queue
import threading
import weakref

import numpy as np

_local = threading.local()
_lock = threading.Lock()
_starts = []                 # sorted allocation start addresses
_allocs = {}                 # start -> (end, device id)
host_waits = {"count": 0, "by_stream": {}}
events_made = {"timing": 0, "plain": 0}     # cupy.cuda.Event() with / without timing
# stream order, as CUDA defines it: each allocation's last write (stream, that stream's op
# count); what each stream, and the host, has waited for. A use on another stream without an
# event wait or a synchronize in between is a race on a GPU: the double raises.
_writers = {}                 # allocation start -> (Stream, tick)
host_known = {}               # stream ptr -> tick the host has seen finish


sticky = 0                   # a sticky CUDA error of this process's context (0: none)


def fault(status: int = 700) -> None:
    """A kernel of this process hit ``status`` (700: cudaErrorIllegalAddress, 719:
    cudaErrorLaunchFailure): the context is unusable, every later runtime call returns it."""
    global sticky
    sticky = int(status)


def device_count() -> int:
    """CUDA's enumeration under CUDA_VISIBLE_DEVICES: entries are indices (< the GPUs there
    are), GPU-<uuid> or MIG-<uuid> (the double has as many GPUs as CUPY_DOUBLE_GPUS, any uuid
    is one of them); CUDA stops at the first invalid or repeated entry, and enumerates one MIG
    instance per process at most (later MIG entries are skipped)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    total = int(os.environ.get("CUPY_DOUBLE_GPUS", "8"))
    if visible is None:
        return total
    seen, mig = [], False
    for item in (v.strip() for v in visible.split(",")):
        if item.isdigit():
            if int(item) >= total or item in seen:
                break
        elif item.startswith("MIG-") and len(item) > 4:
            if mig:
                continue
            mig = True
        elif not (item.startswith("GPU-") and len(item) > 4) or item in seen:
            break
        seen.append(item)
    return min(len(seen), total)


def current_device() -> int:
    return getattr(_local, "device", 0)


def set_device(index: int) -> None:
    _local.device = index


def register(arr: np.ndarray, device: int) -> None:
    """Record a fresh buffer as device memory of ``device``; forgotten when it is freed."""
    start = arr.__array_interface__["data"][0]
    if arr.nbytes == 0:
        return
    with _lock:
        bisect.insort(_starts, start)
        _allocs[start] = (start + arr.nbytes, device)
    weakref.finalize(arr, _forget, start)


def _forget(start: int) -> None:
    with _lock:
        _allocs.pop(start, None)
        _writers.pop(start, None)
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            _starts.pop(i)


def lookup(ptr: int, nbytes: int):
    """The device of the allocation holding [ptr, ptr+nbytes), or None."""
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i < 0:
            return None
        end, device = _allocs[_starts[i]]
    return device if ptr + nbytes <= end else None


def _start_of(ptr: int):
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i >= 0 and ptr < _allocs[_starts[i]][0]:
            return _starts[i]
    return None


class StreamRace(RuntimeError):
    """Memory used on one stream while another stream's write to it may not have happened."""


def _ordered(writer, tick, stream) -> bool:
    if writer is stream or host_known.get(writer.ptr, 0) >= tick:
        return True
    if stream._known.get(writer.ptr, 0) >= tick:
        return True
    # the legacy default stream synchronises with every blocking stream
    return (writer.ptr == 0 and not stream.is_non_blocking) or \
        (stream.ptr == 0 and not writer.is_non_blocking)


def used(ptr: int, stream) -> None:
    """``stream`` reads (or writes) the allocation at ``ptr``: raise on a stream race."""
    start = _start_of(ptr)
    last = _writers.get(start) if start is not None else None
    if last is not None and not _ordered(last[0], last[1], stream):
        raise StreamRace(
            f"cupy double: stream race: memory written on stream {last[0].ptr:#x} (its op "
            f"{last[1]}) used on stream {stream.ptr:#x} with no event wait or synchronize in "
            "between")


def wrote(ptr: int, stream) -> None:
    start = _start_of(ptr)
    if start is not None:
        _writers[start] = (stream, stream._tick)


def host_saw(stream, tick, known) -> None:
    """The host waited for ``stream`` up to ``tick`` (and so for what it had waited for)."""
    with _lock:
        for ptr, t in list(known.items()) + [(stream.ptr, tick)]:
            host_known[ptr] = max(host_known.get(ptr, 0), t)


def memory(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 view of registered memory (callers checked it with ``lookup``)."""
    import ctypes
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


def waited(stream_ptr: int) -> None:
    with _lock:
        host_waits["count"] += 1
        by = host_waits["by_stream"]
        by[stream_ptr] = by.get(stream_ptr, 0) + 1


class Worker:
    """One stream's queue: work runs in order on a thread of its own, as a GPU would run it."""

    def __init__(self):
        self.q = queue.Queue()
        self.pending = 0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, fn) -> None:
        with self.cond:
            self.pending += 1
        self.q.put(fn)

    def _run(self):
        while True:
            fn = self.q.get()
            try:
                fn()
            finally:
                with self.cond:
                    self.pending -= 1
                    self.cond.notify_all()

    def idle(self) -> bool:
        with self.cond:
            return self.pending == 0

    def drain(self) -> None:
        with self.cond:
            while self.pending:
                self.cond.wait()
