"""Collectives between the ranks of one node through one shared-memory segment.

Layout: a control page (one 64-byte line per local rank holding its arrival counter and pid, two
alternating metadata tables, an abort word and message), then one input slot per local rank and
one result area, each ``chunk`` bytes. An allreduce of a chunk is: each rank copies into its slot
the slices the *other* ranks reduce, arrives; each rank reduces its own 1/n slice (its own data,
read in place, plus every peer's copy) into the result area (reduce-scatter), arrives; each rank
copies the other slices out (allgather). Per rank that moves 4.5x the message size through
memory for two ranks, against 5.5x when every rank copies everything in. Arrival counters only
ever grow and each rank writes only its own line, so no atomics are needed (x86's store order
publishes the data before the counter).

Waiting spins on the counters (a 4 KiB allreduce stays far below 100 us), then yields and
sleeps with a growing backoff; it gives up at the timeout, when a peer's pid is gone, or when
another rank posted an abort, always with a message naming the rank.

Leaks: the segment is a plain file in /dev/shm (mmap, never multiprocessing's resource_tracker).
The node leader creates it, every local rank maps it, and after one store barrier it is
unlinked: the mapping lives on until the last process exits, so even SIGKILL leaves nothing
behind. On every failure path during set-up, each rank that knows the name unlinks it.
"""
from __future__ import annotations

import mmap
import os
import secrets
import time
from typing import Callable, List, Optional

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

PREFIX = "fluidctl-"
LINE = 64                         # bytes per rank's control line (one cache line)
ALIGN = 4096
ABORT_MSG = 1024
DEFAULT_CHUNK = 4 << 20
BLOCK = 512 << 10                 # bytes reduced at a time (a multiple of every itemsize)
SPIN_SECONDS = 100e-6
YIELD_SECONDS = 5e-3
LIVENESS_EVERY = 0.2


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")


def _round_up(n: int, k: int = ALIGN) -> int:
    return (n + k - 1) // k * k


def _pid_alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (a SIGKILLed rank its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


class ShmGroup:
    """The local ranks of one node; ``index`` is this rank's position in ``ranks``."""

    def __init__(self, ranks: List[int], index: int, world_size: int, path: str, create: bool,
                 timeout: float, chunk: int = DEFAULT_CHUNK):
        self.ranks, self.index, self.n = ranks, index, len(ranks)
        self.world_size = world_size
        self.timeout = timeout
        self.chunk = chunk
        self.path = path
        ctl_bytes = _round_up(self.n * LINE + 2 * world_size * meta.RECORD * 8 + 8 + ABORT_MSG)
        size = ctl_bytes + (self.n + 1) * chunk
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != size:
                raise CollectiveError(f"shared segment {path} has the wrong size "
                                      "(ranks disagree on the node layout)")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        buf = np.frombuffer(self._mm, dtype=np.uint8)
        ctl = buf[:ctl_bytes].view(np.int64)
        self._counters = ctl[: self.n * LINE // 8: LINE // 8]            # arrival counters
        self._pids = ctl[1: self.n * LINE // 8: LINE // 8]
        off = self.n * LINE // 8
        # two metadata tables, used by alternate calls: a rank that is one call ahead must not
        # overwrite the records a slower rank is still checking
        self.tables = ctl[off: off + 2 * world_size * meta.RECORD].reshape(
            2, world_size, meta.RECORD)
        off += 2 * world_size * meta.RECORD
        self._abort = ctl[off: off + 1]
        self._abort_msg = buf[(off + 1) * 8: (off + 1) * 8 + ABORT_MSG]
        self.slots = [buf[ctl_bytes + i * chunk: ctl_bytes + (i + 1) * chunk]
                      for i in range(self.n)]
        self.result = buf[ctl_bytes + self.n * chunk: ctl_bytes + (self.n + 1) * chunk]
        self._pids[index] = os.getpid()
        self._gen = int(self._counters[index])
        self.broken: Optional[str] = None

    @staticmethod
    def new_path(tag: str) -> str:
        return os.path.join(shm_dir(), f"{PREFIX}{tag}-{os.getpid()}-{secrets.token_hex(4)}")

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            self.slots = self.result = self.tables = None
            self._counters = self._pids = self._abort = self._abort_msg = None
            try:
                mm.close()
            except BufferError:      # a caller still holds a view; the OS frees it at exit
                pass

    # --- synchronisation ---------------------------------------------------------------
    def arrive_and_wait(self) -> None:
        self._gen += 1
        self._counters[self.index] = self._gen
        self.wait_all(self._gen)

    def wait_all(self, gen: int) -> None:
        counters = self._counters
        if counters.min() >= gen:
            return
        start = time.perf_counter()
        next_check = start + LIVENESS_EVERY
        sleep = 20e-6
        while True:
            for _ in range(64):
                if counters.min() >= gen:
                    return
            now = time.perf_counter()
            if self._abort[0]:
                self._fail(bytes(self._abort_msg).rstrip(b"\0").decode(errors="replace"))
            if now - start > SPIN_SECONDS:
                if now - start < YIELD_SECONDS:
                    os.sched_yield()
                else:
                    time.sleep(sleep)
                    sleep = min(sleep * 2, 1e-3)
            if now >= next_check:
                next_check = now + LIVENESS_EVERY
                self._check_peers(gen, now - start)

    def _check_peers(self, gen: int, waited: float) -> None:
        late = [i for i in range(self.n) if self._counters[i] < gen]
        for i in late:
            pid = int(self._pids[i])
            if pid and not _pid_alive(pid):
                self.abort(f"rank {self.ranks[i]} (pid {pid}, same node) died during a "
                           "collective")
        if waited > self.timeout:
            names = ", ".join(f"rank {self.ranks[i]}" for i in late)
            self.abort(f"{names} did not reach the collective within {self.timeout:g}s "
                       "(stuck, or calling a different collective? raise FLUIDCTL_TIMEOUT if "
                       "it is just slow)")

    def abort(self, message: str) -> None:
        """Tell every local rank that the group is broken, then raise here too."""
        data = message.encode()[: ABORT_MSG - 1]
        if self._abort is not None and not self._abort[0]:
            self._abort_msg[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            self._abort[0] = 1
        self._fail(message)

    def _fail(self, message: str) -> None:
        self.broken = message
        raise CollectiveError(message)

    # --- collectives -------------------------------------------------------------------
    def allreduce(self, flat: np.ndarray, rec: np.ndarray, op: str, zero_input: bool = False,
                  across: Optional[Callable[[np.ndarray, np.ndarray, bool], None]] = None,
                  ) -> None:
        """In-place allreduce of a 1-d contiguous array among the local ranks.

        ``across`` (hierarchical mode, node leader only) is called with the node's reduced
        chunk, the metadata table and whether it is the first chunk; it completes the
        reduction across nodes before the local ranks copy the result out.
        """
        if self.broken:
            raise CollectiveError(f"the communicator is broken by an earlier error: {self.broken}")
        raw = flat.view(np.uint8)
        total, isz, me = raw.nbytes, flat.itemsize, self.index
        step = max(isz, self.chunk // isz * isz)
        hierarchical = across is not None or self.world_size > self.n
        ufunc = meta.reducer(op)
        table = self.tables[int(rec[meta.SEQ]) % 2]
        table[self.ranks[me]] = rec
        pos, first = 0, True
        while first or pos < total:
            size = min(step, total - pos)
            part = raw[pos:pos + size]
            cuts = [b * isz for b in self._bounds(size // isz)]
            others = [j for j in range(self.n) if j != me]
            # 1. publish the slices the other ranks reduce (this rank's own slice stays local)
            mine = self.slots[me]
            for j in others:
                if zero_input:
                    mine[cuts[j]:cuts[j + 1]] = 0
                else:
                    mine[cuts[j]:cuts[j + 1]] = part[cuts[j]:cuts[j + 1]]
            self.arrive_and_wait()
            problem = meta.check(table[self.ranks], not hierarchical) if first else None
            if first and problem and not hierarchical:
                raise CollectiveError(problem)
            # 2. reduce this rank's slice: own data + every peer's copy of that slice
            if not problem:
                # in cache-sized blocks, so the copy back into ``own`` reads a hot ``out``
                for lo in range(cuts[me], cuts[me + 1], BLOCK):
                    hi = min(lo + BLOCK, cuts[me + 1])
                    out = self.result[lo:hi].view(flat.dtype)
                    own = part[lo:hi].view(flat.dtype)
                    peers = [self.slots[j][lo:hi].view(flat.dtype) for j in others]
                    if zero_input:
                        out[:] = peers[0] if peers else 0
                        peers = peers[1:]
                    elif peers:
                        ufunc(own, peers.pop(0), out=out)
                    else:
                        out[:] = own
                    for peer in peers:
                        ufunc(out, peer, out=out)
                    if not hierarchical:
                        own[:] = out
            self.arrive_and_wait()
            if hierarchical:
                if across is not None:
                    try:
                        across(self.result[:size].view(flat.dtype) if not problem else None,
                               table, first)
                    except CollectiveError as exc:
                        self.abort(str(exc))
                self.arrive_and_wait()
                if first:
                    problem = meta.check(table)
                    if problem:
                        raise CollectiveError(problem)
                part[:] = self.result[:size]
            else:
                # 3. collect the slices the others reduced
                for j in others:
                    part[cuts[j]:cuts[j + 1]] = self.result[cuts[j]:cuts[j + 1]]
            pos += size
            first = False

    def _bounds(self, count: int) -> List[int]:
        """Element offsets of each local rank's slice, cut at whole cache lines."""
        per = -(-count // self.n)
        per = -(-per // 16) * 16
        return [min(count, i * per) for i in range(self.n + 1)]
