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
(``FLUIDCTL_JOB_TOKEN``); a peer without the token never gets a frame processed.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from typing import List, Optional, Sequence, Tuple

import msgpack

MAGIC = b"FL"
VERSION = 1
PREFIX = struct.Struct(">2sBBIQ")
MAX_HEADER = 1 << 20                                   # 1 MiB of msgpack is plenty
MAX_PAYLOAD = int(os.environ.get("FLUIDCTL_MAX_FRAME", str(4 << 30)))  # 4 GiB
HANDSHAKE_TIMEOUT = 10.0
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


def recv_header(sock: socket.socket, max_payload: int = MAX_PAYLOAD) -> Tuple[dict, int]:
    """Read prefix and header; return (header, payload_len). The payload is still unread."""
    magic, version, _flags, head_len, payload_len = PREFIX.unpack(recv_exact(sock, PREFIX.size))
    if magic != MAGIC:
        raise WireError(f"not a fluidctl frame (magic {bytes(magic)!r})")
    if version != VERSION:
        raise WireError(f"wire version {version}, this side speaks {VERSION} "
                        "(run the same fluidctl version everywhere)")
    if head_len > MAX_HEADER or payload_len > max_payload:
        raise WireError(f"frame too large (header {head_len} B, payload {payload_len} B)")
    try:
        header = msgpack.unpackb(recv_exact(sock, head_len), raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"undecodable frame header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("frame header is not a map")
    return header, payload_len


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
    return hmac.new(_key(token), b"".join(parts), hashlib.sha256).digest()


def server_handshake(sock: socket.socket, token: Optional[str],
                     timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Challenge a new peer; raise WireError unless it proves it holds ``token``."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        server_nonce = os.urandom(_NONCE)
        send_frame(sock, {"op": "hello", "v": VERSION, "nonce": server_nonce})
        reply, _ = recv_frame(sock, max_payload=0)
        client_nonce = reply.get("nonce")
        mac = reply.get("mac")
        if (reply.get("op") != "auth" or not isinstance(client_nonce, bytes)
                or not isinstance(mac, bytes) or len(client_nonce) != _NONCE):
            raise WireError("malformed authentication reply")
        if not hmac.compare_digest(mac, _mac(token, b"c", server_nonce, client_nonce)):
            send_frame(sock, {"op": "denied"})     # so the peer stops retrying
            raise AuthError("authentication failed (wrong job token)")
        send_frame(sock, {"op": "ok", "mac": _mac(token, b"s", client_nonce, server_nonce)})
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
        if ok.get("op") != "ok" or not isinstance(mac, bytes) or not hmac.compare_digest(
                mac, _mac(token, b"s", client_nonce, server_nonce)):
            raise AuthError("server failed authentication (wrong job token)")
    except socket.timeout:
        raise WireError("server did not answer the handshake in time") from None
    finally:
        sock.settimeout(old)


def connect(endpoint: str, token: Optional[str], timeout: float = HANDSHAKE_TIMEOUT
            ) -> socket.socket:
    """Open an authenticated connection to ``host:port`` (TCP_NODELAY set)."""
    host, _, port = endpoint.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client_handshake(sock, token, timeout)
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise

