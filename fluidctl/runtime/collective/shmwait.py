"""How the ranks of one node wait for each other's progress counters without stealing the CPU.

A rank publishes a counter in its control line, then increments the node's doorbell (a 32-bit
word in the shared control page) and wakes the peers whose SLEEP word says they sleep on it.
A waiter spins briefly (only when every local rank has a CPU of its own), then sleeps on the
doorbell with futex(2): it costs nothing while it waits and wakes as soon as a peer posts, so
ranks that share CPUs with other work (or with each other) take turns instead of burning the
time slice their peer needs. Every wait returns at least every ``slice`` seconds, and at once
on an abort, so the caller can check liveness and its deadline.

The native module (_fastshm.c) does this with atomic instructions. Without it (it could not be
built, or FLUIDCTL_SHM_NATIVE=0) the same protocol runs through ctypes' syscall(SYS_futex)
with plain loads and stores: a poster there always calls FUTEX_WAKE (the kernel then orders
its doorbell store against any waiter's check, so no sleeper is missed), and a waiter there
looks again every MISSED_WAKE_BOUND (a poster may not see its SLEEP word in time).
"""
from __future__ import annotations

import ctypes
import os
import platform
import time
from typing import Optional

from fluidctl import envs

SLEEP = 8                       # a rank's control-line word: 1 while it sleeps on the doorbell
REACHED, SLOW, ABORTED = 0, 1, 3     # a wait's outcomes (as _fastshm's)
MISSED_WAKE_BOUND = 2e-3        # ctypes path: longest sleep before looking again
PYTHON_SPIN = 100e-6            # ctypes path: a step of the Python protocol takes ~10-30 us, and
                                # a futex wake-up 150-400 us on a small virtual machine
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


def native():
    """The _fastshm extension, or None when it is not built or switched off."""
    if os.environ.get(envs.SHM_NATIVE, "1").strip() == "0":
        return None
    try:
        from fluidctl.runtime.collective import _fastshm
    except ImportError:
        return None
    return _fastshm


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Waiter:
    """Posting and waiting on one node's control page.

    ``ctl``: the control words (a memoryview of int64); ``bell``: the doorbell (a memoryview
    of one uint32) at address ``bell_addr``; ``abort``: the abort word; ``native_group``: the
    native module's handle (native_group()), or None for the ctypes path.
    """

    def __init__(self, ctl, bell, abort, *, bell_addr: int, words: int, n: int, index: int,
                 spin: float, native_group=None):
        self.ctl, self.bell, self.abort, self._addr = ctl, bell, abort, bell_addr
        self.words, self.n, self.index, self.spin = words, n, index, spin
        self.mine = index * words
        self.others = [j for j in range(n) if j != index]
        self.group = native_group
        self._mod = native() if native_group is not None else None
        self._futex = None if native_group is not None else _ctypes_futex()
        self._ts = _Timespec()

    def post(self, word: int, value: int) -> None:
        """Publish this rank's counter ``word`` and wake the peers that sleep."""
        if self._mod is not None:
            self._mod.post(self.group, word, value)
            return
        self.ctl[self.mine + word] = value
        self.ring()

    def ring(self) -> None:
        """Wake the peers that sleep (they look at the abort word)."""
        if self._mod is not None:
            self._mod.ring(self.group)
            return
        self.bell[0] = (self.bell[0] + 1) & 0xFFFFFFFF
        if self._futex is not None:       # always: without atomics, the SLEEP words could be
            # read before this rank's stores are seen; the syscall orders them (see above)
            self._futex(self._addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wait(self, word: int, target: int, slice_: float) -> int:
        """REACHED once every peer's ``word`` is at least ``target``; SLOW after ``slice_``
        seconds; ABORTED when a rank posted an abort."""
        if self._mod is not None:
            return self._mod.wait(self.group, word, target, int(slice_ * 1e9))
        return self._wait_ctypes(word, target, slice_)

    def _reached(self, word: int, target: int) -> bool:
        ctl, words = self.ctl, self.words
        for j in self.others:
            if ctl[j * words + word] < target:
                return False
        return True

    def _wait_ctypes(self, word: int, target: int, slice_: float) -> int:
        start = time.perf_counter()
        end_spin = start + (PYTHON_SPIN if self.spin else 0.0)
        while self._reached(word, target) is False:
            if time.perf_counter() > end_spin:
                break
        else:
            return REACHED
        ctl, mine = self.ctl, self.mine
        try:
            while True:
                seen = self.bell[0]
                ctl[mine + SLEEP] = 1
                if self._reached(word, target):
                    return REACHED
                if self.abort[0]:
                    return ABORTED
                left = start + slice_ - time.perf_counter()
                if left <= 0:
                    return SLOW
                if self._futex is None:
                    time.sleep(min(left, 1e-4))
                    continue
                step = min(left, MISSED_WAKE_BOUND)
                self._ts.tv_sec, self._ts.tv_nsec = int(step), int(step % 1 * 1e9)
                self._futex(self._addr, _FUTEX_WAIT, seen, ctypes.byref(self._ts),
                            None, 0)
        finally:
            ctl[mine + SLEEP] = 0


def _ctypes_futex():
    """libc's syscall() bound to SYS_futex, or None where the number is not known."""
    number = _SYS_FUTEX.get(platform.machine())
    if number is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long

    def futex(addr, op, val, timeout, addr2, val3, _fn=fn, _n=number):
        return _fn(ctypes.c_long(_n), ctypes.c_void_p(addr), ctypes.c_int(op),
                   ctypes.c_uint32(val), timeout, addr2, ctypes.c_int(val3))
    return futex


def native_group(mod, ctl_addr: int, words: int, n: int, index: int, world: int, ranks,
                 bell_addr: int, abort_addr: int, tables_addr: int, slots_addr: int,
                 chunk: int, room: int, spin: float) -> Optional[object]:
    """The native module's handle on this node's page (None without the module)."""
    if mod is None:
        return None
    return mod.group(ctl_addr, words, n, index, world, list(ranks), bell_addr, abort_addr,
                     tables_addr, slots_addr, chunk, room, int(spin * 1e9))
