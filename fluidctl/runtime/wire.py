"""Framing and authentication for every fluidctl TCP connection (rendezvous store, ring
collectives, parameter servers).

A frame is a 16-byte prefix, a msgpack header (never pickle: the peer is not trusted to run code
here) and raw payload bytes:

    magic b"FL" | version u8 | flags u8 | header_len u32 | payload_len u64 | header | payload

Payload buffers (numpy arrays, memoryviews) are sent with ``sendmsg`` scatter-gather, so they
are not copied into a joined bytes object, and received with ``recv_into`` either into a fresh
buffer or straight into the caller's arrays. Lengths are checked against limits before any
allocation, so a garbage or hostile frame costs the server one dropped connection.

Every connection starts with a mutual HMAC-SHA256 challenge over the per-job token
(``FLUIDCTL_JOB_TOKEN``); a peer without the token never gets a frame processed. No server runs
without a token. Before a peer has authenticated it costs the server little and only for a
while: the whole handshake has one absolute deadline, its frames may hold at most
``PREAUTH_MAX_HEADER`` bytes, and ``Acceptor`` runs every pending handshake of a server from one
thread (no thread per unauthenticated connection) with a cap per server and per peer address;
at the cap the oldest handshake of the busiest address makes room, instead of anything growing.
"""
from __future__ import annotations

import os
import socket
import selectors
import struct
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import msgpack

from fluidctl import envs

if TYPE_CHECKING:
    import logging

MAGIC = b"FL"
VERSION = 1
PREFIX = struct.Struct(">2sBBIQ")
MAX_HEADER = 1 << 20                                   # 1 MiB of msgpack is plenty
MAX_PAYLOAD = envs.knob(envs.MAX_FRAME)                # 4 GiB
HANDSHAKE_TIMEOUT = envs.knob(envs.HANDSHAKE_TIMEOUT)  # whole handshake, 10 s
DROP_LOG_INTERVAL = envs.knob(envs.DROP_LOG_INTERVAL)
DROP_LOG_FIRST = 5                                     # drops logged one by one per burst
PREAUTH_MAX_HEADER = 256                               # an auth reply is ~90 bytes of msgpack
MAX_PENDING = 128                                      # unauthenticated connections per server
MAX_PENDING_PER_PEER = 8                               # ... and per peer address
ACCEPT_BITE = 1024                                     # connections accepted per wake-up
_NONCE = 32


class WireError(ConnectionError):
    """The peer sent something that is not a valid frame, or failed authentication."""


class PeerClosed(WireError):
    """The peer closed the connection (at a frame boundary this is a normal goodbye)."""


class AuthError(WireError):
    """The peer does not hold the job token: retrying will not help."""


def _as_bytes_view(buf) -> memoryview:
    view = memoryview(buf)
    if not view.contiguous:
        raise ValueError("wire buffers must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def send_frame(sock: socket.socket, header: dict, buffers: Sequence = ()) -> None:
    """Send one frame; ``buffers`` (arrays or bytes-likes) are concatenated as the payload."""
    head = msgpack.packb(header, use_bin_type=True)
    views = [_as_bytes_view(b) for b in buffers]
    payload_len = sum(v.nbytes for v in views)
    parts: List[memoryview] = [memoryview(PREFIX.pack(MAGIC, VERSION, 0, len(head), payload_len)
                                          + head)]
    parts.extend(v for v in views if v.nbytes)
    _sendall_parts(sock, parts)


def _sendall_parts(sock: socket.socket, parts: List[memoryview]) -> None:
    while parts:
        sent = sock.sendmsg(parts[:64])
        while sent:
            first = parts[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                parts.pop(0)
            else:
                parts[0] = first[sent:]
                sent = 0


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    view = _as_bytes_view(view)
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed("connection closed by peer")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return buf


def pack_frame(header: dict, payload: bytes = b"") -> bytes:
    """One whole frame as bytes (for event-loop servers that queue their replies)."""
    head = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(MAGIC, VERSION, 0, len(head), len(payload)) + head + payload


def parse_prefix(prefix, max_header: int = MAX_HEADER,
                 max_payload: int = MAX_PAYLOAD) -> Tuple[int, int]:
    """Check a frame's 16-byte prefix against the limits; return (header_len, payload_len)."""
    magic, version, _flags, head_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"not a fluidctl frame (magic {bytes(magic)!r})")
    if version != VERSION:
        raise WireError(f"wire version {version}, this side speaks {VERSION} "
                        "(run the same fluidctl version everywhere)")
    if head_len > max_header or payload_len > max_payload:
        raise WireError(f"frame too large (header {head_len} B, payload {payload_len} B)")
    return head_len, payload_len


def parse_header(head) -> dict:
    try:
        header = msgpack.unpackb(head, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"undecodable frame header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("frame header is not a map")
    return header


def recv_header(sock: socket.socket, max_payload: int = MAX_PAYLOAD) -> Tuple[dict, int]:
    """Read prefix and header; return (header, payload_len). The payload is still unread."""
    head_len, payload_len = parse_prefix(recv_exact(sock, PREFIX.size), MAX_HEADER, max_payload)
    return parse_header(recv_exact(sock, head_len)), payload_len


def recv_frame(sock: socket.socket, max_payload: int = MAX_PAYLOAD) -> Tuple[dict, memoryview]:
    """Read one frame; the payload arrives in a fresh buffer (one copy, from the kernel)."""
    header, n = recv_header(sock, max_payload)
    payload = bytearray(n)
    if n:
        recv_exact_into(sock, memoryview(payload))
    return header, memoryview(payload)


def drain(sock: socket.socket, n: int) -> None:
    chunk = bytearray(min(n, 1 << 20) or 1)
    while n:
        k = sock.recv_into(chunk, min(n, len(chunk)))
        if k == 0:
            raise PeerClosed("connection closed by peer")
        n -= k


# --- authentication -------------------------------------------------------------------------

def _key(token: Optional[str]) -> bytes:
    return (token or "").encode()


def _mac(token: Optional[str], *parts: bytes) -> bytes:
    import hashlib          # here, not at import: OpenSSL's load (3 ms) is on a node agent's
    import hmac             # path to its ranks, and the agent authenticates only later
    return hmac.new(_key(token), b"".join(parts), hashlib.sha256).digest()


def _same(a: bytes, b: bytes) -> bool:
    """hmac.compare_digest (constant time)."""
    import hmac
    return hmac.compare_digest(a, b)


def _check_token(token: Optional[str]) -> None:
    if not token:
        raise AuthError("no job token: a fluidctl server never serves without one "
                        "(set FLUIDCTL_JOB_TOKEN or pass --token-file)")


def _hello(server_nonce: bytes) -> bytes:
    head = msgpack.packb({"op": "hello", "v": VERSION, "nonce": server_nonce}, use_bin_type=True)
    return PREFIX.pack(MAGIC, VERSION, 0, len(head), 0) + head


def _preauth_prefix(prefix: bytes) -> int:
    """Check the prefix of a pre-authentication frame; return its header length."""
    magic, version, _flags, head_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"not a fluidctl frame (magic {bytes(magic)!r})")
    if version != VERSION:
        raise WireError(f"wire version {version}, this side speaks {VERSION} "
                        "(run the same fluidctl version everywhere)")
    if head_len > PREAUTH_MAX_HEADER or payload_len:
        raise WireError(f"oversized frame before authentication (header {head_len} B, "
                        f"payload {payload_len} B)")
    return head_len


def _check_auth(token: str, server_nonce: bytes, head: bytes) -> bytes:
    """The reply frame to send for the client's auth header; AuthError if it is wrong
    (the caller sends ``DENIED`` first, so the peer stops retrying)."""
    try:
        reply = msgpack.unpackb(head, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"undecodable frame header: {exc}") from None
    if not isinstance(reply, dict):
        raise WireError("malformed authentication reply")
    client_nonce, mac = reply.get("nonce"), reply.get("mac")
    if (reply.get("op") != "auth" or not isinstance(client_nonce, bytes)
            or not isinstance(mac, bytes) or len(client_nonce) != _NONCE):
        raise WireError("malformed authentication reply")
    if not _same(mac, _mac(token, b"c", server_nonce, client_nonce)):
        raise AuthError("authentication failed (wrong job token)")
    head = msgpack.packb({"op": "ok", "mac": _mac(token, b"s", client_nonce, server_nonce)},
                         use_bin_type=True)
    return PREFIX.pack(MAGIC, VERSION, 0, len(head), 0) + head


_DENIED_HEAD = msgpack.packb({"op": "denied"})
DENIED = PREFIX.pack(MAGIC, VERSION, 0, len(_DENIED_HEAD), 0) + _DENIED_HEAD


def _recv_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise PeerClosed("connection closed by peer")
        buf += chunk
    return bytes(buf)


def server_handshake(sock: socket.socket, token: Optional[str],
                     timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Challenge a new peer; raise WireError unless it proves it holds ``token`` within
    ``timeout`` seconds in all (blocking; servers with many peers use ``Acceptor``)."""
    _check_token(token)
    deadline = time.monotonic() + timeout
    old = sock.gettimeout()
    try:
        server_nonce = os.urandom(_NONCE)
        sock.settimeout(timeout)
        sock.sendall(_hello(server_nonce))
        head_len = _preauth_prefix(_recv_by(sock, PREFIX.size, deadline))
        try:
            ok = _check_auth(token, server_nonce, _recv_by(sock, head_len, deadline))
        except AuthError:
            sock.sendall(DENIED)
            raise
        sock.sendall(ok)
    except socket.timeout:
        raise WireError("peer did not authenticate in time") from None
    finally:
        sock.settimeout(old)


def client_handshake(sock: socket.socket, token: Optional[str],
                     timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Answer the server's challenge and check that the server holds the token too."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello, _ = recv_frame(sock, max_payload=0)
        server_nonce = hello.get("nonce")
        if hello.get("op") != "hello" or not isinstance(server_nonce, bytes):
            raise WireError("peer is not a fluidctl server")
        client_nonce = os.urandom(_NONCE)
        send_frame(sock, {"op": "auth", "nonce": client_nonce,
                          "mac": _mac(token, b"c", server_nonce, client_nonce)})
        ok, _ = recv_frame(sock, max_payload=0)
        if ok.get("op") == "denied":
            raise AuthError("the server refused this job token (wrong job token)")
        mac = ok.get("mac")
        if ok.get("op") != "ok" or not isinstance(mac, bytes) or not _same(
                mac, _mac(token, b"s", client_nonce, server_nonce)):
            raise AuthError("server failed authentication (wrong job token)")
    except socket.timeout:
        raise WireError("server did not answer the handshake in time") from None
    finally:
        sock.settimeout(old)


def connect(endpoint: str, token: Optional[str], timeout: float = HANDSHAKE_TIMEOUT,
            io_timeout: Optional[float] = None) -> socket.socket:
    """Open an authenticated connection to ``host:port`` (TCP_NODELAY set). ``io_timeout``
    bounds every later send and receive on it (``socket.timeout`` when the peer stays silent
    that long); None leaves them unbounded, for callers that set their own deadline."""
    host, _, port = endpoint.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client_handshake(sock, token, timeout)
        sock.settimeout(io_timeout)
        return sock
    except BaseException:
        sock.close()
        raise



# --- dropped peers: logged, but never faster than a disk can take --------------------------

class DropLog:
    """Log dropped connections without letting whoever can reach a port fill the disk.

    The first ``first`` drops of a burst get a line each; later ones are counted and summed up
    in one line per ``interval`` ("dropped 1995 more connections from 10.0.0.7, 10.0.0.9 in
    the last 10 s"), written by a timer when the interval is over. A burst ends once an
    interval passes without a drop beyond the first few: the next drop is logged again."""

    MAX_ADDRESSES = 5

    def __init__(self, logger: logging.Logger, what: str = "dropped connection from",
                 first: int = DROP_LOG_FIRST, interval: Optional[float] = None,
                 prefix: str = ""):
        self.log, self.what, self.first, self.prefix = logger, what, first, prefix
        self.interval = DROP_LOG_INTERVAL if interval is None else interval
        self._lock = threading.Lock()
        self._window = -float("inf")       # when the current interval began
        self._logged = 0                   # lines written in it
        self._count = 0                    # drops summed up, not yet written
        self._hosts: Dict[str, None] = {}
        self._others = False
        self._timer: Optional[threading.Timer] = None

    def __call__(self, peer: str, why) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._window >= self.interval and not self._count:
                self._window, self._logged = now, 0
            if self._logged < self.first:
                self._logged += 1
                line = True
            else:
                line = False
                self._count += 1
                host = peer.rsplit(":", 1)[0]
                if host in self._hosts or len(self._hosts) < self.MAX_ADDRESSES:
                    self._hosts[host] = None
                else:
                    self._others = True
                if self._timer is None:
                    self._timer = threading.Timer(max(0.0, self._window + self.interval - now),
                                                  self.flush)
                    self._timer.daemon = True
                    self._timer.start()
        if line:
            self.log.warning("%s %s: %s", self.what, peer, why)

    def flush(self) -> None:
        """Write the summary of the drops counted so far (the timer calls it)."""
        with self._lock:
            self._timer = None
            count, hosts, others = self._count, list(self._hosts), self._others
            self._count, self._hosts, self._others = 0, {}, False
            elapsed = time.monotonic() - self._window
            if count:                      # the burst goes on: no single lines next interval
                self._window, self._logged = time.monotonic(), self.first
        if count:
            self.log.warning("%sdropped %d more connection%s from %s in the last %.0f s (only "
                             "the first %d of a burst are logged one by one)", self.prefix, count,
                             "" if count == 1 else "s",
                             ", ".join(hosts) + (" and others" if others else ""),
                             max(elapsed, 1.0), self.first)

    def close(self) -> None:
        with self._lock:
            timer = self._timer
        if timer is not None:
            timer.cancel()
        self.flush()


# --- many peers: one thread for every pending handshake -----------------------------------

class _Pending:
    __slots__ = ("sock", "addr", "nonce", "out", "inbuf", "need", "head_len", "deadline")

    def __init__(self, sock, addr, deadline):
        self.sock, self.addr, self.deadline = sock, addr, deadline
        self.nonce = os.urandom(_NONCE)
        self.out = _hello(self.nonce)
        self.inbuf = bytearray()
        self.need, self.head_len = PREFIX.size, None


class Acceptor:
    """Accept on ``listeners`` and authenticate every new peer without a thread of its own.

    Each pending handshake is a small state machine driven by one selector thread, under an
    absolute deadline (no thread, ~300 bytes of buffer each). At most ``max_pending_per_peer``
    run from one peer address (more are closed at once) and at most ``max_pending`` in all: a
    new peer then evicts the oldest handshake of the address holding the most, so a legitimate
    client, whose handshake takes a round trip, gets in while slow ones are pushed out. The
    backlog is drained in bounded bites; when the process is out of descriptors (EMFILE) the
    thread pauses and leaves the rest in the kernel's backlog. ``on_peer(sock, addr)`` gets every
    authenticated connection (blocking, no timeout) and owns it from then on; ``on_drop(addr,
    why)`` hears about every refused or failed one.
    """

    def __init__(self, listeners: Sequence[socket.socket], token: Optional[str],
                 on_peer: Callable[[socket.socket, tuple], None],
                 on_drop: Callable[[tuple, str], None] = lambda addr, why: None, *,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT, max_pending: int = MAX_PENDING,
                 max_pending_per_peer: int = MAX_PENDING_PER_PEER, name: str = "fluidctl-accept"):
        _check_token(token)
        self.token = token
        self.on_peer, self.on_drop = on_peer, on_drop
        self.handshake_timeout = handshake_timeout
        self.max_pending, self.max_pending_per_peer = max_pending, max_pending_per_peer
        self._listeners = list(listeners)
        self._pending: Dict[int, _Pending] = {}
        self._per_peer: Dict[str, int] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Acceptor":
        for lst in self._listeners:
            lst.setblocking(False)
            self._sel.register(lst, selectors.EVENT_READ, "listen")
        self._thread.start()
        return self

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Stop accepting and drop every pending handshake (listeners are the caller's)."""
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        try:
            while not self._closed:
                # _pending is in arrival order, hence deadline order: the first entry is the
                # next to expire (no scan over every pending handshake per event)
                now = time.monotonic()
                first = next(iter(self._pending.values()), None)
                timeout = first.deadline if first is not None else now + 1.0
                for key, events in self._sel.select(max(0.0, timeout - now)):
                    if key.data is None:
                        self._wake_r.recv(64)
                    elif key.data == "listen":
                        self._accept(key.fileobj)
                    else:
                        self._advance(key.data, events)
                now = time.monotonic()
                while self._pending:
                    first = next(iter(self._pending.values()))
                    if first.deadline > now:
                        break
                    self._fail(first, "did not authenticate in time")
        finally:
            for p in list(self._pending.values()):
                self._forget(p)
                p.sock.close()
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _evict(self) -> None:
        """Make room: the oldest handshake of the address holding the most."""
        host = max(self._per_peer, key=self._per_peer.get)
        victim = min((p for p in self._pending.values() if p.addr[0] == host),
                     key=lambda p: p.deadline)
        self._fail(victim, f"evicted: {self.max_pending} unauthenticated connections pending")

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BITE):                 # drain the backlog in bounded bites
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:                   # EMFILE and friends: back off a little
                self.on_drop(("?", 0), f"accept failed: {exc}")
                time.sleep(0.05)
                return
            host = addr[0]
            if self._per_peer.get(host, 0) >= self.max_pending_per_peer:
                sock.close()
                self.on_drop(addr, f"more than {self.max_pending_per_peer} unauthenticated "
                                   "connections from this address")
                continue
            if len(self._pending) >= self.max_pending:
                self._evict()
            sock.setblocking(False)
            p = _Pending(sock, addr, time.monotonic() + self.handshake_timeout)
            try:                                     # the hello fits an empty socket buffer
                p.out = p.out[sock.send(p.out):]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                sock.close()
                self.on_drop(addr, str(exc))
                continue
            self._pending[sock.fileno()] = p
            self._per_peer[host] = self._per_peer.get(host, 0) + 1
            self._sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if p.out
                                                             else 0), p)

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.sock.fileno(), None) is None:
            return
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        host = p.addr[0]
        left = self._per_peer.get(host, 1) - 1
        if left:
            self._per_peer[host] = left
        else:
            self._per_peer.pop(host, None)

    def _fail(self, p: _Pending, why) -> None:
        self._forget(p)
        p.sock.close()
        self.on_drop(p.addr, str(why))

    def _advance(self, p: _Pending, events: int) -> None:
        try:
            if p.out:
                sent = p.sock.send(p.out)
                p.out = p.out[sent:]
                if not p.out:
                    self._sel.modify(p.sock, selectors.EVENT_READ, p)
                return
            if not events & selectors.EVENT_READ:
                return
            chunk = p.sock.recv(p.need - len(p.inbuf))
            if not chunk:
                raise PeerClosed("connection closed by peer during the handshake")
            p.inbuf += chunk
            if len(p.inbuf) < p.need:
                return
            if p.head_len is None:
                p.head_len = _preauth_prefix(bytes(p.inbuf))
                p.inbuf.clear()
                p.need = p.head_len
                if p.need:
                    return
            try:
                ok = _check_auth(self.token, p.nonce, bytes(p.inbuf))
            except AuthError:
                try:
                    p.sock.send(DENIED)
                except OSError:
                    pass
                raise
            self._forget(p)
            sock = p.sock
            sock.setblocking(True)
            self.on_peer(sock, p.addr)        # counted as served before the peer hears "ok"
            try:
                sock.sendall(ok)              # ~60 bytes into an empty socket buffer
            except OSError:
                pass                          # refused by on_peer, or gone: its thread sees it
        except (OSError, WireError) as exc:
            self._fail(p, exc)
