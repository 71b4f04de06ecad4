"""How the GPU path agrees on its calls without a per-call exchange that grows with the world.

The first time a signature (kind, op, dtype, shape, root) is used, every rank runs the full
agreement over the CPU communicator, with the usual messages. After that a call costs a dict
lookup and a rolling 64-bit hash of (call number, signature). The ranks compare the hash every
K calls (K paced to about 50 ms apart, as checkpoint requests are: every rank computes the same
K from the agreed elapsed time) and at every barrier, synchronize and checkpoint. On a mismatch
the ranks gather a small ring of their recent signatures and name the first call that differs.

A rank that meets a call it has never seen while the others hash theirs (the calls diverged
there) runs the full agreement; the others meet it at their next hash comparison: the table
then holds a comparison row beside a call's row (meta.DIVERGED) and the ranks name the call
from their rings in the same way. FLUIDCTL_STRICT_COLLECTIVES=1 agrees on every call in full.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

RING = 64                       # recent calls each rank keeps for naming a divergence
PERIOD = 0.05                   # seconds between hash comparisons, once calls are timed
MAX_EVERY = 1024                # calls between comparisons at most
_MASK = (1 << 62) - 1           # the hash and its negation both fit an int64
_PRIME = 0x100000001B3
_EMPTY = np.zeros(0, np.uint8)


def signature(rec: np.ndarray) -> int:
    """A call's record without its sequence number, as one integer."""
    return zlib.crc32(rec[meta.KIND:].tobytes())


class CallLog:
    """Per communicator: the signatures agreed so far, the rolling hash and the recent calls."""

    def __init__(self, comm, strict: bool):
        self.comm = comm
        self.strict = strict
        self.solo = comm.world_size == 1        # first-use checks only: nobody to compare with
        self.agreed = set()
        self.hash = 0
        self.calls = 0                   # GPU calls so far (their 'collective #N')
        self.recent = [None] * RING      # (call number, record) by call number % RING
        self.every, self.next_check, self.max_every = 1, 1, MAX_EVERY
        self.last = time.monotonic_ns()
        self._buf = np.zeros(4, np.int64)       # hash, -hash, elapsed ns, a rank is broken
        self._check = meta.record(0, "check of the collective calls", "max", np.int64, (4,))

    def call(self, key, rec: np.ndarray, sig: int, full: bool = False) -> int:
        """Agree on one call (in full the first time, or always with ``full``); returns its
        number. Raises the same CollectiveError on every rank on a mismatch."""
        self.calls = n = self.calls + 1
        self.recent[n % RING] = (n, rec)
        if full or self.strict or key not in self.agreed:
            self._full(rec)
            if not full:
                if len(self.agreed) > 4096:      # the same on every rank: calls agree so far
                    self.agreed.clear()
                self.agreed.add(key)
        if self.solo:
            return n
        self.hash = ((self.hash * _PRIME) ^ (sig + n)) & _MASK
        if n >= self.next_check and not self.strict:
            self.verify()
        return n

    def _full(self, rec: np.ndarray) -> None:
        comm = self.comm
        comm._seq += 1
        rec[meta.SEQ] = comm._seq
        self._exchange(_EMPTY, rec, "sum")

    def _exchange(self, flat, rec, op: str) -> None:
        try:
            self.comm._exchange(flat, rec, op, False)
        except CollectiveError as exc:
            if str(exc).startswith(meta.DIVERGED):
                self.diagnose()
            nccl = self.comm.nccl
            if nccl is None or not self.comm.broken:
                raise
            # a rank died or left: its GPU peers' watchdogs may have posted the job's error
            # already; the first one posted is every rank's, and this rank's words are the
            # watchdog's (the collective in flight), whichever of the two sees it first
            message = nccl.work.stuck() if nccl._dead_peers() else str(exc)
            raise CollectiveError(nccl.first_error(message)) from None

    def verify(self) -> None:
        """Compare the hash of every call so far on every rank (a 4-number allreduce that
        also tells every rank when one rank's GPU work failed)."""
        if self.strict or self.solo:
            return
        comm, buf = self.comm, self._buf
        now = time.monotonic_ns()
        nccl = comm.nccl
        broken = nccl is not None and (nccl.broken or nccl.work.fault is not None)
        buf[0], buf[1], buf[2], buf[3] = self.hash, -self.hash, now - self.last, broken
        comm._seq += 1
        rec = self._check
        rec[meta.SEQ] = comm._seq
        self._exchange(buf, rec, "max")
        if buf[3]:                     # a rank's GPU work failed: its error, on every rank
            raise CollectiveError(nccl.adopt_posted())
        if buf[0] != -buf[1]:
            self.diagnose()
        self.last = time.monotonic_ns()
        wanted = int(self.every * PERIOD * 1e9 / max(int(buf[2]), 1))
        self.every = max(1, min(wanted, self.every * 2, self.max_every))
        self.next_check = self.calls + self.every

    def diagnose(self) -> None:
        """Gather every rank's recent calls and raise naming the first that differs."""
        comm = self.comm
        mine = np.full((RING, meta.RECORD), -1, np.int64)
        for i, item in enumerate(sorted(x for x in self.recent if x is not None)[-RING:]):
            mine[i] = item[1]
            mine[i, meta.SEQ] = item[0]
        table = np.zeros((comm.world_size, RING, meta.RECORD), np.int64)
        table[comm.rank] = mine
        comm._seq += 1
        rec = meta.record(comm._seq, "allgather", "sum", np.int64, table.shape)
        comm._exchange(table.reshape(-1), rec, "sum", False)
        message = first_divergence(table)
        if comm.nccl is not None:         # its launched work may never end: abort it
            message = comm.nccl.trip(message, post=False)
        raise CollectiveError(message)


def first_divergence(table: np.ndarray) -> str:
    """The first call number at which the ranks' recent calls (a (world, RING, RECORD)
    table, call numbers in SEQ, -1 for none) differ, with the usual metadata message."""
    seqs = table[:, :, meta.SEQ]
    have = seqs >= 0
    lo = int(np.where(have, seqs, np.iinfo(np.int64).max).min(axis=1).max())
    hi = int(seqs.max())
    ranks = np.arange(len(table))
    for s in range(lo, hi + 1):                  # numpy over the ranks: a big world is fine
        match = seqs == s
        has = match.any(axis=1)
        rows = table[ranks, match.argmax(axis=1)]
        if not has.all():
            missing = np.nonzero(~has)[0].tolist()
            there = int(np.nonzero(has)[0][0])
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            return (f"the ranks' GPU collective calls diverged at collective #{s}: rank(s) "
                    f"{shown} had not reached it while rank {there} called "
                    f"{meta.KINDS[int(rows[there, meta.KIND])]}; every rank must make the "
                    "same collective calls in the same order")
        rows[:, meta.SEQ] = s
        if not (rows == rows[0]).all():
            what = meta.check(rows) or "the calls differ"
            return (f"the ranks' GPU collective calls diverged at collective #{s}: {what} "
                    "(set FLUIDCTL_STRICT_COLLECTIVES=1 to check every call as it is made)")
    return (f"the ranks' GPU collective calls diverged before collective #{lo}, the oldest "
            f"of the last {RING} each rank keeps: set FLUIDCTL_STRICT_COLLECTIVES=1 to find it")
