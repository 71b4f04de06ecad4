"""One event loop for every SSH channel the launcher reads: a fixed number of threads whatever
the number of nodes.

Each remote command used to be read by two threads (stdout, stderr) and each node agent
watched by a third, so 1,000 nodes held 3,000 threads besides paramiko's own transport thread
per connection. Here one thread waits on every channel at once (a paramiko ``Channel`` gives a
descriptor that turns readable when either stream has data or the channel closes), hands the
bytes to the channel's line splitters, and calls each registered ``tick`` every
``TICK`` seconds (heartbeat and end checks), and at once when a channel ends or its exit
status comes (a job's last agent exiting is noticed then, not up to a tick later). Callbacks
run on this thread: they must not block.
"""
from __future__ import annotations

import os
import selectors
import threading
import time
from typing import Callable, Dict, List, Optional

TICK = 0.1              # seconds between ticks (the agents' WATCH_EVERY)
_CHUNK = 65536


class _Reading:
    """A channel being read: its two streams' consumers and the event set at its end."""
    __slots__ = ("channel", "out", "err", "end", "done", "fd")

    def __init__(self, channel, out, err, end):
        self.channel, self.out, self.err, self.end = channel, out, err, end
        self.done = threading.Event()
        self.fd = -1


class ChannelPump:
    """The process's one reader of SSH channels (``pump()``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._new: List[_Reading] = []
        self._ticks: List[Callable[[float], bool]] = []
        self._urgent = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._loop, name="fluidctl-ssh-pump",
                                        daemon=True)
        self._thread.start()

    def read(self, channel, out: Callable[[bytes], None], err: Callable[[bytes], None],
             end: Callable[[], None]) -> threading.Event:
        """Feed ``channel``'s stdout to ``out`` and stderr to ``err`` until both end, then call
        ``end``; the returned event is set after that."""
        reading = _Reading(channel, out, err, end)
        with self._lock:
            self._new.append(reading)
        self._wake()
        return reading.done

    def every_tick(self, tick: Callable[[float], bool]) -> None:
        """Call ``tick(now)`` every TICK seconds until it returns False."""
        with self._lock:
            self._ticks.append(tick)
        self._wake()

    def poke(self) -> None:
        """Run the ticks now (a channel's exit status came: its end check need not wait)."""
        self._urgent = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass                          # a wake-up is already pending

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        readings: Dict[int, _Reading] = {}            # by descriptor
        next_tick = time.monotonic() + TICK

        def drop(reading: _Reading) -> None:
            if readings.get(reading.fd) is reading:
                del readings[reading.fd]
                try:
                    sel.unregister(reading.fd)
                except (KeyError, ValueError, OSError):
                    pass
            self._finish(reading)

        while True:
            try:                      # the process's only reader: it must never die
                timeout = max(0.0, next_tick - time.monotonic())
                for key, _ in sel.select(timeout):
                    if key.fileobj == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    if self._drain(key.data):
                        drop(key.data)
                        next_tick = 0.0   # an end: the end checks run now, not a tick later
                with self._lock:
                    new, self._new = self._new, []
                for reading in new:
                    try:
                        reading.fd = reading.channel.fileno()
                    except Exception:
                        self._finish(reading)
                        continue
                    stale = readings.get(reading.fd)
                    if stale is not None:   # a channel closed behind our back: its number
                        drop(stale)         # came back for this one (epoll forgot it)
                    sel.register(reading.fd, selectors.EVENT_READ, reading)
                    readings[reading.fd] = reading
                    if self._drain(reading):      # data (or the end) came before we looked
                        drop(reading)
                now = time.monotonic()
                if self._urgent:
                    self._urgent, next_tick = False, 0.0
                if now >= next_tick:
                    next_tick = now + TICK
                    for reading in [r for r in readings.values() if r.channel.closed]:
                        if self._drain(reading):  # closed without a last readable event:
                            drop(reading)         # what it still holds is read first
                    with self._lock:
                        ticks = list(self._ticks)
                    done = [t for t in ticks if not _safe_tick(t, now)]
                    if done:
                        with self._lock:
                            self._ticks = [t for t in self._ticks if t not in done]
            except Exception:                     # one channel's trouble: look again
                time.sleep(0.01)

    @staticmethod
    def _drain(reading: _Reading) -> bool:
        """Read what is there on both streams without blocking; True at the channel's end."""
        channel = reading.channel
        try:
            while channel.recv_stderr_ready():
                data = channel.recv_stderr(_CHUNK)
                if not data:
                    break
                reading.err(data)
            while channel.recv_ready():
                data = channel.recv(_CHUNK)
                if not data:
                    break
                reading.out(data)
        except Exception:                 # a dead transport: the end of this channel
            return True
        if channel.recv_ready() or channel.recv_stderr_ready():
            return False
        transport = channel.get_transport()
        return bool(channel.eof_received or channel.closed or transport is None
                    or not transport.is_active())

    @staticmethod
    def _finish(reading: _Reading) -> None:
        try:
            reading.end()
        finally:
            reading.done.set()


def _safe_tick(tick: Callable[[float], bool], now: float) -> bool:
    try:
        return bool(tick(now))
    except Exception:
        return False


_pump: Optional[ChannelPump] = None
_pump_lock = threading.Lock()


def poke() -> None:
    """Run the pump's end checks now, if the process has a pump."""
    if _pump is not None:
        _pump.poke()


def pump() -> ChannelPump:
    """The process's one pump, started on first use."""
    global _pump
    with _pump_lock:
        if _pump is None:
            _pump = ChannelPump()
        return _pump
