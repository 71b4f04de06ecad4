"""The rendezvous store's server: one event loop for every connection, not a thread each.

``wire.Acceptor`` authenticates new peers (HMAC over the job token) on its own selector
thread and hands each one here; from then on one selector thread reads every request, answers
at once or parks it, and writes replies without blocking. Nothing a client asks for grows with
the world: a request header is at most ``MAX_REQUEST`` bytes, a barrier is a counter (one
request per rank, O(1) in size, answered when the last rank arrives), the record exchange is a
``join`` whose layout is computed once (``rendezvous.Layout``) and answered per node, and a
wait is parked on the keys it misses and woken only by those keys, never by every ``set``.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import resource
import selectors
import socket
import threading
import time
from collections import deque
from typing import Dict, List, Optional

from fluidctl.runtime import rendezvous, wire

log = logging.getLogger("fluidctl.store")

MAX_VALUE = 64 << 20        # store values are small: addresses, ids, metadata
MAX_REQUEST = 64 << 10      # a request header: keys, counters, one node's records
MAX_NAMED = 64              # absent ranks/keys named in a timeout reply (and how many in all)
_READ = 256 << 10


def raise_nofile() -> int:
    """Raise this process's descriptor limit to its hard limit (a store holds one per rank)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


def listen(host: str, port: int, fallback_to_any: bool = True) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    from fluidctl.net import bind_socket
    try:
        sock = bind_socket(host, port)
    except OSError:
        if not fallback_to_any or host in ("", "0.0.0.0"):
            raise
        sock = bind_socket("", port)   # the master name may not be a local address (NAT, alias)
    sock.listen(max(4096, socket.SOMAXCONN))   # a node's or a job's connect storm
    return sock

class _Conn:
    __slots__ = ("sock", "addr", "inbuf", "out", "parked")

    def __init__(self, sock, addr):
        self.sock, self.addr = sock, addr
        self.inbuf = bytearray()
        self.out: deque = deque()
        self.parked = None                 # the request waiting for an answer, if any


class _Wait:
    """A parked request: answered by ``answer`` once, by its condition or its deadline."""
    __slots__ = ("conn", "done", "left", "keys", "fetch", "any", "on_timeout")

    def __init__(self, conn, on_timeout):
        self.conn, self.on_timeout, self.done = conn, on_timeout, False
        self.left, self.keys, self.fetch, self.any = 0, (), False, False


class _Barrier:
    __slots__ = ("n", "ranks", "arrived", "waits")

    def __init__(self, n: int, ranks):
        self.n, self.ranks, self.arrived, self.waits = n, ranks, set(), []


class _Group:
    __slots__ = ("n", "records", "waits", "layout", "frames")

    def __init__(self, n: int):
        self.n, self.records, self.waits = n, {}, []
        self.layout: Optional[rendezvous.Layout] = None
        self.frames: Dict[int, bytes] = {}           # node -> its reply, built once


def _named(total, absent) -> dict:
    """The first few absent names and how many in all (a reply bounded whatever N is)."""
    first = list(itertools.islice(absent, MAX_NAMED))
    return {"ok": False, "missing": first, "missing_count": max(total, len(first))}


class StoreServer:
    """Serve the store on ``host:port``. ``members``: how many processes will connect (the
    world size): the Acceptor's caps on unauthenticated connections are sized for it, so a
    whole node, or a whole job from one address, connecting at once loses none."""

    def __init__(self, host: str, port: int, token: Optional[str], members: int = 0):
        if not token:
            raise ValueError("the rendezvous store needs a job token (FLUIDCTL_JOB_TOKEN)")
        raise_nofile()
        self.token = token
        self._data: Dict[str, bytes] = {}
        self._watch: Dict[str, List[_Wait]] = {}
        self._barriers: Dict[str, _Barrier] = {}
        self._groups: Dict[str, _Group] = {}
        self._timers: list = []
        self._seq = itertools.count()
        self.requests: Dict[object, int] = {}      # op -> requests served (what a job costs)
        self._conns: Dict[int, _Conn] = {}
        self._incoming: deque = deque()
        self._idle = threading.Condition()
        self._active = 0
        self._closed = False
        self._drop_log = wire.DropLog(log, "store: dropping", prefix="store: ")
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sock = listen(host, port)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="fluidctl-store", daemon=True)
        self._thread.start()
        cap = max(wire.MAX_PENDING, 2 * members + wire.MAX_PENDING)
        self._acceptor = wire.Acceptor(
            [self._sock], token, self._on_peer, self._on_drop, name="fluidctl-store-accept",
            max_pending=cap, max_pending_per_peer=max(wire.MAX_PENDING_PER_PEER, members + 8),
        ).start()

    # --- life cycle ----------------------------------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """Wait until no client is connected (others have read their answers), up to timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._active and time.monotonic() < deadline:
                self._idle.wait(max(0.0, min(0.5, deadline - time.monotonic())))
            return not self._active

    def close(self) -> None:
        self._closed = True
        self._acceptor.close()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._drop_log.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _on_drop(self, addr, why) -> None:
        self._drop_log(f"{addr[0]}:{addr[1]}", why)     # rate-limited

    def _on_peer(self, sock: socket.socket, addr) -> None:
        """From the Acceptor's thread: an authenticated peer, for the loop to serve."""
        with self._idle:
            self._active += 1
        self._incoming.append((sock, addr))
        self._wake()

    # --- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                timeout = None
                if self._timers:
                    timeout = max(0.0, self._timers[0][0] - time.monotonic())
                for key, events in self._sel.select(timeout):
                    if key.data is None:
                        self._wake_r.recv(4096)
                        self._adopt()
                    elif events & selectors.EVENT_READ:
                        self._read(key.data)
                    if key.data is not None and events & selectors.EVENT_WRITE:
                        self._flush(key.data)
                self._expire()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn, None)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _adopt(self) -> None:
        while self._incoming:
            sock, addr = self._incoming.popleft()
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
                conn = _Conn(sock, addr)
                self._conns[sock.fileno()] = conn
                self._sel.register(sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError) as exc:
                self._gone(sock, addr, exc)

    def _gone(self, sock, addr, why) -> None:
        sock.close()
        if why is not None:
            self._drop_log(f"{addr[0]}:{addr[1]}", why)
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    def _drop(self, conn: _Conn, why) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        if conn.parked is not None:
            conn.parked.done = True
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._gone(conn.sock, conn.addr, why)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._drop(conn, exc)
        if not chunk:
            return self._drop(conn, None)
        conn.inbuf += chunk
        self._serve(conn)

    def _serve(self, conn: _Conn) -> None:
        """Answer the complete requests in ``conn``'s buffer, one at a time."""
        buf = conn.inbuf
        while conn.parked is None and len(buf) >= wire.PREFIX.size:
            try:
                head_len, size = wire.parse_prefix(bytes(buf[:wire.PREFIX.size]),
                                                   MAX_REQUEST, MAX_VALUE)
                end = wire.PREFIX.size + head_len + size
                if len(buf) < end:
                    return
                header = wire.parse_header(bytes(buf[wire.PREFIX.size:wire.PREFIX.size
                                                     + head_len]))
            except wire.WireError as exc:
                return self._drop(conn, exc)
            payload = bytes(buf[end - size:end])
            del buf[:end]
            try:
                reply = self._handle(conn, header, payload)
            except (TypeError, ValueError, OverflowError, AttributeError, LookupError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            if reply is not None:
                self._send(conn, reply if isinstance(reply, bytes) else _frame(reply))

    def _send(self, conn: _Conn, frame: bytes) -> None:
        conn.out.append(memoryview(frame))
        if len(conn.out) == 1:
            self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.out:
                head = conn.out[0]
                sent = conn.sock.send(head)
                if sent < len(head):
                    conn.out[0] = head[sent:]
                    break
                conn.out.popleft()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            return self._drop(conn, exc)
        if conn.sock.fileno() in self._conns:
            self._sel.modify(conn.sock, selectors.EVENT_READ
                             | (selectors.EVENT_WRITE if conn.out else 0), conn)

    def _answer(self, wait: _Wait, reply) -> None:
        """Answer a parked request, then go on with what its client sent after it."""
        if wait.done:
            return
        wait.done = True
        conn = wait.conn
        conn.parked = None
        if conn.sock.fileno() in self._conns and self._conns[conn.sock.fileno()] is conn:
            self._send(conn, reply if isinstance(reply, bytes) else _frame(reply))
            self._serve(conn)

    def _park(self, conn: _Conn, timeout, on_timeout) -> _Wait:
        wait = _Wait(conn, on_timeout)
        conn.parked = wait
        heapq.heappush(self._timers, (time.monotonic() + max(0.0, float(timeout)),
                                      next(self._seq), wait))
        return wait

    def _expire(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            wait = heapq.heappop(self._timers)[2]
            if not wait.done:
                self._answer(wait, wait.on_timeout())

    # --- requests ------------------------------------------------------------------------
    def _handle(self, conn: _Conn, header: dict, payload: bytes):
        op, key = header.get("op"), header.get("key")
        self.requests[op] = self.requests.get(op, 0) + 1
        if op == "set" and isinstance(key, str):
            self._data[key] = payload
            self._woke(key)
            return {"ok": True}
        if op == "add" and isinstance(key, str) and isinstance(header.get("n"), int):
            value = int(self._data.get(key, b"0")) + header["n"]
            self._data[key] = str(value).encode()
            self._woke(key)
            return {"ok": True, "value": value}
        if op == "wait" and isinstance(header.get("keys"), list):
            return self._wait(conn, header)
        if op == "barrier" and isinstance(key, str):
            return self._barrier(conn, key, header)
        if op == "join" and isinstance(key, str):
            return self._join(conn, key, header)
        if op == "delete" and isinstance(key, str):
            return {"ok": True, "existed": self._data.pop(key, None) is not None}
        return {"ok": False, "error": f"bad request {op!r}"}

    def _woke(self, key: str) -> None:
        for wait in self._watch.pop(key, ()):
            if not wait.done:
                wait.left -= 1
                if wait.left <= 0 or wait.any:
                    self._answer(wait, self._present(wait.keys, wait.fetch))

    def _present(self, keys, fetch: bool):
        if not fetch:
            return {"ok": True}
        values = [self._data.get(k, b"") for k in keys]
        return _frame({"ok": True, "sizes": [len(v) for v in values],
                       "present": [k in self._data for k in keys]}, b"".join(values))

    def _wait(self, conn: _Conn, header: dict):
        keys = [k for k in header["keys"] if isinstance(k, str)]
        timeout = float(header.get("timeout") or 0)
        missing = [k for k in keys if k not in self._data]
        wait_any = bool(header.get("any"))
        if not missing or (wait_any and len(missing) < len(keys)):
            return self._present(keys, bool(header.get("fetch")))

        def timed_out():
            absent = [k for k in keys if k not in self._data]
            return _named(len(absent), absent)
        wait = self._park(conn, timeout, timed_out)
        wait.keys, wait.fetch, wait.any = keys, bool(header.get("fetch")), wait_any
        wait.left = len(set(missing))
        for k in set(missing):
            self._watch.setdefault(k, []).append(wait)
        return None

    def _barrier(self, conn: _Conn, name: str, header: dict):
        """A counter: each rank arrives once; all are answered when the last one does."""
        rank, n, ranks = header.get("rank"), header.get("n"), header.get("ranks")
        if not isinstance(rank, int) or not isinstance(n, int) or n <= 0:
            raise ValueError("a barrier needs an integer rank and member count")
        if ranks is not None and (not isinstance(ranks, list) or len(ranks) != n):
            raise ValueError("a barrier's rank list must hold its member count")
        bar = self._barriers.get(name)
        if bar is None:
            bar = self._barriers[name] = _Barrier(n, ranks)
        elif bar.n != n:
            raise ValueError(f"barrier {name!r} has {bar.n} members, this rank says {n}")
        if header.get("peek"):                      # who is still absent (no arrival)
            return {"ok": True} if len(bar.arrived) >= bar.n else self._absent(bar)
        bar.arrived.add(rank)
        if len(bar.arrived) >= bar.n:
            waits, bar.waits = bar.waits, []
            for wait in waits:
                self._answer(wait, {"ok": True})
            return {"ok": True}

        bar.waits.append(self._park(conn, header.get("timeout") or 0,
                                    lambda: self._absent(bar)))
        return None

    @staticmethod
    def _absent(bar: _Barrier) -> dict:
        members = bar.ranks if bar.ranks is not None else range(bar.n)
        return _named(bar.n - len(bar.arrived), (r for r in members if r not in bar.arrived))

    def _join(self, conn: _Conn, key: str, header: dict):
        """Records in; once the world is complete, every member gets its node's view."""
        n, records = header.get("n"), header.get("records")
        if not isinstance(n, int) or n <= 0 or not isinstance(records, list) or not records:
            raise ValueError("a join needs the world size and this member's records")
        group = self._groups.get(key)
        if header.get("read"):                       # only read a finished layout again
            if group is None or group.layout is None:
                raise ValueError(f"no layout {key!r} yet")
            return self._views(group, [r.get("rank") for r in records])
        if group is None:
            group = self._groups[key] = _Group(n)
        elif group.n != n:
            raise ValueError(f"{key!r} is a world of {group.n}, this member says {n}")
        mine = []
        for rec in records:
            rank, rec = rendezvous.check_record(rec)
            if rank >= n:
                raise ValueError(f"rank {rank} is outside a world of {n}")
            if group.layout is None:
                group.records[rank] = rec
            mine.append(rank)
        if header.get("more") and group.layout is None:
            return _frame({"ok": True, "views": []})    # more of this member's records follow
        if group.layout is not None:                 # joined already: read the layout again
            return self._views(group, mine)
        if len(group.records) < n:
            def timed_out():
                return _named(n - len(group.records),
                              (r for r in range(n) if r not in group.records))
            wait = self._park(conn, header.get("timeout") or 0, timed_out)
            wait.keys = mine
            group.waits.append(wait)
            return None
        group.layout = rendezvous.Layout(n, group.records)
        waits, group.waits = group.waits, []
        for wait in waits:
            self._answer(wait, self._views(group, wait.keys))
        return self._views(group, mine)

    def _views(self, group: _Group, ranks: List[int]) -> bytes:
        nodes = list(dict.fromkeys(group.layout.node_of[r] for r in ranks))
        if len(nodes) == 1:
            frame = group.frames.get(nodes[0])
            if frame is None:
                frame = group.frames[nodes[0]] = _frame(
                    {"ok": True, "views": [group.layout.view(ranks[0])]})
            return frame
        return _frame({"ok": True, "views": [group.layout.view(group.layout.node_ranks[i][0])
                                             for i in nodes]})


def _frame(reply: dict, payload: bytes = b"") -> bytes:
    return wire.pack_frame(reply, payload)
