"""Frames and the HMAC handshake over real sockets (socketpair and loopback TCP)."""
import socket
import struct
import threading

import msgpack
import numpy as np
import pytest

from fluidctl.runtime import wire


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _send_in_thread(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def test_header_and_arrays_round_trip(pair):
    a, b = pair
    w = np.arange(300_000, dtype=np.float32).reshape(600, 500)   # larger than socket buffers
    ids = np.array([-5, 0, 1 << 40], dtype=np.int64)
    t = _send_in_thread(wire.send_frame, a, {"op": "x", "n": 3}, [w, ids])
    header, payload = wire.recv_frame(b)
    t.join()
    out_w = np.frombuffer(payload[:w.nbytes], np.float32).reshape(w.shape)
    out_ids = np.frombuffer(payload[w.nbytes:], np.int64)
    assert header == {"op": "x", "n": 3}
    assert np.array_equal(out_w, w) and np.array_equal(out_ids, ids)


def test_recv_frame_returns_payload_and_non_contiguous_input_is_refused(pair):
    a, b = pair
    wire.send_frame(a, {"k": b"\x00\x01"}, [b"abc", memoryview(b"de")])
    header, payload = wire.recv_frame(b)
    assert header == {"k": b"\x00\x01"} and bytes(payload) == b"abcde"
    with pytest.raises(ValueError):
        wire.send_frame(a, {}, [np.zeros((4, 4))[:, 1]])


@pytest.mark.parametrize("raw, match", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a fluidctl frame"),
    (wire.PREFIX.pack(wire.MAGIC, 99, 0, 2, 0) + b"\x80\x80", "wire version 99"),
    (wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, 4, 1 << 50), "too large"),
    (wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, wire.MAX_HEADER + 1, 0), "too large"),
    (wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, 1, 0) + b"\xc1", "undecodable"),
    (wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, 2, 0) + msgpack.packb([1]), "not a map"),
])
def test_bad_frames_raise_wire_error(pair, raw, match):
    a, b = pair
    a.sendall(raw)
    with pytest.raises(wire.WireError, match=match):
        wire.recv_header(b)


def test_limit_is_checked_before_allocating(pair):
    a, b = pair
    a.sendall(wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, 1, 1000) + msgpack.packb({}))
    with pytest.raises(wire.WireError, match="too large"):
        wire.recv_header(b, max_payload=999)


def test_peer_closing_is_peer_closed(pair):
    a, b = pair
    a.close()
    with pytest.raises(wire.PeerClosed):
        wire.recv_header(b)


def _tcp_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    return listener, port


@pytest.mark.parametrize("server_token, client_token, ok", [
    ("job-secret", "job-secret", True),
    ("job-secret", "wrong", False),
    ("job-secret", None, False),
])
def test_handshake_over_tcp(server_token, client_token, ok):
    listener, port = _tcp_pair()
    result = {}

    def serve():
        conn, _ = listener.accept()
        try:
            wire.server_handshake(conn, server_token)
            result["server"] = "ok"
            header, _ = wire.recv_frame(conn)
            wire.send_frame(conn, {"echo": header["ping"]})
        except wire.WireError as exc:
            result["server"] = exc
        finally:
            conn.close()
    t = _send_in_thread(serve)
    if ok:
        sock = wire.connect(f"127.0.0.1:{port}", client_token)
        wire.send_frame(sock, {"ping": 7})
        assert wire.recv_frame(sock)[0] == {"echo": 7}
        sock.close()
    else:
        with pytest.raises(wire.WireError):
            wire.connect(f"127.0.0.1:{port}", client_token)
    t.join(10)
    listener.close()
    if ok:
        assert result["server"] == "ok"
    else:
        assert isinstance(result["server"], wire.AuthError)


def test_client_rejects_a_server_without_the_token():
    listener, port = _tcp_pair()

    def impostor():
        conn, _ = listener.accept()
        try:
            wire.server_handshake(conn, "another-job")
        except wire.WireError:
            pass
        conn.close()
    t = _send_in_thread(impostor)
    with pytest.raises(wire.WireError):
        wire.connect(f"127.0.0.1:{port}", "my-job")
    t.join(10)
    listener.close()


def test_prefix_layout_is_stable():
    # 2-byte magic, version, flags, u32 header length, u64 payload length: 16 bytes
    assert wire.PREFIX.size == 16
    assert wire.PREFIX.pack(b"FL", 1, 0, 5, 9) == b"FL\x01\x00" + struct.pack(">IQ", 5, 9)
