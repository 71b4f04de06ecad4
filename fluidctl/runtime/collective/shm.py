"""Collectives between the ranks of one node: a shared-memory segment, plus reading the peers'
arrays directly when the kernel allows it.

Layout: a control page (one 64-byte line per local rank: see the word names below; two
alternating metadata tables, an abort word and message), then one input slot per local rank and
one result area, each ``chunk`` bytes. In every path each rank reduces its own 1/n of the array
(its own data, read in place, plus every peer's copy: a reduce-scatter), then collects the parts
the others reduced (an allgather). Three ways to move the data:

- direct (messages from DIRECT_MIN bytes when the native module is missing or
  FLUIDCTL_SHM_DIRECT=1 asks for it, and every local rank may read the others' memory):
  the peers' copies and results are read straight out of their arrays with process_vm_readv
  (cross-memory attach, what Open MPI's shared-memory transport uses for large messages), in
  cache-sized pieces through a reused buffer for the reduction. No segment in between: the
  message crosses memory two times fewer per rank than copying it through shared memory.
- pipelined (smaller messages, or no cross-memory attach): pieces of PIECE bytes flow through a
  ring of RING slots per rank, so the segment's part of the working set stays in cache; piece
  g + 1 is copied in while piece g is being finished. Progress counters per stage, no barriers.
- chunked with barriers (hierarchical: the node's reduced chunk goes to the other nodes between
  the reduce and the copy-out).

Counters only ever grow and each rank writes only its own line. A message of one piece runs in
the native module (_fastshm.c, the same protocol in C: slots, counters and the metadata table,
compared as bytes on every call), so a 4 KiB allreduce costs microseconds; without the module
the Python path runs it. Waiting (shmwait.py) spins briefly, then sleeps on a futex that every
post rings; it gives up at the timeout, when a peer's pid is gone, or when another rank posted
an abort, always with a message naming the rank.

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

from fluidctl import envs
from fluidctl.runtime.collective import meta, shmwait
from fluidctl.runtime.collective.meta import CollectiveError

PREFIX = "fluidctl-"
LINE = 128                        # bytes per rank's control line (two cache lines)
WORDS = LINE // 8
# the words of a rank's control line: barrier arrivals (hierarchical path and the probe), pid,
# pieces copied in / reduced / copied out (pipelined and direct paths), the direct path's array
# address and "contributes zeros" flag, the probe's answer, and "asleep on the doorbell"
ARRIVE, PID, IN, RED, OUT, ADDR, ZERO, CAN_READ, SLEEP = range(9)
ALIGN = 4096
ABORT_MSG = 1024
DEFAULT_CHUNK = 4 << 20
BLOCK = 512 << 10                 # bytes reduced at a time (a multiple of every itemsize)
PIECE = 512 << 10                 # bytes per piece (fits in L2); the pipelined path's pieces
                                  # are PIECE x (ranks - 1), so each rank's part stays ~PIECE / 2
RING = 2                          # pipelined path: slots per rank (2 suffice, see _pipelined)
DIRECT_MIN = 4 << 20              # below this, the kernel's per-page cost of a direct read
                                  # loses to copies that stay in cache
SPIN_SECONDS = 20e-6              # spin this long before sleeping, when each rank has a CPU
LIVENESS_EVERY = 0.2              # seconds between checks of the peers' pids and the deadline
SLICE_NS = int(LIVENESS_EVERY * 1e9)
_fastshm_MISMATCH, _fastshm_FALLBACK = 2, 4       # _fastshm.c's step outcomes


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


_vm_readv = None                  # (process_vm_readv, iovec pair buffer, get_errno), on first use


def _read_peer(pid: int, addr: int, dest: np.ndarray) -> bool:
    """Copy ``dest.nbytes`` bytes from address ``addr`` of process ``pid`` into ``dest``
    (process_vm_readv: the kernel copies once between the two address spaces)."""
    global _vm_readv
    if _vm_readv is None:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "process_vm_readv", None)
        if fn is None:
            return False
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                       ctypes.c_ulong, ctypes.c_ulong]
        _vm_readv = (fn, np.zeros(4, np.uint64), ctypes.get_errno)
    fn, iov = _vm_readv[0], _vm_readv[1]
    size, done, local = dest.nbytes, 0, dest.ctypes.data
    while done < size:            # the kernel may copy less than asked: go on from there
        iov[:] = (local + done, size - done, addr + done, size - done)
        got = fn(pid, iov.ctypes.data, 1, iov.ctypes.data + 16, 1, 0)
        if got <= 0:
            return False
        done += got
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
        bell_at = _round_up(self.n * LINE + 2 * world_size * meta.RECORD * 8 + 8 + ABORT_MSG,
                            LINE)          # the doorbell (shmwait.py), on a line of its own
        ctl_bytes = _round_up(bell_at + LINE)
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
        self._counters = ctl[ARRIVE: self.n * WORDS: WORDS]           # arrival counters
        self._pids = ctl[PID: self.n * WORDS: WORDS]
        off = self.n * WORDS
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
        # the control lines as words: reading one through a memoryview is a few times cheaper
        # than through numpy, which matters in the spin loops
        self._ctl = memoryview(self._mm)[:ctl_bytes].cast("q")
        self._others = [j for j in range(self.n) if j != index]
        self._whole = list(ranks) == list(range(world_size))   # the table is this node's
        self._lines = [[j * WORDS + word for j in self._others] for word in range(WORDS)]
        self._mine = index * WORDS                          # + a word name: this rank's word
        self._piece_room = chunk // RING // ALIGN * ALIGN   # bytes of one ring slot
        self._pids[index] = os.getpid()
        self._gen = int(self._counters[index])
        self._piece = int(self._ctl[self._mine + OUT])      # pieces numbered across calls
        # more local ranks than CPUs: a spinning rank holds the CPU its peer needs, so yield
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        self._spin = SPIN_SECONDS if self.n <= cpus else 0.0
        base = buf.ctypes.data
        mod = shmwait.native()
        self._native = shmwait.native_group(
            mod, base, WORDS, self.n, index, world_size, ranks, base + bell_at,
            base + (self.n * WORDS + 2 * world_size * meta.RECORD) * 8,
            base + self.n * WORDS * 8, base + ctl_bytes, chunk, self._piece_room, self._spin)
        self._waiter = shmwait.Waiter(
            self._ctl, memoryview(self._mm)[bell_at: bell_at + 4].cast("I"),
            self._abort, bell_addr=base + bell_at, words=WORDS, n=self.n, index=index,
            spin=self._spin, native_group=self._native)
        self._post = self._waiter.post
        self._step = mod.step if self._native is not None else None
        self._direct: Optional[bool] = None                 # probed on the first collective
        self._temp: Optional[np.ndarray] = None
        self.broken: Optional[str] = None

    @staticmethod
    def new_path(tag: str) -> str:
        return os.path.join(shm_dir(), f"{PREFIX}{tag}-{os.getpid()}-{secrets.token_hex(4)}")

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            self._native = self._step = None
            self._waiter.bell.release()
            self._ctl.release()
            self.slots = self.result = self.tables = None
            self._counters = self._pids = self._abort = self._abort_msg = None
            try:
                mm.close()
            except BufferError:      # a caller still holds a view; the OS frees it at exit
                pass

    # --- synchronisation ---------------------------------------------------------------
    def arrive_and_wait(self) -> None:
        self._gen += 1
        self._post(ARRIVE, self._gen)
        self.wait_all(self._gen)

    def wait_all(self, gen: int) -> None:
        self._wait(ARRIVE, gen)

    def _wait(self, word: int, target: int) -> None:
        """Until every other local rank's counter ``word`` has reached ``target`` (see
        shmwait.py); checks the peers' liveness and the deadline every LIVENESS_EVERY."""
        wait, start = self._waiter.wait, time.perf_counter()
        status = wait(word, target, LIVENESS_EVERY)
        while status != shmwait.REACHED:
            self._stop_if_aborted()
            self._check_peers(word, target, time.perf_counter() - start)
            status = wait(word, target, LIVENESS_EVERY)

    def _check_peers(self, word: int, target: int, waited: float) -> None:
        late = [i for i in self._others if self._ctl[i * WORDS + word] < target]
        for i in late:
            self._stop_if_dead(i)
        if waited > self.timeout:
            names = ", ".join(f"rank {self.ranks[i]}" for i in late)
            self.abort(f"{names} did not reach the collective within {self.timeout:g}s "
                       "(stuck, or calling a different collective? raise FLUIDCTL_TIMEOUT if "
                       "it is just slow)")

    def _stop_if_aborted(self) -> None:
        if self._abort[0]:
            self._fail(bytes(self._abort_msg).rstrip(b"\0").decode(errors="replace"))

    def _stop_if_dead(self, i: int) -> None:
        pid = int(self._pids[i])
        if pid and not _pid_alive(pid):
            self.abort(f"rank {self.ranks[i]} (pid {pid}, same node) died during a collective")

    def abort(self, message: str) -> None:
        """Tell every local rank that the group is broken, then raise here too."""
        data = message.encode()[: ABORT_MSG - 1]
        if self._abort is not None and not self._abort[0]:
            self._abort_msg[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            self._abort[0] = 1
            self._waiter.ring()
        self._fail(message)

    def _fail(self, message: str) -> None:
        self.broken = message
        raise CollectiveError(message)

    # --- collectives -------------------------------------------------------------------
    def allreduce(self, flat: np.ndarray, rec: np.ndarray, op: str, zero_input: bool = False,
                  across: Optional[Callable[[np.ndarray, np.ndarray, bool], None]] = None,
                  fast: bool = False) -> None:
        """In-place allreduce of a 1-d contiguous array among the local ranks.

        ``across`` (hierarchical mode, node leader only) is called with the node's reduced
        chunk, the metadata table and whether it is the first chunk; it completes the
        reduction across nodes before the local ranks copy the result out. ``fast``: the
        leaders agree by their ring's headers, so the table holds this node's rows only.
        """
        if self.broken:
            raise CollectiveError(f"the communicator is broken by an earlier error: {self.broken}")
        if across is not None or self.world_size > self.n:
            return self._hierarchical(flat, rec, op, zero_input, across, fast)
        if self._direct is None:
            self._direct = self._probe_direct()
        # ranks whose sizes differ may pick different paths here: both paths begin with the
        # same metadata agreement (_agree), where they all fail together
        if self._direct and flat.nbytes >= DIRECT_MIN:
            return self._direct_allreduce(flat, rec, op, zero_input)
        return self._pipelined(flat, rec, op, zero_input)

    def _start(self, rec: np.ndarray) -> np.ndarray:
        """Publish this rank's metadata record; returns this call's table."""
        table = self.tables[int(rec[meta.SEQ]) % 2]
        table[self.ranks[self.index]] = rec
        return table

    def _agree(self, table: np.ndarray, g: int) -> None:
        """Once every rank published piece ``g`` (IN): the metadata check, the same on every
        rank. On a mismatch every rank leaves its counters at piece ``g`` done and raises."""
        self._wait(IN, g + 1)
        problem = meta.check(table if self._whole else table[self.ranks], True)
        if problem:
            self._ctl[self._mine + RED] = self._ctl[self._mine + OUT] = self._piece = g + 1
            raise CollectiveError(problem)

    def _probe_direct(self) -> bool:
        """Whether every local rank can read every other's memory (process_vm_readv needs
        ptrace rights: same user, and Yama's ptrace_scope 0, or CAP_SYS_PTRACE). Each rank
        publishes the address of a word holding its pid and reads its peers'; the direct path
        is used only if all succeeded, so every rank decides the same."""
        ctl = self._ctl
        allowed = os.environ.get(envs.SHM_DIRECT, "1") != "0"     # a user may switch it off
        word = np.array([os.getpid()], np.int64)
        ctl[self._mine + ADDR] = word.ctypes.data
        self.arrive_and_wait()
        ok = allowed
        for j in self._others if allowed else ():
            got = np.zeros(1, np.int64)
            pid = int(self._pids[j])
            ok = ok and _read_peer(pid, ctl[j * WORDS + ADDR], got) and int(got[0]) == pid
        ctl[self._mine + CAN_READ] = 1 if ok else 2
        self.arrive_and_wait()              # the peers are done reading ``word``
        return all(ctl[j * WORDS + CAN_READ] == 1 for j in range(self.n))

    def _direct_allreduce(self, flat: np.ndarray, rec: np.ndarray, op: str,
                          zero_input: bool) -> None:
        """Reduce this rank's part reading the peers' copies out of their arrays (PIECE bytes
        at a time through a reused buffer, so the reduction reads it from cache), then read
        the other parts' results out of their owners' arrays. A rank stays in the call until
        every peer has finished reading its array."""
        table = self._start(rec)
        ctl, me, g = self._ctl, self.index, self._piece
        ctl[self._mine + ADDR] = flat.ctypes.data
        ctl[self._mine + ZERO] = int(zero_input)
        self._post(IN, g + 1)
        self._agree(table, g)
        raw, dtype = flat.view(np.uint8), flat.dtype
        cuts = [b * flat.itemsize for b in self._bounds(flat.size)]
        ufunc = meta.reducer(op)
        sources = [(j, ctl[j * WORDS + ADDR]) for j in self._others if not ctl[j * WORDS + ZERO]]
        if self._temp is None:
            self._temp = np.empty(PIECE, np.uint8)
        piece = PIECE // flat.itemsize * flat.itemsize
        for lo in range(cuts[me], cuts[me + 1], piece):
            own = raw[lo:lo + min(piece, cuts[me + 1] - lo)]
            empty = zero_input            # ``own`` holds nothing of the result yet
            for j, addr in sources:
                if empty:
                    self._read(j, addr + lo, own)
                    empty = False
                else:
                    temp = self._temp[:own.nbytes]
                    self._read(j, addr + lo, temp)
                    ufunc(own.view(dtype), temp.view(dtype), out=own.view(dtype))
            if empty:                     # every rank contributes zeros
                own[:] = 0
        self._post(RED, g + 1)
        self._wait(RED, g + 1)
        for j in self._others:
            self._read(j, ctl[j * WORDS + ADDR] + cuts[j], raw[cuts[j]:cuts[j + 1]])
        self._post(OUT, g + 1)
        self._piece = g + 1
        self._wait(OUT, g + 1)

    def _read(self, j: int, addr: int, dest: np.ndarray) -> None:
        """Read from local rank ``j``'s memory; its failure breaks the group."""
        if dest.nbytes and not _read_peer(int(self._pids[j]), addr, dest):
            errno = _vm_readv[2]() if _vm_readv else 0
            self._stop_if_aborted()       # the peer gave up first (its array may be gone)
            self._stop_if_dead(j)
            self.abort(f"reading rank {self.ranks[j]}'s array failed: {os.strerror(errno)}")

    def _pipelined(self, flat: np.ndarray, rec: np.ndarray, op: str, zero_input: bool) -> None:
        """Pieces through the ring slots: per piece, each rank copies into its slot the parts
        the others reduce (then counts IN), reduces its own part in place in the caller's
        array and copies it to the result slot (RED), and copies the others' parts out (OUT);
        piece c + 1 is copied in before piece c is copied out.

        Piece g uses ring slot g % RING. Reuse needs no wait of its own with two slots: a
        rank copies piece g + 2 into its input slot after it saw every RED reach g + 1 (the
        readers of piece g are done), and writes result slot g + 2 after every IN reached
        g + 3, which a peer counts only after its copy-out of piece g.
        """
        raw = flat.view(np.uint8)
        total, isz, me, dtype = raw.nbytes, flat.itemsize, self.index, flat.dtype
        piece = max(isz, min(PIECE * max(1, self.n - 1), self._piece_room) // isz * isz)
        count = max(1, -(-total // piece))
        ufunc = meta.reducer(op)
        table = self._start(rec)
        ctl, base, room = self._ctl, self._piece, self._piece_room
        slot, result, others = self.slots[me], self.result, self._others

        def copy_in(c: int):
            """Publish piece c's parts for the others; returns (slot offset, piece, cuts)."""
            part = raw[c * piece:(c + 1) * piece]
            at = (base + c) % RING * room
            cuts = [b * isz for b in self._bounds(part.nbytes // isz)]
            for j in others:
                lo, hi = cuts[j], cuts[j + 1]
                if zero_input:
                    slot[at + lo:at + hi] = 0
                else:
                    slot[at + lo:at + hi] = part[lo:hi]
            self._post(IN, base + c + 1)
            return at, part, cuts

        nxt = copy_in(0)
        self._agree(table, base)
        for c in range(count):
            g = base + c
            at, part, cuts = nxt
            if c:
                self._wait(IN, g + 1)
            lo, hi = cuts[me], cuts[me + 1]
            own = part[lo:hi].view(dtype)
            peers = [self.slots[j][at + lo:at + hi].view(dtype) for j in others]
            if zero_input:
                if peers:
                    np.copyto(own, peers.pop(0))
                else:
                    own[:] = 0
            for peer in peers:
                ufunc(own, peer, out=own)
            result[at + lo:at + hi] = part[lo:hi]
            self._post(RED, g + 1)
            if c + 1 < count:
                nxt = copy_in(c + 1)
            self._wait(RED, g + 1)
            for j in others:
                lo, hi = cuts[j], cuts[j + 1]
                part[lo:hi] = result[at + lo:at + hi]
            self._post(OUT, g + 1)
        self._piece = base + count

    def _hierarchical(self, flat: np.ndarray, rec: np.ndarray, op: str, zero_input: bool,
                      across, fast: bool = False) -> None:
        """Chunk by chunk with barriers: each rank copies into its slot the slices the others
        reduce, reduces its own slice into the result area, the node leader completes the
        chunk across nodes (``across``), then every rank copies the whole chunk out."""
        raw = flat.view(np.uint8)
        total, isz, me = raw.nbytes, flat.itemsize, self.index
        step = max(isz, self.chunk // isz * isz)
        ufunc = meta.reducer(op)
        table = self._start(rec)
        others = self._others
        pos, first = 0, True
        while first or pos < total:
            size = min(step, total - pos)
            part = raw[pos:pos + size]
            cuts = [b * isz for b in self._bounds(size // isz)]
            # 1. publish the slices the other ranks reduce (this rank's own slice stays local)
            mine = self.slots[me]
            for j in others:
                if zero_input:
                    mine[cuts[j]:cuts[j + 1]] = 0
                else:
                    mine[cuts[j]:cuts[j + 1]] = part[cuts[j]:cuts[j + 1]]
            self.arrive_and_wait()
            problem = local = meta.check(table[self.ranks], False) if first else None
            # 2. reduce this rank's slice: own data + every peer's copy of that slice
            if not problem:
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
            self.arrive_and_wait()
            if across is not None:
                try:
                    across(self.result[:size].view(flat.dtype) if not problem else None,
                           table, first)
                except CollectiveError as exc:
                    self.abort(str(exc))
            self.arrive_and_wait()
            if first and (not fast or local):    # fast and local: the leader aborted
                problem = meta.check(table)
                if problem:
                    raise CollectiveError(problem)
            part[:] = self.result[:size]
            pos += size
            first = False

    # --- one piece in the native module ------------------------------------------------
    def piece_bytes(self, itemsize: int) -> int:
        """The pipelined path's piece for items of ``itemsize`` bytes."""
        return max(itemsize, min(PIECE * max(1, self.n - 1), self._piece_room)
                   // itemsize * itemsize)

    def native_limit(self) -> int:
        """Messages below this many bytes take the native pipelined path: every size, unless
        FLUIDCTL_SHM_DIRECT=1 asks for direct reads from DIRECT_MIN on. Measured on a 2-core
        EPYC VM, 2 ranks, float32 sum: 16 MiB in 0.80 ms through the native slots against
        1.47 ms reading the peer's array (process_vm_readv; 2.64 ms without huge pages), 64
        MiB in 4.2 ms against 6.4 ms: the kernel's page walk costs more than the copies. The
        Python path, without the module, still reads directly from DIRECT_MIN on."""
        if os.environ.get(envs.SHM_DIRECT) == "1" and self._direct is not False:
            return DIRECT_MIN
        return 1 << 62

    def small(self, x, rec_addr: int, seq: int, code: int, op: int, zero: bool,
              piece: int) -> bool:
        """The pipelined path run by _fastshm.c with the same slots, counters and metadata
        table. ``rec_addr``: this call's record (its SEQ is ``seq``); ``code``: the dtype's
        char as a number; ``op``: meta.OPS' index of the reduction; ``piece``: piece_bytes().
        False, with nothing done, when ``x`` is not a writable contiguous array."""
        if self.broken:
            raise CollectiveError(f"the communicator is broken by an earlier error: {self.broken}")
        if self._direct is None:
            self._direct = self._probe_direct()
        g = self._piece
        status = self._step(self._native, x, rec_addr, seq, g, code, op, zero, 0, SLICE_NS,
                            piece)
        if status == 0:
            self._piece = g + max(1, -(-x.nbytes // piece))
            return True
        return self._small_slow(x, rec_addr, seq, g, code, op, zero, piece, status)

    def _small_slow(self, x, rec_addr, seq, g, code, op, zero, piece, status) -> bool:
        """A native step that did not finish at once: wait on with the liveness checks,
        explain a metadata mismatch as the Python path does, or hand the call back."""
        start = time.perf_counter()
        while True:
            outcome, resume = status & 7, status >> 3
            if outcome == _fastshm_FALLBACK:
                return False
            if outcome == shmwait.REACHED:
                self._piece = g + max(1, -(-x.nbytes // piece))
                return True
            if outcome == _fastshm_MISMATCH:
                table = self.tables[seq % 2]
                problem = meta.check(table if self._whole else table[self.ranks], True)
                self._ctl[self._mine + RED] = self._ctl[self._mine + OUT] = self._piece = g + 1
                raise CollectiveError(problem or "the ranks' collective calls differ")
            self._stop_if_aborted()
            at = g + (resume >> 2) + 1                  # the piece it waits for
            self._check_peers(IN if resume & 3 == 1 else RED, at, time.perf_counter() - start)
            status = self._step(self._native, x, rec_addr, seq, g, code, op, zero, resume,
                                SLICE_NS, piece)

    def _bounds(self, count: int) -> List[int]:
        """Element offsets of each local rank's slice, cut at whole cache lines."""
        per = -(-count // self.n)
        per = -(-per // 16) * 16
        return [min(count, i * per) for i in range(self.n + 1)]
