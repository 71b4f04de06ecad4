"""The GPU collectives a rank has launched and not yet seen finish, and the watchdog that
retires them (torch's ProcessGroupNCCL does the same with its work list and watchdog thread).

``run()`` records one completion event (from a pool) on the caller's stream after the NCCL call
and returns: no host wait. The queue is bounded; a call that fills it waits for the oldest (half of it).
The watchdog thread looks at the oldest work only: its event (done: retired, counted for the
launcher's hang watchdog; a CUDA fault: named), NCCL's async error every millisecond, the
deadline (FLUIDCTL_TIMEOUT from when the work became the oldest), same-node peers' processes
every 0.2 s, errors other ranks posted every 0.5 s. A fault is sticky: the communicator is
aborted and the next call, ``synchronize``, ``barrier`` and ``finalize`` raise the same
CollectiveError on every rank (the first rank's message, through the store).
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Optional

from fluidctl.diagnostics import progress
from fluidctl.runtime.collective.meta import CollectiveError

CUDA_NOT_READY = 600          # cudaErrorNotReady: what cudaEventQuery says of pending work
DEPTH = 64
# what a rank whose metadata exchange broke says when a same-node peer died and no collective
# of its own is in flight (else it names that one, in its watchdog's words: ``stuck``)
DEAD_PEER = "the GPU collectives in flight cannot finish"


def cannot_finish(kind: str, seq: int) -> str:
    return f"NCCL {kind} (collective #{seq}) cannot finish"


class InFlight:
    def __init__(self, transport, depth: int = DEPTH):
        self.t = transport
        self.depth = max(1, depth)
        self.items = collections.deque()         # (event, call number, kind)
        self.pool = []
        self.cv = threading.Condition()
        self.fault: Optional[str] = None
        self._thread = None
        self._closing = False
        self._idle = False                       # the watchdog waits for work

    def event(self):
        """A completion event (made on the transport's device, which is current)."""
        pool = self.pool
        return pool.pop() if pool else self.t.cupy.cuda.Event(disable_timing=True)

    def push(self, event, seq: int, kind: str) -> None:
        items = self.items
        items.append((event, seq, kind))          # atomic; the watchdog only pops the left
        if self._idle:                           # (it re-looks every 50 ms anyway)
            with self.cv:
                self.cv.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, daemon=True,
                                            name="fluidctl-nccl-watchdog")
            self._thread.start()
        if len(items) >= self.depth:       # full: wait for the older half (fewer switches)
            self.wait(self.depth // 2)

    def wait(self, room: int = 0) -> None:
        """Until at most ``room`` collectives are in flight (the watchdog bounds the wait);
        raises the sticky fault."""
        with self.cv:
            while len(self.items) > room and self.fault is None:
                self.cv.wait(1.0)
        if self.fault is not None:
            raise CollectiveError(self.fault)

    def stuck(self) -> str:
        """What a same-node peer's death leaves unfinished: the oldest collective in flight, in
        the watchdog's words (DEAD_PEER when nothing is queued)."""
        with self.cv:
            oldest = self.items[0] if self.items else None
        return cannot_finish(oldest[2], oldest[1]) if oldest else DEAD_PEER

    def trip(self, message: str) -> str:
        with self.cv:
            if self.fault is None:
                self.fault = message
            self.cv.notify_all()
            return self.fault

    def close(self) -> None:
        with self.cv:
            self._closing = True
            self.cv.notify_all()

    # --- the watchdog thread --------------------------------------------------------------
    def _watch(self) -> None:
        try:
            self._loop()
        except BaseException as exc:          # never leave a waiter without an answer
            self.t.trip(f"the NCCL watchdog on rank {self.t.rank} failed: "
                        f"{type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        t, cv, items = self.t, self.cv, self.items
        query = t.cupy.cuda.runtime.eventQuery
        since = next_async = next_peers = next_post = time.monotonic()
        while True:
            with cv:
                while not items and not self._closing and self.fault is None:
                    self._idle = True
                    cv.wait(0.05)
                    since = time.monotonic()
                self._idle = False
                if self._closing or self.fault is not None:
                    return
                event, seq, kind = items[0]
            status = query(event.ptr)
            now = time.monotonic()
            if status == 0:
                with cv:
                    items.popleft()
                    self.pool.append(event)
                    cv.notify_all()
                since = now
                progress.bump()               # completed collectives: the hang watchdog's count
                continue
            message, post = None, True
            if status != CUDA_NOT_READY:
                message = t._fault_message(kind, seq, t._status_text(status))
            if message is None and now >= next_async:
                next_async = now + 1e-3
                message = t._async_error(kind, seq)
            if message is None and now >= next_peers:
                next_peers = now + 0.2
                if t._dead_peers():
                    message = cannot_finish(kind, seq)
            if message is None and now - since > t.timeout:
                message = (f"NCCL {kind} (collective #{seq}) did not finish within "
                           f"{t.timeout:g}s on rank {t.rank}")
            if message is None and now >= next_post:
                next_post = now + 0.5
                message, post = t._posted(), False
            if message is not None:
                t.trip(message, post)
                return
            time.sleep(1e-4 if now - since < 0.01 else 1e-3)
