"""Ring allreduce over TCP, for ranks on different nodes (or node leaders, hierarchically).

Each member connects to the next one (through ``wire``: HMAC handshake with the job token, then a
hello frame naming its rank) and accepts one connection from the previous one. An allreduce is
the classic reduce-scatter then allgather, 2(n-1) steps, each moving 1/n of the data. Every
segment is cut into pieces and the steps are pipelined: a sender thread streams pieces from a
queue (``sendall`` on memoryviews, no copies, GIL released) while the caller receives the
matching piece with ``recv_into`` and reduces it, then queues it for the next hop.

Every call starts with a fixed 104-byte header to the next member: a mode word and the call's
metadata record (see ``meta``). The first use of a call's signature is agreed in full (mode
FULL): the records go round in small wire frames, so a mismatch is reported on every rank, in
the same words, before any data moves, and the ring stays usable. After that (mode FAST) the
header rides in front of the call's data and each member compares its predecessor's header with
its own: if every neighbour agrees, all do, so a call costs the same in a ring of 3 and of 3,000.
A member that finds a difference posts it as the job's error (``posted``) and closes the ring.

A peer that dies shows up as a closed connection or a timeout, reported with its rank and
endpoint (or as the error a member posted, when there is one); the ring is then closed so the
failure reaches the other members instead of leaving them waiting.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

from fluidctl.diagnostics import stragglers
from fluidctl.runtime import store, wire
from fluidctl.runtime.collective import meta, posted
from fluidctl.runtime.collective.meta import CollectiveError

log = logging.getLogger("fluidctl.ring")

PIECE = 512 << 10                 # pipelining granularity
SOCKBUF = 4 << 20
DIRECT_SEND = 64 << 10            # below this the kernel buffers it all: send inline
FULL = 0x4C4C5546                 # a header's mode word: "FULL", the records go round next
FAST = 0x54534146                 # "FAST": the call's data follows


def listen(endpoint: str) -> socket.socket:
    """Bind this rank's own endpoint (PADDLE_CURRENT_ENDPOINT) before anyone connects to it."""
    host, _, port = endpoint.rpartition(":")
    return store.listen(host.strip("[]"), int(port), fallback_to_any=False)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKBUF)


class Ring:
    """``members`` = [(global rank, endpoint)] in ring order; this process is ``members[index]``."""

    def __init__(self, members: Sequence[Tuple[int, str]], index: int, listener: socket.socket,
                 token: Optional[str], timeout: float, store=None):
        self.members, self.index, self.n = list(members), index, len(members)
        self.timeout = timeout
        self.store = store              # where a member's error is posted for all (posted.py)
        self._mine = np.zeros(1 + meta.RECORD, np.int64)       # this call's header
        self._theirs = np.zeros(1 + meta.RECORD, np.int64)     # the predecessor's
        self.rank = members[index][0]
        self.next_rank, self.next_ep = members[(index + 1) % self.n]
        self.prev_rank, self.prev_ep = members[(index - 1) % self.n]
        self.broken: Optional[str] = None
        deadline = time.monotonic() + timeout
        accepted: List[socket.socket] = []
        acceptor = threading.Thread(target=self._accept, args=(listener, token, deadline,
                                                               accepted), daemon=True)
        acceptor.start()
        self.send_sock = self._connect(token, deadline)
        acceptor.join(max(0.0, deadline - time.monotonic()) + 1)
        listener.close()
        if not accepted:
            self.send_sock.close()
            raise CollectiveError(
                f"rank {self.rank}: rank {self.prev_rank} ({self.prev_ep}) did not connect "
                f"within {timeout:g}s (did it start? is the port reachable from its node?)")
        self.recv_sock = accepted[0]
        for sock in (self.send_sock, self.recv_sock):
            _tune(sock)
            sock.settimeout(timeout)
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._send_error: Optional[BaseException] = None
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="fluidctl-ring-send")
        self._sender.start()

    # --- set-up ----------------------------------------------------------------------
    def _connect(self, token, deadline) -> socket.socket:
        delay, last = 0.01, None
        while time.monotonic() < deadline:
            try:
                sock = wire.connect(self.next_ep, token,
                                    timeout=max(0.1, min(10.0, deadline - time.monotonic())))
                wire.send_frame(sock, {"op": "ring", "rank": self.rank})
                return sock
            except (OSError, wire.WireError) as exc:
                last = exc
            time.sleep(delay)
            delay = min(2 * delay, 0.5)
        raise CollectiveError(f"rank {self.rank}: could not connect to rank {self.next_rank} at "
                              f"{self.next_ep} within {self.timeout:g}s ({last}); did it start?")

    def _accept(self, listener, token, deadline, accepted) -> None:
        while time.monotonic() < deadline:
            listener.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                conn, addr = listener.accept()
            except OSError:
                return
            try:
                wire.server_handshake(conn, token)
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                hello, _ = wire.recv_frame(conn, max_payload=0)
                if hello.get("op") == "ring" and hello.get("rank") == self.prev_rank:
                    accepted.append(conn)
                    return
                raise wire.WireError(f"unexpected hello {hello!r}")
            except (OSError, wire.WireError) as exc:
                log.warning("ring: dropping connection from %s:%s: %s", addr[0], addr[1], exc)
                conn.close()

    def close(self) -> None:
        if getattr(self, "_sender", None) is not None:
            self._queue.put(None)
        for sock in (getattr(self, "send_sock", None), getattr(self, "recv_sock", None)):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    # --- data movement ---------------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._send_error is None:
                try:
                    self.send_sock.sendall(item)
                except BaseException as exc:  # noqa: BLE001 - reported by the caller
                    self._send_error = exc

    def _flush(self) -> None:
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(self.timeout + 1) or self._send_error is not None:
            self._lost(self._send_error or socket.timeout(), self.next_rank, self.next_ep)

    def _lost(self, exc, rank, endpoint):
        what = ("timed out" if isinstance(exc, socket.timeout)
                else f"lost the connection ({exc})")
        message = posted.read(self.store) or (
            f"rank {self.rank}: {what} with rank {rank} at {endpoint} during a collective "
            f"(did it die? check its log; timeout {self.timeout:g}s)")
        self.broken = message
        self.close()
        raise CollectiveError(message)

    def _recv_into(self, view: memoryview) -> None:
        """The piece from the previous member. Once its first bytes came, the rest takes what
        the link takes: that time is the rank's link time (stragglers.LINK)."""
        try:
            got = self.recv_sock.recv_into(view)
            if got == 0:
                raise wire.PeerClosed("connection closed by peer")
            if got < view.nbytes:
                began = stragglers.clock()
                wire.recv_exact_into(self.recv_sock, view[got:])
                stragglers.add(stragglers.LINK, stragglers.clock() - began)
        except (OSError, wire.WireError) as exc:
            self._lost(exc, self.prev_rank, self.prev_ep)

    # --- agreeing on each call ---------------------------------------------------------
    def header(self, fast: bool, rec: np.ndarray) -> np.ndarray:
        """This call's header: the mode word, then the record."""
        mine = self._mine
        mine[0] = FAST if fast else FULL
        mine[1:] = rec
        return mine

    def _recv_header(self) -> np.ndarray:
        theirs = self._theirs
        try:
            wire.recv_exact_into(self.recv_sock, memoryview(theirs).cast("B"))
        except (OSError, wire.WireError) as exc:
            self._lost(exc, self.prev_rank, self.prev_ep)
        return theirs

    def _compare(self, mine: np.ndarray, theirs: np.ndarray) -> None:
        """Go on when the predecessor's header is this member's (or both agree in full, which
        names any difference on every rank); else fail the job with the difference."""
        if mine[0] == FULL and theirs[0] == FULL:
            return
        if mine.tobytes() != theirs.tobytes():
            self.fail(self._difference(mine, theirs))

    def _difference(self, mine: np.ndarray, theirs: np.ndarray) -> str:
        if theirs[0] not in (FULL, FAST):
            return (f"rank {self.rank}: rank {self.prev_rank} ({self.prev_ep}) sent something "
                    "that is not a collective call's header")
        table = np.stack([theirs[1:], mine[1:]])
        what = meta.check(table, False, [self.prev_rank, self.rank])
        if what is None:
            seq = int(min(mine[1 + meta.SEQ], theirs[1 + meta.SEQ]))
            what = (f"{meta.DIVERGED} at collective #{seq}: rank {self.prev_rank} and rank "
                    f"{self.rank} had not made the same calls before it")
        return f"{what} (the communicator is closed; restart the job)"

    def exchange_header(self, mine: np.ndarray) -> None:
        """The header alone: before the records go round in full, or for a call with no data."""
        self._send_inline(memoryview(mine).cast("B"))
        self._compare(mine, self._recv_header())

    def fail(self, message: str) -> None:
        """A fault only this member sees: post it as the job's error (the first posted stands),
        close the ring so the other members stop and read it, and raise it."""
        message = posted.post(self.store, message)
        self.broken = message
        self.close()
        raise CollectiveError(message)

    def gather_meta(self, table: np.ndarray, my_rows: List[int]) -> None:
        """Ring-allgather the metadata rows ``my_rows`` of ``table`` so every member has all."""
        outgoing = [[r] + table[r].tolist() for r in my_rows]
        for _ in range(self.n - 1):
            try:
                wire.send_frame(self.send_sock, {"op": "meta", "rows": outgoing})
            except OSError as exc:
                self._lost(exc, self.next_rank, self.next_ep)
            try:
                header, _ = wire.recv_frame(self.recv_sock, max_payload=0)
            except (OSError, wire.WireError) as exc:
                self._lost(exc, self.prev_rank, self.prev_ep)
            outgoing = header.get("rows", [])
            for row in outgoing:
                table[row[0]] = row[1:]

    def allreduce(self, flat: np.ndarray, op: str, header: Optional[np.ndarray] = None) -> None:
        """In-place allreduce of a 1-d contiguous array: its metadata agreed already, or in
        ``header`` (FAST), sent ahead of the data and compared before any data is reduced."""
        if self.broken:
            raise CollectiveError(f"the communicator is broken by an earlier error: {self.broken}")
        n, r = self.n, self.index
        if n == 1:
            return
        if flat.size == 0:
            if header is not None:
                self.exchange_header(header)
            return
        ufunc = meta.reducer(op)
        bounds = [flat.size * i // n for i in range(n + 1)]
        per_piece = max(1, PIECE // flat.itemsize)
        pieces = [[(lo, min(lo + per_piece, bounds[s + 1]))
                   for lo in range(bounds[s], bounds[s + 1], per_piece)] for s in range(n)]
        tmp = np.empty(min(per_piece, max(bounds[s + 1] - bounds[s] for s in range(n))),
                       dtype=flat.dtype)
        inline = flat.nbytes <= DIRECT_SEND
        send = self._send_inline if inline else self._queue.put
        if header is not None:           # the queue is empty: the last call flushed it
            self._send_inline(memoryview(header).cast("B"))
        for lo, hi in pieces[r]:
            send(memoryview(flat[lo:hi]).cast("B"))
        if header is not None:
            self._compare(header, self._recv_header())
        steps = 2 * (n - 1)
        for step in range(steps):
            reducing = step < n - 1
            seg = (r - step - 1) % n if reducing else (r - (step - (n - 1))) % n
            for lo, hi in pieces[seg]:
                if reducing:
                    part = tmp[: hi - lo]
                    self._recv_into(memoryview(part).cast("B"))
                    ufunc(flat[lo:hi], part, out=flat[lo:hi])
                else:
                    self._recv_into(memoryview(flat[lo:hi]).cast("B"))
                if step < steps - 1:
                    send(memoryview(flat[lo:hi]).cast("B"))
        if not inline:
            self._flush()

    def _send_inline(self, view: memoryview) -> None:
        try:
            self.send_sock.sendall(view)
        except OSError as exc:
            self._lost(exc, self.next_rank, self.next_ep)
