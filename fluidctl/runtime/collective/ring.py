"""Ring allreduce over TCP, for ranks on different nodes (or node leaders, hierarchically).

Each member connects to the next one (through ``wire``: HMAC handshake with the job token, then a
hello frame naming its rank) and accepts one connection from the previous one. An allreduce is
the classic reduce-scatter then allgather, 2(n-1) steps, each moving 1/n of the data. Every
segment is cut into pieces and the steps are pipelined: a sender thread streams pieces from a
queue (``sendall`` on memoryviews, no copies, GIL released) while the caller receives the
matching piece with ``recv_into`` and reduces it, then queues it for the next hop.

The metadata records (see ``meta``) go round first in small wire frames, so a mismatch is
reported on every rank before any data moves. A peer that dies shows up as a closed connection
or a timeout, reported with its rank and endpoint; the ring is then closed so the failure reaches
the other members instead of leaving them waiting.
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
from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

log = logging.getLogger("fluidctl.ring")

PIECE = 512 << 10                 # pipelining granularity
SOCKBUF = 4 << 20
DIRECT_SEND = 64 << 10            # below this the kernel buffers it all: send inline


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
                 token: Optional[str], timeout: float):
        self.members, self.index, self.n = list(members), index, len(members)
        self.timeout = timeout
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
        message = (f"rank {self.rank}: {what} with rank {rank} at {endpoint} during a collective "
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

    def allreduce(self, flat: np.ndarray, op: str) -> None:
        """In-place allreduce of a 1-d contiguous array (metadata already agreed)."""
        if self.broken:
            raise CollectiveError(f"the communicator is broken by an earlier error: {self.broken}")
        n, r = self.n, self.index
        if n == 1 or flat.size == 0:
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
        for lo, hi in pieces[r]:
            send(memoryview(flat[lo:hi]).cast("B"))
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
